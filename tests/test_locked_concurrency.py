"""Locked appends from many tasks and threads to one shared live session.

However their finishes interleave, the live session ends equal to what the
store holds: same events in the same order, no repeats, same state, and the
store's revision marker.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

import _stores
from _stores import APP, USER, StoreFactory, ev, event_ids
from sessionscope import SessionService, SyncSessionService

store_factory = _stores.store_factory

TASKS = 12
THREADS = 6
PER_THREAD = 25


def _assert_live_matches(live: Any, stored: Any, expected: int) -> None:
    ids = event_ids(live)
    assert len(ids) == len(set(ids)), "the live session holds an event twice"
    assert ids == event_ids(stored)
    assert len(ids) == expected
    assert live.state == stored.state
    assert live.revision == stored.revision
    assert live.last_update_time == stored.last_update_time


def test_locked_appends_from_tasks_keep_the_live_session_exact(
    store_factory: StoreFactory,
) -> None:
    async def scenario() -> None:
        async with SessionService(store_factory()) as svc:
            live = await svc.create_session(app_name=APP, user_id=USER, state={"n": -1})
            # Each round starts many appends before any finishes.
            for round_ in range(3):
                await asyncio.gather(
                    *(
                        svc.append_event_locked(
                            live,
                            ev(delta={f"k{round_}-{i}": i, "n": i, "user:last": i, "temp:t": i}),
                        )
                        for i in range(TASKS)
                    )
                )
            stored = await svc.get_session(app_name=APP, user_id=USER, session_id=live.id)
            assert stored is not None
            temp = {k: v for k, v in live.state.items() if k.startswith("temp:")}
            assert set(temp) == {"temp:t"}
            live.state.pop("temp:t")
            _assert_live_matches(live, stored, 3 * TASKS)

    asyncio.run(scenario())


def test_locked_appends_from_threads_keep_the_live_session_exact(
    store_factory: StoreFactory,
) -> None:
    with SyncSessionService(store_factory()) as svc:
        live = svc.create_session(app_name=APP, user_id=USER)
        start = threading.Barrier(THREADS, timeout=30)
        failures: list[BaseException] = []

        def worker(n: int) -> None:
            try:
                start.wait()
                for i in range(PER_THREAD):
                    svc.append_event_locked(live, ev(delta={f"t{n}": i, "app:last": n}))
            except BaseException as error:  # reported by the test thread
                failures.append(error)

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert not any(thread.is_alive() for thread in threads)
        assert not failures
        stored = svc.get_session(app_name=APP, user_id=USER, session_id=live.id)
        assert stored is not None
        _assert_live_matches(live, stored, THREADS * PER_THREAD)
        assert {live.state[f"t{n}"] for n in range(THREADS)} == {PER_THREAD - 1}


@pytest.mark.parametrize("first", ["older", "newer"])
def test_a_late_older_finish_adds_nothing(store_factory: StoreFactory, first: str) -> None:
    """Two locked appends prepared on one copy finish in either order: same live session."""
    with SyncSessionService(store_factory()) as svc:
        live = svc.create_session(app_name=APP, user_id=USER)
        core = svc._core
        one, two = ev(delta={"a": 1}), ev(delta={"a": 2})
        prepared_one = core.prepare_append(live, one, locked=True)
        prepared_two = core.prepare_append(live, two, locked=True)
        assert prepared_one is not None and prepared_two is not None
        result_one = svc.store.append(prepared_one.request).result()
        result_two = svc.store.append(prepared_two.request).result()
        finishes = [(one, prepared_one, result_one), (two, prepared_two, result_two)]
        if first == "newer":
            finishes.reverse()
        for event, prepared, result in finishes:
            core.finish_append(live, event, prepared, result)
        stored = svc.get_session(app_name=APP, user_id=USER, session_id=live.id)
        assert stored is not None
        _assert_live_matches(live, stored, 2)
        # The caller's own event objects are the ones the live session holds.
        assert live.events[0] is one and live.events[1] is two
        assert live.state["a"] == 2
