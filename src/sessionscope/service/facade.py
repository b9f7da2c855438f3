"""The SessionService facades: ``SessionService`` (async) and ``SyncSessionService``.

Every rule lives in ``ServiceCore`` (``core``), which does no I/O; the
facades are thin shells that hand its prepared requests to the store, wait
for them in their own way and hand the answers back to the core to finish.
The core never learns which store it has.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from contextlib import suppress
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, NoReturn, TypeVar, cast

from ..errors import SessionscopeError, batch_stopped
from ..model import Event, GetSessionConfig, ListSessionsResponse, Session
from ..stores import Store, open_store
from ..stores.protocol import AsyncChainStore
from ..stores.records import AppendBatch, AppendRequest, BatchResult, BatchSlices
from .core import (
    MAX_ID_BYTES,
    FieldModel,
    Model,
    NativeModel,
    ServiceCore,
    check_app_name,
    check_id,
    check_session_id,
    event_from_record,
    event_to_record,
    timestamp_of,
)
from .paging import check_page, cursor_position, page_of

if TYPE_CHECKING:
    from typing_extensions import Self


S = TypeVar("S")
E = TypeVar("E")

__all__ = [
    "MAX_ID_BYTES",
    "AsyncSessions",
    "FieldModel",
    "Model",
    "NativeModel",
    "ServiceCore",
    "SessionService",
    "SyncSessionService",
    "check_app_name",
    "check_id",
    "check_page",
    "check_session_id",
    "cursor_position",
    "event_from_record",
    "event_to_record",
    "page_of",
    "timestamp_of",
]


def _resolve_store(store: Store | str | None) -> Store:
    if store is None:
        from ..stores.memory import MemoryStore

        return MemoryStore()
    if isinstance(store, str):
        return open_store(store)
    return store


def _position_of_stored(appends: list[tuple[Any, Any]], applied: int) -> int:
    """Return how many of the caller's appends are handled when the store took ``applied``.

    The store counts the stored events only; the caller's list also holds
    partial events, which are never stored: those before the stop count as
    handled, so that the answer indexes the caller's list.
    """
    taken = 0
    for index, (_, event) in enumerate(appends):
        if event.partial:
            continue
        if taken == applied:
            return index
        taken += 1
    return len(appends)


class AsyncSessions(Generic[S, E]):
    """The async facade over a ServiceCore: what SessionService and the ADK drop-in share.

    A subclass sets ``store`` and ``_core``, adds its own ``list_sessions``,
    and may override ``_raise`` to hand callers its own error classes.
    """

    store: Store
    _core: ServiceCore[S, E]
    # Per live session object (by id) with an append in flight: the appends
    # waiting behind it (None: none). The in-flight append holds the object,
    # so no other object takes its id while its entry is here.
    _turns: dict[int, deque[asyncio.Future[None]] | None]

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
        # One append at a time per live session object. Each is prepared with
        # the revision the object holds, and brings it forward when it lands:
        # a second append prepared while the first is in flight would carry the
        # revision the first moves past, and be refused as stale though the
        # object is the only copy (ADK's live mode appends from two tasks).
        key = id(session)
        if not self._take_turn(key):
            await self._wait_turn(key)
        try:
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
        finally:
            self._leave_turn(key)

    async def _append_chain(self, session: S, events: list[E]) -> list[E]:
        """Append events to one session in order, all or none, in one write of the store.

        The result, on the store and on the live session, is that of
        ``append_event`` called for each event in turn (a partial event is
        handed back unstored), but one transaction carries them all: a
        stale copy or a conflicting event id anywhere stores nothing and
        leaves the live session as it was. The store must be a
        ``ChainStore`` (memory, LMDB).
        """
        key = id(session)
        if not self._take_turn(key):
            await self._wait_turn(key)
        try:
            core = self._core
            prepared = core.prepare_chain(session, events)
            requests: list[AppendRequest] = [append for append in prepared if append is not None]
            if not requests:
                return events
            completion = cast(AsyncChainStore, self.store.aio).append_chain(requests)
            try:
                results = await completion
            except asyncio.CancelledError:
                # Queued, it lands or fails all the same: as ``_append`` does.
                try:
                    results = await completion
                except BaseException:
                    core.abandon_chain(events, prepared)
                    raise
                core.finish_chain(session, events, prepared, results)
                raise
            except BaseException as error:
                core.abandon_chain(events, prepared)
                if isinstance(error, SessionscopeError):
                    self._raise(error)
                raise
            return core.finish_chain(session, events, prepared, results)
        finally:
            self._leave_turn(key)

    def _take_turn(self, key: int) -> bool:
        """Take the turn on a live session object if nobody holds it; False: wait for it."""
        turns = self._turns
        if key in turns:
            return False
        turns[key] = None
        return True

    def _leave_turn(self, key: int) -> None:
        """End an append's turn on its live session object: the next waiting one runs."""
        if self._turns[key] is None:
            del self._turns[key]
        else:
            self._next_turn(key)

    async def _wait_turn(self, key: int) -> None:
        """Wait until the appends before this one on the same live object are done."""
        waiting = self._turns[key]
        if waiting is None:
            waiting = self._turns[key] = deque()
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiting.append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                # Cancelled as the turn came: hand it on to the next.
                self._next_turn(key)
            else:
                with suppress(ValueError):
                    waiting.remove(waiter)
            raise

    def _next_turn(self, key: int) -> None:
        """Give the turn to the first append still waiting on the object, or free its entry."""
        waiting = self._turns[key]
        while waiting:
            waiter = waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        del self._turns[key]

    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        """Return the user map, keys without prefix; {} when none."""
        return await self.store.aio.read_user_state(*self._core.check_user(app_name, user_id))

    async def get_app_state(self, *, app_name: str) -> dict[str, Any]:
        """Return the app map, keys without prefix; {} when none."""
        return await self.store.aio.read_app_state(check_app_name(app_name))

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
        app, user = self._core.check_user(app_name, user_id)
        return await self.store.aio.delete_user(app, user)

    async def delete_app(self, *, app_name: str) -> int:
        """Delete every session and all state of an app; return the sessions removed."""
        return await self.store.aio.delete_app(check_app_name(app_name))

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
        self._turns = {}

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


# A sync append waiting for its turn: the lock it blocks on (released when the
# turn comes) and whether the append is locked.
_Waiter = tuple[threading.Lock, bool]
# The running count of an object whose one running append is a plain one.
_PLAIN_RUNS = -1


class _Turns:
    """The sync appends through one live session object that run, and those waiting."""

    __slots__ = ("running", "waiting")

    def __init__(self, running: int) -> None:
        # _PLAIN_RUNS, or how many locked appends run (0: none).
        self.running = running
        self.waiting: deque[_Waiter] = deque()

    def admit(self) -> None:
        """Let the waiters at the head run, in arrival order, as far as they can.

        A plain append runs alone; locked ones run together. Called with the
        turns lock held.
        """
        waiting = self.waiting
        while waiting:
            wake, locked = waiting[0]
            if self.running == 0 and not locked:
                self.running = _PLAIN_RUNS
            elif self.running >= 0 and locked:
                self.running += 1
            else:
                return
            waiting.popleft()
            wake.release()


class SyncSessionService:
    """The synchronous twin of SessionService, for scripts, replay and threads."""

    def __init__(self, store: Store | str | None = None) -> None:
        self.store = _resolve_store(store)
        self._core: ServiceCore[Session, Event] = ServiceCore(NativeModel())
        # Per live session object (by id) with an append in flight: how many
        # run (_PLAIN_RUNS: one plain append, alone; n > 0: n locked ones),
        # or, once a thread waits, a _Turns with the waiters. The appends in
        # flight and waiting hold the object, so no other object takes its id
        # while its entry is here. One lock guards the map, never held while
        # an append waits or runs.
        self._turns: dict[int, int | _Turns] = {}
        self._turns_lock = threading.Lock()

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
        """Append an event to a session read before; stale copies are refused.

        Threads appending through one live session object take turns, in
        arrival order, so the owner of the object is never refused as stale;
        another copy read at the same revision still is.
        """
        return self._append(session, event, locked=False)

    def append_event_locked(self, session: Session, event: Event) -> Event:
        """Append on top of what is stored, and bring the live session up to date.

        Threads may append locked through one live session object at once;
        a plain ``append_event`` through it waits for them, and they for it.
        """
        return self._append(session, event, locked=True)

    def _append(self, session: Session, event: Event, locked: bool) -> Event:
        # A plain append is prepared with the revision the object holds and
        # brings it forward when it lands: a second append through the same
        # object landing meanwhile would make it stale, though the object is
        # the only copy. So a plain append runs alone on its object. Locked
        # appends skip the stale check and merge in any order (finish_append),
        # so they run together, keeping a durable store's group commit.
        key = id(session)
        turns = self._turns
        with self._turns_lock:
            running = turns.get(key)
            if running is None:
                turns[key] = 1 if locked else _PLAIN_RUNS
                waiter = None
            elif locked and isinstance(running, int) and running > 0:
                turns[key] = running + 1
                waiter = None
            else:
                waiter = self._queue_turn(key, running, locked)
        if waiter is not None:
            self._wait_turn(key, waiter)
        try:
            prepared = self._core.prepare_append(session, event, locked)
            if prepared is None:
                return event
            try:
                result = self.store.append(prepared).result()
            except BaseException:
                self._core.abandon_append(event, prepared)
                raise
            return self._core.finish_append(session, event, prepared, result)
        finally:
            with self._turns_lock:
                running = turns[key]
                if isinstance(running, _Turns):
                    self._end_turn(key, running)
                elif running == _PLAIN_RUNS or running == 1:
                    del turns[key]
                else:
                    turns[key] = running - 1

    def _queue_turn(self, key: int, running: int | _Turns, locked: bool) -> _Waiter | None:
        """Queue an append behind those on the same object; None if it may run now.

        Called with the turns lock held.
        """
        turns = running if isinstance(running, _Turns) else _Turns(running)
        self._turns[key] = turns
        if locked and turns.running > 0 and not turns.waiting:
            turns.running += 1
            return None
        wake = threading.Lock()
        wake.acquire()
        waiter = (wake, locked)
        turns.waiting.append(waiter)
        return waiter

    def _wait_turn(self, key: int, waiter: _Waiter) -> None:
        """Wait until the appends before this one on the same live object let it run."""
        try:
            waiter[0].acquire()
        except BaseException:
            # Interrupted (KeyboardInterrupt): leave the queue, or, if the
            # turn came meanwhile, hand it on.
            with self._turns_lock:
                turns = self._turns[key]
                assert isinstance(turns, _Turns)
                if waiter in turns.waiting:
                    turns.waiting.remove(waiter)
                    turns.admit()
                else:
                    self._end_turn(key, turns)
            raise

    def _end_turn(self, key: int, turns: _Turns) -> None:
        """End one running append on an object others waited on; let the next run.

        Called with the turns lock held.
        """
        turns.running = turns.running - 1 if turns.running > 0 else 0
        if turns.running == 0 and not turns.waiting:
            del self._turns[key]
        else:
            turns.admit()

    def append_many(self, appends: Iterable[tuple[Session, Event]]) -> list[Event]:
        """Append many events in as few transactions as the store can: replay and import.

        Each append is applied on top of what is stored, like
        ``append_event_locked``, but events others appended meanwhile are not
        brought into the live sessions. A bad event anywhere in the batch is
        refused before anything is stored. An error the store meets (a missing
        session, a conflicting event id) stops the batch there: the appends
        before it stay stored and applied to their sessions, and it is raised
        with ``stored`` set to how many of the batch's first appends are
        handled, counted in ``appends`` (a partial event, never stored, counts
        as handled), so that ``appends[stored:]`` is what was not
        (``errors.batch_stopped``). The store is handed the batch as slices
        checked and packed as it asks for them (``Store.append_slices``).
        """
        return self._append_sliced(
            appends, lambda slices: self.store.append_slices(slices).result()
        )

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
        # The whole batch, checked and packed before ``send`` is called.
        return self._append_sliced(appends, lambda slices: send(slices.whole()))

    def _append_sliced(
        self,
        appends: Iterable[tuple[Session, Event]],
        send: Callable[[BatchSlices], BatchResult],
    ) -> list[Event]:
        """Append as ``append_many`` does, ``send`` handing the batch's slices to the store."""
        core = self._core
        appends = appends if isinstance(appends, list) else list(appends)
        # Checked and packed as the store asks for its slices (or the whole
        # batch): a bad event raises out of ``send``, and nothing is stored.
        slices = core.slice_many(appends)
        prepared = slices.prepared
        try:
            result = send(slices)
        except BaseException as error:
            core.abandon_many(prepared, 0)
            if isinstance(error, (AttributeError, TypeError, ValueError)):
                core.check_pairs(appends)
            raise
        # Those the store did not reach get their deltas back.
        finished = core.finish_many(prepared, result)
        if result.error is not None:
            stored = _position_of_stored(appends, result.applied)
            raise batch_stopped(result.error, stored, len(appends))
        return finished

    def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        """Return the user map, keys without prefix; {} when none."""
        return self.store.read_user_state(*self._core.check_user(app_name, user_id))

    def get_app_state(self, *, app_name: str) -> dict[str, Any]:
        """Return the app map, keys without prefix; {} when none."""
        return self.store.read_app_state(check_app_name(app_name))

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
        app, user = self._core.check_user(app_name, user_id)
        return self.store.delete_user(app, user).result()

    def delete_app(self, *, app_name: str) -> int:
        """Delete every session and all state of an app; return the sessions removed."""
        return self.store.delete_app(check_app_name(app_name)).result()

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
