"""The LMDB store's key layout and record codecs: every key and stored value is built here.

Layout (named sub-databases; ``part(x)`` is a length-prefixed UTF-8 id, or a
marker and a BLAKE2b digest for ids over 150 bytes, which keeps every key
under LMDB's 511-byte limit while ids may be 4 KiB):

    meta      b"format" -> version byte + packed {"magic", "format"}
              b"next_number" -> 8-byte counter of session numbers
              b"purge" number -> b""  (removed sessions whose data is still to delete)
    sessions  part(app) part(user) part(session) -> packed SessionRecord
    shared    b"a" part(app) part(key) -> packed value            (app state)
              b"u" part(app) part(user) part(key) -> packed value (user state)
    data      number b"e" seq -> 8-byte timestamp + event record
              number b"i" part(event id) -> seq
              number b"t" sortable(timestamp) seq -> b""
              number b"s" part(key) -> packed value                (session state)
    listing   part(app) sortable(last_update_time) number -> the session's key
              (format 2 only: the list index, one entry per session)

``number`` is an 8-byte session number that is never reused, ``seq`` the
8-byte position of an event in its session. Everything a session owns sits
under its number in one database, so an append dirties few pages and a
delete is one range. State is one record per key, so an append writes only
the keys its delta touches. A state key stored under a digest keeps its full
text in the value (``[key, packed value]``).

The store, retention, maintenance and the compiled append path (``_append``)
all import from here: nothing else builds a key or decodes a record.

Every append and every read runs these helpers, so ``setup.py`` also compiles
this file, unchanged, as ``layout_c`` (as it does ``_append``); the append
path and the store's reads take that build through
``sessionscope.core.compiled_or_twin``, and this module is its twin.

The helpers an append runs pass py-lmdb's arguments by position, in the
order its documented signatures give them (``get(key, default, db)``,
``put(key, value, dupdata, overwrite, append, db)``, ``delete(key, value,
db)``, ``cursor(db)``): py-lmdb looks a keyword up by name on every call,
which cost about 250 ns a call here, some 3% of a deferred append over its
ten or so calls. Elsewhere ``db=`` reads better and costs nothing that shows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import lru_cache
from hashlib import blake2b
from struct import Struct
from typing import TYPE_CHECKING, Any

from ...codec import UNDECODABLE, decode_stored, pack, unpack, unreadable_state_value
from ...core import pack_plain, sized_key, sortable_time, timed_record
from ...errors import CorruptStoreError, StoreError
from ..records import Items, LoadedSession, SessionRecord

if TYPE_CHECKING:
    from ..._speedups import _no_cython as cython

    _untrack: Any = None
else:
    try:
        import cython
    except ImportError:  # a pure install runs without Cython
        from ..._speedups import _no_cython as cython
    if cython.compiled:
        from cython.cimports.sessionscope._speedups._gc import PyObject_GC_UnTrack as _untrack

__all__ = [
    "APP",
    "DB_NAMES",
    "DIGEST_MARK",
    "EVENT",
    "EVENT_ID",
    "EVENT_TIME",
    "F64",
    "FORMAT_KEY",
    "FORMAT_VERSION",
    "LISTING",
    "MAGIC",
    "MAX_DBS",
    "NUMBER_KEY",
    "PURGE",
    "RAW_PART_LIMIT",
    "STATE",
    "U64",
    "USER",
    "Databases",
    "after",
    "checked_record",
    "db_names",
    "decode_record",
    "encode_record",
    "event_value",
    "events",
    "format_record",
    "item_entries",
    "item_entries_of",
    "list_key",
    "list_new",
    "loaded",
    "part",
    "part_length",
    "parts_length",
    "put_items",
    "put_record",
    "raw_names",
    "read_map",
    "read_record",
    "records_under",
    "relist",
    "session_key",
    "sortable_time",
    "start_time_index",
    "take_number",
    "unique_part",
    "unlist",
]

FORMAT_VERSION = 2
MAGIC = "sessionscope"
DB_NAMES = (b"meta", b"sessions", b"shared", b"data")
# Format 2 adds the list index; a store of format 1 is read and written as it is.
LISTING = b"listing"
# Room for the named databases, and one to spare.
MAX_DBS = len(DB_NAMES) + 2
APP, USER = b"a", b"u"
EVENT, EVENT_ID, EVENT_TIME, STATE = b"e", b"i", b"t", b"s"
FORMAT_KEY = b"format"
NUMBER_KEY = b"next_number"
# Numbers of removed sessions whose state and events are still to delete.
PURGE = b"purge"
# Ids longer than this (in UTF-8) are keyed by a digest after DIGEST_MARK.
RAW_PART_LIMIT = 150
DIGEST_MARK = b"\xff\xff"
U64 = Struct(">Q")
F64 = Struct(">d")


def db_names(version: int) -> tuple[bytes, ...]:
    """Return the named databases a store of ``version`` holds."""
    return DB_NAMES if version == 1 else (*DB_NAMES, LISTING)


def format_record(version: int) -> bytes:
    """Return the value of meta's b"format": the version byte, then the packed header.

    ``opening.check_format`` reads it back, and refuses what it cannot read.
    """
    return bytes([version]) + pack({"magic": MAGIC, "format": version})


def take_number(txn: Any, meta: Any) -> int:
    """Return the next session number, and count it as taken (numbers are never reused)."""
    (number,) = U64.unpack(txn.get(NUMBER_KEY, db=meta))
    txn.put(NUMBER_KEY, U64.pack(number + 1), db=meta)
    result: int = number
    return result


class Databases:
    """The handles of a store's named databases and the format they were written in.

    What the append path and every transaction body read: the store replaces
    the whole object when it maps the environment again.
    """

    __slots__ = ("data", "format", "listing", "meta", "sessions", "shared")

    def __init__(self, handles: dict[bytes, Any], version: int) -> None:
        self.meta: Any = handles[b"meta"]
        self.sessions: Any = handles[b"sessions"]
        self.shared: Any = handles[b"shared"]
        self.data: Any = handles[b"data"]
        # None in format 1, which keeps no list index.
        self.listing: Any = handles.get(LISTING)
        self.format = version

    def items(self) -> Iterator[tuple[bytes, Any]]:
        """Yield (name, handle) of every named database."""
        for name in db_names(self.format):
            yield name, getattr(self, "listing" if name == LISTING else name.decode())

    def timed(self, record: SessionRecord) -> bool:
        """Return whether the store keeps a time index for the session.

        Format 1 keeps one for every session; format 2 only for sessions that
        received an event out of time order (the others' events are in time
        order, so their positions are the index).
        """
        return self.format == 1 or record.time_indexed


# -- key parts ---------------------------------------------------------------


def unique_part(text: str) -> bytes:
    """Return the key part of an id: self-delimiting, so parts concatenate safely."""
    raw = text.encode()
    if len(raw) <= RAW_PART_LIMIT:
        return len(raw).to_bytes(2, "big") + raw
    return DIGEST_MARK + blake2b(raw, digest_size=32).digest()


# App, user, session ids and state keys recur from call to call: remember their
# parts. Event ids never recur, so they take unique_part and stay out of the cache.
part: Callable[[str], bytes] = lru_cache(maxsize=4096)(unique_part)


def session_key(app_name: str, user_id: str, session_id: str) -> bytes:
    """Return the key of a session's record."""
    return part(app_name) + part(user_id) + part(session_id)


def after(prefix: bytes) -> bytes | None:
    """Return the first key past every key that starts with ``prefix`` (None: no such key)."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


def part_length(key: bytes, start: int) -> int:
    """Return the length of the id part at ``start`` of a key."""
    if key[start : start + 2] == DIGEST_MARK:
        return 2 + 32
    return 2 + int.from_bytes(key[start : start + 2], "big")


def parts_length(key: bytes, depth: int) -> int:
    """Return how many bytes the first ``depth`` id parts of a key take."""
    end = 0
    for _ in range(depth):
        end += part_length(key, end)
    return end


def raw_names(cursor: Any, prefix: bytes, depth: int) -> Iterator[str]:
    """Yield each distinct id found ``depth`` parts after ``prefix`` (ids kept raw only)."""
    start = len(prefix)
    positioned = cursor.set_range(prefix)
    while positioned and cursor.key().startswith(prefix):
        key = cursor.key()
        offset = start + parts_length(key[start:], depth - 1)
        length = part_length(key, offset)
        if key[offset : offset + 2] != DIGEST_MARK:
            yield key[offset + 2 : offset + length].decode()
        following = after(key[: offset + length])
        positioned = following is not None and cursor.set_range(following)


# -- the list index ----------------------------------------------------------


def list_key(record: SessionRecord) -> bytes:
    """Return the list index key of a session: app, last update time, number.

    Within one time the order of the numbers is not the listing order; a
    page sorts each run of equal times by its ids (see ``LmdbStore.list_page``).
    """
    app: bytes = part(record.app_name)
    return app + sortable_time(record.last_update_time) + U64.pack(record.number)


def relist(
    txn: Any, listing: Any, record: SessionRecord, app: bytes, key: bytes, old_time: float
) -> None:
    """Move a session's list index entry from ``old_time`` to its last update time.

    ``app`` is the part of the session's app id, ``key`` its record key (what
    the entry holds). Nothing to do in format 1 (``listing`` is None).
    """
    if listing is None:
        return
    number = U64.pack(record.number)
    new = app + sortable_time(record.last_update_time) + number
    old = app + sortable_time(old_time) + number
    if old != new:
        txn.delete(old, b"", listing)
        txn.put(new, key, True, True, False, listing)


def list_new(txn: Any, listing: Any, record: SessionRecord, key: bytes) -> None:
    """Add a new session's list index entry (format 2)."""
    if listing is not None:
        txn.put(list_key(record), key, db=listing)


def unlist(txn: Any, listing: Any, record: SessionRecord) -> None:
    """Remove a session's list index entry (format 2)."""
    if listing is not None:
        txn.delete(list_key(record), db=listing)


# -- records -----------------------------------------------------------------


def encode_record(record: SessionRecord) -> bytes:
    """Return a session record's stored value.

    Packed by the compiled core's packer of plain values, which a record's
    fields always are: msgpack's own bytes, without a Python frame and a
    thread's packer to find (an append writes its session's record).
    """
    fields = record.to_list()
    packed: bytes | None = pack_plain(fields)
    if packed is None:  # not a record this version writes: msgpack says why
        packed = pack(fields)
    return packed


def decode_record(value: bytes, whose: str | None = None) -> SessionRecord:
    """Return a stored session record; an unreadable one is a CorruptStoreError.

    ``whose``: the session, when the caller knows it (for the message).
    """
    try:
        return SessionRecord(*unpack(value))
    except Exception as error:
        message = "a session record" if whose is None else f"the record of {whose}"
        raise CorruptStoreError(f"{message} is unreadable") from error


def read_record(
    txn: Any, dbs: Databases, app_name: str, user_id: str, session_id: str
) -> SessionRecord | None:
    """Return a session's record, or None."""
    data = txn.get(session_key(app_name, user_id, session_id), None, dbs.sessions)
    if data is None:
        return None
    return checked_record(data, app_name, user_id, session_id)


def checked_record(data: bytes, app_name: str, user_id: str, session_id: str) -> SessionRecord:
    """Decode the record stored under a session's key, and check that it is that session's.

    Two ids keyed by one digest would share the key: the stored ids tell.
    """
    try:
        # SessionRecord.from_list without its call, as records_under makes them.
        record = SessionRecord(*unpack(data))
    except Exception:
        # Decoded again for the error: the message is only built when it is needed.
        decode_record(data, f"session {session_id!r} of user {user_id!r} in app {app_name!r}")
        raise
    if record.app_name != app_name or record.user_id != user_id or record.session_id != session_id:
        raise StoreError("two session ids share a digest", hint="report this as a bug")
    return record


def records_under(txn: Any, dbs: Databases, prefix: bytes) -> list[SessionRecord]:
    """Return the records of the sessions whose keys start with ``prefix``, in key order."""
    cursor = txn.cursor(db=dbs.sessions)
    records: list[SessionRecord] = []
    if not cursor.set_range(prefix):
        return records
    add, record_of = records.append, SessionRecord
    # Typed, so that the compiled build tests each key in C (see read_map).
    key: bytes
    # One record per session of the app: the loop is the whole listing's cost.
    for key, value in cursor.iternext():
        if not key.startswith(prefix):
            break
        made = record_of(*unpack(value))
        if cython.compiled:
            # Left out of the cyclic collector (see ``records.SessionRecord``):
            # a whole listing holds one record per session at once, and the
            # collector's passes meanwhile went over them again and again.
            _untrack(cython.cast(cython.p_void, made))
        add(made)
    return records


def put_record(txn: Any, dbs: Databases, record: SessionRecord) -> None:
    """Write a session's record under its key."""
    key = session_key(record.app_name, record.user_id, record.session_id)
    txn.put(key, encode_record(record), db=dbs.sessions)


# -- state -------------------------------------------------------------------


def item_entries(owner: bytes, items: Items) -> list[tuple[bytes, bytes]]:
    """Return the entries of state items stored under ``owner``."""
    entries = []
    for key, value in items:
        # The common key is made in one allocation (as part() makes its part);
        # a long key, stored under a digest, keeps its text in the value.
        entry_key: bytes | None = sized_key(owner, key, RAW_PART_LIMIT)
        if entry_key is None:
            key_part: bytes = part(key)
            if key_part[:2] == DIGEST_MARK:
                value = pack([key, value])
            entry_key = owner + key_part
        entries.append((entry_key, value))
    return entries


def put_items(txn: Any, handle: Any, owner: bytes, items: Items) -> None:
    """Write state items under ``owner``."""
    for key, value in item_entries(owner, items):
        txn.put(key, value, db=handle)


def read_map(txn: Any, handle: Any, owner: bytes) -> dict[str, Any]:
    """Return the state map stored under ``owner``, keys without prefix."""
    result: dict[str, Any] = {}
    cursor = txn.cursor(db=handle)
    if not cursor.set_range(owner):
        return result
    # Typed, so that the compiled build tests, slices and decodes each key in
    # C rather than through bytes methods: a read decodes every value of
    # three maps, some 40 on the agent mix.
    start: cython.Py_ssize_t = len(owner)
    key: bytes
    for key, value in cursor.iternext():
        if not key.startswith(owner):
            break
        if key.startswith(DIGEST_MARK, start):
            name, value = decode_stored(value, "a state entry")
        else:
            try:
                name = key[start + 2 :].decode()
            except UnicodeDecodeError as error:
                raise CorruptStoreError(f"a state key is unreadable ({error})") from error
        # decode_state_value without its call: a read decodes every value of three maps.
        try:
            result[name] = unpack(value)
        except UNDECODABLE as error:
            raise unreadable_state_value(name, error) from error
    return result


def item_entries_of(values: dict[str, Any]) -> Items:
    """Return state items (key, packed value) of a decoded map."""
    return [(key, pack(value)) for key, value in values.items()]


def loaded(txn: Any, dbs: Databases, record: SessionRecord, events: list[bytes]) -> LoadedSession:
    """Return a session with its three state maps and the given events."""
    app = part(record.app_name)
    return LoadedSession(
        record,
        read_map(txn, dbs.data, U64.pack(record.number) + STATE),
        read_map(txn, dbs.shared, APP + app),
        read_map(txn, dbs.shared, USER + app + part(record.user_id)),
        events,
    )


# -- events ------------------------------------------------------------------


def event_value(timestamp: float, record: bytes) -> bytes:
    """Return an event's stored value: its time (8 bytes, big-endian), then its record.

    In one allocation for a bytes record; another buffer type is joined.
    """
    if type(record) is bytes:
        stamped: bytes = timed_record(float(timestamp), record)
        return stamped
    return F64.pack(timestamp) + record


def events(txn: Any, dbs: Databases, number: bytes, start: int, stop: int) -> list[bytes]:
    """Return the records of a session's events ``start`` to ``stop`` (exclusive)."""
    if start >= stop:
        return []
    cursor = txn.cursor(dbs.data)
    # Bounded by key, not by count: a truncation leaves gaps in positions.
    if not cursor.set_range(number + EVENT + U64.pack(start)):
        return []
    end: bytes = number + EVENT + U64.pack(stop)
    found: list[bytes] = []
    # Typed, so that the compiled build compares and slices in C (see read_map).
    key: bytes
    value: bytes
    for key, value in cursor.iternext():
        if key >= end:
            break
        found.append(value[8:])
    return found


def start_time_index(txn: Any, dbs: Databases, record: SessionRecord) -> None:
    """Give a session going out of time order a time index of the events it stores."""
    number = U64.pack(record.number)
    prefix = number + EVENT
    cursor = txn.cursor(db=dbs.data)
    entries: list[tuple[bytes, bytes]] = []
    if cursor.set_range(prefix):
        for key, value in cursor.iternext():
            if not key.startswith(prefix):
                break
            stamp = sortable_time(F64.unpack_from(value)[0])
            entries.append((number + EVENT_TIME + stamp + key[9:17], b""))
    if entries:
        txn.cursor(db=dbs.data).putmulti(entries)
    record.time_indexed = True
