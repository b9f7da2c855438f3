"""The LMDB store's append bodies: one event, or a batch, inside a write transaction.

Written once, as annotated Python in Cython's pure-Python mode: ``setup.py``
compiles this file a second time as ``sessionscope.stores._lmdb_append_c``,
and this module stays importable as it is, the twin that runs where nothing
was compiled (``sessionscope.core.compiled_or_twin`` picks one). The store
(``lmdb.py``) keeps the lifecycle, locking, group commit and errors; it calls
these functions inside its transactions and hands them itself, whose handles
(``_sessions``, ``_shared``, ``_data``, ``_listing``) and format they read.

Only what every append runs is here: the keys of its entries, the session
record's read, check and write, and the list index move. A rare step (the
first event out of time order, a locked append's catch-up) calls back into
the store.
"""

from __future__ import annotations

from functools import lru_cache
from hashlib import blake2b
from struct import Struct
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from .. import _no_cython as cython
    from .base import Items
else:
    try:
        import cython
    except ImportError:  # a pure install runs without Cython
        from .. import _no_cython as cython

from ..codec import pack, unpack
from ..errors import CorruptStoreError, StoreError
from .base import (
    AppendRequest,
    AppendResult,
    PartialBatch,
    SessionRecord,
    catch_up,
    check_append,
    events_seen,
)

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
]

_APP, _USER = b"a", b"u"
_EVENT, _EVENT_ID, _EVENT_TIME, _STATE = b"e", b"i", b"t", b"s"
_RAW_PART_LIMIT = 150
_DIGEST_MARK = b"\xff\xff"
_U64 = Struct(">Q")
_F64 = Struct(">d")


def unique_part(text: str) -> bytes:
    """Return the key part of an id: self-delimiting, so parts concatenate safely."""
    raw: bytes = text.encode()
    size: cython.Py_ssize_t = len(raw)
    if size <= _RAW_PART_LIMIT:
        short: bytes = size.to_bytes(2, "big") + raw
        return short
    return _DIGEST_MARK + blake2b(raw, digest_size=32).digest()


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
        (number + _EVENT + seq, _F64.pack(timestamp) + request.event),
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
        id_key = number + _EVENT_ID + unique_part(request.event_id)
        stored = _stored_event(txn, data_db, number, id_key)
    if check_append(record, request, stored):
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
    puts.append((number + _EVENT + seq, _F64.pack(timestamp) + request.event))
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


# The two steps of a locked append's catch-up live in their own functions: a
# closure in append_one would cost every append a scope object.
def _events_seen(
    txn: Any, data_db: Any, number: bytes, request: AppendRequest, record: SessionRecord
) -> int | None:
    def seq_of(event_id: str) -> int | None:
        seq = txn.get(number + _EVENT_ID + unique_part(event_id), db=data_db)
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


def append_batch(store: Any, txn: Any, requests: list[AppendRequest]) -> list[AppendResult]:
    """Append a batch in one transaction; a refused append raises ``PartialBatch``.

    Each session record is read once and written once per batch. A state key
    the batch sets several times is written once, with its last value, which
    is what the appends one by one would leave. Each database takes the
    batch's entries in one ``putmulti`` call rather than a Python call per entry.
    """
    data_db = store._data
    data = txn.cursor(db=data_db)
    format_1: cython.bint = store.format == 1
    results: list[AppendResult] = []
    # Each session of the batch by its ids (see _batch_session).
    sessions: dict[tuple[str, str, str], tuple[Any, ...]] = {}
    # The app and user state the batch sets, by map prefix: key -> packed
    # value, the last one set. (Each session's own is kept with the session.)
    shared: dict[bytes, dict[str, bytes]] = {}
    event_puts: list[tuple[bytes, bytes]] = []
    # Events of this batch by id key: not yet in the store, seen by repeats.
    batch_events: dict[bytes, bytes] = {}
    index: cython.Py_ssize_t = -1
    number: bytes
    for request in requests:
        index += 1
        ids = (request.app_name, request.user_id, request.session_id)
        known = sessions.get(ids)
        if known is None:
            known = _batch_session(txn, store, shared, ids)
            if known is not None:
                sessions[ids] = known
        record = None
        stored = None
        id_key: bytes = b""
        if known is not None:
            record = known[0]
            number = known[1]
            id_key = number + _EVENT_ID + unique_part(request.event_id)
            stored = batch_events.get(id_key)
            if stored is None:
                stored = _stored_event(txn, data_db, number, id_key)
        # A locked append of a new event to a stored session always goes on
        # (see check_append): only the other cases are checked.
        if record is None or stored is not None or not request.locked:
            try:
                if check_append(record, request, stored):
                    results.append(AppendResult(None, duplicate=True))
                    continue
            except Exception as error:
                raise PartialBatch(index, error) from error
        assert record is not None and known is not None
        if request.app_items:
            known[5].update(request.app_items)
        if request.user_items:
            known[6].update(request.user_items)
        if request.session_items:
            known[7].update(request.session_items)
        timestamp: float = request.timestamp
        timed: cython.bint = format_1 or record.time_indexed
        if (
            not timed
            and record.event_count != record.removed_count
            and (timestamp < record.last_update_time)
        ):
            # The index is built from what the transaction holds: write the events so far.
            if event_puts:
                data.putmulti(event_puts)
                event_puts.clear()
            store._start_time_index(txn, record)
            timed = True
        count: int = record.event_count
        seq: bytes = _U64.pack(count)
        event_puts.append((number + _EVENT + seq, _F64.pack(timestamp) + request.event))
        event_puts.append((id_key, seq))
        if timed:
            event_puts.append((number + _EVENT_TIME + sortable_time(timestamp) + seq, b""))
        batch_events[id_key] = request.event
        record.event_count = count + 1
        record.last_update_time = timestamp
        record.last_event_id = request.event_id
        results.append(AppendResult(record.marker, timestamp))
    # putmulti writes in list order and overwrites: the last write of a key
    # wins. (Sorting first was measured slower than it saves.)
    if event_puts:
        data.putmulti(event_puts)
    state_puts: list[tuple[bytes, bytes]] = []
    for known in sessions.values():
        if known[7]:
            _add_items(state_puts, known[1] + _STATE, known[7].items())
    if state_puts:
        data.putmulti(state_puts)
    shared_puts: list[tuple[bytes, bytes]] = []
    for owner, items in shared.items():
        _add_items(shared_puts, owner, items.items())
    if shared_puts:
        txn.cursor(db=store._shared).putmulti(shared_puts)
    sessions_db = store._sessions
    for known in sessions.values():
        record = known[0]
        txn.put(known[2], pack(record.to_list()), db=sessions_db)
        _relist(txn, store, record, known[3], known[2], known[4])
    return results


@cython.cfunc
def _batch_session(
    txn: Any, store: Any, shared: dict[bytes, dict[str, bytes]], ids: tuple[str, str, str]
) -> Any:
    """Return what a batch keeps of a stored session, or None when it is not stored.

    (record, number, record key, app part, last update time before the batch,
    then the maps of state the batch sets: the app's, the user's, the session's.)
    """
    app_name, user_id, session_id = ids
    app: bytes = part(app_name)
    user: bytes = part(user_id)
    key: bytes = app + user + part(session_id)
    record = _read_record(txn, store, key, app_name, user_id, session_id)
    if record is None:
        return None
    number: bytes = _U64.pack(record.number)
    return (
        record,
        number,
        key,
        app,
        record.last_update_time,
        shared.setdefault(_APP + app, {}),
        shared.setdefault(_USER + app + user, {}),
        {},
    )
