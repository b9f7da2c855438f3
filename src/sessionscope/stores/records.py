"""What stores and the service hand each other: records, requests, results, copies.

Plain data with the few helpers that build one from another; the rules an
append must obey are in ``rules``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..codec import events_equal
from ..core import revision_marker

__all__ = [
    "ENCRYPTION_MARKER_APP",
    "AppendBatch",
    "AppendRequest",
    "AppendResult",
    "BatchOutcome",
    "BatchResult",
    "BatchSlices",
    "EventCopy",
    "EventPage",
    "Items",
    "ListPosition",
    "LoadedSession",
    "PartialBatch",
    "PreparedAppend",
    "SameEvent",
    "SealState",
    "SessionCopy",
    "SessionRecord",
    "copies_equal",
    "event_copy",
    "result_of_batch",
]

# The app whose app state marks a store's data as encrypted (sessionscope.crypto
# writes it; opening and dumps look for it): NUL first, so no listing shows it
# and it sorts before every other app.
ENCRYPTION_MARKER_APP = "\x00sessionscope:encryption"
# Packed state items: (key without prefix, packed value).
Items = list[tuple[str, bytes]]
# Where a session stands in a listing: (last_update_time, user_id, session_id).
ListPosition = tuple[float, str, str]
# A session's record and a page of its stored events, each with its position.
EventPage = tuple["SessionRecord", list[tuple[int, bytes]]]


@dataclass(slots=True)
class SessionRecord:
    """What a store keeps about a session besides its state and events.

    ``number`` is store-internal and never reused, so a session deleted and
    created again under the same id has a new number, and markers read from
    the old one can never match.

    Every field holds a str, an int, a float, a bool or None, which refer to
    nothing else, so a record can never be part of a reference cycle: the
    compiled LMDB listing leaves the records it reads out of the cyclic
    collector (``layout.records_under``). A field that could hold a container
    would end that (``tests/test_listing.py`` checks the fields' types).
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
        return revision_marker(self.number, self.event_count, self.removed_count)

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
        fields = [
            self.app_name,
            self.user_id,
            self.session_id,
            self.number,
            self.create_time,
            self.last_update_time,
            self.event_count,
            self.last_event_id,
        ]
        # One list, grown in place: every append writes its session's record.
        if self.removed_count or self.time_indexed:
            fields.append(self.removed_count)
            if self.time_indexed:
                fields.append(True)
        return fields

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


# Tells whether ``stored``, the record a session holds under a request's event
# id, holds the request's event, where the bytes differ. A store that seals
# records (sessionscope.crypto) seals a retried event to other bytes: it hands
# one down with its requests, and the rules of a repeat ask it.
SameEvent = Callable[["AppendRequest", bytes], bool]

# Seals the state items a batch leaves in one map (kind "a", "u" or "s": the
# app's, the user's or the session's map; ``key`` a session that writes it),
# returning the items as stored. A store that seals (sessionscope.crypto) may
# hand a batch's items down unsealed with one of these (``AppendBatch``), so
# that a value set again later in the batch is never sealed.
SealState = Callable[[str, tuple[str, str, str], Items], Items]


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
    # Tells whether a stored record with other bytes holds this request's
    # event (see ``SameEvent``); None: content equal as ``events_equal`` says.
    same_event: SameEvent | None = None


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
    # Handed to each event's request (see ``AppendRequest.same_event``).
    same_event: SameEvent | None = None
    # None: the items are stored as they are. Set (only on a slice asked with
    # ``defer_sealing``): the items are plaintext, and the store passes the
    # items it writes to each map through it, once, just before writing them.
    seal_state: SealState | None = None

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
            same_event=self.same_event,
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
            self.same_event,
            self.seal_state,
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


class BatchSlices(Protocol):
    """A bulk append handed to ``Store.append_slices``: its slices, packed as the store asks.

    ``len()`` is the number of slices. ``slice(n)`` returns slice ``n`` as an
    ``AppendBatch`` of its own (its keys only the sessions it appends to);
    the first time each is asked, in order, its events are checked, and a
    bad one raises there (so a store that appends each slice as it gets it
    must then abort what it wrote of the batch, which the caller will
    refuse whole). Asked again, a slice is packed anew, the same bytes: a
    store may run its transaction again. Nothing keeps a slice's bytes once
    the store drops them. ``join`` returns the batch's result of the
    results of its first slices, in order (the last may be a slice's
    ``head``). ``whole()`` is the batch in one ``AppendBatch``, for a store
    that appends no faster in slices (``append_joined``); a store calls
    either ``slice`` or ``whole``, never both.

    ``slice(n, defer_sealing=True)`` is for a store that writes each state
    key a batch sets once, with its last value: it lets a slice come with
    its state items unsealed and ``AppendBatch.seal_state`` set, which the
    store must then call on the items of every map it writes. A batch that
    seals nothing ignores it.
    """

    def __len__(self) -> int: ...

    def slice(self, number: int, defer_sealing: bool = False) -> AppendBatch: ...

    def whole(self) -> AppendBatch: ...

    def join(self, results: list[BatchResult]) -> BatchResult: ...


# A ``SessionCopy`` is a whole session as ``restore_session`` writes it and
# ``dump`` moves it between stores: exact times, packed state, and every
# event with its id, timestamp and record.


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
