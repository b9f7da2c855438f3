"""A retry of an append whose reply was lost brings the live session up to date.

The store applied the append but its answer never reached the caller (a
timeout, a stalled network); the caller retries the same event on the same
live session. The store holds the event right after the live copy's
revision, so the retry answers as the append would have: the live session
gets the event, its delta and the new revision, and the next append goes on.
A lost reply is simulated by appending through a copy of the live session
(the append the store applied), then retrying on the original object; the
Redis store also meets a real one (a server stopped with SIGSTOP).
"""

from __future__ import annotations

import asyncio
import copy
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import _redis
import _stores
from _redis import RedisServer
from _stores import APP, USER, StoreFactory, clone, ev, event_ids, run
from sessionscope import Session, SessionService, SyncSessionService
from sessionscope.errors import DuplicateEventError, StaleSessionError, StoreError

# Fixtures shared with the other modules (bound here so pytest finds them).
store_factory = _stores.store_factory
redis_server = _redis.redis_server
redis_cluster = _redis.redis_cluster

DELTA = {"k": 1, "user:u": 2, "app:a": 3, "temp:t": 4}
# What a live session holds after DELTA: temp keys are applied to it alone.
HELD = {"k": 1, "user:u": 2, "app:a": 3, "temp:t": 4}


def _stored(svc: SyncSessionService, sid: str = "s") -> Session:
    got = svc.get_session(app_name=APP, user_id=USER, session_id=sid)
    assert got is not None
    return got


def _lost_reply(svc: SyncSessionService, live: Session, event: Any) -> Session:
    """Apply ``event`` as the store would have for ``live``; return the copy that saw the reply."""
    applied = clone(live)
    svc.append_event(applied, event)
    return applied


@pytest.mark.parametrize("locked", [False, True], ids=["plain", "locked"])
def test_a_retry_after_a_lost_reply_is_returned_as_appended(
    store_factory: StoreFactory, locked: bool
) -> None:
    """Sync: the live session gets the event once, its delta, the revision; then goes on."""
    svc = SyncSessionService(store_factory())
    live = svc.create_session(app_name=APP, user_id=USER, session_id="s", state={"k": 0})
    svc.append_event(live, ev(delta={"k": 0}, ts=10.0))
    event = ev(delta=DELTA, content={"text": "hi"}, ts=20.0)
    applied = _lost_reply(svc, live, clone(event))
    append = svc.append_event_locked if locked else svc.append_event
    retry = clone(event)
    assert append(live, retry) is retry
    assert event_ids(live) == event_ids(applied) == event_ids(_stored(svc))
    assert live.events[-1] is retry
    assert live.state == HELD
    assert live.revision == applied.revision == _stored(svc).revision
    assert live.last_update_time == 20.0
    # Stored once, applied once.
    assert len(_stored(svc).events) == 2
    assert _stored(svc).state == {"k": 1, "user:u": 2, "app:a": 3}
    # The next append on the live session is not stale.
    svc.append_event(live, ev(delta={"k": 5}, ts=30.0))
    assert _stored(svc).state["k"] == 5
    assert event_ids(live) == event_ids(_stored(svc))


@pytest.mark.parametrize("locked", [False, True], ids=["plain", "locked"])
def test_an_async_retry_after_a_lost_reply_is_returned_as_appended(
    store_factory: StoreFactory, locked: bool
) -> None:
    """Async: as the sync face."""
    asvc = SessionService(store_factory())

    async def main() -> None:
        live = await asvc.create_session(app_name=APP, user_id=USER, session_id="s")
        event = ev(delta=DELTA, ts=20.0)
        applied = clone(live)
        await asvc.append_event(applied, clone(event))
        append = asvc.append_event_locked if locked else asvc.append_event
        retry = clone(event)
        assert await append(live, retry) is retry
        assert event_ids(live) == [event.id]
        assert live.state == HELD
        assert live.revision == applied.revision
        assert live.last_update_time == 20.0
        await asvc.append_event(live, ev(delta={"k": 2}, ts=21.0))
        stored = await asvc.get_session(app_name=APP, user_id=USER, session_id="s")
        assert stored is not None
        assert event_ids(stored) == event_ids(live)
        assert stored.state == {"k": 2, "user:u": 2, "app:a": 3}

    run(main())


def test_a_retry_after_a_truncation_keeps_the_revision_form(store_factory: StoreFactory) -> None:
    """A copy read after a truncation gets the revision right after its event, removals kept."""
    svc = SyncSessionService(store_factory())
    s = svc.create_session(app_name=APP, user_id=USER, session_id="s")
    for n in range(3):
        svc.append_event(s, ev(delta={"n": n}, ts=float(n)))
    assert svc.truncate_events(app_name=APP, user_id=USER, session_id="s", keep_last=1) == 2
    live = _stored(svc)
    event = ev(delta={"n": 9}, ts=9.0)
    applied = _lost_reply(svc, live, clone(event))
    svc.append_event(live, clone(event))
    assert live.revision == applied.revision == _stored(svc).revision
    assert event_ids(live) == event_ids(_stored(svc))
    assert live.state == {"n": 9}
    svc.append_event(live, ev(ts=10.0))


def test_a_repeat_further_back_changes_nothing(store_factory: StoreFactory) -> None:
    """An event stored before or after the one right after the copy: returned, nothing applied."""
    svc = SyncSessionService(store_factory())
    live = svc.create_session(app_name=APP, user_id=USER, session_id="s")
    first = ev(delta={"k": 1}, ts=1.0)
    second = ev(delta={"k": 2}, ts=2.0)
    # Another copy appended two events: the live one is two behind.
    other = clone(live)
    svc.append_event(other, clone(first))
    svc.append_event(other, clone(second))
    before = copy.deepcopy(live)
    retry = clone(second)
    assert svc.append_event(live, retry) is retry
    assert svc.append_event_locked(live, clone(second)) is not None
    assert live == before
    # Up to date, a repeat of an earlier event changes nothing either.
    current = _stored(svc)
    now = copy.deepcopy(current)
    assert svc.append_event(current, clone(first)) is not None
    assert svc.append_event_locked(current, clone(first)) is not None
    assert current == now
    # The live copy is still behind: stale, as before.
    with pytest.raises(StaleSessionError):
        svc.append_event(live, ev(ts=3.0))
    assert _stored(svc).state == {"k": 2}


def test_a_copy_built_by_hand_keeps_the_repeat_untouched(store_factory: StoreFactory) -> None:
    """Without a revision where the copy stands is not known: a repeat changes nothing."""
    svc = SyncSessionService(store_factory())
    created = svc.create_session(app_name=APP, user_id=USER, session_id="s")
    hand = Session(id="s", app_name=APP, user_id=USER, last_update_time=created.last_update_time)
    event = ev(delta={"k": 1}, ts=created.last_update_time + 1)
    _lost_reply(svc, created, clone(event))
    before = copy.deepcopy(hand)
    svc.append_event(hand, clone(event))
    assert hand == before
    assert _stored(svc).state == {"k": 1}


def test_the_same_id_with_other_content_is_still_refused(store_factory: StoreFactory) -> None:
    """Right after the copy too, other content under a stored id is DuplicateEventError."""
    svc = SyncSessionService(store_factory())
    live = svc.create_session(app_name=APP, user_id=USER, session_id="s")
    event = ev(delta={"k": 1}, ts=1.0)
    _lost_reply(svc, live, clone(event))
    stored = _stored(svc)
    before = copy.deepcopy(live)
    for changed in [
        ev(id=event.id, delta={"k": 2}, ts=1.0),
        ev(id=event.id, delta={"k": 1}, ts=2.0),
        ev(id=event.id, delta={"k": 1}, content={"text": "other"}, ts=1.0),
    ]:
        with pytest.raises(DuplicateEventError):
            svc.append_event(live, changed)
        with pytest.raises(DuplicateEventError):
            svc.append_event_locked(clone(live), clone(changed))
    assert live == before
    assert _stored(svc) == stored


def test_a_batch_repeat_stays_a_repeat(store_factory: StoreFactory) -> None:
    """A bulk append's repeat is skipped as before, however the session stands."""
    svc = SyncSessionService(store_factory())
    live = svc.create_session(app_name=APP, user_id=USER, session_id="s")
    event = ev(delta={"k": 1}, ts=1.0)
    _lost_reply(svc, live, clone(event))
    later = ev(delta={"k": 2}, ts=2.0)
    svc.append_many([(live, clone(event)), (live, later)])
    assert event_ids(_stored(svc)) == [event.id, later.id]
    assert event_ids(live) == [later.id]


# -- the ADK drop-in -------------------------------------------------------


@pytest.fixture(params=["memory", "lmdb", "redis", "redis-cluster"])
def adk_service(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """Yield an ADK session service over a fresh store of each kind."""
    pytest.importorskip("google.adk")
    from sessionscope.adk import LmdbSessionService, MemorySessionService, RedisSessionService

    service: Any
    if request.param == "memory":
        service = MemorySessionService()
    elif request.param == "lmdb":
        service = LmdbSessionService(tmp_path / "store")
    else:
        fixture = "redis_server" if request.param == "redis" else "redis_cluster"
        server = request.getfixturevalue(fixture)
        service = RedisSessionService(f"{server.url}?prefix=a{uuid.uuid4().hex}")
    try:
        yield service
    finally:
        service.store.close()


@pytest.mark.parametrize("locked", [False, True], ids=["plain", "locked"])
def test_an_adk_retry_after_a_lost_reply_is_returned_as_appended(
    adk_service: Any, locked: bool
) -> None:
    """ADK's Session and Event: the retry brings the live session up to date."""
    from google.adk.events import Event, EventActions
    from google.genai import types

    async def main() -> None:
        live = await adk_service.create_session(app_name=APP, user_id=USER, session_id="s")
        event = Event(
            author="agent",
            content=types.Content(role="model", parts=[types.Part(text="hi")]),
            actions=EventActions(state_delta=dict(DELTA)),
        )
        applied = live.model_copy(deep=True)
        await adk_service.append_event(applied, event.model_copy(deep=True))
        append = adk_service.append_event_locked if locked else adk_service.append_event
        retry = event.model_copy(deep=True)
        assert await append(live, retry) is retry
        assert [e.id for e in live.events] == [event.id]
        assert live.state == HELD
        assert live.last_update_time == event.timestamp
        nxt = Event(author="agent", actions=EventActions(state_delta={"k": 2}))
        await adk_service.append_event(live, nxt)
        stored = await adk_service.get_session(app_name=APP, user_id=USER, session_id="s")
        assert [e.id for e in stored.events] == [event.id, nxt.id]
        assert stored.state == {"k": 2, "user:u": 2, "app:a": 3}

    asyncio.run(main())


# -- a real lost reply -----------------------------------------------------


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of this test's own (it is stopped and resumed), stopped at the end."""
    server = RedisServer(tmp_path / "own")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.slow
def test_a_retry_after_a_server_stall_is_returned_as_appended(own_server: RedisServer) -> None:
    """The server stops answering, the append times out, lands on resume; the retry catches up."""
    with SyncSessionService(f"{own_server.url}?prefix=f&timeout=0.5") as svc:
        live = svc.create_session(app_name=APP, user_id=USER, session_id="s")
        event = ev(delta={"k": 1, "user:u": 2}, ts=live.last_update_time + 1)
        own_server.pause()
        try:
            with pytest.raises(StoreError, match="did not answer in time"):
                svc.append_event(live, clone(event))
        finally:
            own_server.resume()
        # The command waited in the stopped server's socket: it runs on resume,
        # before a command of a connection made after it (waited for all the same).
        deadline = time.monotonic() + 10
        while event_ids(_stored(svc)) != [event.id] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert event_ids(_stored(svc)) == [event.id]
        assert event_ids(live) == []
        retry = clone(event)
        assert svc.append_event(live, retry) is retry
        assert event_ids(live) == [event.id]
        assert live.state == {"k": 1, "user:u": 2}
        assert live.revision == _stored(svc).revision
        svc.append_event(live, ev(delta={"k": 2}, ts=event.timestamp + 1))
        assert _stored(svc).state == {"k": 2, "user:u": 2}
