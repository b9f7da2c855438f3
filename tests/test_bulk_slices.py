"""SyncSessionService.append_many of batches longer than a slice (``Store.append_slices``).

LMDB appends a batch's slices in one transaction, each checked and packed
just before it is written: a bad event or a store error in a later slice,
and a transaction run again when the map grows, must leave what a batch
packed whole leaves. The other stores take the batch whole.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import _stores
from sessionscope import Event, EventActions, Session, SyncSessionService
from sessionscope.crypto import Encryption
from sessionscope.crypto.store import open_encrypted
from sessionscope.errors import DuplicateEventError, SessionNotFoundError, StateValueError
from sessionscope.service._append import SLICE_EVENTS
from sessionscope.stores.lmdb import LmdbStore

APP, USER = "app", "user"
# Past two slices, so that the last slice is a short one.
BATCH = 2 * SLICE_EVENTS + SLICE_EVENTS // 2


@pytest.fixture(params=_stores.STORE_KINDS + _stores.ENCRYPTED_KINDS)
def sliced_factory(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[_stores.StoreFactory]:
    """Yield a factory of stores of each kind, plain and encrypted."""
    yield from _stores.factory_of_param(request, tmp_path)


@pytest.fixture
def sliced_svc(sliced_factory: _stores.StoreFactory) -> SyncSessionService:
    """Return a service over a fresh store of each kind, plain and encrypted."""
    return SyncSessionService(sliced_factory())


def ev(delta: dict[str, object], **fields: object) -> Event:
    return Event(author="agent", actions=EventActions(state_delta=dict(delta)), **fields)  # type: ignore[arg-type]


def batch_of(sessions: list[Session], size: int) -> list[tuple[Session, Event]]:
    """Return ``size`` appends over the sessions in turn, each with a temp key and an int time."""
    return [
        (
            sessions[n % len(sessions)],
            ev({"n": n, "app:last": n, "temp:step": n}, timestamp=1000 + n),
        )
        for n in range(size)
    ]


def stored_ids(svc: SyncSessionService, session_id: str) -> list[str]:
    stored = svc.get_session(app_name=APP, user_id=USER, session_id=session_id)
    assert stored is not None
    return [event.id for event in stored.events]


def test_a_bad_event_in_a_later_slice_stores_nothing(sliced_svc: SyncSessionService) -> None:
    """A bad event past the first slices: nothing stored, every event's delta given back."""
    svc = sliced_svc
    sessions = [svc.create_session(app_name=APP, user_id=USER, session_id=s) for s in "ab"]
    appends = batch_of(sessions, BATCH)
    bad = SLICE_EVENTS + SLICE_EVENTS // 2
    appends[bad][1].actions.state_delta["bad"] = {1, 2}
    deltas = [dict(event.actions.state_delta) for _, event in appends]

    with pytest.raises(StateValueError, match=r"state\['bad'\]"):
        svc.append_many(appends)

    for session in sessions:
        assert stored_ids(svc, session.id) == []
        assert session.events == [] and session.state == {}
    assert svc.get_app_state(app_name=APP) == {}
    assert [event.actions.state_delta for _, event in appends] == deltas
    # The batch, made good, is taken whole: nothing of the refused try is left over.
    del appends[bad][1].actions.state_delta["bad"]
    assert svc.append_many(appends) == [event for _, event in appends]
    assert stored_ids(svc, "a") + stored_ids(svc, "b") == [
        event.id for _, event in appends[0::2] + appends[1::2]
    ]


def session_and_ghost(svc: SyncSessionService) -> tuple[Session, Session]:
    """Return a stored session, and a live copy of one deleted since (a store error to append)."""
    session = svc.create_session(app_name=APP, user_id=USER, session_id="s")
    ghost = svc.create_session(app_name=APP, user_id=USER, session_id="ghost")
    svc.delete_session(app_name=APP, user_id=USER, session_id="ghost")
    return session, ghost


def test_a_store_error_in_a_later_slice_keeps_the_slices_before_it(
    sliced_svc: SyncSessionService,
) -> None:
    """A missing session in a later slice: the appends before it stay stored and applied."""
    svc = sliced_svc
    session, ghost = session_and_ghost(svc)
    appends = batch_of([session], BATCH)
    stop = 2 * SLICE_EVENTS + 3
    appends.insert(stop, (ghost, ev({"n": -1})))

    with pytest.raises(SessionNotFoundError) as stopped:
        svc.append_many(appends)

    assert stopped.value.stored == stop  # type: ignore[attr-defined]
    before = [event for _, event in appends[:stop]]
    assert stored_ids(svc, "s") == [event.id for event in before]
    assert session.events == before
    assert session.state == {"n": stop - 1, "app:last": stop - 1, "temp:step": stop - 1}
    stored = svc.get_session(app_name=APP, user_id=USER, session_id="s")
    assert stored is not None and session.revision == stored.revision
    # Those not tried keep their temp keys for a retry; those stored lost them.
    assert all("temp:step" in event.actions.state_delta for _, event in appends[stop + 1 :])
    assert all("temp:step" not in event.actions.state_delta for event in before)


def test_a_bad_event_after_a_store_error_still_refuses_the_whole_batch(
    sliced_svc: SyncSessionService,
) -> None:
    """The slices after the one a store error stops are checked: a bad one stores nothing."""
    svc = sliced_svc
    session, ghost = session_and_ghost(svc)
    appends = batch_of([session], BATCH)
    appends.insert(SLICE_EVENTS + 3, (ghost, ev({"n": -1})))
    appends[2 * SLICE_EVENTS + 3][1].actions.state_delta["bad"] = {1, 2}
    deltas = [dict(event.actions.state_delta) for _, event in appends]

    with pytest.raises(StateValueError, match=r"state\['bad'\]"):
        svc.append_many(appends)

    assert stored_ids(svc, "s") == [] and session.events == [] and session.state == {}
    assert [event.actions.state_delta for _, event in appends] == deltas


def test_an_event_id_clashing_with_an_earlier_slice_stops_the_batch_there(
    sliced_svc: SyncSessionService,
) -> None:
    """Repeats and clashes are seen across slices: a repeat is skipped, a clash stops the batch."""
    svc = sliced_svc
    session = svc.create_session(app_name=APP, user_id=USER, session_id="s")
    appends = batch_of([session], BATCH)
    first = appends[3][1]
    appends.insert(SLICE_EVENTS + 1, (session, first))  # the same event again: a repeat
    clash_at = 2 * SLICE_EVENTS + 1
    appends.insert(clash_at, (session, ev({"n": -1}, id=first.id)))

    with pytest.raises(DuplicateEventError) as stopped:
        svc.append_many(appends)

    assert stopped.value.stored == clash_at  # type: ignore[attr-defined]
    before = [event for _, event in appends[:clash_at]]
    once = [event.id for n, event in enumerate(before) if n != SLICE_EVENTS + 1]
    assert stored_ids(svc, "s") == once
    assert [event.id for event in session.events] == once


def test_two_live_copies_in_different_slices_each_stay_current(
    sliced_svc: SyncSessionService,
) -> None:
    """Each live copy of one session gets its own events and the marker after its last one."""
    svc = sliced_svc
    one = svc.create_session(app_name=APP, user_id=USER, session_id="s")
    other = svc.get_session(app_name=APP, user_id=USER, session_id="s")
    assert other is not None
    appends = [(one, ev({"n": n})) for n in range(SLICE_EVENTS)]
    appends += [(other, ev({"n": n})) for n in range(SLICE_EVENTS, SLICE_EVENTS + 5)]

    svc.append_many(appends)

    assert stored_ids(svc, "s") == [event.id for _, event in appends]
    assert one.events == [event for _, event in appends[:SLICE_EVENTS]]
    assert other.events == [event for _, event in appends[SLICE_EVENTS:]]
    # The copy that appended last is current: a plain append from it is not stale.
    svc.append_event(other, ev({"n": -1}))


def test_each_key_keeps_the_value_of_the_last_event_applied(
    sliced_factory: _stores.StoreFactory,
) -> None:
    """A key set by many events of a batch keeps the last applied one's value; a repeat sets none.

    An encrypted store over LMDB has the store below seal only those values,
    as it writes them (``AppendBatch.seal_state``): a store opened afresh,
    which has nothing kept opened, reads them, and no value is in the files
    in plaintext.
    """
    svc = SyncSessionService(sliced_factory())
    a, b = (svc.create_session(app_name=APP, user_id=USER, session_id=s) for s in "ab")
    stored = ev({"who": "stored", "user:who": "stored", "app:who": "stored"})
    svc.append_event(a, stored)

    def values(n: int) -> dict[str, object]:
        return {"who": f"session-{n:04d}", "user:who": f"user-{n:04d}", "app:who": f"app-{n:04d}"}

    appends = [(a if n % 2 == 0 else b, ev(values(n))) for n in range(BATCH)]
    # The last event of the batch to set each key is the stored one again: a repeat.
    appends.append((a, stored))
    svc.append_many(appends)

    last = BATCH - 1
    last_of_a = last if last % 2 == 0 else last - 1
    last_of_b = last if last % 2 == 1 else last - 1
    expected = {
        "a": {**values(last_of_a), "user:who": f"user-{last:04d}", "app:who": f"app-{last:04d}"},
        "b": {**values(last_of_b), "user:who": f"user-{last:04d}", "app:who": f"app-{last:04d}"},
    }

    def check(reader: SyncSessionService) -> None:
        for session_id, state in expected.items():
            got = reader.get_session(app_name=APP, user_id=USER, session_id=session_id)
            assert got is not None and got.state == state

    check(svc)
    # A live session holds what its own events set.
    assert a.state == values(last_of_a) and b.state == values(last_of_b)
    if sliced_factory.persistent:
        svc.close()
        with SyncSessionService(sliced_factory.reopen()) as again:
            check(again)
    if sliced_factory.encrypted and sliced_factory.kind in _stores.LMDB_KINDS:
        data = (sliced_factory.path / "data.mdb").read_bytes()
        assert b"session-0" not in data and b"user-0" not in data and b"app-0" not in data


@pytest.mark.parametrize("encrypted", [False, True], ids=["plain", "encrypted"])
@pytest.mark.parametrize("durability", ["sync", "deferred"])
def test_a_batch_crossing_a_map_growth_is_stored_once(
    tmp_path: Path, durability: str, encrypted: bool
) -> None:
    """A transaction run again on a grown map packs its slices again: each event stored once.

    The events get their ids, float timestamps and temp keys taken out once,
    in the first run; the run after the growth packs the same bytes (and,
    encrypted, seals them again under other nonces).
    """
    lmdb = LmdbStore(tmp_path / "store", map_size=1 << 20, durability=durability)  # type: ignore[arg-type]
    store: Any = lmdb
    if encrypted:
        keys = f"lmdb://{tmp_path / 'keys'}"
        store = open_encrypted(lmdb, Encryption(keys=keys, key=_stores.TEST_KEK), None)
    with SyncSessionService(store) as svc:
        sessions = [svc.create_session(app_name=APP, user_id=USER, session_id=s) for s in "ab"]
        before = lmdb.stat()["map_size"]
        appends = batch_of(sessions, BATCH)
        # About 4 KB a record: the batch outgrows a 1 MB map within its transaction.
        for n, (_, event) in enumerate(appends):
            event.error_message = f"{n:04d}" + "x" * 4096
        appended = svc.append_many(appends)

        assert lmdb.stat()["map_size"] > before
        assert appended == [event for _, event in appends]
        for session in sessions:
            mine = [event for owner, event in appends if owner is session]
            assert stored_ids(svc, session.id) == [event.id for event in mine]
            assert session.events == mine
            stored = svc.get_session(app_name=APP, user_id=USER, session_id=session.id)
            assert stored is not None and session.revision == stored.revision
            assert [e.error_message for e in stored.events] == [e.error_message for e in mine]
            assert [e.timestamp for e in stored.events] == [float(e.timestamp) for e in mine]
        assert all(event.actions.state_delta == {"n": n, "app:last": n} for n, (_, event) in
                   enumerate(appends))  # fmt: skip
        assert svc.get_app_state(app_name=APP) == {"last": BATCH - 1}
