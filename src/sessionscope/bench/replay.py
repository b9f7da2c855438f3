"""Replay a trace on a target, verify what it left, and measure each call.

A target is named by a URI:

- ``memory://``, ``lmdb:///path?durability=deferred``: the native
  ``SyncSessionService`` on a sessionscope store;
- ``adk-lmdb:///path?durability=...``: sessionscope's google-adk adapter;
- ``adk-memory://``, ``adk-sqlite:///path``, ``adk-database://<sqlalchemy-url>``:
  google-adk's own ``InMemorySessionService``, ``SqliteSessionService`` and
  ``DatabaseSessionService`` (with the ``adk`` extra installed).

The trace is loaded and turned into the target's event objects before the
clock starts, so the figures measure the service, not JSON parsing.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib
import math
import os
import time
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TypeVar

from ..cli.console import Column, RichProgressBar, render_table
from ..core import APP_PREFIX, TEMP_PREFIX, USER_PREFIX
from ..errors import DuplicateEventError, StateValueError
from ..model import Event, EventActions, GetSessionConfig, Session
from ..service.facade import SyncSessionService
from ..stores import open_store, redact
from ..stores.uri import SCHEMES, query_pairs, uri_path
from .trace import Expectation, TraceError, check_record, load_trace

if TYPE_CHECKING:
    from ..stores.records import AppendBatch, BatchResult

__all__ = [
    "ADK_SCHEMES",
    "LatencyStats",
    "ReplayResult",
    "Target",
    "TargetError",
    "check_trace",
    "open_target",
    "percentile",
    "replay",
    "replay_file",
    "verify",
]

T = TypeVar("T")
ADK_SCHEMES = ("adk-memory", "adk-sqlite", "adk-database", "adk-lmdb")
Key = tuple[str, str, str]
# A read placed in a batch: (appends of the batch before it, app, user, session, config).
PlacedRead = tuple[int, str, str, str, "Mapping[str, Any] | None"]


class TargetError(ValueError):
    """A target URI is malformed, unknown, or needs a package that is missing."""


# -- latency -------------------------------------------------------------------


def percentile(ordered: Sequence[float], fraction: float) -> float:
    """Return the value at ``fraction`` of sorted samples (nearest rank)."""
    if not ordered:
        return math.nan
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


@dataclass(slots=True)
class LatencyStats:
    """Percentiles of one operation's latencies, in microseconds."""

    count: int
    p50: float
    p90: float
    p99: float
    mean: float
    max: float
    total_s: float

    @classmethod
    def of(cls, samples_ns: Sequence[int]) -> LatencyStats:
        """Return the stats of latency samples given in nanoseconds."""
        ordered = sorted(samples_ns)
        total = sum(ordered)
        count = len(ordered)
        return cls(
            count,
            percentile(ordered, 0.50) / 1e3,
            percentile(ordered, 0.90) / 1e3,
            percentile(ordered, 0.99) / 1e3,
            total / count / 1e3 if count else math.nan,
            ordered[-1] / 1e3 if count else math.nan,
            total / 1e9,
        )

    def to_dict(self) -> dict[str, float]:
        """Return the stats as a JSON-ready map."""
        return {
            "count": self.count,
            "p50_us": self.p50,
            "p90_us": self.p90,
            "p99_us": self.p99,
            "mean_us": self.mean,
            "max_us": self.max,
            "total_s": self.total_s,
        }


# -- targets -------------------------------------------------------------------


class Target:
    """One session service that a trace can be replayed on, behind one sync interface."""

    name = "target"
    native = False
    # Whether reads can travel inside a batch (``append_many_reading``).
    reads_in_batch = False

    def make_event(self, record: Mapping[str, Any]) -> Any:
        """Return the target's event object for a trace event record."""
        raise NotImplementedError

    def create(self, app: str, user: str, sid: str, state: dict[str, Any] | None) -> None:
        """Create a session and keep it as the live copy for later appends."""
        raise NotImplementedError

    def append(self, key: Key, event: Any) -> None:
        """Append one event to the live copy of a session."""
        raise NotImplementedError

    def append_locked(self, key: Key, event: Any) -> None:
        """Append one event of a second writer of the session (``append`` where none is)."""
        self.append(key, event)

    def append_many(self, appends: list[tuple[Key, Any]]) -> None:
        """Append events through the bulk path (one at a time where there is none)."""
        for key, event in appends:
            self.append(key, event)

    def append_many_reading(
        self, appends: list[tuple[Key, Any]], reads: list[PlacedRead]
    ) -> list[Any]:
        """Append a batch and answer reads placed between its appends; return the answers.

        A read placed after ``n`` appends answers what ``get`` would answer
        after those ``n`` and before the rest. Here, one step after another.
        """
        answers: list[Any] = []
        done = 0
        for position, app, user, sid, config in reads:
            if position > done:
                self.append_many(appends[done:position])
                done = position
            answers.append(self.get(app, user, sid, config))
        if done < len(appends):
            self.append_many(appends[done:])
        return answers

    def read_answer(self, answer: Any) -> Any:
        """Return what ``get`` returns for an answer of ``append_many_reading``."""
        return answer

    def get(self, app: str, user: str, sid: str, config: Mapping[str, Any] | None) -> Any:
        """Read a session with a config."""
        raise NotImplementedError

    def listing(self, app: str, user: str | None) -> Any:
        """List the sessions of an app or user."""
        raise NotImplementedError

    def delete(self, app: str, user: str, sid: str) -> None:
        """Delete a session."""
        raise NotImplementedError

    def read(self, app: str, user: str, sid: str) -> tuple[dict[str, Any], list[str]] | None:
        """Return a session's merged state and its event ids as stored; None if missing."""
        raise NotImplementedError

    def session_keys(self, app: str) -> set[tuple[str, str]]:
        """Return the (user, session) pairs an app lists."""
        raise NotImplementedError

    def flush(self) -> None:
        """Make what was acknowledged durable."""

    def close(self) -> None:
        """Release the target."""


def native_event(record: Mapping[str, Any]) -> Event:
    """Return a native event for a trace event record; unknown fields go to ``extra``."""
    fields = dict(record)
    actions = fields.pop("actions", None)
    extra = fields.pop("extra", None) or {}
    known = {name: fields.pop(name) for name in _NATIVE_FIELDS if name in fields}
    event = Event(**known)
    if fields or extra:
        event.extra = {**extra, **fields}
    if actions:
        actions = dict(actions)
        more = actions.pop("extra", None) or {}
        known_actions = {name: actions.pop(name) for name in _ACTION_FIELDS if name in actions}
        event.actions = EventActions(**known_actions)
        if actions or more:
            event.actions.extra = {**more, **actions}
    return event


_NATIVE_FIELDS = tuple(n for n in Event.__dataclass_fields__ if n not in ("actions", "extra"))
_ACTION_FIELDS = tuple(n for n in EventActions.__dataclass_fields__ if n != "extra")


class NativeTarget(Target):
    """The native ``SyncSessionService`` on a sessionscope store."""

    native = True

    def __init__(self, uri: str, service: SyncSessionService | None = None) -> None:
        self.name = redact(uri)  # shown and written in reports: never a password
        self.service = service or SyncSessionService(open_store(uri))
        self.live: dict[Key, Session] = {}
        # A store that answers reads inside a batch's round trips (Redis).
        self._reading = getattr(self.service.store, "append_many_reading", None)
        self.reads_in_batch = self._reading is not None

    def make_event(self, record: Mapping[str, Any]) -> Event:
        """Return the native event of a trace event record."""
        return native_event(record)

    def create(self, app: str, user: str, sid: str, state: dict[str, Any] | None) -> None:
        """Create a session and keep it as the live copy."""
        session = self.service.create_session(
            app_name=app, user_id=user, state=state, session_id=sid
        )
        self.live[(app, user, sid)] = session

    def append(self, key: Key, event: Event) -> None:
        """Append one event to the live copy."""
        self.service.append_event(self.live[key], event)

    def append_locked(self, key: Key, event: Event) -> None:
        """Append one event of a second writer through ``append_event_locked``."""
        self.service.append_event_locked(self.live[key], event)

    def append_many(self, appends: list[tuple[Key, Any]]) -> None:
        """Append a batch in one transaction."""
        live = self.live
        self.service.append_many([(live[key], event) for key, event in appends])

    def append_many_reading(
        self, appends: list[tuple[Key, Any]], reads: list[PlacedRead]
    ) -> list[Any]:
        """Append a batch and answer the reads placed in it, in the store's round trips.

        As ``SyncSessionService.append_many`` (a bad event refuses the whole
        batch before anything is stored; a store error stops it there and is
        raised), with the reads carried along where the store can.
        """
        if self._reading is None:
            return super().append_many_reading(appends, reads)
        core = self.service.core
        reading = self._reading
        # Positions count stored appends: partial events never reach the store.
        stored_before, stored = [], 0
        for _, event in appends:
            stored_before.append(stored)
            stored += not event.partial
        stored_before.append(stored)
        answers: list[Any] = []

        def send(batch: AppendBatch) -> BatchResult:
            placed = [
                (stored_before[position],
                 *core.check_get(app, user, sid, GetSessionConfig(**config) if config else None))
                for position, app, user, sid, config in reads
            ]  # fmt: skip
            result: BatchResult
            result, loaded = reading(batch, placed)
            answers.extend(loaded)
            return result

        live = self.live
        self.service.append_many_with([(live[key], event) for key, event in appends], send)
        return answers

    def read_answer(self, answer: Any) -> Any:
        """Return the session a read in a batch answered (the store's answer, decoded)."""
        if self._reading is None:
            return answer
        return self.service.core.finish_get(answer)

    def get(self, app: str, user: str, sid: str, config: Mapping[str, Any] | None) -> Any:
        """Read a session."""
        options = GetSessionConfig(**config) if config else None
        return self.service.get_session(app_name=app, user_id=user, session_id=sid, config=options)

    def listing(self, app: str, user: str | None) -> Any:
        """List sessions."""
        return self.service.list_sessions(app_name=app, user_id=user)

    def delete(self, app: str, user: str, sid: str) -> None:
        """Delete a session."""
        self.service.delete_session(app_name=app, user_id=user, session_id=sid)
        self.live.pop((app, user, sid), None)

    def read(self, app: str, user: str, sid: str) -> tuple[dict[str, Any], list[str]] | None:
        """Return a session's state and event ids as stored."""
        session = self.service.get_session(app_name=app, user_id=user, session_id=sid)
        if session is None:
            return None
        return session.state, [event.id for event in session.events]

    def session_keys(self, app: str) -> set[tuple[str, str]]:
        """Return the (user, session) pairs an app lists."""
        listing = self.service.list_sessions(app_name=app)
        return {(meta.user_id, meta.id) for meta in listing.sessions}

    def flush(self) -> None:
        """Make deferred appends durable."""
        self.service.flush()

    def close(self) -> None:
        """Flush and close the store."""
        self.service.close()


class AdkTarget(Target):
    """A google-adk ``BaseSessionService``, driven on a private event loop."""

    def __init__(self, name: str, service: Any) -> None:
        from google.adk.events import Event as AdkEvent
        from google.adk.sessions.base_session_service import GetSessionConfig as AdkConfig

        self.name = redact(name)  # adk-database://URL may carry a password
        self.service = service
        self.live: dict[Key, Any] = {}
        self._event_class = AdkEvent
        self._config_class = AdkConfig
        self._loop = asyncio.new_event_loop()

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._loop.run_until_complete(coro)

    def make_event(self, record: Mapping[str, Any]) -> Any:
        """Return the ADK event of a trace event record."""
        return self._event_class.model_validate(record)

    def create(self, app: str, user: str, sid: str, state: dict[str, Any] | None) -> None:
        """Create a session and keep it as the live copy."""
        self.live[(app, user, sid)] = self._run(
            self.service.create_session(app_name=app, user_id=user, state=state, session_id=sid)
        )

    def append(self, key: Key, event: Any) -> None:
        """Append one event to the live copy."""
        self._run(self.service.append_event(self.live[key], event))

    def get(self, app: str, user: str, sid: str, config: Mapping[str, Any] | None) -> Any:
        """Read a session."""
        options = self._config_class(**config) if config else None
        return self._run(
            self.service.get_session(app_name=app, user_id=user, session_id=sid, config=options)
        )

    def listing(self, app: str, user: str | None) -> Any:
        """List sessions."""
        return self._run(self.service.list_sessions(app_name=app, user_id=user))

    def delete(self, app: str, user: str, sid: str) -> None:
        """Delete a session."""
        self._run(self.service.delete_session(app_name=app, user_id=user, session_id=sid))
        self.live.pop((app, user, sid), None)

    def read(self, app: str, user: str, sid: str) -> tuple[dict[str, Any], list[str]] | None:
        """Return a session's state and event ids as stored."""
        session = self._run(self.service.get_session(app_name=app, user_id=user, session_id=sid))
        if session is None:
            return None
        return dict(session.state), [event.id for event in session.events]

    def session_keys(self, app: str) -> set[tuple[str, str]]:
        """Return the (user, session) pairs an app lists."""
        listing = self._run(self.service.list_sessions(app_name=app, user_id=None))
        return {(s.user_id, s.id) for s in listing.sessions}

    def flush(self) -> None:
        """Flush the service if it can."""
        flush = getattr(self.service, "flush", None)
        if flush is not None:
            result = flush()
            if asyncio.iscoroutine(result):
                self._run(result)

    def close(self) -> None:
        """Close the service and the loop."""
        close = getattr(self.service, "close", None)
        try:
            if close is not None:
                result = close()
                if asyncio.iscoroutine(result):
                    self._run(result)
            engine = getattr(self.service, "db_engine", None)
            if engine is not None and hasattr(engine, "dispose"):
                self._run(engine.dispose())
        finally:
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            self._loop.close()


def _need_adk(scheme: str) -> None:
    try:
        import google.adk  # noqa: F401
    except ImportError:
        raise TargetError(
            f"{scheme}:// needs google-adk: pip install 'sessionscope[adk]'"
        ) from None


def _path_of(uri: str) -> str:
    path = uri_path(uri)
    if not path:
        raise TargetError(f"{uri!r} names no path")
    return path


def open_target(uri: str) -> Target:
    """Open the target a URI names (see the module docstring)."""
    if not isinstance(uri, str) or "://" not in uri:
        raise TargetError(
            f"{uri!r} is not a target URI: use memory://, lmdb:///path, "
            "adk-memory://, adk-sqlite:///path, adk-database://URL or adk-lmdb:///path"
        )
    scheme, _, rest = uri.partition("://")
    if scheme in SCHEMES:
        try:
            return NativeTarget(uri)
        except ValueError as error:
            raise TargetError(str(error)) from None
    if scheme not in ADK_SCHEMES:
        raise TargetError(
            f"unknown target scheme {scheme!r} in {redact(uri)!r}; known: memory, lmdb, "
            + ", ".join(ADK_SCHEMES)
        )
    _need_adk(scheme)
    if scheme == "adk-memory":
        from google.adk.sessions import InMemorySessionService

        return AdkTarget(uri, InMemorySessionService())
    if scheme == "adk-sqlite":
        from google.adk.sessions.sqlite_session_service import SqliteSessionService

        return AdkTarget(uri, SqliteSessionService(_path_of(uri)))
    if scheme == "adk-database":
        from google.adk.sessions import DatabaseSessionService

        if not rest:
            raise TargetError(f"{uri!r} names no database URL")
        return AdkTarget(uri, DatabaseSessionService(rest))
    try:
        adk = importlib.import_module("sessionscope.adk")
    except ImportError as error:
        raise TargetError(f"adk-lmdb:// needs sessionscope's adk adapter: {error}") from None
    # A blank value is left out, as parse_qsl does by default.
    options = {name: text for name, text in query_pairs(uri) if text}
    unknown = set(options) - {"durability"}
    if unknown:
        raise TargetError(f"unknown adk-lmdb:// option(s) {sorted(unknown)}; known: durability")
    service = adk.LmdbSessionService(_path_of(uri), **options)
    return AdkTarget(uri, service)


# -- replay ----------------------------------------------------------------------


@dataclass
class ReplayResult:
    """What a replay did and how long each kind of call took."""

    target: str
    ops: int
    events: int
    elapsed_s: float
    latency: dict[str, LatencyStats]
    batch: int = 0
    problems: list[str] = field(default_factory=list)
    verified: bool = False
    truncated: bool = False
    append_s: float = 0.0

    @property
    def ops_per_s(self) -> float:
        """Return calls per second over the whole replay."""
        return self.ops / self.elapsed_s if self.elapsed_s else math.nan

    @property
    def events_per_s(self) -> float:
        """Return stored events per second of time spent appending."""
        return self.events / self.append_s if self.append_s else math.nan

    def to_dict(self) -> dict[str, Any]:
        """Return the result as a JSON-ready map."""
        return {
            "target": self.target,
            "ops": self.ops,
            "events": self.events,
            "batch": self.batch,
            "elapsed_s": self.elapsed_s,
            "ops_per_s": self.ops_per_s,
            "events_per_s": self.events_per_s,
            "append_s": self.append_s,
            "latency": {name: stats.to_dict() for name, stats in self.latency.items()},
            "truncated": self.truncated,
            "verified": self.verified,
            "problems": self.problems,
        }

    def format(self) -> str:
        """Return a human-readable report."""
        lines = [
            f"target   {self.target}"
            + (f"  (bulk path, batches of {self.batch})" if self.batch else ""),
            f"calls    {self.ops:,} in {self.elapsed_s:.2f} s: {self.ops_per_s:,.0f} calls/s",
            f"events   {self.events:,} stored: {self.events_per_s:,.0f} events/s of append time",
            "",
            render_table(
                [
                    "operation",
                    Column("count", True),
                    Column("p50 us", True),
                    Column("p90 us", True),
                    Column("p99 us", True),
                    Column("total s", True),
                ],
                [
                    [
                        name,
                        f"{stats.count:,}",
                        f"{stats.p50:.1f}",
                        f"{stats.p90:.1f}",
                        f"{stats.p99:.1f}",
                        f"{stats.total_s:.2f}",
                    ]
                    for name, stats in self.latency.items()
                ],
            ),
            "",
        ]
        if not self.verified:
            lines.append("verify   skipped")
        elif self.problems:
            shown = self.problems[:20]
            more = len(self.problems) - len(shown)
            lines.append(f"verify   FAILED: {len(self.problems)} problem(s)")
            lines.extend(f"  - {problem}" for problem in shown)
            if more:
                lines.append(f"  ... and {more} more")
        else:
            lines.append("verify   ok: final states and event counts match the trace")
        return "\n".join(lines)


def check_trace(records: Iterable[Mapping[str, Any]]) -> None:
    """Raise TraceError at the first record a replay refuses: before any target is opened.

    Each record is checked as a trace line is (``check_record``), and the
    sessions it names as a replay needs them: an append goes to a session
    the trace created and has not deleted, a create to one it has not, and
    an event id appended twice to a session holds the same content. The
    error names the record's position.
    """
    for _ in _checked(records):
        pass


def _checked(records: Iterable[Mapping[str, Any]]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Yield each record with its position once ``check_trace``'s checks passed it."""
    # The event records of each live session by id: one id twice with other
    # content is an append the service refuses.
    live: dict[Key, dict[str, Mapping[str, Any]]] = {}
    for number, record in enumerate(records, start=1):
        where = f"record {number}"
        check_record(record, where)
        op = record["op"]
        if op in ("get", "list"):
            yield where, record
            continue
        key = (record["app"], record["user"], record["session"])
        if op == "append":
            if key not in live:
                raise TraceError(f"{where}: append to a session the trace has not created")
            event_record = record["event"]
            if not event_record.get("partial"):  # a partial event is never stored
                seen = live[key].setdefault(event_record["id"], event_record)
                if seen != event_record:
                    raise TraceError(f"{where}: append of an event id stored with other content")
        elif op == "create":
            if key in live:
                raise TraceError(f"{where}: create of a session the trace created already")
            live[key] = {}
        else:  # delete
            live.pop(key, None)
        yield where, record


def _prepare(target: Target, records: Iterable[Mapping[str, Any]]) -> list[tuple[Any, ...]]:
    """Turn records into the target's calls, before the clock starts.

    The records are checked as ``check_trace`` checks them, and each event
    made as the target's; a record that fails is a TraceError naming its
    position.
    """
    calls: list[tuple[Any, ...]] = []
    for where, record in _checked(records):
        op = record["op"]
        if op == "append":
            key = (record["app"], record["user"], record["session"])
            delta = (record["event"].get("actions") or {}).get("state_delta")
            try:
                event = target.make_event(record["event"])
            except (TypeError, ValueError) as error:
                message = str(error).splitlines()[0] if str(error) else type(error).__name__
                raise TraceError(f"{where}: append's event is not one: {message}") from None
            shared = _shared_keys(key[0], key[1], delta)
            calls.append(("append", key, event, record["event"], shared,
                          bool(record.get("locked"))))  # fmt: skip
        elif op == "create":
            state = record.get("state")
            calls.append(("create", record["app"], record["user"], record["session"], state,
                          _shared_keys(record["app"], record["user"], state)))  # fmt: skip
        elif op == "get":
            calls.append(
                ("get", record["app"], record["user"], record["session"], record.get("config"))
            )
        elif op == "list":
            calls.append(("list", record["app"], record.get("user")))
        else:
            calls.append(("delete", record["app"], record["user"], record["session"]))
    return calls


def _shared_keys(
    app: str, user: str, state: Mapping[str, Any] | None
) -> frozenset[tuple[str, str | None, str]]:
    """Return the app and user map keys a delta or initial state sets: (app, user or None, key)."""
    if not state:
        return frozenset()
    return frozenset(
        (app, user if key.startswith(USER_PREFIX) else None, key)
        for key in state
        if key.startswith((APP_PREFIX, USER_PREFIX))
    )


def replay(
    target: Target,
    records: Sequence[Mapping[str, Any]],
    *,
    batch: int = 0,
    verify_result: bool = True,
    progress: bool = True,
    stream: IO[str] | None = None,
    on_append: Callable[[Key, int, int], None] | None = None,
    budget_s: float | None = None,
    keep_gc: bool = False,
) -> ReplayResult:
    """Replay trace records on a target; measure every call; verify the end state.

    ``batch`` > 1 sends runs of consecutive appends through the bulk path
    (``append_many``), timed per batch as ``append_batch``. ``on_append`` is
    called with (session key, events in the session before, latency ns) after
    every single append. With ``budget_s`` the replay stops after that many
    seconds, and only the calls replayed are verified. The cyclic garbage
    collector is paused during the timed loop unless ``keep_gc``.
    """
    calls = _prepare(target, records)
    try:
        with collector_paused(not keep_gc):
            return _replay(target, records, calls, batch, verify_result, progress, stream,
                           on_append, budget_s)  # fmt: skip
    except (DuplicateEventError, StateValueError) as error:
        # What the checks above let through and the service refuses is the
        # trace's, not the target's: a store that already holds the trace's
        # sessions stays an AlreadyExistsError.
        raise TraceError(f"the service refuses a call of the trace: {error}") from error


@contextlib.contextmanager
def collector_paused(pause: bool = True) -> Iterator[None]:
    """Pause the cyclic garbage collector for a timed run over prepared objects.

    A loaded trace (or a prepared workload) and the live sessions are the
    replayer's own objects, not the service under test: the collector's full
    passes over them take a third of a bulk replay. Reference counting still
    frees everything acyclic meanwhile; the collector runs once before.
    """
    gc.collect()
    paused = pause and gc.isenabled()
    if paused:
        gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()


def _replay(
    target: Target,
    records: Sequence[Mapping[str, Any]],
    calls: list[tuple[Any, ...]],
    batch: int,
    verify_result: bool,
    progress: bool,
    stream: IO[str] | None,
    on_append: Callable[[Key, int, int], None] | None,
    budget_s: float | None,
) -> ReplayResult:
    samples: dict[str, list[int]] = {}
    clock = time.perf_counter_ns
    bar = RichProgressBar(len(calls) if progress else 0, f"replay {target.name}", stream)
    stored = 0
    append_ns = 0
    lengths: dict[Key, int] = {}
    pending: list[tuple[Key, Any]] = []
    batch_samples = samples.setdefault("append_batch", []) if batch > 1 else []
    # One sample per batch: the batch's time over its size, an event's share.
    shares = samples.setdefault("append", []) if batch > 1 else []
    # Reads ride in the batch where the target can carry them: each is
    # answered as it stands at its place among the batch's appends. Their
    # round trips are the batch's, timed as append time; their own samples
    # ("get_in_batch") time only the decoding of their answers.
    reads_ride = batch > 1 and target.reads_in_batch
    placed: list[PlacedRead] = []
    # What a create sent ahead of the batch could change: the sessions and
    # maps the placed reads see, and the app and user keys the appends set.
    read_sessions: set[Key] = set()
    read_users: set[tuple[str, str]] = set()
    read_apps: set[str] = set()
    shared: set[tuple[str, str | None, str]] = set()

    def flush_batch() -> None:
        nonlocal append_ns
        start = clock()
        if placed:
            answers = target.append_many_reading(pending, placed)
        else:
            answers = []
            target.append_many(pending)
        spent = clock() - start
        append_ns += spent
        batch_samples.append(spent)
        if pending:
            shares.append(spent // len(pending))
        for answer in answers:
            start = clock()
            target.read_answer(answer)
            samples.setdefault("get_in_batch", []).append(clock() - start)
        pending.clear()
        placed.clear()
        read_sessions.clear()
        read_users.clear()
        read_apps.clear()
        shared.clear()

    def create_waits(app: str, user: str, sid: str, keys: frozenset[Any]) -> bool:
        """Tell whether a create changes what the batch reads or sets: then it waits for it."""
        if (app, user, sid) in read_sessions or not keys.isdisjoint(shared):
            return True
        return any(
            (app, user) in read_users if owner is not None else app in read_apps
            for _, owner, _ in keys
        )

    started = time.perf_counter()
    deadline = math.inf if budget_s is None else started + budget_s
    done = 0
    for done, call in enumerate(calls, start=1):
        op = call[0]
        if op == "append":
            partial = bool(call[3].get("partial"))
            if not partial:
                stored += 1
            if batch > 1:
                pending.append((call[1], call[2]))
                shared.update(call[4])
                if len(pending) >= batch:
                    flush_batch()
            else:
                start = clock()
                if call[5]:
                    target.append_locked(call[1], call[2])
                else:
                    target.append(call[1], call[2])
                spent = clock() - start
                append_ns += spent
                samples.setdefault("append", []).append(spent)
                if on_append is not None and not partial:
                    before = lengths.get(call[1], 0)
                    lengths[call[1]] = before + 1
                    on_append(call[1], before, spent)
        elif op == "get" and reads_ride:
            placed.append((len(pending), call[1], call[2], call[3], call[4]))
            read_sessions.add((call[1], call[2], call[3]))
            read_users.add((call[1], call[2]))
            read_apps.add(call[1])
        else:
            # A create that touches nothing the batch reads or writes goes
            # ahead of it: the batch goes on.
            if (pending or placed) and (
                op != "create" or create_waits(call[1], call[2], call[3], call[5])
            ):
                flush_batch()
            if op == "get":
                name = "get" if call[4] is None else "get_recent"
                start = clock()
                target.get(call[1], call[2], call[3], call[4])
            elif op == "create":
                name = "create"
                start = clock()
                target.create(call[1], call[2], call[3], call[4])
            elif op == "list":
                name = "list"
                start = clock()
                target.listing(call[1], call[2])
            else:
                name = "delete"
                start = clock()
                target.delete(call[1], call[2], call[3])
            samples.setdefault(name, []).append(clock() - start)
        if not done & 63:
            bar.update(done)
            if time.perf_counter() > deadline:
                break
    if pending or placed:
        flush_batch()
    target.flush()
    elapsed = time.perf_counter() - started
    bar.done = done
    bar.close()
    order = ["create", "append", "append_batch", "get", "get_recent", "get_in_batch", "list",
             "delete"]  # fmt: skip
    latency = {name: LatencyStats.of(samples[name]) for name in order if samples.get(name)}
    result = ReplayResult(target.name, done, stored, elapsed, latency, batch if batch > 1 else 0)
    result.append_s = append_ns / 1e9
    result.truncated = done < len(calls)
    if verify_result:
        result.problems = verify(target, Expectation.of(records[:done]))
        result.verified = True
    return result


def verify(target: Target, expected: Expectation, limit: int = 1000) -> list[str]:
    """Compare what a target holds with what a trace implies; return the differences.

    Checks every session the trace leaves: it is listed, its merged state
    (session, ``app:`` and ``user:`` keys) is the expected one and holds no
    ``temp:`` key, and it stores the expected number of events, ending with
    the expected one. Sessions the trace deleted must be gone.
    """
    problems: list[str] = []
    for app in sorted(expected.apps):
        listed = target.session_keys(app)
        wanted = {(user, sid) for (a, user, sid) in expected.sessions if a == app}
        for user, sid in sorted(wanted - listed):
            problems.append(f"{app}/{user}/{sid}: not listed")
        for user, sid in sorted(listed - wanted):
            problems.append(f"{app}/{user}/{sid}: listed, but the trace does not leave it")
        if len(problems) >= limit:
            return problems
    for (app, user, sid), session in sorted(expected.sessions.items()):
        name = f"{app}/{user}/{sid}"
        found = target.read(app, user, sid)
        if found is None:
            problems.append(f"{name}: missing")
            continue
        state, event_ids = found
        temp = sorted(k for k in state if k.startswith(TEMP_PREFIX))
        if temp:
            problems.append(f"{name}: temp keys stored: {temp}")
        want = expected.merged_state(app, user, sid)
        if state != want:
            problems.append(f"{name}: state differs: {_diff(want, state)}")
        if len(event_ids) != session.event_count:
            problems.append(
                f"{name}: {len(event_ids)} events stored, {session.event_count} expected"
            )
        elif event_ids and event_ids[-1] != session.last_event_id:
            problems.append(
                f"{name}: last event is {event_ids[-1]}, expected {session.last_event_id}"
            )
        if len(problems) >= limit:
            break
    return problems


def _diff(want: Mapping[str, Any], got: Mapping[str, Any]) -> str:
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    changed = sorted(k for k in set(want) & set(got) if want[k] != got[k])
    parts = []
    if missing:
        parts.append(f"missing {missing[:5]}")
    if extra:
        parts.append(f"unexpected {extra[:5]}")
    if changed:
        key = changed[0]
        parts.append(f"changed {changed[:5]} (e.g. {key!r}: {got[key]!r:.60} != {want[key]!r:.60})")
    return "; ".join(parts)


def replay_file(
    path: str | os.PathLike[str],
    uri: str,
    *,
    batch: int = 0,
    verify_result: bool = True,
    progress: bool = True,
) -> ReplayResult:
    """Load a trace file and replay it on the target a URI names."""
    _, records = load_trace(Path(path))
    target = open_target(uri)
    try:
        return replay(target, records, batch=batch, verify_result=verify_result, progress=progress)
    finally:
        target.close()
