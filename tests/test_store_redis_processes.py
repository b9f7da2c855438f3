"""Several processes on one Redis server or cluster: locked appends, stale retries, crashes.

Children are fresh interpreters running ``_redis_workers.py``; every child is
killed (if still running) and reaped in a ``finally``.
"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import _stores
from _children import Child
from _children import children as spawn
from _redis import RedisCluster, RedisServer
from sessionscope import SyncSessionService

pytestmark = pytest.mark.slow

WORKERS = Path(__file__).with_name("_redis_workers.py")


@contextmanager
def children(tmp_path: Path, *arg_lists: tuple[str, ...]) -> Iterator[list[Child]]:
    """Start children of the Redis worker script, and always kill and reap them."""
    with spawn(tmp_path, *arg_lists, script=WORKERS) as started:
        yield started


@pytest.fixture(params=_stores.REDIS_KINDS)
def uri(request: pytest.FixtureRequest) -> str:
    """Return the URI of a fresh store (its own prefix) on the session's server or cluster."""
    server = request.getfixturevalue(
        "redis_server" if request.param == "redis" else "redis_cluster"
    )
    return f"{server.url}?prefix=p{uuid.uuid4().hex}"


def test_four_processes_locked_appends_lose_nothing(uri: str, tmp_path: Path) -> None:
    """Four processes append (locked) to one shared and their own sessions: nothing lost."""
    n_procs, per_proc = 4, 100
    go = tmp_path / "go"
    with SyncSessionService(uri) as svc:
        svc.create_session(app_name="app", user_id="user", session_id="shared")
    arg_lists = [
        ("concurrent", uri, "app", "user", "shared", str(i), str(per_proc), str(go))
        for i in range(n_procs)
    ]
    with children(tmp_path, *arg_lists) as started:
        for child in started:
            child.expect("ready")
        go.touch()
        for child in started:
            child.expect("done")
    with SyncSessionService(uri) as svc:
        shared = svc.get_session(app_name="app", user_id="user", session_id="shared")
        assert shared is not None
        assert len(shared.events) == n_procs * per_proc
        assert len({e.id for e in shared.events}) == n_procs * per_proc
        for i in range(n_procs):
            # Each worker's counters went up by one per append, read from its live copy.
            assert shared.state[f"count_{i}"] == per_proc
            assert shared.state[f"user:count_{i}"] == per_proc
            assert shared.state[f"app:count_{i}"] == per_proc
            own = svc.get_session(app_name="app", user_id=f"user-{i}", session_id=f"own-{i}")
            assert own is not None and len(own.events) == per_proc
            assert own.state["own"] == per_proc
            mine = [e.content["i"] for e in shared.events if e.content["w"] == i]
            assert mine == list(range(per_proc))


def test_counters_by_read_modify_append_lose_no_increment(uri: str, tmp_path: Path) -> None:
    """Four processes increment a counter, retrying on StaleSessionError: no increment lost."""
    n_procs, per_proc = 4, 40
    go = tmp_path / "go"
    with SyncSessionService(uri) as svc:
        svc.create_session(app_name="app", user_id="user", session_id="c", state={"n": 0})
    arg_lists = [("counter", uri, "app", "user", "c", str(per_proc), str(go))] * n_procs
    with children(tmp_path, *arg_lists) as started:
        for child in started:
            child.expect("ready")
        go.touch()
        retries = [int(child.expect("done").split()[1]) for child in started]
    with SyncSessionService(uri) as svc:
        s = svc.get_session(app_name="app", user_id="user", session_id="c")
        assert s is not None
        assert s.state["n"] == n_procs * per_proc
        assert len(s.events) == n_procs * per_proc
        assert [e.actions.state_delta["n"] for e in s.events] == list(
            range(1, 1 + n_procs * per_proc)
        )
    # Four writers on one session collide: the stale check was exercised.
    assert sum(retries) > 0


def test_cluster_app_delta_left_half_done_is_finished_once(
    redis_cluster: RedisCluster, tmp_path: Path
) -> None:
    """A process killed between the two steps of an app: delta loses nothing, applies it once.

    Until a reader of that user (or its next append) finishes the step, a
    session of another user does not see the key: that is the documented window.
    """
    uri = f"{redis_cluster.url}?prefix=p{uuid.uuid4().hex}"
    with SyncSessionService(uri) as svc:
        mine = svc.create_session(app_name="app", user_id="killed", session_id="s")
        other = svc.create_session(app_name="app", user_id="other", session_id="o")
        args = ("stop_between", uri, "app", "killed", "s", "from-child")
        with children(tmp_path, args) as (child,):
            child.expect("between")
            os.kill(child.proc.pid, signal.SIGKILL)
            child.proc.wait(timeout=30)
        # The window: the event is stored, the app map does not have its key yet.
        assert svc.get_app_state(app_name="app") == {}
        seen_by_other = svc.get_session(app_name="app", user_id="other", session_id="o")
        assert seen_by_other is not None and "app:flag" not in seen_by_other.state
        # A reader of the killed process's user finishes the step.
        got = svc.get_session(app_name="app", user_id="killed", session_id="s")
        assert got is not None and len(got.events) == 1
        assert got.state["app:flag"] == "from-child"
        assert svc.get_app_state(app_name="app") == {"flag": "from-child"}
        # Applied once: a later write by another user is not undone by reading again.
        svc.append_event(other, _stores.ev(delta={"app:flag": "later"}))
        again = svc.get_session(app_name="app", user_id="killed", session_id="s")
        assert again is not None and again.state["app:flag"] == "later"
        assert svc.get_app_state(app_name="app") == {"flag": "later"}
        assert mine.id == "s"


def test_cluster_next_append_finishes_a_half_done_step(
    redis_cluster: RedisCluster, tmp_path: Path
) -> None:
    """The user's next append (not only a reader) applies a delta its killed writer left."""
    uri = f"{redis_cluster.url}?prefix=p{uuid.uuid4().hex}"
    with SyncSessionService(uri) as svc:
        svc.create_session(app_name="app", user_id="killed", session_id="s")
        svc.create_session(app_name="app", user_id="killed", session_id="t")
        args = ("stop_between", uri, "app", "killed", "s", "v1")
        with children(tmp_path, args) as (child,):
            child.expect("between")
            os.kill(child.proc.pid, signal.SIGKILL)
            child.proc.wait(timeout=30)
        t = svc.get_session(app_name="app", user_id="killed", session_id="t")
        assert t is not None
        svc.append_event(t, _stores.ev(delta={"user:x": 1}))
        assert svc.get_app_state(app_name="app") == {"flag": "v1"}


def test_kill_9_of_redis_with_appendfsync_always_loses_no_acknowledged_append(
    tmp_path: Path,
) -> None:
    """With appendonly yes and appendfsync always, SIGKILL of redis-server keeps every ack."""
    server = RedisServer(tmp_path / "aof", "--appendonly", "yes", "--appendfsync", "always").start()
    try:
        uri = f"{server.url}?prefix=k&timeout=2"
        acknowledged: list[str] = []
        for _round in range(3):
            with children(tmp_path, ("kill_append", uri, "app", "user", "s")) as (child,):
                child.expect("ready")
                for _ in range(30):
                    line = child.readline()
                    assert line is not None and len(line) == 32, f"{line!r}: {child.stderr()}"
                    acknowledged.append(line)
                server.kill()
                # What the child printed before it saw the server go is acknowledged too.
                for _ in range(1_000):
                    line = child.readline(timeout=30)
                    if line is None or line.startswith("error"):
                        break
                    acknowledged.append(line)
            server.start()
            with SyncSessionService(uri) as svc:
                got = svc.get_session(app_name="app", user_id="user", session_id="s")
                assert got is not None
                ids = [e.id for e in got.events]
                missing = [eid for eid in acknowledged if eid not in ids]
                assert missing == []
                positions = [ids.index(eid) for eid in acknowledged]
                assert positions == sorted(positions)
                assert got.state["last"] == ids[-1]
    finally:
        server.stop()
