"""SyncSessionService.append_many: the bulk path of replay and import, on every store."""

from __future__ import annotations

import sys

import pytest

import _stores
from sessionscope import Event, EventActions, SyncSessionService
from sessionscope.errors import DuplicateEventError, SessionNotFoundError, StateValueError
from sessionscope.service._append import encode_event
from sessionscope.stores.records import AppendBatch, AppendRequest, BatchResult, Items

svc = _stores.svc
store_factory = _stores.store_factory

APP, USER = "app", "user"


def ev(delta: dict[str, object] | None = None, **fields: object) -> Event:
    return Event(author="agent", actions=EventActions(state_delta=dict(delta or {})), **fields)  # type: ignore[arg-type]


def ids(events: list[Event]) -> list[str]:
    return [e.id for e in events]


def test_a_batch_over_several_sessions_lands_in_order(svc: SyncSessionService) -> None:
    """Events of many sessions in one batch are stored in order, deltas by scope."""
    a = svc.create_session(app_name=APP, user_id=USER, session_id="a")
    b = svc.create_session(app_name=APP, user_id="other", session_id="b")
    batch = [
        (a, ev({"n": 1, "app:total": 1, "temp:t": "x"})),
        (b, ev({"n": 10, "user:seen": True})),
        (a, ev({"n": 2, "user:name": "Ada"})),
        (a, ev({"app:total": 3})),
    ]
    appended = svc.append_many(batch)

    assert appended == [event for _, event in batch]
    stored_a = svc.get_session(app_name=APP, user_id=USER, session_id="a")
    stored_b = svc.get_session(app_name=APP, user_id="other", session_id="b")
    assert stored_a is not None and stored_b is not None
    assert ids(stored_a.events) == [batch[0][1].id, batch[2][1].id, batch[3][1].id]
    assert ids(stored_b.events) == [batch[1][1].id]
    assert stored_a.state == {"n": 2, "app:total": 3, "user:name": "Ada"}
    assert stored_b.state == {"n": 10, "app:total": 3, "user:seen": True}
    # The live sessions moved with the store: same events, state (plus temp), marker.
    assert ids(a.events) == ids(stored_a.events)
    assert a.revision == stored_a.revision and b.revision == stored_b.revision
    assert a.state == {**stored_a.state, "temp:t": "x"}
    assert a.last_update_time == batch[3][1].timestamp
    assert "temp:t" not in batch[0][1].actions.state_delta
    # The live copy is current: a plain append from it is not stale.
    svc.append_event(a, ev({"n": 3}))


def test_a_repeated_event_in_a_batch_is_stored_once(svc: SyncSessionService) -> None:
    """The same event twice in a batch is a repeat, not a second entry."""
    s = svc.create_session(app_name=APP, user_id=USER, session_id="s")
    event = ev({"n": 1})
    svc.append_many([(s, event), (s, event)])
    stored = svc.get_session(app_name=APP, user_id=USER, session_id="s")
    assert stored is not None and ids(stored.events) == [event.id]


def test_a_store_error_keeps_what_came_before_it(svc: SyncSessionService) -> None:
    """A missing session stops the batch: earlier appends stay, later ones are not tried."""
    s = svc.create_session(app_name=APP, user_id=USER, session_id="s")
    ghost = svc.create_session(app_name=APP, user_id=USER, session_id="ghost")
    svc.delete_session(app_name=APP, user_id=USER, session_id="ghost")
    first, second, after = ev({"n": 1}), ev({"temp:t": 1, "n": 2}), ev({"n": 3, "temp:u": 2})
    with pytest.raises(SessionNotFoundError) as stopped:
        svc.append_many([(s, first), (s, second), (ghost, ev()), (s, after)])
    # The error says how far the batch got: its first two appends are stored.
    assert stopped.value.stored == 2  # type: ignore[attr-defined]
    if sys.version_info >= (3, 11):
        assert stopped.value.__notes__ == [
            "the batch stopped here: its first 2 of 4 appends are stored, none after"
        ]
    stored = svc.get_session(app_name=APP, user_id=USER, session_id="s")
    assert stored is not None
    assert ids(stored.events) == [first.id, second.id]
    assert stored.state == {"n": 2}
    assert ids(s.events) == [first.id, second.id] and s.revision == stored.revision
    # The event that was not tried keeps its temp key for a retry.
    assert after.actions.state_delta == {"n": 3, "temp:u": 2}


def test_a_conflicting_event_id_stops_the_batch(svc: SyncSessionService) -> None:
    """An id stored with other content is an error; nothing after it is stored."""
    s = svc.create_session(app_name=APP, user_id=USER, session_id="s")
    original = svc.append_event(s, ev({"n": 1}))
    clash = ev({"n": 2}, id=original.id)
    later = ev({"n": 3})
    with pytest.raises(DuplicateEventError) as stopped:
        svc.append_many([(s, clash), (s, later)])
    assert stopped.value.stored == 0  # type: ignore[attr-defined]
    stored = svc.get_session(app_name=APP, user_id=USER, session_id="s")
    assert stored is not None and ids(stored.events) == [original.id]


def test_a_clash_between_two_events_of_one_batch_stops_it_at_the_second(
    svc: SyncSessionService,
) -> None:
    """An id given twice in one batch with other content: the first lands, then the error."""
    s = svc.create_session(app_name=APP, user_id=USER, session_id="s")
    first = ev({"n": 1})
    clash, later = ev({"n": 2}, id=first.id), ev({"n": 3})
    with pytest.raises(DuplicateEventError) as stopped:
        svc.append_many([(s, first), (s, clash), (s, later)])
    assert stopped.value.stored == 1  # type: ignore[attr-defined]
    stored = svc.get_session(app_name=APP, user_id=USER, session_id="s")
    assert stored is not None and ids(stored.events) == [first.id]
    assert stored.state == {"n": 1} and s.revision == stored.revision


def test_long_state_keys_in_a_batch_keep_their_last_value(svc: SyncSessionService) -> None:
    """Keys stored under a digest, written twice in a batch, read back whole and last."""
    s = svc.create_session(app_name=APP, user_id=USER, session_id="s")
    long_key, long_app = "k" * 400, "app:" + "a" * 400
    svc.append_many([(s, ev({long_key: 1, long_app: "x"})), (s, ev({long_key: 2, long_app: "y"}))])
    stored = svc.get_session(app_name=APP, user_id=USER, session_id="s")
    assert stored is not None and stored.state == {long_key: 2, long_app: "y"}


def test_a_bad_value_anywhere_stores_nothing(svc: SyncSessionService) -> None:
    """An unstorable value is refused before any append of the batch is stored."""
    s = svc.create_session(app_name=APP, user_id=USER, session_id="s")
    good = ev({"n": 1, "temp:t": 1})
    with pytest.raises(StateValueError, match=r"state\['bad'\]"):
        svc.append_many([(s, good), (s, ev({"bad": {1, 2}}))])
    stored = svc.get_session(app_name=APP, user_id=USER, session_id="s")
    assert stored is not None and stored.events == [] and stored.state == {}
    assert s.events == [] and good.actions.state_delta == {"n": 1, "temp:t": 1}


def test_partial_events_are_skipped(svc: SyncSessionService) -> None:
    """A partial event in a batch is returned untouched and not stored."""
    s = svc.create_session(app_name=APP, user_id=USER, session_id="s")
    partial, whole = ev({"n": 1}, partial=True), ev({"n": 2})
    assert svc.append_many([(s, partial), (s, whole)]) == [whole]
    stored = svc.get_session(app_name=APP, user_id=USER, session_id="s")
    assert stored is not None and ids(stored.events) == [whole.id]
    assert partial.actions.state_delta == {"n": 1}


# Deltas the batch prepare routes straight to packed items (ASCII keys, plain
# values) and deltas it hands to the scope core's checks: a batch must store
# exactly what appends one at a time store.
MIXED_DELTAS: list[dict[str, object]] = [
    {"n": 1, "app:calls": 2**64 - 1, "user:seen": -(2**63), "temp:step": object()},
    {"flag": True, "none": None, "ratio": 0.5, "raw": b"\x00\xff", "app:text": "plain"},
    {"é": "non-ASCII key", "user:name": "Ada Lovelace, née Byron", "app:list": [1, "two"]},
    {"nested": {"a": [1, {"b": None}]}, "tuple": (1, 2), "user:": "empty name"},
    {"app:": 0, "": "empty key", "temp:": "empty temp key"},
]


def test_a_batch_stores_what_single_appends_store(store_factory: _stores.StoreFactory) -> None:
    """Plain and nested values, every scope, odd keys: a batch and single appends agree."""
    single = SyncSessionService(store_factory())
    bulk = SyncSessionService(store_factory.fresh("bulk"))
    for service in (single, bulk):
        service.create_session(app_name=APP, user_id=USER, session_id="s")
    events = [ev(delta, id=f"e{n}", timestamp=1000.0 + n) for n, delta in enumerate(MIXED_DELTAS)]
    live = single.get_session(app_name=APP, user_id=USER, session_id="s")
    assert live is not None
    for event in events:
        copy = ev(dict(event.actions.state_delta), id=event.id, timestamp=event.timestamp)
        single.append_event(live, copy)
    batch_live = bulk.get_session(app_name=APP, user_id=USER, session_id="s")
    assert batch_live is not None
    bulk.append_many([(batch_live, event) for event in events])

    stored_single = single.get_session(app_name=APP, user_id=USER, session_id="s")
    stored_bulk = bulk.get_session(app_name=APP, user_id=USER, session_id="s")
    assert stored_single is not None and stored_bulk is not None
    assert stored_bulk.state == stored_single.state
    assert stored_bulk.state["app:calls"] == 2**64 - 1 and stored_bulk.state["tuple"] == [1, 2]
    assert stored_bulk.events == stored_single.events
    assert all("temp:step" not in e.actions.state_delta for e in stored_bulk.events)
    assert batch_live.state == live.state


@pytest.mark.parametrize(
    ("delta", "message"),
    [
        ({"ok": 1, "big": 2**64}, r"state\['big'\]: int 18446744073709551616 is out of"),
        ({"app:ok": 1, "app:low": -(2**63) - 1}, r"state\['app:low'\]: int -\d+ is out of"),
        ({"ok": "fine", "lone": "\ud800"}, r"state\['lone'\]: str holds a lone surrogate"),
        ({"ok": 1, "\ud800": 1}, r"state key '\\ud800' holds a lone surrogate"),
        ({"ok": 1, 7: "int key"}, r"state key 7 is not a str"),
    ],
)
def test_a_batch_refuses_what_a_single_append_refuses(
    svc: SyncSessionService, delta: dict[object, object], message: str
) -> None:
    """The same error, with the same message, whether the delta comes alone or in a batch."""
    s = svc.create_session(app_name=APP, user_id=USER, session_id="s")
    with pytest.raises(StateValueError, match=message) as alone:
        svc.append_event(s, ev(dict(delta)))  # type: ignore[arg-type]
    good = ev({"n": 1})
    with pytest.raises(StateValueError, match=message) as batched:
        svc.append_many([(s, good), (s, ev(dict(delta)))])  # type: ignore[arg-type]
    assert str(batched.value) == str(alone.value)
    stored = svc.get_session(app_name=APP, user_id=USER, session_id="s")
    assert stored is not None and stored.events == [] and stored.state == {}


def test_two_live_copies_of_one_session_each_get_their_own_events(
    svc: SyncSessionService,
) -> None:
    """Two copies of one session in a batch: stored in order, each copy moves with its own."""
    svc.create_session(app_name=APP, user_id=USER, session_id="s")
    one = svc.get_session(app_name=APP, user_id=USER, session_id="s")
    two = svc.get_session(app_name=APP, user_id=USER, session_id="s")
    assert one is not None and two is not None
    first, second, third = ev({"n": 1}), ev({"m": 2}), ev({"n": 3})
    svc.append_many([(one, first), (two, second), (one, third)])

    stored = svc.get_session(app_name=APP, user_id=USER, session_id="s")
    assert stored is not None
    assert ids(stored.events) == [first.id, second.id, third.id]
    assert stored.state == {"n": 3, "m": 2}
    assert ids(one.events) == [first.id, third.id] and one.state == {"n": 3}
    assert ids(two.events) == [second.id] and two.state == {"m": 2}
    # Each copy carries the revision after its own last event.
    assert one.revision == stored.revision
    assert two.revision is not None and two.revision != stored.revision
    assert one.last_update_time == third.timestamp
    assert two.last_update_time == second.timestamp


def _request(session_id: str, event: Event, **items: Items) -> AppendRequest:
    record = encode_event(event)
    return AppendRequest(APP, USER, session_id, event.id, event.timestamp, record, **items)


def test_a_store_answers_a_batch_by_position(store_factory: _stores.StoreFactory) -> None:
    """A store's batch result: how far it went, the repeats, each key's last marker, the error."""
    store = store_factory()
    for name in ("a", "b"):
        store.create_session(APP, USER, name, 1000.0, [], [], []).result()
    events = [ev(id=f"e{n}", timestamp=1000.0 + n) for n in range(4)]
    batch = AppendBatch.of(
        [
            _request("a", events[0], session_items=[("n", b"\x01")]),
            _request("b", events[1], app_items=[("k", b"\x02")]),
            _request("a", events[0]),  # a repeat: skipped
            _request("a", events[2]),
            _request("ghost", events[3]),  # not stored: stops the batch
            _request("b", ev(id="never")),
        ]
    )
    assert batch.keys == [(APP, USER, "a"), (APP, USER, "b"), (APP, USER, "ghost")]
    assert batch.owners == [0, 1, 0, 0, 2, 1]

    result = store.append_many(batch).result()

    assert isinstance(result, BatchResult)
    assert result.applied == 4 and result.repeats == [2]
    assert isinstance(result.error, SessionNotFoundError)
    loaded_a = store.load_session(APP, USER, "a", None, None)
    loaded_b = store.load_session(APP, USER, "b", None, None)
    assert loaded_a is not None and loaded_b is not None
    assert result.markers == [loaded_a.record.marker, loaded_b.record.marker, None]
    assert result.times == [1002.0, 1001.0, 0.0]
    assert loaded_a.session_state == {"n": 1} and loaded_b.app_state == {"k": 2}
    assert len(loaded_a.events) == 2 and len(loaded_b.events) == 1


def test_a_batch_refused_at_its_first_event_stores_nothing(
    store_factory: _stores.StoreFactory,
) -> None:
    """An error at the first event: nothing applied, no marker, the store as it was."""
    store = store_factory()
    store.create_session(APP, USER, "a", 1000.0, [], [], []).result()
    batch = AppendBatch.of([_request("ghost", ev()), _request("a", ev(timestamp=1001.0))])

    result = store.append_many(batch).result()

    assert result.applied == 0 and result.repeats == [] and result.markers == [None, None]
    assert isinstance(result.error, SessionNotFoundError)
    loaded = store.load_session(APP, USER, "a", None, None)
    assert loaded is not None and loaded.events == [] and loaded.record.event_count == 0
