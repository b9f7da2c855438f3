"""Several processes on one LMDB store: kill -9, concurrent appends, staleness, growth.

Children are fresh interpreters (``subprocess`` with ``sys.executable``): no
process ever forks with an open environment. Every child is killed and reaped
in a ``finally``.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import pytest

import _stores
import sessionscope
from _children import Child, children
from _stores import APP, USER, ev, event_ids
from sessionscope import LmdbStore, SyncSessionService
from sessionscope.errors import StaleSessionError

pytestmark = pytest.mark.slow

WORKERS = _stores.WORKERS


def _read_json(child: Child) -> Any:
    line = child.readline()
    assert line is not None, f"child ended early: {child.stderr()}"
    return json.loads(line)


# (1) kill -9 loses nothing acknowledged


@pytest.mark.parametrize("durability", ["sync", "deferred"])
def test_kill_9_loses_no_acknowledged_event(tmp_path: Path, durability: str) -> None:
    """Every event whose append returned survives SIGKILL, in order; the store stays sound.

    A process crash leaves LMDB's committed pages in the OS page cache, so even
    deferred durability keeps every commit (only power loss could lose what
    came after the last flush); either way the store must not be corrupt.
    """
    path = tmp_path / "store"
    rng = random.Random(1234)
    acknowledged: list[str] = []
    rounds = 5
    deadline = time.monotonic() + 60
    for round_no in range(rounds):
        if time.monotonic() > deadline:
            break
        target = rng.randint(1, 40)
        args = ("kill_append", str(path), APP, USER, "s", durability)
        with children(tmp_path, args) as (child,):
            line = child.readline()
            assert line is not None and line.startswith("ready"), child.stderr()
            while target > 0:
                line = child.readline()
                assert line is not None, f"child ended early: {child.stderr()}"
                if line != "flushed":
                    acknowledged.append(line)
                    target -= 1
            child.proc.kill()
            child.proc.wait(timeout=30)
            # Lines printed before the kill are acknowledged appends too.
            for _ in range(1_000_000):
                line = child.readline(timeout=10)
                if line is None:
                    break
                if len(line) == 32:  # a whole event id, not "flushed" or a torn line
                    acknowledged.append(line)
        store = LmdbStore(path, durability=durability)
        try:
            svc = SyncSessionService(store)
            got = svc.get_session(app_name=APP, user_id=USER, session_id="s")
            assert got is not None
            ids = event_ids(got)
            assert len(ids) == len(set(ids))
            # Acknowledged ids are all there, in order; at most one unacknowledged
            # (committed, killed before it printed) per round.
            positions = {eid: n for n, eid in enumerate(ids)}
            missing = [eid for eid in acknowledged if eid not in positions]
            assert missing == [], f"round {round_no}: lost {len(missing)} acknowledged events"
            order = [positions[eid] for eid in acknowledged]
            assert order == sorted(order)
            assert len(ids) - len(acknowledged) <= round_no + 1
            assert got.state["last"] == ids[-1]
            metas = svc.list_sessions(app_name=APP).sessions
            assert [m.id for m in metas] == ["s"]
            assert metas[0].event_count == len(ids)
            assert metas[0].revision == got.revision
            assert metas[0].last_update_time == got.events[-1].timestamp
            tail = svc.get_session(
                app_name=APP,
                user_id=USER,
                session_id="s",
                config=sessionscope.GetSessionConfig(num_recent_events=3),
            )
            assert tail is not None and event_ids(tail) == ids[-3:]
            # The store still takes writes.
            svc.append_event(got, ev(delta={"parent": round_no}))
            acknowledged.append(got.events[-1].id)
        finally:
            store.close()
    assert len(acknowledged) >= rounds


# (2) concurrent appenders


def test_concurrent_processes_lose_no_event_and_no_key(tmp_path: Path) -> None:
    """Four processes append (locked) to a shared and own sessions: nothing lost."""
    path = tmp_path / "store"
    n_procs, per_proc = 4, 200
    with SyncSessionService(LmdbStore(path)) as svc:
        svc.create_session(app_name=APP, user_id=USER, session_id="shared")
    go = tmp_path / "go"
    args = [
        ("concurrent", str(path), APP, USER, "shared", str(i), str(per_proc), str(go))
        for i in range(n_procs)
    ]
    with children(tmp_path, *args) as procs:
        for child in procs:
            assert child.readline() == "ready", child.stderr()
        go.touch()
        for child in procs:
            assert child.readline(timeout=90) == "done", child.stderr()
            child.wait_ok()
    with SyncSessionService(LmdbStore(path)) as svc:
        shared = svc.get_session(app_name=APP, user_id=USER, session_id="shared")
        assert shared is not None
        ids = event_ids(shared)
        assert len(ids) == len(set(ids)) == n_procs * per_proc
        for i in range(n_procs):
            mine = [e.content["i"] for e in shared.events if e.content["w"] == i]
            assert mine == list(range(per_proc))
            assert shared.state[f"count_{i}"] == per_proc
            assert shared.state[f"app:count_{i}"] == per_proc
            assert shared.state[f"user:count_{i}"] == per_proc
            own = svc.get_session(app_name=APP, user_id=USER, session_id=f"own-{i}")
            assert own is not None
            assert [e.content["i"] for e in own.events] == list(range(per_proc))
            assert own.state["own"] == per_proc
        app_state = svc.get_app_state(app_name=APP)
        user_state = svc.get_user_state(app_name=APP, user_id=USER)
        assert app_state == {f"count_{i}": per_proc for i in range(n_procs)}
        assert user_state == {f"count_{i}": per_proc for i in range(n_procs)}
        metas = svc.list_sessions(app_name=APP).sessions
        assert sorted(m.id for m in metas) == sorted(
            ["shared", *(f"own-{i}" for i in range(n_procs))]
        )
        counts = {m.id: m.event_count for m in metas}
        assert counts["shared"] == n_procs * per_proc


# (3) stale detection across processes


def test_stale_copy_is_detected_across_processes(tmp_path: Path) -> None:
    """A reads, B (another process) appends, A's append from its old copy is stale."""
    path = tmp_path / "store"
    store = LmdbStore(path)
    try:
        svc = SyncSessionService(store)
        svc.create_session(app_name=APP, user_id=USER, session_id="s", state={"k": 0})
        a = svc.get_session(app_name=APP, user_id=USER, session_id="s")
        assert a is not None
        with children(tmp_path, ("append_one", str(path), APP, USER, "s", "from-b")) as (b,):
            _read_json(b)
            b.wait_ok()
        before = svc.get_session(app_name=APP, user_id=USER, session_id="s")
        assert before is not None and event_ids(before) == ["from-b"]
        with pytest.raises(StaleSessionError):
            svc.append_event(a, ev(delta={"by": "a"}))
        after = svc.get_session(app_name=APP, user_id=USER, session_id="s")
        assert after == before
        assert after.state == {"k": 0, "by": "child"}
    finally:
        store.close()


def test_stale_copy_in_a_child_is_detected(tmp_path: Path) -> None:
    """The other way round: the child holds the old copy, the parent appends."""
    path = tmp_path / "store"
    go = tmp_path / "go"
    with SyncSessionService(LmdbStore(path)) as svc:
        svc.create_session(app_name=APP, user_id=USER, session_id="s")
    with children(tmp_path, ("stale_reader", str(path), APP, USER, "s", str(go))) as (child,):
        assert child.readline() == "ready", child.stderr()
        with SyncSessionService(LmdbStore(path)) as svc:
            s = svc.get_session(app_name=APP, user_id=USER, session_id="s")
            assert s is not None
            e = svc.append_event(s, ev(delta={"by": "parent"}))
            go.touch()
            assert _read_json(child) == {"error": "StaleSessionError"}
            child.wait_ok()
            got = svc.get_session(app_name=APP, user_id=USER, session_id="s")
            assert got is not None
            assert event_ids(got) == [e.id]
            assert got.state == {"by": "parent"}


# (4) a map grown by another process


def test_a_map_grown_by_another_process(tmp_path: Path) -> None:
    """A child opened with a small map reads and writes after the parent grew it."""
    path = tmp_path / "store"
    with SyncSessionService(LmdbStore(path, map_size=1 << 20)) as svc:
        svc.create_session(app_name=APP, user_id=USER, session_id="big")
    with children(tmp_path, ("grow_child", str(path), APP, USER, "big"), stdin=True) as (child,):
        assert child.readline() == "ready", child.stderr()
        written = 0
        with SyncSessionService(LmdbStore(path, map_size=1 << 20)) as svc:
            big = svc.get_session(app_name=APP, user_id=USER, session_id="big")
            assert big is not None
            for i in range(400):  # about 25 MiB, far past the child's 1 MiB map
                svc.append_event(big, ev(content=bytes([i % 251]) * (64 * 1024)))
                written += 64 * 1024
            child.send("go")
            answer = _read_json(child)
            child.wait_ok()
            assert answer["events"] == 400
            assert answer["bytes"] == written
            got = svc.get_session(app_name=APP, user_id=USER, session_id="child")
            assert got is not None
            assert event_ids(got) == answer["ids"]
            assert (path / "data.mdb").stat().st_size > written


# (5) interrupts in the middle of appends


@pytest.mark.skipif(
    sessionscope.core.IMPLEMENTATIONS.get("sessionscope.stores.lmdb._locks") != "c",
    reason="only the compiled locks are interrupt-exact: Python code, the twin's "
    "included, may run a signal handler between any two of its bytecodes",
)
@pytest.mark.parametrize("durability", ["sync", "deferred"])
def test_interrupts_while_appending_leave_no_lock_held(tmp_path: Path, durability: str) -> None:
    """SIGINT every fraction of a millisecond while a thread appends: nothing stays locked.

    A KeyboardInterrupt raised between a lock taken and the code that gives it
    back left the store's gate counted as held, and close() then waited for
    ever. Afterwards an append and close() must end, and every append that
    returned must be stored.
    """
    path = tmp_path / "store"
    args = ("append_under_interrupts", str(path), durability, "2")
    with children(tmp_path, args) as (child,):
        report = _read_json(child)
        child.wait_ok()
    assert report["interrupts"] > 100, "the signals did not reach the appends"
    assert report["appended"] is True
    assert report["closed"] is True
    store = LmdbStore(path, durability=durability)
    try:
        store.verify()
        got = SyncSessionService(store).get_session(app_name="app", user_id="user", session_id="s")
        assert got is not None
        stored = set(event_ids(got))
        assert set(report["acknowledged"]) <= stored
        assert len(event_ids(got)) == len(stored)
    finally:
        store.close()
