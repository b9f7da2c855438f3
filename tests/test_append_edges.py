"""Edge cases of appending: odd timestamps, odd text, repeats, locked catch-up, cancellation."""

from __future__ import annotations

import asyncio
import math

import pytest

import _stores
from _stores import APP, USER, StoreFactory, ev, event_ids
from sessionscope import (
    GetSessionConfig,
    LmdbStore,
    Session,
    SessionService,
    SyncSessionService,
)
from sessionscope.errors import DuplicateEventError, StateValueError, StoreClosedError

svc = _stores.svc
store_factory = _stores.store_factory


def stored(service: SyncSessionService, sid: str = "s", **config: object) -> Session:
    got = service.get_session(
        app_name=APP, user_id=USER, session_id=sid, config=GetSessionConfig(**config)
    )
    assert got is not None
    return got


# -- repeats ---------------------------------------------------------------------


@pytest.mark.parametrize(("first", "again"), [(1, True), (1, 1.0), (0, False), ([1], [True])])
def test_a_repeat_must_match_in_type_too(
    svc: SyncSessionService, first: object, again: object
) -> None:
    """1, 1.0 and True are equal in Python but store differently: not a safe retry."""
    s = svc.create_session(app_name=APP, user_id=USER, session_id="s")
    svc.append_event(s, ev(delta={"flag": first}, id="dup"))
    with pytest.raises(DuplicateEventError):
        svc.append_event(s, ev(delta={"flag": again}, id="dup"))
    assert stored(svc).state == {"flag": first}


def test_an_exact_repeat_is_still_a_no_op(svc: SyncSessionService) -> None:
    s = svc.create_session(app_name=APP, user_id=USER, session_id="s")
    event = ev(delta={"x": [1, 2.5, None, b"b"]}, content={"nan": math.nan})
    svc.append_event(s, event)
    svc.append_event(s, event)
    assert event_ids(stored(svc)) == [event.id]


# -- timestamps ------------------------------------------------------------------


@pytest.mark.parametrize("stamp", [math.nan, math.inf, -math.inf, 10**400])
def test_a_timestamp_must_be_a_finite_float(svc: SyncSessionService, stamp: float) -> None:
    s = svc.create_session(app_name=APP, user_id=USER, session_id="s")
    with pytest.raises(ValueError, match=r"event\.timestamp"):
        svc.append_event(s, ev(ts=stamp))
    assert stored(svc).events == []


@pytest.mark.parametrize("after", [math.nan, 10**400])
def test_after_timestamp_must_be_a_float(svc: SyncSessionService, after: float) -> None:
    with pytest.raises(ValueError, match="after_timestamp"):
        svc.get_session(
            app_name=APP,
            user_id=USER,
            session_id="s",
            config=GetSessionConfig(after_timestamp=after),
        )


def test_minus_zero_is_zero_for_after_timestamp(svc: SyncSessionService) -> None:
    """Every store agrees: -0.0 >= 0.0, and -1.0 is before it."""
    s = svc.create_session(app_name=APP, user_id=USER, session_id="s")
    early, zero, late = ev(ts=-1.0), ev(ts=-0.0), ev(ts=5.0)
    for event in (early, zero, late):
        svc.append_event(s, event)
    assert event_ids(stored(svc, after_timestamp=0.0)) == [zero.id, late.id]
    assert event_ids(stored(svc, after_timestamp=-0.0)) == [zero.id, late.id]
    assert event_ids(stored(svc, after_timestamp=0.0, num_recent_events=10)) == [zero.id, late.id]


# -- text that UTF-8 cannot hold ---------------------------------------------------


@pytest.mark.parametrize(
    ("state", "path"),
    [
        ({"k\ud800": 1}, r"state key 'k\\ud800'"),
        ({"user:k\udfff": 1}, r"state key 'user:k\\udfff'"),
        ({"k": "v\ud800"}, r"state\['k'\]: str holds a lone surrogate"),
        ({"k": {"in\ud800": 1}}, r"state\['k'\]: dict key 'in\\ud800'"),
    ],
)
def test_a_lone_surrogate_is_refused_everywhere(
    svc: SyncSessionService, state: dict[str, object], path: str
) -> None:
    """Memory and LMDB agree: a typed error naming the key, and nothing written."""
    with pytest.raises(StateValueError, match=path):
        svc.create_session(app_name=APP, user_id=USER, session_id="s", state=state)
    assert svc.get_session(app_name=APP, user_id=USER, session_id="s") is None
    s = svc.create_session(app_name=APP, user_id=USER, session_id="s")
    with pytest.raises(StateValueError, match=path):
        svc.append_event(s, ev(delta=state))
    assert stored(svc).events == [] and svc.get_user_state(app_name=APP, user_id=USER) == {}


def test_non_ascii_text_is_stored(svc: SyncSessionService) -> None:
    s = svc.create_session(app_name=APP, user_id=USER, session_id="s")
    svc.append_event(s, ev(delta={"ключ": "värde 😀", "user:名前": {"é": ["ü"]}}))
    assert stored(svc).state == {"ключ": "värde 😀", "user:名前": {"é": ["ü"]}}


# -- locked appends ----------------------------------------------------------------


def test_a_locked_append_from_before_a_recreate_takes_the_new_session(
    svc: SyncSessionService,
) -> None:
    """A copy read before delete and create again is not patched with the old history."""
    old = svc.create_session(app_name=APP, user_id=USER, session_id="s")
    svc.append_event(old, ev(delta={"x": 1}))
    svc.delete_session(app_name=APP, user_id=USER, session_id="s")
    new = svc.create_session(app_name=APP, user_id=USER, session_id="s", state={"y": 2})
    e2 = svc.append_event(new, ev())
    e3 = svc.append_event_locked(old, ev(delta={"z": 3}))
    now = stored(svc)
    assert event_ids(now) == [e2.id, e3.id]
    assert event_ids(old) == event_ids(now) and old.state == now.state == {"y": 2, "z": 3}
    assert old.revision == now.revision
    svc.append_event(old, ev())  # the copy is current now


def test_a_locked_append_brings_in_other_sessions_shared_keys(svc: SyncSessionService) -> None:
    a = svc.create_session(app_name=APP, user_id=USER, session_id="a")
    b = svc.create_session(app_name=APP, user_id=USER, session_id="b")
    svc.append_event(b, ev(delta={"user:k": 1, "app:n": 2}))
    svc.append_event_locked(a, ev(delta={"own": True}))
    assert a.state == {"own": True, "user:k": 1, "app:n": 2} == stored(svc, "a").state


def test_a_locked_append_keeps_the_live_temp_keys(svc: SyncSessionService) -> None:
    svc.create_session(app_name=APP, user_id=USER, session_id="s", state={"k": 0})
    live = Session("s", APP, USER, state={"k": 0, "temp:plan": "draft"})
    svc.append_event_locked(live, ev(delta={"k": 1, "temp:step": 2}))
    assert live.state == {"k": 1, "temp:plan": "draft", "temp:step": 2}
    assert stored(svc).state == {"k": 1}


# -- failures that leave the event as it was -----------------------------------------


def test_a_bulk_append_to_a_closed_store_gives_back_temp_keys(store_factory: StoreFactory) -> None:
    service = SyncSessionService(store_factory())
    s = service.create_session(app_name=APP, user_id=USER, session_id="s")
    event = ev(delta={"k": 1, "temp:t": 1})
    service.close()
    with pytest.raises(StoreClosedError):
        service.append_many([(s, event)])
    assert event.actions.state_delta == {"k": 1, "temp:t": 1}


def test_a_cancelled_append_still_brings_the_live_session_up_to_date(tmp_path: object) -> None:
    """The write was queued before the cancel: the live copy follows the store."""
    store = LmdbStore(f"{tmp_path}/store", durability="sync")
    service = SessionService(store)

    async def main() -> Session:
        s = await service.create_session(app_name=APP, user_id=USER, session_id="s")
        task = asyncio.ensure_future(service.append_event(s, ev(delta={"k": 1, "temp:t": 2})))
        await asyncio.sleep(0)  # the append is queued and waits for the group commit
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return s

    live = asyncio.run(main())
    now = SyncSessionService(store).get_session(app_name=APP, user_id=USER, session_id="s")
    assert now is not None
    assert event_ids(live) == event_ids(now) and len(now.events) == 1
    assert live.revision == now.revision and live.state == {"k": 1, "temp:t": 2}
    store.close()
