"""The speed targets: each figure measured beside its peer, in one run.

Every measurement here times its own side and its peer's in the same
process, round by round (the two alternate, so a noisy neighbour hits both),
and reports the median over rounds of each round's median. ``sessionscope
bench`` prints them as one table; ``benchmarks/bench_speed.py`` runs them on
their own with more rounds.

The workload is one agent turn after another: a user message, a model reply
that calls a tool, the tool's answer, each with a state delta on a session
key, a ``user:`` key, an ``app:`` key and a ``temp:`` key.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lmdb

from ..model import Event
from ..service.core import event_from_record
from ..service.facade import SessionService, SyncSessionService
from ..stores.lmdb.store import LmdbStore
from ..stores.records import AppendRequest, AppendResult

__all__ = ["Figure", "SpeedConfig", "measure", "turn_records"]

_TEXT = (
    "The quarterly report shows revenue up 12% year over year, driven by demand in the "
    "enterprise segment. Operating margins improved as cloud costs fell. "
)
_START = 1_767_225_600.0


@dataclass(slots=True)
class SpeedConfig:
    """How many rounds and how much work each measurement takes."""

    rounds: int = 5
    appends: int = 300
    durable_appends: int = 120
    bulk_events: int = 20_000
    list_sizes: tuple[int, int] = (1_000, 100_000)
    full_listing: int = 10_000

    @classmethod
    def quick(cls) -> SpeedConfig:
        """Return the settings of ``bench --quick``: fewer rounds, smaller stores."""
        return cls(
            rounds=2,
            appends=150,
            durable_appends=40,
            bulk_events=5_000,
            list_sizes=(1_000, 10_000),
            full_listing=2_000,
        )


@dataclass(slots=True)
class Figure:
    """One target: our figure, its peer's from the same run, and the limit on their ratio.

    ``ratio`` is ours over the peer's. ``most`` says the ratio must stay at or
    under ``limit`` (times), otherwise at or above it. An absolute target
    (no peer, or ``absolute``) compares ``ours`` itself with ``limit``; its
    peer, when it has one, is shown for scale.
    """

    name: str
    ours: float
    peer_name: str
    peer: float | None
    unit: str
    limit: float
    most: bool = True
    absolute: bool = False

    @property
    def ratio(self) -> float | None:
        """Return ours over the peer's, or None for an absolute target."""
        if self.peer is None or not self.peer:
            return None
        return self.ours / self.peer

    @property
    def met(self) -> bool:
        """Return whether the target holds."""
        value = self.ours if self.absolute or self.peer is None else self.ratio
        if value is None:
            return False
        return value <= self.limit if self.most else value >= self.limit

    @property
    def target(self) -> str:
        """Return the target as a reader states it, e.g. ``<= 1.5x``."""
        sign = "<=" if self.most else ">="
        if self.absolute or self.peer is None:
            return f"{sign} {self.limit:,g} {self.unit}"
        return f"{sign} {self.limit:g}x"

    def to_dict(self) -> dict[str, Any]:
        """Return the figure as a JSON-ready map."""
        return {
            "name": self.name,
            "ours": self.ours,
            "peer_name": self.peer_name,
            "peer": self.peer,
            "unit": self.unit,
            "ratio": self.ratio,
            "target": self.target,
            "met": self.met,
        }


# -- the workload ------------------------------------------------------------------


def turn_records(count: int, first: int = 0, prefix: str = "ev") -> list[dict[str, Any]]:
    """Return ``count`` event records of the workload: user, model (tool call), tool."""
    records = []
    for n in range(first, first + count):
        kind = n % 3
        delta = {
            "turn": n,
            "user:seen": n,
            "app:calls": n,
            "temp:step": f"step-{n}",
        }
        record: dict[str, Any] = {
            "id": f"{prefix}-{n:08d}",
            "timestamp": _START + n / 1000,
            "invocation_id": f"inv-{n // 3}",
            "actions": {"state_delta": delta},
        }
        if kind == 0:
            record["author"] = "user"
            record["content"] = {"role": "user", "parts": [{"text": f"Question {n}: {_TEXT}"}]}
        elif kind == 1:
            record["author"] = "analyst"
            call = {"id": f"call-{n}", "name": "lookup_account", "args": {"account": f"a-{n}"}}
            record["content"] = {
                "role": "model",
                "parts": [{"text": _TEXT}, {"function_call": call}],
            }
        else:
            record["author"] = "analyst"
            answer = {
                "id": f"call-{n - 1}",
                "name": "lookup_account",
                "response": {"revenue": n * 10, "region": "EMEA"},
            }
            record["content"] = {"role": "user", "parts": [{"function_response": answer}]}
        records.append(record)
    return records


def _native_events(records: list[dict[str, Any]]) -> list[Event]:
    return [event_from_record(_copy(record)) for record in records]


def _copy(record: dict[str, Any]) -> dict[str, Any]:
    copied = dict(record)
    copied["actions"] = {"state_delta": dict(record["actions"]["state_delta"])}
    return copied


def _median_us(samples: list[int]) -> float:
    return statistics.median(samples) / 1e3


def _over_rounds(values: list[float]) -> float:
    return statistics.median(values)


# -- appends against ADK's in-memory service -------------------------------------------


async def _timed_appends(service: Any, session: Any, events: list[Any]) -> list[int]:
    clock = time.perf_counter_ns
    samples = []
    for event in events:
        begin = clock()
        await service.append_event(session, event)
        samples.append(clock() - begin)
    return samples


def _adk_rounds(config: SpeedConfig, directory: Path, adk: bool) -> dict[str, list[float]]:
    """Return per-round medians of native deferred, adapter deferred and ADK InMemory appends."""
    rounds: dict[str, list[float]] = {"native": [], "adapter": [], "adk": []}

    async def one_round(number: int) -> None:
        records = turn_records(config.appends, prefix=f"r{number}")
        native = SessionService(f"lmdb://{directory / f'native-{number}'}?durability=deferred")
        try:
            session = await native.create_session(app_name="speed", user_id="u")
            samples = await _timed_appends(native, session, _native_events(records))
            rounds["native"].append(_median_us(samples))
        finally:
            await native.close()
        if not adk:
            return
        from google.adk.events import Event as AdkEvent
        from google.adk.sessions import InMemorySessionService

        from ..adk import LmdbSessionService

        memory = InMemorySessionService()
        theirs = await memory.create_session(app_name="speed", user_id="u")
        events = [AdkEvent.model_validate(_copy(r)) for r in records]
        rounds["adk"].append(_median_us(await _timed_appends(memory, theirs, events)))
        adapter = LmdbSessionService(str(directory / f"adapter-{number}"), durability="deferred")
        try:
            adapted = await adapter.create_session(app_name="speed", user_id="u")
            events = [AdkEvent.model_validate(_copy(r)) for r in records]
            rounds["adapter"].append(_median_us(await _timed_appends(adapter, adapted, events)))
        finally:
            await adapter.close()

    for number in range(config.rounds):
        asyncio.run(one_round(number))
    return rounds


# -- appends against a raw transaction of the same shape --------------------------------


class _TxnRecorder:
    """A write transaction that notes every get and put made through it."""

    def __init__(self, txn: Any, names: dict[int, bytes]) -> None:
        self._txn = txn
        self._names = names
        # (what, database, key, value): what is "get", "put" or "delete".
        self.ops: list[tuple[str, bytes, bytes, bytes]] = []

    def get(self, key: bytes, default: Any = None, db: Any = None) -> Any:
        self.ops.append(("get", self._names[id(db)], key, b""))
        return self._txn.get(key, default, db=db)

    def put(self, key: bytes, value: bytes, db: Any = None, **options: Any) -> Any:
        self.ops.append(("put", self._names[id(db)], key, value))
        return self._txn.put(key, value, db=db, **options)

    def delete(self, key: bytes, value: bytes = b"", db: Any = None) -> Any:
        self.ops.append(("delete", self._names[id(db)], key, value))
        return self._txn.delete(key, value, db=db)

    def cursor(self, db: Any = None) -> Any:
        return self._txn.cursor(db=db)


class _RecordingStore(LmdbStore):
    """An LMDB store that keeps the gets and puts of each append it makes."""

    shapes: list[list[tuple[str, bytes, bytes, bytes]]]

    def append_in(self, txn: Any, request: AppendRequest) -> AppendResult:
        if not hasattr(self, "shapes"):
            self.shapes = []
        names = {id(handle): name for name, handle in self.databases.items()}
        recorder = _TxnRecorder(txn, names)
        result = super().append_in(recorder, request)
        self.shapes.append(recorder.ops)
        return result


def append_shapes(records: list[dict[str, Any]], directory: Path) -> list[list[Any]]:
    """Return the gets and puts each append of ``records`` makes on a fresh store."""
    store = _RecordingStore(directory, durability="deferred")
    try:
        service = SyncSessionService(store)
        session = service.create_session(app_name="speed", user_id="u", session_id="s")
        for event in _native_events(records):
            service.append_event(session, event)
        return store.shapes
    finally:
        store.close()


def _raw_samples(
    shapes: list[list[Any]], path: Path, durable: bool, writemap: bool = False
) -> list[int]:
    """Time one raw py-lmdb transaction per shape: its gets and puts, then the commit.

    ``writemap`` opens the environment as the store it is compared with was
    opened: a deferred store writes through a writable map where it could
    reserve the file, and that mode alone makes a commit about twice as cheap.
    """
    env = lmdb.open(
        str(path),
        map_size=1 << 30,
        max_dbs=6,
        sync=durable,
        metasync=True,
        readahead=False,
        writemap=writemap,
    )
    try:
        names = (b"meta", b"sessions", b"shared", b"data", b"listing")
        handles = {name: env.open_db(name) for name in names}
        plans = [[(what, handles[db], key, value) for what, db, key, value in s] for s in shapes]
        clock = time.perf_counter_ns
        samples = []
        for plan in plans:
            begin = clock()
            with env.begin(write=True) as txn:
                for what, handle, key, value in plan:
                    if what == "put":
                        txn.put(key, value, db=handle)
                    elif what == "get":
                        txn.get(key, db=handle)
                    else:
                        txn.delete(key, db=handle)
            samples.append(clock() - begin)
        return samples
    finally:
        env.close()


def _sync_samples(uri: str, records: list[dict[str, Any]]) -> tuple[list[int], bool]:
    """Time sync appends of ``records``; also say whether the store wrote through its map."""
    with SyncSessionService(uri) as service:
        session = service.create_session(app_name="speed", user_id="u", session_id="s")
        clock = time.perf_counter_ns
        samples = []
        for event in _native_events(records):
            begin = clock()
            service.append_event(session, event)
            samples.append(clock() - begin)
        return samples, bool(getattr(service.store, "writemap", False))


def _async_samples(uri: str, records: list[dict[str, Any]]) -> list[int]:
    async def main() -> list[int]:
        async with SessionService(uri) as service:
            session = await service.create_session(app_name="speed", user_id="u", session_id="s")
            return await _timed_appends(service, session, _native_events(records))

    return asyncio.run(main())


def _raw_rounds(config: SpeedConfig, directory: Path) -> dict[str, list[float]]:
    """Return per-round medians of native appends and raw transactions of their shape."""
    rounds: dict[str, list[float]] = {
        k: [] for k in ("deferred", "raw-nosync", "sync-api", "async-api", "raw-sync")
    }
    for number in range(config.rounds):
        base = directory / f"raw-{number}"
        records = turn_records(config.appends, prefix=f"x{number}")
        shapes = append_shapes(records, base / "shape")
        uri = f"lmdb://{base / 'deferred'}?durability=deferred"
        deferred, writemap = _sync_samples(uri, records)
        rounds["deferred"].append(_median_us(deferred))
        raw = _raw_samples(shapes, base / "raw-nosync", False, writemap)
        rounds["raw-nosync"].append(_median_us(raw))
        durable = records[: config.durable_appends]
        sync_api, _ = _sync_samples(f"lmdb://{base / 'sync-api'}", durable)
        rounds["sync-api"].append(_median_us(sync_api))
        async_api = _async_samples(f"lmdb://{base / 'async-api'}", durable)
        rounds["async-api"].append(_median_us(async_api))
        raw = _raw_samples(shapes[: config.durable_appends], base / "raw-sync", True)
        rounds["raw-sync"].append(_median_us(raw))
    return rounds


# -- bulk ------------------------------------------------------------------------------


def _bulk_rate(config: SpeedConfig, directory: Path, number: int) -> float:
    """Return events/s of ``append_many`` in batches of 1,000 over 100 sessions, deferred."""
    from .replay import collector_paused

    uri = f"lmdb://{directory / f'bulk-{number}'}?durability=deferred"
    with SyncSessionService(uri) as service:
        sessions = [
            service.create_session(app_name="speed", user_id=f"u{i % 10}", session_id=f"s{i}")
            for i in range(100)
        ]
        records = turn_records(config.bulk_events, prefix=f"b{number}")
        events = _native_events(records)
        pairs = [(sessions[i % 100], event) for i, event in enumerate(events)]
        # Timed as a replay times its batches: the prepared events are the
        # benchmark's own objects, kept out of the collector's passes.
        with collector_paused():
            began = time.perf_counter()
            for start in range(0, len(pairs), 1000):
                service.append_many(pairs[start : start + 1000])
            return len(pairs) / (time.perf_counter() - began)


def _replay_rate(config: SpeedConfig, directory: Path, number: int) -> float:
    """Return the events/s of ``sessionscope replay --batch 1000`` on a deferred store."""
    from .replay import open_target, replay
    from .trace import TraceSpec, generate

    sessions = max(50, config.bulk_events // 40)
    records = [
        r
        for r in generate(TraceSpec(sessions=sessions, seed=number))
        if r["op"] in ("create", "append", "delete")
    ]
    target = open_target(f"lmdb://{directory / f'replay-{number}'}?durability=deferred")
    try:
        result = replay(target, records, batch=1000, progress=False)
    finally:
        target.close()
    return result.events_per_s


# -- listings --------------------------------------------------------------------------


def _listing_us(service: SyncSessionService, limit: int | None, reads: int) -> float:
    clock = time.perf_counter_ns
    samples = []
    for _ in range(reads):
        begin = clock()
        service.list_sessions(app_name="speed", limit=limit)
        samples.append(clock() - begin)
    return _median_us(samples)


def _listing_figures(config: SpeedConfig, directory: Path, adk: bool) -> dict[str, float]:
    """Return page and full-listing times (us) at the configured session counts."""
    small, large = config.list_sizes
    full = config.full_listing
    out: dict[str, float] = {}
    uri = f"lmdb://{directory / 'listing'}?durability=deferred"
    with SyncSessionService(uri) as service:
        count = 0
        for size in sorted({small, full, large}):
            for i in range(count, size):
                service.create_session(app_name="speed", user_id=f"u{i % 97}", session_id=f"s{i}")
            count = size
            if size in (small, large):
                out[f"page-{size}"] = _listing_us(service, 100, 9)
            if size == full:
                out[f"full-{size}"] = _listing_us(service, None, 5)
    if adk:
        out[f"adk-full-{full}"] = _adk_listing_us(full)
    return out


def _adk_listing_us(count: int) -> float:
    from google.adk.sessions import InMemorySessionService

    async def main() -> float:
        memory = InMemorySessionService()
        for i in range(count):
            await memory.create_session(app_name="speed", user_id=f"u{i % 97}", session_id=f"s{i}")
        clock = time.perf_counter_ns
        samples = []
        for _ in range(5):
            begin = clock()
            await memory.list_sessions(app_name="speed")
            samples.append(clock() - begin)
        return _median_us(samples)

    return asyncio.run(main())


# -- all of them ------------------------------------------------------------------------


def measure(
    config: SpeedConfig,
    directory: Path | None = None,
    adk: bool = True,
    lengths: dict[str, dict[int, float]] | None = None,
    concurrency: dict[str, dict[int, float]] | None = None,
    log: Callable[[str], None] | None = None,
) -> list[Figure]:
    """Measure every speed target; ``lengths`` and ``concurrency`` come from the bench's sweeps.

    ``lengths`` is the deferred store's sweep ({"append": {n: us}, "get_recent": ...});
    ``concurrency`` maps "tasks"/"threads" to appends/s by writer count.
    """
    say = log or (lambda _: None)
    with _workspace(directory) as root:
        figures: list[Figure] = []
        say("measuring appends against ADK InMemorySessionService")
        adk_rounds = _adk_rounds(config, root, adk)
        if adk:
            figures.append(
                Figure(
                    "native deferred append (async)",
                    _over_rounds(adk_rounds["native"]),
                    "adk InMemory append_event",
                    _over_rounds(adk_rounds["adk"]),
                    "us",
                    1.0,
                )
            )
            figures.append(
                Figure(
                    "adk adapter deferred append",
                    _over_rounds(adk_rounds["adapter"]),
                    "adk InMemory append_event",
                    _over_rounds(adk_rounds["adk"]),
                    "us",
                    2.0,
                )
            )
        say("measuring appends against raw transactions of the same shape")
        raw = _raw_rounds(config, root)
        figures.append(
            Figure(
                "native deferred append (sync)",
                _over_rounds(raw["deferred"]),
                "raw txn, same gets/puts, no fsync",
                _over_rounds(raw["raw-nosync"]),
                "us",
                1.5,
            )
        )
        figures.append(
            Figure(
                "durable append, sync API",
                _over_rounds(raw["sync-api"]),
                "raw txn, same gets/puts, fsync",
                _over_rounds(raw["raw-sync"]),
                "us",
                1.3,
            )
        )
        figures.append(
            Figure(
                "durable append, async API",
                _over_rounds(raw["async-api"]),
                "raw txn, same gets/puts, fsync",
                _over_rounds(raw["raw-sync"]),
                "us",
                1.5,
            )
        )
        say("measuring the bulk path")
        bulk = [_bulk_rate(config, root, n) for n in range(config.rounds)]
        replayed = [_replay_rate(config, root, n) for n in range(config.rounds)]
        figures.append(
            Figure("append_many, batches of 1,000", _over_rounds(bulk), "", None, "events/s",
                   150_000, most=False)
        )  # fmt: skip
        figures.append(
            Figure("replay --batch 1000", _over_rounds(replayed), "", None, "events/s",
                   150_000, most=False)
        )  # fmt: skip
        for kind, limit in (("tasks", 8.0), ("threads", 5.0)):
            values = (concurrency or {}).get(kind, {})
            if len(values) >= 2:
                low, high = min(values), max(values)
                figures.append(
                    Figure(
                        f"group commit, {high} {kind}",
                        values[high],
                        f"1 of the {kind}",
                        values[low],
                        "appends/s",
                        limit,
                        most=False,
                    )
                )
        say("measuring session listings")
        listing = _listing_figures(config, root, adk)
        small, large = config.list_sizes
        figures.append(
            Figure(
                f"list page of 100 at {large:,} sessions",
                listing[f"page-{large}"] / 1e3,
                f"page at {small:,}",
                listing[f"page-{small}"] / 1e3,
                "ms",
                2.0,
                absolute=True,
            )
        )
        figures.append(
            Figure(
                f"list page of 100, {large:,} against {small:,} sessions",
                listing[f"page-{large}"] / 1e3,
                f"page at {small:,}",
                listing[f"page-{small}"] / 1e3,
                "ms",
                1.2,
            )
        )
        full = config.full_listing
        figures.append(
            Figure(
                f"full listing of {full:,} sessions",
                listing[f"full-{full}"] / 1e3,
                f"adk InMemory at {full:,}" if adk else "",
                listing[f"adk-full-{full}"] / 1e3 if adk else None,
                "ms",
                20.0,
                absolute=True,
            )
        )
        for op, name in (("get_recent", "get of the last 10"), ("append", "append")):
            values = (lengths or {}).get(op, {})
            if len(values) >= 2:
                low, high = min(values), max(values)
                figures.append(
                    Figure(
                        f"{name} at {high:,} events",
                        values[high],
                        f"at {low:,} events",
                        values[low],
                        "us",
                        1.2,
                    )
                )
        return figures


class _workspace:
    """A directory to measure in: the one given, or a temporary one removed afterwards."""

    def __init__(self, directory: Path | None) -> None:
        self._given = directory
        self._temporary: tempfile.TemporaryDirectory[str] | None = None

    def __enter__(self) -> Path:
        if self._given is not None:
            return self._given
        self._temporary = tempfile.TemporaryDirectory(prefix="sessionscope-speed-")
        return Path(self._temporary.name)

    def __exit__(self, *exc: object) -> None:
        if self._temporary is not None:
            self._temporary.cleanup()


def rows(figures: list[Figure]) -> Iterator[list[str]]:
    """Yield one table row per figure: name, ours, peer, ratio, target, verdict."""
    for f in figures:
        digits = 0 if f.unit in ("events/s", "appends/s") else (2 if f.unit == "ms" else 1)
        ratio = f"{f.ratio:.2f}x" if f.ratio is not None else "-"
        peer = f"{f.peer:,.{digits}f} ({f.peer_name})" if f.peer is not None else "-"
        yield [
            f.name,
            f"{f.ours:,.{digits}f} {f.unit}",
            peer,
            ratio,
            f.target,
            "met" if f.met else "MISSED",
        ]
