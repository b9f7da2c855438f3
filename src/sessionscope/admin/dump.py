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

A dump comes from outside: it is checked for everything the service would
refuse (ids, keys in the wrong scope, times that are not finite, events whose
record says another id or time, state values that are not storable), and
read within per-record limits, so that refusing any file costs bounded memory
and time: one record is at most ``MAX_RECORD_BYTES`` of msgpack, one state
map at most ``MAX_STATE_KEYS`` keys, one value at most ``core.MAX_DEPTH``
levels deep; an export refuses a store with a record over them.
"""

from __future__ import annotations

import gzip
import logging
import os
import sys
from collections.abc import Callable, Generator
from dataclasses import dataclass, replace
from hashlib import blake2b
from pathlib import Path
from typing import Any, BinaryIO

import msgpack

from ..codec import check_event_values, decode_event, pack, unpack
from ..core import TEMP_PREFIX, Scope, check_storable, scope_of
from ..errors import DumpError
from ..service.core import check_app_name, check_id, check_session_id
from ..stores.protocol import Store
from ..stores.records import (
    ENCRYPTION_MARKER_APP,
    EventCopy,
    Items,
    SessionCopy,
    SessionRecord,
    copies_equal,
    event_copy,
)
from ..stores.rules import check_copy, finite_float
from .ops import SessionChangedError, event_pages, session_records
from .outfile import output_file

_log = logging.getLogger(__name__)

__all__ = [
    "DUMP_FORMAT",
    "MAX_RECORD_BYTES",
    "MAX_STATE_KEYS",
    "DumpCounts",
    "check_dump",
    "export_dump",
    "holds_only_dump",
    "import_dump",
    "read_copy",
]

DUMP_FORMAT = 1
# The formats this version reads.
_KNOWN_FORMATS = (1,)
MAGIC = "sessionscope-dump"
_GZIP_MAGIC = b"\x1f\x8b"
# The largest single record (an event, or a session with its state map) a
# dump may hold, in msgpack bytes: reading stops at the first record over it,
# before it is held whole (refusing one costs about twice this in memory, the
# reader's buffer growing), and an export refuses to write one.
MAX_RECORD_BYTES = 32 << 20
# The most keys one state map of a dump may hold.
MAX_STATE_KEYS = 1 << 20
# The longest record array: a session record has 8 fields.
_MAX_FIELDS = 16


@dataclass(frozen=True, slots=True)
class DumpCounts:
    """How many of each thing a dump holds (or an export wrote).

    An import also says how many of the dump's sessions (and their events)
    it skipped, because an equal copy was already stored: importing a dump
    a second time skips them all. Into an encrypted store, it says how many
    user and app state values it left out (``erased_values``): values
    sealed under data keys erased since the dump was made, of users (or
    apps) who came back meanwhile, which no one could read and which would
    make their new state unreadable.
    """

    apps: int = 0
    users: int = 0
    sessions: int = 0
    events: int = 0
    skipped_sessions: int = 0
    skipped_events: int = 0
    erased_values: int = 0


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
    # An encrypted store's dump holds its ciphertext, its marker first.
    store, marker = _ciphertext_of(store)
    with output_file(out, protect) as raw:
        writer = _Writer(raw, compress=Path(out).name.endswith(".gz"), progress=progress)
        writer.write([MAGIC, DUMP_FORMAT, {"app_name": app_name, "user_id": user_id}])
        if marker:
            writer.app(ENCRYPTION_MARKER_APP, marker)
        # An app the store does not know gives an empty dump, not an empty app.
        apps = [
            app
            for app in store.list_apps()
            if (app_name is None or app == app_name) and app != ENCRYPTION_MARKER_APP
        ]
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
        if len(data) > MAX_RECORD_BYTES:
            # Refused now rather than by every import of the dump.
            what = " ".join(repr(field)[:80] for field in record[:4] if isinstance(field, str))
            raise DumpError(
                f"cannot dump {what}: its record is {len(data):,} bytes, over the "
                f"{MAX_RECORD_BYTES:,} a dump holds"
            )
        self._hash.update(data)
        self._file.write(data)
        self._records += 1

    def app(self, app_name: str, state: dict[str, Any]) -> None:
        self.write(["app", app_name, {key: pack(value) for key, value in state.items()}])
        if app_name != ENCRYPTION_MARKER_APP:  # the encryption marker is not an app
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
    target = _import_target(store, path)
    # A dump of an encrypted store goes below it as ciphertext: see _Erased.
    erased = _Erased(_encrypted_store(store)) if target is not store else None
    store = target
    counts = _check(store, path)
    skipped_sessions = skipped_events = 0
    for item in _items(path):
        if item[0] == "app":
            items = item[2] if erased is None else erased.held_items(item[1], None, item[2])
            if items:
                store.write_app_state(item[1], items).result()
            handled = 1
        elif item[0] == "user":
            items = item[3] if erased is None else erased.held_items(item[1], item[2], item[3])
            if items:
                store.write_user_state(item[1], item[2], items).result()
            handled = 1
        else:
            copy: SessionCopy = item[1]
            if not store.restore_session(copy).result():
                skipped_sessions += 1
                skipped_events += len(copy.events)
            handled = 1 + len(copy.events)
        if progress is not None:
            progress(handled)
    counts = replace(counts, skipped_sessions=skipped_sessions, skipped_events=skipped_events)
    if erased is not None and erased.values:
        _log.warning(
            "the import left out %d user or app state values sealed under data keys erased "
            "since the dump was made, of users or apps that came back meanwhile",
            erased.values,
        )
        counts = replace(counts, erased_values=erased.values)
    return counts


class _Erased:
    """What an import of an encrypted dump leaves out: erased values over a returning user's.

    A user (or app) erased after the dump was made has no data keys, and
    nothing of theirs in the dump reads again: imported, each read of it says
    the key was erased. But once that user came back (new keys, a new user
    map), an old value set in the map would make the whole map, so every
    session of theirs, unreadable. Those values are left out, and counted.
    """

    def __init__(self, encrypted: Any) -> None:
        self._store = encrypted
        self.values = 0

    def held_items(self, app: str, user: str | None, items: Items) -> Items:
        """Return the items to write to a user's (or an app's) map; count those left out."""
        if app == ENCRYPTION_MARKER_APP:
            return items  # the marker is not sealed
        kept = [item for item in items if not self._left_out(app, user, item[1])]
        self.values += len(items) - len(kept)
        return kept

    def _left_out(self, app: str, user: str | None, packed: bytes) -> bool:
        # A dump keeps each value packed as the store below keeps it: the sealed bytes, packed.
        sealed = unpack(packed)
        return isinstance(sealed, bytes) and self._store.erased_over_new_keys(app, user, sealed)


def check_dump(source: str | os.PathLike[str]) -> DumpCounts:
    """Read a whole dump and check it as ``import_dump`` does; return the counts it holds.

    Nothing is opened but the file: a command checks a dump with this before
    it creates the store to import it into. A bad dump is a ``DumpError``.
    """
    return _check(None, Path(source))


def holds_only_dump(store: Store, source: str | os.PathLike[str]) -> bool:
    """Tell whether everything a store holds is from a dump: how a failed import tells its own.

    Every stored session must equal the dump's copy of it, and every app
    and user state key hold the dump's value. A session or key written by
    anyone else (another process that opened the store meanwhile) makes it
    False, and so does a dump that no longer reads.
    """
    apps = {app: store.read_app_state(app) for app in store.list_apps()}
    stored_sessions = sum(len(store.list_sessions(app, None)) for app in apps)
    users = {(app, user): store.read_user_state(app, user) for app in apps
             for user in store.list_users(app)}  # fmt: skip
    matched = 0
    try:
        for item in _items(Path(source)):
            if item[0] == "app":
                state = apps.get(item[1], {})
            elif item[0] == "user":
                state = users.get((item[1], item[2]), {})
            else:
                copy: SessionCopy = item[1]
                stored = read_copy(store, copy.app_name, copy.user_id, copy.session_id)
                if stored is not None:
                    if not copies_equal(stored, copy):
                        return False
                    matched += 1
                continue
            for key, value in item[-1]:
                if key in state and pack(state.pop(key)) != value:
                    return False
    except DumpError:
        return False
    leftover = any(apps.values()) or any(users.values())
    return matched == stored_sessions and not leftover


def _encrypted_store(store: Store) -> Any:
    """Return the store as an EncryptedStore, None when it is not one."""
    crypto = sys.modules.get("sessionscope.crypto.store")
    if crypto is not None and isinstance(store, crypto.EncryptedStore):
        return store
    return None


def _ciphertext_of(store: Store) -> tuple[Store, dict[str, Any]]:
    """Return the store holding what a dump copies, and its encryption marker ({}: none)."""
    encrypted = _encrypted_store(store)
    below: Store = store if encrypted is None else encrypted.raw
    return below, below.read_app_state(ENCRYPTION_MARKER_APP)


def _dump_marker(path: Path) -> dict[str, Any]:
    """Return the encryption marker a dump starts with ({} for a dump of plaintext)."""
    items = _items(path)
    try:
        for item in items:
            if item[0] == "app" and item[1] == ENCRYPTION_MARKER_APP:
                return {key: unpack(value) for key, value in item[2]}
            return {}
    finally:
        items.close()
    return {}


def _import_target(store: Store, path: Path) -> Store:
    """Return the store a dump is written to: ciphertext goes below an encrypted store.

    A dump of an encrypted store imports into a store encrypted with the
    same key store (or into an empty one); a dump of plaintext is sealed on
    its way into an encrypted store, and refused by a plain store that is
    encrypted below.
    """
    marker = _dump_marker(path)
    encrypted = _encrypted_store(store)
    below: Store = store if encrypted is None else encrypted.raw
    stored = below.read_app_state(ENCRYPTION_MARKER_APP)
    if not marker:
        if stored and encrypted is None:
            raise DumpError(f"{path}: a dump of plaintext cannot go below an encrypted store")
        return store
    if stored.get("keystore", marker.get("keystore")) != marker.get("keystore") or (
        not stored and below.list_apps()
    ):
        raise DumpError(
            f"{path} is a dump of an encrypted store whose data keys are in another key "
            "store than this store's; nothing was imported"
        )
    return below


def _check(store: Store | None, path: Path) -> DumpCounts:
    """Read the whole dump once; refuse it, with what is wrong, before anything is written."""
    apps: set[str] = set()
    users = sessions = events = 0
    for item in _items(path):
        if item[0] == "app":
            if item[1] != ENCRYPTION_MARKER_APP:
                apps.add(item[1])
        elif item[0] == "user":
            apps.add(item[1])
            users += 1
        else:
            copy: SessionCopy = item[1]
            sessions += 1
            events += len(copy.events)
            if store is None:
                continue
            stored = read_copy(store, copy.app_name, copy.user_id, copy.session_id)
            if stored is not None and not copies_equal(stored, copy):
                raise DumpError(
                    f"{path}: session {copy.session_id!r} of user {copy.user_id!r} in app "
                    f"{copy.app_name!r} is stored with other content; nothing was imported"
                )
    return DumpCounts(len(apps), users, sessions, events)


def _items(path: Path) -> Generator[tuple[Any, ...], None, None]:
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
        if version not in _KNOWN_FORMATS:
            raise reader.error(f"has format {version}, which no version of sessionscope writes")
        sessions = events = users = 0
        app_names: set[str] = set()
        seen: set[tuple[str, str, str]] = set()
        first = True
        while True:
            record = reader.next("a record or the trailer")
            kind = record[0] if isinstance(record, list) and record else None
            if kind == "end":
                _check_trailer(reader, record, app_names, users, sessions, events)
                return
            # The encryption marker is a dump's first record (an export
            # writes it there, and the import reads it there alone); the
            # name it is kept under is no app's anywhere else.
            marker = first and kind == "app" and record[1:2] == [ENCRYPTION_MARKER_APP]
            first = False
            if marker and _shape(record, str, str, dict):
                items = _items_of(reader, record[2], None, "the encryption marker")
                yield ("app", ENCRYPTION_MARKER_APP, items)
            elif kind == "app" and _shape(record, str, str, dict):
                app = _id(reader, record[1], "app_name")
                app_names.add(app)
                yield ("app", app, _items_of(reader, record[2], None, f"app {app!r}"))
            elif kind == "user" and _shape(record, str, str, str, dict):
                app = _id(reader, record[1], "app_name")
                user = _id(reader, record[2], "user_id")
                app_names.add(app)
                users += 1
                where = f"user {user!r} of app {app!r}"
                yield ("user", app, user, _items_of(reader, record[3], None, where))
            elif kind == "session" and _shape(record, str, str, str, str, float, float, dict, int):
                copy = _session(reader, record)
                key = (copy.app_name, copy.user_id, copy.session_id)
                if key in seen:
                    raise reader.error(f"holds session {copy.session_id!r} twice")
                seen.add(key)
                sessions += 1
                events += len(copy.events)
                app_names.add(copy.app_name)
                yield ("session", copy)
            else:
                raise reader.error(f"has a record it cannot read: {_describe(record)}")
    finally:
        reader.close()


def _id(reader: _Reader, value: str, name: str) -> str:
    """Return an id the service would take as it is (stripped, within limits), or refuse it."""
    try:
        if name == "session_id":
            checked = check_session_id(value)
        elif name == "app_name":
            checked = check_app_name(value)
        else:
            checked = check_id(value, name)
    except ValueError as error:
        raise reader.error(f"has a bad {name}: {_cut(str(error))}") from None
    if checked != value:
        raise reader.error(f"has a {name} with surrounding whitespace: {_cut(repr(value))}")
    return value


def _time(reader: _Reader, value: float, what: str) -> float:
    if finite_float(value) is None:
        raise reader.error(f"has {what} {value!r}: a time must be a finite number")
    return value


def _session(reader: _Reader, record: list[Any]) -> SessionCopy:
    """Return the copy a session record and its event records describe, each checked."""
    _, app, user, sid, created, updated, state, count = record
    _id(reader, app, "app_name")
    _id(reader, user, "user_id")
    _id(reader, sid, "session_id")
    where = f"session {sid!r}"
    _time(reader, created, f"a create time in {where}")
    _time(reader, updated, f"a last update time in {where}")
    if count < 0:
        raise reader.error(f"has a negative event count in {where}")
    copy = SessionCopy(
        app, user, sid, created, updated, _items_of(reader, state, Scope.SESSION, where)
    )
    for _ in range(count):
        event = reader.next("an event")
        if not (
            isinstance(event, list)
            and event[:1] == ["event"]
            and _shape(event, str, str, float, bytes)
        ):
            raise reader.error(f"has a bad event record in {where}")
        copy.events.append(_event(reader, event, where))
    try:
        check_copy(copy)
    except ValueError as error:
        raise reader.error(f"has {_cut(str(error))}") from None
    return copy


def _event(reader: _Reader, event: list[Any], where: str) -> EventCopy:
    """Return an event record's copy: its id and time are those its record says."""
    _, event_id, stamp, data = event
    _id(reader, event_id, "event.id")
    _time(reader, stamp, f"an event time in {where}")
    try:
        fields = decode_event(data)
    except Exception:
        raise reader.error(f"has an event record that does not decode in {where}") from None
    if not isinstance(fields, dict):
        raise reader.error(f"has an event record that is not a map in {where}")
    if fields.get("id") != event_id:
        raise reader.error(f"has an event record that does not match in {where}: another id")
    if finite_float(fields.get("timestamp")) != stamp:
        raise reader.error(
            f"has an event record that does not match in {where}: event {event_id!r} is "
            f"dumped at {stamp!r} but its record says {_cut(repr(fields.get('timestamp')))}"
        )
    try:
        check_event_values(fields)
    except (TypeError, ValueError) as error:
        raise reader.error(f"has an event {event_id!r} in {where}: {_cut(str(error))}") from None
    if fields.get("partial") is True:
        raise reader.error(
            f"has a partial event {event_id!r} in {where}, which the service never stores"
        )
    actions = fields.get("actions")
    delta = actions.get("state_delta") if isinstance(actions, dict) else None
    if isinstance(delta, dict) and any(str(key).startswith(TEMP_PREFIX) for key in delta):
        raise reader.error(
            f"has an event {event_id!r} in {where} whose state delta keeps a {TEMP_PREFIX} key, "
            "which the service never stores"
        )
    return EventCopy(event_id, stamp, data)


def _shape(record: list[Any], *types: type) -> bool:
    """Tell whether a record has exactly these field types (bool is not an int here)."""
    return len(record) == len(types) and all(
        isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        for value, kind in zip(record, types, strict=True)
    )


def _items_of(
    reader: _Reader, mapping: dict[Any, Any], scope: Scope | None, where: str
) -> list[tuple[str, bytes]]:
    """Return a state map's entries, each value decoded and checked as the service would.

    ``scope`` SESSION: the keys of a session's own map, which are never
    ``app:``, ``user:`` or ``temp:`` keys (the service routes those
    elsewhere or drops them). App and user maps keep keys without prefix,
    and any str is one.
    """
    items = list(mapping.items())
    for key, value in items:
        if not isinstance(key, str) or not isinstance(value, bytes):
            raise reader.error(f"has a state map in {where} that is not str -> packed bytes")
        if scope is not None and scope_of(key) is not scope:
            raise reader.error(
                f"has the key {_cut(repr(key))} in the state of {where}: the service keeps "
                f"{scope_of(key).value} keys elsewhere"
            )
        try:
            decoded = unpack(value)
        except Exception:
            raise reader.error(
                f"has a state value under {_cut(repr(key))} in {where} that does not decode"
            ) from None
        try:
            check_storable(decoded, "state")
        except (TypeError, ValueError) as error:
            raise reader.error(
                f"has a state value under {_cut(repr(key))} in {where} the service would "
                f"refuse: {_cut(str(error))}"
            ) from None
    return items


def _cut(text: str, limit: int = 200) -> str:
    """Return text cut to a length an error line can carry, keeping both ends.

    The end of a service error says what is wrong, after the path to it.
    """
    if len(text) <= limit:
        return text
    half = limit // 2
    return text[:half] + "..." + text[-half:]


def _describe(record: Any) -> str:
    """Say what a record is without building the text of all of it (it may be huge)."""
    if isinstance(record, list):
        head = record[0] if record else None
        first = _cut(repr(head), 40) if isinstance(head, (str, int, float)) else type(head).__name__
        return f"an array of {len(record)} starting with {first}"
    return f"a {type(record).__name__}"


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
        raise reader.error(f"holds {expected} but its trailer says {_cut(repr(counts))}")
    if record[2] != digest:
        raise reader.error("fails its checksum: it was altered")
    if reader.more():
        raise reader.error("has data after its trailer")


class _Reader:
    """Read msgpack records from a dump file, hashing each one but the trailer.

    The unpacker refuses a record over ``MAX_RECORD_BYTES`` (or a map of
    more than ``MAX_STATE_KEYS`` keys) as soon as its header says so, so a
    small compressed file that inflates to a huge record costs no more than
    one record's worth of memory to refuse.
    """

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
            max_buffer_size=MAX_RECORD_BYTES,
            max_str_len=MAX_RECORD_BYTES,
            max_bin_len=MAX_RECORD_BYTES,
            max_array_len=_MAX_FIELDS,
            max_map_len=MAX_STATE_KEYS,
            max_ext_len=0,
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
            # BufferFull: a record longer than the buffer; "exceeds max_...": a
            # header announcing more than a limit. Neither record was read whole.
            if isinstance(error, msgpack.BufferFull) or "exceeds max_" in str(error):
                raise self.error(
                    f"holds a record over the limits of one ({MAX_RECORD_BYTES:,} bytes, "
                    f"{MAX_STATE_KEYS:,} state keys, {_MAX_FIELDS} fields)"
                ) from None
            what = _cut(str(error)) or type(error).__name__
            raise self.error(f"is damaged ({what})") from None
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
