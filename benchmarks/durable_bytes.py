"""Bytes written per durable append, counted at the system call (Linux, needs strace).

    python benchmarks/durable_bytes.py [--appends 300]

Runs a child that makes ``--appends`` durable appends (user, model and tool
events with deltas on every scope, spread over 20 sessions, after 50 appends
of warm-up) under ``strace -f -e trace=pwrite64,pwritev,fdatasync,fsync``,
then the same child without the measured appends, and prints the difference
per append: bytes and write calls that reached the kernel, and syncs.
``/proc/self/io`` over-counts on some kernels; the system calls do not.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

_CHILD = """
import sys
from sessionscope import SyncSessionService
from sessionscope.bench.speed import turn_records
from sessionscope.service import event_from_record

count, warm = int(sys.argv[2]), 50
with SyncSessionService(f"lmdb://{sys.argv[1]}") as service:
    sessions = [
        service.create_session(app_name="speed", user_id=f"u{i}", session_id=f"s{i}")
        for i in range(20)
    ]
    for n, record in enumerate(turn_records(warm + count)):
        service.append_event(sessions[n % 20], event_from_record(record))
"""
_WRITE = re.compile(r"\b(pwrite64|pwritev)\(.*\)\s+=\s+(\d+)")
_SYNC = re.compile(r"\b(fdatasync|fsync)\(")


def _traced(count: int, directory: Path) -> tuple[int, int, int]:
    """Return (bytes written, write calls, syncs) of a child making ``count`` measured appends."""
    log = directory / f"trace-{count}.txt"
    store = directory / f"store-{count}"
    subprocess.run(
        ["strace", "-f", "-qq", "-e", "trace=pwrite64,pwritev,fdatasync,fsync", "-o", str(log),
         sys.executable, "-c", _CHILD, str(store), str(count)],
        check=True,
    )  # fmt: skip
    written = calls = syncs = 0
    for line in log.read_text().splitlines():
        match = _WRITE.search(line)
        if match:
            written += int(match.group(2))
            calls += 1
        elif _SYNC.search(line):
            syncs += 1
    return written, calls, syncs


def main() -> int:
    """Measure and print bytes per durable append."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--appends", type=int, default=300)
    args = parser.parse_args()
    if shutil.which("strace") is None:
        print("strace is not installed (apt-get install strace)", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="sessionscope-bytes-") as tmp:
        measured = _traced(args.appends, Path(tmp))
        baseline = _traced(0, Path(tmp))
    written, calls, syncs = (a - b for a, b in zip(measured, baseline, strict=True))
    n = args.appends
    print(
        f"{written / n:,.0f} bytes per durable append in {calls / n:.1f} writes "
        f"and {syncs / n:.2f} syncs ({n} appends)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
