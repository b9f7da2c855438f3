"""The small Store protocol the service talks to, and what every store shares.

A store keeps bytes: packed state values per key and packed event records. It
knows the three stored maps (app, user, session) the core hands it, and not
what a prefix is. The rules an append must obey (not found, duplicate event,
stale copy) are decided here once, so every backend enforces them alike.

Writes return a ``Completion``: a store that writes inline hands back a
finished one, a store that commits in a background thread (group commit)
hands back one wrapping a future. Sync callers call ``result()``, async
callers ``await`` it; a finished completion never suspends the event loop.
"""

from __future__ import annotations

import _thread
import asyncio
import contextlib
import heapq
import logging
import math
import threading
from collections.abc import Awaitable, Callable, Generator, Iterable, Mapping
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, Generic, Protocol, TypeVar

from ..codec import events_equal
from ..errors import DuplicateEventError, SessionNotFoundError, StaleSessionError

__all__ = [
    "AppendBatch",
    "AppendRequest",
    "AppendResult",
    "AsyncStore",
    "BatchOutcome",
    "BatchResult",
    "Completion",
    "EventCopy",
    "EventPage",
    "Expirer",
    "InlineAsyncStore",
    "ListPosition",
    "LoadedSession",
    "PartialBatch",
    "Pending",
    "PreparedAppend",
    "SessionCopy",
    "SessionRecord",
    "Store",
    "catch_up",
    "catch_up_repeat",
    "check_append",
    "check_copy",
    "check_ttl",
    "copies_equal",
    "event_copy",
    "events_seen",
    "finish_all",
    "finite_float",
    "list_position",
    "marker_position",
    "page_records",
    "repeat_result",
    "result_of_batch",
]

_log = logging.getLogger(__name__)

T = TypeVar("T")
Items = list[tuple[str, bytes]]
# Where a session stands in a listing: (last_update_time, user_id, session_id).
ListPosition = tuple[float, str, str]
# A session's record and a page of its stored events, each with its position.
EventPage = tuple["SessionRecord", list[tuple[int, bytes]]]


# Guards the hand-over between a finishing thread and a waiter; held for a
# few attribute reads and writes only.
_handover = threading.Lock()


class Pending(Generic[T]):
    """A write another thread finishes, waited on by one thread or one task.

    Lighter than a ``concurrent.futures.Future``: a waiting thread blocks on
    a bare lock, and ``finish_all`` wakes each event loop once per batch of
    writes rather than once per write.
    """

    __slots__ = ("_done", "_loop_waiter", "_ok", "_thread_waiter", "_value")

    def __init__(self) -> None:
        self._done = False
        self._ok = False
        self._value: Any = None
        self._thread_waiter: Any = None
        self._loop_waiter: tuple[asyncio.AbstractEventLoop, asyncio.Future[None]] | None = None

    @property
    def done(self) -> bool:
        """Tell whether the write has finished."""
        return self._done

    def wait(self) -> T:
        """Block the calling thread until the write is done; return or raise its outcome."""
        waiter = None
        with _handover:
            if not self._done:
                waiter = _thread.allocate_lock()
                waiter.acquire()
                self._thread_waiter = waiter
        if waiter is not None:
            waiter.acquire()
        return self._outcome()

    def __await__(self) -> Generator[Any, None, T]:
        # Awaiting again after a cancellation replaces the earlier waiter.
        future = None
        with _handover:
            if not self._done:
                loop = asyncio.get_running_loop()
                future = loop.create_future()
                self._loop_waiter = (loop, future)
        if future is not None:
            yield from future.__await__()
        return self._outcome()

    def _outcome(self) -> T:
        if self._ok:
            return self._value  # type: ignore[no-any-return]
        raise self._value


def finish_all(outcomes: Iterable[tuple[Pending[Any], bool, Any]]) -> None:
    """Finish writes (pending, ok, value or error) and wake whoever waits on them."""
    loops: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}
    for pending, ok, value in outcomes:
        with _handover:
            pending._ok, pending._value, pending._done = ok, value, True
            thread_waiter, loop_waiter = pending._thread_waiter, pending._loop_waiter
        if thread_waiter is not None:
            thread_waiter.release()
        if loop_waiter is not None:
            loops.setdefault(loop_waiter[0], []).append(loop_waiter[1])
    for loop, futures in loops.items():
        # A closed loop has no one left to wake.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_wake, futures)


def _wake(futures: list[asyncio.Future[None]]) -> None:
    for future in futures:
        if not future.done():
            future.set_result(None)


class Completion(Generic[T]):
    """The outcome of a store write: finished now, or when a ``Pending`` finishes."""

    __slots__ = ("_error", "_pending", "_value")

    def __init__(
        self,
        value: T | None = None,
        error: BaseException | None = None,
        pending: Pending[T] | None = None,
    ) -> None:
        self._value = value
        self._error = error
        self._pending = pending

    @classmethod
    def done(cls, value: T) -> Completion[T]:
        """Return a finished completion holding ``value``."""
        return cls(value)

    @classmethod
    def failed(cls, error: BaseException) -> Completion[T]:
        """Return a finished completion that raises ``error``."""
        return cls(error=error)

    @classmethod
    def waiting(cls, pending: Pending[T]) -> Completion[T]:
        """Return a completion that finishes when ``pending`` does."""
        return cls(pending=pending)

    def result(self) -> T:
        """Block until the write is done; return its value or raise its error."""
        if self._pending is not None:
            return self._pending.wait()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]

    def __await__(self) -> Generator[Any, None, T]:
        if self._pending is not None:
            return (yield from self._pending.__await__())
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]


@dataclass(slots=True)
class SessionRecord:
    """What a store keeps about a session besides its state and events.

    ``number`` is store-internal and never reused, so a session deleted and
    created again under the same id has a new number, and markers read from
    the old one can never match.
    """

    app_name: str
    user_id: str
    session_id: str
    number: int
    create_time: float
    last_update_time: float
    event_count: int = 0
    last_event_id: str | None = None
    # Events removed by truncation. ``event_count`` counts every event ever
    # appended (it is also the position the next one takes), so the events
    # stored are ``event_count - removed_count``. Records of format 1 have
    # the eight fields above; this one is written only once it is not zero.
    removed_count: int = 0
    # Whether the store keeps a time index for this session (LMDB format 2
    # keeps one only once an event arrived out of time order); written after
    # removed_count, only when true.
    time_indexed: bool = False

    @property
    def marker(self) -> str:
        """Return the revision marker: which session, after how many events and removals.

        ``number:appended`` while nothing was removed (as format 1 wrote it),
        ``number:appended:removed`` after a truncation, so that a copy read
        before a truncation no longer matches.
        """
        if self.removed_count:
            return f"{self.number}:{self.event_count}:{self.removed_count}"
        return f"{self.number}:{self.event_count}"

    @property
    def stored_count(self) -> int:
        """Return how many events the session stores now."""
        return self.event_count - self.removed_count

    def advance(self, event_id: str, timestamp: float) -> None:
        """Move past an event appended to the session."""
        self.event_count += 1
        self.last_update_time = timestamp
        self.last_event_id = event_id

    def to_list(self) -> list[Any]:
        """Return the record as a packable list."""
        return [
            self.app_name,
            self.user_id,
            self.session_id,
            self.number,
            self.create_time,
            self.last_update_time,
            self.event_count,
            self.last_event_id,
        ] + (
            [self.removed_count, True]
            if self.time_indexed
            else [self.removed_count]
            if self.removed_count
            else []
        )

    @classmethod
    def from_list(cls, fields: list[Any]) -> SessionRecord:
        """Return the record packed by ``to_list``."""
        return cls(*fields)


@dataclass(slots=True)
class LoadedSession:
    """A session as a store reads it: record, decoded maps, event bytes."""

    record: SessionRecord
    session_state: dict[str, Any]
    app_state: dict[str, Any]
    user_state: dict[str, Any]
    events: list[bytes]


@dataclass(slots=True)
class AppendRequest:
    """Everything a store needs to append one event, already checked and packed."""

    app_name: str
    user_id: str
    session_id: str
    event_id: str
    timestamp: float
    event: bytes
    app_items: Items = field(default_factory=list)
    user_items: Items = field(default_factory=list)
    session_items: Items = field(default_factory=list)
    # The marker of the caller's copy (None: built by hand) and, for hand-built
    # copies, what the caller last saw.
    marker: str | None = None
    caller_update_time: float = 0.0
    caller_last_event_id: str | None = None
    # Locked appends are applied on top of what is stored; with catch_up they
    # also return what the caller missed (bulk appends do not need it).
    locked: bool = False
    catch_up: bool = False


@dataclass(slots=True)
class PreparedAppend(AppendRequest):
    """An append request as the service prepared it, with what it needs to finish it.

    One object per append, handed to the store as the request: the store
    reads only the request's fields, the service keeps the delta to apply to
    the live session (temp keys apart) and the event's original delta, to
    give back if the append fails (None when nothing was taken from it).
    """

    delta: dict[str, Any] = field(default_factory=dict)
    original_delta: Mapping[str, Any] | None = None
    temp: dict[str, Any] = field(default_factory=dict)

    @property
    def request(self) -> AppendRequest:
        """Return the request to hand a store: this object itself."""
        return self


@dataclass(slots=True)
class AppendResult:
    """What an append did: the session's new marker and time, or that it was a repeat."""

    marker: str | None
    last_update_time: float = 0.0
    duplicate: bool = False
    # For a locked append (catch_up): the stored events the caller's copy
    # lacks, before its own; when its history cannot be known (built by hand
    # without a known last event, or read before the session was deleted and
    # created again), all stored events, and ``replace_events`` is set.
    missed_events: list[bytes] = field(default_factory=list)
    replace_events: bool = False
    # The position in the session of the first missed event: the result holds
    # the stored events from there up to this append's, which is the last.
    # Finishes of concurrent locked appends may arrive in any order; positions
    # let each one add only what the live session does not hold yet.
    first_missed: int = 0
    # For a locked append: the stored maps after it. Other sessions write the
    # app and user maps too, so replaying missed events would not suffice.
    stored_state: LoadedSession | None = None


class PartialBatch(Exception):
    """A batch stopped at request ``applied`` by ``error``: the ones before it still go.

    Raised inside a batch's transaction, which it aborts; the store then
    appends again the requests before ``applied`` alone.
    """

    def __init__(self, applied: int, error: Exception) -> None:
        super().__init__(applied, error)
        self.applied = applied
        self.error = error


# What a store that appends a batch one request at a time gathers: a result
# per request appended, and what stopped it (see ``result_of_batch``).
BatchOutcome = tuple[list[AppendResult], "BaseException | None"]


@dataclass(slots=True)
class AppendBatch:
    """Many locked appends without catch-up, one list per field: a bulk append's request.

    Event ``n`` goes to the session ``keys[owners[n]]`` (app, user, session
    id); its id, time, stored record and packed state items are the ``n``-th
    entries of the other lists. A batch of a thousand events is a few lists
    rather than a thousand request objects, and a store reads each list once.
    Each event is applied on top of what is stored, as ``AppendRequest`` with
    ``locked`` and without ``catch_up``.
    """

    keys: list[tuple[str, str, str]] = field(default_factory=list)
    owners: list[int] = field(default_factory=list)
    event_ids: list[str] = field(default_factory=list)
    timestamps: list[float] = field(default_factory=list)
    events: list[bytes] = field(default_factory=list)
    app_items: list[Items] = field(default_factory=list)
    user_items: list[Items] = field(default_factory=list)
    session_items: list[Items] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.events)

    def request(self, index: int) -> AppendRequest:
        """Return event ``index`` as a request of its own."""
        app_name, user_id, session_id = self.keys[self.owners[index]]
        return AppendRequest(
            app_name,
            user_id,
            session_id,
            self.event_ids[index],
            self.timestamps[index],
            self.events[index],
            self.app_items[index],
            self.user_items[index],
            self.session_items[index],
            locked=True,
        )

    def requests(self) -> list[AppendRequest]:
        """Return every event as a request of its own, in order."""
        return [self.request(index) for index in range(len(self.events))]

    def head(self, count: int) -> AppendBatch:
        """Return the batch of the first ``count`` events (the same sessions)."""
        return AppendBatch(
            self.keys,
            self.owners[:count],
            self.event_ids[:count],
            self.timestamps[:count],
            self.events[:count],
            self.app_items[:count],
            self.user_items[:count],
            self.session_items[:count],
        )

    @classmethod
    def of(cls, requests: Iterable[AppendRequest]) -> AppendBatch:
        """Return the batch of requests' events, each applied as a locked append."""
        batch = cls()
        keys: dict[tuple[str, str, str], int] = {}
        for request in requests:
            ids = (request.app_name, request.user_id, request.session_id)
            batch.owners.append(keys.setdefault(ids, len(keys)))
            batch.event_ids.append(request.event_id)
            batch.timestamps.append(request.timestamp)
            batch.events.append(request.event)
            batch.app_items.append(request.app_items)
            batch.user_items.append(request.user_items)
            batch.session_items.append(request.session_items)
        batch.keys = list(keys)
        return batch


@dataclass(slots=True)
class BatchResult:
    """What a batch append did, without an object per event.

    The first ``applied`` events were handled: appended, or skipped as
    repeats (their positions in ``repeats``). ``markers[k]`` and ``times[k]``
    are the marker and last update time of the session ``keys[k]`` after its
    last event appended, None and 0.0 where none was. ``error`` stopped the
    batch at event ``applied`` (None when all were handled): the events
    before it stay appended, those after it were not tried.
    """

    applied: int
    repeats: list[int]
    markers: list[str | None]
    times: list[float]
    error: BaseException | None = None


def result_of_batch(
    batch: AppendBatch, results: list[AppendResult], error: BaseException | None
) -> BatchResult:
    """Return the batch result of the per-event results of a batch's first events."""
    markers: list[str | None] = [None] * len(batch.keys)
    times = [0.0] * len(batch.keys)
    repeats: list[int] = []
    owners = batch.owners
    for index, result in enumerate(results):
        if result.duplicate or result.marker is None:
            repeats.append(index)
            continue
        markers[owners[index]] = result.marker
        times[owners[index]] = result.last_update_time
    return BatchResult(len(results), repeats, markers, times, error)


def marker_position(marker: str | None) -> tuple[int, int] | None:
    """Return (session number, event count) of a revision marker; None for another form.

    Session numbers only grow, so a later revision of a session (or a session
    created later under the same id) compares greater. The count is of events
    ever appended; a marker after a truncation carries a third part (events
    removed), which does not change the position.
    """
    if marker is None:
        return None
    number, _, rest = marker.partition(":")
    count, _, removed = rest.partition(":")
    if not number.isdigit() or not count.isdigit() or not (removed.isdigit() or not removed):
        return None
    return int(number), int(count)


def check_append(
    record: SessionRecord | None,
    request: AppendRequest,
    stored_event: bytes | None,
    stored_seq: int | None = None,
) -> AppendResult | None:
    """Decide whether an append may proceed: None when it may, else its answer (a repeat).

    A repeat (same id, equal content) is checked before staleness so that a
    caller retrying an append whose answer it lost gets the same answer:
    ``stored_seq`` is the stored event's position, which tells whether it is
    the one right after the caller's copy (see ``repeat_result``).
    """
    if record is None:
        raise SessionNotFoundError(
            f"session {request.session_id!r} of user {request.user_id!r} in app "
            f"{request.app_name!r} does not exist"
        )
    if stored_event is not None:
        if events_equal(stored_event, request.event):
            return repeat_result(request, record.number, stored_seq)
        raise DuplicateEventError(
            f"session {request.session_id!r} already stores an event with id "
            f"{request.event_id!r} and other content"
        )
    if request.locked:
        return None
    if request.marker is not None:
        if request.marker != record.marker:
            raise StaleSessionError(
                f"session {request.session_id!r} was read at revision {request.marker}, "
                f"the store is at {record.marker}: read it again before appending"
            )
    elif (
        record.last_update_time > request.caller_update_time
        and record.last_event_id != request.caller_last_event_id
    ):
        raise StaleSessionError(
            f"session {request.session_id!r} has events this copy does not have: "
            "read it again before appending"
        )
    return None


def repeat_result(request: AppendRequest, number: int, seq: int | None) -> AppendResult:
    """Return the answer to a repeat: the event the session ``number`` stores at ``seq``.

    When the stored event is the one right after the caller's copy (its
    marker names this session and counts ``seq`` events), the caller lost
    the reply of the append that stored it: the answer is the one that
    append had, so that the live session is brought up to date with it
    (the marker right after the event, in the form of the copy's marker,
    and the event's time). A repeat further back, or from a copy without a
    marker (built by hand: where it stands is not known), is returned
    untouched and changes nothing.
    """
    marker = request.marker
    if seq is None or marker is None or marker_position(marker) != (number, seq):
        return AppendResult(None, duplicate=True)
    # A marker read after a truncation carries its removed count: kept as it was.
    removed = marker.split(":")[2:]
    return AppendResult(":".join([str(number), str(seq + 1), *removed]), request.timestamp)


def catch_up_repeat(
    result: AppendResult, seq: int, stored_state: Callable[[], LoadedSession]
) -> AppendResult:
    """Fill a locked append's answer to a retry (``repeat_result``) as ``catch_up`` does.

    The caller's copy holds every event before the retried one (its marker
    says so): nothing is missed, and the event is the result's first, at ``seq``.
    """
    return catch_up(result, seq, lambda start: [], stored_state)


def events_seen(
    request: AppendRequest, record: SessionRecord, seq_of: Callable[[str], int | None]
) -> int | None:
    """Return how many events the caller's copy has seen, or None when unknown.

    The count is of events ever appended, the position the next one takes:
    a truncation does not change it, so ``events(count)`` in ``catch_up``
    still reads exactly what the copy lacks. A marker of this session says
    it (a marker of an earlier session under the same id says nothing); a
    hand-built copy has seen up to its last event,
    looked up by id with ``seq_of``, or none at all when it has no events.
    """
    if request.marker is not None:
        position = marker_position(request.marker)
        if position is None or position[0] != record.number:
            return None
        return position[1]
    if request.caller_last_event_id is None:
        return 0
    seq = seq_of(request.caller_last_event_id)
    return None if seq is None else seq + 1


def catch_up(
    result: AppendResult,
    known: int | None,
    events: Callable[[int], list[bytes]],
    stored_state: Callable[[], LoadedSession],
) -> AppendResult:
    """Fill a locked append's result with what the caller's copy lacks.

    ``events(start)`` reads the stored events from position ``start`` up to,
    not including, the one just appended (positions a truncation removed are
    skipped); ``stored_state()`` the maps after it.
    """
    if known is None:
        result.missed_events, result.replace_events = events(0), True
    else:
        result.missed_events, result.first_missed = events(known), known
    result.stored_state = stored_state()
    return result


def list_position(record: SessionRecord) -> ListPosition:
    """Return where a session stands in a listing (see ``Store.list_page``)."""
    return record.last_update_time, record.user_id, record.session_id


# list_position as a C-level getter: sorting a whole listing calls it once per session.
_position = attrgetter("last_update_time", "user_id", "session_id")


def page_records(
    records: Iterable[SessionRecord], limit: int | None, after: ListPosition | None
) -> tuple[list[SessionRecord], bool]:
    """Return the page ``Store.list_page`` describes, from records in any order.

    A store without a list index pages this way: the cost follows the
    records given, not the page.
    """
    records = list(records) if after is None else [r for r in records if _position(r) > after]
    if limit is None or len(records) <= limit:
        return sorted(records, key=_position), False
    return heapq.nsmallest(limit, records, key=_position), True


class Store(Protocol):
    """The storage a ``SyncSessionService`` runs on; ``aio`` is its async face."""

    @property
    def aio(self) -> AsyncStore:
        """Return the async face of this store, the one ``SessionService`` awaits."""
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


class InlineAsyncStore:
    """The async face of a store whose calls answer inline (memory, LMDB).

    Reads return at once; writes hand back the store's ``Completion``, which
    suspends the event loop only while a background thread commits it, and
    may be awaited again after a cancellation. Nothing is wrapped in a task.
    """

    __slots__ = ("_store",)

    def __init__(self, store: Store) -> None:
        self._store = store

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
        """Store a new session; see ``Store.create_session``."""
        return self._store.create_session(
            app_name, user_id, session_id, create_time, app_items, user_items, session_items
        )

    async def load_session(
        self,
        app_name: str,
        user_id: str,
        session_id: str,
        num_recent_events: int | None,
        after_timestamp: float | None,
    ) -> LoadedSession | None:
        """Read a session; see ``Store.load_session``."""
        return self._store.load_session(
            app_name, user_id, session_id, num_recent_events, after_timestamp
        )

    async def read_events(
        self, app_name: str, user_id: str, session_id: str, start: int, limit: int
    ) -> EventPage | None:
        """Return a page of a session's events; see ``Store.read_events``."""
        return self._store.read_events(app_name, user_id, session_id, start, limit)

    async def list_sessions(self, app_name: str, user_id: str | None) -> list[SessionRecord]:
        """Return session records; see ``Store.list_sessions``."""
        return self._store.list_sessions(app_name, user_id)

    async def list_page(
        self,
        app_name: str,
        user_id: str | None,
        limit: int | None,
        after: ListPosition | None,
    ) -> tuple[list[SessionRecord], bool]:
        """Return one page of sessions; see ``Store.list_page``."""
        return self._store.list_page(app_name, user_id, limit, after)

    def delete_session(self, app_name: str, user_id: str, session_id: str) -> Completion[None]:
        """Remove a session; see ``Store.delete_session``."""
        return self._store.delete_session(app_name, user_id, session_id)

    def append(self, request: AppendRequest) -> Completion[AppendResult]:
        """Append one event; see ``Store.append``."""
        return self._store.append(request)

    def append_many(self, batch: AppendBatch) -> Completion[BatchResult]:
        """Append a batch; see ``Store.append_many``."""
        return self._store.append_many(batch)

    async def read_app_state(self, app_name: str) -> dict[str, Any]:
        """Return the app map; see ``Store.read_app_state``."""
        return self._store.read_app_state(app_name)

    async def read_user_state(self, app_name: str, user_id: str) -> dict[str, Any]:
        """Return the user map; see ``Store.read_user_state``."""
        return self._store.read_user_state(app_name, user_id)

    def flush(self) -> Completion[None]:
        """Make every acknowledged write durable."""
        return self._store.flush()

    async def close(self) -> None:
        """Flush and release the store."""
        self._store.close()

    # Retention works in several transactions, some of which may wait for the
    # disk: it runs in a worker thread so the event loop goes on meanwhile.

    async def truncate_events(
        self,
        app_name: str,
        user_id: str,
        session_id: str,
        before: float | None,
        keep_last: int | None,
    ) -> int:
        """Remove old events of a session; see ``Store.truncate_events``."""
        store = self._store
        return await asyncio.to_thread(
            lambda: store.truncate_events(app_name, user_id, session_id, before, keep_last).result()
        )

    async def expire_sessions(self, app_name: str | None, idle_before: float) -> int:
        """Delete idle sessions; see ``Store.expire_sessions``."""
        store = self._store
        return await asyncio.to_thread(
            lambda: store.expire_sessions(app_name, idle_before).result()
        )

    async def delete_user(self, app_name: str, user_id: str) -> int:
        """Delete a user's sessions and state; see ``Store.delete_user``."""
        store = self._store
        return await asyncio.to_thread(lambda: store.delete_user(app_name, user_id).result())

    async def delete_app(self, app_name: str) -> int:
        """Delete everything of an app; see ``Store.delete_app``."""
        store = self._store
        return await asyncio.to_thread(lambda: store.delete_app(app_name).result())

    async def list_apps(self) -> list[str]:
        """Return the apps of the store; see ``Store.list_apps``."""
        return self._store.list_apps()

    async def list_users(self, app_name: str) -> list[str]:
        """Return the users of an app; see ``Store.list_users``."""
        return self._store.list_users(app_name)

    async def restore_session(self, copy: SessionCopy) -> bool:
        """Write a whole session as given; see ``Store.restore_session``."""
        return await self._store.restore_session(copy)

    async def write_app_state(self, app_name: str, items: Items) -> None:
        """Set keys of the app map; see ``Store.write_app_state``."""
        await self._store.write_app_state(app_name, items)

    async def write_user_state(self, app_name: str, user_id: str, items: Items) -> None:
        """Set keys of a user map; see ``Store.write_user_state``."""
        await self._store.write_user_state(app_name, user_id, items)


# -- retention and copies ------------------------------------------------
#
# Retention removes data for good: ``truncate_events`` events of one session
# (its state stays), ``expire_sessions``, ``delete_user`` and ``delete_app``
# whole sessions. A store that other processes write to works in batches
# bounded in count and in time (``BATCH_SECONDS``), so that no append waits
# long for its write lock, and checks each session again inside the batch
# that removes it.
#
# A ``SessionCopy`` is a whole session as ``restore_session`` writes it and
# ``dump`` moves it between stores: exact times, packed state, and every
# event with its id, timestamp and record.

# How long one retention batch may work inside a write transaction.
BATCH_SECONDS = 0.01
# How many sessions (or events) one retention batch removes at most.
BATCH_SESSIONS = 256
BATCH_EVENTS = 500


@dataclass(frozen=True, slots=True)
class EventCopy:
    """An event as stored: its id, its timestamp and its record bytes."""

    event_id: str
    timestamp: float
    record: bytes


@dataclass(slots=True)
class SessionCopy:
    """A whole session as given to ``restore_session``; state items are packed values."""

    app_name: str
    user_id: str
    session_id: str
    create_time: float
    last_update_time: float
    session_items: Items = field(default_factory=list)
    events: list[EventCopy] = field(default_factory=list)

    @classmethod
    def of_record(
        cls, record: SessionRecord, session_items: Items, events: list[EventCopy]
    ) -> SessionCopy:
        """Return the copy of a stored session: its record's ids and times, its state, events."""
        return cls(
            record.app_name,
            record.user_id,
            record.session_id,
            record.create_time,
            record.last_update_time,
            session_items,
            events,
        )


def event_copy(record: bytes, timestamp: float | None = None) -> EventCopy:
    """Return the copy of a stored event record; its id (and time) are read from it.

    Every event record is a map with ``id`` and ``timestamp``, whichever
    model wrote it; a store that keeps the timestamp beside the record
    passes it, so it is returned exactly as appended.
    """
    from ..codec import decode_event

    fields = decode_event(record)
    stamp = float(fields["timestamp"]) if timestamp is None else timestamp
    return EventCopy(str(fields["id"]), stamp, record)


def copies_equal(stored: SessionCopy, given: SessionCopy) -> bool:
    """Tell whether a stored session holds exactly what a copy describes.

    Values compare in type too (1, 1.0 and True differ), maps in any key order.
    """
    from ..codec import pack_event, unpack

    if (
        stored.create_time != given.create_time
        or stored.last_update_time != given.last_update_time
        or len(stored.events) != len(given.events)
    ):
        return False
    state = {key: unpack(value) for key, value in stored.session_items}
    other = {key: unpack(value) for key, value in given.session_items}
    # events_equal compares two packed maps deeply and strictly: reuse it.
    if not events_equal(pack_event(state), pack_event(other)):
        return False
    return all(
        a.event_id == b.event_id and a.timestamp == b.timestamp and events_equal(a.record, b.record)
        for a, b in zip(stored.events, given.events, strict=True)
    )


def check_copy(copy: SessionCopy) -> None:
    """Refuse a copy whose events repeat an id; say which."""
    seen: set[str] = set()
    for event in copy.events:
        if event.event_id in seen:
            raise ValueError(
                f"session {copy.session_id!r} copy holds event id {event.event_id!r} twice"
            )
        seen.add(event.event_id)


class Expirer:
    """A background thread that expires idle sessions of a store with ``session_ttl``.

    It runs once at start, then every ``min(60, max(1, ttl / 2))`` seconds (at
    most once a second) until ``stop``; an error of one pass is logged and
    the next pass runs all the same.
    """

    def __init__(self, store: Store, ttl: float) -> None:
        self.ttl = ttl
        self.interval = min(60.0, max(1.0, ttl / 2))
        self.passes = 0
        self._store = store
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sessionscope-expirer", daemon=True)

    @property
    def stopping(self) -> bool:
        """Tell whether the store is closing: a pass stops between batches."""
        return self._stop.is_set()

    def start(self) -> None:
        """Start the thread; its first pass runs at once."""
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and wait for it (a pass in progress ends after its batch)."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        import time

        while not self._stop.is_set():
            try:
                expired = self._store.expire_sessions(None, time.time() - self.ttl).result()
            except Exception:  # nobody else would hear of it; the next pass retries
                _log.exception("expiring idle sessions of %r failed", self._store)
            else:
                _log.debug("expired %d idle sessions of %r", expired, self._store)
            self.passes += 1
            self._stop.wait(self.interval)


def finite_float(value: object) -> float | None:
    """Return an int or float (not a bool) as a finite float; None when it is none.

    An int beyond the float range is None too, where ``float()`` and
    ``math.isfinite`` would raise OverflowError: every option and argument
    that takes seconds or a timestamp checks through here.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def check_ttl(session_ttl: float | None) -> float | None:
    """Return a valid ``session_ttl`` (positive seconds, or None)."""
    if session_ttl is None:
        return None
    if isinstance(session_ttl, bool) or not isinstance(session_ttl, (int, float)):
        raise ValueError(f"session_ttl must be a number of seconds, not {session_ttl!r}")
    seconds = finite_float(session_ttl)
    if seconds is None or not seconds > 0:
        raise ValueError(f"session_ttl must be a positive finite number, not {session_ttl!r}")
    return seconds
