"""google-adk's BufferedSessionService over the LMDB drop-in: queued events chained, or one by one.

    python benchmarks/adk_buffered.py [--rounds 5] [--sessions 40] [--quick]

google-adk 2.15's ``BufferedSessionService`` returns from ``append_event`` at
once and writes in the background: a session's queued events in one
``append_events`` call when the service below overrides it, else one
``append_event`` per event. ``LmdbSessionService`` overrides it with one
transaction of the store (one sync on a durable store). Each round sends
the agent mix (``sessionscope.bench.mix``: its sessions, in the mix's order)
through a ``BufferedSessionService`` over a fresh LMDB store, then flushes,
twice: over ``LmdbSessionService`` as it is, and over a subclass that keeps
ADK's default ``append_events`` (its peer, in the same round; the two
alternate which goes first). Figures: events per second from the first
append to the end of the flush, and events per store write (per
``append_events`` call, or 1), medians over rounds, for a durable and a
deferred store. Needs google-adk 2.15 or later.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from google.adk.events import Event
from google.adk.sessions import BaseSessionService, Session

from sessionscope.adk import LmdbSessionService
from sessionscope.bench.replay import collector_paused
from sessionscope.bench.speed import Workload, live_appends_async, mix_spec
from sessionscope.cli.console import Column, render_table

BufferedSessionService: Any
try:
    from google.adk.sessions import BufferedSessionService
except ImportError:  # google-adk before 2.15
    BufferedSessionService = None


class _Counting(LmdbSessionService):
    """The drop-in, counting its store writes: one per ``append_events`` call."""

    writes: list[int]

    async def append_events(self, session: Session, events: list[Event]) -> list[Event]:
        self.writes.append(len(events))
        return await super().append_events(session, events)


class _OneByOne(LmdbSessionService):
    """The drop-in with ADK's default ``append_events``: one ``append_event`` per event."""

    writes: list[int]
    append_events = BaseSessionService.append_events

    async def append_event(self, session: Session, event: Event) -> Event:
        self.writes.append(1)
        return await super().append_event(session, event)


async def _send(inner: Any, work: Workload) -> float:
    """Send the workload through a BufferedSessionService over ``inner``; return events/s."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ADK marks the service experimental
        service = BufferedSessionService(inner)
    appends = await live_appends_async(service, work, Event.model_validate)
    inner.writes = []
    with collector_paused():
        began = time.perf_counter()
        for session, event, _ in appends:
            await service.append_event(session, event)
        await service.flush()
        elapsed = time.perf_counter() - began
    await service.aclose()
    await inner.close()
    return len(appends) / elapsed


def measure(rounds: int, sessions: int) -> list[list[str]]:
    """Return the table's rows: store, one by one, chained, ratio, events per write."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="sessionscope-bench-buffered-") as root:
        for durability in ("sync", "deferred"):
            rates: dict[str, list[float]] = {"one": [], "chain": []}
            per_write: dict[str, list[float]] = {"one": [], "chain": []}
            for number in range(rounds):
                work = Workload.of(mix_spec(sessions, seed=number))
                order = ("one", "chain") if number % 2 == 0 else ("chain", "one")
                for side in order:
                    kind = _OneByOne if side == "one" else _Counting
                    path = Path(root) / f"{durability}-{side}-{number}"
                    inner = kind(path, durability=durability)
                    rates[side].append(asyncio.run(_send(inner, work)))
                    per_write[side].append(sum(inner.writes) / len(inner.writes))
            one, chain = statistics.median(rates["one"]), statistics.median(rates["chain"])
            rows.append(
                [
                    "durable (fsync)" if durability == "sync" else "deferred",
                    f"{one:,.0f}",
                    f"{chain:,.0f}",
                    f"{chain / one:.2f}x",
                    f"{statistics.median(per_write['chain']):.1f}",
                ]
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sessions", type=int, default=40, help="sessions of the mix a round")
    parser.add_argument("--quick", action="store_true", help="2 rounds of 10 sessions")
    args = parser.parse_args()
    if BufferedSessionService is None:
        parser.exit(1, "needs google-adk 2.15 or later (BufferedSessionService)\n")
    rounds, sessions = (2, 10) if args.quick else (args.rounds, args.sessions)
    columns = [
        "LMDB store",
        Column("one by one (events/s)", True),
        Column("chained", True),
        Column("speedup", True),
        Column("events a write", True),
    ]
    title = f"BufferedSessionService over LmdbSessionService, {sessions} sessions of the mix"
    print(render_table(columns, measure(rounds, sessions), title))


if __name__ == "__main__":
    main()
