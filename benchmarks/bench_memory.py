"""Memory and opening time: private memory stays small, a big store opens at once.

Two checks, run as a script (``--quick`` uses a tenth of the size)::

    python benchmarks/bench_memory.py [--events 1000000] [--quick]

1. A process appends N events (default 1,000,000, about 1 KB each) to an LMDB
   store with deferred durability, and its private memory (``Private_Clean +
   Private_Dirty`` of every mapping in ``/proc/self/smaps`` but the store's
   file, whose touched pages are page cache the kernel writes back and drops)
   must stay under 200 MB. The mapped store is reported beside it.
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
    """Return this process's memory figures from /proc/self/smaps, in MB (Linux).

    ``private`` is Private_Clean + Private_Dirty of every mapping but the
    store's own file (``data.mdb``): what the process itself holds. The pages
    of the store's map it has touched count as private too while no other
    process maps them, yet they are page cache of the file, written back and
    dropped by the kernel at will: ``mapped`` reports them apart. ``anonymous``
    is the heap alone, ``rss`` everything resident.
    """
    private = mapped = anonymous = rss = 0.0
    in_store = False
    with open("/proc/self/smaps", encoding="utf-8", errors="replace") as file:
        for line in file:
            head, _, rest = line.partition(":")
            if not rest.strip().endswith("kB"):
                # A mapping's header line: address range, perms, ..., path.
                in_store = line.rstrip().endswith("/data.mdb")
                continue
            size = int(rest.split()[0]) / 1024
            if head in ("Private_Clean", "Private_Dirty"):
                if in_store:
                    mapped += size
                else:
                    private += size
            elif head == "Anonymous":
                anonymous += size
            elif head == "Rss":
                rss += size
    return {"private": private, "mapped": mapped, "anonymous": anonymous, "rss": rss}


def private_mb() -> float:
    """Return this process's private memory in MB, the store's map left out."""
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
                        f"anonymous {now['anonymous']:6.1f} MB, "
                        f"store pages mapped {now['mapped']:6.1f} MB, {rate:,.0f} events/s"
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
