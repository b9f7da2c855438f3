"""User-space instructions and system calls per operation, ours beside the peers', on the mix.

Wall time on a shared machine moves by tens of percent from run to run;
the instructions an operation executes barely move. For each operation
this script runs a child Python twice under ``valgrind --tool=callgrind``
(no root needed): once doing the setup and ``--ops`` operations, once
doing the same setup and none, and divides the difference by ``--ops``.
The same pair of runs under ``strace -f -c`` gives the system calls per
operation. Every child builds the same workload: sessions of 40 events of
the agent mix (``sessionscope.bench.mix``), appended in the mix's order,
the second writer's appends through ``append_event_locked`` where the
service has it.

As a script (some minutes: a child under callgrind runs about 50 times
slower, and importing google-adk alone takes half a minute there)::

    python benchmarks/instructions.py [--ops 200] [--only NAME ...] [--json out.json]

Needs valgrind and strace on the PATH; a tool that is missing leaves its
column empty. pytest collects this file when the folder is run and finds no
tests in it.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

# Each operation: (name, group shown with it, what it is).
OPERATIONS = (
    ("native-async-append", "append, deferred", "SessionService.append_event, lmdb deferred"),
    ("native-sync-append", "append, deferred", "SyncSessionService.append_event, lmdb deferred"),
    ("adapter-append", "append, deferred", "ADK adapter LmdbSessionService, deferred"),
    ("adk-memory-append", "append, deferred", "ADK InMemorySessionService.append_event"),
    ("raw-txn-append", "append, deferred", "raw py-lmdb txn of the same shape, no fsync"),
    ("append-many", "append, deferred", "SyncSessionService.append_many, per event"),
    ("native-durable-append", "append, durable", "SyncSessionService.append_event, lmdb durable"),
    ("raw-txn-durable", "append, durable", "raw py-lmdb txn of the same shape, fsync"),
    ("adk-sqlite-append", "append, durable", "ADK SqliteSessionService.append_event"),
    ("native-get-recent", "get_session, last 10", "SessionService.get_session, last 10"),
    ("adk-memory-get-recent", "get_session, last 10", "ADK InMemory get_session, last 10"),
    ("native-get-whole", "get_session, whole", "SessionService.get_session, 40 events"),
    ("adk-memory-get-whole", "get_session, whole", "ADK InMemory get_session, 40 events"),
    ("encrypted-async-append", "encryption", "native-async-append on an encrypted store"),
    ("encrypted-append-many", "encryption", "append-many on an encrypted store, per event"),
    ("encrypted-get-recent", "encryption", "native-get-recent on an encrypted store"),
)
# The encrypted store's key-encryption key: the counts are measured, not the secrecy.
KEK = bytes(range(32))
LENGTH = 40


# -- the child: one operation, ``count`` times, after the same setup ---------------------


def _workload(total: int) -> Any:
    from sessionscope.bench.speed import Workload, mix_spec

    sessions = max(2, -(-total // LENGTH))
    return Workload.of(mix_spec(sessions, seed=0, length=LENGTH))


def _loop(count: int, step: Callable[[int], Any]) -> None:
    gc.collect()
    gc.disable()
    try:
        for n in range(count):
            step(n)
    finally:
        gc.enable()


def _native_sync(store: Any, total: int, count: int, bulk: bool = False) -> None:
    """Append on a sync service over ``store`` (a URI or a store)."""
    from sessionscope import SyncSessionService
    from sessionscope.bench.speed import live_appends

    work = _workload(total)
    with SyncSessionService(store) as service:
        events = live_appends(service, work)[:total]
        if bulk:
            _loop(1 if count else 0, lambda _: service.append_many([e[:2] for e in events]))
            return

        def step(n: int) -> None:
            session, event, second = events[n]
            if second:
                service.append_event_locked(session, event)
            else:
                service.append_event(session, event)

        _loop(count, step)


def _async(make_service: Callable[[], Any], native: bool, total: int, count: int,
           read: int | None = None) -> None:  # fmt: skip
    """Append (or, with ``read``, fill then read) on an async service: native or ADK's."""
    from sessionscope.bench.replay import native_event
    from sessionscope.bench.speed import live_appends_async

    work = _workload(total)
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
            events = events[:total]
        else:
            for session, event, _ in events:
                await service.append_event(session, event)
            events = []
        keys = [key for key, _ in work.creates]
        config = config_class(num_recent_events=read) if read else None
        gc.collect()
        gc.disable()
        for n in range(count):
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


def _raw(path: Path, durable: bool, total: int, count: int) -> None:
    from sessionscope import SyncSessionService
    from sessionscope.bench.speed import raw_txn

    work = _workload(total)
    # raw_txn creates every session of the workload, then appends what it is given.
    work.appends = work.appends[:count]
    writemap = False
    if not durable:
        # Opened as the deferred store it is compared with opens its environment.
        probe = f"lmdb://{path.parent / 'probe'}?durability=deferred"
        with SyncSessionService(probe) as service:
            writemap = bool(getattr(service.store, "writemap", False))
    raw_txn(work, path, durable, writemap)


def child(name: str, total: int, count: int, scratch: Path) -> None:
    """Run one operation ``count`` times after the setup every run of it shares."""
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

    runs: dict[str, Callable[[], None]] = {
        "native-async-append": lambda: _async(native_service, True, total, count),
        "native-sync-append": lambda: _native_sync(deferred, total, count),
        "adapter-append": lambda: _async(adapter, False, total, count),
        "adk-memory-append": lambda: _async(adk_memory, False, total, count),
        "raw-txn-append": lambda: _raw(scratch / "raw", False, total, count),
        "append-many": lambda: _native_sync(deferred, total, count, bulk=True),
        "native-durable-append": lambda: _native_sync(f"lmdb://{scratch / 'd'}", total, count),
        "raw-txn-durable": lambda: _raw(scratch / "raw", True, total, count),
        "adk-sqlite-append": lambda: _async(adk_sqlite, False, total, count),
        "native-get-recent": lambda: _async(native_service, True, total, count, read=10),
        "adk-memory-get-recent": lambda: _async(adk_memory, False, total, count, read=10),
        "native-get-whole": lambda: _async(native_service, True, total, count, read=0),
        "adk-memory-get-whole": lambda: _async(adk_memory, False, total, count, read=0),
        "encrypted-async-append": lambda: _async(encrypted_service, True, total, count),
        "encrypted-append-many": lambda: _native_sync(encrypted_store(), total, count, bulk=True),
        "encrypted-get-recent": lambda: _async(encrypted_service, True, total, count, read=10),
    }
    runs[name]()


# -- the parent: pairs of runs under each tool -------------------------------------------


def _callgrind(command: list[str]) -> int | None:
    done = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *command],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    found = re.search(r"Collected\s*:\s*(\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        print(done.stderr[-2000:], file=sys.stderr)
        return None
    return int(found.group(1))


def _strace(command: list[str], scratch: Path) -> int | None:
    out = scratch / "strace.txt"
    done = subprocess.run(
        ["strace", "-f", "-c", "-o", str(out), *command], capture_output=True, text=True,
        check=False,
    )  # fmt: skip
    if done.returncode != 0 or not out.exists():
        print(done.stderr[-2000:], file=sys.stderr)
        return None
    for line in out.read_text().splitlines():
        fields = line.split()
        if fields and fields[-1] == "total":
            return int(fields[3])
    return None


def measure(name: str, ops: int, tools: tuple[str, ...]) -> dict[str, float | None]:
    """Return instructions and system calls per operation of one operation."""
    # The bulk path takes all its events in one call: per event is per op.
    per = ops
    results: dict[str, float | None] = {}
    for tool in tools:
        counts = []
        for count in (ops, 0):
            with tempfile.TemporaryDirectory(prefix="sessionscope-instr-") as tmp:
                scratch = Path(tmp)
                command = [sys.executable, __file__, "--child", name, str(ops), str(count), tmp]
                if tool == "callgrind":
                    counts.append(_callgrind(command))
                else:
                    counts.append(_strace(command, scratch))
        high, low = counts
        results[tool] = None if high is None or low is None else (high - low) / per
    return results


def main(argv: list[str] | None = None) -> int:
    """Measure every operation (or those named) and print one table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--ops", type=int, default=200, help="operations per counted run")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="these operations only")
    parser.add_argument("--jobs", type=int, default=2, help="children run at once")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        name, total, count, scratch = args.child
        child(name, int(total), int(count), Path(scratch))
        return 0
    known = {name for name, _, _ in OPERATIONS}
    names = args.only or [name for name, _, _ in OPERATIONS]
    unknown = sorted(set(names) - known)
    if unknown:
        parser.error(f"unknown operation {unknown[0]}; known: {', '.join(sorted(known))}")
    tools = tuple(t for t, exe in (("callgrind", "valgrind"), ("strace", "strace"))
                  if shutil.which(exe))  # fmt: skip
    # The same hash seed in every child, so that the counted runs differ only by the ops.
    os.environ["PYTHONHASHSEED"] = "0"
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {name: pool.submit(measure, name, args.ops, tools) for name in names}
        results = {name: future.result() for name, future in futures.items()}
    print(f"per operation, {args.ops} operations on {LENGTH}-event sessions of the agent mix")
    print(f"{'operation':24s} {'group':22s} {'instructions':>14s} {'syscalls':>9s}  what")
    for name, group, what in OPERATIONS:
        if name not in results:
            continue
        found = results[name]
        instructions = found.get("callgrind")
        calls = found.get("strace")
        ins = "-" if instructions is None else f"{instructions:,.0f}"
        sys_calls = "-" if calls is None else f"{calls:.1f}"
        print(f"{name:24s} {group:22s} {ins:>14s} {sys_calls:>9s}  {what}")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
