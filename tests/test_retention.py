"""Retention on every store: truncating events, expiring idle sessions, erasing a user or app.

The multi-process races (a truncation or an expiry while another process
appends) are in test_retention_processes.py.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import lmdb
import pytest

import _stores
from _stores import APP, USER, StoreFactory, ev, event_ids, run
from sessionscope import (
    GetSessionConfig,
    LmdbStore,
    MemoryStore,
    Session,
    SessionService,
    SyncSessionService,
)
from sessionscope.errors import SessionNotFoundError, StaleSessionError
from sessionscope.stores import open_store
from sessionscope.stores.records import event_copy

store_factory = _stores.store_factory
lmdb_factory = _stores.lmdb_factory

# Timestamps of the events of the out-of-order session, in append order.
OUT_OF_ORDER = [50.0, 10.0, 40.0, 20.0, 60.0, 30.0, 5.0, 70.0]


def _filled(svc: SyncSessionService, sid: str, stamps: list[float], user: str = USER) -> Session:
    """Create a session with state in every scope and one event per timestamp."""
    session = svc.create_session(
        app_name=APP,
        user_id=user,
        session_id=sid,
        state={"app:plan": "pro", "user:name": "Ada", "topic": b"\x00bytes"},
    )
    for index, stamp in enumerate(stamps):
        svc.append_event(
            session, ev(ts=stamp, delta={f"k{index}": index, "user:seen": index}, content=[index])
        )
    return session


def _stamps(session: Session | None) -> list[float]:
    assert session is not None
    return [e.timestamp for e in session.events]


def _get(svc: SyncSessionService, sid: str, user: str = USER, **config: Any) -> Session | None:
    return svc.get_session(
        app_name=APP,
        user_id=user,
        session_id=sid,
        config=GetSessionConfig(**config) if config else None,
    )


def _store_of(factory: StoreFactory, **options: Any) -> Any:
    """Open a store of the factory's kind with options the memory kind takes too."""
    if factory.kind == "memory":
        store = MemoryStore(**options)
        factory._opened.append(store)
        return store
    return factory(**options)


# -- truncate_events -----------------------------------------------------


def test_truncate_before_removes_earlier_events_and_keeps_state(
    store_factory: StoreFactory,
) -> None:
    svc = SyncSessionService(store_factory())
    _filled(svc, "s", OUT_OF_ORDER)
    before = _get(svc, "s")
    assert before is not None
    removed = svc.truncate_events(app_name=APP, user_id=USER, session_id="s", before=30.0)
    assert removed == 3  # 10, 20 and 5; 30 itself is kept (>= before)
    after = _get(svc, "s")
    assert after is not None
    assert _stamps(after) == [50.0, 40.0, 60.0, 30.0, 70.0]
    assert [e.content for e in after.events] == [[0], [2], [4], [5], [7]]
    assert after.state == before.state
    assert after.last_update_time == before.last_update_time
    assert after.revision != before.revision
    assert svc.get_user_state(app_name=APP, user_id=USER) == {"name": "Ada", "seen": 7}


def test_reads_after_a_truncation_from_the_middle(store_factory: StoreFactory) -> None:
    svc = SyncSessionService(store_factory())
    _filled(svc, "s", OUT_OF_ORDER)
    svc.truncate_events(app_name=APP, user_id=USER, session_id="s", before=30.0)
    # What remains: 50, 40, 60, 30, 70 (positions 0, 2, 4, 5, 7).
    assert _stamps(_get(svc, "s", num_recent_events=3)) == [60.0, 30.0, 70.0]
    assert _stamps(_get(svc, "s", num_recent_events=5)) == [50.0, 40.0, 60.0, 30.0, 70.0]
    assert _stamps(_get(svc, "s", num_recent_events=50)) == [50.0, 40.0, 60.0, 30.0, 70.0]
    assert _stamps(_get(svc, "s", num_recent_events=0)) == []
    assert _stamps(_get(svc, "s", after_timestamp=45.0)) == [50.0, 60.0, 70.0]
    assert _stamps(_get(svc, "s", after_timestamp=0.0)) == [50.0, 40.0, 60.0, 30.0, 70.0]
    assert _stamps(_get(svc, "s", num_recent_events=3, after_timestamp=45.0)) == [60.0, 70.0]
    meta = svc.list_sessions(app_name=APP).sessions[0]
    assert meta.event_count == 5


def test_truncate_keep_last(store_factory: StoreFactory) -> None:
    svc = SyncSessionService(store_factory())
    _filled(svc, "s", OUT_OF_ORDER)
    ids = event_ids(_get(svc, "s"))
    assert svc.truncate_events(app_name=APP, user_id=USER, session_id="s", keep_last=3) == 5
    assert event_ids(_get(svc, "s")) == ids[-3:]
    assert _stamps(_get(svc, "s", num_recent_events=2)) == [5.0, 70.0]
    # Keeping more than is stored removes nothing and leaves the revision alone.
    revision = _get(svc, "s").revision  # type: ignore[union-attr]
    assert svc.truncate_events(app_name=APP, user_id=USER, session_id="s", keep_last=3) == 0
    assert svc.truncate_events(app_name=APP, user_id=USER, session_id="s", keep_last=99) == 0
    assert _get(svc, "s").revision == revision  # type: ignore[union-attr]
    assert svc.truncate_events(app_name=APP, user_id=USER, session_id="s", keep_last=0) == 3
    emptied = _get(svc, "s")
    assert emptied is not None and emptied.events == []
    assert emptied.state["k7"] == 7 and emptied.state["topic"] == b"\x00bytes"
    assert svc.list_sessions(app_name=APP).sessions[0].event_count == 0


def test_truncate_makes_earlier_copies_stale(store_factory: StoreFactory) -> None:
    svc = SyncSessionService(store_factory())
    _filled(svc, "s", [1.0, 2.0, 3.0])
    old = _get(svc, "s")
    assert old is not None
    svc.truncate_events(app_name=APP, user_id=USER, session_id="s", keep_last=1)
    with pytest.raises(StaleSessionError):
        svc.append_event(old, ev(ts=4.0))
    fresh = _get(svc, "s")
    assert fresh is not None
    svc.append_event(fresh, ev(ts=4.0, delta={"after": True}))
    assert _stamps(_get(svc, "s")) == [3.0, 4.0]
    assert fresh.revision == _get(svc, "s").revision  # type: ignore[union-attr]


def test_locked_append_catches_up_after_a_truncation(store_factory: StoreFactory) -> None:
    svc = SyncSessionService(store_factory())
    _filled(svc, "s", [1.0, 2.0])
    live = _get(svc, "s")
    other = _get(svc, "s")
    assert live is not None and other is not None
    svc.append_event(other, ev(ts=3.0, delta={"from_other": 1}))
    svc.truncate_events(app_name=APP, user_id=USER, session_id="s", before=2.5)
    event = ev(ts=4.0, delta={"mine": 1})
    svc.append_event_locked(live, event)
    # The live copy keeps what it had, gains what it missed, then its own event.
    assert _stamps(live) == [1.0, 2.0, 3.0, 4.0]
    assert live.state["from_other"] == 1 and live.state["mine"] == 1
    assert _stamps(_get(svc, "s")) == [3.0, 4.0]
    assert live.revision == _get(svc, "s").revision  # type: ignore[union-attr]
    # A locked append from a copy read after the truncation misses nothing.
    svc.append_event_locked(live, ev(ts=5.0))
    assert _stamps(live) == [1.0, 2.0, 3.0, 4.0, 5.0]


def test_a_removed_event_id_is_no_longer_stored(store_factory: StoreFactory) -> None:
    svc = SyncSessionService(store_factory())
    session = _filled(svc, "s", [1.0, 2.0])
    first = session.events[0]
    svc.truncate_events(app_name=APP, user_id=USER, session_id="s", keep_last=1)
    fresh = _get(svc, "s")
    assert fresh is not None
    svc.append_event(fresh, first)
    assert event_ids(_get(svc, "s")) == [session.events[1].id, first.id]


def test_truncate_on_a_missing_session(store_factory: StoreFactory) -> None:
    svc = SyncSessionService(store_factory())
    with pytest.raises(SessionNotFoundError):
        svc.truncate_events(app_name=APP, user_id=USER, session_id="nope", keep_last=1)
    _filled(svc, "s", [1.0])
    svc.delete_session(app_name=APP, user_id=USER, session_id="s")
    with pytest.raises(SessionNotFoundError):
        svc.truncate_events(app_name=APP, user_id=USER, session_id="s", before=5.0)


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({}, "exactly one of before and keep_last"),
        ({"before": 1.0, "keep_last": 1}, "exactly one of before and keep_last"),
        ({"keep_last": -1}, "keep_last"),
        ({"keep_last": 1.5}, "keep_last"),
        ({"keep_last": True}, "keep_last"),
        ({"before": "yesterday"}, "before"),
        ({"before": float("nan")}, "before"),
        ({"before": float("inf")}, "before"),
        ({"before": False}, "before"),
        pytest.param({"before": 10**400}, "before", id="before-beyond-float"),
        ({"keep_last": 1, "app_name": ""}, "app_name"),
        ({"keep_last": 1, "user_id": 7}, "user_id"),
        ({"keep_last": 1, "session_id": None}, "session_id"),
    ],
)
def test_truncate_refuses_bad_arguments_and_changes_nothing(
    store_factory: StoreFactory, arguments: dict[str, Any], named: str
) -> None:
    svc = SyncSessionService(store_factory())
    _filled(svc, "s", [1.0, 2.0])
    before = _get(svc, "s")
    call = {"app_name": APP, "user_id": USER, "session_id": "s", **arguments}
    with pytest.raises(ValueError, match=named):
        svc.truncate_events(**call)
    assert _get(svc, "s") == before


def test_truncate_a_session_with_a_long_event_id(store_factory: StoreFactory) -> None:
    svc = SyncSessionService(store_factory())
    session = svc.create_session(app_name=APP, user_id=USER, session_id="s" * 400)
    svc.append_event(session, ev(ts=1.0, id="e" * 3000))
    svc.append_event(session, ev(ts=2.0, id="f" * 3000))
    assert svc.truncate_events(app_name=APP, user_id=USER, session_id="s" * 400, before=1.5) == 1
    fresh = _get(svc, "s" * 400)
    assert fresh is not None and event_ids(fresh) == ["f" * 3000]
    # The removed id's index entry went with it: appending it again is new.
    svc.append_event(fresh, ev(ts=3.0, id="e" * 3000))
    assert event_ids(_get(svc, "s" * 400)) == ["f" * 3000, "e" * 3000]


def test_truncate_survives_reopening(lmdb_factory: StoreFactory) -> None:
    store = lmdb_factory()
    svc = SyncSessionService(store)
    _filled(svc, "s", OUT_OF_ORDER)
    svc.truncate_events(app_name=APP, user_id=USER, session_id="s", before=30.0)
    revision = _get(svc, "s").revision  # type: ignore[union-attr]
    store.close()
    again = SyncSessionService(lmdb_factory.reopen())
    reread = _get(again, "s")
    assert reread is not None
    assert _stamps(reread) == [50.0, 40.0, 60.0, 30.0, 70.0]
    assert reread.revision == revision


def test_async_truncate(store_factory: StoreFactory) -> None:
    async def scenario() -> None:
        svc = SessionService(store_factory())
        session = await svc.create_session(app_name=APP, user_id=USER, session_id="s")
        for stamp in (1.0, 2.0, 3.0):
            await svc.append_event(session, ev(ts=stamp))
        removed = await svc.truncate_events(app_name=APP, user_id=USER, session_id="s", keep_last=1)
        assert removed == 2
        with pytest.raises(StaleSessionError):
            await svc.append_event(session, ev(ts=4.0))
        got = await svc.get_session(app_name=APP, user_id=USER, session_id="s")
        assert got is not None and [e.timestamp for e in got.events] == [3.0]
        with pytest.raises(SessionNotFoundError):
            await svc.truncate_events(app_name=APP, user_id=USER, session_id="x", before=1.0)
        with pytest.raises(ValueError, match="keep_last"):
            await svc.truncate_events(app_name=APP, user_id=USER, session_id="s", keep_last=-2)

    _stores.run(scenario())


@pytest.mark.adk
def test_the_adk_services_truncate_and_raise_adk_errors(store_factory: StoreFactory) -> None:
    from google.adk.errors.session_not_found_error import (
        SessionNotFoundError as AdkSessionNotFoundError,
    )
    from google.adk.events import Event as AdkEvent

    from sessionscope.adk import _AdkService

    async def scenario() -> None:
        service = _AdkService(store_factory())
        session = await service.create_session(app_name=APP, user_id=USER, session_id="s")
        for stamp in (1.0, 2.0, 3.0):
            await service.append_event(session, AdkEvent(author="a", timestamp=stamp))
        assert (
            await service.truncate_events(app_name=APP, user_id=USER, session_id="s", before=2.5)
            == 2
        )
        got = await service.get_session(app_name=APP, user_id=USER, session_id="s")
        assert got is not None and [e.timestamp for e in got.events] == [3.0]
        with pytest.raises(AdkSessionNotFoundError):
            await service.truncate_events(app_name=APP, user_id=USER, session_id="x", keep_last=0)
        assert await service.delete_user(app_name=APP, user_id=USER) == 1
        assert await service.expire_sessions(idle_for=0) == 0

    _stores.run(scenario())


# -- expire_sessions -----------------------------------------------------


def _idle_and_busy(svc: SyncSessionService, app: str = APP) -> None:
    """Make sessions idle since long ago (an old event) and sessions active now."""
    now = time.time()
    for index in range(5):
        old = svc.create_session(app_name=app, user_id=f"u{index % 2}", session_id=f"old{index}")
        svc.append_event(old, ev(ts=now - 3600 - index, delta={"user:k": index}))
        recent = svc.create_session(app_name=app, user_id=f"u{index % 2}", session_id=f"new{index}")
        svc.append_event(recent, ev(ts=now, delta={"x": index}))


def _ids(svc: SyncSessionService, app: str = APP) -> list[str]:
    return sorted(m.id for m in svc.list_sessions(app_name=app).sessions)


def test_expire_removes_idle_sessions_only(store_factory: StoreFactory) -> None:
    svc = SyncSessionService(store_factory())
    _idle_and_busy(svc)
    _idle_and_busy(svc, "other")
    fresh = svc.create_session(app_name=APP, user_id="u0", session_id="no-events")
    assert svc.expire_sessions(app_name=APP, idle_for=600) == 5
    assert _ids(svc) == ["new0", "new1", "new2", "new3", "new4", "no-events"]
    assert len(_ids(svc, "other")) == 10
    assert svc.get_session(app_name=APP, user_id="u0", session_id="old0") is None
    # User and app state are not a session's: they stay.
    assert svc.get_user_state(app_name=APP, user_id="u0") == {"k": 4}
    assert svc.expire_sessions(idle_for=600) == 5
    assert len(_ids(svc, "other")) == 5
    assert svc.expire_sessions(idle_for=600) == 0
    assert fresh.id in _ids(svc)


def test_expire_everything_idle_for_zero_seconds(store_factory: StoreFactory) -> None:
    svc = SyncSessionService(store_factory())
    _idle_and_busy(svc)
    # A session updated after the call started is not idle; all here are older.
    time.sleep(0.01)
    assert svc.expire_sessions(idle_for=0) == 10
    assert _ids(svc) == []
    assert svc.list_sessions(app_name=APP).sessions == []


def test_an_expired_session_can_be_created_again(store_factory: StoreFactory) -> None:
    svc = SyncSessionService(store_factory())
    _idle_and_busy(svc)
    svc.expire_sessions(idle_for=600)
    again = svc.create_session(app_name=APP, user_id="u0", session_id="old0")
    assert again.events == [] and "x" not in again.state
    got = svc.get_session(app_name=APP, user_id="u0", session_id="old0")
    assert got is not None and got.events == []


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"idle_for": -1}, "idle_for"),
        ({"idle_for": "1h"}, "idle_for"),
        ({"idle_for": float("nan")}, "idle_for"),
        ({"idle_for": True}, "idle_for"),
        pytest.param({"idle_for": 10**400}, "idle_for", id="idle-beyond-float"),
        ({"idle_for": 1, "app_name": ""}, "app_name"),
        ({"idle_for": 1, "app_name": 3}, "app_name"),
    ],
)
def test_expire_refuses_bad_arguments_and_changes_nothing(
    store_factory: StoreFactory, arguments: dict[str, Any], named: str
) -> None:
    svc = SyncSessionService(store_factory())
    _idle_and_busy(svc)
    with pytest.raises(ValueError, match=named):
        svc.expire_sessions(**arguments)
    assert len(_ids(svc)) == 10


def test_async_expire_delete_user_and_app(store_factory: StoreFactory) -> None:
    store = store_factory()
    _idle_and_busy(SyncSessionService(store))

    async def scenario() -> None:
        svc = SessionService(store)
        assert await svc.expire_sessions(app_name=APP, idle_for=600) == 5
        assert await svc.delete_user(app_name=APP, user_id="u0") == 3
        assert await svc.get_user_state(app_name=APP, user_id="u0") == {}
        assert await svc.delete_app(app_name=APP) == 2
        listed = await svc.list_sessions(app_name=APP)
        assert listed.sessions == []
        with pytest.raises(ValueError, match="idle_for"):
            await svc.expire_sessions(idle_for=-5)

    _stores.run(scenario())


# -- delete_user and delete_app ------------------------------------------


def test_delete_user_removes_sessions_and_user_state(store_factory: StoreFactory) -> None:
    store = store_factory()
    svc = SyncSessionService(store)
    for user in ("ada", "bob"):
        for index in range(3):
            _filled(svc, f"s{index}", [1.0, 2.0], user=user)
    assert svc.delete_user(app_name=APP, user_id="ada") == 3
    assert svc.list_sessions(app_name=APP, user_id="ada").sessions == []
    assert svc.get_user_state(app_name=APP, user_id="ada") == {}
    assert len(svc.list_sessions(app_name=APP, user_id="bob").sessions) == 3
    assert svc.get_user_state(app_name=APP, user_id="bob") == {"name": "Ada", "seen": 1}
    assert svc.get_app_state(app_name=APP) == {"plan": "pro"}
    assert store.list_users(APP) == ["bob"]
    assert svc.delete_user(app_name=APP, user_id="ada") == 0


def test_delete_user_with_state_and_no_sessions(store_factory: StoreFactory) -> None:
    store = store_factory()
    svc = SyncSessionService(store)
    svc.create_session(app_name=APP, user_id="ada", session_id="s", state={"user:k": 1})
    svc.delete_session(app_name=APP, user_id="ada", session_id="s")
    assert store.list_users(APP) == ["ada"]
    assert svc.delete_user(app_name=APP, user_id="ada") == 0
    assert svc.get_user_state(app_name=APP, user_id="ada") == {}
    assert store.list_users(APP) == []


def test_delete_app_removes_everything_of_the_app(store_factory: StoreFactory) -> None:
    store = store_factory()
    svc = SyncSessionService(store)
    for app in ("one", "two"):
        for user in ("ada", "bob"):
            session = svc.create_session(
                app_name=app, user_id=user, state={"app:a": app, "user:u": user, "s": 1}
            )
            svc.append_event(session, ev(ts=1.0, delta={"app:b": 2}))
    assert store.list_apps() == ["one", "two"]
    assert svc.delete_app(app_name="one") == 2
    assert svc.list_sessions(app_name="one").sessions == []
    assert svc.get_app_state(app_name="one") == {}
    assert svc.get_user_state(app_name="one", user_id="ada") == {}
    assert store.list_apps() == ["two"]
    assert store.list_users("one") == []
    assert svc.get_app_state(app_name="two") == {"a": "two", "b": 2}
    assert svc.get_user_state(app_name="two", user_id="bob") == {"u": "bob"}
    assert len(svc.list_sessions(app_name="two").sessions) == 2
    assert svc.delete_app(app_name="one") == 0


def test_delete_user_and_app_refuse_bad_ids(store_factory: StoreFactory) -> None:
    svc = SyncSessionService(store_factory())
    _filled(svc, "s", [1.0])
    with pytest.raises(ValueError, match="user_id"):
        svc.delete_user(app_name=APP, user_id="")
    with pytest.raises(ValueError, match="app_name"):
        svc.delete_user(app_name=None, user_id=USER)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="app_name"):
        svc.delete_app(app_name="x" * 5000)
    assert _get(svc, "s") is not None


def test_listing_apps_and_users(store_factory: StoreFactory) -> None:
    store = store_factory()
    svc = SyncSessionService(store)
    assert store.list_apps() == []
    svc.create_session(app_name="b", user_id="u1", session_id="s")
    svc.create_session(app_name="a", user_id="u2", session_id="s", state={"user:x": 1})
    svc.create_session(app_name="a", user_id="u1", session_id="s")
    # State alone makes an app and a user known.
    svc.create_session(app_name="c", user_id="only-state", state={"app:k": 1, "user:k": 2})
    svc.delete_session(app_name="a", user_id="u2", session_id="s")
    (only,) = svc.list_sessions(app_name="c").sessions
    svc.delete_session(app_name="c", user_id="only-state", session_id=only.id)
    odd = "日本:/\x00 " + "z" * 60
    svc.create_session(app_name=odd, user_id=odd, session_id=odd)
    assert store.list_apps() == sorted(["a", "b", "c", odd])
    assert store.list_users("a") == ["u1", "u2"]
    assert store.list_users("c") == ["only-state"]
    assert store.list_users(odd) == [odd]
    assert store.list_users("nope") == []
    # Ids over 150 bytes are listed through their sessions.
    long_id = "L" * 300
    svc.create_session(app_name=long_id, user_id=long_id, session_id="s")
    assert long_id in store.list_apps()
    assert store.list_users(long_id) == [long_id]


# -- session_ttl ---------------------------------------------------------


def _wait_until(check: Any, seconds: float = 20.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return bool(check())


def _expirer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "sessionscope-expirer"]


def test_session_ttl_expires_in_the_background(store_factory: StoreFactory) -> None:
    threads_before = len(_expirer_threads())
    # A two-second TTL passes every second; the busy sessions are dated ahead.
    store = _store_of(store_factory, session_ttl=2)
    svc = SyncSessionService(store)
    now = time.time()
    for index in range(4):
        idle = svc.create_session(app_name=APP, user_id=USER, session_id=f"idle{index}")
        svc.append_event(idle, ev(ts=now - 60))
        busy = svc.create_session(app_name=APP, user_id=USER, session_id=f"busy{index}")
        svc.append_event(busy, ev(ts=now + 3600))
    assert _wait_until(lambda: len(_ids(svc)) == 4)
    assert _ids(svc) == ["busy0", "busy1", "busy2", "busy3"]
    assert len(_expirer_threads()) == threads_before + 1
    svc.close()
    assert len(_expirer_threads()) == threads_before


def test_session_ttl_expires_at_open(lmdb_factory: StoreFactory) -> None:
    first = lmdb_factory()
    _idle_and_busy(SyncSessionService(first))
    first.close()
    store = lmdb_factory.reopen(session_ttl=600)
    svc = SyncSessionService(store)
    assert _wait_until(lambda: len(_ids(svc)) == 5)
    store.close()


def test_session_ttl_from_a_uri(tmp_path: Any) -> None:
    store = open_store(f"lmdb://{tmp_path / 'store'}?session_ttl=30")
    try:
        assert isinstance(store, LmdbStore) and store.session_ttl == 30.0
    finally:
        store.close()
    memory = open_store("memory://?session_ttl=2.5")
    try:
        assert isinstance(memory, MemoryStore) and memory.session_ttl == 2.5
    finally:
        memory.close()


@pytest.mark.adk
def test_session_ttl_through_the_adk_service_uri(tmp_path: Any) -> None:
    from sessionscope.adk import LmdbSessionService

    service = LmdbSessionService(uri=f"lmdb://{tmp_path / 'store'}?session_ttl=3600")
    try:
        assert service.store.session_ttl == 3600.0  # type: ignore[attr-defined]
        assert len(_expirer_threads()) == 1
    finally:
        _stores.run(service.close())
    assert _expirer_threads() == []


@pytest.mark.parametrize(
    "ttl", [0, -1, float("nan"), float("inf"), "10", True, pytest.param(10**400, id="beyond-float")]
)
def test_session_ttl_must_be_positive_seconds(tmp_path: Any, ttl: Any) -> None:
    with pytest.raises(ValueError, match="session_ttl"):
        MemoryStore(session_ttl=ttl)
    with pytest.raises(ValueError, match="session_ttl"):
        LmdbStore(tmp_path / "store", session_ttl=ttl)


@pytest.mark.parametrize("query", ["session_ttl=", "session_ttl=soon", "session_ttl=-3"])
def test_session_ttl_uri_values_are_checked(tmp_path: Any, query: str) -> None:
    with pytest.raises(ValueError, match="session_ttl"):
        open_store(f"lmdb://{tmp_path / 'store'}?{query}")
    with pytest.raises(ValueError, match="session_ttl"):
        open_store(f"memory://?{query}")
    assert not (tmp_path / "store" / "data.mdb").exists()


# -- the LMDB layout after removals --------------------------------------


def _entries(store: LmdbStore) -> dict[str, int]:
    entries: dict[str, int] = store.stat()["entries"]
    return entries


def test_lmdb_removals_leave_no_entries_behind(lmdb_factory: StoreFactory) -> None:
    store = lmdb_factory()
    svc = SyncSessionService(store)
    empty = _entries(store)
    for user in ("ada", "bob"):
        for index in range(4):
            _filled(svc, f"s{index}", [float(i) for i in range(30)], user=user)
    svc.truncate_events(app_name=APP, user_id="bob", session_id="s0", keep_last=0)
    svc.delete_user(app_name=APP, user_id="ada")
    svc.delete_app(app_name=APP)
    assert _entries(store) == empty


def test_lmdb_finishes_a_purge_left_by_a_crash(lmdb_factory: StoreFactory) -> None:
    store = lmdb_factory()
    svc = SyncSessionService(store)
    _filled(svc, "gone", [1.0, 2.0, 3.0])
    path = store.path
    number = svc.list_sessions(app_name=APP).sessions[0].revision.split(":")[0]
    store.close()
    # What a crash after removing the record and before the purge leaves.
    env = lmdb.open(str(path), max_dbs=8)
    with env.begin(write=True) as txn:
        sessions = env.open_db(b"sessions", txn=txn, create=False)
        meta = env.open_db(b"meta", txn=txn, create=False)
        cursor = txn.cursor(db=sessions)
        assert cursor.first()
        cursor.delete()
        txn.put(b"purge" + int(number).to_bytes(8, "big"), b"", db=meta)
    env.close()
    again = lmdb_factory.reopen()
    assert _entries(again)["data"] > 0
    assert SyncSessionService(again).expire_sessions(idle_for=3600) == 0
    assert _entries(again)["data"] == 0
    assert _entries(again)["meta"] == 2


def test_lmdb_golden_format_records_still_have_eight_fields(lmdb_factory: StoreFactory) -> None:
    store = lmdb_factory()
    svc = SyncSessionService(store)
    _filled(svc, "plain", [1.0, 2.0])
    _filled(svc, "cut", [1.0, 2.0])
    svc.truncate_events(app_name=APP, user_id=USER, session_id="cut", keep_last=1)
    path = store.path
    store.close()
    env = lmdb.open(str(path), readonly=True, lock=False, max_dbs=8)
    from sessionscope import codec

    with env.begin() as txn:
        sessions = env.open_db(b"sessions", txn=txn, create=False)
        lengths = {
            codec.unpack(value)[2]: len(codec.unpack(value)) for _, value in txn.cursor(db=sessions)
        }
    env.close()
    assert lengths == {"plain": 8, "cut": 9}


def test_closing_while_the_expirer_runs(lmdb_factory: StoreFactory) -> None:
    store = lmdb_factory(session_ttl=1)
    svc = SyncSessionService(store)
    _idle_and_busy(svc)
    svc.close()
    assert _expirer_threads() == []
    again = lmdb_factory.reopen()
    # Whatever the expirer did, every session is whole or gone.
    for meta in SyncSessionService(again).list_sessions(app_name=APP).sessions:
        session = again.load_session(APP, meta.user_id, meta.id, None, None)
        assert session is not None and len(session.events) == 1


def test_lmdb_layout_is_consistent_after_every_removal(lmdb_factory: StoreFactory) -> None:
    store = lmdb_factory()
    svc = SyncSessionService(store)
    for user in ("ada", "bob", "carol"):
        for index in range(3):
            _filled(svc, f"s{index}", OUT_OF_ORDER, user=user)
    assert store.check_layout() == []
    svc.truncate_events(app_name=APP, user_id="ada", session_id="s0", before=30.0)
    svc.truncate_events(app_name=APP, user_id="ada", session_id="s1", keep_last=2)
    svc.truncate_events(app_name=APP, user_id="ada", session_id="s2", keep_last=0)
    assert store.check_layout() == []
    live = _get(svc, "s0", user="ada")
    assert live is not None
    svc.append_event(live, ev(ts=1.0, delta={"again": 1}))
    assert store.check_layout() == []
    svc.delete_user(app_name=APP, user_id="bob")
    svc.expire_sessions(idle_for=0)
    assert store.check_layout() == []
    assert _entries(store)["sessions"] == 0


# -- a pop conditional on the newest event ------------------------------------------


@pytest.fixture(params=(*_stores.STORE_KINDS, *_stores.ENCRYPTED_KINDS))
def any_store_factory(
    request: pytest.FixtureRequest, tmp_path: Any
) -> Any:  # every kind, plain and encrypted
    yield from _stores.factory_of_param(request, tmp_path)


def _popped_ids(records: list[bytes]) -> list[str]:
    return [event_copy(record).event_id for record in records]


async def _pop_async(store: Any, *args: Any, **options: Any) -> list[bytes]:
    """Pop through the store's async face, from inside an event loop."""
    popped: list[bytes] = await store.aio.pop_events(*args, **options)
    return popped


def _as_stored(store: Any, sid: str) -> tuple[Any, list[bytes]]:
    """Return a session's record and every stored event, as the store reads them."""
    loaded = store.load_session(APP, USER, sid, None, None)
    assert loaded is not None
    return loaded.record, loaded.events


def test_a_pop_conditional_on_the_newest_event(any_store_factory: StoreFactory) -> None:
    """The events go only while the newest is the one named; otherwise nothing moves."""
    store = any_store_factory()
    svc = SyncSessionService(store)
    session = _filled(svc, "s", [1.0, 2.0, 3.0, 4.0])
    ids = event_ids(session)
    before = _as_stored(store, "s")
    for stale in (ids[2], ids[0], "never-stored"):
        with pytest.raises(StaleSessionError, match="nothing was removed"):
            store.pop_events(APP, USER, "s", 2, if_last_event_id=stale).result()
        assert _as_stored(store, "s") == before
    # The newest named: the pop happens, and again on what is left (a gap now).
    popped = store.pop_events(APP, USER, "s", 1, if_last_event_id=ids[3]).result()
    assert _popped_ids(popped) == ids[3:]
    with pytest.raises(StaleSessionError):
        store.pop_events(APP, USER, "s", 1, if_last_event_id=ids[3]).result()
    popped = store.pop_events(APP, USER, "s", 2, if_last_event_id=ids[2]).result()
    assert _popped_ids(popped) == ids[1:3]
    record, events = _as_stored(store, "s")
    assert _popped_ids(events) == ids[:1] and record.last_event_id == ids[0]
    # The async face takes the condition too.
    with pytest.raises(StaleSessionError):
        run(_pop_async(store, APP, USER, "s", 1, if_last_event_id=ids[1]))
    assert _popped_ids(run(_pop_async(store, APP, USER, "s", 5, if_last_event_id=ids[0]))) == [
        ids[0]
    ]
    # An empty session has no newest event: the condition fails, unlike a plain pop.
    with pytest.raises(StaleSessionError):
        store.pop_events(APP, USER, "s", 1, if_last_event_id=ids[0]).result()
    assert store.pop_events(APP, USER, "s", 1).result() == []
    # A session that does not exist is not found, with a condition or without.
    for condition in ({}, {"if_last_event_id": ids[0]}):
        with pytest.raises(SessionNotFoundError):
            store.pop_events(APP, USER, "missing", 1, **condition).result()
        with pytest.raises(SessionNotFoundError):
            run(_pop_async(store, APP, USER, "missing", 1, **condition))
    assert svc.get_session(app_name=APP, user_id=USER, session_id="s") is not None


def test_a_conditional_pop_after_a_truncation(store_factory: StoreFactory) -> None:
    """Positions removed at the front (Redis: the positions set) do not confuse the check."""
    store = store_factory()
    svc = SyncSessionService(store)
    ids = event_ids(_filled(svc, "s", OUT_OF_ORDER))
    svc.truncate_events(app_name=APP, user_id=USER, session_id="s", keep_last=3)
    before = _as_stored(store, "s")
    with pytest.raises(StaleSessionError):
        store.pop_events(APP, USER, "s", 1, if_last_event_id=ids[-2]).result()
    assert _as_stored(store, "s") == before
    popped = store.pop_events(APP, USER, "s", 1, if_last_event_id=ids[-1]).result()
    assert _popped_ids(popped) == ids[-1:]
    assert _popped_ids(_as_stored(store, "s")[1]) == ids[-3:-1]
