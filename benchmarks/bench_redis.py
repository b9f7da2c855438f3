"""Benchmark the Redis store against google-adk's own RedisSessionService, on one server.

As a script, printing median times (microseconds) per operation at 10, 100 and
1,000 events per session, the ratio of ADK's time to ours, a bare FCALL round
trip (async and sync), appends and reads on sessions of the agent mix
against ADK's service, the bulk append rate (one session, and fifty
interleaved) and the rate of a replay of a generated 400-session trace in
batches of 1,000 (what ``sessionscope replay --store redis://... --batch 1000``
reports as events/s of append time), all measured in the same run on the same
redis-server::

    python benchmarks/bench_redis.py                      # starts its own redis-server
    python benchmarks/bench_redis.py --url redis://127.0.0.1:6379/0
    python benchmarks/bench_redis.py --same-cpu 1         # server and client on CPU 1

Both services are driven through their async API (ADK's is async only). Our
store runs under its own key prefix and ADK's under its own, and both are
removed at the end. ADK's sessions of 1,000 events are written in the one
JSON value its service keeps per session (what a thousand appends through it
leave behind), because filling them through its append, which rewrites the
whole value each time, would take most of the run.

Targets (issue 11): ours flat in history; at least 10x faster than ADK's on
append at 1,000 events; our append within 1.5x of a bare FCALL; append_many
of at least 50,000 events/s on one connection.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from google.adk.integrations.redis import RedisSessionService as AdkRedisSessionService
from google.adk.integrations.redis._config import RedisSessionServiceConfig
from google.adk.sessions.base_session_service import GetSessionConfig

from _redis_server import redis_server
from bench_adk import make_event
from sessionscope.adk import RedisSessionService
from sessionscope.bench.mix import MixSpec, generate
from sessionscope.bench.replay import open_target, replay
from sessionscope.stores.records import AppendBatch
from sessionscope.stores.redis import RedisStore

APP, USER = "bench", "user"
LENGTHS = (10, 100, 1000)
SESSIONS_PER_USER = 10
# The mix `sessionscope bench` replays: 400 sessions of the agent mix.
REPLAY_SESSIONS = 400
REPLAY_BATCH = 1000


async def median_us(action: Callable[[], Awaitable[Any]], rounds: int) -> float:
    """Return the median time of ``action`` in microseconds, after two warm-up calls."""
    for _ in range(2):
        await action()
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        await action()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


async def fill_ours(service: RedisSessionService, length: int) -> None:
    """Create the user's sessions with ``length`` events each, through the bulk path."""
    core = service._core
    for n in range(SESSIONS_PER_USER):
        session = await service.create_session(
            app_name=APP, user_id=f"{USER}-{length}", session_id=f"s{n}"
        )
        requests = []
        for i in range(length):
            prepared = core.prepare_append(session, make_event(i), locked=True)
            assert prepared is not None
            prepared.request.catch_up = False
            requests.append(prepared.request)
        outcome = await service.store.aio.append_many(AppendBatch.of(requests))
        assert outcome.error is None, outcome.error


async def fill_adk(service: AdkRedisSessionService, length: int) -> None:
    """Store the user's sessions with ``length`` events each, as ADK's service keeps them."""
    client = service._get_redis()
    for n in range(SESSIONS_PER_USER):
        user = f"{USER}-{length}"
        session = await service.create_session(app_name=APP, user_id=user, session_id=f"s{n}")
        session.events = [make_event(i) for i in range(length)]
        key = service._session_key(APP, user, session.id)
        await client.set(key, session.model_dump_json())


async def measure(service: Any, length: int, rounds: int) -> dict[str, float]:
    """Time append, get of the last 10, full get and list on a user at ``length`` events."""
    user = f"{USER}-{length}"
    live = await service.get_session(app_name=APP, user_id=user, session_id="s0")
    counter = iter(range(10**9))

    async def append() -> None:
        await service.append_event(live, make_event(next(counter)))

    async def last_10() -> None:
        await service.get_session(
            app_name=APP, user_id=user, session_id="s1",
            config=GetSessionConfig(num_recent_events=10),
        )  # fmt: skip

    async def full() -> None:
        await service.get_session(app_name=APP, user_id=user, session_id="s1")

    async def listing() -> None:
        await service.list_sessions(app_name=APP, user_id=user)

    return {
        "append": await median_us(append, rounds),
        "get last 10": await median_us(last_10, rounds),
        "full get": await median_us(full, max(5, rounds // 4)),
        "list": await median_us(listing, max(5, rounds // 4)),
    }


async def native_append_us(url: str, prefix: str, rounds: int) -> float:
    """Return the median append of the native async service (no ADK model to encode)."""
    from sessionscope import Event as NativeEvent
    from sessionscope import EventActions, SessionService

    async with SessionService(f"{url}?prefix={prefix}-native") as service:
        session = await service.create_session(app_name=APP, user_id="native")

        async def append() -> None:
            event = NativeEvent(author="analyst", content={"text": "z" * 400})
            event.actions = EventActions(state_delta={"last": 1, "user:visits": 2})
            await service.append_event(session, event)

        return await median_us(append, rounds)


def native_sync_append_us(url: str, prefix: str, rounds: int) -> tuple[float, float]:
    """Return the median append of the native sync service and the sync bare FCALL."""
    from sessionscope import Event as NativeEvent
    from sessionscope import EventActions, SyncSessionService

    def timed(action: Callable[[], Any]) -> float:
        for _ in range(2):
            action()
        times = []
        for _ in range(rounds):
            started = time.perf_counter()
            action()
            times.append(time.perf_counter() - started)
        return statistics.median(times) * 1e6

    with SyncSessionService(f"{url}?prefix={prefix}-sync") as service:
        session = service.create_session(app_name=APP, user_id="native")

        def append() -> None:
            event = NativeEvent(author="analyst", content={"text": "z" * 400})
            event.actions = EventActions(state_delta={"last": 1, "user:visits": 2})
            service.append_event(session, event)

        store = service.store
        assert isinstance(store, RedisStore)
        return timed(append), timed(store.noop)


def bulk_rate(url: str, prefix: str, events: int, sessions: int = 1) -> float:
    """Return events/s of append_many on one connection (batches of 1,000).

    With several sessions the batches interleave them, one event each in
    turn, as a replayed trace does. The cyclic collector is paused while the
    clock runs, as ``sessionscope replay`` does: the prepared events are the
    benchmark's own objects, and its passes over them are not the store's.
    """
    from sessionscope import Event as NativeEvent
    from sessionscope import SyncSessionService

    with SyncSessionService(f"{url}?prefix={prefix}-bulk") as sync:
        live = [sync.create_session(app_name=APP, user_id=f"bulk-{sessions}",
                                    session_id=f"b{n}") for n in range(sessions)]  # fmt: skip
        batches = [
            [(live[i % sessions], NativeEvent(author="replay", content={"i": i, "text": "y" * 200}))
             for i in range(start, start + 1000)]
            for start in range(0, events, 1000)
        ]  # fmt: skip
        gc.collect()
        gc.disable()
        try:
            started = time.perf_counter()
            for batch in batches:
                sync.append_many(batch)
            return events / (time.perf_counter() - started)
        finally:
            gc.enable()


def replay_rate(url: str, prefix: str, reads: bool = True) -> tuple[float, float]:
    """Return the events/s of append time a bulk replay of the bench trace reports, and its calls/s.

    The same path as ``sessionscope replay --store URL --batch 1000`` on a
    trace of ``sessionscope generate --sessions 400`` (``--no-reads`` when
    ``reads`` is false): the trace's calls in order, runs of appends sent
    through the bulk path, the collector paused, only the bulk calls timed.
    The reads ride in the batches (``RedisStore.append_many_reading``): their
    server time and transfer count as append time here, only the decoding
    of their answers does not. Calls/s is over the whole replay (every
    create, append, read, listing and delete of the trace).
    """
    spec = MixSpec(sessions=REPLAY_SESSIONS, seed=0)
    if not reads:
        spec = MixSpec(sessions=REPLAY_SESSIONS, seed=0, get_every_turn=False, list_every=0,
                         delete_fraction=0.0)  # fmt: skip
    records = list(generate(spec))
    target = open_target(f"{url}?prefix={prefix}-replay{'' if reads else '-writes'}")
    try:
        result = replay(target, records, batch=REPLAY_BATCH, verify_result=False,
                        progress=False)  # fmt: skip
    finally:
        target.close()
    return result.events_per_s, result.ops_per_s


async def run(url: str, rounds: int, bulk_events: int) -> dict[str, Any]:
    prefix = f"bench{uuid.uuid4().hex[:8]}"
    adk_prefix = f"adkbench{uuid.uuid4().hex[:8]}:"
    ours = RedisSessionService(f"{url}?prefix={prefix}")
    theirs = AdkRedisSessionService(RedisSessionServiceConfig(uri=url, key_prefix=adk_prefix))
    results: dict[str, Any] = {"ours": {}, "adk": {}}
    try:
        for length in LENGTHS:
            await fill_ours(ours, length)
            await fill_adk(theirs, length)
            results["ours"][length] = await measure(ours, length, rounds)
            results["adk"][length] = await measure(theirs, length, rounds)
        store = ours.store
        assert isinstance(store, RedisStore)
        results["fcall"] = await median_us(store.aio.noop, rounds * 4)
        results["native append"] = await native_append_us(url, prefix, rounds * 4)
        results["native sync append"], results["sync fcall"] = native_sync_append_us(
            url, prefix, rounds * 4
        )
        results["bulk"] = bulk_rate(url, prefix, bulk_events)
        results["bulk interleaved"] = bulk_rate(url, prefix, bulk_events, sessions=50)
        results["replay"] = replay_rate(url, prefix)
        results["replay writes"] = replay_rate(url, prefix, reads=False)
    finally:
        await ours.close()
        for store_prefix in (prefix, f"{prefix}-bulk", f"{prefix}-native", f"{prefix}-sync",
                             f"{prefix}-replay", f"{prefix}-replay-writes"):  # fmt: skip
            RedisStore(url, prefix=store_prefix).destroy()
        client = theirs._get_redis()
        async for key in client.scan_iter(match=adk_prefix + "*"):
            await client.delete(key)
        await client.aclose()
    return results


def mix_rows(url: str, sessions: int) -> dict[str, Any]:
    """Return median append and reads on the agent mix: ours (native async) and ADK's service.

    Both take the same sessions of the mix (``sessionscope.bench.speed``),
    appended in the mix's order; ours sends the second writer's appends
    through ``append_event_locked``, ADK's has only ``append_event``.
    """
    import redis

    from sessionscope.bench.speed import Workload, adk_run, mix_spec, native_async

    work = Workload.of(mix_spec(sessions, seed=0))
    prefix = f"benchmix{uuid.uuid4().hex[:8]}"
    adk_prefix = f"adkbenchmix{uuid.uuid4().hex[:8]}:"
    try:
        ours = native_async(f"{url}?prefix={prefix}", work, gets=True)
        theirs = adk_run(
            lambda: AdkRedisSessionService(
                RedisSessionServiceConfig(uri=url, key_prefix=adk_prefix)
            ),
            work,
            gets=True,
        )
    finally:
        RedisStore(url, prefix=prefix).destroy()
        client = redis.Redis.from_url(url)
        for key in client.scan_iter(match=adk_prefix + "*"):
            client.delete(key)
        client.close()
    medians = {
        side: {op: statistics.median(found[op]) / 1e3 for op in ("append", "get", "get_recent")}
        for side, found in (("ours", ours), ("adk", theirs))
    }
    return {"appends": len(work.appends), "sessions": sessions, **medians}


def report(results: dict[str, Any]) -> str:
    lines = [
        "median microseconds per call (one redis-server, async API, same run)",
        f"{'operation':<14}{'events':>8}{'sessionscope':>14}{'adk redis':>12}{'adk/ours':>10}",
    ]
    for op in ("append", "get last 10", "full get", "list"):
        for length in LENGTHS:
            ours = results["ours"][length][op]
            theirs = results["adk"][length][op]
            lines.append(f"{op:<14}{length:>8}{ours:>14.0f}{theirs:>12.0f}{theirs / ours:>9.1f}x")
    fcall = results["fcall"]
    append_1000 = results["ours"][1000]["append"]
    native = results["native append"]
    lines.append(f"bare FCALL round trip (async client): {fcall:.0f} us")
    lines.append(f"native SessionService append: {native:.0f} us = {native / fcall:.2f}x of it; "
                 f"ADK drop-in append at 1,000 events: {append_1000 / fcall:.2f}x "
                 "(the rest is encoding ADK's pydantic event)")  # fmt: skip
    sync_append, sync_fcall = results["native sync append"], results["sync fcall"]
    sync_ratio = sync_append / sync_fcall
    lines.append(f"sync API: native SyncSessionService append {sync_append:.0f} us, "
                 f"bare FCALL {sync_fcall:.0f} us = {sync_ratio:.2f}x of it")  # fmt: skip
    lines.append(f"append_many on one connection: {results['bulk']:,.0f} events/s "
                 f"(one session), {results['bulk interleaved']:,.0f} events/s "
                 "(50 sessions interleaved)")  # fmt: skip
    mix = results.get("mix")
    if mix is not None:
        ours, theirs = mix["ours"], mix["adk"]
        lines.append(f"on the agent mix ({mix['sessions']} sessions, {mix['appends']:,} appends), "
                     "median us, ours / adk RedisSessionService:")  # fmt: skip
        for op, name in (("append", "append"), ("get_recent", "get last 10"), ("get", "full get")):
            lines.append(f"  {name:<12}{ours[op]:>10.0f}{theirs[op]:>12.0f}"
                         f"{theirs[op] / ours[op]:>9.1f}x")  # fmt: skip
        lines.append(f"  native append on the mix = {ours['append'] / fcall:.2f}x a bare FCALL")
    (with_reads, calls), (writes, _) = results["replay"], results["replay writes"]
    lines.append(f"bulk replay of a {REPLAY_SESSIONS}-session trace, batches of "
                 f"{REPLAY_BATCH:,}: {with_reads:,.0f} events/s of append time "
                 f"(a read after every turn, carried in the batches; {calls:,.0f} calls/s "
                 f"over the whole replay), {writes:,.0f} (--no-reads)")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running server (default: start one)")
    parser.add_argument("--rounds", type=int, default=60, help="timed calls per operation")
    parser.add_argument("--bulk-events", type=int, default=50_000)
    parser.add_argument("--mix-sessions", type=int, default=20,
                        help="sessions of the agent mix timed on both services")  # fmt: skip
    parser.add_argument(
        "--same-cpu", type=int, metavar="CPU",
        help="run the started redis-server and this process on one CPU (Linux): a round "
        "trip then costs no wake-up of another core, which on a small VM can add "
        "tens of microseconds and varies from run to run",
    )  # fmt: skip
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="bench-redis-"))
    try:
        with contextlib.ExitStack() as stack:
            url = args.url
            if url is None:
                if shutil.which("redis-server") is None:
                    raise SystemExit("redis-server is not installed; give --url")
                url = stack.enter_context(redis_server(directory, args.same_cpu))
            if args.same_cpu is not None:
                os.sched_setaffinity(0, {args.same_cpu})
            results = asyncio.run(run(url, args.rounds, args.bulk_events))
            results["mix"] = mix_rows(url, args.mix_sessions)
            print(report(results))
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
