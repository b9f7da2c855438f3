"""The async deferred append beside ADK's in-memory append, by session length, with its floor.

As a script (about 30 seconds; ``--quick`` about 10)::

    python benchmarks/async_floor.py [--rounds 3] [--quick] [--json out.json]

Why this exists: the target "native deferred append at most 1.0x ADK
``InMemorySessionService.append_event``" compares a durable store with a dict,
whose cost grows with the session. From an event loop, a deferred LMDB
append commits inline when nobody holds the write lock; when someone does,
it is handed to the store's writer thread and its outcome handed back (the
loop never waits for the lock). This script measures, in one run and at
several session lengths:

- ADK ``InMemorySessionService.append_event`` (its cost grows with the
  session: the in-memory service copies what it stores);
- the native async service's deferred append, and the sync service's;
- a bare hand-off of nothing to a thread and back, made the way the store
  makes it (a condition variable to wake the thread, ``call_soon_threadsafe``
  to wake the loop): what an append from a loop pays on top when the write
  lock is busy.

Every row appends the workload's user/model/tool turns (deltas on session,
``user:``, ``app:`` and ``temp:`` keys) until the session holds the length,
then times the next ``--window`` appends; each figure is the median over
rounds of each round's median. The ratios are printed, not asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from sessionscope.bench.speed import _copy, _median_us, _timed_appends, turn_records
from sessionscope.cli.console import Column, render_table
from sessionscope.service import SessionService, SyncSessionService, event_from_record


def _records(count: int, prefix: str) -> list[dict[str, Any]]:
    return turn_records(count, prefix=prefix)


async def _adk_inmemory(length: int, window: int, prefix: str) -> float:
    from google.adk.events import Event as AdkEvent
    from google.adk.sessions import InMemorySessionService

    service = InMemorySessionService()
    session = await service.create_session(app_name="floor", user_id="u")
    events = [AdkEvent.model_validate(_copy(r)) for r in _records(length + window, prefix)]
    for event in events[:length]:
        await service.append_event(session, event)
    return _median_us(await _timed_appends(service, session, events[length:]))


async def _native_async(root: Path, length: int, window: int, prefix: str) -> float:
    service = SessionService(f"lmdb://{root / prefix}?durability=deferred")
    try:
        session = await service.create_session(app_name="floor", user_id="u")
        events = [event_from_record(_copy(r)) for r in _records(length + window, prefix)]
        for event in events[:length]:
            await service.append_event(session, event)
        return _median_us(await _timed_appends(service, session, events[length:]))
    finally:
        await service.close()


def _native_sync(root: Path, length: int, window: int, prefix: str) -> float:
    with SyncSessionService(f"lmdb://{root / prefix}?durability=deferred") as service:
        session = service.create_session(app_name="floor", user_id="u")
        events = [event_from_record(_copy(r)) for r in _records(length + window, prefix)]
        for event in events[:length]:
            service.append_event(session, event)
        clock = time.perf_counter_ns
        samples = []
        for event in events[length:]:
            begin = clock()
            service.append_event(session, event)
            samples.append(clock() - begin)
        return _median_us(samples)


async def _bare_handoff(count: int) -> float:
    """Hand nothing to a thread and back, ``count`` times: the floor of a loop's write."""
    loop = asyncio.get_running_loop()
    queue: deque[asyncio.Future[None]] = deque()
    wake = threading.Condition()
    stop = False

    def worker() -> None:
        while True:
            with wake:
                while not queue and not stop:
                    wake.wait()
                if not queue:
                    return
                future = queue.popleft()
            loop.call_soon_threadsafe(future.set_result, None)

    thread = threading.Thread(target=worker, name="floor-handoff", daemon=True)
    thread.start()
    clock = time.perf_counter_ns
    samples = []
    try:
        for _ in range(count):
            begin = clock()
            future = loop.create_future()
            with wake:
                queue.append(future)
                wake.notify()
            await future
            samples.append(clock() - begin)
    finally:
        with wake:
            stop = True
            wake.notify()
        thread.join(timeout=10)
    return _median_us(samples)


def measure(
    lengths: tuple[int, ...], window: int, rounds: int, root: Path
) -> dict[int, dict[str, float]]:
    """Return the median over rounds of each row, per session length."""
    results: dict[int, dict[str, list[float]]] = {
        n: {"adk": [], "async": [], "sync": [], "floor": []} for n in lengths
    }
    for number in range(rounds):
        for length in lengths:
            prefix = f"r{number}-{length}"
            row = results[length]
            row["adk"].append(asyncio.run(_adk_inmemory(length, window, prefix)))
            row["async"].append(asyncio.run(_native_async(root, length, window, prefix + "a")))
            row["sync"].append(_native_sync(root, length, window, prefix + "s"))
            row["floor"].append(asyncio.run(_bare_handoff(window)))
    return {
        n: {name: statistics.median(values) for name, values in row.items()}
        for n, row in results.items()
    }


def main(argv: list[str] | None = None) -> int:
    """Measure and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds per length")
    parser.add_argument("--window", type=int, default=150, help="appends timed per length")
    parser.add_argument("--quick", action="store_true", help="fewer lengths and rounds")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    lengths = (10, 300, 1000) if args.quick else (10, 100, 300, 1000, 3000)
    rounds = 1 if args.quick else args.rounds
    with tempfile.TemporaryDirectory(prefix="sessionscope-floor-") as root:
        figures = measure(lengths, args.window, rounds, Path(root))
    table = [
        [
            f"{length:,}",
            f"{row['adk']:.1f}",
            f"{row['async']:.1f}",
            f"{row['async'] / row['adk']:.2f}x",
            f"{row['sync']:.1f}",
            f"{row['sync'] / row['adk']:.2f}x",
            f"{row['floor']:.1f}",
            f"{row['floor'] / row['adk']:.2f}x",
        ]
        for length, row in figures.items()
    ]
    columns = [
        Column("events before", numeric=True),
        Column("adk InMemory us", numeric=True),
        Column("async deferred us", numeric=True),
        Column("ratio", numeric=True),
        Column("sync deferred us", numeric=True),
        Column("ratio", numeric=True),
        Column("bare hand-off us", numeric=True),
        Column("ratio", numeric=True),
    ]
    print(render_table(columns, table, title="deferred append against ADK InMemory, by length"))
    if args.json:
        args.json.write_text(json.dumps({str(n): row for n, row in figures.items()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
