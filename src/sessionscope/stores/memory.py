"""A volatile store in process memory, with the same semantics as the durable ones.

It keeps the same packed bytes an LMDB store writes, so values are checked
and copied exactly as they would be on disk: nothing a caller holds ever
aliases what is stored. One lock makes it safe to share between threads.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from ..codec import decode_values
from ..errors import AlreadyExistsError, StoreClosedError
from .base import (
    AppendRequest,
    AppendResult,
    BatchOutcome,
    Completion,
    InlineAsyncStore,
    Items,
    LoadedSession,
    SessionRecord,
    catch_up,
    check_append,
    events_seen,
)

__all__ = ["MemoryStore"]


@dataclass(slots=True)
class _StoredSession:
    record: SessionRecord
    state: dict[str, bytes] = field(default_factory=dict)
    events: list[bytes] = field(default_factory=list)
    timestamps: list[float] = field(default_factory=list)
    event_index: dict[str, int] = field(default_factory=dict)


class MemoryStore:
    """Sessions, state and events in dictionaries; gone when the process ends."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._apps: dict[str, dict[str, dict[str, _StoredSession]]] = {}
        self._app_state: dict[str, dict[str, bytes]] = {}
        self._user_state: dict[tuple[str, str], dict[str, bytes]] = {}
        self._numbers = 0
        self._closed = False
        self.aio = InlineAsyncStore(self)

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

    def append_many(self, requests: list[AppendRequest]) -> Completion[BatchOutcome]:
        """Append a batch in order under one lock; stop at the first error."""
        with self._lock:
            self._check_open()
            results: list[AppendResult] = []
            for request in requests:
                try:
                    results.append(self._append(request))
                except Exception as error:  # it stops the batch; the caller raises it
                    return Completion.done((results, error))
            return Completion.done((results, None))

    def _append(self, request: AppendRequest) -> AppendResult:
        stored = self._find(request.app_name, request.user_id, request.session_id)
        record = stored.record if stored is not None else None
        seen = None
        if stored is not None and request.event_id in stored.event_index:
            seen = stored.events[stored.event_index[request.event_id]]
        if check_append(record, request, seen):
            return AppendResult(None, duplicate=True)
        assert stored is not None and record is not None
        known = events_seen(request, record, stored.event_index.get) if request.catch_up else None
        count_before = len(stored.events)
        self._write_shared(request.app_name, request.user_id, request.app_items, request.user_items)
        stored.state.update(request.session_items)
        stored.event_index[request.event_id] = len(stored.events)
        stored.events.append(request.event)
        stored.timestamps.append(request.timestamp)
        record.advance(request.event_id, request.timestamp)
        result = AppendResult(record.marker, record.last_update_time)
        if not request.catch_up:
            return result
        return catch_up(
            result,
            known,
            lambda start: stored.events[start:count_before],
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
        with self._lock:
            self._closed = True
            self._apps.clear()
            self._app_state.clear()
            self._user_state.clear()


def _copy(record: SessionRecord) -> SessionRecord:
    return SessionRecord(*record.to_list())
