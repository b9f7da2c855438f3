"""The durable default: sessions in an LMDB memory-mapped store.

``LmdbStore`` is the Store protocol over the parts in this package:

    layout       every key and stored value (the layout is described there)
    opening      the checks before a store opens, and LMDB's errors
    writer       the environment, transactions, group commit, its threads, map growth
    _append      the append bodies and a commit's common path (compiled)
    retention    truncation, expiry, deleting users and apps, in bounded batches
    maintenance  verify, check_layout, stat, space, copy, compact, upgrade

Durability: with ``durability="sync"`` a write returns once on disk, and the
writes that queue meanwhile are committed together (group commit); with
``"deferred"`` writes commit without fsync and a background thread syncs
every ``flush_interval`` seconds, on ``flush()``, on ``close()`` and at the
interpreter's exit (see ``writer``).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Iterator
from functools import partial, wraps
from itertools import islice, pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from ...core import compiled_or_twin
from ...errors import AlreadyExistsError, CorruptStoreError, SessionscopeError
from ..completion import Completion
from ..expiry import Expirer
from ..protocol import InlineAsyncStore
from ..records import (
    ENCRYPTION_MARKER_APP,
    AppendBatch,
    AppendRequest,
    AppendResult,
    BatchResult,
    BatchSlices,
    EventCopy,
    EventPage,
    Items,
    ListPosition,
    LoadedSession,
    PartialBatch,
    SessionCopy,
    SessionRecord,
    copies_equal,
    event_copy,
    result_of_batch,
)
from ..rules import (
    append_chain,
    check_copy,
    check_ttl,
    list_position,
    page_records,
    refuse_encrypted,
)
from . import maintenance, retention
from .layout import (
    APP,
    EVENT,
    EVENT_ID,
    EVENT_TIME,
    F64,
    FORMAT_VERSION,
    STATE,
    U64,
    USER,
    Databases,
)
from .opening import (
    DEFAULT_MAP_SIZE,
    check_options,
    check_store_files,
    open_failure,
    path_uri,
    probe,
)
from .writer import Durability, Writer

if TYPE_CHECKING:
    # The source is the type source; its compiled build has the same signatures.
    from . import _append as _hot
    from . import layout as _layout
else:
    _hot = compiled_or_twin("sessionscope.stores.lmdb._append")
    # The layout's compiled build, for the reads every get_session makes.
    _layout = compiled_or_twin("sessionscope.stores.lmdb.layout")

__all__ = ["FORMAT_VERSION", "LmdbStore", "path_uri"]

_log = logging.getLogger(__name__)

_Init = TypeVar("_Init", bound=Callable[..., None])


def _logs_refusal(init: _Init) -> _Init:
    """Log why a store refused to open (at INFO: the caller gets the error too)."""

    @wraps(init)
    def opening(self: LmdbStore, *args: Any, **kwargs: Any) -> None:
        try:
            init(self, *args, **kwargs)
        except SessionscopeError as error:
            _log.info("refused to open the store at %s: %s", self.path, error)
            raise

    return cast(_Init, opening)


def _refuse_encrypted_at(path: Path) -> Callable[[Any, Databases], None]:
    """Return the opening check that refuses the store at ``path`` if it was written encrypted."""

    def check(txn: Any, dbs: Databases) -> None:
        marker = _layout.read_map(txn, dbs.shared, APP + _layout.part(ENCRYPTION_MARKER_APP))
        refuse_encrypted(marker, str(path))

    return check


class LmdbStore:
    """A durable store in one directory, shared safely by several processes.

    A store written encrypted is refused (``IncompatibleStoreError``), so that
    nothing is written into it in plaintext: ``open_store`` with its key opens
    it. ``encrypted_ok=True`` opens it as it is, for what seals every value it
    writes (``sessionscope.crypto.open_encrypted``) or reads only structure.
    """

    @_logs_refusal
    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durability: Durability = "sync",
        map_size: int = DEFAULT_MAP_SIZE,
        flush_interval: float = 1.0,
        file_mode: int = 0o600,
        max_readers: int = 256,
        session_ttl: float | None = None,
        verify: bool = False,
        trust_directory: bool = False,
        encrypted_ok: bool = False,
        read_ahead: bool = True,
    ) -> None:
        ttl = check_ttl(session_ttl)
        map_size = check_options(durability, map_size, flush_interval, file_mode, max_readers)
        self.path = Path(path)
        self.aio = InlineAsyncStore(self)
        self.durability: Durability = durability
        self.flush_interval = flush_interval
        try:
            # Refuse a directory others could write to, planted links, and a
            # path that is not ours, before LMDB creates or writes a file there.
            check_store_files(self.path, file_mode, trust_directory)
            self._opened_elsewhere = probe(self.path, verify)
        except OSError as error:  # a directory that cannot be listed or read
            raise open_failure(self.path, error) from error
        if not self.path.exists():
            # A directory needs the search bit wherever its files are readable.
            try:
                self.path.mkdir(mode=file_mode | (file_mode & 0o444) >> 2, parents=True)
            except OSError as error:
                raise open_failure(self.path, error) from error
        self._writer = Writer(
            self.path,
            durability=durability,
            map_size=map_size,
            flush_interval=flush_interval,
            file_mode=file_mode,
            max_readers=max_readers,
            check=None if encrypted_ok else _refuse_encrypted_at(self.path),
            read_ahead=read_ahead,
        )
        # Expires idle sessions at open and then periodically, with session_ttl.
        self.session_ttl = ttl
        self._expirer = Expirer(self, ttl) if ttl is not None else None
        if self._expirer is not None:
            self._expirer.start()

    def __repr__(self) -> str:
        return f"LmdbStore({str(self.path)!r}, durability={self.durability!r})"

    def opened_elsewhere(self) -> bool:
        """Tell whether another process had this store open as this one opened it.

        Asked of the lock file before LMDB opened it here: asked later, the
        question's own descriptor, once closed, would drop this process's
        locks on the file (see ``Store.opened_elsewhere``).
        """
        return self._opened_elsewhere

    @property
    def uri(self) -> str:
        """Return the URI ``open_store`` takes to open this store again."""
        return f"{path_uri(self.path)}?durability={self.durability}"

    @property
    def format(self) -> int:
        """The format the store was written in (read at open); see ``FORMAT_VERSION``."""
        return self._writer.dbs.format

    @property
    def writemap(self) -> bool:
        """Whether this store writes through a writable map (deferred stores, where safe)."""
        return self._writer.writemap

    # -- the Store protocol ----------------------------------------------

    def create_session(
        self,
        app_name: str,
        user_id: str,
        session_id: str,
        create_time: float,
        app_items: Items,
        user_items: Items,
        session_items: Items,
    ) -> Completion[LoadedSession]:
        """Store a new session and return it with the shared maps merged in.

        AlreadyExistsError if the id is taken.
        """

        def create(txn: Any) -> LoadedSession:
            dbs = self._writer.dbs
            if _layout.read_record(txn, dbs, app_name, user_id, session_id) is not None:
                raise AlreadyExistsError(f"session {session_id!r} already exists")
            meta = dbs.meta
            number = _layout.take_number(txn, meta)
            record = SessionRecord(app_name, user_id, session_id, number, create_time, create_time)
            _layout.put_record(txn, dbs, record)
            _layout.list_new(
                txn,
                dbs.listing,
                record,
                _layout.session_key(record.app_name, record.user_id, record.session_id),
            )
            _layout.put_items(txn, dbs.data, U64.pack(number) + STATE, session_items)
            _layout.put_items(txn, dbs.shared, APP + _layout.part(app_name), app_items)
            _layout.put_items(
                txn, dbs.shared, USER + _layout.part(app_name) + _layout.part(user_id), user_items
            )
            return _layout.loaded(txn, dbs, record, [])

        return self._writer.write(create)

    def load_session(
        self,
        app_name: str,
        user_id: str,
        session_id: str,
        num_recent_events: int | None,
        after_timestamp: float | None,
    ) -> LoadedSession | None:
        """Read a session with the events the filters select, in append order."""

        def load(txn: Any) -> LoadedSession | None:
            dbs = self._writer.dbs
            record = _layout.read_record(txn, dbs, app_name, user_id, session_id)
            if record is None:
                return None
            number = U64.pack(record.number)
            count = record.event_count
            if record.removed_count and num_recent_events is not None:
                # Positions have gaps after a truncation: count back from the end.
                recent = _last_events(txn, dbs, number, num_recent_events)
                low = -math.inf if after_timestamp is None else after_timestamp
                events = [v[8:] for v in recent if F64.unpack_from(v)[0] >= low]
            elif after_timestamp is not None:
                events = _events_after(
                    txn, dbs, number, count, num_recent_events, after_timestamp, dbs.timed(record)
                )
            elif num_recent_events is not None:
                events = _layout.events(txn, dbs, number, max(0, count - num_recent_events), count)
            else:
                events = _layout.events(txn, dbs, number, 0, count)
            return _layout.loaded(txn, dbs, record, events)

        return self._writer.read(load)

    def read_events(
        self, app_name: str, user_id: str, session_id: str, start: int, limit: int
    ) -> EventPage | None:
        """Return a session's record and up to ``limit`` stored events from position ``start``.

        Each event comes with its position (positions count every event ever
        appended; a truncation leaves gaps). Reading a long session page by
        page, from the last position read plus one, keeps memory bounded:
        what the command line's export, stats and verify do. None if the
        session does not exist.
        """

        def read(txn: Any) -> EventPage | None:
            dbs = self._writer.dbs
            record = _layout.read_record(txn, dbs, app_name, user_id, session_id)
            if record is None:
                return None
            prefix = U64.pack(record.number) + EVENT
            events: list[tuple[int, bytes]] = []
            cursor = txn.cursor(db=dbs.data)
            if limit <= 0 or not cursor.set_range(prefix + U64.pack(max(0, start))):
                return record, events
            for key, value in cursor.iternext():
                if not key.startswith(prefix) or len(events) >= limit:
                    break
                events.append((U64.unpack(key[9:17])[0], value[8:]))
            return record, events

        return self._writer.read(read)

    def list_sessions(self, app_name: str, user_id: str | None) -> list[SessionRecord]:
        """Return the records of an app's (or one user's) sessions, in key order."""
        prefix = _layout.part(app_name) + (_layout.part(user_id) if user_id is not None else b"")

        def scan(txn: Any) -> list[SessionRecord]:
            return _layout.records_under(txn, self._writer.dbs, prefix)

        return self._writer.read(scan)

    def list_page(
        self,
        app_name: str,
        user_id: str | None,
        limit: int | None,
        after: ListPosition | None,
    ) -> tuple[list[SessionRecord], bool]:
        """Return one page of sessions in listing order; see ``Store.list_page``.

        With the list index (format 2) a page of an app reads its own
        entries only, from ``after``'s time on: one index entry and one
        record per session, plus every session that shares a time with the
        page's last (a run of equal times is sorted by ids). One user's
        sessions, a whole listing, and stores of format 1 are read whole
        and sorted.
        """
        listing = self._writer.dbs.listing
        if listing is None or user_id is not None or limit is None:
            return page_records(self.list_sessions(app_name, user_id), limit, after)
        app = _layout.part(app_name)
        width = len(app) + 16

        def runs(cursor: Any) -> Iterator[list[bytes]]:
            """Yield the session keys of the app's entries, one list per run of equal times."""
            run: list[bytes] = []
            stamp = b""
            for key, value in cursor.iternext():
                if len(key) != width or not key.startswith(app):
                    break
                this = key[len(app) : len(app) + 8]
                if this != stamp and run:
                    yield run
                    run = []
                stamp = this
                run.append(value)
            if run:
                yield run

        def read(txn: Any) -> tuple[list[SessionRecord], bool]:
            dbs = self._writer.dbs
            cursor = txn.cursor(db=listing)
            start = app if after is None else app + _layout.sortable_time(after[0])
            page: list[SessionRecord] = []
            if not cursor.set_range(start):
                return page, False
            for run in runs(cursor):
                records = []
                for key in run:
                    value = txn.get(key, db=dbs.sessions)
                    if value is None:
                        raise CorruptStoreError(
                            f"the list index of app {app_name!r} names a session that is gone",
                            hint="run 'sessionscope verify' on the store",
                        )
                    records.append(_layout.decode_record(value))
                records.sort(key=list_position)
                if after is not None:
                    records = [r for r in records if list_position(r) > after]
                page.extend(records)
                if len(page) > limit:
                    break
            return page[:limit], len(page) > limit

        return self._writer.read(read)

    def delete_session(self, app_name: str, user_id: str, session_id: str) -> Completion[None]:
        """Remove a session with its state and events; a missing one is a no-op."""

        def delete(txn: Any) -> None:
            dbs = self._writer.dbs
            record = _layout.read_record(txn, dbs, app_name, user_id, session_id)
            if record is None:
                return
            key = _layout.part(app_name) + _layout.part(user_id) + _layout.part(session_id)
            txn.delete(key, db=dbs.sessions)
            _layout.unlist(txn, dbs.listing, record)
            prefix = U64.pack(record.number)
            cursor = txn.cursor(db=dbs.data)
            if cursor.set_range(prefix):
                # delete() moves the cursor to the next entry, or past the end.
                while cursor.key().startswith(prefix) and cursor.delete():
                    pass

        return self._writer.write(delete)

    @property
    def databases(self) -> dict[bytes, Any]:
        """Return the store's named LMDB databases by name (not part of the Store protocol).

        For harnesses that look at an append's reads and writes (the bench's
        shape of an append): the handles belong to this store's environment.
        """
        return dict(self._writer.dbs.items())

    def append(self, request: AppendRequest) -> Completion[AppendResult]:
        """Append one event and apply its packed delta, all or nothing."""
        return self._writer.write(partial(_hot.write_append, self._writer, request))

    def append_chain(self, requests: list[AppendRequest]) -> Completion[list[AppendResult]]:
        """Append events to one session in order, all or none, in one transaction.

        See ``ChainStore.append_chain``: an error in any aborts the transaction,
        and nothing of the chain is stored. A durable store syncs it once.
        """
        writer = self._writer

        def append_all(txn: Any) -> list[AppendResult]:
            dbs = writer.dbs
            return append_chain(requests, lambda request: _hot.append_one(dbs, txn, request))

        return writer.write(append_all)

    def append_many(self, batch: AppendBatch) -> Completion[BatchResult]:
        """Append a batch in one transaction; on an error, commit those before it.

        Each session record is read once and written once per batch, and the
        batch's entries go to each database in one ``putmulti`` call rather
        than a Python call per entry.
        """

        def append_all(txn: Any) -> BatchResult:
            dbs = self._writer.dbs
            return _hot.append_batch(dbs, txn, batch)

        try:
            return Completion.done(self._writer.write(append_all).result())
        except PartialBatch as partial:
            # The transaction was aborted: append again what came before the error.
            if partial.applied:
                done = self.append_many(batch.head(partial.applied)).result()
            else:
                done = result_of_batch(batch, [], None)
            done.error = partial.error
            return Completion.done(done)

    def append_slices(self, slices: BatchSlices) -> Completion[BatchResult]:
        """Append a batch as ``append_many`` does, in one transaction, a slice at a time.

        Each slice is packed, written and dropped before the next is packed
        (``_append.append_slices``). A bad event in any slice aborts the
        transaction: nothing of the batch is stored, and its error is raised.
        """
        return Completion.done(self._append_sliced(slices, -1))

    def _append_sliced(self, slices: BatchSlices, stop: int) -> BatchResult:
        def append_all(txn: Any) -> BatchResult:
            return _hot.append_slices(self._writer.dbs, txn, slices, stop)

        try:
            return self._writer.write(append_all).result()
        except PartialBatch as partial:
            # The transaction was aborted: append again what came before the error.
            done = (
                self._append_sliced(slices, partial.applied) if partial.applied else slices.join([])
            )
            done.error = partial.error
            return done

    def read_app_state(self, app_name: str) -> dict[str, Any]:
        """Return the app map, keys without prefix."""
        return self._writer.read(
            lambda txn: _layout.read_map(txn, self._writer.dbs.shared, APP + _layout.part(app_name))
        )

    def read_user_state(self, app_name: str, user_id: str) -> dict[str, Any]:
        """Return the user map, keys without prefix."""
        owner = USER + _layout.part(app_name) + _layout.part(user_id)
        return self._writer.read(lambda txn: _layout.read_map(txn, self._writer.dbs.shared, owner))

    # -- retention -------------------------------------------------------

    def truncate_events(
        self,
        app_name: str,
        user_id: str,
        session_id: str,
        before: float | None,
        keep_last: int | None,
    ) -> Completion[int]:
        """Remove events with ``timestamp < before``, or all but the last ``keep_last``."""
        return retention.truncate_events(
            self._writer, app_name, user_id, session_id, before, keep_last
        )

    def pop_events(
        self,
        app_name: str,
        user_id: str,
        session_id: str,
        count: int,
        *,
        if_last_event_id: str | None = None,
    ) -> Completion[list[bytes]]:
        """Remove a session's newest ``count`` events in one transaction; return their records.

        With ``if_last_event_id``, only if the newest stored event has that id.
        """
        return retention.pop_events(
            self._writer, app_name, user_id, session_id, count, if_last_event_id
        )

    def expire_sessions(self, app_name: str | None, idle_before: float) -> Completion[int]:
        """Delete the sessions whose last update is before ``idle_before``, in batches."""
        return retention.expire_sessions(self._writer, app_name, idle_before, self._stopping_expiry)

    def delete_user(self, app_name: str, user_id: str) -> Completion[int]:
        """Delete every session of a user, then the user's state map."""
        return retention.delete_user(self._writer, app_name, user_id, self._stopping_expiry)

    def delete_app(self, app_name: str) -> Completion[int]:
        """Delete every session of an app, then its user maps and its app map."""
        return retention.delete_app(self._writer, app_name, self._stopping_expiry)

    def _stopping_expiry(self) -> bool:
        return self._expirer is not None and self._expirer.stopping

    # -- listing and copies ------------------------------------------------

    def list_apps(self) -> list[str]:
        """Return the apps that have a session, app state or user state, sorted.

        An app whose id is over 150 bytes is keyed by a digest: it is listed
        through its sessions, not through its state alone.
        """

        def scan(txn: Any) -> list[str]:
            dbs = self._writer.dbs
            names = {record.app_name for record in _first_records(txn, dbs, b"", 1)}
            for tag in (APP, USER):
                names.update(_layout.raw_names(txn.cursor(db=dbs.shared), tag, 1))
            return sorted(names)

        return self._writer.read(scan)

    def list_users(self, app_name: str) -> list[str]:
        """Return the users of an app that have a session or user state, sorted.

        A user whose id is over 150 bytes is listed through its sessions only.
        """
        app = _layout.part(app_name)

        def scan(txn: Any) -> list[str]:
            dbs = self._writer.dbs
            names = {record.user_id for record in _first_records(txn, dbs, app, 2)}
            names.update(_layout.raw_names(txn.cursor(db=dbs.shared), USER + app, 1))
            return sorted(names)

        return self._writer.read(scan)

    def restore_session(self, copy: SessionCopy) -> Completion[bool]:
        """Write a whole session as given, in one transaction; False when already equal."""
        check_copy(copy)
        entries = [
            (
                U64.pack(seq),
                _layout.event_value(event.timestamp, event.record),
                _layout.unique_part(event.event_id),
                _layout.sortable_time(event.timestamp),
            )
            for seq, event in enumerate(copy.events)
        ]

        def restore(txn: Any) -> bool:
            dbs = self._writer.dbs
            found = _layout.read_record(txn, dbs, copy.app_name, copy.user_id, copy.session_id)
            if found is not None:
                if copies_equal(_session_copy(txn, dbs, found), copy):
                    return False
                raise AlreadyExistsError(
                    f"session {copy.session_id!r} already exists with other content"
                )
            meta = dbs.meta
            number = _layout.take_number(txn, meta)
            last = copy.events[-1].event_id if copy.events else None
            stamps = [event.timestamp for event in copy.events]
            # In time order, and no later than the record's time: no time index (format 2).
            ordered = all(a <= b for a, b in pairwise(stamps)) and (
                not stamps or stamps[-1] <= copy.last_update_time
            )
            record = SessionRecord(
                copy.app_name,
                copy.user_id,
                copy.session_id,
                number,
                copy.create_time,
                copy.last_update_time,
                len(copy.events),
                last,
                time_indexed=dbs.format > 1 and not ordered,
            )
            timed = dbs.timed(record)
            _layout.put_record(txn, dbs, record)
            _layout.list_new(
                txn,
                dbs.listing,
                record,
                _layout.session_key(record.app_name, record.user_id, record.session_id),
            )
            owner = U64.pack(number)
            _layout.put_items(txn, dbs.data, owner + STATE, copy.session_items)
            puts: list[tuple[bytes, bytes]] = []
            for seq, value, id_part, stamp in entries:
                puts.append((owner + EVENT + seq, value))
                puts.append((owner + EVENT_ID + id_part, seq))
                if timed:
                    puts.append((owner + EVENT_TIME + stamp + seq, b""))
            if puts:
                txn.cursor(db=dbs.data).putmulti(puts)
            return True

        return self._writer.write(restore)

    def write_app_state(self, app_name: str, items: Items) -> Completion[None]:
        """Set keys of the app map, leaving other keys as they are."""
        owner = APP + _layout.part(app_name)
        return self._writer.write(
            lambda txn: _layout.put_items(txn, self._writer.dbs.shared, owner, items)
        )

    def write_user_state(self, app_name: str, user_id: str, items: Items) -> Completion[None]:
        """Set keys of a user map, leaving other keys as they are."""
        owner = USER + _layout.part(app_name) + _layout.part(user_id)
        return self._writer.write(
            lambda txn: _layout.put_items(txn, self._writer.dbs.shared, owner, items)
        )

    def flush(self) -> Completion[None]:
        """Make every acknowledged write durable."""
        return self._writer.flush()

    def close(self) -> None:
        """Flush, stop the background threads and release the environment.

        In a child process that inherited the store through fork(), only
        mark it closed: the environment and the threads belong to the parent.
        """
        if self._writer.closed:
            return
        if self._expirer is not None and not self._writer.forked:
            self._expirer.stop()
        self._writer.close()

    # -- operations (see maintenance) ----------------------------------------

    def verify(self) -> None:
        """Check every page of the store's data file; raise CorruptStoreError if one is wrong."""
        maintenance.verify(self._writer)

    def stat(self) -> dict[str, Any]:
        """Return LMDB's figures: map size, pages used, last transaction, entries per database."""
        return maintenance.stat(self._writer)

    def check_layout(self, progress: Callable[[int, int], None] | None = None) -> list[str]:
        """Return the problems of the key layout; an empty list when it is sound."""
        return maintenance.check_layout(self._writer, progress)

    def space(self) -> dict[str, int]:
        """Return the file's size and how its pages are used."""
        return maintenance.space(self._writer)

    def copy_to(self, dest: str | os.PathLike[str]) -> None:
        """Write a consistent, compacted copy of the store into the empty directory ``dest``."""
        maintenance.copy_to(self._writer, dest)

    compact = staticmethod(maintenance.compact)
    upgrade = staticmethod(maintenance.upgrade)


# -- reads ---------------------------------------------------------------------


def _last_events(txn: Any, dbs: Databases, number: bytes, n: int) -> list[bytes]:
    """Return the last ``n`` stored values (timestamp + record) of a session, in order."""
    cursor = txn.cursor(db=dbs.data)
    prefix = number + EVENT
    # The first key after the session's events, then back.
    following = _layout.after(prefix) or prefix
    positioned = cursor.prev() if cursor.set_range(following) else cursor.last()
    values: list[bytes] = []
    while positioned and len(values) < n and cursor.key().startswith(prefix):
        values.append(cursor.value())
        positioned = cursor.prev()
    values.reverse()
    return values


def _events_after(
    txn: Any,
    dbs: Databases,
    number: bytes,
    count: int,
    num_recent: int | None,
    after: float,
    timed: bool,
) -> list[bytes]:
    cursor = txn.cursor(db=dbs.data)
    if num_recent is not None:
        # The last n first, then the filter: a timestamp leads each value.
        start = max(0, count - num_recent)
        if start >= count or not cursor.set_key(number + EVENT + U64.pack(start)):
            return []
        values = islice(cursor.iternext(keys=False), count - start)
        return [v[8:] for v in values if F64.unpack_from(v)[0] >= after]
    if not timed:
        return _events_from_time(cursor, number, count, after)
    # Only the index entries at or after the time are read.
    prefix = number + EVENT_TIME
    seqs: list[bytes] = []
    if cursor.set_range(prefix + _layout.sortable_time(after)):
        for key in cursor.iternext(values=False):
            if not key.startswith(prefix):
                break
            seqs.append(key[17:25])
    seqs.sort()
    event = number + EVENT
    return [cursor.get(event + seq)[8:] for seq in seqs]


def _events_from_time(cursor: Any, number: bytes, count: int, after: float) -> list[bytes]:
    """Return the events at or after ``after`` of a session whose events are in time order.

    A binary search over positions (with gaps after a truncation) finds
    the first such event in about log2(count) seeks; the rest follow it.
    """
    prefix = number + EVENT
    low, high = 0, count
    # Invariant: stored events before ``low`` are earlier than ``after``,
    # stored events from ``high`` on are not.
    while low < high:
        middle = (low + high) // 2
        if not cursor.set_range(prefix + U64.pack(middle)) or not cursor.key().startswith(prefix):
            high = middle
            continue
        if F64.unpack_from(cursor.value())[0] < after:
            low = U64.unpack(cursor.key()[9:17])[0] + 1
        else:
            high = middle
    if not cursor.set_range(prefix + U64.pack(low)):
        return []
    values: list[bytes] = []
    for key, value in cursor.iternext():
        if not key.startswith(prefix):
            break
        values.append(value[8:])
    return values


# -- the Store protocol ----------------------------------------------


def _first_records(txn: Any, dbs: Databases, prefix: bytes, depth: int) -> Iterator[SessionRecord]:
    """Yield one session record per distinct id ``depth`` parts deep under ``prefix``."""
    cursor = txn.cursor(db=dbs.sessions)
    positioned = cursor.set_range(prefix)
    while positioned and cursor.key().startswith(prefix):
        key = cursor.key()
        yield _layout.decode_record(cursor.value())
        positioned = cursor.set_range(_layout.after(key[: _layout.parts_length(key, depth)]))


def _session_copy(txn: Any, dbs: Databases, record: SessionRecord) -> SessionCopy:
    """Return what the store holds of a session, as a copy."""
    number = U64.pack(record.number)
    cursor = txn.cursor(db=dbs.data)
    events: list[EventCopy] = []
    prefix = number + EVENT
    if cursor.set_range(prefix):
        for key, value in cursor.iternext():
            if not key.startswith(prefix):
                break
            events.append(event_copy(value[8:], F64.unpack_from(value)[0]))
    state = _layout.item_entries_of(_layout.read_map(txn, dbs.data, number + STATE))
    return SessionCopy.of_record(record, state, events)
