"""Benchmark the google-adk drop-in against ADK's own session services.

Under pytest-benchmark::

    pytest benchmarks/bench_adk.py --benchmark-only

As a script, printing median times per operation and our/ADK ratios, all
measured in the same run::

    python benchmarks/bench_adk.py

Targets: deferred ``append_event`` no slower than 1.5x ADK's
``InMemorySessionService``; durable ``append_event`` at least 5x faster than
ADK's ``SqliteSessionService``; ``get_session`` of a 500-event session and
``get_session(num_recent_events=10)`` of a 2,000-event one no slower than
``InMemorySessionService``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("google.adk")

from google.adk.events import Event, EventActions
from google.adk.sessions import BaseSessionService, InMemorySessionService
from google.adk.sessions.base_session_service import GetSessionConfig
from google.genai import types

from sessionscope.adk import LmdbSessionService

pytestmark = pytest.mark.adk

APP, USER = "bench", "user"
TEXT = (
    "The quarterly report shows revenue up 12% year over year, driven by strong demand in "
    "the enterprise segment. Operating margins improved as cloud costs fell. The team "
    "recommends expanding the sales force in EMEA and revisiting pricing for the SMB tier "
    "before the next planning cycle begins in October."
)


def make_event(i: int) -> Event:
    """Return a realistic model event: text, a function call, a small state delta."""
    return Event(
        invocation_id=f"inv-{i // 4}",
        author="analyst",
        content=types.Content(
            role="model",
            parts=[
                types.Part(text=TEXT),
                types.Part(
                    function_call=types.FunctionCall(
                        id=f"call-{i}",
                        name="lookup_account",
                        args={"account_id": f"acct-{i}", "fields": ["revenue", "region"]},
                    )
                ),
            ],
        ),
        actions=EventActions(
            state_delta={"last_account": f"acct-{i}", "user:visits": i, "app:calls": i}
        ),
        usage_metadata=types.GenerateContentResponseUsageMetadata(
            prompt_token_count=812, candidates_token_count=96, total_token_count=908
        ),
    )


@asynccontextmanager
async def service(kind: str) -> AsyncIterator[BaseSessionService]:
    """Yield a fresh service of one kind, on a temporary directory when it needs one."""
    with tempfile.TemporaryDirectory() as tmp:
        if kind == "adk-memory":
            yield InMemorySessionService()
            return
        if kind == "adk-sqlite":
            from google.adk.sessions.sqlite_session_service import SqliteSessionService

            svc: Any = SqliteSessionService(db_path=str(Path(tmp) / "s.db"))
        else:
            durability = "deferred" if kind == "ours-deferred" else "sync"
            svc = LmdbSessionService(str(Path(tmp) / "store"), durability=durability)
        try:
            yield svc
        finally:
            await svc.close()


async def _append_run(svc: BaseSessionService, count: int, start: int) -> float:
    """Return the seconds ``count`` appends to a fresh session take."""
    session = await svc.create_session(app_name=APP, user_id=USER)
    events = [make_event(start + i) for i in range(count)]
    began = time.perf_counter()
    for event in events:
        await svc.append_event(session, event)
    return time.perf_counter() - began


async def _fill(svc: BaseSessionService, count: int) -> str:
    session = await svc.create_session(app_name=APP, user_id=USER)
    for i in range(count):
        await svc.append_event(session, make_event(i))
    return str(session.id)


async def _get_run(svc: BaseSessionService, sid: str, reads: int, config: Any) -> float:
    began = time.perf_counter()
    for _ in range(reads):
        await svc.get_session(app_name=APP, user_id=USER, session_id=sid, config=config)
    return (time.perf_counter() - began) / reads


# Each case: (name, kinds compared, how to measure one sample on a service).
def _append_sample(count: int) -> Callable[[BaseSessionService, int], Awaitable[float]]:
    async def sample(svc: BaseSessionService, round_no: int) -> float:
        return await _append_run(svc, count, round_no * count) / count

    return sample


def _get_sample(size: int, config: Any) -> Callable[[BaseSessionService, int], Awaitable[float]]:
    sids: dict[int, str] = {}

    async def sample(svc: BaseSessionService, round_no: int) -> float:
        if id(svc) not in sids:
            sids[id(svc)] = await _fill(svc, size)
        return await _get_run(svc, sids[id(svc)], 5, config)

    return sample


CASES: list[tuple[str, str, str, Callable[[BaseSessionService, int], Awaitable[float]]]] = [
    ("append_event deferred vs InMemory", "ours-deferred", "adk-memory", _append_sample(200)),
    ("append_event durable vs Sqlite", "ours-sync", "adk-sqlite", _append_sample(30)),
    ("get_session 500 events", "ours-deferred", "adk-memory", _get_sample(500, None)),
    (
        "get_session last 10 of 2000",
        "ours-deferred",
        "adk-memory",
        _get_sample(2000, GetSessionConfig(num_recent_events=10)),
    ),
]


def measure(kind: str, sample: Any, rounds: int) -> float:
    """Return the median seconds per operation of one kind over ``rounds`` samples."""

    async def run() -> list[float]:
        async with service(kind) as svc:
            return [await sample(svc, r) for r in range(rounds)]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return statistics.median(asyncio.run(run()))


def main() -> None:
    """Print a table of medians and ratios, measured in this run."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    print(f"{'case':36} {'ours':>12} {'ADK':>12} {'ours/ADK':>9}")
    for name, ours, theirs, sample in CASES:
        mine = measure(ours, sample, args.rounds)
        other = measure(theirs, sample, args.rounds)
        print(f"{name:36} {mine * 1e6:10.1f}us {other * 1e6:10.1f}us {mine / other:9.2f}")


# -- pytest-benchmark -----------------------------------------------------


@pytest.mark.parametrize("kind", ["ours-deferred", "adk-memory", "ours-sync", "adk-sqlite"])
def test_bench_adk_append(benchmark: Any, kind: str) -> None:
    """Time appends of realistic events to one session."""
    count = 30 if kind in ("ours-sync", "adk-sqlite") else 200
    loop = asyncio.new_event_loop()
    cm = service(kind)
    svc = loop.run_until_complete(cm.__aenter__())
    try:
        rounds = iter(range(10_000))
        benchmark.name = f"adk_append_{kind}"
        benchmark.pedantic(
            lambda: loop.run_until_complete(_append_run(svc, count, next(rounds) * count)),
            rounds=5,
            iterations=1,
        )
    finally:
        loop.run_until_complete(cm.__aexit__(None, None, None))
        loop.close()


@pytest.mark.parametrize("kind", ["ours-deferred", "adk-memory"])
@pytest.mark.parametrize("size,recent", [(500, None), (2000, 10)])
def test_bench_adk_get_session(benchmark: Any, kind: str, size: int, recent: int | None) -> None:
    """Time get_session of a long session, whole or its last events."""
    config = GetSessionConfig(num_recent_events=recent) if recent else None
    loop = asyncio.new_event_loop()
    cm = service(kind)
    svc = loop.run_until_complete(cm.__aenter__())
    try:
        sid = loop.run_until_complete(_fill(svc, size))
        benchmark.name = f"adk_get_session_{size}_{recent}_{kind}"
        benchmark(
            lambda: loop.run_until_complete(
                svc.get_session(app_name=APP, user_id=USER, session_id=sid, config=config)
            )
        )
    finally:
        loop.run_until_complete(cm.__aexit__(None, None, None))
        loop.close()


if __name__ == "__main__":
    main()
