"""Every speed target, each figure beside its peer measured in the same run.

As a script (about three minutes; ``--quick`` about one)::

    python benchmarks/bench_speed.py [--rounds 7] [--quick] [--json out.json]

The figures are medians over rounds of each round's median; each round
times every system on the same sessions of the agent mix
(``sessionscope.bench.mix``) and on mix sessions of 10, 40, 200 and 1,000
events. What is compared with what (``sessionscope/bench/speed.py``):

- the native async deferred append against ADK ``InMemorySessionService``,
  over the mix and at 40-event sessions; the ADK adapter against the native
  async append;
- the native sync deferred append against a raw py-lmdb transaction of the
  same shape (the event and its state items packed with msgpack, one
  transaction, no sessionscope code);
- durable appends through the sync and async services against that raw
  transaction with fsync, and against ADK's Sqlite and Database services;
- ``get_session`` whole and of the last 10 events against ADK InMemory;
- ``append_many`` in batches of 1,000 and ``replay --batch 1000`` of the mix,
  deferred, in events/s;
- group-commit lift from 1 to 64 writers (asyncio tasks, threads), durable;
- a ``list_sessions`` page of 100 at 100,000 sessions against the same page
  at 1,000, and the whole listing of 10,000 sessions (ADK InMemory beside it);
- get of the last 10 events and append at 100,000 events against at 10.

pytest collects this file when the folder is run and finds no tests in it:
the comparisons are ratios of one run, printed, not asserted.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from sessionscope.bench.job import (
    adk_available,
    length_sweep,
    tasks_throughput,
    threads_throughput,
)
from sessionscope.bench.replay import open_target
from sessionscope.bench.speed import SpeedConfig, measure, rows
from sessionscope.cli.console import Column, render_table


def main(argv: list[str] | None = None) -> int:
    """Measure every target and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=None, help="rounds per comparison")
    parser.add_argument("--quick", action="store_true", help="fewer rounds, smaller stores")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    config = SpeedConfig.quick() if args.quick else SpeedConfig()
    if args.rounds:
        config.rounds = args.rounds
    lengths = (10, 100, 1000, 10_000) if args.quick else (10, 1000, 100_000)
    writers, seconds = (1, 64), (0.5 if args.quick else 1.5)

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="sessionscope-speed-") as tmp:
        root = Path(tmp)
        say("measuring latency against session length")
        target = open_target(f"lmdb://{root / 'sweep'}?durability=deferred")
        try:
            sweep = length_sweep(target, lengths, budget_s=20.0)
        finally:
            target.close()
        say("measuring durable writers")
        concurrency = {
            "tasks": {n: tasks_throughput(f"lmdb://{root / f'tasks-{n}'}", n, seconds)
                      for n in writers},
            "threads": {n: threads_throughput(f"lmdb://{root / f'threads-{n}'}", n, seconds)
                        for n in writers},
        }  # fmt: skip
        work = root / "speed"
        work.mkdir()
        measured = measure(
            config,
            work,
            adk=adk_available() is None,
            lengths=sweep,
            concurrency=concurrency,
            log=say,
        )
    columns = ["target", Column("ours", True), Column("peer, same run", True)]
    columns += [Column("ratio", True), "limit", "verdict"]
    title = f"medians of {config.rounds} rounds"
    print(render_table(columns, list(rows(measured.figures)), title=title))
    if args.json is not None:
        args.json.write_text(json.dumps(measured.to_dict(), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
