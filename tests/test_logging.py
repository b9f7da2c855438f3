"""What the library logs: background failures, map growth, retries, refused opens.

The library logs through ``logging.getLogger(__name__)`` per module and never
prints; the command line shows its warnings on stderr, one line each, and with
``-v`` its INFO records too. No record carries a password.
"""

from __future__ import annotations

import ast
import asyncio
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from itertools import pairwise
from pathlib import Path

import pytest

from _redis import RedisServer
from _stores import APP, USER, child_env, ev, run_cli
from sessionscope import LmdbStore, SessionService, SyncSessionService
from sessionscope.errors import IncompatibleStoreError, StoreError, UnsafeStoreError
from sessionscope.stores.redis import RedisStore

SECRET = "l0g-Pw-8Rt"


def _wait_for(
    caplog: pytest.LogCaptureFixture, found: Callable[[logging.LogRecord], bool]
) -> logging.LogRecord:
    """Return the first record ``found`` accepts, waiting for a background thread to log it."""
    deadline = time.monotonic() + 30
    while True:
        for record in list(caplog.records):
            if found(record):
                return record
        assert time.monotonic() < deadline, [r.getMessage() for r in caplog.records]
        time.sleep(0.02)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    """A server of this test's own, to stop and start."""
    started = RedisServer(tmp_path / "redis").start()
    try:
        yield started
    finally:
        started.stop()


# -- LMDB --------------------------------------------------------------------


@pytest.mark.parametrize("durability", ["sync", "deferred"])
def test_map_growth_is_logged_with_its_sizes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, durability: str
) -> None:
    caplog.set_level(logging.INFO, logger="sessionscope")
    path = tmp_path / "store"
    store = LmdbStore(path, map_size=1 << 20, durability=durability)  # type: ignore[arg-type]
    try:
        svc = SyncSessionService(store)
        session = svc.create_session(app_name=APP, user_id=USER)
        for n in range(150):
            svc.append_event(session, ev(content={"n": n, "blob": "x" * 20_000}))
        grown = [r for r in caplog.records if r.getMessage().startswith("grew the map")]
        assert grown, caplog.text
        # Each growth doubles the map, from where the last one left it.
        sizes = [(r.args[1], r.args[2]) for r in grown]  # type: ignore[index]
        assert sizes[0][0] == 1 << 20
        assert all(new == 2 * old for old, new in sizes)
        assert all(later[0] == earlier[1] for earlier, later in pairwise(sizes))
        assert sizes[-1][1] == store.stat()["map_size"]
        assert all(
            r.name == "sessionscope.stores.lmdb.writer" and r.levelno == logging.INFO for r in grown
        )
        assert str(path) in grown[0].getMessage()
    finally:
        store.close()


GROW_ELSEWHERE = """
import sys
from sessionscope import LmdbStore, SyncSessionService
from sessionscope.model import Event
store = LmdbStore(sys.argv[1], map_size=1 << 20)
svc = SyncSessionService(store)
session = svc.create_session(app_name="app", user_id="other")
for n in range(150):
    svc.append_event(session, Event(author="agent", content={"blob": "x" * 20_000}))
print(store.stat()["map_size"])
store.close()
"""


def test_a_map_another_process_grew_is_adopted_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sessionscope")
    path = tmp_path / "store"
    store = LmdbStore(path, map_size=1 << 20)
    try:
        done = subprocess.run(
            [sys.executable, "-c", GROW_ELSEWHERE, str(path)],
            capture_output=True, text=True, timeout=120, env=child_env(), check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        grown_to = int(done.stdout)
        assert grown_to > 1 << 20
        assert SyncSessionService(store).list_sessions(app_name=APP, user_id="other").sessions
        (adopted,) = [r for r in caplog.records if r.getMessage().startswith("adopted the map")]
        assert adopted.args == (path, 1 << 20, grown_to)
    finally:
        store.close()


def test_a_refused_open_is_logged_with_its_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sessionscope")
    # A directory that holds something else.
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(IncompatibleStoreError) as caught:
        LmdbStore(other)
    assert os.listdir(other) == ["notes.txt"]
    (refused,) = [r for r in caplog.records if r.getMessage().startswith("refused to open")]
    assert refused.levelno == logging.INFO and refused.name == "sessionscope.stores.lmdb.store"
    assert refused.getMessage() == f"refused to open the store at {other}: {caught.value}"
    # A store in a directory others may write to.
    caplog.clear()
    path = tmp_path / "store"
    LmdbStore(path).close()
    path.chmod(0o777)
    with pytest.raises(UnsafeStoreError):
        LmdbStore(path)
    (refused,) = [r for r in caplog.records if r.getMessage().startswith("refused to open")]
    assert str(path) in refused.getMessage() and "writable by group" in refused.getMessage()


def test_a_failure_of_the_writer_thread_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sessionscope")
    path = tmp_path / "store"
    store = LmdbStore(path)
    try:
        service = SessionService(store)

        async def scenario() -> None:
            session = await service.create_session(app_name=APP, user_id=USER)
            # Another process would no longer see this one's writer: writes refused.
            (path / "lock.mdb").unlink()
            (path / "lock.mdb").write_bytes(b"\0" * 8192)
            # Written from an event loop: the writer thread commits it.
            with pytest.raises(UnsafeStoreError):
                await service.append_event(session, ev(delta={"a": 1}))

        asyncio.run(scenario())
        (failed,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert failed.threadName == "sessionscope-lmdb-writer"
        assert failed.getMessage() == f"{path / 'lock.mdb'} was removed or replaced: writes refused"
    finally:
        store.close()


def test_each_expiry_pass_is_logged_with_what_it_removed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="sessionscope")
    path = tmp_path / "store"
    with SyncSessionService(LmdbStore(path)) as svc:
        for sid in ("a", "b"):
            session = svc.create_session(app_name=APP, user_id=USER, session_id=sid)
            svc.append_event(session, ev(ts=time.time() - 3600))
    store = LmdbStore(path, session_ttl=60)
    try:
        swept = _wait_for(caplog, lambda r: r.getMessage().startswith("expired "))
        assert swept.levelno == logging.DEBUG and swept.name == "sessionscope.stores.expiry"
        assert swept.getMessage() == f"expired 2 idle sessions of {store!r}"
    finally:
        store.close()


# -- Redis ---------------------------------------------------------------------


def test_an_expirer_failure_is_logged_and_the_next_pass_runs(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="sessionscope")
    store = RedisStore(server.url, session_ttl=1, timeout=2)
    try:
        _wait_for(caplog, lambda r: r.getMessage().startswith("expired 0 idle sessions"))
        server.kill()
        failed = _wait_for(caplog, lambda r: r.levelno >= logging.ERROR)
        assert failed.name == "sessionscope.stores.expiry"
        assert failed.threadName == "sessionscope-expirer"
        assert failed.getMessage() == f"expiring idle sessions of {store!r} failed"
        assert failed.exc_info is not None and "Redis failed" in str(failed.exc_info[1])
        # The thread goes on: once the server is back, a pass succeeds again.
        server.start()
        caplog.clear()
        _wait_for(caplog, lambda r: r.getMessage().startswith("expired 0 idle sessions"))
    finally:
        store.close()


def _sent_to(port: int) -> bool:
    """Tell whether bytes wait unread in a socket of the server on ``port`` (it is paused)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as file:
            for line in file.readlines()[1:]:
                fields = line.split()
                local, queues = fields[1], fields[4]
                if int(local.rsplit(":", 1)[1], 16) == port and int(queues.split(":")[1], 16):
                    return True
    return False


def test_a_reloaded_library_and_a_lost_connection_are_logged(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sessionscope")
    where = server.url
    with SyncSessionService(RedisStore(server.url)) as svc:
        session = svc.create_session(app_name=APP, user_id=USER)
        # The server lost its functions (a restart without them, a FUNCTION FLUSH).
        server.cli("FUNCTION", "FLUSH")
        caplog.clear()
        svc.append_event(session, ev(delta={"a": 1}))
        (loaded,) = caplog.records
        assert loaded.levelno == logging.INFO and loaded.name == "sessionscope.stores.redis.runners"
        assert loaded.getMessage() == (
            f"loading sessionscope's functions on {where} (new, restarted or flushed)"
        )
        # The server dies with a read on the wire: redis-py retries once, and says so.
        caplog.clear()
        server.pause()
        outcome: list[BaseException | None] = []

        def read() -> None:
            try:
                svc.get_session(app_name=APP, user_id=USER, session_id=session.id)
                outcome.append(None)
            except BaseException as error:
                outcome.append(error)

        reader = threading.Thread(target=read, name="reader")
        reader.start()
        deadline = time.monotonic() + 30
        while not _sent_to(server.port):
            assert time.monotonic() < deadline and reader.is_alive()
            time.sleep(0.01)
        server.kill()
        reader.join(60)
        # The retry found nothing to reconnect to: the caller hears of it.
        assert isinstance(outcome[0], StoreError)
        (retried,) = caplog.records
        assert retried.levelno == logging.INFO and retried.threadName == "reader"
        assert (
            retried.getMessage() == f"lost the connection to the Redis server at {where}: retrying"
        )


def test_no_log_record_carries_a_password(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    server = RedisServer(tmp_path / "locked", "--maxmemory-policy", "allkeys-lru").start()
    try:
        server.cli("CONFIG", "SET", "requirepass", SECRET)
        url = f"redis://:{SECRET}@127.0.0.1:{server.port}/0"
        # A warning (an evicting server), a library load, and, the server
        # gone, a retry and failing expiry passes.
        store = RedisStore(url, session_ttl=1, allow_eviction=True, timeout=2)
        try:
            SyncSessionService(store).create_session(app_name=APP, user_id=USER)
            server.kill()
            _wait_for(caplog, lambda r: r.levelno >= logging.ERROR)
        finally:
            store.close()
        done = run_cli("-v", "ls", f"{url}?allow_eviction=true")
    finally:
        server.stop()
    levels = {r.levelno for r in caplog.records}
    assert {logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR} <= levels
    for record in caplog.records:
        assert SECRET not in record.getMessage()
    assert SECRET not in caplog.text  # with the tracebacks
    assert "***" in caplog.text
    assert SECRET not in done.stderr and SECRET not in done.stdout


WARN_UNCONFIGURED = """
import sys
from sessionscope.stores.redis import RedisStore
RedisStore(sys.argv[1], allow_eviction=True).close()
"""


def test_a_program_that_configures_no_logging_sees_nothing_on_stderr(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "lru", "--maxmemory-policy", "allkeys-lru").start()
    try:
        done = subprocess.run(
            [sys.executable, "-c", WARN_UNCONFIGURED, server.url],
            capture_output=True, text=True, timeout=120, env=child_env(), check=False,
        )  # fmt: skip
    finally:
        server.stop()
    # Python's last-resort handler would print the warning: the library never does.
    assert done.returncode == 0 and done.stderr == "" and done.stdout == "", done.stderr


# -- the command line ------------------------------------------------------------


def test_the_command_line_shows_warnings_on_stderr_and_info_with_verbose(
    tmp_path: Path,
) -> None:
    server = RedisServer(tmp_path / "lru", "--maxmemory-policy", "allkeys-lru").start()
    try:
        uri = f"{server.url}?prefix=p&allow_eviction=true"
        listing = ("ls", uri, "--app", APP, "--user", USER, "--json")
        with SyncSessionService(RedisStore(server.url, prefix="p", allow_eviction=True)) as svc:
            svc.create_session(app_name=APP, user_id=USER, session_id="s")
        warning = (
            f"sessionscope: warning: the Redis server at {server.url} has maxmemory-policy "
            "allkeys-lru: it may evict sessions' keys; opened all the same (allow_eviction)"
        )
        # --json: stdout stays one JSON document, the warning goes to stderr.
        done = run_cli(*listing)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)
        assert done.stderr.splitlines() == [warning]
        # -v (before or after the command) adds the INFO records.
        server.cli("FUNCTION", "FLUSH")
        for args in (("-v", *listing), (*listing, "--verbose")):
            done = run_cli(*args)
            assert done.returncode == 0, done.stderr
            assert json.loads(done.stdout)
            assert warning in done.stderr.splitlines()
            assert "sessionscope: info: loading sessionscope's functions on" in done.stderr
            server.cli("FUNCTION", "FLUSH")
        # Without -v, no INFO line.
        done = run_cli(*listing[:-1])
        assert done.returncode == 0, done.stderr
        assert done.stderr.splitlines() == [warning]
    finally:
        server.stop()


def test_main_leaves_the_callers_logging_as_it_was(tmp_path: Path) -> None:
    from sessionscope.cli import main

    top = logging.getLogger("sessionscope")
    before = (top.level, list(top.handlers))
    path = tmp_path / "store"
    LmdbStore(path).close()
    assert main(["-v", "ls", f"lmdb://{path}", "--json"]) == 0
    assert (top.level, list(top.handlers)) == before


# -- never print -------------------------------------------------------------------

# The command line's own package writes to stdout; every other module logs.
_MAY_PRINT = "cli"


def test_the_library_never_prints() -> None:
    import sessionscope

    root = Path(sessionscope.__file__).parent
    printing = []
    for source in sorted(root.rglob("*.py")):
        if source.parent == root / _MAY_PRINT:
            continue
        for node in ast.walk(ast.parse(source.read_text(), str(source))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print":
                printing.append(f"{source.relative_to(root)}:{node.lineno}")
    assert printing == []
