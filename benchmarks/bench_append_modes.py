"""The cost of one native LMDB append by path: durable, deferred, locked, from an event loop.

Run as a script (best of three runs of each, in microseconds per append)::

    python benchmarks/bench_append_modes.py

To compare two versions, run it once with each on ``PYTHONPATH``, one after
the other: the figures move with the load of the machine.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections.abc import Callable

from sessionscope import Event, EventActions, LmdbStore, SessionService, SyncSessionService

TEXT = "Here is what I found about your order and the delivery window. " * 12
WARMUP = 50


def _event(i: int) -> Event:
    return Event(author="agent", content={"text": TEXT}, actions=EventActions(state_delta={"n": i}))


def sync_append(durability: str, count: int, locked: bool = False) -> float:
    """Return the seconds per append through SyncSessionService."""
    where = tempfile.mkdtemp()
    try:
        with SyncSessionService(LmdbStore(f"{where}/store", durability=durability)) as svc:  # type: ignore[arg-type]
            session = svc.create_session(app_name="app", user_id="user")
            append = svc.append_event_locked if locked else svc.append_event
            events = [_event(i) for i in range(WARMUP + count)]
            for event in events[:WARMUP]:
                append(session, event)
            start = time.perf_counter()
            for event in events[WARMUP:]:
                append(session, event)
            return (time.perf_counter() - start) / count
    finally:
        shutil.rmtree(where)


def async_append(durability: str, count: int) -> float:
    """Return the seconds per append through SessionService on an event loop."""
    where = tempfile.mkdtemp()

    async def run() -> float:
        async with SessionService(LmdbStore(f"{where}/store", durability=durability)) as svc:  # type: ignore[arg-type]
            session = await svc.create_session(app_name="app", user_id="user")
            events = [_event(i) for i in range(WARMUP + count)]
            for event in events[:WARMUP]:
                await svc.append_event(session, event)
            start = time.perf_counter()
            for event in events[WARMUP:]:
                await svc.append_event(session, event)
            return (time.perf_counter() - start) / count

    try:
        return asyncio.run(run())
    finally:
        shutil.rmtree(where)


def _best(measure: Callable[[], float]) -> float:
    return min(measure() for _ in range(3))


def main() -> None:
    cases: dict[str, Callable[[], float]] = {
        "durable": lambda: sync_append("sync", 1000),
        "deferred": lambda: sync_append("deferred", 5000),
        "deferred locked": lambda: sync_append("deferred", 5000, locked=True),
        "deferred from a loop": lambda: async_append("deferred", 5000),
        "durable from a loop": lambda: async_append("sync", 1000),
    }
    for name, measure in cases.items():
        print(f"{name:22} {_best(measure) * 1e6:8.1f} us", flush=True)


if __name__ == "__main__":
    main()
