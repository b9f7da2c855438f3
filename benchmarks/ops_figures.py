"""Figures of the operations commands: a backup under load and a compaction.

    python benchmarks/ops_figures.py [--sessions 2000] [--events 20] [--dir DIR]

Builds an LMDB store, takes ``sessionscope backup`` while four processes
append to it, then deletes nine sessions in ten and runs ``sessionscope
compact``; prints time and sizes before and after of both. Each run takes
well under a minute with the defaults.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sessionscope import Event, EventActions, LmdbStore, SyncSessionService

WRITERS = 4


def build(path: Path, sessions: int, events: int) -> None:
    """Write ``sessions`` sessions of ``events`` events (about 500 bytes each)."""
    with SyncSessionService(LmdbStore(path, durability="deferred")) as svc:
        appends = []
        for n in range(sessions):
            session = svc.create_session(app_name="app", user_id=f"u{n % 50}", session_id=f"s{n}")
            for i in range(events):
                text = f"turn {i} of session {n} " + "lorem ipsum " * 40
                event = Event(author="agent", content={"parts": [{"text": text}]})
                event.actions = EventActions(state_delta={"turn": i})
                appends.append((session, event))
            if len(appends) >= 2000:
                svc.append_many(appends)
                appends = []
        svc.append_many(appends)


def writer(path: str, name: str, stop: str) -> None:
    """Append durably to sessions of its own until ``stop`` exists (at most a minute)."""
    deadline = time.monotonic() + 60
    count = 0
    with SyncSessionService(LmdbStore(path)) as svc:
        session = svc.create_session(app_name="load", user_id=name)
        print("ready", flush=True)
        while not Path(stop).exists() and time.monotonic() < deadline:
            svc.append_event(session, Event(author=name, content={"text": "x" * 300}))
            count += 1
    print(count, flush=True)


def sessionscope(*args: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-m", "sessionscope", *args, "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, object] = json.loads(done.stdout)
    return result


def main() -> None:
    """Measure and print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=2000)
    parser.add_argument("--events", type=int, default=20)
    parser.add_argument("--dir", type=Path, help="work here (default: a temporary directory)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as temp:
        root = args.dir or Path(temp)
        store = root / "store"
        started = time.perf_counter()
        build(store, args.sessions, args.events)
        print(f"built {args.sessions} sessions x {args.events} events "
              f"in {time.perf_counter() - started:.1f} s")  # fmt: skip

        stop = root / "stop"
        writers = [
            subprocess.Popen(
                [sys.executable, __file__, "writer", str(store), f"w{n}", str(stop)],
                stdout=subprocess.PIPE,
                text=True,
            )
            for n in range(WRITERS)
        ]
        for process in writers:
            assert process.stdout is not None and process.stdout.readline().strip() == "ready"
        time.sleep(0.5)
        started = time.perf_counter()
        backup = sessionscope("backup", f"lmdb://{store}", str(root / "backup"))
        wall = time.perf_counter() - started
        stop.touch()
        appended = sum(int(p.communicate(timeout=60)[0].split()[-1]) for p in writers)
        print(
            f"backup under load ({WRITERS} writers, {appended} durable appends while they ran): "
            f"store {backup['source_bytes']:,} B -> backup {backup['backup_bytes']:,} B, "
            f"{backup['sessions']} sessions, {backup['events']} events; copy "
            f"{backup['copy_s']:.3f} s, copy + verify {backup['total_s']:.3f} s, "
            f"command {wall:.3f} s"
        )

        with SyncSessionService(LmdbStore(store, durability="deferred")) as svc:
            for n in range(args.sessions):
                if n % 10:
                    svc.delete_session(app_name="app", user_id=f"u{n % 50}", session_id=f"s{n}")
        stats = sessionscope("stats", f"lmdb://{store}")
        free = stats["file"]["free_pages"]  # type: ignore[index]
        started = time.perf_counter()
        compact = sessionscope("compact", f"lmdb://{store}")
        wall = time.perf_counter() - started
        print(
            f"compaction after deleting 9 sessions in 10 ({free:,} free pages): "
            f"{compact['bytes_before']:,} B -> {compact['bytes_after']:,} B, "
            f"{compact['sessions']} sessions, {compact['events']} events kept; "
            f"copy + verify + swap {compact['total_s']:.3f} s, command {wall:.3f} s"
        )


if __name__ == "__main__":
    if sys.argv[1:2] == ["writer"]:
        writer(*sys.argv[2:])
    else:
        main()
