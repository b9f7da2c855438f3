"""Benchmark AgentsSession beside the OpenAI Agents SDK's own sessions, in one run.

Run as a script (it starts a redis-server on a free loopback port for the
Redis backends, and stops it)::

    python benchmarks/bench_openai_agents.py [--quick]

Backends: the SDK's ``SQLiteSession`` and ``AsyncSQLiteSession`` (a file),
its ``RedisSession``; ``AgentsSession`` on LMDB (durable, then deferred),
Redis and memory. Measured: ``add_items`` of one turn (four items),
``get_items(limit=20)`` at 10, 1,000 and 100,000 items, ``pop_item``, and 8
processes each adding turns to its own session and then all to one shared
session (turns per second, operations that failed, items lost). Medians in
microseconds; the ratio is SQLiteSession's time over the backend's. Last,
the floors no backend goes below, in the same run: decoding the twenty
items a ``get_items(20)`` returns, and one sync of the disk.

Goal: ``get_items(20)`` at 1,000 items and durable ``add_items`` at least
10x faster than ``SQLiteSession``; no failed operation across processes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from agents import SQLiteSession
from agents.extensions.memory import AsyncSQLiteSession, RedisSession

from sessionscope.codec import pack, unpack
from sessionscope.openai_agents import AgentsSession
from sessionscope.stores import open_store

TURN = [
    {"role": "user", "content": "What is the weather in Paris tomorrow? Do I need a coat?"},
    {"type": "function_call", "name": "forecast", "arguments": '{"city": "Paris"}',
     "call_id": "call_1", "id": "fc_1", "status": "completed"},
    {"type": "function_call_output", "call_id": "call_1",
     "output": '{"high": 14, "low": 6, "rain": 0.4, "wind": "NW 20 km/h"}'},
    {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
     "content": [{"type": "output_text", "annotations": [],
                  "text": "Tomorrow in Paris: 6 to 14 degrees, a 40% chance of rain and a "
                          "north-west wind. Bring a light coat and an umbrella."}]},
]  # fmt: skip


# -- the backends -----------------------------------------------------------------


class Backend:
    """Make sessions of one kind in a directory; ``close`` releases what they share."""

    name = ""

    def __init__(self, base: Path, redis_url: str) -> None:
        self.base = base
        self.redis_url = redis_url

    def spec(self) -> tuple[str, str, str]:
        """Return what a child process needs to open the same backend: (kind, base, url)."""
        return (type(self).__name__, str(self.base), self.redis_url)

    def session(self, sid: str) -> Any:
        raise NotImplementedError

    async def close(self) -> None:
        """Release what the sessions share."""


class Sqlite(Backend):
    name = "SQLiteSession (SDK)"

    def __init__(self, base: Path, redis_url: str) -> None:
        super().__init__(base, redis_url)
        self.opened: list[Any] = []

    def session(self, sid: str) -> Any:
        session = SQLiteSession(sid, self.base / "sdk.db")
        self.opened.append(session)
        return session

    async def close(self) -> None:
        for session in self.opened:
            session.close()


class AsyncSqlite(Sqlite):
    name = "AsyncSQLiteSession (SDK)"

    def session(self, sid: str) -> Any:
        session = AsyncSQLiteSession(sid, self.base / "sdk-async.db")
        self.opened.append(session)
        return session

    async def close(self) -> None:
        for session in self.opened:
            await session.close()


class SdkRedis(Sqlite):
    name = "RedisSession (SDK)"

    def session(self, sid: str) -> Any:
        session = RedisSession.from_url(sid, url=self.redis_url, key_prefix=f"sdk{self.base.name}")
        self.opened.append(session)
        return session

    async def close(self) -> None:
        for session in self.opened:
            await session.close()


class Ours(Backend):
    uri = ""

    def __init__(self, base: Path, redis_url: str) -> None:
        super().__init__(base, redis_url)
        self.store = open_store(self.uri_of())

    def uri_of(self) -> str:
        return self.uri.format(base=self.base, redis=self.redis_url)

    def session(self, sid: str) -> Any:
        return AgentsSession(sid, self.store)

    async def close(self) -> None:
        await self.store.aio.close()


class OursDurable(Ours):
    name = "AgentsSession lmdb (durable)"
    uri = "lmdb://{base}/lmdb-durable"


class OursDeferred(Ours):
    name = "AgentsSession lmdb (deferred)"
    uri = "lmdb://{base}/lmdb-deferred?durability=deferred"


class OursRedis(Ours):
    name = "AgentsSession redis"
    uri = "{redis}/0?prefix=ours-{base.name}"


class OursMemory(Ours):
    name = "AgentsSession memory"
    uri = "memory://"


BACKENDS: list[type[Backend]] = [
    Sqlite, AsyncSqlite, SdkRedis, OursDurable, OursDeferred, OursRedis, OursMemory,
]  # fmt: skip
BY_NAME = {kind.__name__: kind for kind in BACKENDS}


# -- timing -------------------------------------------------------------------------


async def median_us(call: Callable[[], Awaitable[Any]], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        await call()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


async def fill(session: Any, count: int) -> None:
    """Add ``count`` items in lists of at most 1,000."""
    done = 0
    while done < count:
        size = min(1000, count - done)
        await session.add_items([dict(TURN[i % 4], n=done + i) for i in range(size)])
        done += size


async def measure(backend: Backend, sizes: list[int], rounds: int) -> dict[str, float]:
    try:
        return await _measure(backend, sizes, rounds)
    finally:
        await backend.close()


async def _measure(backend: Backend, sizes: list[int], rounds: int) -> dict[str, float]:
    figures: dict[str, float] = {}
    session = backend.session("turns")
    figures["add_items (one turn)"] = await median_us(lambda: session.add_items(TURN), rounds)
    for size in sizes:
        reader = backend.session(f"read-{size}")
        await fill(reader, size)
        got = await reader.get_items(20)
        assert len(got) == min(20, size), (backend.name, size, len(got))
        figures[f"get_items(20) at {size:,}"] = await median_us(
            lambda reader=reader: reader.get_items(20), rounds
        )
    popper = backend.session("pops")
    await fill(popper, rounds + 10)
    figures["pop_item"] = await median_us(popper.pop_item, rounds)
    return figures


def floors(directory: Path, rounds: int) -> dict[str, float]:
    """Return what no backend goes below, in microseconds, measured in this run.

    Decoding the twenty items ``get_items(20)`` returns: from one msgpack
    array, the least decoding AgentsSession can do (its items are msgpack),
    and from twenty JSON texts, as SQLiteSession stores them. And one sync
    of this disk: a 4 KiB write and ``fdatasync`` in the benchmark's
    directory, the least a durable ``add_items`` waits for on any backend.
    """
    items = [dict(TURN[i % 4], n=980 + i) for i in range(20)]
    packed = pack(items)
    texts = [json.dumps(item) for item in items]
    assert unpack(packed) == [json.loads(text) for text in texts] == items

    def median_of(call: Callable[[], Any]) -> float:
        times = []
        for _ in range(rounds):
            started = time.perf_counter()
            call()
            times.append(time.perf_counter() - started)
        return statistics.median(times) * 1e6

    path = directory / "sync-floor"
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        block = os.urandom(4096)

        def sync() -> None:
            os.pwrite(descriptor, block, 0)
            os.fdatasync(descriptor)

        sync_us = median_of(sync)
    finally:
        os.close(descriptor)
        path.unlink()
    return {
        "decoding 20 items, msgpack (one array)": median_of(lambda: unpack(packed)),
        "decoding 20 items, JSON (one text each)": median_of(
            lambda: [json.loads(text) for text in texts]
        ),
        "one 4 KiB write and fdatasync": sync_us,
    }


# -- processes ------------------------------------------------------------------------


def _child(spec: tuple[str, str, str], sid: str, turns: int, start: Any, out: Any) -> None:
    """Add ``turns`` turns to session ``sid``; put (done, failed, seconds, first error)."""
    kind, base, url = spec
    backend = BY_NAME[kind](Path(base), url)

    async def work() -> tuple[int, int, float, str]:
        session = backend.session(sid)
        start.wait()
        done = failed = 0
        error = ""
        started = time.perf_counter()
        for _ in range(turns):
            try:
                await session.add_items(TURN)
                done += 1
            except Exception as exc:  # counted: what the benchmark reports
                failed += 1
                error = error or f"{type(exc).__name__}: {exc}"[:100]
        elapsed = time.perf_counter() - started
        await backend.close()
        return done, failed, elapsed, error

    out.put(asyncio.run(work()))


def processes(backend: Backend, shared: bool, workers: int, turns: int) -> dict[str, Any]:
    """Run ``workers`` processes adding ``turns`` turns each; return what they did."""
    context = multiprocessing.get_context("spawn")
    start, out = context.Event(), context.Queue()
    prefix = "shared" if shared else "own"
    sids = [prefix if shared else f"{prefix}-{n}" for n in range(workers)]
    children = [
        context.Process(target=_child, args=(backend.spec(), sid, turns, start, out))
        for sid in sids
    ]
    for child in children:
        child.start()
    time.sleep(0.5)
    start.set()
    results = [out.get(timeout=600) for _ in children]
    for child in children:
        child.join(timeout=60)
    done = sum(r[0] for r in results)
    failed = sum(r[1] for r in results)
    seconds = max(r[2] for r in results)

    async def stored() -> int:
        total = 0
        for sid in set(sids):
            total += len(await backend.session(sid).get_items())
        await backend.close()
        return total

    items = asyncio.run(stored())
    return {
        "turns/s": done / seconds if seconds else 0.0,
        "failed": failed,
        "lost items": done * len(TURN) - items,
        "error": next((r[3] for r in results if r[3]), ""),
    }


# -- the run --------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def start_redis(directory: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    server = subprocess.Popen(
        ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "",
         "--appendonly", "no", "--dir", str(directory)],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    for _ in range(100):
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return server, f"redis://127.0.0.1:{port}"
        time.sleep(0.05)
    server.kill()
    raise RuntimeError("redis-server did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds, 10,000 at most")
    args = parser.parse_args()
    rounds = 50 if args.quick else 200
    sizes = [10, 1_000, 10_000] if args.quick else [10, 1_000, 100_000]
    workers, turns = 8, 25 if args.quick else 100
    root = Path(tempfile.mkdtemp(prefix="bench-oai-"))
    server, url = start_redis(root)
    try:
        table: dict[str, dict[str, float]] = {}
        procs: dict[str, dict[str, dict[str, Any]]] = {}
        for index, kind in enumerate(BACKENDS):
            base = root / f"b{index}"
            base.mkdir()
            backend = kind(base, url)
            table[kind.name] = asyncio.run(measure(backend, sizes, rounds))
            if kind is not OursMemory:  # a memory store is not shared by processes
                procs[kind.name] = {
                    "own": processes(kind(base, url), False, workers, turns),
                    "shared": processes(kind(base, url), True, workers, turns),
                }
            print(f"measured {kind.name}", file=sys.stderr, flush=True)
        report(table, procs, workers, turns, floors(root, rounds))
    finally:
        server.terminate()
        server.wait(timeout=30)
        shutil.rmtree(root, ignore_errors=True)


def report(
    table: dict[str, dict[str, float]],
    procs: dict[str, dict[str, dict[str, Any]]],
    workers: int,
    turns: int,
    floor: dict[str, float],
) -> None:
    base = table[Sqlite.name]
    operations = list(base)
    print(f"\nmedian microseconds per call (x: SQLiteSession's time over this one); "
          f"Python {sys.version.split()[0]}, {os.cpu_count()} cpus\n")  # fmt: skip
    print("| operation | " + " | ".join(table) + " |")
    print("|---" * (len(table) + 1) + "|")
    for operation in operations:
        cells = [
            f"{figures[operation]:,.0f} ({base[operation] / figures[operation]:.1f}x)"
            for figures in table.values()
        ]
        print(f"| {operation} | " + " | ".join(cells) + " |")
    print(f"\n{workers} processes, {turns} turns each (add_items of four items)\n")
    print("| backend | own sessions: turns/s | failed | lost | shared session: turns/s "
          "| failed | lost | first error |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for name, runs in procs.items():
        own, shared = runs["own"], runs["shared"]
        error = own["error"] or shared["error"]
        print(f"| {name} | {own['turns/s']:,.0f} | {own['failed']} | {own['lost items']} "
              f"| {shared['turns/s']:,.0f} | {shared['failed']} | {shared['lost items']} "
              f"| {error} |")  # fmt: skip
    print("\nWhat no backend goes below, in this run (median microseconds)\n")
    print("| floor | us |")
    print("|---|---|")
    for name, value in floor.items():
        print(f"| {name} | {value:,.1f} |")


if __name__ == "__main__":
    main()
