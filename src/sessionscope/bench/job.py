"""The ``sessionscope bench`` job: the agent mix, every store, one table.

It generates the agent mix (``mix``), replays it on sessionscope's embedded LMDB store
(durable, deferred, and deferred through the bulk path) and on every peer
importable in this process (google-adk's in-memory, SQLite and Database
services, and sessionscope's ADK adapter), measures raw LMDB put/commit with
and without fsync as the floor, then sweeps latency against session length
(one session filled to 100,000 events of the mix) and throughput against the
number of concurrent writers (each appending events of the mix). Slow peers
replay the trace only as far as a time budget allows; their state is
verified for the part they replayed. The speed targets (``speed``) end the
run: each on the mix beside its peer, and on mix sessions of 10 to 1,000
events.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import math
import os
import platform
import shutil
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import lmdb

from .. import codec
from ..admin.outfile import create_exclusive, make_directory
from ..core import IMPLEMENTATION
from ..service.facade import SessionService, SyncSessionService
from ..stores import open_store
from ..stores.uri import REDIS_SCHEMES, scheme_of
from . import speed
from .mix import MixSpec, generate
from .replay import (
    ADK_SCHEMES,
    LatencyStats,
    ReplayResult,
    Target,
    TargetError,
    native_event,
    open_target,
    replay,
)

__all__ = ["BenchConfig", "BenchReport", "concurrency_sweep", "length_sweep", "raw_lmdb", "run"]


@dataclass(slots=True)
class BenchConfig:
    """How big and how long a bench run is."""

    sessions: int = 400
    seed: int = 0
    budget_s: float = 10.0
    lengths: tuple[int, ...] = (10, 100, 1000, 10_000, 100_000)
    sweep_budget_s: float = 8.0
    writers: tuple[int, ...] = (1, 8, 64)
    writer_seconds: float = 1.5
    batch: int = 256
    peers: bool = True
    charts: bool = True
    # The speed targets, each against its peer (bench/speed.py); None skips them.
    targets: speed.SpeedConfig | None = field(default_factory=speed.SpeedConfig)
    # More stores to replay on (e.g. redis://host:port/0), each under a fresh prefix.
    stores: tuple[str, ...] = ()

    @classmethod
    def quick(cls, sessions: int | None = None) -> BenchConfig:
        """Return the settings of ``--quick``: the same steps, a tenth of the time."""
        return cls(
            sessions=sessions or 60,
            budget_s=1.2,
            lengths=(10, 100, 1000),
            sweep_budget_s=0.6,
            writer_seconds=0.4,
            batch=256,
            targets=speed.SpeedConfig.quick(),
        )


@dataclass
class BenchReport:
    """Everything a bench run measured."""

    machine: dict[str, Any]
    config: dict[str, Any]
    results: list[ReplayResult] = field(default_factory=list)
    floors: list[ReplayResult] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    lengths: dict[str, dict[str, dict[int, float]]] = field(default_factory=dict)
    concurrency: dict[str, dict[int, float]] = field(default_factory=dict)
    targets: list[speed.Figure] = field(default_factory=list)
    # Medians (us) over the mix, and per session length, of every system the targets compare.
    mix: dict[str, float] = field(default_factory=dict)
    mix_sweep: dict[str, dict[int, float]] = field(default_factory=dict)
    elapsed_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """Return the report as a JSON-ready map."""
        return {
            "machine": self.machine,
            "config": self.config,
            "results": [r.to_dict() for r in self.results],
            "floors": [r.to_dict() for r in self.floors],
            "skipped": self.skipped,
            "latency_vs_length_us": self.lengths,
            "throughput_vs_writers": self.concurrency,
            "concurrency_lift": {name: lift(v) for name, v in self.concurrency.items()},
            "targets": [figure.to_dict() for figure in self.targets],
            "mix_us": self.mix,
            "mix_sweep_us": self.mix_sweep,
            "elapsed_s": self.elapsed_s,
        }

    def format(self) -> str:
        """Return the tables: medians per target and ratios to the durable default."""
        from ..cli.console import Column, render_table

        base = self.results[0] if self.results else None

        def median(result: ReplayResult, op: str) -> float:
            stats = result.latency.get(op)
            return stats.p50 if stats is not None else math.nan

        def ratio(result: ReplayResult, op: str) -> str:
            if base is None:
                return ""
            mine, theirs = median(result, op), median(base, op)
            if math.isnan(mine) or math.isnan(theirs) or not theirs:
                return "-"
            return f"{mine / theirs:.2f}x"

        rows: list[list[str]] = []
        for result in [*self.results, *self.floors]:
            check = "-" if not result.verified else ("ok" if not result.problems else "FAILED")
            rows.append(
                [
                    _label(result.target, result.batch),
                    f"{result.ops:,}",
                    _num(median(result, "append")),
                    ratio(result, "append"),
                    _num(median(result, "get_recent")),
                    ratio(result, "get_recent"),
                    _num(median(result, "get")),
                    _num(median(result, "list")),
                    _num(result.events_per_s, 0),
                    check,
                ]
            )
        for name, reason in self.skipped.items():
            rows.append([name, "", "", "", "", "", "", "", "", f"skipped: {reason}"])
        numeric = ("calls", "append", "ratio", "get10", "ratio ", "get", "list", "events/s")
        out = [
            f"sessionscope bench on {self.machine['cpu']} ({self.machine['cores']} cores), "
            f"Python {self.machine['python']}, core={self.machine['core']}",
            f"the agent mix: {self.config['sessions']} sessions, seed {self.config['seed']}; "
            "medians in microseconds; ratio = median / sessionscope durable",
            "",
            render_table(["target", *(Column(n, True) for n in numeric), "verify"], rows),
        ]
        if self.lengths:
            lengths = sorted({n for ops in self.lengths.values() for v in ops.values() for n in v})
            cells = [
                [f"{name} {op}", *(_num(values.get(n, math.nan)) for n in lengths)]
                for name, ops in self.lengths.items()
                for op, values in ops.items()
            ]
            columns: list[Column | str] = [
                "target / operation",
                *(Column(f"{n:,}", True) for n in lengths),
            ]
            title = "median latency (us) against session length (events in the session)"
            out += ["", render_table(columns, cells, title=title)]
        if self.concurrency:
            writers = sorted({n for v in self.concurrency.values() for n in v})
            cells = [
                [
                    name,
                    *(_num(values.get(n, math.nan), 0) for n in writers),
                    f"{lift(values):.1f}x",
                ]
                for name, values in self.concurrency.items()
            ]
            columns = ["target", *(Column(str(n), True) for n in writers)]
            columns.append(Column("lift", True))
            title = "durable appends per second against concurrent writers"
            out += ["", render_table(columns, cells, title=title)]
        if self.mix:
            cells = [[name, _num(value)] for name, value in self.mix.items()]
            title = "medians over the mix (us), every system on the same sessions"
            out += ["", render_table(["system / operation", Column("us", True)], cells,
                                     title=title)]  # fmt: skip
        if self.mix_sweep:
            lengths = sorted({n for values in self.mix_sweep.values() for n in values})
            cells = [
                [name, *(_num(values.get(n, math.nan)) for n in lengths)]
                for name, values in self.mix_sweep.items()
            ]
            columns = ["system / operation", *(Column(f"{n:,}", True) for n in lengths)]
            title = "medians (us) on mix sessions of each length (events per session)"
            out += ["", render_table(columns, cells, title=title)]
        if self.targets:
            columns = ["target", Column("ours", True), Column("peer, same run", True)]
            columns += [Column("ratio", True), "limit", "verdict"]
            title = "speed targets: medians over rounds, each beside its peer from this run"
            out += ["", render_table(columns, list(speed.rows(self.targets)), title=title)]
        out += ["", f"total {self.elapsed_s:.1f} s"]
        return "\n".join(out)


def _num(value: float, digits: int = 1) -> str:
    return "-" if math.isnan(value) else f"{value:,.{digits}f}"


_WRITES = ("create", "append", "delete")


def _label(uri: str, batch: int) -> str:
    scheme = scheme_of(uri)
    names = {
        "memory": "sessionscope memory",
        "adk-memory": "adk InMemorySessionService",
        "adk-sqlite": "adk SqliteSessionService",
        "adk-database": "adk DatabaseSessionService",
        "raw-lmdb-sync": "raw lmdb put+commit, fsync",
        "raw-lmdb-nosync": "raw lmdb put+commit, no fsync",
    }
    if scheme in REDIS_SCHEMES:
        kind = "redis cluster" if scheme == "redis+cluster" else "redis"
        return f"sessionscope {kind} bulk {batch} (writes)" if batch else f"sessionscope {kind}"
    if batch:
        return f"sessionscope lmdb bulk {batch} (writes)"
    if scheme in ("lmdb", "adk-lmdb"):
        durability = "deferred" if "durability=deferred" in uri else "durable"
        return f"sessionscope {'adk ' if scheme == 'adk-lmdb' else ''}lmdb {durability}"
    return names.get(scheme, uri)


def lift(values: dict[int, float]) -> float:
    """Return the throughput at the most writers over that at the fewest."""
    if len(values) < 2:
        return math.nan
    low, high = min(values), max(values)
    return values[high] / values[low] if values[low] else math.nan


def machine() -> dict[str, Any]:
    """Return what the figures ran on."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as file:
            for line in file:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    versions = {"lmdb": getattr(lmdb, "__version__", "?")}
    try:
        from importlib.metadata import version

        versions["google-adk"] = version("google-adk")
    except Exception:  # not installed: fine
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "core": IMPLEMENTATION,
        "versions": versions,
    }


def adk_available() -> str | None:
    """Return why the ADK peers cannot run, or None when they can."""
    try:
        import google.adk  # noqa: F401
    except ImportError:
        return "google-adk is not installed (pip install 'sessionscope[adk]')"
    return None


def _database_available() -> str | None:
    for name in ("sqlalchemy", "greenlet", "aiosqlite"):
        if importlib.util.find_spec(name) is None:
            return f"{name} is not installed (pip install 'sessionscope[adk]')"
    return None


def _adapter_available() -> str | None:
    try:
        adk = importlib.import_module("sessionscope.adk")
        adk.LmdbSessionService  # noqa: B018
    except (ImportError, AttributeError) as error:
        return f"the adapter sessionscope.adk is not importable ({error})"
    return None


# -- the floor: raw LMDB ---------------------------------------------------------


def raw_lmdb(
    records: list[dict[str, Any]], directory: Path, sync: bool, budget_s: float
) -> ReplayResult:
    """Time one put+commit per event of the trace: what any LMDB store pays at least."""
    path = directory / ("raw-sync" if sync else "raw-nosync")
    env = lmdb.open(str(path), map_size=1 << 30, sync=sync, metasync=sync)
    samples: list[int] = []
    events = [
        codec.pack(r["event"])
        for r in records
        if r["op"] == "append" and not r["event"].get("partial")
    ]
    clock = time.perf_counter_ns
    started = time.perf_counter()
    deadline = started + budget_s
    try:
        for seq, data in enumerate(events):
            begin = clock()
            with env.begin(write=True) as txn:
                txn.put(seq.to_bytes(8, "big"), data)
            samples.append(clock() - begin)
            if not seq & 63 and time.perf_counter() > deadline:
                break
    finally:
        env.close()
    elapsed = time.perf_counter() - started
    name = "raw-lmdb-sync://" if sync else "raw-lmdb-nosync://"
    stats = {"append": LatencyStats.of(samples)}
    result = ReplayResult(name, len(samples), len(samples), elapsed, stats)
    result.append_s = sum(samples) / 1e9
    return result


# -- sweeps ------------------------------------------------------------------------


def length_sweep(
    target: Target,
    lengths: tuple[int, ...],
    budget_s: float,
    samples: int = 20,
    events: speed.MixEvents | None = None,
) -> dict[str, dict[int, float]]:
    """Return median append and get(num_recent_events=10) latency at each session length.

    The session is filled to each length (through the bulk path where the
    target has one), then ``samples`` appends and reads are timed there. A
    slow target stops at the first length the budget does not reach. The
    events are the agent mix's (``events``, by default the stored events of
    40 generated sessions), cycled with fresh ids to reach each length; the
    cycle restarts where each length's timed appends start, so that at every
    length the same events are appended and read (its last 10 before them).
    """
    events = events or speed.MixEvents()
    target.create("sweep", "user", "long", {})
    key = ("sweep", "user", "long")
    count = 0
    append: dict[int, float] = {}
    recent: dict[int, float] = {}
    deadline = time.perf_counter() + budget_s
    clock = time.perf_counter_ns
    for length in sorted(lengths):
        for start in range(count, length, 512):
            numbers = range(start, min(start + 512, length))
            target.append_many(
                [(key, target.make_event(events.record(n, length))) for n in numbers]
            )
            if time.perf_counter() > deadline:
                return {"append": append, "get_recent": recent}
        count = length
        times_append: list[int] = []
        times_get: list[int] = []
        for _ in range(samples):
            event = target.make_event(events.record(count, length))
            begin = clock()
            target.append(key, event)
            times_append.append(clock() - begin)
            count += 1
            begin = clock()
            target.get("sweep", "user", "long", {"num_recent_events": 10})
            times_get.append(clock() - begin)
        append[length] = statistics.median(times_append) / 1e3
        recent[length] = statistics.median(times_get) / 1e3
        if time.perf_counter() > deadline:
            break
    return {"append": append, "get_recent": recent}


def _mix_events(events: speed.MixEvents | None) -> speed.MixEvents:
    return events if events is not None else speed.MixEvents()


async def _tasks_throughput(
    service: Any,
    writers: int,
    seconds: float,
    make_event: Callable[[dict[str, Any]], Any] = native_event,
    events: speed.MixEvents | None = None,
) -> float:
    """Return appends/s of ``writers`` tasks on ``service``, native or ADK's (``make_event``).

    Each writer appends the agent mix's events (``events``), each with a fresh id.
    """
    mix = _mix_events(events)
    sessions = [
        await service.create_session(
            app_name="bench", user_id=f"u{i}", session_id=f"t{writers}-{i}"
        )
        for i in range(writers)
    ]
    done = [0] * writers
    deadline = time.perf_counter() + seconds

    async def writer(index: int) -> None:
        session = sessions[index]
        while time.perf_counter() < deadline:
            await service.append_event(session, make_event(mix.next_record()))
            done[index] += 1

    started = time.perf_counter()
    await asyncio.gather(*(writer(i) for i in range(writers)))
    return sum(done) / (time.perf_counter() - started)


def tasks_throughput(
    uri: str, writers: int, seconds: float, events: speed.MixEvents | None = None
) -> float:
    """Return durable appends/s of ``writers`` asyncio tasks, each on its own session.

    The events are the agent mix's (``events``), each with a fresh id.
    """

    async def main() -> float:
        async with SessionService(uri) as service:
            return await _tasks_throughput(service, writers, seconds, events=events)

    return asyncio.run(main())


def threads_throughput(
    uri: str, writers: int, seconds: float, events: speed.MixEvents | None = None
) -> float:
    """Return durable appends/s of ``writers`` threads, each on its own session.

    The events are the agent mix's (``events``), each with a fresh id.
    """
    mix = _mix_events(events)
    with SyncSessionService(uri) as service:
        sessions = [
            service.create_session(app_name="bench", user_id=f"u{i}", session_id=f"th{writers}-{i}")
            for i in range(writers)
        ]
        done = [0] * writers
        start_gate = threading.Barrier(writers + 1)
        deadline = 0.0

        def writer(index: int) -> None:
            start_gate.wait()
            while time.perf_counter() < deadline:
                service.append_event(sessions[index], native_event(mix.next_record()))
                done[index] += 1

        threads = [threading.Thread(target=writer, args=(i,)) for i in range(writers)]
        for thread in threads:
            thread.start()
        deadline = time.perf_counter() + seconds
        started = time.perf_counter()
        start_gate.wait()
        for thread in threads:
            thread.join()
        return sum(done) / (time.perf_counter() - started)


def _adk_tasks_throughput(
    service: Any, writers: int, seconds: float, events: speed.MixEvents | None = None
) -> float:
    from google.adk.events import Event as AdkEvent

    async def main() -> float:
        rate = await _tasks_throughput(service, writers, seconds, AdkEvent.model_validate, events)
        close = getattr(service, "close", None)
        if close is not None:
            await close()
        return rate

    return asyncio.run(main())


def concurrency_sweep(
    directory: Path, writers: tuple[int, ...], seconds: float, peers: bool
) -> dict[str, dict[int, float]]:
    """Return durable appends/s against the number of writers, per target and kind.

    Every writer appends the agent mix's events (``speed.MixEvents``).
    """
    events = speed.MixEvents()
    results: dict[str, dict[int, float]] = {}
    tasks: dict[int, float] = {}
    threads: dict[int, float] = {}
    for n in writers:
        tasks[n] = tasks_throughput(f"lmdb://{directory / f'tasks-{n}'}", n, seconds, events)
        threads[n] = threads_throughput(f"lmdb://{directory / f'threads-{n}'}", n, seconds, events)
    results["sessionscope lmdb durable, asyncio tasks"] = tasks
    results["sessionscope lmdb durable, threads"] = threads
    if peers and adk_available() is None:
        from google.adk.sessions.sqlite_session_service import SqliteSessionService

        sqlite: dict[int, float] = {}
        for n in writers:
            try:
                sqlite[n] = _adk_tasks_throughput(
                    SqliteSessionService(str(directory / f"adk-{n}.db")), n, seconds, events
                )
            except sqlite3.OperationalError:
                # Its writers time out on SQLite's lock ("database is locked")
                # when commits are slow: the peer has no figure at this count.
                break
        results["adk SqliteSessionService, asyncio tasks"] = sqlite
    return results


# -- the job ---------------------------------------------------------------------


def _scoped(uri: str, name: str) -> str:
    """Return a store URI under a prefix of this run's own, so runs never meet."""
    return f"{uri}{'&' if '?' in uri else '?'}prefix=sessionscope-bench-{name}"


def _targets(
    directory: Path, peers: bool, skipped: dict[str, str], stores: tuple[str, ...] = ()
) -> list[tuple[str, int]]:
    lmdb_dir = directory / "lmdb"
    targets = [
        (f"lmdb://{lmdb_dir}-durable?durability=sync", 0),
        (f"lmdb://{lmdb_dir}-deferred?durability=deferred", 0),
        (f"lmdb://{lmdb_dir}-bulk?durability=deferred", -1),
        ("memory://", 0),
    ]
    run_id = os.urandom(4).hex()
    for uri in stores:
        targets.append((_scoped(uri, run_id), 0))
        targets.append((_scoped(uri, f"{run_id}-bulk"), -1))
    if not peers:
        return targets
    reason = adk_available()
    if reason is not None:
        for scheme in ADK_SCHEMES:
            skipped[scheme] = reason
        return targets
    adapter = _adapter_available()
    if adapter is None:
        targets.append((f"adk-lmdb://{directory / 'adk-lmdb'}?durability=sync", 0))
    else:
        skipped["sessionscope adk lmdb"] = adapter
    targets.append(("adk-memory://", 0))
    targets.append((f"adk-sqlite://{directory / 'adk-sqlite.db'}", 0))
    database = _database_available()
    if database is None:
        targets.append((f"adk-database://sqlite+aiosqlite:///{directory / 'adk-database.db'}", 0))
    else:
        skipped["adk DatabaseSessionService"] = database
    return targets


def run(
    config: BenchConfig,
    out: Path | None = None,
    log: IO[str] | None = None,
    progress: bool = True,
) -> BenchReport:
    """Run the whole job; write JSON and charts to ``out`` when given.

    ``out`` is made, or must be an empty directory: it is checked before the
    run, so a run is not spent to find nothing may be written, and nothing
    in it is overwritten (OutputPathError).
    """
    log = log if log is not None else sys.stderr
    made = make_directory(out) if out is not None else False
    started = time.perf_counter()
    report = BenchReport(machine(), _config_dict(config))
    spec = MixSpec(sessions=config.sessions, seed=config.seed)
    records = list(generate(spec))
    directory = Path(tempfile.mkdtemp(prefix="sessionscope-bench-"))
    targets: list[tuple[str, int]] = []
    try:
        targets = _targets(directory, config.peers, report.skipped, config.stores)
        for uri, batch in targets:
            size = config.batch if batch < 0 else batch
            log.write(f"replaying on {_label(uri, size)}\n")
            log.flush()
            try:
                target = open_target(uri)
            except (TargetError, ImportError) as error:
                report.skipped[_label(uri, size)] = str(error)
                continue
            # The bulk path is the import path: the trace's writes, no reads between.
            calls = [r for r in records if r["op"] in _WRITES] if size else records
            try:
                result = replay(
                    target,
                    calls,
                    batch=size,
                    progress=progress,
                    budget_s=config.budget_s,
                )
            finally:
                target.close()
            report.results.append(result)
        for sync in (True, False):
            report.floors.append(raw_lmdb(records, directory, sync, config.budget_s / 2))
        report.lengths = _length_sweeps(config, directory, log)
        log.write("measuring concurrent writers\n")
        report.concurrency = concurrency_sweep(
            directory, config.writers, config.writer_seconds, config.peers
        )
        if config.targets is not None:
            measured = _speed_targets(config.targets, config.peers, report, directory, log)
            report.targets = measured.figures
            report.mix = measured.mix
            report.mix_sweep = measured.sweep
    except BaseException:
        if made and out is not None and not any(out.iterdir()):
            out.rmdir()  # a run that failed leaves no directory it made
        raise
    finally:
        shutil.rmtree(directory, ignore_errors=True)
        _drop_scoped_stores(targets)
    report.elapsed_s = time.perf_counter() - started
    if out is not None:
        write_outputs(report, out, config.charts)
    return report


def _speed_targets(
    config: speed.SpeedConfig, peers: bool, report: BenchReport, directory: Path, log: IO[str]
) -> speed.SpeedReport:
    def say(line: str) -> None:
        log.write(line + "\n")
        log.flush()

    workspace = directory / "speed"
    workspace.mkdir()
    return speed.measure(
        config,
        workspace,
        adk=peers and adk_available() is None,
        lengths=report.lengths.get("sessionscope lmdb deferred"),
        concurrency={
            "tasks": report.concurrency.get("sessionscope lmdb durable, asyncio tasks", {}),
            "threads": report.concurrency.get("sessionscope lmdb durable, threads", {}),
        },
        log=say,
    )


def _drop_scoped_stores(targets: list[tuple[str, int]]) -> None:
    """Remove what the run wrote to shared servers (its own prefixes only)."""
    for uri, _ in targets:
        if scheme_of(uri) in REDIS_SCHEMES:
            with contextlib.suppress(Exception):  # the run's figures matter more
                open_store(uri).destroy()  # type: ignore[attr-defined]


def _length_sweeps(
    config: BenchConfig, directory: Path, log: IO[str]
) -> dict[str, dict[str, dict[int, float]]]:
    log.write("measuring latency against session length\n")
    uris = [("sessionscope lmdb deferred", f"lmdb://{directory / 'sweep'}?durability=deferred")]
    if config.peers and adk_available() is None:
        uris.append(("adk InMemorySessionService", "adk-memory://"))
        uris.append(("adk SqliteSessionService", f"adk-sqlite://{directory / 'sweep-adk.db'}"))
    sweeps = {}
    events = speed.MixEvents()
    for name, uri in uris:
        target = open_target(uri)
        try:
            sweeps[name] = length_sweep(
                target, config.lengths, config.sweep_budget_s, events=events
            )
        finally:
            target.close()
    return sweeps


def _config_dict(config: BenchConfig) -> dict[str, Any]:
    return {
        "sessions": config.sessions,
        "seed": config.seed,
        "budget_s": config.budget_s,
        "lengths": list(config.lengths),
        "writers": list(config.writers),
        "writer_seconds": config.writer_seconds,
        "batch": config.batch,
    }


def write_outputs(report: BenchReport, out: Path, charts: bool = True) -> list[Path]:
    """Write results.json, the table, and (with matplotlib) the PNG charts; return the paths.

    Each file is new (``run`` made ``out``, or found it empty): an existing
    one is an OutputPathError, never overwritten.
    """
    written = [out / "results.json", out / "results.txt"]
    texts = [json.dumps(report.to_dict(), indent=2, default=_jsonable), report.format()]
    for path, text in zip(written, texts, strict=True):
        with os.fdopen(create_exclusive(path), "w", encoding="utf-8") as file:
            file.write(text + "\n")
    if charts:
        written.extend(_charts(report, out))
    return written


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _charts(report: BenchReport, out: Path) -> list[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []

    def style(axis: Any, xlabel: str, ylabel: str, title: str, base: int = 10) -> None:
        axis.set_xscale("log", base=base)
        axis.set_yscale("log")
        axis.set_xlabel(xlabel)
        axis.set_ylabel(ylabel)
        axis.set_title(title)
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=8)

    def save(fig: Any, name: str) -> Path:
        fig.tight_layout()
        path = out / name
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path

    paths = []
    if report.mix_sweep:
        fig, axes = plt.subplots(2, 2, figsize=(11, 8.4))
        panels = (
            ("deferred appends", "deferred appends", "median latency (us)"),
            ("durable appends", "durable appends (fsync)", "median latency (us)"),
            ("bulk", "append_many and replay, batches of 1,000", "microseconds per event"),
            ("reads", "get_session", "median latency (us)"),
        )
        for axis, (kind, title, ylabel) in zip(axes.flat, panels, strict=True):
            for name, values in report.mix_sweep.items():
                if speed.group(name) == kind and values:
                    xs = sorted(values)
                    axis.plot(xs, [values[x] for x in xs], marker="o", label=name)
            style(axis, "events per session (agent mix)", ylabel, title)
        paths.append(save(fig, "mix_sweep.png"))
    if report.lengths:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
        for axis, op, title in zip(
            axes,
            ("append", "get_recent"),
            ("append", "get_session(num_recent_events=10)"),
            strict=True,
        ):
            for name, ops in report.lengths.items():
                values = ops.get(op, {})
                if values:
                    xs = sorted(values)
                    axis.plot(xs, [values[x] for x in xs], marker="o", label=name)
            style(axis, "events in the session", "median latency (us)", title)
        paths.append(save(fig, "latency_vs_length.png"))
    if report.concurrency:
        fig, axis = plt.subplots(figsize=(6.5, 4.2))
        for name, values in report.concurrency.items():
            xs = sorted(values)
            axis.plot(xs, [values[x] for x in xs], marker="o", label=name)
        style(
            axis,
            "concurrent writers",
            "durable appends per second",
            "throughput against concurrency",
            base=2,
        )
        paths.append(save(fig, "throughput_vs_concurrency.png"))
        fig, axis = plt.subplots(figsize=(6.5, 4.2))
        for name, values in report.concurrency.items():
            xs = sorted(values)
            # Per-append latency seen by each writer: writers / throughput.
            axis.plot(xs, [x / values[x] * 1e6 for x in xs], marker="o", label=name)
        style(
            axis, "concurrent writers", "mean append latency (us)", "latency against concurrency",
            base=2,
        )  # fmt: skip
        paths.append(save(fig, "latency_vs_concurrency.png"))
    return paths
