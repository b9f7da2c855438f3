"""Durable appends from 1, 8 and 64 writers: group commit's lift, in one run.

Writers are asyncio tasks on one ``SessionService``, threads on one
``SyncSessionService``, or 4 processes each opening the same store path; each
writer appends to its own session with the default (fsync) durability. The
target: 64 writers reach at least 8x the throughput of one.

As a script (prints appends/s per writer count and the 1 -> 64 lift)::

    python benchmarks/bench_concurrency.py [--seconds 2]

Under pytest-benchmark (512 appends per round, spread over the writers; 4
processes of 128 each)::

    pytest benchmarks/bench_concurrency.py --benchmark-only
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from sessionscope import Event, EventActions, SessionService, SyncSessionService
from sessionscope.bench.job import lift, tasks_throughput, threads_throughput

WRITERS = (1, 8, 64)
PROCESSES = 4
# Appends per pytest-benchmark round: enough that 64 writers each do several.
APPENDS = 512


def _process_writer(path: str, index: int, count: int, start: Any) -> None:
    with SyncSessionService(f"lmdb://{path}") as service:
        session = service.create_session(app_name="bench", user_id=f"p{index}")
        start.wait()
        for number in range(count):
            service.append_event(
                session,
                Event(
                    author="model",
                    content={"role": "model", "parts": [{"text": "ok " * 300}]},
                    actions=EventActions(state_delta={"turn": number}),
                ),
            )


def processes_throughput(path: Path, processes: int, per_process: int) -> float:
    """Return durable appends/s of ``processes`` processes sharing one store path."""
    context = multiprocessing.get_context("spawn")
    start = context.Event()
    workers = [
        context.Process(target=_process_writer, args=(str(path), i, per_process, start))
        for i in range(processes)
    ]
    for worker in workers:
        worker.start()
    time.sleep(1.0)  # let every process open the store before the clock starts
    began = time.perf_counter()
    start.set()
    for worker in workers:
        worker.join()
        if worker.exitcode != 0:
            raise RuntimeError(f"a writer process failed with exit code {worker.exitcode}")
    return processes * per_process / (time.perf_counter() - began)


def _event(number: int) -> Event:
    return Event(
        author="model",
        content={"role": "model", "parts": [{"text": "ok " * 300}]},
        actions=EventActions(state_delta={"turn": number}),
    )


def _tasks_fixed(service: SessionService, sessions: list[Any], total: int) -> None:
    per_writer = total // len(sessions)

    async def writer(session: Any) -> None:
        for number in range(per_writer):
            await service.append_event(session, _event(number))

    async def main() -> None:
        await asyncio.gather(*(writer(s) for s in sessions))

    asyncio.run(main())


def _threads_fixed(service: SyncSessionService, sessions: list[Any], total: int) -> None:
    per_writer = total // len(sessions)

    def writer(session: Any) -> None:
        for number in range(per_writer):
            service.append_event(session, _event(number))

    threads = [threading.Thread(target=writer, args=(s,)) for s in sessions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


@pytest.mark.parametrize("writers", WRITERS)
@pytest.mark.parametrize("kind", ["tasks", "threads"])
def test_durable_writers(benchmark: Any, tmp_path: Path, kind: str, writers: int) -> None:
    """Time APPENDS durable appends spread evenly over ``writers`` writers."""
    uri = f"lmdb://{tmp_path / 'store'}"
    service: Any = SessionService(uri) if kind == "tasks" else SyncSessionService(uri)
    # Sessions are made by a sync twin on the same store: creating them is not timed.
    maker = SyncSessionService(service.store)
    rounds = iter(range(1_000_000))

    def setup() -> tuple[tuple[Any, ...], dict[str, Any]]:
        batch = next(rounds)
        sessions = [
            maker.create_session(app_name="bench", user_id=f"u{i}", session_id=f"{batch}-{i}")
            for i in range(writers)
        ]
        return (service, sessions, APPENDS), {}

    benchmark.group = f"durable writers ({kind})"
    benchmark.name = f"durable_{kind}_{writers}"
    benchmark.extra_info["appends_per_round"] = APPENDS
    try:
        benchmark.pedantic(
            _tasks_fixed if kind == "tasks" else _threads_fixed, setup=setup, rounds=3
        )
    finally:
        maker.close()


def test_durable_processes(benchmark: Any, tmp_path: Path) -> None:
    """Time 4 processes appending durably to one store path."""
    rates: list[float] = []
    rounds = iter(range(1_000_000))

    def run() -> None:
        path = tmp_path / f"processes-{next(rounds)}"
        rates.append(processes_throughput(path, PROCESSES, APPENDS // PROCESSES))

    benchmark.group = "durable writers (processes)"
    benchmark.name = f"durable_processes_{PROCESSES}"
    benchmark.pedantic(run, rounds=2)
    benchmark.extra_info["appends_per_s"] = sorted(rates)[len(rates) // 2]


def main(argv: list[str] | None = None) -> None:
    """Print appends/s against writers for tasks, threads and processes, and the lift."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="per measurement")
    parser.add_argument("--quick", action="store_true", help="0.5 s per measurement")
    args = parser.parse_args(argv)
    seconds = 0.5 if args.quick else args.seconds
    with tempfile.TemporaryDirectory(prefix="sessionscope-bench-") as tmp:
        directory = Path(tmp)
        print(f"{'writers':<10}" + "".join(f"{n:>10}" for n in WRITERS) + "      lift")
        for kind, measure in (("tasks", tasks_throughput), ("threads", threads_throughput)):
            rates = {n: measure(f"lmdb://{directory / f'{kind}-{n}'}", n, seconds) for n in WRITERS}
            cells = "".join(f"{rates[n]:>10,.0f}" for n in WRITERS)
            verdict = "ok" if lift(rates) >= 8 else "below the 8x target"
            print(f"{kind:<10}{cells}{lift(rates):>9.1f}x  {verdict}")
        single = processes_throughput(directory / "p1", 1, 200)
        many = processes_throughput(directory / "p4", PROCESSES, 400)
        print(
            f"processes: 1 -> {single:,.0f}/s, {PROCESSES} -> {many:,.0f}/s ({many / single:.1f}x)"
        )


if __name__ == "__main__":
    main()
