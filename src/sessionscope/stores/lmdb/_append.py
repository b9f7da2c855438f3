"""The LMDB store's append bodies (one event, or a batch), and a commit's common path.

Written once, as annotated Python in Cython's pure-Python mode: ``setup.py``
compiles this file a second time as ``sessionscope.stores.lmdb._append_c``,
and this module stays importable as it is, the twin that runs where nothing
was compiled (``sessionscope.core.compiled_or_twin`` picks one). The store
calls these functions inside its transactions and hands them its database
handles (``layout.Databases``); the writer hands ``commit`` itself.

Only what every append runs is here: the keys of its entries, the session
record's read, check and write, and the list index move; and a commit's
transaction (``commit``). Keys and values are built by ``layout``, the one
place that says what the store holds; a rare step (the first event out of
time order, a locked append's catch-up) is a ``layout`` function too.

py-lmdb's arguments are passed by position here, as in ``layout``'s
append helpers (see there why): ``txn.put(key, value, True, True, False,
db)`` is a plain put into ``db``.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..._speedups import _no_cython as cython
    from ..records import BatchSlices, Items
    from . import layout
    from .writer import Writer
else:
    try:
        import cython
    except ImportError:  # a pure install runs without Cython
        from ..._speedups import _no_cython as cython

from ...core import compiled_or_twin, revision_marker, sized_key, timed_record
from ..records import (
    AppendBatch,
    AppendRequest,
    AppendResult,
    BatchResult,
    PartialBatch,
    SessionRecord,
)
from ..rules import catch_up, catch_up_repeat, check_append, events_seen
from .layout import (
    APP,
    EVENT,
    EVENT_ID,
    EVENT_TIME,
    RAW_PART_LIMIT,
    STATE,
    U64,
    USER,
    Databases,
)
from .opening import file_id

if TYPE_CHECKING:
    _c_stat: Any = os.stat
    _StatBuf: Any = os.stat_result
elif cython.compiled:
    # stat(2) itself: os.stat builds a stat_result of some twenty objects,
    # which took about as long as the system call on every commit.
    from cython.cimports.posix.stat import stat as _c_stat
    from cython.cimports.posix.stat import struct_stat as _StatBuf

if not TYPE_CHECKING:
    # The layout's compiled build where there is one: every append runs its
    # key and record helpers. (Its constants are the same bytes either way.)
    layout = compiled_or_twin("sessionscope.stores.lmdb.layout")

__all__ = [
    "LockFileReplaced",
    "append_batch",
    "append_one",
    "append_slices",
    "commit",
    "write_append",
]

# The 8-byte positions of a session's first events, made once: a batch takes
# its events' positions from here rather than packing each.
_SEQ_TABLE = 4096
_SEQS: list[bytes] = [U64.pack(seq) for seq in range(_SEQ_TABLE)]


@cython.cfunc
def _id_key(prefix: bytes, event_id: str) -> bytes:
    """Return an event's id index key: ``prefix``, then ``layout.unique_part(event_id)``.

    The common id's key is made in one allocation; a long id (stored under a
    digest) or a str subclass takes unique_part's way.
    """
    made: Any = sized_key(prefix, event_id, RAW_PART_LIMIT)
    if made is None:
        made = prefix + layout.unique_part(event_id)
    key: bytes = made
    return key


@cython.cfunc
def _add_items(puts: list[tuple[bytes, bytes]], owner: bytes, items: Any) -> cython.int:
    """Add the entries of state items stored under ``owner`` to ``puts``."""
    if items:
        puts += layout.item_entries(owner, items)
    return 0


@cython.cfunc
def _read_record(
    txn: Any, dbs: Databases, key: bytes, app_name: str, user_id: str, session_id: str
) -> Any:
    """Return the session record stored under ``key``, or None."""
    data = txn.get(key, None, dbs.sessions)
    if data is None:
        return None
    return layout.checked_record(data, app_name, user_id, session_id)


@cython.cfunc
def _stored_event(txn: Any, data_db: Any, number: bytes, id_key: bytes) -> Any:
    """Return the stored record of the session's event under ``id_key``, if any."""
    seq = txn.get(id_key, None, data_db)
    if seq is None:
        return None
    stored: bytes = txn.get(number + EVENT + seq, None, data_db)
    return stored[8:]


class LockFileReplaced(Exception):
    """The store's lock file is no longer the one it opened: nothing was written."""


@cython.cfunc
def _lock_file_unchanged(writer: Writer) -> cython.bint:
    """Tell whether the store's lock file is still the one it opened (one stat, by path)."""
    opened = writer.lock_id
    if opened is None:
        return False
    if cython.compiled:
        found = cython.declare(_StatBuf)
        name: bytes = writer.lock_bytes
        path: cython.p_const_char = name
        failed: cython.int
        # As os.stat does: a slow disk must not hold up the other threads.
        with cython.nogil:
            failed = _c_stat(path, cython.address(found))
        if failed != 0:
            return False
        device: cython.ulonglong = opened[0]
        inode: cython.ulonglong = opened[1]
        same: cython.bint = found.st_dev == device and found.st_ino == inode
        return same
    else:
        return file_id(writer.lock_name) == opened


def commit(writer: Writer, actions: list[Callable[[Any], Any]]) -> list[tuple[bool, Any]]:
    """Run writes in one write transaction and commit it; return each write's outcome.

    Called holding the writer lock. What fails is raised, nothing committed:
    ``LockFileReplaced``, LMDB's errors, or a write's own error; the writer
    (``Writer.run_writes``) recovers or reports. A begin that fails is
    retried through ``Writer.begin``, which adopts a map another process
    grew and says when the store closed. Compiled, this saves every write
    the Python frames of that path.
    """
    if not _lock_file_unchanged(writer):
        raise LockFileReplaced
    gate = writer.gate
    gate.__enter__()
    try:
        txn = None
        if not writer.released:
            try:
                txn = writer.env.begin(None, None, True)
            except Exception:
                txn = None
        if txn is None:
            txn = writer.begin(write=True)
        try:
            # One write is the common case: no comprehension's frame for it.
            if len(actions) == 1:
                outcomes = [(True, actions[0](txn))]
            else:
                outcomes = [(True, action(txn)) for action in actions]
        except BaseException:
            txn.abort()
            raise
        # LMDB frees the transaction whether the commit succeeds or not.
        txn.commit()
    finally:
        gate.__exit__()
    writer.dirty = True
    if writer.warmer_idle:
        writer.wake_warmer()
    return outcomes


def write_append(writer: Writer, request: AppendRequest, txn: Any) -> AppendResult:
    """Append one event as a write of ``writer``: ``partial(write_append, writer, request)``.

    The store's write action, called by ``commit`` with no Python frame
    between them. The database handles are read in the transaction: a
    map opened again (``Writer._reopen``) replaces them.
    """
    return append_one(writer.dbs, txn, request)


def append_one(dbs: Databases, txn: Any, request: AppendRequest) -> AppendResult:
    """Append one event: check, write its entries, update the session record."""
    app_name: str = request.app_name
    user_id: str = request.user_id
    app: bytes = layout.part(app_name)
    user: bytes = layout.part(user_id)
    key: bytes = app + user + layout.part(request.session_id)
    record = _read_record(txn, dbs, key, app_name, user_id, request.session_id)
    data_db = dbs.data
    stored = None
    number: bytes = b""
    id_key: bytes = b""
    if record is not None:
        number = U64.pack(record.number)
        id_key = _id_key(number + EVENT_ID, request.event_id)
        stored = _stored_event(txn, data_db, number, id_key)
    if stored is not None:
        return _repeat(dbs, txn, record, request, stored, number, id_key)
    marker_before: str | None = None
    if record is not None:
        marker_before = revision_marker(record.number, record.event_count, record.removed_count)
    if check_append(record, request, None, None, marker_before) is not None:
        return AppendResult(None, duplicate=True)
    known = None
    catching_up: cython.bint = request.catch_up
    if catching_up:
        known = _events_seen(txn, data_db, number, request, record)
    count_before: int = record.event_count
    puts: list[tuple[bytes, bytes]] = []
    if request.app_items or request.user_items:
        shared_db = dbs.shared
        _add_items(puts, APP + app, request.app_items)
        _add_items(puts, USER + app + user, request.user_items)
        for entry_key, value in puts:
            txn.put(entry_key, value, True, True, False, shared_db)
        puts.clear()
    if request.session_items:
        _add_items(puts, number + STATE, request.session_items)
    timestamp: float = request.timestamp
    timed: cython.bint = dbs.format == 1 or record.time_indexed
    # Out of time order (see in_time_order): the session needs a time index from now on.
    if (
        not timed
        and record.event_count != record.removed_count
        and (timestamp < record.last_update_time)
    ):
        layout.start_time_index(txn, dbs, record)
        timed = True
    seq: bytes = U64.pack(count_before)
    puts.append((number + EVENT + seq, layout.event_value(timestamp, request.event)))
    puts.append((id_key, seq))
    if timed:
        puts.append((number + EVENT_TIME + layout.sortable_time(timestamp) + seq, b""))
    # One call for the session's entries (state, event, indexes): LMDB finds
    # each next key from the cursor's place rather than from the root.
    txn.cursor(data_db).putmulti(puts)
    old_time: float = record.last_update_time
    record.event_count = count_before + 1
    record.last_update_time = timestamp
    record.last_event_id = request.event_id
    txn.put(key, layout.encode_record(record), True, True, False, dbs.sessions)
    layout.relist(txn, dbs.listing, record, app, key, old_time)
    marker: str = revision_marker(record.number, count_before + 1, record.removed_count)
    result = AppendResult(marker, timestamp)
    if not catching_up:
        return result
    return _catch_up(dbs, txn, result, known, number, count_before, record)


def _repeat(
    dbs: Databases,
    txn: Any,
    record: Any,
    request: AppendRequest,
    stored: bytes,
    number: bytes,
    id_key: bytes,
) -> AppendResult:
    """Answer an append whose event id the session stores (see ``check_append``)."""
    seq = int(U64.unpack(txn.get(id_key, None, dbs.data))[0])
    repeat = check_append(record, request, stored, seq)
    assert repeat is not None  # a stored id is a repeat or a refusal
    if request.catch_up and not repeat.duplicate:
        return catch_up_repeat(repeat, seq, lambda: layout.loaded(txn, dbs, record, []))
    return repeat


# The two steps of a locked append's catch-up live in their own functions: a
# closure in append_one would cost every append a scope object.
def _events_seen(
    txn: Any, data_db: Any, number: bytes, request: AppendRequest, record: SessionRecord
) -> int | None:
    def seq_of(event_id: str) -> int | None:
        seq = txn.get(_id_key(number + EVENT_ID, event_id), None, data_db)
        return None if seq is None else int(U64.unpack(seq)[0])

    return events_seen(request, record, seq_of)


def _catch_up(
    dbs: Databases,
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
        lambda start: layout.events(txn, dbs, number, start, count_before),
        lambda: layout.loaded(txn, dbs, record, []),
    )


@cython.cclass
class _BatchSession:
    """What a batch keeps of one stored session while it appends to it.

    The record's counters live here during the batch, as C fields of a
    compiled build, and go back into the record when the batch writes it
    (``settle``). The session's entries wait here too, so that the batch
    writes them session after session, its events in key order, where LMDB
    finds each next key on the page of the last one rather than from the root.
    """

    record: SessionRecord
    # (app, user, session id): what ``seal_state`` is told of its maps.
    ids: tuple[str, str, str]
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
        ids: tuple[str, str, str],
        key: bytes,
        app: bytes,
        timed: bool,
        app_state: dict[str, bytes],
        user_state: dict[str, bytes],
    ) -> None:
        self.record = record
        self.ids = ids
        self.number = U64.pack(record.number)
        self.key = key
        self.app = app
        self.event_prefix = self.number + EVENT
        self.id_prefix = self.number + EVENT_ID
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


def append_batch(dbs: Databases, txn: Any, batch: AppendBatch) -> BatchResult:
    """Append a batch in one transaction; a refused append raises ``PartialBatch``.

    Each session record is read once and written once per batch, and the
    event ids the batch brings are looked up in one ``getmulti`` call. A
    state key the batch sets several times is written once, with its last
    value, which is what the appends one by one would leave. Each database
    takes the batch's entries in one ``putmulti`` call, in key order.
    """
    state = _BatchState(dbs, txn)
    state.seal_state = batch.seal_state
    # One part: its events go with the state entries, in finish's one putmulti.
    result = _append_part(state, batch, False)
    state.finish()
    return result


def append_slices(dbs: Databases, txn: Any, slices: BatchSlices, stop: int) -> BatchResult:
    """Append a batch's slices in one transaction, each packed as it comes and dropped once written.

    A batch of a thousand events is about a megabyte of packed bytes, more
    than a core's L2 cache: packed and written a slice at a time, those
    bytes are still in the cache when written. The slices append as one
    ``append_batch`` would (each session record read and written once, the
    state each key is left with written once), but each slice's events go
    to the database before the next slice is packed; a refused append
    raises ``PartialBatch`` with its position in the batch (once the later
    slices are checked too), and a slice's bad event raises its own error,
    which aborts the transaction. ``stop``
    (-1: none) ends the batch after its first ``stop`` events.

    The slices are asked with ``defer_sealing``: a store that seals state
    values (``AppendBatch.seal_state``) then seals only the value each key
    is left with, in ``finish``.
    """
    state = _BatchState(dbs, txn)
    results: list[BatchResult] = []
    done: cython.Py_ssize_t = 0
    number: cython.Py_ssize_t
    for number in range(len(slices)):
        if stop >= 0 and done >= stop:
            break
        batch: AppendBatch = slices.slice(number, True)
        state.seal_state = batch.seal_state
        size: cython.Py_ssize_t = len(batch.events)
        if stop >= 0 and done + size > stop:
            batch = batch.head(stop - done)
            size = stop - done
        try:
            results.append(_append_part(state, batch, True))
        except PartialBatch as partial:
            if stop < 0:
                # The later slices are checked all the same: a bad event
                # anywhere refuses the whole batch, as when it is packed whole.
                for later in range(number + 1, len(slices)):
                    slices.slice(later, True)
            raise PartialBatch(done + partial.applied, partial.error) from partial.error
        # Dropped before the next slice is packed: one slice's bytes live at a time.
        batch = None  # type: ignore[assignment]
        done += size
    state.finish()
    return slices.join(results)


@cython.cclass
class _BatchState:
    """What the parts of a batch appended in one transaction share: its sessions and shared maps.

    ``sessions`` holds each stored session the batch appends to, by key;
    ``shared`` the app and user maps it sets, by prefix (see
    ``_BatchSession``), each with what ``seal_state`` is told of it: its
    kind and the ids of a session that writes it. ``finish`` writes what
    waits until the batch's end: the state entries (through ``seal_state``,
    when the batch's items came unsealed), the session records and their
    listing.
    """

    dbs: Databases
    txn: Any
    data_db: Any
    data: Any
    format_1: cython.bint
    sessions: dict[tuple[str, str, str], _BatchSession]
    shared: dict[bytes, tuple[str, tuple[str, str, str], dict[str, bytes]]]
    seal_state: Any

    def __init__(self, dbs: Databases, txn: Any) -> None:
        self.dbs = dbs
        self.txn = txn
        self.data_db = dbs.data
        self.data = txn.cursor(dbs.data)
        self.format_1 = dbs.format == 1
        self.sessions = {}
        self.shared = {}
        self.seal_state = None

    @cython.ccall
    def finish(self) -> None:
        """Write the state entries and the session records the batch leaves."""
        dbs: Databases = self.dbs
        txn = self.txn
        sessions = self.sessions
        seal = self.seal_state
        _put_entries(self.data, sessions, True, seal)
        shared_puts: list[tuple[bytes, bytes]] = []
        for prefix, (kind, owner, state) in self.shared.items():
            if state:
                _add_items(shared_puts, prefix, _items_written(seal, kind, owner, state))
        if shared_puts:
            txn.cursor(dbs.shared).putmulti(shared_puts)
        sessions_db = dbs.sessions
        session: _BatchSession
        for session in sessions.values():
            session.settle()
            record = session.record
            txn.put(session.key, layout.encode_record(record), True, True, False, sessions_db)
            layout.relist(txn, dbs.listing, record, session.app, session.key, session.old_time)


# Indexes into the batch's lists are in range by construction: no checks.
@cython.boundscheck(False)
@cython.wraparound(False)
@cython.cfunc
def _append_part(state: _BatchState, batch: AppendBatch, write: cython.bint) -> BatchResult:
    """Append a batch, or a slice of one; a refused append raises ``PartialBatch``.

    The markers and times are those of the part's keys after it. With
    ``write`` the part's events go to the database before it returns; what
    waits for the batch's end (state entries, session records) is
    ``state.finish``'s.
    """
    dbs: Databases = state.dbs
    txn = state.txn
    data_db = state.data_db
    data = state.data
    format_1: cython.bint = state.format_1
    keys: list[tuple[str, str, str]] = batch.keys
    owners: list[int] = batch.owners
    event_ids: list[str] = batch.event_ids
    timestamps: list[float] = batch.timestamps
    events: list[bytes] = batch.events
    app_items: list[Items] = batch.app_items
    user_items: list[Items] = batch.user_items
    session_items: list[Items] = batch.session_items
    sessions: dict[tuple[str, str, str], _BatchSession] = state.sessions
    # Each key's stored session (None: not stored); two keys naming one
    # session share its _BatchSession.
    owned: list[_BatchSession | None] = []
    # The sessions of this part, each once.
    part_sessions: dict[tuple[str, str, str], _BatchSession] = {}
    session: _BatchSession
    for ids in keys:
        found = sessions.get(ids)
        if found is None:
            found = _batch_session(txn, dbs, state, ids, format_1)
            if found is not None:
                sessions[ids] = found
        if found is not None:
            session = found
            session.appended = False
            part_sessions[ids] = session
        owned.append(found)
    size: cython.Py_ssize_t = len(events)
    index: cython.Py_ssize_t
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
    # event; otherwise a key's marker is its session's after the part.
    per_key: cython.bint = len(part_sessions) != len(keys) - owned.count(None)
    # Per key: the event count after its last event appended (None: none was), and its time.
    last_counts: list[Any] = [None] * len(keys)
    last_times: list[float] = [0.0] * len(keys)
    # Events of this part by id key: not yet in the store, seen by repeats.
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
            _put_entries(data, sessions, False, None)
            layout.start_time_index(txn, dbs, session.record)
            session.timed = True
        seq: bytes = _SEQS[count] if count < _SEQ_TABLE else U64.pack(count)
        # layout.event_value's value (the time, then the record), made here
        # directly: a batch's records are bytes, and this runs for every event.
        session.events.append((session.event_prefix + seq, timed_record(timestamp, event)))
        session.index.append((id_key, seq))
        if session.timed:
            session.index.append(
                (session.number + EVENT_TIME + layout.sortable_time(timestamp) + seq, b"")
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
    if write:
        _put_entries(data, part_sessions, False, None)
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
def _put_entries(
    data: Any, sessions: dict[Any, _BatchSession], with_state: cython.bint, seal: Any
) -> None:
    """Write the entries the sessions of a batch hold so far, session by session, and forget them.

    Keys start with the session's number, then the kind: events (b"e", by
    position, so in key order), the id index (b"i") and time index (b"t")
    in the order the events came, state (b"s"). Event ids are random:
    sorting a session's index entries first cost more than the pages it
    spared LMDB's search (a batch of rich events took about 10% longer).
    ``with_state``: the state entries too (the batch's last call), each
    session's items through ``seal`` when it is not None.
    """
    puts: list[tuple[bytes, bytes]] = []
    session: _BatchSession
    for session in sorted(sessions.values(), key=_number_of):
        puts += session.events
        puts += session.index
        if with_state and session.session_state:
            items = _items_written(seal, "s", session.ids, session.session_state)
            _add_items(puts, session.number + STATE, items)
        session.events = []
        session.index = []
    if puts:
        data.putmulti(puts)


@cython.cfunc
def _items_written(
    seal: Any, kind: str, owner: tuple[str, str, str], state: dict[str, bytes]
) -> Any:
    """Return a map's items as the batch writes them: as they are, or through ``seal``."""
    if seal is None:
        return state.items()
    return seal(kind, owner, list(state.items()))


def _number_of(session: _BatchSession) -> bytes:
    return session.number


@cython.cfunc
def _batch_session(
    txn: Any,
    dbs: Databases,
    state: _BatchState,
    ids: tuple[str, str, str],
    format_1: cython.bint,
) -> Any:
    """Return a batch's _BatchSession of a stored session, or None when it is not stored."""
    app_name, user_id, session_id = ids
    app: bytes = layout.part(app_name)
    user: bytes = layout.part(user_id)
    key: bytes = app + user + layout.part(session_id)
    record = _read_record(txn, dbs, key, app_name, user_id, session_id)
    if record is None:
        return None
    shared = state.shared
    app_map = shared.setdefault(APP + app, ("a", ids, {}))[2]
    user_map = shared.setdefault(USER + app + user, ("u", ids, {}))[2]
    return _BatchSession(record, ids, key, app, format_1, app_map, user_map)
