"""Session traces: a versioned JSONL record of session-service calls.

A trace is a text file, one JSON object per line (gzip-compressed when the name
ends in ``.gz``). The first line is the header::

    {"format": "sessionscope-trace", "version": 1, "generator": {...}, "counts": {...}}

Every other line is one call, with ``op`` one of:

- ``create``: ``app``, ``user``, ``session``, ``state`` (may hold every scope)
- ``append``: ``app``, ``user``, ``session``, ``event`` (the full event record:
  ``id``, ``timestamp``, ``author``, ``invocation_id``, ``content`` as a
  google.genai ``Content`` dict, ``actions.state_delta``, ...), and
  optionally ``"locked": true``: the append of a second writer of the session,
  sent through ``append_event_locked`` where the target has it
- ``get``: ``app``, ``user``, ``session``, ``config`` (``null`` or
  ``{"num_recent_events": n, "after_timestamp": t}``)
- ``list``: ``app``, ``user`` (``null`` lists the whole app)
- ``delete``: ``app``, ``user``, ``session``

Values that JSON cannot hold are tagged: bytes as ``{"$bytes": base64}``. A map
whose only key starts with ``$`` is wrapped as ``{"$map": {...}}`` so that a
stored value can never be mistaken for a tag.

The module also holds the ``Expectation`` a trace implies (final states and
event counts) and ``export_trace``, which writes any store's sessions as a
trace. The generator of agent traffic is ``mix``.
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import heapq
import io
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from ..admin.outfile import output_file
from ..codec import check_event_values
from ..core import APP_PREFIX, MAX_DEPTH, TEMP_PREFIX, USER_PREFIX, check_delta, check_storable
from ..model import GetSessionConfig
from ..service.core import check_app_name, check_id, check_session_id, event_to_record
from ..service.facade import SyncSessionService

__all__ = [
    "FORMAT",
    "OPS",
    "VERSION",
    "Expectation",
    "SessionExpectation",
    "TraceError",
    "check_record",
    "decode_value",
    "encode_value",
    "export_trace",
    "read_trace",
    "sample_trace_path",
    "write_trace",
]

FORMAT = "sessionscope-trace"
VERSION = 1
OPS = ("create", "append", "get", "list", "delete")
# The longest line a trace may hold, in characters: reading refuses a longer
# one before parsing it (an event of a real session is far smaller).
MAX_LINE_CHARS = 32 << 20
_CONFIG_KEYS = ("num_recent_events", "after_timestamp")
_SESSION_OPS = ("create", "append", "get", "delete")


class TraceError(ValueError):
    """A trace file is malformed, of another format, or of an unknown version."""


# -- values ----------------------------------------------------------------


def encode_value(value: Any) -> Any:
    """Return ``value`` with bytes (and tag-like maps) made JSON-safe."""
    # Plain loops, not comprehensions: one frame per level of nesting, so
    # that a value as deep as the service stores fits the interpreter's stack.
    if isinstance(value, (str, int, float)) or value is None:
        return value
    if isinstance(value, dict):
        encoded = {}
        for key, item in value.items():
            encoded[key] = encode_value(item)
        if len(value) == 1 and next(iter(value)).startswith("$"):
            return {"$map": encoded}
        return encoded
    if isinstance(value, (list, tuple)):
        items = []
        for item in value:
            items.append(encode_value(item))
        return items
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"$bytes": base64.b64encode(bytes(value)).decode("ascii")}
    raise TypeError(f"{type(value).__name__} cannot be written to a trace")


def decode_value(value: Any) -> Any:
    """Return the value ``encode_value`` encoded; TraceError for a tag that holds no such value.

    Nesting deeper than the service stores (``core.MAX_DEPTH`` below a
    record's own levels) is refused before it can exhaust the interpreter's
    stack.
    """
    try:
        return _decode(value, 0)
    except RecursionError:
        raise TraceError(f"a value is nested too deeply (over {MAX_DEPTH} levels)") from None


# The levels of a record above the values the service bounds: the record,
# its event, the event's actions and their state delta. The service checks
# each value from itself, so a record may be this much deeper as a whole.
_RECORD_LEVELS = 4


def _decode(value: Any, depth: int) -> Any:
    # Plain loops, not comprehensions: one frame per level of nesting.
    if depth > MAX_DEPTH + _RECORD_LEVELS:
        raise TraceError(f"a value is nested too deeply (over {MAX_DEPTH} levels)")
    if isinstance(value, dict):
        if len(value) == 1:
            ((key, item),) = value.items()
            if key == "$bytes":
                if not isinstance(item, str):
                    raise TraceError(f'"$bytes" holds a {type(item).__name__}, not base64 text')
                try:
                    return base64.b64decode(item, validate=True)
                except ValueError:
                    raise TraceError('"$bytes" holds text that is not base64') from None
            if key == "$map":
                if not isinstance(item, dict):
                    raise TraceError(f'"$map" holds a {type(item).__name__}, not an object')
                value = item
        decoded = {}
        for key, item in value.items():
            decoded[key] = _decode(item, depth + 1)
        return decoded
    if isinstance(value, list):
        items = []
        for item in value:
            items.append(_decode(item, depth + 1))
        return items
    return value


def _needs_decoding(line: str) -> bool:
    # Most lines hold no tag at all: skip the recursive walk for them.
    return '"$' in line


# -- reading and writing -----------------------------------------------------


def _open_text(path: str | Path, mode: str) -> IO[str]:
    if str(path).endswith(".gz"):
        return io.TextIOWrapper(gzip.GzipFile(path, mode + "b"), encoding="utf-8", newline="\n")
    return open(path, mode, encoding="utf-8", newline="\n")


def make_header(**fields: Any) -> dict[str, Any]:
    """Return a trace header carrying ``fields`` besides the format and version."""
    return {"format": FORMAT, "version": VERSION, **fields}


def check_header(header: object, where: str = "trace") -> dict[str, Any]:
    """Return a valid header, or raise TraceError saying what is wrong."""
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise TraceError(f"{where} is not a sessionscope trace: its first line has no "
                         f'"format": "{FORMAT}" header')  # fmt: skip
    version = header.get("version")
    if version != VERSION:
        raise TraceError(
            f"{where} is a sessionscope trace of version {version!r}; this version of "
            f"sessionscope reads version {VERSION} only"
        )
    return header


def write_trace(
    path: str | Path,
    records: Iterable[Mapping[str, Any]],
    header: Mapping[str, Any] | None = None,
    protect: Iterable[Path] = (),
) -> int:
    """Write a header and records as a new trace file; return the number of records.

    The file is created as ``outfile.output_file`` creates it: an existing
    ``path`` or a missing directory is an ``OutputPathError``, and so is a
    path inside one of the ``protect`` directories.
    """
    head = make_header(
        **{k: v for k, v in (header or {}).items() if k not in ("format", "version")}
    )
    count = 0
    # A new file, owner-only, whole or not at all (see outfile.output_file).
    with output_file(path, protect) as raw:
        # No name and no time in the gzip header: the same records give the same bytes.
        gz = str(path).endswith(".gz")
        packed = gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) if gz else raw
        file = io.TextIOWrapper(packed, encoding="utf-8", newline="\n")
        try:
            file.write(_dumps(head))
            file.write("\n")
            for record in records:
                file.write(dump_record(record))
                file.write("\n")
                count += 1
        except BaseException:
            # Interrupted: let go of the wrappers while the raw file is open,
            # or their clean-up runs later, against a closed file, and prints.
            with contextlib.suppress(Exception):
                _let_go(file, packed, raw)
            raise
        _let_go(file, packed, raw)
    return count


def _let_go(file: io.TextIOWrapper, packed: Any, raw: Any) -> None:
    """Flush the text and end the gzip stream, leaving ``raw`` open to its owner."""
    file.detach()
    if packed is not raw:
        packed.close()


def _dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def dump_record(record: Mapping[str, Any]) -> str:
    """Return the JSON line of one record (no newline)."""
    return _dumps(encode_value(dict(record)))


def read_trace(path: str | Path) -> tuple[dict[str, Any], Iterator[dict[str, Any]]]:
    """Return a trace's header and an iterator over its records.

    The header is read and checked at once; the records are read lazily and
    each is checked for everything a replay needs (``check_record``), a bad
    line raising TraceError with its line number. A line is read at most
    ``MAX_LINE_CHARS`` at a time, so a huge line costs bounded memory.
    """
    name = str(path)
    try:
        file = _open_text(path, "r")
    except FileNotFoundError:
        raise TraceError(f"trace file {name} does not exist") from None
    except OSError as error:
        raise TraceError(f"cannot read trace file {name}: {error}") from None
    try:
        first = _line(file, name, 1)
        if not first.strip():
            raise TraceError(f"{name} is empty: a trace starts with a header line")
        try:
            header = _loads(first)
        except TraceError:
            raise TraceError(f"{name} is not a sessionscope trace: line 1 is not JSON") from None
        check_header(header, name)
    except BaseException:
        file.close()
        raise
    return header, _records(file, name)


def _line(file: IO[str], name: str, number: int) -> str:
    """Return the next line, refusing one over the limit before holding it whole."""
    try:
        line = file.readline(MAX_LINE_CHARS + 1)
    except (OSError, EOFError, UnicodeDecodeError) as error:
        raise TraceError(f"{name}:{number}: cannot be read ({error})") from None
    if len(line) > MAX_LINE_CHARS:
        raise TraceError(f"{name}:{number}: longer than {MAX_LINE_CHARS:,} characters")
    return line


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _loads(line: str) -> Any:
    """Parse a JSON line; TraceError for anything Python's parser refuses or cannot nest."""
    try:
        return json.loads(line, parse_constant=_refuse_constant)
    except json.JSONDecodeError as error:
        raise TraceError(f"not JSON ({error.msg})") from None
    except (ValueError, RecursionError) as error:
        what = "nested too deeply" if isinstance(error, RecursionError) else str(error)
        raise TraceError(f"not JSON a trace can hold ({what})") from None


def _records(file: IO[str], name: str) -> Iterator[dict[str, Any]]:
    with file:
        number = 1
        while True:
            number += 1
            line = _line(file, name, number)
            if not line:
                return
            if not line.strip():
                continue
            try:
                record = _loads(line)
                if _needs_decoding(line):
                    record = decode_value(record)
            except TraceError as error:
                raise TraceError(f"{name}:{number}: {error}") from None
            check_record(record, f"{name}:{number}")
            yield record


def check_record(record: Any, where: str = "record") -> None:
    """Raise TraceError unless a record holds what a replay of it needs, of the right types.

    Ids are checked as the service checks them (the app a store keeps its
    encryption marker under is refused); a value the service would refuse
    for its content (not its type) is the service's to refuse.
    """
    if not isinstance(record, dict):
        raise TraceError(f"{where}: a record must be a JSON object")
    try:
        # Every value of a record goes to the service: refuse here what it
        # would (nesting over core.MAX_DEPTH, a lone surrogate, a huge int),
        # each value bounded from itself as the service bounds it.
        for name, value in record.items():
            if name == "event" and isinstance(value, dict):
                check_event_values(value, "record['event']")
            elif name == "state" and isinstance(value, dict):
                check_delta(value, "record['state']")
            else:
                check_storable({name: value}, "record")
    except (TypeError, ValueError) as error:
        raise TraceError(f"{where}: {error}") from None
    op = record.get("op")
    if op not in OPS:
        raise TraceError(f"{where}: unknown op {_short(op)}; known: {', '.join(OPS)}")
    try:
        check_app_name(record.get("app"), "app")
        if op in _SESSION_OPS:
            check_id(record.get("user"), "user")
            session = record.get("session")
            if check_session_id(session) != session:
                raise ValueError("session has surrounding whitespace")
        elif record.get("user") is not None:
            check_id(record["user"], "user")
    except ValueError as error:
        raise TraceError(f"{where}: {op} needs a valid app, user and session: {error}") from None
    if op == "create":
        _need_map(record.get("state"), f"{where}: create's state", optional=True)
    elif op == "append":
        event: dict[str, Any] = _need_map(record.get("event"), f"{where}: append's event")
        if not isinstance(event.get("id"), str) or not event["id"]:
            raise TraceError(f"{where}: append's event needs an id (a non-empty string)")
        stamp = event.get("timestamp", 0.0)
        if isinstance(stamp, bool) or not isinstance(stamp, (int, float)):
            raise TraceError(f"{where}: append's event.timestamp must be a number")
        if not isinstance(record.get("locked", False), bool):
            raise TraceError(f"{where}: append's locked must be true or false")
        actions = event.get("actions")
        _need_map(actions, f"{where}: append's event.actions", optional=True)
        if actions:
            _need_map(actions.get("state_delta"), f"{where}: event.actions.state_delta", True)
    elif op == "get":
        config = record.get("config")
        _need_map(config, f"{where}: get's config", optional=True)
        if config:
            unknown = sorted(set(config) - set(_CONFIG_KEYS))
            if unknown:
                raise TraceError(f"{where}: get's config has unknown key {_short(unknown[0])}")
            try:
                GetSessionConfig(**config)
            except (TypeError, ValueError) as error:
                raise TraceError(f"{where}: get's config: {error}") from None


def _need_map(value: Any, what: str, optional: bool = False) -> Any:
    """Return a value that is a JSON object (or None where optional); TraceError otherwise."""
    if isinstance(value, dict) or (optional and value is None):
        return value
    raise TraceError(f"{what} must be an object, not {type(value).__name__}")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:80] + "..."


def load_trace(path: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Return a trace's header and all its records."""
    header, records = read_trace(path)
    return header, list(records)


def sample_trace_path() -> Path:
    """Return the path of the small sample trace shipped with the package."""
    return Path(__file__).parents[1] / "data" / "sample_trace.jsonl"


# -- what a trace implies ----------------------------------------------------


@dataclass(slots=True)
class SessionExpectation:
    """What a session must hold after a trace: its own state and its events."""

    state: dict[str, Any] = field(default_factory=dict)
    event_count: int = 0
    last_event_id: str | None = None
    event_ids: set[str] = field(default_factory=set)


@dataclass
class Expectation:
    """The final state of every app, user and session a trace touches."""

    sessions: dict[tuple[str, str, str], SessionExpectation] = field(default_factory=dict)
    app_state: dict[str, dict[str, Any]] = field(default_factory=dict)
    user_state: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    apps: set[str] = field(default_factory=set)

    def _apply(self, app: str, user: str, delta: Mapping[str, Any], own: dict[str, Any]) -> None:
        for key, value in delta.items():
            if key.startswith(APP_PREFIX):
                self.app_state.setdefault(app, {})[key[len(APP_PREFIX) :]] = value
            elif key.startswith(USER_PREFIX):
                self.user_state.setdefault((app, user), {})[key[len(USER_PREFIX) :]] = value
            elif not key.startswith(TEMP_PREFIX):
                own[key] = value

    def feed(self, record: Mapping[str, Any]) -> None:
        """Account for one trace record."""
        op = record["op"]
        app = record["app"]
        self.apps.add(app)
        if op == "create":
            key = (app, record["user"], record["session"])
            expected = SessionExpectation()
            self.sessions[key] = expected
            self._apply(app, record["user"], record.get("state") or {}, expected.state)
        elif op == "append":
            event = record["event"]
            if event.get("partial"):
                return
            key = (app, record["user"], record["session"])
            found = self.sessions.get(key)
            if found is None or event["id"] in found.event_ids:
                return
            delta = (event.get("actions") or {}).get("state_delta") or {}
            self._apply(app, record["user"], delta, found.state)
            found.event_count += 1
            found.last_event_id = event["id"]
            found.event_ids.add(event["id"])
        elif op == "delete":
            self.sessions.pop((app, record["user"], record["session"]), None)

    @classmethod
    def of(cls, records: Iterable[Mapping[str, Any]]) -> Expectation:
        """Return what a trace's records imply."""
        expectation = cls()
        for record in records:
            expectation.feed(record)
        return expectation

    def merged_state(self, app: str, user: str, session: str) -> dict[str, Any]:
        """Return the state a read of the session must show (prefixed shared keys)."""
        state = dict(self.sessions[(app, user, session)].state)
        for name, value in self.app_state.get(app, {}).items():
            state[APP_PREFIX + name] = value
        for name, value in self.user_state.get((app, user), {}).items():
            state[USER_PREFIX + name] = value
        return state

    @property
    def event_count(self) -> int:
        """Return the number of events stored at the end, over every session."""
        return sum(s.event_count for s in self.sessions.values())


# -- the exporter ------------------------------------------------------------


def export_trace(store: Any, app_name: str, path: str | Path, user_id: str | None = None) -> int:
    """Write the sessions of an app (or one user) in ``store`` as a trace; return records.

    Creates and appends are merged in time order. A create carries the state
    the events' deltas do not explain: a session's initial keys, and for the
    first session of an app or user the shared keys that no exported event
    sets (those written at a create, or by a session deleted since).
    """
    service = SyncSessionService(store)
    metas = []
    cursor: str | None = None
    while True:
        page = service.list_sessions(app_name=app_name, user_id=user_id, limit=1000, cursor=cursor)
        metas.extend(page.sessions)
        cursor = page.next_cursor
        if cursor is None:
            break
    sessions = []
    for meta in sorted(metas, key=lambda m: (m.create_time, m.user_id, m.id)):
        session = service.get_session(app_name=app_name, user_id=meta.user_id, session_id=meta.id)
        if session is not None:
            sessions.append((meta.create_time, session))
    explained_app: set[str] = set()
    explained_user: dict[str, set[str]] = {}
    timelines = []
    for order, (created, session) in enumerate(sessions):
        records = [event_to_record(event) for event in session.events]
        set_keys = {k for r in records for k in (r.get("actions") or {}).get("state_delta", {})}
        explained_app.update(k for k in set_keys if k.startswith(APP_PREFIX))
        explained_user.setdefault(session.user_id, set()).update(
            k for k in set_keys if k.startswith(USER_PREFIX)
        )
        timelines.append((order, created, session, records, set_keys))
    seen_users: set[str] = set()
    streams: list[list[tuple[float, int, int, dict[str, Any]]]] = []
    for order, created, session, records, set_keys in timelines:
        state = {}
        for key, value in session.state.items():
            if key.startswith(APP_PREFIX):
                if order == 0 and key not in explained_app:
                    state[key] = value
            elif key.startswith(USER_PREFIX):
                if session.user_id not in seen_users and key not in explained_user[session.user_id]:
                    state[key] = value
            elif key not in set_keys:
                state[key] = value
        seen_users.add(session.user_id)
        ids = {"app": app_name, "user": session.user_id, "session": session.id}
        # heapq.merge needs each stream sorted: a session's calls keep their order,
        # placed at the running maximum of their times (a replay creates sessions
        # at the wall clock, after the traced event timestamps).
        stamps = [float(record["timestamp"]) for record in records]
        at = min([created, *stamps[:1]])
        stream = [(at, order, 0, {"op": "create", **ids, "state": state})]
        for seq, (stamp, record) in enumerate(zip(stamps, records, strict=True), start=1):
            at = max(at, stamp)
            stream.append((at, order, seq, {"op": "append", **ids, "event": record}))
        streams.append(stream)
    merged = (item[3] for item in heapq.merge(*streams, key=lambda item: item[:3]))
    header = {"generator": {"name": "sessionscope-export", "app": app_name, "user": user_id}}
    # Never into the directory of the store being read.
    home = getattr(store, "path", None)
    return write_trace(path, merged, header, [home] if isinstance(home, Path) else [])
