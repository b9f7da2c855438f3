"""The store interface, written once: the ``Store`` protocol and its async face.

``Store`` is what a ``SyncSessionService`` calls; ``AsyncStore`` what a
``SessionService`` awaits. A store whose calls answer inline (memory, LMDB)
gets its async face from ``InlineAsyncStore``, whose methods are derived
from ``STORE_METHODS``, one line each.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from .completion import Completion
from .records import (
    AppendBatch,
    AppendRequest,
    AppendResult,
    BatchResult,
    BatchSlices,
    EventPage,
    Items,
    ListPosition,
    LoadedSession,
    SessionCopy,
    SessionRecord,
)

__all__ = [
    "CHAIN_METHODS",
    "STORE_METHODS",
    "AsyncChainStore",
    "AsyncStore",
    "ChainStore",
    "InlineAsyncStore",
    "Store",
    "append_joined",
]


class Store(Protocol):
    """The storage a ``SyncSessionService`` runs on; ``aio`` is its async face."""

    @property
    def aio(self) -> AsyncStore:
        """Return the async face of this store, the one ``SessionService`` awaits."""
        ...

    def opened_elsewhere(self) -> bool:
        """Tell whether another process may have had this store open as this one opened it.

        An LMDB store asked its lock file then; a Redis store, whose clients
        the server does not tell apart, answers True unless this open
        created it. ``sessionscope.crypto.open_encrypted`` marks a store without
        data as encrypted only when nobody else may have it open without a
        key, writing plaintext into it.
        """
        ...

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
        ...

    def load_session(
        self,
        app_name: str,
        user_id: str,
        session_id: str,
        num_recent_events: int | None,
        after_timestamp: float | None,
    ) -> LoadedSession | None:
        """Read a session with the events the filters select, in append order."""
        ...

    def read_events(
        self, app_name: str, user_id: str, session_id: str, start: int, limit: int
    ) -> EventPage | None:
        """Return a session's record and up to ``limit`` stored events from position ``start``.

        Each event comes with its position (positions count every event ever
        appended; a truncation leaves gaps, which are skipped), in order.
        Reading page after page, from the last position plus one, reads a
        long session in bounded memory. None if the session does not exist.
        """
        ...

    def list_sessions(self, app_name: str, user_id: str | None) -> list[SessionRecord]:
        """Return the records of an app's (or one user's) sessions, any order."""
        ...

    def list_page(
        self,
        app_name: str,
        user_id: str | None,
        limit: int | None,
        after: ListPosition | None,
    ) -> tuple[list[SessionRecord], bool]:
        """Return one page of an app's (or one user's) sessions, and whether more follow.

        The listing order is ``(last_update_time, user_id, session_id)``
        ascending, compared as Python compares floats and str (code point
        order): least recently active first. The page holds the first
        ``limit`` sessions (all of them with None) whose position is
        strictly greater than ``after`` (from the first with None); the
        flag is True when sessions past the page remain. ``after`` need not
        be the position of a session that still exists, or still has that
        time: a session appended to since moves later in the order and is
        listed again if its new position lies past ``after``.

        The page is read in one consistent view. ``page_records`` gives
        the answer from a full listing; a store with a list index (LMDB of
        format 2) reads only the page, so a page costs the same however
        many sessions the app has. With ``user_id`` a store may read all
        of that user's sessions.
        """
        ...

    def delete_session(self, app_name: str, user_id: str, session_id: str) -> Completion[None]:
        """Remove a session with its state and events; a missing one is a no-op."""
        ...

    def append(self, request: AppendRequest) -> Completion[AppendResult]:
        """Append one event and apply its packed delta, all or nothing."""
        ...

    def append_many(self, batch: AppendBatch) -> Completion[BatchResult]:
        """Append a batch in order, in as few transactions as possible (replay, import).

        Returns how far the batch went, each session's marker after it, and
        the error that stopped it (None when every event was handled): the
        events before a failing one stay appended, those after it are not
        tried.
        """
        ...

    def append_slices(self, slices: BatchSlices) -> Completion[BatchResult]:
        """Append a batch handed as slices packed on demand, as ``append_many`` appends it.

        What ``SyncSessionService.append_many`` calls (the sync face only).
        The batch's events are checked as its slices are packed
        (``BatchSlices``): a bad event raises its error, and nothing of the
        batch may be stored then. A store that appends no faster in slices
        answers ``append_joined(self, slices)``: the whole batch, packed
        first, through ``append_many``. LMDB appends the slices in one
        transaction, each packed just before it is written.
        """
        ...

    def read_app_state(self, app_name: str) -> dict[str, Any]:
        """Return the app map, keys without prefix."""
        ...

    def read_user_state(self, app_name: str, user_id: str) -> dict[str, Any]:
        """Return the user map, keys without prefix."""
        ...

    def flush(self) -> Completion[None]:
        """Make every acknowledged write durable."""
        ...

    def close(self) -> None:
        """Flush and release the store; later calls raise StoreClosedError."""
        ...

    # -- retention and copies (see the module's "Retention" notes) --------

    def truncate_events(
        self,
        app_name: str,
        user_id: str,
        session_id: str,
        before: float | None,
        keep_last: int | None,
    ) -> Completion[int]:
        """Remove a session's events with ``timestamp < before``, or all but the last ``keep_last``.

        Exactly one of the two is given (the service checks it). State and
        ``last_update_time`` stay; ``removed_count`` grows by the number
        removed, so the marker moves whenever an event went. Return that
        number. A store may remove in several transactions, oldest
        positions first; each leaves the session readable and consistent.
        SessionNotFoundError if the session does not exist.
        """
        ...

    def pop_events(
        self,
        app_name: str,
        user_id: str,
        session_id: str,
        count: int,
        *,
        if_last_event_id: str | None = None,
    ) -> Completion[list[bytes]]:
        """Remove a session's newest ``count`` stored events and return their records.

        One transaction: two callers never get the same event. The records
        come oldest first (fewer when fewer are stored, none from an empty
        session). As with a truncation, ``removed_count`` grows by the
        number removed (positions are never reused, so the marker moves),
        ``last_event_id`` names the newest event left, and state and
        ``last_update_time`` stay. SessionNotFoundError if the session does
        not exist.

        ``if_last_event_id`` makes the pop conditional: the events go only
        if the session's newest stored event has that id, checked in the
        pop's own transaction (one server-side call on Redis). Otherwise
        nothing is removed and the pop fails with StaleSessionError (an
        empty session fails it too: it has no newest event), which a caller
        tells apart from an empty answer: read the session again and retry.
        """
        ...

    def expire_sessions(self, app_name: str | None, idle_before: float) -> Completion[int]:
        """Delete the sessions (of one app, or all) whose ``last_update_time < idle_before``.

        Works in batches bounded in count and time; each session is checked
        again inside the transaction that deletes it, so one appended to
        meanwhile survives whole. Return how many sessions went.
        """
        ...

    def delete_user(self, app_name: str, user_id: str) -> Completion[int]:
        """Delete every session of a user and the user's state map; return the sessions removed."""
        ...

    def delete_app(self, app_name: str) -> Completion[int]:
        """Delete every session, user map and the app map of an app; return the sessions removed."""
        ...

    def list_apps(self) -> list[str]:
        """Return the apps that have a session, app state or user state, sorted."""
        ...

    def list_users(self, app_name: str) -> list[str]:
        """Return the users of an app that have a session or user state, sorted."""
        ...

    def restore_session(self, copy: SessionCopy) -> Completion[bool]:
        """Write a whole session as given: times, state and events, in one transaction.

        The record gets ``copy.create_time`` and ``copy.last_update_time``
        exactly; events keep their ids, timestamps and records, in order.
        Return True when written, False when an equal session is already
        stored (restoring twice is a no-op); AlreadyExistsError when a
        different one is. App and user state are written separately.
        """
        ...

    def write_app_state(self, app_name: str, items: Items) -> Completion[None]:
        """Set keys of the app map (keys without prefix), leaving other keys as they are."""
        ...

    def write_user_state(self, app_name: str, user_id: str, items: Items) -> Completion[None]:
        """Set keys of a user map (keys without prefix), leaving other keys as they are."""
        ...


class AsyncStore(Protocol):
    """The async face of a store: what the async services await.

    A store that answers inline (memory, LMDB) gets it from ``InlineAsyncStore``;
    a networked store (Redis) implements it over an async client, so that no
    call blocks the event loop on the network.

    A write returns an awaitable that may be awaited again after the task
    awaiting it was cancelled: the write goes on regardless, and the service
    waits for its outcome so that the live session matches the store.
    """

    def create_session(
        self,
        app_name: str,
        user_id: str,
        session_id: str,
        create_time: float,
        app_items: Items,
        user_items: Items,
        session_items: Items,
    ) -> Awaitable[LoadedSession]:
        """Store a new session; see ``Store.create_session``."""
        ...

    async def load_session(
        self,
        app_name: str,
        user_id: str,
        session_id: str,
        num_recent_events: int | None,
        after_timestamp: float | None,
    ) -> LoadedSession | None:
        """Read a session; see ``Store.load_session``."""
        ...

    async def read_events(
        self, app_name: str, user_id: str, session_id: str, start: int, limit: int
    ) -> EventPage | None:
        """Return a page of a session's events; see ``Store.read_events``."""
        ...

    async def list_sessions(self, app_name: str, user_id: str | None) -> list[SessionRecord]:
        """Return session records; see ``Store.list_sessions``."""
        ...

    async def list_page(
        self,
        app_name: str,
        user_id: str | None,
        limit: int | None,
        after: ListPosition | None,
    ) -> tuple[list[SessionRecord], bool]:
        """Return one page of sessions; see ``Store.list_page``."""
        ...

    def delete_session(self, app_name: str, user_id: str, session_id: str) -> Awaitable[None]:
        """Remove a session; see ``Store.delete_session``."""
        ...

    def append(self, request: AppendRequest) -> Awaitable[AppendResult]:
        """Append one event; see ``Store.append``."""
        ...

    def append_many(self, batch: AppendBatch) -> Awaitable[BatchResult]:
        """Append a batch; see ``Store.append_many``."""
        ...

    async def read_app_state(self, app_name: str) -> dict[str, Any]:
        """Return the app map; see ``Store.read_app_state``."""
        ...

    async def read_user_state(self, app_name: str, user_id: str) -> dict[str, Any]:
        """Return the user map; see ``Store.read_user_state``."""
        ...

    def flush(self) -> Awaitable[None]:
        """Make every acknowledged write durable."""
        ...

    async def close(self) -> None:
        """Flush and release the store."""
        ...

    # -- retention and copies ----------------------------------------------

    async def truncate_events(
        self,
        app_name: str,
        user_id: str,
        session_id: str,
        before: float | None,
        keep_last: int | None,
    ) -> int:
        """Remove old events of a session; see ``Store.truncate_events``."""
        ...

    def pop_events(
        self,
        app_name: str,
        user_id: str,
        session_id: str,
        count: int,
        *,
        if_last_event_id: str | None = None,
    ) -> Awaitable[list[bytes]]:
        """Remove a session's newest events; see ``Store.pop_events``."""
        ...

    async def expire_sessions(self, app_name: str | None, idle_before: float) -> int:
        """Delete idle sessions; see ``Store.expire_sessions``."""
        ...

    async def delete_user(self, app_name: str, user_id: str) -> int:
        """Delete a user's sessions and state; see ``Store.delete_user``."""
        ...

    async def delete_app(self, app_name: str) -> int:
        """Delete everything of an app; see ``Store.delete_app``."""
        ...

    async def list_apps(self) -> list[str]:
        """Return the apps of the store; see ``Store.list_apps``."""
        ...

    async def list_users(self, app_name: str) -> list[str]:
        """Return the users of an app; see ``Store.list_users``."""
        ...

    async def restore_session(self, copy: SessionCopy) -> bool:
        """Write a whole session as given; see ``Store.restore_session``."""
        ...

    async def write_app_state(self, app_name: str, items: Items) -> None:
        """Set keys of the app map; see ``Store.write_app_state``."""
        ...

    async def write_user_state(self, app_name: str, user_id: str, items: Items) -> None:
        """Set keys of a user map; see ``Store.write_user_state``."""
        ...


class ChainStore(Store, Protocol):
    """A store that also appends a chain of events to one session, all or none (memory, LMDB).

    What the google-adk drop-in's ``append_events`` stands on. Redis has no
    such write yet: its append is a server function of one event, and a
    chain would need a function of its own that checks every event of the
    chain before it writes any.
    """

    @property
    def aio(self) -> AsyncChainStore:
        """Return the async face of this store."""
        ...

    def append_chain(self, requests: list[AppendRequest]) -> Completion[list[AppendResult]]:
        """Append events to one session in order, all or none; return each one's answer.

        Each request after the first is checked against what those before
        it left (``rules.append_chain``), as the same appends made one by one
        would be; an error in any (a stale copy, a conflicting event id)
        leaves nothing of the chain stored and is raised. A durable store
        syncs the chain once.
        """
        ...


class AsyncChainStore(AsyncStore, Protocol):
    """The async face of a ``ChainStore``."""

    def append_chain(self, requests: list[AppendRequest]) -> Awaitable[list[AppendResult]]:
        """Append a chain of events to one session; see ``ChainStore.append_chain``."""
        ...


def append_joined(store: Store, slices: BatchSlices) -> Completion[BatchResult]:
    """Append a batch's slices as one batch: ``Store.append_slices`` of a store without slices.

    The whole batch is checked and packed first, so a bad event raises
    before anything reaches the store.
    """
    return store.append_many(slices.whole())


# The methods of ``Store`` (``aio`` and ``opened_elsewhere``, which answers what
# the open learned, and ``append_slices``, the sync face's way of a bulk
# append, apart), each face's in this order.
STORE_METHODS: tuple[str, ...] = (
    "create_session",
    "load_session",
    "read_events",
    "list_sessions",
    "list_page",
    "delete_session",
    "append",
    "append_many",
    "read_app_state",
    "read_user_state",
    "flush",
    "close",
    "truncate_events",
    "pop_events",
    "expire_sessions",
    "delete_user",
    "delete_app",
    "list_apps",
    "list_users",
    "restore_session",
    "write_app_state",
    "write_user_state",
)

# The methods a ``ChainStore`` adds, which the inline async face has too.
CHAIN_METHODS: tuple[str, ...] = ("append_chain",)


# How the inline async face answers a method of ``Store``:
#   _given    hands back the store's Completion: awaiting it suspends the event
#             loop only while a background thread commits it, it may be
#             awaited again after a cancellation, and nothing is wrapped in a task;
#   _inline   a coroutine returning the store's answer (reads answer at once);
#   _awaited  a coroutine awaiting the store's Completion;
#   _thread   a coroutine running the call and its result in a worker thread:
#             retention works in several transactions, some of which may wait
#             for the disk, and the event loop goes on meanwhile.
def _given(name: str, protocol: str = "Store") -> Callable[..., Any]:
    def method(self: InlineAsyncStore, *args: Any) -> Any:
        return getattr(self._store, name)(*args)

    return _named(method, name, protocol)


def _given_with_keywords(name: str) -> Callable[..., Any]:
    # Apart from _given: the appends' path builds no keyword map per call.
    def method(self: InlineAsyncStore, *args: Any, **keywords: Any) -> Any:
        return getattr(self._store, name)(*args, **keywords)

    return _named(method, name)


def _inline(name: str) -> Callable[..., Any]:
    async def method(self: InlineAsyncStore, *args: Any) -> Any:
        return getattr(self._store, name)(*args)

    return _named(method, name)


def _awaited(name: str) -> Callable[..., Any]:
    async def method(self: InlineAsyncStore, *args: Any) -> Any:
        return await getattr(self._store, name)(*args)

    return _named(method, name)


def _thread(name: str) -> Callable[..., Any]:
    async def method(self: InlineAsyncStore, *args: Any) -> Any:
        call = getattr(self._store, name)
        return await asyncio.to_thread(lambda: call(*args).result())

    return _named(method, name)


def _named(method: Callable[..., Any], name: str, protocol: str = "Store") -> Callable[..., Any]:
    method.__name__, method.__qualname__ = name, f"InlineAsyncStore.{name}"
    method.__doc__ = f"See ``{protocol}.{name}``."
    return method


class InlineAsyncStore:
    """The async face of a store whose calls answer inline (memory, LMDB), both ``ChainStore``.

    Each method of ``Store`` is built in one line by the builder that says how
    it answers; the type callers see is ``AsyncStore``.
    """

    __slots__ = ("_store",)

    def __init__(self, store: Store) -> None:
        self._store = store

    create_session = _given("create_session")
    load_session = _inline("load_session")
    read_events = _inline("read_events")
    list_sessions = _inline("list_sessions")
    list_page = _inline("list_page")
    delete_session = _given("delete_session")
    append = _given("append")
    append_many = _given("append_many")
    read_app_state = _inline("read_app_state")
    read_user_state = _inline("read_user_state")
    flush = _given("flush")
    close = _inline("close")
    truncate_events = _thread("truncate_events")
    pop_events = _given_with_keywords("pop_events")
    expire_sessions = _thread("expire_sessions")
    delete_user = _thread("delete_user")
    delete_app = _thread("delete_app")
    list_apps = _inline("list_apps")
    list_users = _inline("list_users")
    restore_session = _awaited("restore_session")
    write_app_state = _awaited("write_app_state")
    write_user_state = _awaited("write_user_state")
    append_chain = _given("append_chain", "ChainStore")
