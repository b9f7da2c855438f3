"""Memory and opening time: private memory stays small, a big store opens at once.

Two checks, run as a script (``--quick`` uses a tenth of the size)::

    python benchmarks/bench_memory.py [--events 1000000] [--quick]

1. A process appends N events (default 1,000,000, about 1 KB each) to an LMDB
   store with deferred durability, and its private memory (``Private_Clean +
   Private_Dirty`` of ``/proc/self/smaps_rollup``: RSS less the pages shared
   with the page cache, i.e. the mapped store) must stay under 200 MB.
2. Opening that store again (over a GB at the default size) and reading one
   session must take milliseconds: LMDB maps the file, it reads nothing up front.

Under pytest-benchmark, the opening time of a smaller store::

    pytest benchmarks/bench_memory.py --benchmark-only
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from sessionscope import Event, EventActions, GetSessionConfig, SyncSessionService

LIMIT_MB = 200
SESSIONS = 1000
TEXT = "The assistant looked up the order, checked the invoice and wrote back. " * 14


def memory_mb() -> dict[str, float]:
    """Return this process's memory figures from /proc/self/smaps_rollup, in MB (Linux).

    ``private`` is Private_Clean + Private_Dirty (RSS less shared pages). It
    counts the pages of the store's map this process has touched as long as no
    other process maps them (clean page cache the kernel can drop at will);
    ``anonymous`` is the heap alone.
    """
    fields: dict[str, float] = {}
    with open("/proc/self/smaps_rollup", encoding="ascii") as file:
        for line in file:
            name, _, rest = line.partition(":")
            if rest.strip().endswith("kB"):
                fields[name] = int(rest.split()[0]) / 1024
    return {
        "private": fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0),
        "anonymous": fields.get("Anonymous", 0),
        "rss": fields.get("Rss", 0),
    }


def private_mb() -> float:
    """Return this process's private memory in MB (Private_* of smaps_rollup)."""
    return memory_mb()["private"]


def fill(path: Path, events: int, report: bool = True) -> tuple[float, float, float]:
    """Append ``events`` events over SESSIONS sessions.

    Return the peak private and anonymous memory in MB, and the seconds taken.
    """
    uri = f"lmdb://{path}?durability=deferred"
    peak = heap = 0.0
    started = time.perf_counter()
    with SyncSessionService(uri) as service:
        sessions = [
            service.create_session(app_name="bench", user_id=f"u{n % 50}", session_id=f"s{n}")
            for n in range(SESSIONS)
        ]
        for number in range(events):
            index = number % SESSIONS
            session = sessions[index]
            service.append_event(
                session,
                Event(
                    author="model" if number % 2 else "user",
                    content={"role": "model", "parts": [{"text": TEXT}]},
                    actions=EventActions(state_delta={"turn": number, "user:seen": number}),
                ),
            )
            if len(session.events) >= 64:
                # A runner holds one live session per conversation, not every event
                # ever appended: re-read it without events, as a runner would.
                fresh = service.get_session(
                    app_name="bench",
                    user_id=session.user_id,
                    session_id=session.id,
                    config=GetSessionConfig(num_recent_events=0),
                )
                assert fresh is not None
                sessions[index] = fresh
            if not number % 50_000:
                now = memory_mb()
                peak, heap = max(peak, now["private"]), max(heap, now["anonymous"])
                if report and number:
                    rate = number / (time.perf_counter() - started)
                    print(
                        f"  {number:>9,} events: private {now['private']:6.1f} MB, "
                        f"anonymous {now['anonymous']:6.1f} MB, {rate:,.0f} events/s"
                    )
        service.flush()
        now = memory_mb()
        peak, heap = max(peak, now["private"]), max(heap, now["anonymous"])
    return peak, heap, time.perf_counter() - started


def open_and_read(path: Path) -> float:
    """Return the seconds it takes to open a store and read one session's last events."""
    started = time.perf_counter()
    with SyncSessionService(f"lmdb://{path}?durability=deferred") as service:
        session = service.get_session(
            app_name="bench",
            user_id="u7",
            session_id="s7",
            config=GetSessionConfig(num_recent_events=10),
        )
        assert session is not None and len(session.events) == 10
        return time.perf_counter() - started


def _size_gb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.iterdir()) / 1e9


def test_open_store(benchmark: Any, tmp_path: Path) -> None:
    """Time opening a store of 20,000 events and reading one session."""
    fill(tmp_path / "store", 20_000, report=False)
    benchmark.group = "open store"
    benchmark.name = "open_store_20000_events"
    benchmark.pedantic(open_and_read, args=(tmp_path / "store",), rounds=10)


def main(argv: list[str] | None = None) -> int:
    """Run both checks; return 1 when the memory limit is exceeded."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--quick", action="store_true", help="100,000 events")
    parser.add_argument("--dir", type=Path, help="where to build the store (a temp dir)")
    args = parser.parse_args(argv)
    events = 100_000 if args.quick else args.events
    directory = Path(tempfile.mkdtemp(prefix="sessionscope-memory-", dir=args.dir))
    try:
        path = directory / "store"
        print(f"appending {events:,} events to {SESSIONS:,} sessions (deferred durability)")
        peak, heap, seconds = fill(path, events)
        verdict = "ok" if peak < LIMIT_MB else f"OVER the {LIMIT_MB} MB limit"
        print(f"peak private memory {peak:.1f} MB ({verdict}), of which heap {heap:.1f} MB")
        print(f"{events / seconds:,.0f} events/s")
        print(f"store size {_size_gb(path):.2f} GB")
        # Drop the file from the page cache where we may, so the open is a cold one.
        try:
            for name in ("data.mdb", "lock.mdb"):
                fd = os.open(path / name, os.O_RDONLY)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                os.close(fd)
        except (OSError, AttributeError):
            pass
        opened = open_and_read(path)
        print(f"open + read last 10 events: {opened * 1e3:.1f} ms")
        return 0 if peak < LIMIT_MB else 1
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
