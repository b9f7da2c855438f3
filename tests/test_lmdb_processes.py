"""The LMDB store under real processes: dead readers, growers, forks, a held write lock,
a refused map growth, a full and a read-only filesystem.

Every child is bounded in time and reaped by its pid.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from _children import Child, children
from _stores import APP, USER, child_env, ev, snapshot_dir, while_the_loop_beats
from sessionscope import LmdbStore, SessionService, SyncSessionService
from sessionscope.errors import IncompatibleStoreError, StoreError

pytestmark = pytest.mark.slow


def _session_store(path: Path, **kwargs: Any) -> tuple[LmdbStore, str]:
    store = LmdbStore(path, **kwargs)
    svc = SyncSessionService(store)
    session = svc.create_session(app_name=APP, user_id=USER)
    svc.append_event(session, ev(delta={"a": 1}))
    return store, session.id


def _json_line(child: Child, timeout: float = 60.0) -> Any:
    line = child.readline(timeout)
    assert line is not None, child.stderr()
    return json.loads(line)


# Item 2: reader slots of dead processes


def test_readers_that_died_without_closing_never_fill_the_table(tmp_path: Path) -> None:
    path = tmp_path / "store"
    store, sid = _session_store(path, max_readers=6)
    try:
        svc = SyncSessionService(store)
        # Twice as many processes as there are slots, each ending without close().
        for n in range(12):
            how = ("exit", "os_exit", "kill")[n % 3]
            with children(
                tmp_path,
                ("read_then", str(path), sid, "hold" if how == "kill" else how),
                stdin=True,
            ) as (child,):
                assert child.readline() == "read", child.stderr()
                if how == "kill":
                    child.proc.send_signal(signal.SIGKILL)
                child.proc.wait(timeout=30)
        # Every opener reclaimed the slots of those that died before it; this
        # process, which lived on all along, reads and writes as before.
        svc.append_event(
            svc.get_session(app_name=APP, user_id=USER, session_id=sid), ev(delta={"a": 2})
        )
    finally:
        store.close()


def test_only_a_table_full_of_live_readers_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "store"
    # Kept open, so that the reader table keeps this store's size.
    store, sid = _session_store(path, max_readers=4)
    try:
        args = [("read_then", str(path), sid, "hold")] * 4
        with children(tmp_path, *args, stdin=True) as live:
            for child in live:
                assert child.readline() == "read", child.stderr()
            with children(tmp_path, ("read_then", str(path), sid, "exit")) as (late,):
                answer = _json_line(late)
            assert answer["error"] == "StoreError"
            assert "live" in answer["hint"] and "max_readers" in answer["hint"]
            with pytest.raises(StoreError, match="max_readers"):
                SyncSessionService(store).get_session(app_name=APP, user_id=USER, session_id=sid)
            for child in live:
                child.proc.send_signal(signal.SIGKILL)
                child.proc.wait(timeout=30)
            # Their slots are stale now: this process, which lives on, reclaims them.
            assert (
                SyncSessionService(store).get_session(app_name=APP, user_id=USER, session_id=sid)
                is not None
            )
            with children(tmp_path, ("read_then", str(path), sid, "exit")) as (late,):
                assert late.readline() == "read", late.stderr()
    finally:
        store.close()


# Items 3 and 4: opening while another process grows the map


def test_opening_while_another_process_grows_the_map_always_works(tmp_path: Path) -> None:
    path = tmp_path / "store"
    LmdbStore(path).close()
    with children(tmp_path, ("grow_until_told", str(path), "700"), stdin=True) as (grower,):
        assert grower.readline() == "growing", grower.stderr()
        with children(tmp_path, ("open_many", str(path), "5")) as (opener,):
            report = _json_line(opener, timeout=90)
            code = opener.proc.wait(timeout=60)
        assert grower.proc.stdin is not None
        with contextlib.suppress(BrokenPipeError):  # it may have reached its limit
            grower.proc.stdin.close()  # end of input: stop
        grown = _json_line(grower, timeout=90)
    # The opener never died of a signal (SIGABRT from an unregistered read).
    assert code == 0, opener.stderr()
    assert report["failed"] == 0, report
    assert report["opened"] > 0
    assert grown["map_size"] > 64 << 20


def test_a_deferred_store_opened_with_a_smaller_map_never_cuts_another_process_s_file(
    tmp_path: Path,
) -> None:
    """LMDB sizes the data file to a writable map whenever it maps it, shrinking it too.

    A process that opened (or grew) a smaller map than another's cut the
    file under the other's reserved blocks: its next write there was a
    SIGBUS, and pages it had written were lost. Every writable map is now
    at least the file, made under the writers' flock.
    """
    path = tmp_path / "store"
    LmdbStore(path, map_size=1 << 20, durability="deferred").close()
    with children(tmp_path, ("grow_then_wait", str(path), "8"), stdin=True) as (grower,):
        assert grower.readline(timeout=120) == "grown", grower.stderr()
        before = (path / "data.mdb").stat().st_size
        assert before >= 8 << 20
        here = LmdbStore(path, map_size=1 << 20, durability="deferred")
        try:
            assert here.writemap, "this test needs a writable map (posix_fallocate)"
            assert (path / "data.mdb").stat().st_size >= before
            # This process writes and grows its own map too, from below the other's.
            svc = SyncSessionService(here)
            mine = svc.create_session(app_name="app", user_id="here")
            for _ in range(100):
                svc.append_event(mine, ev(content={"blob": "y" * (64 << 10)}))
            assert grower.proc.stdin is not None
            grower.proc.stdin.write(b"go\n")
            grower.proc.stdin.flush()
            done = _json_line(grower, timeout=120)
            assert grower.proc.wait(timeout=60) == 0, grower.stderr()
            got = svc.get_session(app_name="app", user_id="grower", session_id=done["session"])
            assert got is not None and len(got.events) == done["appended"]
            got = svc.get_session(app_name="app", user_id="here", session_id=mine.id)
            assert got is not None and len(got.events) == 100
        finally:
            here.close()


def test_a_foreign_database_in_use_is_refused_and_its_data_untouched(tmp_path: Path) -> None:
    path = tmp_path / "foreign"
    with children(tmp_path, ("foreign_open", str(path)), stdin=True) as (other,):
        assert other.readline() == "open", other.stderr()
        before = snapshot_dir(path / "data.mdb")
        with pytest.raises(IncompatibleStoreError, match="another LMDB database"):
            LmdbStore(path)
        assert snapshot_dir(path / "data.mdb") == before


# Item 6: a growth the OS refuses


def test_a_refused_map_growth_is_a_store_error_and_the_store_lives_on(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with children(tmp_path, ("refused_growth", str(path))) as (child,):
        report = _json_line(child, timeout=90)
        child.wait_ok()
    assert report["error"]["type"] == "StoreError"
    assert "address space" in report["error"]["hint"]
    assert report["events_after_refusal"] >= 8
    assert report["events_after_limit_lifted"] == report["events_after_refusal"] + 1


# Item 7: forks


def _in_forked_child(action: Any, timeout: float = 30.0) -> dict[str, Any]:
    """Run action() in a real fork()ed child; return what it reported (or that it hung)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report and leave without running any cleanup
        os.close(read_end)
        try:
            action()
            answer: dict[str, Any] = {"raised": None}
        except BaseException as error:
            answer = {"raised": type(error).__name__, "hint": getattr(error, "hint", None)}
        os.write(write_end, json.dumps(answer).encode())
        os._exit(0)
    os.close(write_end)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.01)
        else:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return {"raised": "hung"}
        with os.fdopen(read_end, "rb") as reader:
            return json.loads(reader.read() or b"null") or {"raised": "nothing reported"}
    finally:
        with contextlib.suppress(OSError):
            os.close(read_end)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("durability", ["sync", "deferred"])
def test_a_store_that_crossed_a_fork_refuses_in_the_child(tmp_path: Path, durability: str) -> None:
    store, sid = _session_store(tmp_path / "store", durability=durability)
    try:
        svc = SyncSessionService(store)
        session = svc.get_session(app_name=APP, user_id=USER, session_id=sid)
        assert session is not None

        def async_append() -> None:
            async def go() -> None:
                await SessionService(store).append_event(session, ev(delta={"c": 1}))

            asyncio.run(go())

        actions = {
            "async append": async_append,
            "append": lambda: svc.append_event(session, ev(delta={"c": 1})),
            "flush": lambda: store.flush().result(),
            "read": lambda: svc.get_session(app_name=APP, user_id=USER, session_id=sid),
        }
        for name, action in actions.items():
            answer = _in_forked_child(action)
            assert answer["raised"] == "StoreError", (name, answer)
            assert "after forking" in answer["hint"]
        # close() in the child touches nothing the parent holds.
        assert _in_forked_child(store.close)["raised"] is None
        # The parent is unaffected.
        svc.append_event(session, ev(delta={"p": 1}))
        store.flush().result()
        again = svc.get_session(app_name=APP, user_id=USER, session_id=sid)
        assert again is not None and again.state == {"a": 1, "p": 1}
    finally:
        store.close()


def _mp_worker(store: LmdbStore, sid: str, queue: Any) -> None:
    try:
        SyncSessionService(store).get_session(app_name=APP, user_id=USER, session_id=sid)
        queue.put("no error")
    except StoreError as error:
        queue.put(f"StoreError: {error.hint}")


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_multiprocessing_fork_workers_get_a_store_error(tmp_path: Path) -> None:
    store, sid = _session_store(tmp_path / "store")
    try:
        context = multiprocessing.get_context("fork")
        queue = context.Queue()
        worker = context.Process(target=_mp_worker, args=(store, sid, queue))
        worker.start()
        try:
            answer = queue.get(timeout=30)
        finally:
            worker.join(timeout=30)
            if worker.is_alive():
                worker.kill()
                worker.join(timeout=30)
        assert answer.startswith("StoreError") and "after forking" in answer
        assert (
            SyncSessionService(store).get_session(app_name=APP, user_id=USER, session_id=sid)
            is not None
        )
    finally:
        store.close()


# Item 8: the event loop never waits for LMDB's write lock


@pytest.mark.parametrize("durability", ["sync", "deferred"])
# "hold_write_lock": an LMDB transaction of another program, which only LMDB's
# own mutex shows; "hold_store_writer_lock": another process's store between
# taking its writer lock and beginning, which only that lock shows.
@pytest.mark.parametrize("holder_kind", ["hold_write_lock", "hold_store_writer_lock"])
def test_the_loop_runs_while_another_process_holds_the_write_lock(
    tmp_path: Path, durability: str, holder_kind: str
) -> None:
    path = tmp_path / "store"
    release = tmp_path / "release"
    store = LmdbStore(path, durability=durability)

    async def scenario(holder: Child) -> tuple[bool, int]:
        svc = SessionService(store)
        session = await svc.create_session(app_name=APP, user_id=USER)
        assert holder.readline() == "held", holder.stderr()
        return await while_the_loop_beats(
            svc.append_event(session, ev(delta={"a": 1})), release.touch, release.exists
        )

    try:
        with children(tmp_path, (holder_kind, str(path), str(release), "20")) as (holder,):
            ran, ticks = asyncio.run(scenario(holder))
            how = holder.readline(timeout=60)
        assert how == "file", "the loop froze until the holder gave up"
        assert ran and ticks >= 5
    finally:
        store.close()


@pytest.mark.skipif(
    sys.platform != "linux" or sys.maxsize <= 2**32,
    reason="the mutex word's place is known on 64-bit Linux",
)
@pytest.mark.parametrize(
    "module", ["sessionscope.stores.lmdb._locks", "sessionscope.stores.lmdb._locks_c"]
)
def test_the_writer_lock_reads_lmdb_s_write_mutex_where_it_is(
    tmp_path: Path, module: str, build_of: Callable[[str], ModuleType]
) -> None:
    """LMDB's write mutex word is where WriterLock reads it: taken while held, free after.

    Kept on purpose (see "Internals kept, and why" in docs/ARCHITECTURE.md):
    should LMDB move its mutex, the loop would silently hand every deferred
    write to the writer thread; this fails instead.
    """
    import lmdb

    locks = build_of(module)
    env = lmdb.open(str(tmp_path))
    lock = locks.WriterLock(str(tmp_path / "lock.mdb"))
    try:
        with env.begin(write=True):
            lock.learn()
            assert lock.acquire(False) is False
        assert lock.acquire(False) is True
        lock.release()
    finally:
        lock.close()
        env.close()


# Item 10: a full and a read-only filesystem


@contextlib.contextmanager
def _tmpfs(where: Path, size: str) -> Iterator[Path]:
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False, capture_output=True)


def test_a_full_filesystem_is_a_store_error_and_keeps_what_was_stored(tmp_path: Path) -> None:
    with _tmpfs(tmp_path / "small", "2m") as small:
        path = small / "store"
        store = LmdbStore(path)
        svc = SyncSessionService(store)
        session = svc.create_session(app_name=APP, user_id=USER)
        acknowledged = []
        error: StoreError | None = None
        for n in range(1000):
            event = ev(delta={f"k{n}": "x" * 20_000})
            try:
                svc.append_event(session, event)
            except StoreError as failure:
                error = failure
                break
            acknowledged.append(event.id)
        assert error is not None and error.hint is not None
        assert "disk space" in error.hint
        store.close()
        with SyncSessionService(LmdbStore(path)) as again:
            stored = again.get_session(app_name=APP, user_id=USER, session_id=session.id)
            assert stored is not None
            assert [e.id for e in stored.events] == acknowledged


def test_a_read_only_filesystem_is_named_in_the_hint(tmp_path: Path) -> None:
    with _tmpfs(tmp_path / "ro", "4m") as where:
        LmdbStore(where / "store").close()
        remounted = subprocess.run(
            ["mount", "-o", "remount,ro", str(where)], capture_output=True, check=False
        )
        assert remounted.returncode == 0, remounted.stderr
        with pytest.raises(StoreError) as info:
            LmdbStore(where / "store")
        assert info.value.hint is not None and "read-only" in info.value.hint
        with pytest.raises(StoreError) as info:
            LmdbStore(where / "new")
        assert info.value.hint is not None and "read-only" in info.value.hint


_FILL_THROUGH_THE_MAP = """
import sys
from sessionscope import Event, EventActions, LmdbStore, SyncSessionService
from sessionscope.errors import StoreError

store = LmdbStore(sys.argv[1], durability="deferred", map_size=1 << 20)
print("writemap", store.writemap, flush=True)
service = SyncSessionService(store)
session = service.create_session(app_name="app", user_id="user", session_id="s")
for n in range(1000):
    event = Event(author="user", actions=EventActions(state_delta={f"k{n}": "x" * 20_000}))
    try:
        service.append_event(session, event)
    except StoreError as error:
        print("error", error.hint, flush=True)
        break
    print("stored", event.id, flush=True)
store.close()
print("closed", flush=True)
"""


@pytest.mark.slow
def test_a_full_filesystem_under_a_writable_map_is_a_store_error(tmp_path: Path) -> None:
    """A deferred store writes through its map; the disk filling up is an error, not SIGBUS."""
    with _tmpfs(tmp_path / "small", "4m") as small:
        path = small / "store"
        child = subprocess.run(
            [sys.executable, "-c", _FILL_THROUGH_THE_MAP, str(path)],
            capture_output=True,
            text=True,
            timeout=120,
            env=child_env(),
            check=False,
        )
        # A negative status would be the signal that killed it (SIGBUS).
        assert child.returncode == 0, (child.returncode, child.stderr)
        lines = child.stdout.splitlines()
        assert lines[0] == "writemap True"
        assert lines[-1] == "closed"
        errors = [line for line in lines if line.startswith("error")]
        assert len(errors) == 1 and "disk space" in errors[0]
        acknowledged = [line.split()[1] for line in lines if line.startswith("stored")]
        assert acknowledged
        with SyncSessionService(LmdbStore(path)) as again:
            stored = again.get_session(app_name=APP, user_id=USER, session_id="s")
            assert stored is not None
            assert [e.id for e in stored.events] == acknowledged
            assert again.store.check_layout() == []  # type: ignore[attr-defined]
