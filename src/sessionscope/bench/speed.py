"""The speed targets: each figure measured beside its peer, in one run.

Every measurement here times its own side and its peer's in the same
process, round by round (the two alternate, so a noisy neighbour hits both),
and reports the median over rounds of each round's median. ``sessionscope
bench`` prints them as one table; ``benchmarks/bench_speed.py`` runs them on
their own with more rounds.

The workload is the agent mix (``mix``): each round times every system on
the same sessions of the mix, appended in the mix's order (the second
writer's appends through ``append_event_locked`` where the system has it),
then reads each session whole and its last 10 events; durable appends are
timed on the round's first ``durable_appends`` appends; the bulk path
(``append_many`` and ``replay --batch 1000``, in microseconds per event)
on ``bulk_sessions`` sessions. The same again on sessions of 10, 40, 200
and 1,000 events (the sweep): every append of each session for the
deferred systems; for the durable ones the last ``sweep_durable`` appends
of the first round's first sessions of that length, whose earlier appends
are stored once, untimed, and copied for every round. The peers: google-adk's
InMemory, Sqlite and Database services, and a raw py-lmdb transaction of the
same shape (``raw_txn``: the same events and state items, packed with msgpack,
in one transaction, no sessionscope code; ``raw_bulk``: the same, one
transaction per batch of 1,000, the bulk path's peer). Figures that need
events without their sessions take the mix's events cycled (``MixEvents``).

``turn_records`` is the fixed turn of the earlier, narrower workload, kept
for the benchmarks that study one append in isolation.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import math
import os
import shutil
import statistics
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lmdb
import msgpack

from ..model import GetSessionConfig
from ..service.facade import SessionService, SyncSessionService
from .mix import MixSpec, generate
from .replay import collector_paused, native_event

__all__ = [
    "Figure",
    "MixEvents",
    "SpeedConfig",
    "SpeedReport",
    "Workload",
    "live_appends",
    "live_appends_async",
    "measure",
    "mix_spec",
    "raw_bulk",
    "raw_txn",
    "timed_sync_appends",
    "turn_records",
]

_TEXT = (
    "The quarterly report shows revenue up 12% year over year, driven by demand in the "
    "enterprise segment. Operating margins improved as cloud costs fell. "
)
_START = 1_767_225_600.0


@dataclass(slots=True)
class SpeedConfig:
    """How many rounds and how much work each measurement takes."""

    rounds: int = 3
    # Sessions of the mix whose appends and reads are timed, per round.
    mix_sessions: int = 60
    # The session-length sweep: per length, about this many appends.
    sweep: tuple[int, ...] = (10, 40, 200, 1000)
    sweep_events: int = 3000
    durable_appends: int = 150
    # Per length of the sweep, the durable appends timed: the last ones of one
    # session (of several, each timed whole, when the sessions are shorter),
    # its earlier appends written untimed first.
    sweep_durable: int = 30
    # Sessions of the mix appended through append_many, its raw peer and replayed, per round.
    bulk_sessions: int = 300
    list_sizes: tuple[int, int] = (1_000, 100_000)
    full_listing: int = 10_000

    @classmethod
    def quick(cls) -> SpeedConfig:
        """Return the settings of ``bench --quick``: one round, smaller workloads."""
        return cls(
            rounds=1,
            mix_sessions=25,
            sweep_events=1000,
            durable_appends=40,
            sweep_durable=20,
            bulk_sessions=80,
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
    # None: shown beside its peer, with no target.
    limit: float | None
    most: bool = True
    absolute: bool = False

    @property
    def ratio(self) -> float | None:
        """Return ours over the peer's, or None for an absolute target."""
        if self.peer is None or not self.peer:
            return None
        return self.ours / self.peer

    @property
    def met(self) -> bool | None:
        """Return whether the target holds; None for a figure shown with no target."""
        if self.limit is None:
            return None
        value = self.ours if self.absolute or self.peer is None else self.ratio
        if value is None:
            return False
        return value <= self.limit if self.most else value >= self.limit

    @property
    def target(self) -> str:
        """Return the target as a reader states it, e.g. ``<= 1.5x``."""
        sign = "<=" if self.most else ">="
        if self.limit is None:
            return "-"
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


def _copy(record: dict[str, Any]) -> dict[str, Any]:
    copied = dict(record)
    copied["actions"] = {"state_delta": dict(record["actions"]["state_delta"])}
    return copied


def _median_us(samples: list[int]) -> float:
    return statistics.median(samples) / 1e3


def _over_rounds(values: list[float]) -> float:
    return statistics.median(values)


# -- the mix, prepared -----------------------------------------------------------------

Key = tuple[str, str, str]

# The names of the measured series, in the order the tables show them.
ASYNC = "native async deferred append"
SYNC = "native sync deferred append"
ADAPTER = "adk adapter deferred append"
ADK_MEMORY = "adk InMemory append_event"
RAW = "raw py-lmdb txn, no fsync"
GET_FULL = "native get_session, whole"
ADK_GET_FULL = "adk InMemory get_session, whole"
GET_RECENT = "native get_session, last 10"
ADK_GET_RECENT = "adk InMemory get_session, last 10"
DURABLE_SYNC = "native durable append (sync)"
DURABLE_ASYNC = "native durable append (async)"
RAW_DURABLE = "raw py-lmdb txn, fsync"
ADK_SQLITE = "adk Sqlite append_event"
ADK_DATABASE = "adk Database append_event"
# The bulk path, as microseconds per event (the targets table shows events/s).
BULK = "native append_many, batches of 1,000 (us/event)"
REPLAY = "native replay --batch 1000 (us/event)"
RAW_BULK = "raw py-lmdb txn per batch of 1,000 (us/event)"
RAW_BULK_PEER = "raw py-lmdb txn per batch of 1,000"

_DURABLE = (DURABLE_SYNC, DURABLE_ASYNC, RAW_DURABLE, ADK_SQLITE, ADK_DATABASE)
_BULK = (BULK, REPLAY, RAW_BULK)


def group(name: str) -> str:
    """Return the kind of a measured series: deferred or durable appends, bulk, or reads."""
    if "get_session" in name:
        return "reads"
    if name in _BULK:
        return "bulk"
    return "durable appends" if name in _DURABLE else "deferred appends"


@dataclass(slots=True)
class Workload:
    """The sessions of a mix and their stored appends, in the mix's order."""

    creates: list[tuple[Key, dict[str, Any]]]
    # (session, event record, whether a second writer sends it through the locked path)
    appends: list[tuple[Key, dict[str, Any], bool]]

    @classmethod
    def of(cls, spec: MixSpec) -> Workload:
        """Return the creates and stored appends of a generated mix (reads and deletes left out)."""
        return cls.of_records(generate(spec))

    @classmethod
    def of_records(cls, records: Iterable[dict[str, Any]]) -> Workload:
        """Return the creates and stored appends of a mix's records."""
        creates: list[tuple[Key, dict[str, Any]]] = []
        appends: list[tuple[Key, dict[str, Any], bool]] = []
        for record in records:
            key = (record["app"], record.get("user") or "", record.get("session") or "")
            if record["op"] == "create":
                creates.append((key, record.get("state") or {}))
            elif record["op"] == "append" and not record["event"].get("partial"):
                appends.append((key, record["event"], bool(record.get("locked"))))
        return cls(creates, appends)

    def head(self, count: int) -> Workload:
        """Return the first ``count`` appends and the sessions they go to."""
        appends = self.appends[:count]
        used = {key for key, _, _ in appends}
        return Workload([c for c in self.creates if c[0] in used], appends)

    def sessions(self, count: int) -> Workload:
        """Return the first ``count`` sessions created and their appends, in the mix's order."""
        kept = {key for key, _ in self.creates[:count]}
        return Workload(self.creates[:count], [a for a in self.appends if a[0] in kept])

    def split(self, tail: int) -> tuple[Workload, Workload]:
        """Return each session's appends before its last ``tail``, and those last ``tail``.

        Both keep every create; the appends keep the mix's order.
        """
        left = Counter(key for key, _, _ in self.appends)
        early: list[tuple[Key, dict[str, Any], bool]] = []
        late: list[tuple[Key, dict[str, Any], bool]] = []
        for append in self.appends:
            (late if left[append[0]] <= tail else early).append(append)
            left[append[0]] -= 1
        return Workload(self.creates, early), Workload(self.creates, late)


def mix_spec(sessions: int, seed: int, length: int | None = None) -> MixSpec:
    """Return a mix of ``sessions`` sessions (each ``length`` events long if given), writes only."""
    lengths = (length, length) if length else MixSpec().lengths
    return MixSpec(
        sessions=sessions,
        lengths=lengths,
        seed=seed,
        get_every_turn=False,
        list_every=0,
        delete_fraction=0.0,
    )


class MixEvents:
    """The stored events of generated mix sessions, handed out in turn with fresh ids and times.

    For the figures that need more events than a session of the mix holds,
    or events without their sessions (one session filled to 100,000 events,
    concurrent writers): event ``n`` is the ``n``-th stored event of the
    mix's sessions, cycled, as a fresh record with an id of its own and a
    timestamp after the one before. ``next_record`` numbers them itself
    (one counter for every caller, threads included).
    """

    def __init__(self, sessions: int = 40, seed: int = 0) -> None:
        work = Workload.of(mix_spec(sessions, seed))
        self.records = [record for _, record, _ in work.appends]
        self._numbers = itertools.count()

    def record(self, number: int, shift: int = 0) -> dict[str, Any]:
        """Return event ``number``: a stored event of the mix, its id and time fresh.

        It is the mix's event ``number - shift``, cycled: a shift makes event
        ``shift`` the cycle's first.
        """
        base = self.records[(number - shift) % len(self.records)]
        record = _fresh(base)
        record["id"] = f"{number:08x}-{base['id']}"
        record["timestamp"] = _START + number / 1000
        return record

    def next_record(self) -> dict[str, Any]:
        """Return the event after the last one ``next_record`` handed out."""
        return self.record(next(self._numbers))


def _fresh(record: dict[str, Any]) -> dict[str, Any]:
    """Return a copy of an event record whose delta an append may change."""
    copied = dict(record)
    actions = record.get("actions")
    if actions is not None:
        copied["actions"] = {**actions, "state_delta": dict(actions.get("state_delta") or {})}
    return copied


Append = tuple[Any, Any, bool]


def live_appends(
    service: Any,
    work: Workload,
    make_event: Callable[[dict[str, Any]], Any] = native_event,
    resume: bool = False,
) -> list[Append]:
    """Create a workload's sessions on a sync service; return its appends, ready to send.

    Each append is (the live session, a fresh event, whether a second writer
    sends it), in the workload's order. ``resume`` reads the sessions, stored
    before, instead of creating them.
    """
    live = {}
    for key, state in work.creates:
        if resume:
            live[key] = service.get_session(app_name=key[0], user_id=key[1], session_id=key[2])
        else:
            live[key] = service.create_session(
                app_name=key[0], user_id=key[1], state=dict(state), session_id=key[2]
            )
    return [(live[key], make_event(_fresh(r)), second) for key, r, second in work.appends]


async def live_appends_async(
    service: Any,
    work: Workload,
    make_event: Callable[[dict[str, Any]], Any],
    resume: bool = False,
) -> list[Append]:
    """As ``live_appends``, on an async service (sessionscope's or google-adk's)."""
    live = {}
    for key, state in work.creates:
        if resume:
            live[key] = await service.get_session(
                app_name=key[0], user_id=key[1], session_id=key[2]
            )
        else:
            live[key] = await service.create_session(
                app_name=key[0], user_id=key[1], state=dict(state), session_id=key[2]
            )
    return [(live[key], make_event(_fresh(r)), second) for key, r, second in work.appends]


async def _timed_appends(service: Any, session: Any, events: list[Any]) -> list[int]:
    """Time ``append_event`` of each event on one session (an async service)."""
    clock = time.perf_counter_ns
    samples = []
    for event in events:
        begin = clock()
        await service.append_event(session, event)
        samples.append(clock() - begin)
    return samples


async def _async_run(
    service: Any, work: Workload, make_event: Callable[[dict[str, Any]], Any],
    locked: bool, get_config: Callable[[int | None], Any] | None, resume: bool = False,
) -> dict[str, list[int]]:  # fmt: skip
    """Create the sessions, time every append (and then two reads of each session)."""
    events = [
        (session, event, second and locked)
        for session, event, second in await live_appends_async(service, work, make_event, resume)
    ]
    clock = time.perf_counter_ns
    appends: list[int] = []
    with collector_paused():
        for session, event, through_lock in events:
            begin = clock()
            if through_lock:
                await service.append_event_locked(session, event)
            else:
                await service.append_event(session, event)
            appends.append(clock() - begin)
        out = {"append": appends}
        if get_config is not None:
            whole: list[int] = []
            recent: list[int] = []
            full, last = get_config(None), get_config(10)
            for app, user, sid in (key for key, _ in work.creates):
                begin = clock()
                await service.get_session(app_name=app, user_id=user, session_id=sid, config=full)
                whole.append(clock() - begin)
                begin = clock()
                await service.get_session(app_name=app, user_id=user, session_id=sid, config=last)
                recent.append(clock() - begin)
            out["get"] = whole
            out["get_recent"] = recent
    return out


def _native_config(count: int | None) -> GetSessionConfig | None:
    return None if count is None else GetSessionConfig(num_recent_events=count)


def native_async(
    uri: str, work: Workload, gets: bool = False, resume: bool = False
) -> dict[str, list[int]]:
    """Time the native async service's appends (and reads) of a workload.

    ``resume`` appends to the workload's sessions as stored before (``_build_native``).
    """

    async def main() -> dict[str, list[int]]:
        async with SessionService(uri) as service:
            config = _native_config if gets else None
            return await _async_run(service, work, native_event, True, config, resume)

    return asyncio.run(main())


def timed_sync_appends(service: Any, appends: list[Append]) -> list[int]:
    """Send appends through a sync service (the second writer's locked); return each one's ns."""
    clock = time.perf_counter_ns
    samples = []
    with collector_paused():
        for session, event, second in appends:
            begin = clock()
            if second:
                service.append_event_locked(session, event)
            else:
                service.append_event(session, event)
            samples.append(clock() - begin)
    return samples


def native_sync(uri: str, work: Workload, resume: bool = False) -> tuple[list[int], bool]:
    """Time the native sync service's appends; also say whether the store wrote through its map."""
    with SyncSessionService(uri) as service:
        samples = timed_sync_appends(service, live_appends(service, work, resume=resume))
        return samples, bool(getattr(service.store, "writemap", False))


def adk_run(
    make_service: Callable[[], Any], work: Workload, gets: bool = False, resume: bool = False
) -> dict[str, list[int]]:
    """Time a google-adk session service's appends (and reads) of a workload.

    ADK has no locked path: the second writer's appends go through ``append_event``.
    """
    from google.adk.events import Event as AdkEvent
    from google.adk.sessions.base_session_service import GetSessionConfig as AdkConfig

    def config(count: int | None) -> Any:
        return None if count is None else AdkConfig(num_recent_events=count)

    async def main() -> dict[str, list[int]]:
        service = make_service()
        try:
            return await _async_run(
                service, work, AdkEvent.model_validate, False, config if gets else None, resume
            )
        finally:
            close = getattr(service, "close", None)
            if close is not None:
                await close()

    return asyncio.run(main())


def _adk_memory() -> Any:
    from google.adk.sessions import InMemorySessionService

    return InMemorySessionService()


def _adapter(path: Path) -> Callable[[], Any]:
    def make() -> Any:
        from ..adk import LmdbSessionService

        return LmdbSessionService(str(path), durability="deferred")

    return make


# -- the raw peer: one py-lmdb transaction of the same shape ----------------------------


def _raw_key(key: Key) -> bytes:
    return "\0".join(key).encode()


def _raw_open(path: Path, durable: bool, writemap: bool) -> lmdb.Environment:
    return lmdb.open(
        str(path), map_size=1 << 31, max_dbs=4, sync=durable, metasync=durable,
        readahead=False, writemap=writemap,
    )  # fmt: skip


_RawDbs = tuple[Any, Any, Any]


def _raw_dbs(env: lmdb.Environment, creates: list[tuple[Key, dict[str, Any]]] | None) -> _RawDbs:
    """Return the sessions, events and state maps; write ``creates`` (new, empty sessions)."""
    sessions, events, state = (env.open_db(n) for n in (b"sessions", b"events", b"state"))
    if creates:
        with env.begin(write=True) as txn:
            for key, initial in creates:
                meta = {"n": 0, "t": 0.0, "last": None, "state": initial}
                txn.put(_raw_key(key), msgpack.packb(meta), db=sessions)
    return sessions, events, state


def _raw_plan(work: Workload) -> list[tuple[bytes, str, str, dict[str, Any]]]:
    return [(_raw_key(key), key[0], key[1], _fresh(record)) for key, record, _ in work.appends]


def _raw_put(
    txn: lmdb.Transaction, dbs: _RawDbs, skey: bytes, app: str, user: str, record: dict[str, Any]
) -> None:
    """Write one append as an LMDB store of this shape does: event, state items, session record."""
    sessions, events, state = dbs
    pack = msgpack.packb
    meta = msgpack.unpackb(txn.get(skey, db=sessions))
    seq = meta["n"] + 1
    delta = (record.get("actions") or {}).get("state_delta") or {}
    kept = {k: v for k, v in delta.items() if not k.startswith("temp:")}
    if delta:
        record["actions"]["state_delta"] = kept
    txn.put(skey + seq.to_bytes(8, "big"), pack(record), db=events)
    for name, value in kept.items():
        if name.startswith("app:"):
            where = f"a\0{app}\0{name[4:]}"
        elif name.startswith("user:"):
            where = f"u\0{app}\0{user}\0{name[5:]}"
        else:
            where = f"s\0{skey.decode()}\0{name}"
        txn.put(where.encode(), pack(value), db=state)
    meta["n"], meta["t"], meta["last"] = seq, record["timestamp"], record["id"]
    txn.put(skey, pack(meta), db=sessions)


def raw_txn(
    work: Workload, path: Path, durable: bool, writemap: bool = False, created: bool = False
) -> list[int]:
    """Time one py-lmdb write transaction per append: what an LMDB store of this shape pays.

    No sessionscope code: the session's record is read and rewritten, the
    event (its delta without ``temp:`` keys) is packed with msgpack and put
    under the session's next sequence number, and every delta item is put
    into its scope's map, all in one transaction. ``writemap`` opens the
    environment as the store it is compared with was opened. ``created``
    appends to sessions stored at ``path`` before instead of creating them.
    """
    env = _raw_open(path, durable, writemap)
    try:
        dbs = _raw_dbs(env, None if created else work.creates)
        plan = _raw_plan(work)
        clock = time.perf_counter_ns
        samples = []
        with collector_paused():
            for skey, app, user, record in plan:
                begin = clock()
                with env.begin(write=True) as txn:
                    _raw_put(txn, dbs, skey, app, user, record)
                samples.append(clock() - begin)
        return samples
    finally:
        env.close()


def raw_bulk(work: Workload, path: Path, batch: int = 1000, writemap: bool = False) -> float:
    """Return the events/s of the workload's appends in one py-lmdb transaction per batch.

    The peer of ``append_many`` and ``replay --batch``: the same events and
    state items as ``raw_txn`` writes, packed with msgpack, ``batch`` appends
    to a transaction, no fsync; the sessions are created untimed first, as
    theirs are.
    """
    env = _raw_open(path, False, writemap)
    try:
        dbs = _raw_dbs(env, work.creates)
        plan = _raw_plan(work)
        with collector_paused():
            began = time.perf_counter()
            for start in range(0, len(plan), batch):
                with env.begin(write=True) as txn:
                    for skey, app, user, record in plan[start : start + batch]:
                        _raw_put(txn, dbs, skey, app, user, record)
            return len(plan) / (time.perf_counter() - began)
    finally:
        env.close()


# -- rounds on the mix and the length sweep ---------------------------------------------


def _medians(
    series: dict[str, list[int]], into: dict[str, list[float]], names: dict[str, str]
) -> None:
    for op, name in names.items():
        if series.get(op):
            into.setdefault(name, []).append(_median_us(series[op]))


def _append_round(work: Workload, directory: Path, adk: bool) -> dict[str, float]:
    """Time every deferred append system on one workload; return each one's median (us)."""
    directory.mkdir(parents=True)
    found: dict[str, list[float]] = {}
    native = native_async(f"lmdb://{directory / 'async'}?durability=deferred", work, gets=True)
    _medians(native, found, {"append": ASYNC, "get": GET_FULL, "get_recent": GET_RECENT})
    if adk:
        memory = adk_run(_adk_memory, work, gets=True)
        _medians(memory, found, {"append": ADK_MEMORY, "get": ADK_GET_FULL,
                                 "get_recent": ADK_GET_RECENT})  # fmt: skip
        adapter = adk_run(_adapter(directory / "adapter"), work)
        _medians(adapter, found, {"append": ADAPTER})
    samples, writemap = native_sync(f"lmdb://{directory / 'sync'}?durability=deferred", work)
    found[SYNC] = [_median_us(samples)]
    found[RAW] = [_median_us(raw_txn(work, directory / "raw", False, writemap))]
    return {name: values[0] for name, values in found.items()}


def _durable_round(work: Workload, directory: Path, adk: bool) -> dict[str, float]:
    """Time every durable append system on one workload; return each one's median (us)."""
    directory.mkdir(parents=True)
    out: dict[str, float] = {}
    sync, _ = native_sync(f"lmdb://{directory / 'sync'}", work)
    out[DURABLE_SYNC] = _median_us(sync)
    out[DURABLE_ASYNC] = _median_us(native_async(f"lmdb://{directory / 'async'}", work)["append"])
    out[RAW_DURABLE] = _median_us(raw_txn(work, directory / "raw", True))
    if adk:
        sqlite = adk_run(_adk_sqlite(directory / "adk.db"), work)
        out[ADK_SQLITE] = _median_us(sqlite["append"])
        if _database_ready():
            database = adk_run(_adk_database(directory / "adk-database.db"), work)
            out[ADK_DATABASE] = _median_us(database["append"])
    return out


def _adk_sqlite(path: Path) -> Callable[[], Any]:
    def make() -> Any:
        from google.adk.sessions.sqlite_session_service import SqliteSessionService

        # On a database that exists, its constructor leaves a sqlite3 connection
        # to the garbage collector, which Python 3.13 reports (ResourceWarning):
        # collected here, untimed and quietly, as it is ADK's.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            service = SqliteSessionService(str(path))
            gc.collect()
        return service

    return make


def _adk_database(path: Path) -> Callable[[], Any]:
    def make() -> Any:
        from google.adk.sessions import DatabaseSessionService

        return DatabaseSessionService(f"sqlite+aiosqlite:///{path}")

    return make


def _database_ready() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(n) for n in ("sqlalchemy", "greenlet", "aiosqlite"))


def _build_native(uri: str, work: Workload) -> None:
    """Store a workload's sessions and appends untimed, through ``append_many``.

    What is stored is what its appends one by one store: the events, the
    state their deltas leave, the sessions' records.
    """
    with SyncSessionService(uri) as service:
        pairs = [(session, event) for session, event, _ in live_appends(service, work)]
        for start in range(0, len(pairs), 1000):
            service.append_many(pairs[start : start + 1000])


def _build_adk(make_service: Callable[[], Any], work: Workload) -> None:
    """Store a workload's sessions and appends untimed, through an ADK service's own appends."""
    asyncio.run(_adk_appends(make_service(), work))


async def _adk_appends(service: Any, work: Workload) -> None:
    """Create the sessions and send every append."""
    from google.adk.events import Event as AdkEvent

    try:
        for session, event, _ in await live_appends_async(service, work, AdkEvent.model_validate):
            await service.append_event(session, event)
    finally:
        close = getattr(service, "close", None)
        if close is not None:
            await close()


def _build_adk_sqlite(path: Path, work: Workload) -> None:
    """Store a workload in an ADK Sqlite database at ``path``, untimed.

    ADK's Sqlite service syncs every call to its file: the appends go to a
    database in a memory-backed directory (``/dev/shm``, where a sync costs
    nothing), through the same service and SQL, and its files are then
    copied to ``path``. Without such a directory the appends go to ``path``.
    """
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        _build_adk(_adk_sqlite(path), work)
        return
    scratch = Path(tempfile.mkdtemp(prefix="sessionscope-adk-", dir=shm))
    try:
        _build_adk(_adk_sqlite(scratch / path.name), work)
        for built in scratch.iterdir():  # the database and any journal beside it
            shutil.copyfile(built, path.with_name(built.name))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


Built = tuple[Workload, Path]


def _durable_sweep_build(work: Workload, directory: Path, adk: bool, tail: int) -> Built:
    """Store the sessions of a length for the durable sweep, all but their last ``tail`` appends.

    Each system's store gets each session's earlier appends untimed: ours
    and the raw transaction's through a fast path that stores the same
    (``append_many``, transactions without fsync), ADK's through its own
    service. Every round times the last appends on its own copy. Return
    the appends left to time and where the stores are.
    """
    directory.mkdir(parents=True)
    early, late = work.split(tail)
    _build_native(f"lmdb://{directory / 'native'}", early)
    raw_txn(early, directory / "raw", False)
    if adk:
        _build_adk_sqlite(directory / "adk.db", early)
        if _database_ready():
            _build_adk(_adk_database(directory / "adk-database.db"), early)
    return late, directory


def _durable_sweep_round(late: Workload, built: Path, directory: Path) -> dict[str, float]:
    """Time durable appends on sessions that hold their length already: the last ones.

    On a copy of the stores ``_durable_sweep_build`` left in ``built``, in
    the order of ``_durable_round``; ADK's where it built them.
    """
    shutil.copytree(built, directory)
    shutil.copytree(directory / "native", directory / "sync")
    shutil.move(directory / "native", directory / "async")
    out: dict[str, float] = {}
    sync, _ = native_sync(f"lmdb://{directory / 'sync'}", late, resume=True)
    out[DURABLE_SYNC] = _median_us(sync)
    appended = native_async(f"lmdb://{directory / 'async'}", late, resume=True)
    out[DURABLE_ASYNC] = _median_us(appended["append"])
    out[RAW_DURABLE] = _median_us(raw_txn(late, directory / "raw", True, created=True))
    if (directory / "adk.db").exists():
        sqlite = adk_run(_adk_sqlite(directory / "adk.db"), late, resume=True)
        out[ADK_SQLITE] = _median_us(sqlite["append"])
    if (directory / "adk-database.db").exists():
        theirs = adk_run(_adk_database(directory / "adk-database.db"), late, resume=True)
        out[ADK_DATABASE] = _median_us(theirs["append"])
    return out


# -- bulk ------------------------------------------------------------------------------


def bulk_rate(work: Workload, uri: str) -> tuple[float, bool]:
    """Return events/s of ``append_many`` of a workload in batches of 1,000.

    Also say whether the store wrote through its map (its raw peer opens
    its environment the same way).
    """
    with SyncSessionService(uri) as service:
        pairs = [(session, event) for session, event, _ in live_appends(service, work)]
        writemap = bool(getattr(service.store, "writemap", False))
        # Timed as a replay times its batches: the prepared events are the
        # benchmark's own objects, kept out of the collector's passes.
        with collector_paused():
            began = time.perf_counter()
            for start in range(0, len(pairs), 1000):
                service.append_many(pairs[start : start + 1000])
            return len(pairs) / (time.perf_counter() - began), writemap


def replay_rate(records: list[dict[str, Any]], uri: str) -> float:
    """Return the events/s of ``sessionscope replay --batch 1000`` of the records."""
    from .replay import open_target, replay

    target = open_target(uri)
    try:
        result = replay(target, records, batch=1000, progress=False)
    finally:
        target.close()
    return result.events_per_s


def _bulk_records(sessions: int, seed: int) -> list[dict[str, Any]]:
    """Return the writes of the mix (creates, appends, deletes), as a replay of it sends them."""
    return [
        r
        for r in generate(MixSpec(sessions=sessions, seed=seed))
        if r["op"] in ("create", "append", "delete")
    ]


def _bulk_round(records: list[dict[str, Any]], directory: Path) -> dict[str, float]:
    """Time the bulk path and its raw peer on the same records; return us per event.

    ``append_many`` of the records' appends, the raw py-lmdb transaction per
    batch of 1,000 of the same appends, then ``replay --batch 1000`` of the
    records, each on a fresh store (deferred; no fsync).
    """
    directory.mkdir(parents=True)
    work = Workload.of_records(records)
    rate, writemap = bulk_rate(work, f"lmdb://{directory / 'bulk'}?durability=deferred")
    raw = raw_bulk(work, directory / "raw", 1000, writemap)
    replayed = replay_rate(records, f"lmdb://{directory / 'replay'}?durability=deferred")
    return {BULK: 1e6 / rate, RAW_BULK: 1e6 / raw, REPLAY: 1e6 / replayed}


def _bulk_rate(config: SpeedConfig, directory: Path, number: int) -> float:
    """Return events/s of ``append_many`` in batches of 1,000 over the mix, deferred."""
    work = Workload.of_records(_bulk_records(config.bulk_sessions, number))
    uri = f"lmdb://{directory / f'bulk-{number}'}?durability=deferred"
    return bulk_rate(work, uri)[0]


def _replay_rate(config: SpeedConfig, directory: Path, number: int) -> float:
    """Return the events/s of ``sessionscope replay --batch 1000`` of the mix, deferred."""
    records = _bulk_records(config.bulk_sessions, number)
    return replay_rate(records, f"lmdb://{directory / f'replay-{number}'}?durability=deferred")


# -- the rounds ----------------------------------------------------------------------------


def mix_rounds(
    config: SpeedConfig, directory: Path, adk: bool, say: Callable[[str], None]
) -> tuple[dict[str, float], dict[str, dict[int, float]]]:
    """Return medians over rounds on the mix, and per session length (the sweep).

    Each round, on the mix and then at each length: the deferred appends
    and reads, the durable appends, and the bulk path, every system on the
    same sessions. The bulk rows are microseconds per event.
    """
    over_mix: dict[str, list[float]] = {}
    sweep: dict[str, dict[int, list[float]]] = {}
    built: dict[int, Built] = {}

    def keep(found: dict[str, float], length: int | None = None) -> None:
        for name, value in found.items():
            if length is None:
                over_mix.setdefault(name, []).append(value)
            else:
                sweep.setdefault(name, {}).setdefault(length, []).append(value)

    for number in range(config.rounds):
        say(f"round {number + 1} of {config.rounds}: appends and reads on the mix")
        work = Workload.of(mix_spec(config.mix_sessions, number))
        keep(_append_round(work, directory / f"mix-{number}", adk))
        durable = work.head(config.durable_appends)
        keep(_durable_round(durable, directory / f"durable-{number}", adk))
        say(f"round {number + 1}: the bulk path on the mix")
        records = _bulk_records(config.bulk_sessions, number)
        keep(_bulk_round(records, directory / f"bulk-{number}"))
        for length in config.sweep:
            say(f"round {number + 1}: sessions of {length:,} events")
            sessions = max(2, config.sweep_events // length)
            records = list(generate(mix_spec(sessions, number, length)))
            work = Workload.of_records(records)
            place = directory / f"sweep-{number}-{length}"
            keep(_append_round(work, place, adk), length)
            if length not in built:
                # The first round's first sessions, stored once; every round times their last
                # appends on a copy (ADK's stores take seconds to fill at 1,000 events).
                tail = min(length, config.sweep_durable)
                first = work.sessions(math.ceil(config.sweep_durable / tail))
                where = directory / f"sweep-durable-{length}"
                built[length] = _durable_sweep_build(first, where, adk, tail)
            late, stores = built[length]
            place = directory / f"sweep-durable-{number}-{length}"
            keep(_durable_sweep_round(late, stores, place), length)
            keep(_bulk_round(records, directory / f"sweep-bulk-{number}-{length}"), length)
    medians = {name: _over_rounds(values) for name, values in over_mix.items()}
    by_length = {
        name: {length: _over_rounds(v) for length, v in values.items()}
        for name, values in sweep.items()
    }
    return medians, by_length


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


@dataclass
class SpeedReport:
    """The targets' figures, the medians on the mix and the session-length sweep."""

    figures: list[Figure]
    mix: dict[str, float]
    sweep: dict[str, dict[int, float]]

    def to_dict(self) -> dict[str, Any]:
        """Return the report as a JSON-ready map."""
        return {
            "figures": [figure.to_dict() for figure in self.figures],
            "mix_us": self.mix,
            "sweep_us": self.sweep,
        }


def _pair(
    figures: list[Figure], name: str, mine: float | None, peer_name: str, peer: float | None,
    unit: str, limit: float | None, **options: Any,
) -> None:  # fmt: skip
    """Add a figure when its own side was measured."""
    if mine is not None:
        figures.append(Figure(name, mine, peer_name, peer, unit, limit, **options))


def measure(
    config: SpeedConfig,
    directory: Path | None = None,
    adk: bool = True,
    lengths: dict[str, dict[int, float]] | None = None,
    concurrency: dict[str, dict[int, float]] | None = None,
    log: Callable[[str], None] | None = None,
) -> SpeedReport:
    """Measure every speed target on the mix; ``lengths`` and ``concurrency`` come from the bench.

    ``lengths`` is the deferred store's sweep to 100,000 events
    ({"append": {n: us}, "get_recent": ...}); ``concurrency`` maps
    "tasks"/"threads" to appends/s by writer count.
    """
    say = log or (lambda _: None)
    with _workspace(directory) as root:
        mix, sweep = mix_rounds(config, root, adk, say)
        figures: list[Figure] = []
        at40 = {name: values.get(40) for name, values in sweep.items()}
        at200 = {name: values.get(200) for name, values in sweep.items()}
        adk_mix = mix.get(ADK_MEMORY)
        _pair(figures, f"{ASYNC}, over the mix", mix[ASYNC], ADK_MEMORY, adk_mix, "us", 1.0)
        if 40 in config.sweep:
            _pair(figures, f"{ASYNC}, 40-event sessions", at40[ASYNC], ADK_MEMORY,
                  at40.get(ADK_MEMORY), "us", 1.5)  # fmt: skip
        _pair(figures, f"{ADAPTER}, over the mix", mix.get(ADAPTER), ASYNC, mix[ASYNC], "us", 1.3)
        _pair(figures, f"{SYNC}, over the mix", mix[SYNC], RAW, mix[RAW], "us", 2.0)
        _pair(figures, f"{DURABLE_SYNC}, over the mix", mix[DURABLE_SYNC], RAW_DURABLE,
              mix[RAW_DURABLE], "us", 1.3)  # fmt: skip
        _pair(figures, f"{DURABLE_ASYNC}, over the mix", mix[DURABLE_ASYNC], RAW_DURABLE,
              mix[RAW_DURABLE], "us", 1.5)  # fmt: skip
        if ADK_SQLITE in mix:
            # At least 5x faster: our time at most a fifth of theirs.
            _pair(figures, f"{DURABLE_SYNC}, over the mix", mix[DURABLE_SYNC], ADK_SQLITE,
                  mix[ADK_SQLITE], "us", 0.2)  # fmt: skip
        if ADK_DATABASE in mix:
            _pair(figures, f"{DURABLE_SYNC}, over the mix", mix[DURABLE_SYNC], ADK_DATABASE,
                  mix[ADK_DATABASE], "us", None)  # fmt: skip
        _pair(figures, f"{GET_RECENT}, over the mix", mix[GET_RECENT], ADK_GET_RECENT,
              mix.get(ADK_GET_RECENT), "us", None)  # fmt: skip
        if 200 in config.sweep:
            _pair(figures, f"{GET_FULL}, 200-event sessions", at200[GET_FULL], ADK_GET_FULL,
                  at200.get(ADK_GET_FULL), "us", 1.0)  # fmt: skip
        # The bulk rows, medians of microseconds per event, shown as events/s
        # beside the raw transaction per batch of the same events.
        raw_rate = 1e6 / mix[RAW_BULK]
        figures.append(
            Figure("append_many on the mix, batches of 1,000", 1e6 / mix[BULK], RAW_BULK_PEER,
                   raw_rate, "events/s", 150_000, most=False, absolute=True)
        )  # fmt: skip
        figures.append(
            Figure("replay --batch 1000 of the mix", 1e6 / mix[REPLAY], RAW_BULK_PEER,
                   raw_rate, "events/s", 150_000, most=False, absolute=True)
        )  # fmt: skip
        for kind, limit in (("tasks", 8.0), ("threads", 5.0)):
            values = (concurrency or {}).get(kind, {})
            if len(values) >= 2:
                low, high = min(values), max(values)
                figures.append(
                    Figure(f"group commit, {high} {kind}", values[high], f"1 of the {kind}",
                           values[low], "appends/s", limit, most=False)
                )  # fmt: skip
        say("measuring session listings")
        listing = _listing_figures(config, root, adk)
        small, large = config.list_sizes
        figures.append(
            Figure(f"list page of 100 at {large:,} sessions", listing[f"page-{large}"] / 1e3,
                   f"page at {small:,}", listing[f"page-{small}"] / 1e3, "ms", 2.0,
                   absolute=True)
        )  # fmt: skip
        figures.append(
            Figure(f"list page of 100, {large:,} against {small:,} sessions",
                   listing[f"page-{large}"] / 1e3, f"page at {small:,}",
                   listing[f"page-{small}"] / 1e3, "ms", 1.2)
        )  # fmt: skip
        full = config.full_listing
        figures.append(
            Figure(f"full listing of {full:,} sessions", listing[f"full-{full}"] / 1e3,
                   f"adk InMemory at {full:,}" if adk else "",
                   listing[f"adk-full-{full}"] / 1e3 if adk else None, "ms", 20.0,
                   absolute=True)
        )  # fmt: skip
        for op, name in (("get_recent", "get of the last 10"), ("append", "append")):
            values = (lengths or {}).get(op, {})
            if len(values) >= 2:
                low, high = min(values), max(values)
                figures.append(
                    Figure(f"{name} at {high:,} events", values[high], f"at {low:,} events",
                           values[low], "us", 1.2)
                )  # fmt: skip
        return SpeedReport(figures, mix, sweep)


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
            "-" if f.met is None else ("met" if f.met else "MISSED"),
        ]
