"""User-space instructions and system calls per operation, ours beside the peers', on the mix.

Wall time on a shared machine moves by tens of percent from run to run;
the instructions an operation executes barely move. For each operation
this script runs a child Python twice under ``valgrind --tool=callgrind``
(no root needed): once doing the setup and ``--ops`` operations, once
doing the same setup and none, and divides the difference by ``--ops``.
The same pair of runs under ``strace -f -c`` gives the system calls per
operation. Every child builds the same workload: sessions of ``--length``
events (40 unless told) of the agent mix (``sessionscope.bench.mix``),
appended in the mix's order, the second writer's appends through
``append_event_locked`` where the service has it.

The counted appends are spread evenly over the whole workload, so that
they fall at every point of a session's life whatever its length: the run
with none still makes the other appends, in the same order (with
``--ops`` a multiple of ``--length``, from two sessions up, the workload is
the counted appends and the run with none makes no append). A bulk
operation (``append_many``, a replay in batches) is counted per event.
``replay-batch`` is what ``sessionscope replay --batch 1000`` does with the
workload's trace on an LMDB deferred store: both runs turn the whole trace
into events first (as a replay does before its clock starts), then replay
it, with or without the counted appends; with fewer than 1,000 appends
one batch holds them all.

The Redis rows run on a redis-server this script starts on loopback, on a
free port, without persistence, and stops by its pid at the end (or on
``--url``'s server, each child under its own key prefix, removed after
it). Callgrind and strace follow the client only: the server's
instructions and system calls are not in the counts.

As a script (some minutes: a child under callgrind runs about 50 times
slower, and importing google-adk alone takes half a minute there)::

    python benchmarks/instructions.py [--ops 200] [--length 40] [--only NAME ...]
        [--json out.json] [--url redis://host:port/0] [--timeout 1800]
        [--jobs 2] [--cache-sim]

``--cache-sim`` adds callgrind's simulated cache misses per operation:
first-level instruction misses, first-level data misses (reads and
writes) and last-level misses, with the caches of the machine it runs on.

Needs valgrind and strace on the PATH (and redis-server, or ``--url``, for
the Redis rows); a tool that is missing leaves its column empty. Every
child is stopped after ``--timeout`` seconds (its column left empty).
pytest collects this file when the folder is run and finds no tests in it.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, suppress
from pathlib import Path
from typing import Any, TypeVar

from _redis_server import redis_server

# Each operation: (name, group shown with it, what it is).
OPERATIONS = (
    ("native-async-append", "append, deferred", "SessionService.append_event, lmdb deferred"),
    ("native-sync-append", "append, deferred", "SyncSessionService.append_event, lmdb deferred"),
    ("adapter-append", "append, deferred", "ADK adapter LmdbSessionService, deferred"),
    ("adk-memory-append", "append, deferred", "ADK InMemorySessionService.append_event"),
    ("raw-txn-append", "append, deferred", "raw py-lmdb txn of the same shape, no fsync"),
    ("append-many", "append, deferred", "SyncSessionService.append_many, per event"),
    ("replay-batch", "append, deferred", "sessionscope replay --batch 1000, per event"),
    ("native-durable-append", "append, durable", "SyncSessionService.append_event, lmdb durable"),
    ("native-async-durable", "append, durable", "SessionService.append_event, lmdb durable"),
    ("raw-txn-durable", "append, durable", "raw py-lmdb txn of the same shape, fsync"),
    ("adk-sqlite-append", "append, durable", "ADK SqliteSessionService.append_event"),
    ("adk-database-append", "append, durable", "ADK DatabaseSessionService, sqlite+aiosqlite"),
    ("native-get-recent", "get_session, last 10", "SessionService.get_session, last 10"),
    ("adk-memory-get-recent", "get_session, last 10", "ADK InMemory get_session, last 10"),
    ("native-get-whole", "get_session, whole", "SessionService.get_session, {length} events"),
    ("adk-memory-get-whole", "get_session, whole", "ADK InMemory get_session, {length} events"),
    ("redis-async-append", "redis, client only", "SessionService.append_event, redis://"),
    ("redis-fcall", "redis, client only", "bare FCALL round trip, async client"),
    ("encrypted-async-append", "encryption", "native-async-append on an encrypted store"),
    ("encrypted-append-many", "encryption", "append-many on an encrypted store, per event"),
    ("encrypted-get-recent", "encryption", "native-get-recent on an encrypted store"),
)
# The operations on a Redis server (the parent starts one for them).
REDIS = frozenset({"redis-async-append", "redis-fcall"})
# The encrypted store's key-encryption key: the counts are measured, not the secrecy.
KEK = bytes(range(32))
LENGTH = 40
# The batch of ``sessionscope replay --batch`` whose per-event count replay-batch gives.
REPLAY_BATCH = 1000
T = TypeVar("T")


# -- the child: one operation, ``count`` times, after the same setup ---------------------


def _workload(total: int, length: int) -> Any:
    from sessionscope.bench.speed import Workload, mix_spec

    return Workload.of(mix_spec(_sessions(total, length), seed=0, length=length))


def _sessions(total: int, length: int) -> int:
    """Return how many sessions of ``length`` events hold ``total`` appends (two at least)."""
    return max(2, -(-total // length))


def _counted(appends: int, total: int) -> set[int]:
    """Return the places of the ``total`` counted appends among ``appends``, spread evenly."""
    return {n * appends // total for n in range(min(total, appends))}


def _performed(items: list[T], total: int, count: int) -> list[T]:
    """Return the appends a run makes: all of them, or (``count`` 0) all but the counted ones."""
    if count:
        return items
    counted = _counted(len(items), total)
    return [item for n, item in enumerate(items) if n not in counted]


def _loop(count: int, step: Callable[[int], Any]) -> None:
    gc.collect()
    gc.disable()
    try:
        for n in range(count):
            step(n)
    finally:
        gc.enable()


def _native_sync(store: Any, total: int, count: int, length: int, bulk: bool = False) -> None:
    """Append on a sync service over ``store`` (a URI or a store)."""
    from sessionscope import SyncSessionService
    from sessionscope.bench.speed import live_appends

    work = _workload(total, length)
    with SyncSessionService(store) as service:
        events = _performed(live_appends(service, work), total, count)
        if bulk:
            _loop(1 if events else 0, lambda _: service.append_many([e[:2] for e in events]))
            return

        def step(n: int) -> None:
            session, event, second = events[n]
            if second:
                service.append_event_locked(session, event)
            else:
                service.append_event(session, event)

        _loop(len(events), step)


def _async(make_service: Callable[[], Any], native: bool, total: int, count: int, length: int,
           read: int | None = None) -> None:  # fmt: skip
    """Append (or, with ``read``, fill then read) on an async service: native or ADK's."""
    from sessionscope.bench.replay import native_event
    from sessionscope.bench.speed import live_appends_async

    work = _workload(total, length)
    if native:
        from sessionscope import GetSessionConfig

        make_event: Callable[[dict[str, Any]], Any] = native_event
        config_class: Any = GetSessionConfig
    else:
        from google.adk.events import Event as AdkEvent
        from google.adk.sessions.base_session_service import GetSessionConfig as AdkConfig

        make_event, config_class = AdkEvent.model_validate, AdkConfig

    async def main() -> None:
        service = make_service()
        events = await live_appends_async(service, work, make_event)
        if read is None:
            events = _performed(events, total, count)
        else:
            for session, event, _ in events:
                await service.append_event(session, event)
            events = []
        keys = [key for key, _ in work.creates]
        config = config_class(num_recent_events=read) if read else None
        gc.collect()
        gc.disable()
        for n in range(count if read is not None else len(events)):
            if read is not None:
                app, user, sid = keys[n % len(keys)]
                await service.get_session(app_name=app, user_id=user, session_id=sid,
                                          config=config)  # fmt: skip
                continue
            session, event, second = events[n]
            if second and native:
                await service.append_event_locked(session, event)
            else:
                await service.append_event(session, event)
        gc.enable()
        close = getattr(service, "close", None)
        if close is not None:
            await close()

    asyncio.run(main())


def _raw(path: Path, durable: bool, total: int, count: int, length: int) -> None:
    from sessionscope import SyncSessionService
    from sessionscope.bench.speed import raw_txn

    work = _workload(total, length)
    # raw_txn creates every session of the workload, then appends what it is given.
    work.appends = _performed(work.appends, total, count)
    writemap = False
    if not durable:
        # Opened as the deferred store it is compared with opens its environment.
        probe = f"lmdb://{path.parent / 'probe'}?durability=deferred"
        with SyncSessionService(probe) as service:
            writemap = bool(getattr(service.store, "writemap", False))
    raw_txn(work, path, durable, writemap)


def _replay_batch(path: Path, total: int, count: int, length: int) -> None:
    """Replay the workload's trace in batches, as ``sessionscope replay --batch 1000`` does.

    The calls are prepared from the whole trace in both runs (the events
    made before a replay's clock starts); the run with none replays them
    without the counted appends. Only the loop a replay times is left to
    differ, as ``append-many`` leaves only its call.
    """
    from sessionscope.bench import replay as bench_replay
    from sessionscope.bench.mix import generate
    from sessionscope.bench.speed import mix_spec

    # The stored appends of the workload (a streamed chunk is never stored,
    # and Workload leaves it out too), with the creates they go to.
    records = [
        r
        for r in generate(mix_spec(_sessions(total, length), seed=0, length=length))
        if r["op"] == "create" or (r["op"] == "append" and not r["event"].get("partial"))
    ]
    target = bench_replay.open_target(f"lmdb://{path}?durability=deferred&read_ahead=no")
    try:
        calls = bench_replay._prepare(target, records)
        appends = [n for n, call in enumerate(calls) if call[0] == "append"]
        left_out = set() if count else {appends[n] for n in _counted(len(appends), total)}
        kept = [n for n in range(len(calls)) if n not in left_out]
        with bench_replay.collector_paused():
            bench_replay._replay(target, [records[n] for n in kept], [calls[n] for n in kept],
                                 REPLAY_BATCH, False, False, None, None, None)  # fmt: skip
    finally:
        target.close()


def _fcall(url: str, count: int) -> None:
    """Make ``count`` bare FCALL round trips (a function that does nothing) on the async client."""
    from sessionscope import SessionService

    async def main() -> None:
        async with SessionService(url) as service:
            noop = service.store.aio.noop
            # The connection made and the functions loaded, in both runs.
            await noop()
            gc.collect()
            gc.disable()
            for _ in range(count):
                await noop()
            gc.enable()

    asyncio.run(main())


def child(name: str, total: int, count: int, scratch: Path, length: int = LENGTH,
          url: str | None = None) -> None:  # fmt: skip
    """Run one operation ``count`` times after the setup every run of it shares.

    ``url`` is the Redis store (with its key prefix) of the Redis operations.
    """
    # Without the thread that reads a growing store's next pages ahead: under
    # callgrind an operation runs about 50 times slower, so that thread's
    # looks (every 5 ms while the store grows) would count about 50 times
    # what they cost an operation in real time. Its work is the kernel's
    # page faults it spares, which callgrind does not count either.
    deferred = f"lmdb://{scratch / 'store'}?durability=deferred&read_ahead=no"

    def native_service() -> Any:
        from sessionscope import SessionService

        return SessionService(deferred)

    def encrypted_store() -> Any:
        from sessionscope.crypto import Encryption
        from sessionscope.stores import open_store

        keys = f"lmdb://{scratch / 'encrypted-keys'}"
        return open_store(
            f"lmdb://{scratch / 'encrypted'}?durability=deferred&read_ahead=no",
            encryption=Encryption(keys=keys, key=KEK),
        )

    def encrypted_service() -> Any:
        from sessionscope import SessionService

        return SessionService(encrypted_store())

    def adk_memory() -> Any:
        from google.adk.sessions import InMemorySessionService

        return InMemorySessionService()

    def adapter() -> Any:
        from sessionscope.adk import LmdbSessionService

        return LmdbSessionService(str(scratch / "adapter"), durability="deferred", read_ahead=False)

    def adk_sqlite() -> Any:
        from google.adk.sessions.sqlite_session_service import SqliteSessionService

        return SqliteSessionService(str(scratch / "adk.db"))

    def adk_database() -> Any:
        from google.adk.sessions import DatabaseSessionService

        return DatabaseSessionService(f"sqlite+aiosqlite:///{scratch / 'adk-database.db'}")

    def durable_service() -> Any:
        from sessionscope import SessionService

        return SessionService(f"lmdb://{scratch / 'd'}")

    def redis_service() -> Any:
        from sessionscope import SessionService

        assert url is not None, "a Redis operation needs the server's URL"
        return SessionService(url)

    n, c, size = total, count, length
    runs: dict[str, Callable[[], None]] = {
        "native-async-append": lambda: _async(native_service, True, n, c, size),
        "native-sync-append": lambda: _native_sync(deferred, n, c, size),
        "adapter-append": lambda: _async(adapter, False, n, c, size),
        "adk-memory-append": lambda: _async(adk_memory, False, n, c, size),
        "raw-txn-append": lambda: _raw(scratch / "raw", False, n, c, size),
        "append-many": lambda: _native_sync(deferred, n, c, size, bulk=True),
        "replay-batch": lambda: _replay_batch(scratch / "replay", n, c, size),
        "native-durable-append": lambda: _native_sync(f"lmdb://{scratch / 'd'}", n, c, size),
        "native-async-durable": lambda: _async(durable_service, True, n, c, size),
        "raw-txn-durable": lambda: _raw(scratch / "raw", True, n, c, size),
        "adk-sqlite-append": lambda: _async(adk_sqlite, False, n, c, size),
        "adk-database-append": lambda: _async(adk_database, False, n, c, size),
        "native-get-recent": lambda: _async(native_service, True, n, c, size, read=10),
        "adk-memory-get-recent": lambda: _async(adk_memory, False, n, c, size, read=10),
        "native-get-whole": lambda: _async(native_service, True, n, c, size, read=0),
        "adk-memory-get-whole": lambda: _async(adk_memory, False, n, c, size, read=0),
        "redis-async-append": lambda: _async(redis_service, True, n, c, size),
        "redis-fcall": lambda: _fcall(url or "", c),
        "encrypted-async-append": lambda: _async(encrypted_service, True, n, c, size),
        "encrypted-append-many": lambda: _native_sync(encrypted_store(), n, c, size, bulk=True),
        "encrypted-get-recent": lambda: _async(encrypted_service, True, n, c, size, read=10),
    }
    runs[name]()


# -- the parent: pairs of runs under each tool -------------------------------------------


# The process groups of the children running, and whether the run is being stopped.
_RUNNING: set[int] = set()
_STOPPING = threading.Event()


def _stop_group(pid: int) -> None:
    with suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def _run(command: list[str], timeout: float) -> subprocess.CompletedProcess[str] | None:
    """Run a child in its own process group; stop the group after ``timeout`` seconds.

    The group, because killing strace alone would leave the Python it traces running.
    """
    if _STOPPING.is_set():
        return None
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)  # fmt: skip
    _RUNNING.add(proc.pid)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _stop_group(proc.pid)
        proc.communicate()
        print(f"stopped after {timeout:g} s: {' '.join(command)}", file=sys.stderr)
        return None
    finally:
        _RUNNING.discard(proc.pid)
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


# What ``--cache-sim`` adds beside the instructions: callgrind's simulated
# first-level misses (instruction fetches; data reads and writes) and
# last-level misses, each summed from the events of its profile.
CACHE_COUNTS = {
    "i1-misses": ("I1mr",),
    "d1-misses": ("D1mr", "D1mw"),
    "ll-misses": ("ILmr", "DLmr", "DLmw"),
}


def _callgrind(
    command: list[str], scratch: Path, timeout: float, cache_sim: bool = False
) -> dict[str, int] | None:
    """Return the child's instructions (and with ``cache_sim`` its simulated cache misses)."""
    # The profile (tens of megabytes) is read only for its cache totals.
    profile = scratch / "callgrind.out" if cache_sim else Path(os.devnull)
    tool = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={profile}"]
    if cache_sim:
        tool.append("--cache-sim=yes")
    done = _run([*tool, *command], timeout)
    if done is None:
        return None
    found = re.search(r"Collected\s*:\s*(\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        print(done.stderr[-2000:], file=sys.stderr)
        return None
    counts = {"callgrind": int(found.group(1))}
    if cache_sim:
        events: list[str] = []
        totals: list[int] = []
        with open(profile) as lines:
            for line in lines:
                if line.startswith("events:"):
                    events = line.split()[1:]
                elif line.startswith(("summary:", "totals:")):
                    totals = [int(n) for n in line.split()[1:]]
        by_event = dict(zip(events, totals, strict=False))
        for name, parts in CACHE_COUNTS.items():
            counts[name] = sum(by_event.get(part, 0) for part in parts)
    return counts


def _strace(command: list[str], scratch: Path, timeout: float) -> int | None:
    out = scratch / "strace.txt"
    done = _run(["strace", "-f", "-c", "-o", str(out), *command], timeout)
    if done is None:
        return None
    if done.returncode != 0 or not out.exists():
        print(done.stderr[-2000:], file=sys.stderr)
        return None
    for line in out.read_text().splitlines():
        fields = line.split()
        if fields and fields[-1] == "total":
            return int(fields[3])
    return None


def _store_url(url: str, prefix: str) -> str:
    """Return the Redis URL of one child: its own key prefix, a long network wait."""
    # The client runs about 50 times slower under callgrind; the server does not.
    return f"{url}{'&' if '?' in url else '?'}prefix={prefix}&timeout=120"


def measure(name: str, ops: int, tools: tuple[str, ...], length: int = LENGTH,
            url: str | None = None, timeout: float = 1800,
            cache_sim: bool = False) -> dict[str, float | None]:  # fmt: skip
    """Return instructions and system calls (and cache misses) per operation of one operation."""
    # The bulk path takes all its events in one call: per event is per op.
    per = ops
    results: dict[str, float | None] = {}
    for tool in tools:
        counts: list[dict[str, int] | None] = []
        for count in (ops, 0):
            with tempfile.TemporaryDirectory(prefix="sessionscope-instr-") as tmp:
                scratch = Path(tmp)
                prefix = f"instr{uuid.uuid4().hex[:12]}"
                store = "-" if url is None else _store_url(url, prefix)
                command = [sys.executable, __file__, "--child", name, str(ops), str(count), tmp,
                           str(length), store]  # fmt: skip
                try:
                    if tool == "callgrind":
                        counts.append(_callgrind(command, scratch, timeout, cache_sim))
                    else:
                        calls = _strace(command, scratch, timeout)
                        counts.append(None if calls is None else {tool: calls})
                finally:
                    if url is not None:
                        from sessionscope.stores.redis import RedisStore

                        RedisStore(url, prefix=prefix).destroy()
        high, low = counts
        if high is None or low is None:
            results[tool] = None
            continue
        for counted, value in high.items():
            results[counted] = (value - low[counted]) / per
    return results


def _count(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def main(argv: list[str] | None = None) -> int:
    """Measure every operation (or those named) and print one table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--ops", type=int, default=200, help="operations per counted run")
    parser.add_argument("--length", type=int, default=LENGTH, metavar="N",
                        help="events per session of the workload")  # fmt: skip
    parser.add_argument("--only", nargs="+", metavar="NAME", help="these operations only")
    parser.add_argument("--jobs", type=int, default=2, help="children run at once")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--url", help="a running Redis server for the Redis rows "
                        "(default: start a redis-server on loopback)")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=1800,
                        help="seconds a child may run before it is stopped")  # fmt: skip
    parser.add_argument("--cache-sim", action="store_true",
                        help="also count simulated cache misses per operation (callgrind's "
                        "--cache-sim: about twice as slow)")  # fmt: skip
    parser.add_argument("--child", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        name, total, count, scratch, length, url = args.child
        child(name, int(total), int(count), Path(scratch), int(length),
              None if url == "-" else url)  # fmt: skip
        return 0
    if args.ops < 1 or args.length < 1:
        parser.error("--ops and --length take a positive number")
    known = {name for name, _, _ in OPERATIONS}
    names = args.only or [name for name, _, _ in OPERATIONS]
    unknown = sorted(set(names) - known)
    if unknown:
        parser.error(f"unknown operation {unknown[0]}; known: {', '.join(sorted(known))}")
    tools = tuple(t for t, exe in (("callgrind", "valgrind"), ("strace", "strace"))
                  if shutil.which(exe))  # fmt: skip
    # The same hash seed in every child, so that the counted runs differ only by the ops.
    os.environ["PYTHONHASHSEED"] = "0"
    with ExitStack() as stack:
        url = args.url
        if url is None and REDIS.intersection(names):
            if shutil.which("redis-server") is None:
                print("redis-server is not installed (or give --url): the Redis rows are left "
                      "empty", file=sys.stderr)  # fmt: skip
            else:
                where = stack.enter_context(tempfile.TemporaryDirectory(prefix="sessionscope-"))
                url = stack.enter_context(redis_server(Path(where)))
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            futures = {
                name: pool.submit(measure, name, args.ops,
                                  tools if url or name not in REDIS else (), args.length,
                                  url if name in REDIS else None, args.timeout,
                                  args.cache_sim)
                for name in names
            }  # fmt: skip
            try:
                results = {name: future.result() for name, future in futures.items()}
            except BaseException:
                # Interrupted: the children, in groups of their own, do not see it.
                _STOPPING.set()
                for pid in list(_RUNNING):
                    _stop_group(pid)
                raise
    length = args.length
    print(f"per operation, {args.ops} operations on {length}-event sessions of the agent mix")
    misses = tuple(CACHE_COUNTS) if args.cache_sim else ()
    print(f"{'operation':24s} {'group':22s} {'instructions':>14s} {'syscalls':>9s}"
          + "".join(f" {name:>10s}" for name in misses) + "  what")  # fmt: skip
    for name, group, what in OPERATIONS:
        if name not in results:
            continue
        found = results[name]
        instructions = found.get("callgrind")
        calls = found.get("strace")
        ins = _count(instructions)
        sys_calls = "-" if calls is None else f"{calls:.1f}"
        cache = "".join(f" {_count(found.get(m)):>10s}" for m in misses)
        what = what.format(length=length)
        print(f"{name:24s} {group:22s} {ins:>14s} {sys_calls:>9s}{cache}  {what}")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
