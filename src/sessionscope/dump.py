"""A versioned, streaming dump of a store: every app, user, session and event, exactly.

A dump is a stream of msgpack arrays (gzip-compressed when the file name ends
in ``.gz``; reading detects gzip by its magic bytes):

    ["sessionscope-dump", FORMAT, {"app_name": ..., "user_id": ..., "created": t}]
    ["app", app_name, {key: packed value}]
    ["user", app_name, user_id, {key: packed value}]
    ["session", app_name, user_id, session_id, create_time, last_update_time,
     {key: packed value}, event_count]
    ["event", event_id, timestamp, record]          (event_count of them follow)
    ...
    ["end", {"apps", "users", "sessions", "events", "records"}, checksum]

State values stay the packed bytes a store keeps and events their stored
records, so every type (bytes included) comes back as it was. ``checksum`` is
the BLAKE2b (32 bytes) of the msgpack bytes of every record before the trailer,
header included. ``import_dump`` reads the whole dump once to check it (and
that no session in it conflicts with one stored) before writing anything; a
truncated, altered or newer dump is a ``DumpError`` and the store stays as it
was. Importing a dump twice is a no-op: equal sessions are skipped and state
keys are set to the values they already hold.
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from hashlib import blake2b
from pathlib import Path
from typing import Any, BinaryIO

import msgpack

from .codec import pack
from .errors import DumpError
from .ops import SessionChangedError, event_pages, session_records
from .outfile import output_file
from .stores.base import EventCopy, SessionCopy, SessionRecord, Store, copies_equal, event_copy

__all__ = ["DUMP_FORMAT", "DumpCounts", "export_dump", "import_dump", "read_copy"]

DUMP_FORMAT = 1
MAGIC = "sessionscope-dump"
_GZIP_MAGIC = b"\x1f\x8b"
# The largest single record (an event or a state map) a dump may hold.
_MAX_RECORD = 1 << 30


@dataclass(frozen=True, slots=True)
class DumpCounts:
    """How many of each thing a dump holds (or an export wrote)."""

    apps: int = 0
    users: int = 0
    sessions: int = 0
    events: int = 0


def read_copy(store: Store, app_name: str, user_id: str, session_id: str) -> SessionCopy | None:
    """Return a whole stored session as a copy (times, packed state, events); None if missing."""
    loaded = store.load_session(app_name, user_id, session_id, None, None)
    if loaded is None:
        return None
    return SessionCopy.of_record(
        loaded.record,
        [(key, pack(value)) for key, value in loaded.session_state.items()],
        [event_copy(event) for event in loaded.events],
    )


# -- export --------------------------------------------------------------


def export_dump(
    store: Store,
    out: str | os.PathLike[str],
    *,
    app_name: str | None = None,
    user_id: str | None = None,
    progress: Callable[[int], None] | None = None,
) -> DumpCounts:
    """Write every app state, user state, session and event of a store to ``out``.

    ``app_name`` limits the dump to one app, ``user_id`` to one user (of that
    app, or of every app); a dump limited to a user holds no app state. The
    file is written beside ``out`` (``out.partial``, new, mode 0600) and
    linked into place once complete; an existing ``out``, a missing parent
    directory or a path inside the store's directory is refused
    (``OutputPathError``) and nothing is left behind.
    ``progress(n)`` is called with the number of records just written.
    """
    for name, value in (("app_name", app_name), ("user_id", user_id)):
        if value is not None and (not isinstance(value, str) or not value):
            raise ValueError(f"{name} must be a non-empty str or None, not {value!r}")
    # Never into the directory of the store being read (its data.mdb, lock.mdb).
    home = getattr(store, "path", None)
    protect = [home] if isinstance(home, Path) else []
    with output_file(out, protect) as raw:
        writer = _Writer(raw, compress=Path(out).name.endswith(".gz"), progress=progress)
        writer.write([MAGIC, DUMP_FORMAT, {"app_name": app_name, "user_id": user_id}])
        # An app the store does not know gives an empty dump, not an empty app.
        apps = [app for app in store.list_apps() if app_name is None or app == app_name]
        for app in apps:
            users = store.list_users(app)
            if user_id is not None:
                users = [user for user in users if user == user_id]
            if user_id is None:
                writer.app(app, store.read_app_state(app))
            for user in users:
                writer.user(app, user, store.read_user_state(app, user))
                # A page of records and a page of events at a time: memory
                # stays bounded however many sessions and events there are.
                for record in session_records(store, app, user):
                    _write_session(writer, store, record)
        writer.finish()
    return writer.counts()


def _write_session(writer: _Writer, store: Store, listed: SessionRecord) -> None:
    """Write one session: its record and state, then its events a page at a time."""
    head = store.load_session(listed.app_name, listed.user_id, listed.session_id, 0, None)
    if head is None:  # deleted meanwhile
        return
    record = head.record
    items = [(key, pack(value)) for key, value in head.session_state.items()]
    writer.session(SessionCopy.of_record(record, items, []), record.stored_count)
    written = 0
    for events in event_pages(store, record):
        writer.events([event_copy(event) for event in events])
        written += len(events)
    if written != record.stored_count:
        raise SessionChangedError(
            f"session {record.app_name}/{record.user_id}/{record.session_id} counts "
            f"{record.stored_count} events, {written} were read",
            hint="the store changed or is damaged: run `sessionscope verify`, then export again",
        )


class _Writer:
    """Write records to a (possibly gzipped) file, hashing and counting as it goes."""

    def __init__(
        self, raw: BinaryIO, *, compress: bool, progress: Callable[[int], None] | None
    ) -> None:
        self._raw = raw
        self._file: BinaryIO = gzip.GzipFile(fileobj=raw, mode="wb") if compress else raw  # type: ignore[assignment]
        self._hash = blake2b(digest_size=32)
        self._progress = progress
        self._apps: set[str] = set()
        self._users = 0
        self._sessions = 0
        self._events = 0
        self._records = 0

    def write(self, record: list[Any]) -> None:
        data = pack(record)
        self._hash.update(data)
        self._file.write(data)
        self._records += 1

    def app(self, app_name: str, state: dict[str, Any]) -> None:
        self.write(["app", app_name, {key: pack(value) for key, value in state.items()}])
        self._apps.add(app_name)
        self._tick(1)

    def user(self, app_name: str, user_id: str, state: dict[str, Any]) -> None:
        self.write(["user", app_name, user_id, {key: pack(v) for key, v in state.items()}])
        self._apps.add(app_name)
        self._users += 1
        self._tick(1)

    def session(self, copy: SessionCopy, count: int) -> None:
        """Write a session's record; its ``count`` events follow (``events``)."""
        self.write(
            [
                "session",
                copy.app_name,
                copy.user_id,
                copy.session_id,
                copy.create_time,
                copy.last_update_time,
                dict(copy.session_items),
                count,
            ]
        )
        self._sessions += 1
        self._tick(1)

    def events(self, events: list[EventCopy]) -> None:
        for event in events:
            self.write(["event", event.event_id, event.timestamp, event.record])
        self._events += len(events)
        self._tick(len(events))

    def _tick(self, records: int) -> None:
        if self._progress is not None:
            self._progress(records)

    def counts(self) -> DumpCounts:
        return DumpCounts(len(self._apps), self._users, self._sessions, self._events)

    def finish(self) -> None:
        counts = self.counts()
        trailer = {
            "apps": counts.apps,
            "users": counts.users,
            "sessions": counts.sessions,
            "events": counts.events,
            "records": self._records,
        }
        self._file.write(pack(["end", trailer, self._hash.digest()]))
        if self._file is not self._raw:
            self._file.close()  # ends the gzip stream; the raw file stays open


# -- import --------------------------------------------------------------


def import_dump(
    store: Store,
    source: str | os.PathLike[str],
    *,
    progress: Callable[[int], None] | None = None,
) -> DumpCounts:
    """Import a dump into a store; return the counts the dump holds.

    A first streaming pass checks the whole dump (header, format, every
    record, trailer counts and checksum) and that none of its sessions
    conflicts with a stored one; only then is anything written. Sessions
    already stored and equal are skipped, so importing twice is a no-op.
    ``progress(n)`` is called with the number of records just imported.
    """
    path = Path(source)
    counts = _check(store, path)
    for item in _items(path):
        if item[0] == "app":
            store.write_app_state(item[1], item[2]).result()
            handled = 1
        elif item[0] == "user":
            store.write_user_state(item[1], item[2], item[3]).result()
            handled = 1
        else:
            copy: SessionCopy = item[1]
            store.restore_session(copy).result()
            handled = 1 + len(copy.events)
        if progress is not None:
            progress(handled)
    return counts


def _check(store: Store, path: Path) -> DumpCounts:
    """Read the whole dump once; refuse it, with what is wrong, before anything is written."""
    apps: set[str] = set()
    users = sessions = events = 0
    for item in _items(path):
        if item[0] == "app":
            apps.add(item[1])
        elif item[0] == "user":
            apps.add(item[1])
            users += 1
        else:
            copy: SessionCopy = item[1]
            sessions += 1
            events += len(copy.events)
            stored = read_copy(store, copy.app_name, copy.user_id, copy.session_id)
            if stored is not None and not copies_equal(stored, copy):
                raise DumpError(
                    f"{path}: session {copy.session_id!r} of user {copy.user_id!r} in app "
                    f"{copy.app_name!r} is stored with other content; nothing was imported"
                )
    return DumpCounts(len(apps), users, sessions, events)


def _items(path: Path) -> Iterator[tuple[Any, ...]]:
    """Yield ("app", app, items), ("user", app, user, items) and ("session", copy).

    Everything is checked while it streams: the header first, the trailer's
    counts and checksum last; a dump that fails is a DumpError.
    """
    reader = _Reader(path)
    try:
        header = reader.next("the header")
        if not (isinstance(header, list) and len(header) == 3 and header[0] == MAGIC):
            raise reader.error("is not a sessionscope dump")
        version = header[1]
        if not isinstance(version, int) or isinstance(version, bool):
            raise reader.error("has no valid format version")
        if version > DUMP_FORMAT:
            raise reader.error(
                f"has format {version}; this version reads up to {DUMP_FORMAT} "
                "(upgrade sessionscope)"
            )
        sessions = events = users = 0
        app_names: set[str] = set()
        while True:
            record = reader.next("a record or the trailer")
            kind = record[0] if isinstance(record, list) and record else None
            if kind == "end":
                _check_trailer(reader, record, app_names, users, sessions, events)
                return
            if kind == "app" and _shape(record, str, str, dict):
                app_names.add(record[1])
                yield ("app", record[1], _items_of(reader, record[2]))
            elif kind == "user" and _shape(record, str, str, str, dict):
                app_names.add(record[1])
                users += 1
                yield ("user", record[1], record[2], _items_of(reader, record[3]))
            elif kind == "session" and _shape(record, str, str, str, str, float, float, dict, int):
                _, app, user, sid, created, updated, state, count = record
                copy = SessionCopy(app, user, sid, created, updated, _items_of(reader, state))
                for _ in range(count):
                    event = reader.next("an event")
                    if not (
                        isinstance(event, list)
                        and event[:1] == ["event"]
                        and _shape(event, str, str, float, bytes)
                    ):
                        raise reader.error(f"has a bad event record in session {sid!r}")
                    try:
                        stored_id = event_copy(event[3], event[2]).event_id
                    except Exception:
                        stored_id = None
                    if stored_id != event[1]:
                        raise reader.error(f"has an event record that does not match in {sid!r}")
                    copy.events.append(EventCopy(event[1], event[2], event[3]))
                sessions += 1
                events += count
                app_names.add(app)
                yield ("session", copy)
            else:
                raise reader.error(f"has a record it cannot read: {str(record)[:80]}")
    finally:
        reader.close()


def _shape(record: list[Any], *types: type) -> bool:
    """Tell whether a record has exactly these field types (bool is not an int here)."""
    return len(record) == len(types) and all(
        isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        for value, kind in zip(record, types, strict=True)
    )


def _items_of(reader: _Reader, mapping: dict[Any, Any]) -> list[tuple[str, bytes]]:
    items = list(mapping.items())
    for key, value in items:
        if not isinstance(key, str) or not isinstance(value, bytes):
            raise reader.error("has a state map that is not str -> packed bytes")
        try:
            msgpack.unpackb(value, raw=False, strict_map_key=True)
        except Exception:
            raise reader.error(f"has a state value under {key!r} that does not decode") from None
    return items


def _check_trailer(
    reader: _Reader, record: list[Any], apps: set[str], users: int, sessions: int, events: int
) -> None:
    if not _shape(record, str, dict, bytes):
        raise reader.error("has a bad trailer")
    digest = reader.digest()
    counts = record[1]
    expected = {
        "apps": len(apps),
        "users": users,
        "sessions": sessions,
        "events": events,
        "records": reader.records - 1,
    }
    if counts != expected:
        raise reader.error(f"holds {expected} but its trailer says {counts}")
    if record[2] != digest:
        raise reader.error("fails its checksum: it was altered")
    if reader.more():
        raise reader.error("has data after its trailer")


class _Reader:
    """Read msgpack records from a dump file, hashing each one but the trailer."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            raw = open(path, "rb")  # noqa: SIM115 - closed in close()
        except OSError as error:
            raise DumpError(f"cannot read {path}: {error.strerror}") from None
        self._raw = raw
        self._file: BinaryIO = raw
        if raw.read(2) == _GZIP_MAGIC:
            raw.seek(0)
            self._file = gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[assignment]
        else:
            raw.seek(0)
        self._unpacker = msgpack.Unpacker(
            self._file,
            raw=False,
            strict_map_key=True,
            max_buffer_size=_MAX_RECORD,
        )
        self._hash = blake2b(digest_size=32)
        self._last: bytes | None = None
        self.records = 0

    def error(self, what: str) -> DumpError:
        return DumpError(f"{self.path} {what}; nothing was imported")

    def next(self, expected: str) -> Any:
        """Return the next record; the one before it joins the checksum."""
        try:
            record = next(self._unpacker)
        except StopIteration:
            raise self.error(f"ends early, where {expected} should be: it is truncated") from None
        except (ValueError, msgpack.UnpackException, OSError, EOFError) as error:
            raise self.error(f"is damaged ({error})") from None
        if self._last is not None:
            self._hash.update(self._last)
        self._last = pack(record)
        self.records += 1
        return record

    def digest(self) -> bytes:
        """Return the checksum of every record before the last one read (the trailer)."""
        return self._hash.digest()

    def more(self) -> bool:
        try:
            next(self._unpacker)
        except StopIteration:
            return False
        except (ValueError, msgpack.UnpackException, OSError, EOFError):
            return True
        return True

    def close(self) -> None:
        self._file.close()
        self._raw.close()
