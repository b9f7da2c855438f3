"""A store's connections: made again when the server drops them, enough for many calls at once.

Every command a store sends is idempotent, so a lost connection (the
server's idle timeout, a restart, a failover) is retried once, on the sync
and on the asyncio face alike. More calls at once than a store keeps
connections wait for one. The servers here are this module's own, so that
dropping every client drops only this test's.
"""

from __future__ import annotations

import asyncio
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from _redis import RedisCluster, RedisServer
from _stores import APP, USER, ev, run
from sessionscope import SessionService, SyncSessionService


@pytest.fixture(params=["redis", "redis-cluster"])
def servers(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[str, list[RedisServer]]]:
    if request.param == "redis":
        server = RedisServer(tmp_path / "server").start()
        try:
            yield server.url, [server]
        finally:
            server.stop()
    else:
        cluster = RedisCluster(tmp_path / "cluster").start()
        try:
            yield cluster.url, cluster.servers
        finally:
            cluster.stop()


def _drop_clients(servers: list[RedisServer]) -> None:
    for server in servers:
        server.cli("CLIENT", "KILL", "TYPE", "normal", check=False)


def test_the_sync_face_reconnects(servers: tuple[str, list[RedisServer]]) -> None:
    url, nodes = servers
    with SyncSessionService(url) as svc:
        session = svc.create_session(app_name=APP, user_id=USER, session_id="s")
        for step in range(3):
            _drop_clients(nodes)
            svc.append_event(session, ev(delta={"n": step}))
            _drop_clients(nodes)
            got = svc.get_session(app_name=APP, user_id=USER, session_id="s")
            assert got is not None and len(got.events) == step + 1


def test_the_async_face_reconnects(servers: tuple[str, list[RedisServer]]) -> None:
    url, nodes = servers

    async def go() -> list[Any]:
        async with SessionService(url) as svc:
            session = await svc.create_session(app_name=APP, user_id=USER, session_id="s")
            for step in range(3):
                _drop_clients(nodes)
                await svc.append_event(session, ev(delta={"n": step}))
                _drop_clients(nodes)
                got = await svc.get_session(app_name=APP, user_id=USER, session_id="s")
                assert got is not None
            _drop_clients(nodes)
            listed = await svc.list_sessions(app_name=APP, user_id=USER)
            return [got.events, got.state, listed.sessions]

    events, state, listed = run(go())
    assert len(events) == 3 and state == {"n": 2} and [s.id for s in listed] == ["s"]


def test_the_first_calls_of_a_loop_make_one_client(
    servers: tuple[str, list[RedisServer]],
) -> None:
    """Many first calls at once wait for one client rather than each making one to close.

    On a cluster a client's making takes round trips to every node: each of
    hundreds of first calls making its own, and all but one closing theirs
    again, could time out closing them on a loaded machine.
    """
    from sessionscope.stores import open_store

    url, _ = servers
    store = open_store(url)
    made: list[Any] = []
    make = store._new_client

    def counted(*, asynchronous: bool) -> Any:
        client = make(asynchronous=asynchronous)
        made.append(asynchronous)
        return client

    store._new_client = counted  # type: ignore[method-assign]

    async def go() -> int:
        svc = SessionService(store)
        sessions = await asyncio.gather(
            *(svc.create_session(app_name=APP, user_id=f"first-{i}") for i in range(50))
        )
        return len({s.id for s in sessions})

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", ResourceWarning)
            assert run(go()) == 50
            assert made == [True]  # one asyncio client for the loop
            assert run(go()) == 50  # a new loop: a client of its own
            assert made == [True, True]
    finally:
        store.close()


def test_more_calls_at_once_than_connections_wait_for_one(
    servers: tuple[str, list[RedisServer]],
) -> None:
    """Three times the pool's connections at once, async and in threads: every call succeeds."""
    from sessionscope.stores.redis.runners import POOL_SIZE

    url, _ = servers
    calls = 3 * POOL_SIZE

    async def go() -> list[str]:
        async with SessionService(url) as svc:

            async def one(i: int) -> str:
                session = await svc.create_session(app_name=APP, user_id=f"u{i}")
                await svc.append_event(session, ev(delta={"n": i}))
                got = await svc.get_session(app_name=APP, user_id=f"u{i}", session_id=session.id)
                assert got is not None
                return str(got.state["n"])

            return list(await asyncio.gather(*(one(i) for i in range(calls))))

    # One client per event loop: the first calls, all at once, make one
    # (a client made twice and dropped would be a ResourceWarning).
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        assert run(go()) == [str(i) for i in range(calls)]

    errors: list[BaseException] = []
    with SyncSessionService(url) as svc:

        def create(i: int) -> None:
            try:
                svc.create_session(app_name="threads", user_id=f"u{i}")
            except BaseException as error:
                errors.append(error)

        threads = [threading.Thread(target=create, args=(i,)) for i in range(POOL_SIZE + 50)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert errors == []
        assert len(svc.list_sessions(app_name="threads").sessions) == POOL_SIZE + 50


_PACK_UNDER_INTERRUPTS = """
import signal
from sessionscope.stores.redis.client import _pack_in_c

# The handler raises only inside the call, and disarms itself as it does,
# so that nothing but the call is ever interrupted.
inside = False

def interrupt(*_):
    global inside
    if inside:
        inside = False
        raise KeyboardInterrupt

signal.signal(signal.SIGALRM, interrupt)
signal.setitimer(signal.ITIMER_REAL, 0.0005, 0.0005)
interrupted = 0
try:
    for _ in range(200_000):
        try:
            inside = True
            packed = _pack_in_c("FCALL", b"f", 1, b"k", 12345, 1.5, -0.0, 2**70, "text")
            inside = False
        except KeyboardInterrupt:
            interrupted += 1
finally:
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, signal.SIG_IGN)
assert packed == [
    b"*9\\r\\n$5\\r\\nFCALL\\r\\n$1\\r\\nf\\r\\n$1\\r\\n1\\r\\n$1\\r\\nk\\r\\n$5\\r\\n12345\\r\\n"
    b"$3\\r\\n1.5\\r\\n$4\\r\\n-0.0\\r\\n$22\\r\\n1180591620717411303424\\r\\n$4\\r\\ntext\\r\\n"
], packed
print(interrupted)
"""


def test_packing_a_command_survives_ctrl_c_landing_inside_it() -> None:
    """hiredis 3.5 converting an int or a float crashed the process when a signal handler raised.

    Ctrl-C of a command line run against Redis died of SIGSEGV now and then,
    with no clean-up. Every argument now reaches hiredis as bytes; a process
    interrupted thousands of times while packing carries on, and the bytes
    are the ones hiredis makes of the same arguments.
    """
    import subprocess
    import sys

    pytest.importorskip("hiredis")
    import _stores

    done = subprocess.run(
        [sys.executable, "-c", _PACK_UNDER_INTERRUPTS],
        capture_output=True,
        text=True,
        timeout=300,
        env=_stores.child_env(),
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert int(done.stdout) > 0  # the interrupts did land
