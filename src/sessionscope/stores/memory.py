"""A volatile store in process memory, with the same semantics as the durable ones.

It keeps the same packed bytes an LMDB store writes, so values are checked
and copied exactly as they would be on disk: nothing a caller holds ever
aliases what is stored. One lock makes it safe to share between threads.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..codec import decode_values
from ..errors import AlreadyExistsError, StoreClosedError
from .completion import Completion
from .expiry import Expirer
from .protocol import InlineAsyncStore, append_joined
from .records import (
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
    SessionCopy,
    SessionRecord,
    copies_equal,
    event_copy,
    result_of_batch,
)
from .rules import (
    append_chain,
    catch_up,
    catch_up_repeat,
    check_append,
    check_copy,
    check_ttl,
    events_seen,
    newest_moved,
    page_records,
    session_not_found,
)

__all__ = ["MemoryStore"]


@dataclass(slots=True)
class _StoredSession:
    record: SessionRecord
    state: dict[str, bytes] = field(default_factory=dict)
    events: list[bytes] = field(default_factory=list)
    timestamps: list[float] = field(default_factory=list)
    # The position of each stored event (ascending; gaps after a truncation)
    # and, by event id, the position it was appended at.
    seqs: list[int] = field(default_factory=list)
    event_index: dict[str, int] = field(default_factory=dict)

    def position(self, event_id: str) -> int | None:
        """Return where in ``events`` the event with this id is, if stored."""
        seq = self.event_index.get(event_id)
        return None if seq is None else bisect_left(self.seqs, seq)


class MemoryStore:
    """Sessions, state and events in dictionaries; gone when the process ends."""

    def __init__(self, *, session_ttl: float | None = None) -> None:
        ttl = check_ttl(session_ttl)
        self._lock = threading.Lock()
        self._apps: dict[str, dict[str, dict[str, _StoredSession]]] = {}
        self._app_state: dict[str, dict[str, bytes]] = {}
        self._user_state: dict[tuple[str, str], dict[str, bytes]] = {}
        self._numbers = 0
        self._closed = False
        self.aio = InlineAsyncStore(self)
        self.session_ttl = ttl
        self._expirer = Expirer(self, ttl) if ttl is not None else None
        if self._expirer is not None:
            self._expirer.start()

    def opened_elsewhere(self) -> bool:
        """Tell whether another process may have this store open: never, it is this one's memory."""
        return False

    def __repr__(self) -> str:
        return "MemoryStore()"

    @property
    def uri(self) -> str:
        """Return the URI ``open_store`` takes to make a store like this one."""
        return "memory://"

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError("the store is closed", hint="open a new store")

    def _find(self, app_name: str, user_id: str, session_id: str) -> _StoredSession | None:
        return self._apps.get(app_name, {}).get(user_id, {}).get(session_id)

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
        with self._lock:
            self._check_open()
            users = self._apps.setdefault(app_name, {}).setdefault(user_id, {})
            if session_id in users:
                return Completion.failed(
                    AlreadyExistsError(f"session {session_id!r} already exists")
                )
            self._numbers += 1
            record = SessionRecord(
                app_name, user_id, session_id, self._numbers, create_time, create_time
            )
            stored = _StoredSession(record, dict(session_items))
            users[session_id] = stored
            self._write_shared(app_name, user_id, app_items, user_items)
            return Completion.done(self._loaded(stored, []))

    def _write_shared(
        self, app_name: str, user_id: str, app_items: Items, user_items: Items
    ) -> None:
        if app_items:
            self._app_state.setdefault(app_name, {}).update(app_items)
        if user_items:
            self._user_state.setdefault((app_name, user_id), {}).update(user_items)

    def load_session(
        self,
        app_name: str,
        user_id: str,
        session_id: str,
        num_recent_events: int | None,
        after_timestamp: float | None,
    ) -> LoadedSession | None:
        """Read a session with the events the filters select, in append order."""
        with self._lock:
            self._check_open()
            stored = self._find(app_name, user_id, session_id)
            if stored is None:
                return None
            start = 0
            if num_recent_events is not None:
                start = max(0, len(stored.events) - num_recent_events)
            indices = range(start, len(stored.events))
            if after_timestamp is not None:
                times = stored.timestamps
                indices = [i for i in indices if times[i] >= after_timestamp]  # type: ignore[assignment]
            return self._loaded(stored, [stored.events[i] for i in indices])

    def read_events(
        self, app_name: str, user_id: str, session_id: str, start: int, limit: int
    ) -> EventPage | None:
        """Return a session's record and up to ``limit`` stored events from position ``start``.

        See ``LmdbStore.read_events``. None if the session does not exist.
        """
        with self._lock:
            self._check_open()
            stored = self._find(app_name, user_id, session_id)
            if stored is None:
                return None
            first = bisect_left(stored.seqs, start)
            stop = first + max(0, limit)
            pairs = list(zip(stored.seqs[first:stop], stored.events[first:stop], strict=True))
            return _copy(stored.record), pairs

    def _loaded(self, stored: _StoredSession, events: list[bytes]) -> LoadedSession:
        record = stored.record
        return LoadedSession(
            _copy(record),
            decode_values(stored.state.items()),
            decode_values(self._app_state.get(record.app_name, {}).items()),
            decode_values(self._user_state.get((record.app_name, record.user_id), {}).items()),
            events,
        )

    def list_sessions(self, app_name: str, user_id: str | None) -> list[SessionRecord]:
        """Return the records of an app's (or one user's) sessions."""
        with self._lock:
            self._check_open()
            users = self._apps.get(app_name, {})
            if user_id is not None:
                users = {user_id: users.get(user_id, {})}
            return [_copy(s.record) for sessions in users.values() for s in sessions.values()]

    def list_page(
        self,
        app_name: str,
        user_id: str | None,
        limit: int | None,
        after: ListPosition | None,
    ) -> tuple[list[SessionRecord], bool]:
        """Return one page of sessions in listing order; see ``Store.list_page``."""
        return page_records(self.list_sessions(app_name, user_id), limit, after)

    def delete_session(self, app_name: str, user_id: str, session_id: str) -> Completion[None]:
        """Remove a session with its state and events; a missing one is a no-op."""
        with self._lock:
            self._check_open()
            self._apps.get(app_name, {}).get(user_id, {}).pop(session_id, None)
            return Completion.done(None)

    def append(self, request: AppendRequest) -> Completion[AppendResult]:
        """Append one event and apply its packed delta, all or nothing."""
        with self._lock:
            self._check_open()
            try:
                return Completion.done(self._append(request))
            except Exception as error:  # handed to the caller
                return Completion.failed(error)

    def append_chain(self, requests: list[AppendRequest]) -> Completion[list[AppendResult]]:
        """Append events to one session in order, all or none, under one lock.

        See ``ChainStore.append_chain``: on an error the session, its user's map
        and its app's are put back as they were before the chain.
        """
        with self._lock:
            self._check_open()
            undo = self._undo_of(requests) if requests else None
            try:
                return Completion.done(append_chain(requests, self._append))
            except Exception as error:  # handed to the caller, with nothing stored
                if undo is not None:
                    undo()
                return Completion.failed(error)

    def _undo_of(self, requests: list[AppendRequest]) -> Callable[[], None] | None:
        """Return a function putting back what a chain of appends to one session changes."""
        first = requests[0]
        app_name, user_id = first.app_name, first.user_id
        stored = self._find(app_name, user_id, first.session_id)
        if stored is None:
            return None
        record, count = _copy(stored.record), len(stored.events)
        # The chain's own ids are all its appends can add to the id index (at
        # positions from the record's count on): the index is not copied,
        # which a long session would pay for on every chain.
        state, index = dict(stored.state), stored.event_index
        user_key = (app_name, user_id)
        app_map = self._app_state.get(app_name)
        user_map = self._user_state.get(user_key)
        app_items = None if app_map is None else dict(app_map)
        user_items = None if user_map is None else dict(user_map)

        def undo() -> None:
            stored.record = record
            del stored.events[count:], stored.timestamps[count:], stored.seqs[count:]
            for request in requests:
                if index.get(request.event_id, -1) >= record.event_count:
                    del index[request.event_id]
            stored.state = state
            if app_items is None:
                self._app_state.pop(app_name, None)
            else:
                self._app_state[app_name] = app_items
            if user_items is None:
                self._user_state.pop(user_key, None)
            else:
                self._user_state[user_key] = user_items

        return undo

    def append_many(self, batch: AppendBatch) -> Completion[BatchResult]:
        """Append a batch in order under one lock; stop at the first error."""
        with self._lock:
            self._check_open()
            results: list[AppendResult] = []
            for request in batch.requests():
                try:
                    results.append(self._append(request))
                except Exception as error:  # it stops the batch; the caller raises it
                    return Completion.done(result_of_batch(batch, results, error))
            return Completion.done(result_of_batch(batch, results, None))

    def append_slices(self, slices: BatchSlices) -> Completion[BatchResult]:
        """Append a batch as one batch: slices spare memory no work (``Store.append_slices``)."""
        return append_joined(self, slices)

    def _append(self, request: AppendRequest) -> AppendResult:
        stored = self._find(request.app_name, request.user_id, request.session_id)
        record = stored.record if stored is not None else None
        seen = seq = None
        if stored is not None:
            position = stored.position(request.event_id)
            if position is not None:
                seen, seq = stored.events[position], stored.seqs[position]
        repeat = check_append(record, request, seen, seq)
        if repeat is not None:
            if request.catch_up and not repeat.duplicate:
                assert stored is not None and seq is not None
                return catch_up_repeat(repeat, seq, lambda: self._loaded(stored, []))
            return repeat
        assert stored is not None and record is not None
        known = events_seen(request, record, stored.event_index.get) if request.catch_up else None
        count_before = len(stored.events)
        self._write_shared(request.app_name, request.user_id, request.app_items, request.user_items)
        stored.state.update(request.session_items)
        stored.event_index[request.event_id] = record.event_count
        stored.seqs.append(record.event_count)
        stored.events.append(request.event)
        stored.timestamps.append(request.timestamp)
        record.advance(request.event_id, request.timestamp)
        result = AppendResult(record.marker, record.last_update_time)
        if not request.catch_up:
            return result
        return catch_up(
            result,
            known,
            lambda start: stored.events[bisect_left(stored.seqs, start) : count_before],
            lambda: self._loaded(stored, []),
        )

    def read_app_state(self, app_name: str) -> dict[str, Any]:
        """Return the app map, keys without prefix."""
        with self._lock:
            self._check_open()
            return decode_values(self._app_state.get(app_name, {}).items())

    def read_user_state(self, app_name: str, user_id: str) -> dict[str, Any]:
        """Return the user map, keys without prefix."""
        with self._lock:
            self._check_open()
            return decode_values(self._user_state.get((app_name, user_id), {}).items())

    def flush(self) -> Completion[None]:
        """Return at once: there is no disk to wait for."""
        self._check_open()
        return Completion.done(None)

    def close(self) -> None:
        """Drop everything; later calls raise StoreClosedError."""
        if self._expirer is not None:
            self._expirer.stop()
        with self._lock:
            self._closed = True
            self._apps.clear()
            self._app_state.clear()
            self._user_state.clear()

    # -- retention and copies --------------------------------------------

    def truncate_events(
        self,
        app_name: str,
        user_id: str,
        session_id: str,
        before: float | None,
        keep_last: int | None,
    ) -> Completion[int]:
        """Remove events with ``timestamp < before``, or all but the last ``keep_last``."""
        with self._lock:
            self._check_open()
            stored = self._find(app_name, user_id, session_id)
            if stored is None:
                return Completion.failed(session_not_found(app_name, user_id, session_id))
            count = len(stored.events)
            if keep_last is not None:
                keep = [i >= count - keep_last for i in range(count)]
            else:
                keep = [stamp >= before for stamp in stored.timestamps]  # type: ignore[operator]
            removed = count - sum(keep)
            if removed:
                gone = {seq for seq, kept in zip(stored.seqs, keep, strict=True) if not kept}
                stored.events = [e for e, k in zip(stored.events, keep, strict=True) if k]
                stored.timestamps = [t for t, k in zip(stored.timestamps, keep, strict=True) if k]
                stored.seqs = [q for q, k in zip(stored.seqs, keep, strict=True) if k]
                stored.event_index = {i: q for i, q in stored.event_index.items() if q not in gone}
                stored.record.removed_count += removed
            return Completion.done(removed)

    def pop_events(
        self,
        app_name: str,
        user_id: str,
        session_id: str,
        count: int,
        *,
        if_last_event_id: str | None = None,
    ) -> Completion[list[bytes]]:
        """Remove a session's newest ``count`` events and return their records, oldest first.

        With ``if_last_event_id``, only if the newest stored event has that id.
        """
        with self._lock:
            self._check_open()
            stored = self._find(app_name, user_id, session_id)
            if stored is None:
                return Completion.failed(session_not_found(app_name, user_id, session_id))
            if if_last_event_id is not None and (
                not stored.seqs or stored.event_index.get(if_last_event_id) != stored.seqs[-1]
            ):
                return Completion.failed(newest_moved(session_id, if_last_event_id))
            keep = max(0, len(stored.events) - count)
            popped = stored.events[keep:]
            for record_bytes in popped:
                stored.event_index.pop(event_copy(record_bytes).event_id, None)
            del stored.events[keep:], stored.timestamps[keep:], stored.seqs[keep:]
            record = stored.record
            record.removed_count += len(popped)
            if popped:
                last = stored.events[-1] if stored.events else None
                record.last_event_id = None if last is None else event_copy(last).event_id
            return Completion.done(popped)

    def expire_sessions(self, app_name: str | None, idle_before: float) -> Completion[int]:
        """Delete the sessions whose last update is before ``idle_before``."""
        return self._delete_where(
            app_name, None, lambda s: s.record.last_update_time < idle_before, False
        )

    def delete_user(self, app_name: str, user_id: str) -> Completion[int]:
        """Delete every session of a user and the user's state map."""
        return self._delete_where(app_name, user_id, lambda s: True, True)

    def delete_app(self, app_name: str) -> Completion[int]:
        """Delete every session, user map and the app map of an app."""
        return self._delete_where(app_name, None, lambda s: True, True)

    def _delete_where(
        self, app_name: str | None, user_id: str | None, doomed: Any, maps: bool
    ) -> Completion[int]:
        with self._lock:
            self._check_open()
            removed = 0
            apps = list(self._apps) if app_name is None else [app_name]
            for app in apps:
                users = self._apps.get(app, {})
                owners = list(users) if user_id is None else [user_id]
                for user in owners:
                    sessions = users.get(user, {})
                    for sid in [sid for sid, s in sessions.items() if doomed(s)]:
                        del sessions[sid]
                        removed += 1
                    if not sessions:
                        users.pop(user, None)
                if not users:
                    self._apps.pop(app, None)
            if maps and app_name is not None:
                if user_id is not None:
                    self._user_state.pop((app_name, user_id), None)
                else:
                    self._app_state.pop(app_name, None)
                    for key in [k for k in self._user_state if k[0] == app_name]:
                        del self._user_state[key]
            return Completion.done(removed)

    def list_apps(self) -> list[str]:
        """Return the apps that have a session, app state or user state, sorted."""
        with self._lock:
            self._check_open()
            names = {app for app, users in self._apps.items() if any(users.values())}
            names.update(app for app, items in self._app_state.items() if items)
            names.update(app for (app, _), items in self._user_state.items() if items)
            return sorted(names)

    def list_users(self, app_name: str) -> list[str]:
        """Return the users of an app that have a session or user state, sorted."""
        with self._lock:
            self._check_open()
            names = {user for user, sessions in self._apps.get(app_name, {}).items() if sessions}
            names.update(
                user for (app, user), items in self._user_state.items() if app == app_name and items
            )
            return sorted(names)

    def restore_session(self, copy: SessionCopy) -> Completion[bool]:
        """Write a whole session as given; False when an equal one is stored."""
        check_copy(copy)
        with self._lock:
            self._check_open()
            found = self._find(copy.app_name, copy.user_id, copy.session_id)
            if found is not None:
                if copies_equal(_copy_of(found), copy):
                    return Completion.done(False)
                return Completion.failed(
                    AlreadyExistsError(
                        f"session {copy.session_id!r} already exists with other content"
                    )
                )
            self._numbers += 1
            last = copy.events[-1].event_id if copy.events else None
            record = SessionRecord(
                copy.app_name,
                copy.user_id,
                copy.session_id,
                self._numbers,
                copy.create_time,
                copy.last_update_time,
                len(copy.events),
                last,
            )
            stored = _StoredSession(
                record,
                dict(copy.session_items),
                [e.record for e in copy.events],
                [e.timestamp for e in copy.events],
                list(range(len(copy.events))),
                {e.event_id: i for i, e in enumerate(copy.events)},
            )
            users = self._apps.setdefault(copy.app_name, {}).setdefault(copy.user_id, {})
            users[copy.session_id] = stored
            return Completion.done(True)

    def write_app_state(self, app_name: str, items: Items) -> Completion[None]:
        """Set keys of the app map, leaving other keys as they are."""
        with self._lock:
            self._check_open()
            self._write_shared(app_name, "", items, [])
            return Completion.done(None)

    def write_user_state(self, app_name: str, user_id: str, items: Items) -> Completion[None]:
        """Set keys of a user map, leaving other keys as they are."""
        with self._lock:
            self._check_open()
            self._write_shared(app_name, user_id, [], items)
            return Completion.done(None)


def _copy_of(stored: _StoredSession) -> SessionCopy:
    events = [
        EventCopy(event_copy(e).event_id, t, e)
        for e, t in zip(stored.events, stored.timestamps, strict=True)
    ]
    return SessionCopy.of_record(stored.record, list(stored.state.items()), events)


def _copy(record: SessionRecord) -> SessionRecord:
    return SessionRecord.from_list(record.to_list())
