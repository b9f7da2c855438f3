"""Threads appending through one live session object of the sync service take turns.

A plain append is prepared with the revision its object holds; without turns,
a second thread's append through the same object lands meanwhile and the first
is refused as stale, though both came from the object's owner. Copies read
apart are still refused: the turns are per object, not per session.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import _stores
from _stores import APP, USER, StoreFactory, ev, event_ids
from sessionscope import Event, MemoryStore, Session, SyncSessionService
from sessionscope.errors import StaleSessionError
from sessionscope.stores.records import AppendRequest

store_factory = _stores.store_factory

THREADS = 8
PER_THREAD = 20


@pytest.fixture(autouse=True)
def _switch_often() -> Iterator[None]:
    """Switch threads far more often than the default, so that appends interleave."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def _run_threads(worker: Callable[[int], None], count: int = THREADS) -> list[BaseException]:
    """Run ``worker(n)`` in ``count`` threads started together; return what they raised."""
    start = threading.Barrier(count, timeout=30)
    failures: list[BaseException] = []

    def body(n: int) -> None:
        try:
            start.wait()
            worker(n)
        except BaseException as error:  # reported by the test thread
            failures.append(error)

    threads = [threading.Thread(target=body, args=(n,)) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads)
    return failures


def _assert_live_is_stored(svc: SyncSessionService, live: Session, appended: list[Event]) -> None:
    stored = svc.get_session(app_name=APP, user_id=USER, session_id=live.id)
    assert stored is not None
    ids = event_ids(stored)
    assert len(ids) == len(set(ids)), "an event is stored twice"
    assert sorted(ids) == sorted(event.id for event in appended)
    assert event_ids(live) == ids
    assert live.state == stored.state
    assert live.revision == stored.revision
    assert live.last_update_time == stored.last_update_time


def _assert_no_turn_left(svc: SyncSessionService) -> None:
    """Assert that the service keeps nothing for objects with no append in flight."""
    assert getattr(svc, "_turns", {}) == {}


def test_plain_appends_from_threads_through_one_object_all_land(
    store_factory: StoreFactory,
) -> None:
    with SyncSessionService(store_factory()) as svc:
        live = svc.create_session(app_name=APP, user_id=USER)
        appended: list[Event] = []

        def worker(n: int) -> None:
            for i in range(PER_THREAD):
                event = ev(delta={f"t{n}": i, "last": n})
                svc.append_event(live, event)
                appended.append(event)

        assert _run_threads(worker) == []
        assert len(appended) == THREADS * PER_THREAD
        _assert_live_is_stored(svc, live, appended)
        assert {live.state[f"t{n}"] for n in range(THREADS)} == {PER_THREAD - 1}
        _assert_no_turn_left(svc)


def test_plain_and_locked_appends_through_one_object_all_land(
    store_factory: StoreFactory,
) -> None:
    """Locked appends run together; a plain one waits for them, and they for it."""
    with SyncSessionService(store_factory()) as svc:
        live = svc.create_session(app_name=APP, user_id=USER)
        appended: list[Event] = []

        def worker(n: int) -> None:
            append = svc.append_event if n % 2 else svc.append_event_locked
            for i in range(PER_THREAD):
                event = ev(delta={f"t{n}": i})
                append(live, event)
                appended.append(event)

        assert _run_threads(worker) == []
        _assert_live_is_stored(svc, live, appended)
        _assert_no_turn_left(svc)


def _two_copies(svc: SyncSessionService) -> tuple[dict[str, Any], Session, Session]:
    """Create a session; return its key and two copies of it read at one revision."""
    created = svc.create_session(app_name=APP, user_id=USER)
    key: dict[str, Any] = {"app_name": APP, "user_id": USER, "session_id": created.id}
    first, second = svc.get_session(**key), svc.get_session(**key)
    assert first is not None and second is not None
    assert first.revision == second.revision
    return key, first, second


def test_copies_read_at_one_revision_are_still_stale(store_factory: StoreFactory) -> None:
    with SyncSessionService(store_factory()) as svc:
        _, first, second = _two_copies(svc)
        svc.append_event(first, ev(delta={"a": 1}))
        with pytest.raises(StaleSessionError):
            svc.append_event(second, ev(delta={"a": 2}))
        _assert_no_turn_left(svc)


def test_copies_appending_from_threads_at_once_one_wins(store_factory: StoreFactory) -> None:
    """Two copies read at one revision, appended through by two threads at once."""
    with SyncSessionService(store_factory()) as svc:
        key, *copies = _two_copies(svc)
        landed: list[Event] = []

        def worker(n: int) -> None:
            copy = copies[n]
            event = ev(delta={"by": n})
            svc.append_event(copy, event)
            landed.append(event)

        failures = _run_threads(worker, count=2)
        assert len(landed) == 1
        assert [type(error) for error in failures] == [StaleSessionError]
        stored = svc.get_session(**key)
        assert stored is not None
        assert event_ids(stored) == [landed[0].id]
        _assert_no_turn_left(svc)


def test_a_bad_event_raises_in_its_thread_and_the_others_go_on(
    store_factory: StoreFactory,
) -> None:
    with SyncSessionService(store_factory()) as svc:
        live = svc.create_session(app_name=APP, user_id=USER)
        appended: list[Event] = []
        bad_thread, bad_at = 3, PER_THREAD // 2

        def worker(n: int) -> None:
            for i in range(PER_THREAD):
                if (n, i) == (bad_thread, bad_at):
                    svc.append_event(live, ev(delta={"bad": object()}))
                event = ev(delta={f"t{n}": i})
                svc.append_event(live, event)
                appended.append(event)

        failures = _run_threads(worker)
        assert len(failures) == 1
        assert isinstance(failures[0], TypeError)
        assert len(appended) == (THREADS - 1) * PER_THREAD + bad_at
        _assert_live_is_stored(svc, live, appended)
        assert "bad" not in live.state
        _assert_no_turn_left(svc)


def test_a_store_error_releases_the_turn(store_factory: StoreFactory) -> None:
    """An append the store refuses (its session deleted) leaves the object free."""
    with SyncSessionService(store_factory()) as svc:
        live = svc.create_session(app_name=APP, user_id=USER)
        svc.append_event(live, ev(delta={"a": 1}))
        svc.delete_session(app_name=APP, user_id=USER, session_id=live.id)

        def worker(n: int) -> None:
            svc.append_event(live, ev(delta={"by": n}))

        failures = _run_threads(worker, count=4)
        assert len(failures) == 4
        assert all(isinstance(error, ValueError) for error in failures)
        _assert_no_turn_left(svc)


class _GatedStore(MemoryStore):
    """A memory store that holds the appends of chosen events until the gate opens."""

    def __init__(self) -> None:
        super().__init__()
        self.held: set[str] = set()
        self.entered = threading.Event()
        self.gate = threading.Event()

    def append(self, request: AppendRequest) -> Any:
        if request.event_id in self.held:
            self.entered.set()
            assert self.gate.wait(30)
        return super().append(request)


def _waiting_on(svc: SyncSessionService, session: Session) -> int:
    """Return how many appends wait for their turn on ``session`` (0 when none)."""
    with svc._turns_lock:
        turns = svc._turns.get(id(session))
        return len(turns.waiting) if hasattr(turns, "waiting") else 0


def _until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.001)


def test_other_objects_do_not_wait_for_an_append_in_flight() -> None:
    """Another session, or another copy of the same one, appends while one object's waits."""
    store = _GatedStore()
    with SyncSessionService(store) as svc:
        live = svc.create_session(app_name=APP, user_id=USER)
        other = svc.create_session(app_name=APP, user_id=USER)
        copy = svc.get_session(app_name=APP, user_id=USER, session_id=live.id)
        assert copy is not None
        held = ev(delta={"a": 1})
        store.held.add(held.id)
        failures: list[BaseException] = []

        def hold() -> None:
            try:
                svc.append_event(live, held)
            except BaseException as error:  # reported by the test thread
                failures.append(error)

        thread = threading.Thread(target=hold)
        thread.start()
        try:
            assert store.entered.wait(30)
            svc.append_event(other, ev(delta={"b": 1}))
            svc.append_event(copy, ev(delta={"c": 1}))
        finally:
            store.gate.set()
            thread.join(30)
        assert not thread.is_alive()
        # The copy landed first: the held append, prepared at the same
        # revision, is stale (a copy, not the same object).
        assert [type(error) for error in failures] == [StaleSessionError]
        _assert_no_turn_left(svc)


def test_appends_through_one_object_run_in_arrival_order() -> None:
    store = _GatedStore()
    with SyncSessionService(store) as svc:
        live = svc.create_session(app_name=APP, user_id=USER)
        first = ev(delta={"n": 1})
        store.held.add(first.id)
        later = [(svc.append_event, ev(delta={"n": 2})),
                 (svc.append_event_locked, ev(delta={"n": 3})),
                 (svc.append_event_locked, ev(delta={"n": 4})),
                 (svc.append_event, ev(delta={"n": 5}))]  # fmt: skip
        failures: list[BaseException] = []

        def append(how: Callable[[Session, Event], Event], event: Event) -> None:
            try:
                how(live, event)
            except BaseException as error:  # reported by the test thread
                failures.append(error)

        threads = [threading.Thread(target=append, args=(svc.append_event, first))]
        threads[0].start()
        try:
            assert store.entered.wait(30)
            for waiting, (how, event) in enumerate(later, 1):
                threads.append(threading.Thread(target=append, args=(how, event)))
                threads[-1].start()
                _until(lambda n=waiting: _waiting_on(svc, live) == n)
        finally:
            store.gate.set()
            for thread in threads:
                thread.join(30)
        assert not any(thread.is_alive() for thread in threads)
        assert failures == []
        stored = svc.get_session(app_name=APP, user_id=USER, session_id=live.id)
        assert stored is not None
        # The two locked appends ran together: their order between them is free.
        expected = [first.id, later[0][1].id, *sorted(e.id for _, e in later[1:3])]
        got = event_ids(stored)
        assert got[:2] == expected[:2] and sorted(got[2:4]) == expected[2:]
        assert got[4] == later[3][1].id
        assert event_ids(live) == got
        assert live.state["n"] == 5
        _assert_no_turn_left(svc)
