"""Removing what an LMDB store holds: truncation, expiry, deleting a user or an app.

Removing a session deletes its record and queues its number in meta
(b"purge" number); its state and events, all under that number, are then
deleted in later bounded batches (``BATCH_EVENTS``, ``BATCH_SECONDS``). A
session whose record is gone is gone for every reader at once, and a purge
cut short by a crash is finished by the next retention call of any process.
Each batch is a write of its own through the store's ``Writer``: retention
never holds the write lock for long. ``stopping`` tells when the store's
expirer is asked to stop (a close), which ends the work between batches.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from ...errors import SessionNotFoundError
from ..completion import Completion
from ..records import event_copy
from ..rules import (
    BATCH_EVENTS,
    BATCH_SECONDS,
    BATCH_SESSIONS,
    newest_moved,
    session_not_found,
)
from .layout import (
    APP,
    EVENT,
    EVENT_ID,
    EVENT_TIME,
    F64,
    PURGE,
    U64,
    USER,
    after,
    decode_record,
    part,
    put_record,
    read_record,
    sortable_time,
    unique_part,
    unlist,
)

if TYPE_CHECKING:
    from .writer import Writer

__all__ = ["delete_app", "delete_user", "expire_sessions", "pop_events", "truncate_events"]


def truncate_events(
    writer: Writer,
    app_name: str,
    user_id: str,
    session_id: str,
    before: float | None,
    keep_last: int | None,
) -> Completion[int]:
    """Remove events with ``timestamp < before``, or all but the last ``keep_last``.

    Oldest positions (or earliest times) go first, in bounded batches;
    each batch moves the session's marker.
    """

    # The session the first batch found: one deleted and created again
    # under the same id meanwhile is another session, left alone.
    first: list[int] = []

    def batch(txn: Any) -> tuple[int, bool]:
        record = read_record(txn, writer.dbs, app_name, user_id, session_id)
        if record is None or (first and record.number != first[0]):
            raise session_not_found(app_name, user_id, session_id)
        if not first:
            first.append(record.number)
        number = U64.pack(record.number)
        timed = writer.dbs.timed(record)
        started = time.monotonic()
        cursor = txn.cursor(db=writer.dbs.data)
        doomed: list[tuple[bytes, float]] = []  # (seq, timestamp)
        if keep_last is not None:
            wanted = min(record.stored_count - keep_last, BATCH_EVENTS)
            prefix = number + EVENT
            if wanted > 0 and cursor.set_range(prefix):
                for key, value in cursor.iternext():
                    if not key.startswith(prefix) or len(doomed) >= wanted:
                        break
                    doomed.append((key[9:], F64.unpack_from(value)[0]))
                    if time.monotonic() - started > BATCH_SECONDS:
                        break
        elif not timed:
            # Events in time order: the earliest are the first positions.
            prefix = number + EVENT
            if cursor.set_range(prefix):
                for key, value in cursor.iternext():
                    if not key.startswith(prefix) or len(doomed) >= BATCH_EVENTS:
                        break
                    if F64.unpack_from(value)[0] >= before:
                        break
                    doomed.append((key[9:], 0.0))
                    if time.monotonic() - started > BATCH_SECONDS:
                        break
        else:
            prefix = number + EVENT_TIME
            end = prefix + sortable_time(before)  # type: ignore[arg-type]
            if cursor.set_range(prefix):
                for key in cursor.iternext(values=False):
                    if key >= end or len(doomed) >= BATCH_EVENTS:
                        break
                    doomed.append((key[17:25], 0.0))
                    if time.monotonic() - started > BATCH_SECONDS:
                        break
        if not doomed:
            return 0, True
        data = writer.dbs.data
        removed = 0
        # Deleting costs more than finding: the time bound applies here too.
        for seq, _ in doomed:
            value = txn.get(number + EVENT + seq, db=data)
            timestamp = F64.unpack_from(value)[0]
            event_id = event_copy(value[8:], timestamp).event_id
            txn.delete(number + EVENT + seq, db=data)
            if timed:
                txn.delete(number + EVENT_TIME + sortable_time(timestamp) + seq, db=data)
            txn.delete(number + EVENT_ID + unique_part(event_id), db=data)
            removed += 1
            if time.monotonic() - started > BATCH_SECONDS:
                break
        record.removed_count += removed
        put_record(txn, writer.dbs, record)
        return removed, False

    total = 0
    try:
        while True:
            removed, finished = writer.write(batch).result()
            total += removed
            if finished:
                return Completion.done(total)
    except SessionNotFoundError as error:
        # Deleted between two batches: what was removed stays removed.
        return Completion.done(total) if total else Completion.failed(error)


def pop_events(
    writer: Writer,
    app_name: str,
    user_id: str,
    session_id: str,
    count: int,
    if_last_event_id: str | None = None,
) -> Completion[list[bytes]]:
    """Remove a session's newest ``count`` events in one transaction; return their records.

    The last positions go, as a truncation's first ones do: their id and
    time index entries with them, ``removed_count`` grows (positions are
    not reused) and ``last_event_id`` names the newest event left. With
    ``if_last_event_id``, only if the newest stored event has that id,
    checked in the same transaction before anything is deleted.
    """

    def pop(txn: Any) -> list[bytes]:
        dbs = writer.dbs
        record = read_record(txn, dbs, app_name, user_id, session_id)
        if record is None:
            raise session_not_found(app_name, user_id, session_id)
        number = U64.pack(record.number)
        prefix = number + EVENT
        cursor = txn.cursor(db=dbs.data)
        following = after(prefix) or prefix
        positioned = cursor.prev() if cursor.set_range(following) else cursor.last()
        doomed: list[tuple[bytes, bytes]] = []  # (key, value), newest first
        if if_last_event_id is not None and not (
            positioned
            and cursor.key().startswith(prefix)
            and event_copy(bytes(cursor.value()[8:]), 0.0).event_id == if_last_event_id
        ):
            raise newest_moved(session_id, if_last_event_id)
        while positioned and cursor.key().startswith(prefix) and len(doomed) < count:
            doomed.append((cursor.key(), cursor.value()))
            positioned = cursor.prev()
        if not doomed:
            return []
        remaining = cursor.value() if positioned and cursor.key().startswith(prefix) else None
        timed = dbs.timed(record)
        records: list[bytes] = []
        for key, value in reversed(doomed):
            timestamp = F64.unpack_from(value)[0]
            event = bytes(value[8:])
            txn.delete(key, db=dbs.data)
            if timed:
                txn.delete(number + EVENT_TIME + sortable_time(timestamp) + key[9:], db=dbs.data)
            txn.delete(number + EVENT_ID + unique_part(event_copy(event, timestamp).event_id),
                       db=dbs.data)  # fmt: skip
            records.append(event)
        record.removed_count += len(doomed)
        record.last_event_id = (
            None if remaining is None else event_copy(bytes(remaining[8:]), 0.0).event_id
        )
        put_record(txn, dbs, record)
        return records

    return writer.write(pop)


def expire_sessions(
    writer: Writer, app_name: str | None, idle_before: float, stopping: Callable[[], bool]
) -> Completion[int]:
    """Delete the sessions whose last update is before ``idle_before``, in batches."""
    prefix = b"" if app_name is None else part(app_name)
    return Completion.done(_remove_sessions(writer, prefix, idle_before, stopping))


def delete_user(
    writer: Writer, app_name: str, user_id: str, stopping: Callable[[], bool]
) -> Completion[int]:
    """Delete every session of a user, then the user's state map."""
    app = part(app_name)
    removed = _remove_sessions(writer, app + part(user_id), None, stopping)
    _remove_range(writer, USER + app + part(user_id))
    return Completion.done(removed)


def delete_app(writer: Writer, app_name: str, stopping: Callable[[], bool]) -> Completion[int]:
    """Delete every session of an app, then its user maps and its app map."""
    app = part(app_name)
    removed = _remove_sessions(writer, app, None, stopping)
    _remove_range(writer, USER + app)
    _remove_range(writer, APP + app)
    return Completion.done(removed)


def _remove_sessions(
    writer: Writer, prefix: bytes, idle_before: float | None, stopping: Callable[[], bool]
) -> int:
    """Remove the sessions under a key prefix (idle ones only, with a cutoff).

    Each batch re-reads every record it removes inside its own
    transaction: a session appended to after the scan began is judged on
    its new time. Return how many went.
    """

    def batch(txn: Any, *, resume: bytes) -> tuple[int, bytes | None]:
        started = time.monotonic()
        cursor = txn.cursor(db=writer.dbs.sessions)
        meta = writer.dbs.meta
        removed = 0
        positioned = cursor.set_range(resume)
        while positioned:
            key = cursor.key()
            if not key.startswith(prefix):
                break
            if removed >= BATCH_SESSIONS or time.monotonic() - started > BATCH_SECONDS:
                return removed, key
            record = decode_record(cursor.value())
            if idle_before is None or record.last_update_time < idle_before:
                txn.put(PURGE + U64.pack(record.number), b"", db=meta)
                unlist(txn, writer.dbs.listing, record)
                # delete() moves to the next entry; past the last, key() is empty.
                positioned = cursor.delete() and bool(cursor.key())
                removed += 1
            else:
                positioned = cursor.next()
        return removed, None

    total = 0
    resume: bytes | None = prefix
    while resume is not None and not stopping():
        removed, resume = writer.write(partial(batch, resume=resume)).result()
        total += removed
        _purge(writer, stopping)
    _purge(writer, stopping)
    return total


def _purge(writer: Writer, stopping: Callable[[], bool]) -> None:
    """Delete the state and events of removed sessions, in bounded batches."""
    meta = writer.dbs.meta

    def batch(txn: Any) -> bool:
        started = time.monotonic()
        queue = txn.cursor(db=meta)
        cursor = txn.cursor(db=writer.dbs.data)
        deleted = 0
        while queue.set_range(PURGE) and queue.key().startswith(PURGE):
            number = queue.key()[len(PURGE) :]
            if cursor.set_range(number):
                while cursor.key().startswith(number):
                    if deleted >= BATCH_EVENTS or time.monotonic() - started > BATCH_SECONDS:
                        return False
                    cursor.delete()
                    deleted += 1
            txn.delete(PURGE + number, db=meta)
        return True

    # A close stops the expirer between batches; the next call finishes the purge.
    while not writer.write(batch).result() and not stopping():
        pass


def _remove_range(writer: Writer, prefix: bytes) -> None:
    """Delete every entry of the shared database under a key prefix, in bounded batches."""

    def batch(txn: Any) -> bool:
        started = time.monotonic()
        cursor = txn.cursor(db=writer.dbs.shared)
        deleted = 0
        if cursor.set_range(prefix):
            while cursor.key().startswith(prefix):
                if deleted >= BATCH_EVENTS or time.monotonic() - started > BATCH_SECONDS:
                    return False
                cursor.delete()
                deleted += 1
        return True

    while not writer.write(batch).result():
        pass
