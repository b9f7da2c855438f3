"""The SessionService facade: routing by scope, stale checks, live-session updates.

All logic lives in ``ServiceCore``; ``SessionService`` (async) and
``SyncSessionService`` are thin shells that hand its prepared requests to the
store and wait for them in their own way. The core never learns which store it
has. What kind of session and event objects it reads and builds is told by a
``Model``: ``NativeModel`` for this package's dataclasses, another for
google-adk's pydantic models, so the adapter shares every rule.
"""

from __future__ import annotations

import asyncio
import base64
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, NoReturn, Protocol, TypeVar

from .. import codec
from ..core import TEMP_PREFIX, apply_delta, compiled_or_twin, merge_scopes, partition_checked
from ..errors import SessionscopeError
from ..model import (
    Event,
    EventActions,
    GetSessionConfig,
    ListSessionsResponse,
    Session,
    check_filters,
    new_event_id,
    new_session_id,
)
from ..stores import Store, open_store
from ..stores.records import (
    AppendBatch,
    AppendResult,
    BatchResult,
    ListPosition,
    LoadedSession,
    PreparedAppend,
    SessionRecord,
)
from ..stores.rules import finite_float, list_position, marker_position

if TYPE_CHECKING:
    from typing_extensions import Self

    # The source is the type source; its compiled build has the same signatures.
    from . import _append as _hot
    from . import _listing
else:
    _hot = compiled_or_twin("sessionscope.service._append")
    _listing = compiled_or_twin("sessionscope.service._listing")

# Every append runs these: they live with the compiled append steps.
MAX_ID_BYTES = _hot.MAX_ID_BYTES
check_id = _hot.check_id
check_session_id = _hot.check_session_id
timestamp_of = _hot.timestamp_of
event_to_record = _hot.event_to_record

__all__ = [
    "MAX_ID_BYTES",
    "AsyncSessions",
    "FieldModel",
    "Model",
    "NativeModel",
    "ServiceCore",
    "SessionService",
    "SyncSessionService",
    "check_id",
    "timestamp_of",
]

S = TypeVar("S")
E = TypeVar("E")
# Makes each merge of a locked append into its live session one step.
_live_merge = threading.Lock()


def read_filters(config: Any) -> tuple[int | None, float | None]:
    """Return (num_recent_events, after_timestamp) of any config-like object, checked."""
    if config is None:
        return None, None
    return check_filters(
        getattr(config, "num_recent_events", None), getattr(config, "after_timestamp", None)
    )


class Model(Protocol[S, E]):
    """How the service reads and builds the caller's session and event objects.

    Plain fields (ids, timestamp, partial, delta, state, events, last update
    time) are read by ADK's field names in the compiled append path (see
    ``FieldModel``); what differs between models is asked here.
    """

    def event_id(self, event: E) -> str:
        """Return the event's id, giving it a fresh one if it has none."""
        ...

    def set_state_delta(self, event: E, delta: dict[str, Any]) -> None:
        """Replace the event's state delta."""
        ...

    def encode_event(self, event: E) -> bytes:
        """Return the stored record of an event (its delta already checked)."""
        ...

    def decode_events(self, records: list[bytes]) -> list[E]:
        """Return the events stored as ``records``."""
        ...

    def marker(self, session: S) -> str | None:
        """Return the revision marker a session object carries."""
        ...

    def live_parts(self, session: S) -> tuple[dict[str, Any], list[E], float]:
        """Return the state, the events and the last update time of a session object."""
        ...

    def update_session(self, session: S, last_update_time: float, marker: str) -> None:
        """Set a live session's last update time and marker."""
        ...

    def build_session(
        self,
        record: SessionRecord,
        state: dict[str, Any],
        events: list[E],
    ) -> S:
        """Return a new session object."""
        ...


class FieldModel(Generic[S, E]):
    """The Model methods shared by session and event classes with ADK's field names.

    Events carry ``id``, ``timestamp``, ``partial`` and ``actions.state_delta``;
    sessions ``app_name``, ``user_id``, ``id``, ``state``, ``events`` and
    ``last_update_time``. A subclass says how to encode, decode and build
    them, where the marker lives, and how to make a fresh event id.
    """

    def new_event_id(self) -> str:
        """Return a fresh event id."""
        return new_event_id()

    def event_id(self, event: E) -> str:
        """Return the event's id, giving it a fresh one if it has none."""
        item: Any = event
        if not item.id:
            item.id = self.new_event_id()
        return check_id(item.id, "event.id")

    def set_state_delta(self, event: E, delta: dict[str, Any]) -> None:
        """Replace the event's state delta."""
        item: Any = event
        item.actions.state_delta = delta

    def live_parts(self, session: S) -> tuple[dict[str, Any], list[E], float]:
        """Return the state, the events and the last update time of a session object."""
        item: Any = session
        return item.state, item.events, item.last_update_time


class NativeModel(FieldModel[Session, Event]):
    """The Model of this package's own ``Session`` and ``Event`` dataclasses."""

    # The stored record of an event, its set fields only: the compiled
    # function itself, so that an append calls it without a Python frame in
    # between. It checks every field but the delta, which partition_checked
    # has checked: no second walk over the record.
    encode_event = staticmethod(_hot.encode_event)

    def decode_events(self, records: list[bytes]) -> list[Event]:
        """Return the events stored as ``records``."""
        events = []
        for record in records:
            fields = codec.decode_event(record)
            try:
                events.append(event_from_record(fields))
            except (TypeError, ValueError, AttributeError) as error:
                raise codec.unreadable_event(error) from error
        return events

    def marker(self, session: Session) -> str | None:
        """Return the revision marker a session object carries."""
        return session.revision

    def update_session(self, session: Session, last_update_time: float, marker: str) -> None:
        """Set a live session's last update time and marker."""
        session.last_update_time = last_update_time
        session.revision = marker

    def build_session(
        self, record: SessionRecord, state: dict[str, Any], events: list[Event]
    ) -> Session:
        """Return a new session object."""
        return Session(
            record.session_id,
            record.app_name,
            record.user_id,
            state,
            events,
            record.last_update_time,
            record.marker,
        )


def event_from_record(record: dict[str, Any]) -> Event:
    """Return the event stored as ``record``."""
    actions = record.pop("actions", None)
    event = Event(**record)
    if actions is not None:
        event.actions = EventActions(**actions)
    return event


@dataclass(slots=True)
class PreparedCreate:
    """A create checked and packed, waiting for the store."""

    app_name: str
    user_id: str
    session_id: str
    create_time: float
    app_items: list[tuple[str, bytes]]
    user_items: list[tuple[str, bytes]]
    session_items: list[tuple[str, bytes]]


class ServiceCore(Generic[S, E]):
    """Every rule of the contract that is not storage: shared by both facades.

    It does no I/O: it checks a call's arguments and prepares what the store
    is handed (``check_*``, ``prepare_*``), and builds the caller's answer
    from what the store returned (``finish_*``). The facades call the store.
    """

    def __init__(self, model: Model[S, E]) -> None:
        self.model = model

    # -- create ----------------------------------------------------------

    def prepare_create(
        self,
        app_name: object,
        user_id: object,
        state: Mapping[str, Any] | None,
        session_id: object,
    ) -> PreparedCreate:
        """Check a create's arguments and pack its state, routed by scope."""
        app = check_id(app_name, "app_name")
        user = check_id(user_id, "user_id")
        if session_id is None or (isinstance(session_id, str) and not session_id.strip()):
            sid = new_session_id()
        else:
            sid = check_session_id(session_id)
        if state is not None and not isinstance(state, Mapping):
            raise ValueError(f"state must be a mapping or None, not {type(state).__name__}")
        app_delta, user_delta, session_delta, _ = partition_checked(state or {})
        return PreparedCreate(
            app,
            user,
            sid,
            time.time(),
            codec.encode_items(app_delta),
            codec.encode_items(user_delta),
            codec.encode_items(session_delta),
        )

    def finish_load(self, loaded: LoadedSession) -> S:
        """Return the caller's session object for what a store read."""
        state = merge_scopes(loaded.app_state, loaded.user_state, loaded.session_state)
        return self.model.build_session(
            loaded.record, state, self.model.decode_events(loaded.events)
        )

    # -- read ------------------------------------------------------------

    def check_get(
        self, app_name: object, user_id: object, session_id: object, config: Any
    ) -> tuple[str, str, str, int | None, float | None]:
        """Return a read's checked (app, user, session, num_recent_events, after_timestamp)."""
        return (*self.check_key(app_name, user_id, session_id), *read_filters(config))

    def finish_get(self, loaded: LoadedSession | None) -> S | None:
        """Return the caller's session object for a read; None when it does not exist."""
        return None if loaded is None else self.finish_load(loaded)

    @staticmethod
    def check_owner(app_name: object, user_id: object) -> tuple[str, str | None]:
        """Return a listing's checked (app, user or None)."""
        app = check_id(app_name, "app_name")
        return app, None if user_id is None else check_id(user_id, "user_id")

    def check_list(
        self, app_name: object, user_id: object, limit: int | None, cursor: str | None
    ) -> tuple[str, str | None, int | None, ListPosition | None]:
        """Return a listing's checked (app, user or None, limit, position after the cursor)."""
        app, user = self.check_owner(app_name, user_id)
        check_page(limit, cursor)
        return app, user, limit, cursor_position(cursor)

    @staticmethod
    def finish_list(page: list[SessionRecord], more: bool) -> ListSessionsResponse:
        """Return the caller's page of session metadata for what a store listed."""
        return page_of(page, more)

    def check_key(
        self, app_name: object, user_id: object, session_id: object
    ) -> tuple[str, str, str]:
        """Return the checked (app_name, user_id, session_id) that name a session."""
        return (
            check_id(app_name, "app_name"),
            check_id(user_id, "user_id"),
            check_session_id(session_id),
        )

    @staticmethod
    def check_user(app_name: object, user_id: object) -> tuple[str, str]:
        """Return the checked (app_name, user_id) that name a user."""
        return check_id(app_name, "app_name"), check_id(user_id, "user_id")

    # -- retention -------------------------------------------------------

    def check_truncate(
        self,
        app_name: object,
        user_id: object,
        session_id: object,
        before: object,
        keep_last: object,
    ) -> tuple[str, str, str, float | None, int | None]:
        """Return a truncation's checked (app, user, session, before, keep_last).

        Exactly one of ``before`` (a finite timestamp) and ``keep_last`` (an
        int of 0 or more) is given.
        """
        key = self.check_key(app_name, user_id, session_id)
        if (before is None) == (keep_last is None):
            raise ValueError("give exactly one of before and keep_last")
        if keep_last is not None:
            if isinstance(keep_last, bool) or not isinstance(keep_last, int):
                raise ValueError(f"keep_last must be an int, not {keep_last!r}")
            if keep_last < 0:
                raise ValueError(f"keep_last must be 0 or more, not {keep_last}")
            return (*key, None, keep_last)
        if isinstance(before, bool) or not isinstance(before, (int, float)):
            raise ValueError(f"before must be a timestamp (a number), not {before!r}")
        stamp = finite_float(before)
        if stamp is None:
            raise ValueError(f"before must be a finite timestamp, not {before!r}")
        return (*key, stamp, None)

    @staticmethod
    def check_expiry(app_name: object, idle_for: object) -> tuple[str | None, float]:
        """Return an expiry's checked (app or None, idle cutoff time)."""
        app = None if app_name is None else check_id(app_name, "app_name")
        if isinstance(idle_for, bool) or not isinstance(idle_for, (int, float)):
            raise ValueError(f"idle_for must be a number of seconds, not {idle_for!r}")
        seconds = finite_float(idle_for)
        if seconds is None or seconds < 0:
            raise ValueError(f"idle_for must be a finite number of seconds >= 0, not {idle_for!r}")
        return app, time.time() - seconds

    # -- append ----------------------------------------------------------

    def prepare_append(self, session: S, event: E, locked: bool) -> PreparedAppend | None:
        """Check and pack an append; None for a partial event, which is not stored.

        Nothing is changed, on the event or the session, until the store has
        taken the append: ``finish_append`` does that, ``abandon_append``
        undoes the one change made to the event here. The prepared append is
        itself the request the store takes.
        """
        return _hot.prepare_append(self.model, session, event, locked)

    def abandon_append(self, event: E, prepared: PreparedAppend) -> None:
        """Give the event back its delta, temp keys included, after a failed append."""
        if prepared.original_delta is not None:
            self.model.set_state_delta(event, dict(prepared.original_delta))

    def finish_append(
        self, session: S, event: E, prepared: PreparedAppend, result: AppendResult
    ) -> E:
        """Bring the live session up to date with what the store took."""
        if _hot.finish_append(self.model, session, event, prepared, result):
            return event
        # Finishes of locked appends to one live session may come from
        # several threads at once: each merge is a few list and dict
        # operations, done one at a time.
        with _live_merge:
            self._merge_locked(session, event, prepared, result)
        return event

    def _merge_locked(
        self, session: S, event: E, prepared: PreparedAppend, result: AppendResult
    ) -> None:
        """Merge a locked append's result into the live session, by position.

        The result holds the stored events from ``first_missed`` up to this
        append's own, and the maps after it. Locked appends to one live
        session finish in any order, each against the marker the session held
        when it was prepared, so the merge goes by what the live session holds
        now: a result older than it adds nothing (but its event object takes
        the place of the stored copy another finish brought in), a newer one
        adds only the positions the session lacks and brings its state.
        """
        model = self.model
        state, events, _ = model.live_parts(session)
        held = marker_position(model.marker(session))
        now = marker_position(result.marker)
        if held is not None and now is not None and now <= held:
            if now[0] == held[0]:
                index = len(events) - (held[1] - now[1]) - 1
                if 0 <= index < len(events):
                    events[index] = event
            if prepared.temp:
                apply_delta(state, prepared.temp)
            return
        stored = result.stored_state
        assert stored is not None
        # The stored maps hold every delta, this one's, missed ones' and other
        # sessions' to the shared maps. Temp keys live only here and stay.
        temp = {k: v for k, v in state.items() if k.startswith(TEMP_PREFIX)}
        state.clear()
        state.update(merge_scopes(stored.app_state, stored.user_state, stored.session_state))
        state.update(temp)
        if prepared.temp:
            apply_delta(state, prepared.temp)
        missed = model.decode_events(result.missed_events) if result.missed_events else []
        if held is not None and now is not None and now[0] == held[0]:
            # The session holds positions up to held[1]; the result starts at first_missed.
            skip = held[1] - result.first_missed
            new = [*missed, event][max(0, skip) :]
        else:
            new = [*missed, event]
            if result.replace_events:
                events.clear()
        events.extend(new)
        assert result.marker is not None
        model.update_session(session, result.last_update_time, result.marker)


def check_page(limit: object, cursor: object) -> None:
    """Refuse a page size or cursor a listing cannot take, before the store is read."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
        raise ValueError(f"limit must be an int or None, not {limit!r}")
    if limit is not None and limit <= 0:
        raise ValueError(f"limit must be positive, not {limit}")
    if cursor is not None:
        _decode_cursor(cursor)


def cursor_position(cursor: str | None) -> ListPosition | None:
    """Return the listing position a cursor names (None: from the start)."""
    return None if cursor is None else _decode_cursor(cursor)


def page_of(page: list[SessionRecord], more: bool) -> ListSessionsResponse:
    """Return a store's listing page as session metadata, with the cursor past it."""
    metas = _listing.metas(page)
    next_cursor = _encode_cursor(list_position(page[-1])) if more and page else None
    return ListSessionsResponse(metas, next_cursor)


def _encode_cursor(position: tuple[float, str, str]) -> str:
    return base64.urlsafe_b64encode(codec.pack(list(position))).decode("ascii")


def _decode_cursor(cursor: object) -> tuple[float, str, str]:
    try:
        if not isinstance(cursor, str):
            raise TypeError
        stamp, user, sid = codec.unpack(base64.urlsafe_b64decode(cursor.encode("ascii")))
        return float(stamp), str(user), str(sid)
    except Exception:
        raise ValueError(f"cursor {cursor!r} is not one a listing returned") from None


def _resolve_store(store: Store | str | None) -> Store:
    if store is None:
        from ..stores.memory import MemoryStore

        return MemoryStore()
    if isinstance(store, str):
        return open_store(store)
    return store


class AsyncSessions(Generic[S, E]):
    """The async facade over a ServiceCore: what SessionService and the ADK drop-in share.

    A subclass sets ``store`` and ``_core``, adds its own ``list_sessions``,
    and may override ``_raise`` to hand callers its own error classes.
    """

    store: Store
    _core: ServiceCore[S, E]

    def _raise(self, error: SessionscopeError) -> NoReturn:
        """Raise one of sessionscope's errors as callers of this facade expect it."""
        raise error

    async def create_session(
        self,
        *,
        app_name: str,
        user_id: str,
        state: Mapping[str, Any] | None = None,
        session_id: str | None = None,
    ) -> S:
        """Create a session; its initial state is routed by prefix."""
        p = self._core.prepare_create(app_name, user_id, state, session_id)
        try:
            loaded = await self.store.aio.create_session(
                p.app_name, p.user_id, p.session_id, p.create_time,
                p.app_items, p.user_items, p.session_items,
            )  # fmt: skip
        except SessionscopeError as error:
            self._raise(error)
        return self._core.finish_load(loaded)

    async def get_session(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        config: Any = None,
    ) -> S | None:
        """Read a session with the events ``config`` selects; None if missing."""
        core = self._core
        loaded = await self.store.aio.load_session(
            *core.check_get(app_name, user_id, session_id, config)
        )
        return core.finish_get(loaded)

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        """Delete a session, its state and its events; a missing one is a no-op."""
        key = self._core.check_key(app_name, user_id, session_id)
        await self.store.aio.delete_session(*key)

    async def append_event(self, session: S, event: E) -> E:
        """Append an event to a session read before; stale copies are refused."""
        return await self._append(session, event, locked=False)

    async def append_event_locked(self, session: S, event: E) -> E:
        """Append on top of what is stored, and bring the live session up to date."""
        return await self._append(session, event, locked=True)

    async def _append(self, session: S, event: E, locked: bool) -> E:
        prepared = self._core.prepare_append(session, event, locked)
        if prepared is None:
            return event
        completion = self.store.aio.append(prepared)
        try:
            result = await completion
        except asyncio.CancelledError:
            # The write was queued and will land or fail all the same: wait
            # for it, so the live session matches the store, then cancel.
            try:
                result = await completion
            except BaseException:
                self._core.abandon_append(event, prepared)
                raise
            self._core.finish_append(session, event, prepared, result)
            raise
        except BaseException as error:
            self._core.abandon_append(event, prepared)
            if isinstance(error, SessionscopeError):
                self._raise(error)
            raise
        return self._core.finish_append(session, event, prepared, result)

    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        """Return the user map, keys without prefix; {} when none."""
        return await self.store.aio.read_user_state(*self._core.check_user(app_name, user_id))

    async def get_app_state(self, *, app_name: str) -> dict[str, Any]:
        """Return the app map, keys without prefix; {} when none."""
        return await self.store.aio.read_app_state(check_id(app_name, "app_name"))

    async def truncate_events(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        before: float | None = None,
        keep_last: int | None = None,
    ) -> int:
        """Remove a session's events before a time, or all but the last ``keep_last``.

        State stays; the session's revision moves, so copies read before are
        stale. Return how many events went. A missing session raises
        SessionNotFoundError.
        """
        checked = self._core.check_truncate(app_name, user_id, session_id, before, keep_last)
        try:
            return await self.store.aio.truncate_events(*checked)
        except SessionscopeError as error:
            self._raise(error)

    async def expire_sessions(self, *, app_name: str | None = None, idle_for: float) -> int:
        """Delete the sessions (of one app, or all) idle for more than ``idle_for`` seconds.

        Return how many went; a session appended to meanwhile survives whole.
        """
        return await self.store.aio.expire_sessions(*self._core.check_expiry(app_name, idle_for))

    async def delete_user(self, *, app_name: str, user_id: str) -> int:
        """Delete every session of a user and the user's state; return the sessions removed."""
        app, user = check_id(app_name, "app_name"), check_id(user_id, "user_id")
        return await self.store.aio.delete_user(app, user)

    async def delete_app(self, *, app_name: str) -> int:
        """Delete every session and all state of an app; return the sessions removed."""
        return await self.store.aio.delete_app(check_id(app_name, "app_name"))

    async def flush(self) -> None:
        """Return once every acknowledged append is durable."""
        await self.store.aio.flush()

    async def close(self) -> None:
        """Flush and release the store."""
        await self.store.aio.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()


class SessionService(AsyncSessions[Session, Event]):
    """The async session service over any store (default: a MemoryStore)."""

    def __init__(self, store: Store | str | None = None) -> None:
        self.store = _resolve_store(store)
        self._core = ServiceCore(NativeModel())

    def __repr__(self) -> str:
        return f"SessionService({self.store!r})"

    async def list_sessions(
        self,
        *,
        app_name: str,
        user_id: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> ListSessionsResponse:
        """List session metadata, least recently active first; pages with limit."""
        core = self._core
        return core.finish_list(
            *await self.store.aio.list_page(*core.check_list(app_name, user_id, limit, cursor))
        )


class SyncSessionService:
    """The synchronous twin of SessionService, for scripts, replay and threads."""

    def __init__(self, store: Store | str | None = None) -> None:
        self.store = _resolve_store(store)
        self._core: ServiceCore[Session, Event] = ServiceCore(NativeModel())

    def __repr__(self) -> str:
        return f"SyncSessionService({self.store!r})"

    @property
    def core(self) -> ServiceCore[Session, Event]:
        """Return the rules this service runs: its checks, preparations and finishes.

        For a harness that hands the store requests itself (replay reads a
        session inside a batch's round trips): ``core.check_get`` gives the
        arguments of ``Store.load_session``, ``core.finish_get`` the session
        of what it returned. The core does no I/O.
        """
        return self._core

    def create_session(
        self,
        *,
        app_name: str,
        user_id: str,
        state: Mapping[str, Any] | None = None,
        session_id: str | None = None,
    ) -> Session:
        """Create a session; its initial state is routed by prefix."""
        p = self._core.prepare_create(app_name, user_id, state, session_id)
        loaded = self.store.create_session(
            p.app_name, p.user_id, p.session_id, p.create_time,
            p.app_items, p.user_items, p.session_items,
        ).result()  # fmt: skip
        return self._core.finish_load(loaded)

    def get_session(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        config: GetSessionConfig | None = None,
    ) -> Session | None:
        """Read a session with the events ``config`` selects; None if missing."""
        core = self._core
        loaded = self.store.load_session(*core.check_get(app_name, user_id, session_id, config))
        return core.finish_get(loaded)

    def list_sessions(
        self,
        *,
        app_name: str,
        user_id: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> ListSessionsResponse:
        """List session metadata, least recently active first; pages with limit."""
        core = self._core
        return core.finish_list(
            *self.store.list_page(*core.check_list(app_name, user_id, limit, cursor))
        )

    def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        """Delete a session, its state and its events; a missing one is a no-op."""
        self.store.delete_session(*self._core.check_key(app_name, user_id, session_id)).result()

    def append_event(self, session: Session, event: Event) -> Event:
        """Append an event to a session read before; stale copies are refused."""
        return self._append(session, event, locked=False)

    def append_event_locked(self, session: Session, event: Event) -> Event:
        """Append on top of what is stored, and bring the live session up to date."""
        return self._append(session, event, locked=True)

    def _append(self, session: Session, event: Event, locked: bool) -> Event:
        prepared = self._core.prepare_append(session, event, locked)
        if prepared is None:
            return event
        try:
            result = self.store.append(prepared).result()
        except BaseException:
            self._core.abandon_append(event, prepared)
            raise
        return self._core.finish_append(session, event, prepared, result)

    def append_many(self, appends: Iterable[tuple[Session, Event]]) -> list[Event]:
        """Append many events in as few transactions as the store can: replay and import.

        Each append is applied on top of what is stored, like
        ``append_event_locked``, but events others appended meanwhile are not
        brought into the live sessions. A bad event anywhere in the batch is
        refused before anything is stored. An error the store meets (a missing
        session, a conflicting event id) stops the batch there: the appends
        before it stay stored and applied to their sessions, and it is raised.
        """
        return self.append_many_with(appends, lambda batch: self.store.append_many(batch).result())

    def append_many_with(
        self,
        appends: Iterable[tuple[Session, Event]],
        send: Callable[[AppendBatch], BatchResult],
    ) -> list[Event]:
        """Append as ``append_many`` does, with ``send`` handing the batch to the store.

        ``send`` gets the checked and packed ``AppendBatch`` and returns the
        store's ``BatchResult``; the steps around it (checks, live sessions
        updated, deltas given back to events the store did not reach, the
        error raised) are those of ``append_many``. Replay sends the batch
        along with reads where the store can carry them
        (``RedisStore.append_many_reading``).
        """
        model = self._core.model
        # Checked and packed in one call, every event or none (see _append.prepare_many).
        prepared = _hot.prepare_many(model, appends)
        try:
            result = send(prepared.batch)
        except BaseException:
            _hot.abandon_many(model, prepared, 0)
            raise
        # Those the store did not reach get their deltas back.
        finished: list[Event] = _hot.finish_many(model, prepared, result)
        if result.error is not None:
            raise result.error
        return finished

    def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        """Return the user map, keys without prefix; {} when none."""
        return self.store.read_user_state(*self._core.check_user(app_name, user_id))

    def get_app_state(self, *, app_name: str) -> dict[str, Any]:
        """Return the app map, keys without prefix; {} when none."""
        return self.store.read_app_state(check_id(app_name, "app_name"))

    def truncate_events(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        before: float | None = None,
        keep_last: int | None = None,
    ) -> int:
        """Remove a session's events before a time, or all but the last ``keep_last``.

        State stays; the session's revision moves, so copies read before are
        stale. Return how many events went. A missing session raises
        SessionNotFoundError.
        """
        checked = self._core.check_truncate(app_name, user_id, session_id, before, keep_last)
        return self.store.truncate_events(*checked).result()

    def expire_sessions(self, *, app_name: str | None = None, idle_for: float) -> int:
        """Delete the sessions (of one app, or all) idle for more than ``idle_for`` seconds.

        Return how many went; a session appended to meanwhile survives whole.
        """
        return self.store.expire_sessions(*self._core.check_expiry(app_name, idle_for)).result()

    def delete_user(self, *, app_name: str, user_id: str) -> int:
        """Delete every session of a user and the user's state; return the sessions removed."""
        app, user = check_id(app_name, "app_name"), check_id(user_id, "user_id")
        return self.store.delete_user(app, user).result()

    def delete_app(self, *, app_name: str) -> int:
        """Delete every session and all state of an app; return the sessions removed."""
        return self.store.delete_app(check_id(app_name, "app_name")).result()

    def flush(self) -> None:
        """Return once every acknowledged append is durable."""
        self.store.flush().result()

    def close(self) -> None:
        """Flush and release the store."""
        self.store.close()

    def __enter__(self) -> SyncSessionService:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
