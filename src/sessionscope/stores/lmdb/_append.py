"""The LMDB store's append bodies (one event, or a batch), and one write's own transaction.

Written once, as annotated Python in Cython's pure-Python mode: ``setup.py``
compiles this file a second time as ``sessionscope.stores.lmdb._append_c``,
and this module stays importable as it is, the twin that runs where nothing
was compiled (``sessionscope.core.compiled_or_twin`` picks one). The store
(``store.py``) keeps the lifecycle, locking, group commit and errors; it calls
these functions inside its transactions and hands them itself, whose handles
(``_sessions``, ``_shared``, ``_data``, ``_listing``) and format they read.

Only what every append runs is here: the keys of its entries, the session
record's read, check and write, and the list index move; and the common
path of a single write's transaction (``write_alone``). A rare step (the
first event out of time order, a locked append's catch-up, a write that
fails) goes back to the store.
"""

from __future__ import annotations

import os
from functools import lru_cache
from hashlib import blake2b
from struct import Struct
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from ..._speedups import _no_cython as cython
    from ..records import Items
else:
    try:
        import cython
    except ImportError:  # a pure install runs without Cython
        from ..._speedups import _no_cython as cython

from ...codec import pack, unpack
from ...core import sized_key, timed_record
from ...errors import CorruptStoreError, StoreError
from ..records import (
    AppendBatch,
    AppendRequest,
    AppendResult,
    BatchResult,
    PartialBatch,
    SessionRecord,
)
from ..rules import catch_up, catch_up_repeat, check_append, events_seen

__all__ = [
    "append_batch",
    "append_one",
    "event_entries",
    "in_time_order",
    "item_entries",
    "list_key",
    "part",
    "read_record",
    "sortable_time",
    "unique_part",
    "write_alone",
]

_APP, _USER = b"a", b"u"
_EVENT, _EVENT_ID, _EVENT_TIME, _STATE = b"e", b"i", b"t", b"s"
_RAW_PART_LIMIT = 150
_DIGEST_MARK = b"\xff\xff"
_U64 = Struct(">Q")
_F64 = Struct(">d")
# The two-byte size in front of a raw key part, made once for every size it can have.
_SIZES: list[bytes] = [size.to_bytes(2, "big") for size in range(_RAW_PART_LIMIT + 1)]
# The 8-byte positions of a session's first events, made once: a batch takes
# its events' positions from here rather than packing each.
_SEQ_TABLE = 4096
_SEQS: list[bytes] = [_U64.pack(seq) for seq in range(_SEQ_TABLE)]


def unique_part(text: str) -> bytes:
    """Return the key part of an id: self-delimiting, so parts concatenate safely."""
    found: bytes = _id_part(text)
    return found


@cython.cfunc
def _id_part(text: str) -> bytes:
    """Return ``unique_part(text)``: a C call from this module's compiled build."""
    raw: bytes = text.encode()
    size: cython.Py_ssize_t = len(raw)
    if size <= _RAW_PART_LIMIT:
        short: bytes = _SIZES[size] + raw
        return short
    return _DIGEST_MARK + blake2b(raw, digest_size=32).digest()


@cython.cfunc
def _id_key(prefix: bytes, event_id: str) -> bytes:
    """Return an event's id index key: ``prefix``, then ``unique_part(event_id)``.

    The common id's key is made in one allocation; a long id (stored under a
    digest) or a str subclass takes unique_part's way.
    """
    made: Any = sized_key(prefix, event_id, _RAW_PART_LIMIT)
    if made is None:
        made = prefix + _id_part(event_id)
    key: bytes = made
    return key


@cython.cfunc
def _stored_value(timestamp: float, record: Any) -> bytes:
    """Return an event's stored value: its time (8 bytes, big-endian), then its record.

    In one allocation for a bytes record; another buffer type is joined.
    """
    if type(record) is bytes:
        stamped: bytes = timed_record(float(timestamp), record)
        return stamped
    joined: bytes = _F64.pack(timestamp) + record
    return joined


# App, user, session ids and state keys recur from call to call: remember their
# parts. Event ids never recur, so they take unique_part and stay out of the cache.
part: Callable[[str], bytes] = lru_cache(maxsize=4096)(unique_part)


def sortable_time(timestamp: float) -> bytes:
    """Return 8 bytes that sort as the float does (negatives included)."""
    # -0.0 + 0.0 is 0.0: the two zeros compare equal, so they must sort equal.
    (bits,) = _U64.unpack(_F64.pack(timestamp + 0.0))
    bits = bits ^ 0xFFFFFFFFFFFFFFFF if bits >> 63 else bits | 1 << 63
    result: bytes = _U64.pack(bits)
    return result


def item_entries(owner: bytes, items: Items) -> Iterator[tuple[bytes, bytes]]:
    """Yield the entries of state items stored under ``owner``."""
    for key, value in items:
        key_part: bytes = part(key)
        if key_part[:2] == _DIGEST_MARK:
            value = pack([key, value])
        yield owner + key_part, value


@cython.cfunc
def _add_items(puts: list[tuple[bytes, bytes]], owner: bytes, items: Any) -> cython.int:
    """Add the entries of state items stored under ``owner`` to ``puts``."""
    for key, value in items:
        key_part: bytes = part(key)
        if key_part[:2] == _DIGEST_MARK:
            value = pack([key, value])
        puts.append((owner + key_part, value))
    return 0


def event_entries(
    number: bytes, id_key: bytes, record: SessionRecord, request: AppendRequest, timed: bool
) -> tuple[tuple[bytes, bytes], ...]:
    """Return the data entries of an event appended as the session's next one.

    The record (after its timestamp, which an ``after_timestamp`` read checks
    first), its id index entry and, when the session keeps one (``timed``),
    its time index entry.
    """
    seq: bytes = _U64.pack(record.event_count)
    timestamp: float = request.timestamp
    entries = (
        (number + _EVENT + seq, _stored_value(timestamp, request.event)),
        (id_key, seq),
    )
    if not timed:
        return entries
    return (*entries, (number + _EVENT_TIME + sortable_time(timestamp) + seq, b""))


def in_time_order(record: SessionRecord, timestamp: float) -> bool:
    """Return whether an event at ``timestamp`` keeps the session's events in time order.

    ``last_update_time`` is the last event's time, or later (a restored
    session whose copy said so): comparing with it never misses a step back.
    """
    return not record.stored_count or timestamp >= record.last_update_time


def list_key(record: SessionRecord) -> bytes:
    """Return the list index key of a session: app, last update time, number.

    Within one time the order of the numbers is not the listing order; a
    page sorts each run of equal times by its ids (see ``LmdbStore.list_page``).
    """
    app: bytes = part(record.app_name)
    return app + sortable_time(record.last_update_time) + _U64.pack(record.number)


def read_record(
    txn: Any, store: Any, app_name: str, user_id: str, session_id: str
) -> SessionRecord | None:
    """Return a session's record, or None: the store's own reads outside an append."""
    key = part(app_name) + part(user_id) + part(session_id)
    found: SessionRecord | None = _read_record(txn, store, key, app_name, user_id, session_id)
    return found


@cython.cfunc
def _read_record(
    txn: Any, store: Any, key: bytes, app_name: str, user_id: str, session_id: str
) -> Any:
    """Return the session record stored under ``key``, or None."""
    data = txn.get(key, db=store._sessions)
    if data is None:
        return None
    try:
        record = SessionRecord.from_list(unpack(data))
    except Exception as error:
        raise CorruptStoreError(
            f"the record of session {session_id!r} of user {user_id!r} in app "
            f"{app_name!r} is unreadable"
        ) from error
    if record.app_name != app_name or record.user_id != user_id or record.session_id != session_id:
        raise StoreError("two session ids share a digest", hint="report this as a bug")
    return record


@cython.cfunc
def _stored_event(txn: Any, data_db: Any, number: bytes, id_key: bytes) -> Any:
    """Return the stored record of the session's event under ``id_key``, if any."""
    seq = txn.get(id_key, db=data_db)
    if seq is None:
        return None
    stored: bytes = txn.get(number + _EVENT + seq, db=data_db)
    return stored[8:]


@cython.cfunc
def _relist(txn: Any, store: Any, record: Any, app: bytes, key: bytes, old_time: float) -> None:
    """Move a session's list index entry from ``old_time`` to its last update time."""
    listing = store._listing
    if listing is None:
        return
    number: bytes = _U64.pack(record.number)
    new: bytes = app + sortable_time(record.last_update_time) + number
    old: bytes = app + sortable_time(old_time) + number
    if old == new:
        return
    txn.delete(old, db=listing)
    txn.put(new, key, db=listing)


def write_alone(store: Any, action: Callable[[Any], Any]) -> tuple[bool, Any] | None:
    """Run one write in a transaction of its own, on the common path only.

    Called holding the store's writer lock. Return ``(True, result)`` once
    committed, or None at anything out of the ordinary (the lock file
    replaced, the store closing, a begin, write or commit that fails): the
    store then runs the write on its full path (``LmdbStore._run_writes``),
    which recovers or reports. Running it again is safe: nothing was
    committed, and every write checks before it writes. Compiled, this
    saves a single write the Python frames of that full path.
    """
    try:
        lock_file = os.stat(store._lock_name)
    except OSError:
        return None
    if (lock_file.st_dev, lock_file.st_ino) != store._lock_id:
        return None
    gate = store._gate
    gate.__enter__()
    try:
        if store._released:
            return None
        try:
            txn = store._env.begin(write=True)
        except Exception:
            return None
        try:
            result = action(txn)
        except Exception:
            txn.abort()
            return None
        except BaseException:
            txn.abort()
            raise
        try:
            # LMDB frees the transaction whether the commit succeeds or not.
            txn.commit()
        except Exception:
            return None
    finally:
        gate.__exit__()
    store._dirty = True
    return (True, result)


def append_one(store: Any, txn: Any, request: AppendRequest) -> AppendResult:
    """Append one event: check, write its entries, update the session record."""
    app_name: str = request.app_name
    user_id: str = request.user_id
    app: bytes = part(app_name)
    user: bytes = part(user_id)
    key: bytes = app + user + part(request.session_id)
    record = _read_record(txn, store, key, app_name, user_id, request.session_id)
    data_db = store._data
    stored = None
    number: bytes = b""
    id_key: bytes = b""
    if record is not None:
        number = _U64.pack(record.number)
        id_key = _id_key(number + _EVENT_ID, request.event_id)
        stored = _stored_event(txn, data_db, number, id_key)
    if stored is not None:
        return _repeat(store, txn, record, request, stored, number, id_key)
    if check_append(record, request, None) is not None:
        return AppendResult(None, duplicate=True)
    known = None
    catching_up: cython.bint = request.catch_up
    if catching_up:
        known = _events_seen(txn, data_db, number, request, record)
    count_before: int = record.event_count
    puts: list[tuple[bytes, bytes]] = []
    if request.app_items or request.user_items:
        shared_db = store._shared
        _add_items(puts, _APP + app, request.app_items)
        _add_items(puts, _USER + app + user, request.user_items)
        for entry_key, value in puts:
            txn.put(entry_key, value, db=shared_db)
        puts.clear()
    if request.session_items:
        _add_items(puts, number + _STATE, request.session_items)
    timestamp: float = request.timestamp
    timed: cython.bint = store.format == 1 or record.time_indexed
    # Out of time order (see in_time_order): the session needs a time index from now on.
    if (
        not timed
        and record.event_count != record.removed_count
        and (timestamp < record.last_update_time)
    ):
        store._start_time_index(txn, record)
        timed = True
    seq: bytes = _U64.pack(count_before)
    puts.append((number + _EVENT + seq, _stored_value(timestamp, request.event)))
    puts.append((id_key, seq))
    if timed:
        puts.append((number + _EVENT_TIME + sortable_time(timestamp) + seq, b""))
    for entry_key, value in puts:
        txn.put(entry_key, value, db=data_db)
    old_time: float = record.last_update_time
    record.event_count = count_before + 1
    record.last_update_time = timestamp
    record.last_event_id = request.event_id
    txn.put(key, pack(record.to_list()), db=store._sessions)
    _relist(txn, store, record, app, key, old_time)
    marker: str = record.marker
    result = AppendResult(marker, timestamp)
    if not catching_up:
        return result
    return _catch_up(store, txn, result, known, number, count_before, record)


def _repeat(
    store: Any,
    txn: Any,
    record: Any,
    request: AppendRequest,
    stored: bytes,
    number: bytes,
    id_key: bytes,
) -> AppendResult:
    """Answer an append whose event id the session stores (see ``check_append``)."""
    seq = int(_U64.unpack(txn.get(id_key, db=store._data))[0])
    repeat = check_append(record, request, stored, seq)
    assert repeat is not None  # a stored id is a repeat or a refusal
    if request.catch_up and not repeat.duplicate:
        return catch_up_repeat(repeat, seq, lambda: store._loaded(txn, record, []))
    return repeat


# The two steps of a locked append's catch-up live in their own functions: a
# closure in append_one would cost every append a scope object.
def _events_seen(
    txn: Any, data_db: Any, number: bytes, request: AppendRequest, record: SessionRecord
) -> int | None:
    def seq_of(event_id: str) -> int | None:
        seq = txn.get(_id_key(number + _EVENT_ID, event_id), db=data_db)
        return None if seq is None else int(_U64.unpack(seq)[0])

    return events_seen(request, record, seq_of)


def _catch_up(
    store: Any,
    txn: Any,
    result: AppendResult,
    known: int | None,
    number: bytes,
    count_before: int,
    record: SessionRecord,
) -> AppendResult:
    return catch_up(
        result,
        known,
        lambda start: store._events(txn, number, start, count_before),
        lambda: store._loaded(txn, record, []),
    )


@cython.cclass
class _BatchSession:
    """What a batch keeps of one stored session while it appends to it.

    The record's counters live here during the batch, as C fields of a
    compiled build, and go back into the record when the batch writes it
    (``settle``). The session's entries wait here too, so that the batch
    writes them in key order, session after session, where LMDB finds each
    next key on the page of the last one rather than from the root.
    """

    record: SessionRecord
    number: bytes
    key: bytes
    app: bytes
    event_prefix: bytes
    id_prefix: bytes
    old_time: cython.double
    count: cython.longlong
    removed: cython.longlong
    last_time: cython.double
    last_event_id: Any
    timed: cython.bint
    # Whether the batch appended an event to the session (repeats aside).
    appended: cython.bint
    marker_prefix: str
    marker_suffix: str
    # Entries of the batch: events (in position order), id and time index.
    events: list[tuple[bytes, bytes]]
    index: list[tuple[bytes, bytes]]
    # The state the batch sets, key -> packed value (the last one set): the
    # app's and the user's maps are shared by the sessions that write them.
    app_state: dict[str, bytes]
    user_state: dict[str, bytes]
    session_state: dict[str, bytes]

    def __init__(
        self,
        record: SessionRecord,
        key: bytes,
        app: bytes,
        timed: bool,
        app_state: dict[str, bytes],
        user_state: dict[str, bytes],
    ) -> None:
        self.record = record
        self.number = _U64.pack(record.number)
        self.key = key
        self.app = app
        self.event_prefix = self.number + _EVENT
        self.id_prefix = self.number + _EVENT_ID
        self.old_time = record.last_update_time
        self.count = record.event_count
        self.removed = record.removed_count
        self.last_time = record.last_update_time
        self.last_event_id = record.last_event_id
        self.timed = timed or record.time_indexed
        self.appended = False
        # SessionRecord.marker, cut around the event count.
        self.marker_prefix = f"{record.number}:"
        self.marker_suffix = f":{record.removed_count}" if record.removed_count else ""
        self.events = []
        self.index = []
        self.app_state = app_state
        self.user_state = user_state
        self.session_state = {}

    @cython.ccall
    def settle(self) -> None:
        """Write the batch's counters back into the record."""
        record = self.record
        record.event_count = self.count
        record.last_update_time = self.last_time
        record.last_event_id = self.last_event_id


# Indexes into the batch's lists are in range by construction: no checks.
@cython.boundscheck(False)
@cython.wraparound(False)
def append_batch(store: Any, txn: Any, batch: AppendBatch) -> BatchResult:
    """Append a batch in one transaction; a refused append raises ``PartialBatch``.

    Each session record is read once and written once per batch, and the
    event ids the batch brings are looked up in one ``getmulti`` call. A
    state key the batch sets several times is written once, with its last
    value, which is what the appends one by one would leave. Each database
    takes the batch's entries in one ``putmulti`` call, in key order.
    """
    data_db = store._data
    data = txn.cursor(db=data_db)
    format_1: cython.bint = store.format == 1
    keys: list[tuple[str, str, str]] = batch.keys
    owners: list[int] = batch.owners
    event_ids: list[str] = batch.event_ids
    timestamps: list[float] = batch.timestamps
    events: list[bytes] = batch.events
    app_items: list[Items] = batch.app_items
    user_items: list[Items] = batch.user_items
    session_items: list[Items] = batch.session_items
    sessions: dict[tuple[str, str, str], _BatchSession] = {}
    # The app and user maps the batch sets, by prefix (see _BatchSession).
    shared: dict[bytes, dict[str, bytes]] = {}
    # Each key's stored session (None: not stored); two keys naming one
    # session share its _BatchSession.
    owned: list[_BatchSession | None] = []
    for ids in keys:
        found = sessions.get(ids)
        if found is None:
            found = _batch_session(txn, store, shared, ids, format_1)
            if found is not None:
                sessions[ids] = found
        owned.append(found)
    size: cython.Py_ssize_t = len(events)
    index: cython.Py_ssize_t
    session: _BatchSession
    id_keys: list[bytes] = []
    for index in range(size):
        found = owned[owners[index]]
        if found is None:
            id_keys.append(b"")
        else:
            session = found
            id_keys.append(_id_key(session.id_prefix, event_ids[index]))
    known_ids = set(data.getmulti([k for k in id_keys if k], values=False))
    repeats: list[int] = []
    # Two keys naming one session (two live copies of it) each get the marker
    # after their own last event: only then is it tracked per key, event by
    # event; otherwise a key's marker is its session's after the batch.
    per_key: cython.bint = len(sessions) != len(keys) - owned.count(None)
    # Per key: the event count after its last event appended (None: none was), and its time.
    last_counts: list[Any] = [None] * len(keys)
    last_times: list[float] = [0.0] * len(keys)
    # Events of this batch by id key: not yet in the store, seen by repeats.
    batch_events: dict[bytes, bytes] = {}
    items: Items
    owner: cython.Py_ssize_t
    count: cython.longlong
    timestamp: cython.double
    for index in range(size):
        owner = owners[index]
        found = owned[owner]
        id_key: bytes = id_keys[index]
        event: bytes = events[index]
        stored = None
        if found is not None:
            session = found
            stored = batch_events.get(id_key)
            if stored is None and id_key in known_ids:
                stored = _stored_event(txn, data_db, session.number, id_key)
        # A locked append of a new event to a stored session always goes on
        # (see check_append): only a missing session or a repeat is checked.
        if found is None or stored is not None:
            record = None
            if found is not None:
                session = found
                session.settle()
                record = session.record
            try:
                # A batch's requests carry no marker: a repeat changes nothing.
                if check_append(record, batch.request(index), stored) is not None:
                    repeats.append(index)
                    continue
            except Exception as error:
                raise PartialBatch(index, error) from error
        assert found is not None  # check_append refuses a missing session
        session = found
        # A loop over the few items of each map costs less than dict.update.
        items = app_items[index]
        if items:
            for key, value in items:
                session.app_state[key] = value
        items = user_items[index]
        if items:
            for key, value in items:
                session.user_state[key] = value
        items = session_items[index]
        if items:
            for key, value in items:
                session.session_state[key] = value
        timestamp = timestamps[index]
        count = session.count
        # Out of time order (see in_time_order): the session needs a time index from now on.
        if not session.timed and count != session.removed and timestamp < session.last_time:
            # The index is built from what the transaction holds: write the events so far.
            _put_entries(data, sessions, False)
            store._start_time_index(txn, session.record)
            session.timed = True
        seq: bytes = _SEQS[count] if count < _SEQ_TABLE else _U64.pack(count)
        session.events.append((session.event_prefix + seq, _stored_value(timestamp, event)))
        session.index.append((id_key, seq))
        if session.timed:
            session.index.append(
                (session.number + _EVENT_TIME + sortable_time(timestamp) + seq, b"")
            )
        batch_events[id_key] = event
        count += 1
        session.count = count
        session.last_time = timestamp
        session.last_event_id = event_ids[index]
        session.appended = True
        if per_key:
            last_counts[owner] = count
            last_times[owner] = timestamp
    _put_entries(data, sessions, True)
    shared_puts: list[tuple[bytes, bytes]] = []
    for prefix, state in shared.items():
        _add_items(shared_puts, prefix, state.items())
    if shared_puts:
        txn.cursor(db=store._shared).putmulti(shared_puts)
    sessions_db = store._sessions
    for session in sessions.values():
        session.settle()
        record = session.record
        txn.put(session.key, pack(record.to_list()), db=sessions_db)
        _relist(txn, store, record, session.app, session.key, session.old_time)
    # Each key's marker after its last event (the marker of SessionRecord, from its parts).
    markers: list[str | None] = [None] * len(keys)
    for index in range(len(keys)):
        found = owned[index]
        if found is None:
            continue
        session = found
        if per_key:
            last = last_counts[index]
            if last is not None:
                markers[index] = f"{session.marker_prefix}{last}{session.marker_suffix}"
        elif session.appended:
            markers[index] = f"{session.marker_prefix}{session.count}{session.marker_suffix}"
            last_times[index] = session.last_time
    return BatchResult(size, repeats, markers, last_times)


@cython.cfunc
def _put_entries(data: Any, sessions: dict[Any, _BatchSession], with_state: cython.bint) -> None:
    """Write the entries the sessions of a batch hold so far, in key order, and forget them.

    Keys start with the session's number, then the kind: events (b"e", by
    position), the id index (b"i"), state (b"s"), the time index (b"t").
    ``with_state``: the state entries too (the batch's last call).
    """
    puts: list[tuple[bytes, bytes]] = []
    session: _BatchSession
    for session in sorted(sessions.values(), key=_number_of):
        puts += session.events
        session.index.sort()
        puts += session.index
        if with_state and session.session_state:
            _add_items(puts, session.number + _STATE, session.session_state.items())
        session.events = []
        session.index = []
    if puts:
        data.putmulti(puts)


def _number_of(session: _BatchSession) -> bytes:
    return session.number


@cython.cfunc
def _batch_session(
    txn: Any,
    store: Any,
    shared: dict[bytes, dict[str, bytes]],
    ids: tuple[str, str, str],
    format_1: cython.bint,
) -> Any:
    """Return a batch's _BatchSession of a stored session, or None when it is not stored."""
    app_name, user_id, session_id = ids
    app: bytes = part(app_name)
    user: bytes = part(user_id)
    key: bytes = app + user + part(session_id)
    record = _read_record(txn, store, key, app_name, user_id, session_id)
    if record is None:
        return None
    return _BatchSession(
        record,
        key,
        app,
        format_1,
        shared.setdefault(_APP + app, {}),
        shared.setdefault(_USER + app + user, {}),
    )
