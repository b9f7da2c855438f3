"""The service's append steps: check and pack an append, then update the live session.

Written once, as annotated Python in Cython's pure-Python mode: ``setup.py``
compiles this file a second time as ``sessionscope.service._append_c``, and this
module stays importable as it is, the twin that runs where nothing was
compiled (``sessionscope.core.compiled_or_twin`` picks one). ``core.py``
holds the rules' home, ``ServiceCore``, which calls these for every append;
the id and timestamp checks and the native event encoding live here because
every append runs them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .._speedups import _no_cython as cython
    from ..model import Event
    from ..stores.records import AppendResult
else:
    try:
        import cython
    except ImportError:  # a pure install runs without Cython
        from .._speedups import _no_cython as cython

from .. import codec
from ..core import (
    APP_PREFIX,
    TEMP_PREFIX,
    USER_PREFIX,
    apply_delta,
    check_storable,
    pack_event,
    pack_plain,
    partition_checked,
)
from ..errors import StateValueError
from ..stores.records import ENCRYPTION_MARKER_APP, AppendBatch, BatchResult, PreparedAppend

__all__ = [
    "MAX_ID_BYTES",
    "SLICE_EVENTS",
    "PreparedBatch",
    "SlicedBatch",
    "abandon_many",
    "check_app_name",
    "check_id",
    "check_session_id",
    "encode_event",
    "event_to_record",
    "finish_append",
    "finish_many",
    "prepare_append",
    "timestamp_of",
]

MAX_ID_BYTES = 4096
# A str of this many characters is at most MAX_ID_BYTES of UTF-8.
_SHORT_ID = MAX_ID_BYTES // 4
_INF = float("inf")
_EVENT_PREFIX = bytes([codec.EVENT_FORMAT])
_APP_LEN = len(APP_PREFIX)
_USER_LEN = len(USER_PREFIX)

_EVENT_FIELDS = (
    "author",
    "content",
    "invocation_id",
    "partial",
    "branch",
    "turn_complete",
    "interrupted",
    "error_code",
    "error_message",
    "custom_metadata",
    "long_running_tool_ids",
)
_ACTION_FIELDS = ("transfer_to_agent", "escalate", "skip_summarization")


def check_id(value: object, name: str) -> str:
    """Return a valid id, or raise a ValueError that names the argument."""
    if type(value) is str:
        text: str = value
        if 0 < len(text) <= _SHORT_ID and text.isascii():
            return text
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a str, not {type(value).__name__}")
    if not value:
        raise ValueError(f"{name} must not be empty")
    try:
        size = len(value.encode())
    except UnicodeEncodeError:
        raise ValueError(f"{name} is not encodable as UTF-8 (lone surrogate)") from None
    if size > MAX_ID_BYTES:
        raise ValueError(f"{name} is {size} bytes of UTF-8; the limit is {MAX_ID_BYTES}")
    return value


def check_app_name(value: object, name: str = "app_name") -> str:
    """Return a valid app name, or raise a ValueError that names the argument.

    An app name is an id, but not the one a store keeps its encryption marker
    under: through the service that app could be deleted or forged.
    """
    app: str = check_id(value, name)
    if app == ENCRYPTION_MARKER_APP:
        raise ValueError(f"{name} {app!r} is reserved for the store's encryption marker")
    return app


def check_session_id(value: object) -> str:
    """Return a valid session id with surrounding whitespace stripped."""
    if not isinstance(value, str):
        raise ValueError(f"session_id must be a str, not {type(value).__name__}")
    return check_id(value.strip(), "session_id")


def timestamp_of(stamp: object) -> float:
    """Return an event timestamp as a float; a TypeError or ValueError says what is wrong."""
    if type(stamp) is float:
        exact: float = stamp
        return exact
    if isinstance(stamp, bool) or not isinstance(stamp, (int, float)):
        raise StateValueError(f"event.timestamp: {type(stamp).__name__} is not a number")
    try:
        return float(stamp)
    except OverflowError:
        raise ValueError(f"event.timestamp {stamp!r} is out of the float range") from None


def event_to_record(event: Event) -> dict[str, Any]:
    """Return the storable map of an event, without the fields left at their default.

    Every value but the state delta (checked with the delta itself) is checked
    here, so an unstorable one is named by its path, e.g. ``event.content[...]``.
    """
    record: dict[str, Any] = _record(event)
    return record


def encode_event(event: Event) -> bytes:
    """Return the stored bytes of an event: the format byte, then its set fields packed.

    A record of plain values is checked and packed in one walk, straight
    from the event's fields (``pack_event``); any other goes through
    ``event_to_record``'s checks, whose errors name the bad value, and
    msgpack. The bytes are the same.
    """
    stored: bytes = _encode(event)
    return stored


@cython.cfunc
def _encode(event: Any) -> bytes:
    """Return ``encode_event(event)``: a C call from this module's compiled build."""
    stored = pack_event(event, _EVENT_FIELDS, _ACTION_FIELDS, _EVENT_PREFIX)
    if stored is None:
        packed: bytes = codec.packer().pack(_record(event))
        stored = _EVENT_PREFIX + packed
    return stored


@cython.cfunc
def _record(event: Any) -> dict[str, Any]:
    """Return the record of ``event_to_record``, its values checked."""
    record: dict[str, Any] = {"id": event.id, "timestamp": event.timestamp}
    for name in _EVENT_FIELDS:
        value = getattr(event, name)
        if value is None:
            continue
        if type(value) is str:
            text: str = value
            if not text:
                continue
            # ASCII text is storable as it is: no call to check it.
            if text.isascii():
                record[name] = text
                continue
        elif value == "":
            continue
        check_storable(value, "event." + name)
        record[name] = value
    actions = event.actions
    packed: dict[str, Any] = {}
    if actions.state_delta:
        delta = actions.state_delta
        # A mapping of another class (a read-only proxy, say) is stored as the map it holds.
        packed["state_delta"] = delta if type(delta) is dict else dict(delta)
    if actions.artifact_delta:
        check_storable(actions.artifact_delta, "event.actions.artifact_delta")
        packed["artifact_delta"] = actions.artifact_delta
    for name in _ACTION_FIELDS:
        value = getattr(actions, name)
        if value is not None:
            check_storable(value, "event.actions." + name)
            packed[name] = value
    if actions.extra:
        check_storable(actions.extra, "event.actions.extra")
        packed["extra"] = actions.extra
    if packed:
        record["actions"] = packed
    if event.extra:
        check_storable(event.extra, "event.extra")
        record["extra"] = event.extra
    return record


@cython.cfunc
def _items(pack: Any, delta: dict[str, Any]) -> list[tuple[str, bytes]]:
    """Return the (key, packed value) entries of a checked map."""
    return [(key, pack(value)) for key, value in delta.items()]


def prepare_append(model: Any, session: Any, event: Any, locked: bool) -> PreparedAppend | None:
    """Check and pack an append; None for a partial event, which is not stored.

    Nothing is changed, on the event or the session, until the store has
    taken the append: ``finish_append`` does that; the service's
    ``abandon_append`` undoes the one change made to the event here.
    Sessions and events are read by ADK's field names (``FieldModel``'s),
    as a batch reads them (see ``SlicedBatch``): a model call per field
    would cost a Python call each.
    """
    if event.partial:
        return None
    prepared: PreparedAppend = _prepare_event(
        model, codec.packer().pack, event, _session_parts(model, session), locked
    )
    return prepared


def finish_append(
    model: Any, session: Any, event: Any, prepared: PreparedAppend, result: AppendResult
) -> bool:
    """Bring the live session up to date with a plain append; False for a locked one.

    A locked append's result carries the stored maps and what the caller
    missed: the service merges it under its lock (False tells it to).
    Repeats and appends the store skipped change nothing.
    """
    marker = result.marker
    if result.duplicate or marker is None:
        return True
    if result.stored_state is not None:
        return False
    # Read by field name, as prepare_append reads them.
    state = session.state
    if prepared.delta:
        apply_delta(state, prepared.delta)
    if prepared.temp:
        apply_delta(state, prepared.temp)
    session.events.append(event)
    model.update_session(session, result.last_update_time, marker)
    return True


# -- bulk appends ------------------------------------------------------------
#
# A batch prepares and finishes its appends in one call each, for sessions and
# events with ADK's field names (``FieldModel``'s): the fields are read here
# rather than through one model call per field, and each session's ids are
# checked once. What the store takes is an ``AppendBatch``, one list per field,
# and what it answers a ``BatchResult`` (each session's marker once): no object
# per event on either side.


@cython.cclass
class PreparedBatch:
    """A batch of appends checked and packed: the store's request, and what finishes it.

    ``batch`` is what the store takes (an ``AppendBatch``, one list per
    field); the other lists are the service's, by the batch's positions: the
    event, the delta to apply to the live session (temp keys apart), its
    temp keys, and the event's original delta to give back if the append
    does not happen (None when nothing was taken from it). ``lives`` holds
    the live session of each of the batch's keys.
    """

    # Read by the service too: Python attributes of the compiled class.
    batch = cython.declare(object, visibility="readonly")
    lives = cython.declare(list, visibility="readonly")
    events = cython.declare(list, visibility="readonly")
    deltas = cython.declare(list, visibility="readonly")
    temps = cython.declare(list, visibility="readonly")
    originals = cython.declare(list, visibility="readonly")
    # The batch's own lists, filled through these C fields of a compiled
    # build rather than an attribute read of the batch per event.
    keys: list[tuple[str, str, str]]
    owners: list[int]
    event_ids: list[str]
    timestamps: list[float]
    records: list[bytes]
    app_items: list[Any]
    user_items: list[Any]
    session_items: list[Any]

    def __init__(self) -> None:
        self.keys = []
        self.owners = []
        self.event_ids = []
        self.timestamps = []
        self.records = []
        self.app_items = []
        self.user_items = []
        self.session_items = []
        self.batch = AppendBatch(
            self.keys,
            self.owners,
            self.event_ids,
            self.timestamps,
            self.records,
            self.app_items,
            self.user_items,
            self.session_items,
        )
        self.lives = []
        self.events = []
        self.deltas = []
        self.temps = []
        self.originals = []


@cython.cfunc
def _encoder(model: Any) -> Any:
    """Return the model's event encoding, or None for this module's own.

    None is called without a Python call (``_encode``).
    """
    encode: Any = model.encode_event
    if encode is encode_event:
        return None
    return encode


@cython.cfunc
def _prepare_run(
    model: Any,
    encode: Any,
    appends: Any,
    prepared: PreparedBatch,
    positions: dict[int, tuple[Any, int]],
) -> cython.int:
    """Check and pack a run of a batch's appends onto the ends of ``prepared``'s lists.

    ``positions`` holds, per live session (by id), its key's position in
    the batch's keys: a batch prepared in runs hands each run the same map.
    A raise leaves what was prepared before it in the lists (see
    ``abandon_many``).
    """
    pack = codec.packer().pack
    # The last event's session and its key's position: runs of one session's
    # events skip the look-up.
    last: Any = None
    owner: int = 0
    for session, event in appends:
        if event.partial:
            continue
        if session is last:
            prepared.owners.append(owner)
            _prepare_into(model, pack, encode, event, prepared)
            continue
        known = positions.get(id(session))
        # The dict holds each session it saw, so no other object takes its id meanwhile.
        if known is None or known[0] is not session:
            app: str = check_app_name(session.app_name, "session.app_name")
            user: str = check_id(session.user_id, "session.user_id")
            sid: str = check_session_id(session.id)
            known = (session, len(prepared.keys))
            positions[id(session)] = known
            prepared.keys.append((app, user, sid))
            prepared.lives.append(session)
        last = session
        owner = known[1]
        prepared.owners.append(owner)
        _prepare_into(model, pack, encode, event, prepared)
    return 0


# Appends per slice of a sliced batch (``SlicedBatch``). A batch of 1,000
# events of the agent mix packs to about 1 MB, more than a core's L2 cache:
# a slice's packed bytes live only from its packing to its write. On the mix
# in batches of 1,000 (LMDB, deferred), alternating with batches packed
# whole, slices of 125 ran faster than slices of 250: 1.15x to 1.37x against
# 1.11x to 1.25x by wall time, 1.18x to 1.21x against 1.13x to 1.15x by CPU
# time (docs/performance.md).
SLICE_EVENTS = 125


@cython.cclass
class SlicedBatch:
    """A batch of appends checked and packed a slice at a time, as the store asks.

    What ``Store.append_slices`` takes. ``slice(n)`` returns the
    ``AppendBatch`` of the caller's appends ``n * SLICE_EVENTS`` to
    ``(n + 1) * SLICE_EVENTS`` (partial events left out), with only the
    sessions it appends to as its keys. Asked the first time, in order, a
    slice is checked and packed, each append as ``prepare_append`` checks
    one (ids given, temp keys taken out of the deltas, timestamps made
    floats), and a bad event raises
    there, every time it is asked; asked again (a store that runs its
    transaction again) it is packed again from the events as they are now,
    the same bytes, with nothing changed. Nothing keeps a slice's bytes: the
    store drops each once written. ``whole()`` is the batch in one
    ``AppendBatch``, for a store that does not append in slices.
    ``join`` turns the slices' results into the batch's, and ``prepared``
    is what the service finishes or abandons (its packed lists aside).
    """

    prepared = cython.declare(PreparedBatch, visibility="readonly")
    model: Any
    encode: Any
    appends: list[Any]
    positions: dict[int, tuple[Any, int]]
    # Per slice packed so far: its first event's position in the batch,
    # and its keys' positions in the batch's keys.
    starts: list[int]
    key_maps: list[list[int]]
    failure: Any
    whole_batch: Any

    def __init__(self, model: Any, appends: list[Any]) -> None:
        self.prepared = PreparedBatch()
        self.model = model
        self.encode = _encoder(model)
        self.appends = appends
        self.positions = {}
        self.starts = []
        self.key_maps = []
        self.failure = None
        self.whole_batch = None

    def __len__(self) -> int:
        return (len(self.appends) + SLICE_EVENTS - 1) // SLICE_EVENTS

    def slice(self, number: int, defer_sealing: bool = False) -> AppendBatch:
        """Return slice ``number``'s batch, checked and packed (see the class).

        ``defer_sealing`` changes nothing: these items are stored as they are.
        """
        prepared: PreparedBatch = self.prepared
        if self.whole_batch is not None:
            raise RuntimeError("a batch handed whole is not sliced")
        packed: cython.Py_ssize_t = len(self.starts)
        if number > packed or (number == packed and self.failure is not None):
            if self.failure is not None:
                raise self.failure
            raise IndexError(f"slice {number} asked before slice {packed}")
        # Only this slice's packed bytes: the batch's lists of them start anew.
        prepared.records = []
        prepared.app_items = []
        prepared.user_items = []
        prepared.session_items = []
        start: cython.Py_ssize_t
        if number == packed:
            start = len(prepared.events)
            try:
                _prepare_run(
                    self.model,
                    self.encode,
                    self.appends[number * SLICE_EVENTS : (number + 1) * SLICE_EVENTS],
                    prepared,
                    self.positions,
                )
            except BaseException as error:
                self.failure = error
                raise
            self.starts.append(start)
            self.key_maps.append(_slice_keys(prepared.owners, start, len(prepared.events)))
        else:
            start = self.starts[number]
            _repack(self, start, self._end(number))
        return self._batch(number, start)

    @cython.cfunc
    def _end(self, number: cython.Py_ssize_t) -> cython.Py_ssize_t:
        if number + 1 < len(self.starts):
            end: cython.Py_ssize_t = self.starts[number + 1]
            return end
        return len(self.prepared.events)

    @cython.cfunc
    def _batch(self, number: cython.Py_ssize_t, start: cython.Py_ssize_t) -> AppendBatch:
        """Return the batch of slice ``number`` from the packed lists."""
        prepared: PreparedBatch = self.prepared
        end: cython.Py_ssize_t = self._end(number)
        key_map: list[int] = self.key_maps[number]
        keys: list[tuple[str, str, str]] = prepared.keys
        local: dict[int, int] = {owner: index for index, owner in enumerate(key_map)}
        owners: list[int] = prepared.owners
        return AppendBatch(
            [keys[owner] for owner in key_map],
            [local[owners[index]] for index in range(start, end)],
            prepared.event_ids[start:end],
            prepared.timestamps[start:end],
            prepared.records,
            prepared.app_items,
            prepared.user_items,
            prepared.session_items,
        )

    def whole(self) -> AppendBatch:
        """Return the whole batch, checked and packed, in one ``AppendBatch``."""
        if self.whole_batch is None:
            if self.failure is not None:
                raise self.failure
            if self.starts:
                raise RuntimeError("a sliced batch is not handed whole")
            prepared: PreparedBatch = self.prepared
            try:
                _prepare_run(self.model, self.encode, self.appends, prepared, self.positions)
            except BaseException as error:
                self.failure = error
                raise
            self.whole_batch = prepared.batch
        batch: AppendBatch = self.whole_batch
        return batch

    def join(self, results: list[BatchResult]) -> BatchResult:
        """Return the batch's result of the results of its first slices, in order."""
        size: cython.Py_ssize_t = len(self.prepared.keys)
        markers: list[str | None] = [None] * size
        times: list[float] = [0.0] * size
        repeats: list[int] = []
        applied: cython.Py_ssize_t = 0
        number: cython.Py_ssize_t
        index: cython.Py_ssize_t
        for number in range(len(results)):
            result: BatchResult = results[number]
            start: cython.Py_ssize_t = self.starts[number]
            applied += result.applied
            for index in result.repeats:
                repeats.append(start + index)
            key_map: list[int] = self.key_maps[number]
            slice_markers: list[str | None] = result.markers
            for index in range(len(slice_markers)):
                marker = slice_markers[index]
                if marker is not None:
                    markers[key_map[index]] = marker
                    times[key_map[index]] = result.times[index]
        return BatchResult(applied, repeats, markers, times)


@cython.cfunc
def _slice_keys(owners: list[int], start: cython.Py_ssize_t, end: cython.Py_ssize_t) -> list[int]:
    """Return the positions in the batch's keys of the keys events ``start`` to ``end`` use."""
    seen: set[int] = set()
    key_map: list[int] = []
    index: cython.Py_ssize_t
    for index in range(start, end):
        owner = owners[index]
        if owner not in seen:
            seen.add(owner)
            key_map.append(owner)
    return key_map


@cython.cfunc
def _repack(sliced: SlicedBatch, start: cython.Py_ssize_t, end: cython.Py_ssize_t) -> cython.int:
    """Pack again the events ``start`` to ``end`` of a sliced batch, changing nothing.

    Their first packing gave them their ids and float timestamps and took
    the temp keys out of their deltas: packed from what they hold now, the
    records and state items are the same bytes.
    """
    prepared: PreparedBatch = sliced.prepared
    pack = codec.packer().pack
    encode: Any = sliced.encode
    events: list[Any] = prepared.events
    deltas: list[Any] = prepared.deltas
    index: cython.Py_ssize_t
    for index in range(start, end):
        event = events[index]
        prepared.records.append(_encode(event) if encode is None else encode(event))
        delta = deltas[index]
        if delta:
            app_items, user_items, session_items, _ = _scoped_items(pack, delta)
        else:
            app_items, user_items, session_items = [], [], []
        prepared.app_items.append(app_items)
        prepared.user_items.append(user_items)
        prepared.session_items.append(session_items)
    return 0


@cython.cfunc
def _prepare_into(
    model: Any, pack: Any, encode: Any, event: Any, prepared: PreparedBatch
) -> cython.int:
    """Check and pack one event of a batch, onto the ends of the batch's lists.

    As ``_prepare_event`` for a locked append without catch-up: the delta is
    applied to the live session before the batch returns, so it is not
    copied when nothing was taken from it. The batch's owner of the event
    is already added; a raise leaves the other lists one shorter.
    """
    given = event.id
    if not given:
        given = event.id = model.new_event_id()
    event_id: str
    # The common id, short ASCII text, as check_id passes it, without the call.
    if type(given) is str and len(given) <= _SHORT_ID and given.isascii():
        event_id = given
    else:
        event_id = check_id(given, "event.id")
    stamp = event.timestamp
    timestamp: float = stamp if type(stamp) is float else timestamp_of(stamp)
    if timestamp != timestamp or timestamp == _INF or timestamp == -_INF:
        raise ValueError(f"event.timestamp must be a finite number, not {timestamp!r}")
    if type(stamp) is not float:
        # Stored as the float it is read back as, so that an equal retry is a repeat.
        event.timestamp = timestamp
        stamp = timestamp
    actions = event.actions
    original: Any = actions.state_delta if actions else None
    app_items: list[tuple[str, bytes]]
    user_items: list[tuple[str, bytes]]
    session_items: list[tuple[str, bytes]]
    delta: Any
    temp: Any = None
    if original:
        app_items, user_items, session_items, temp = _scoped_items(pack, original)
        if temp:
            delta = _without(original, temp)
            actions.state_delta = delta
        elif type(original) is dict:
            delta = original
            temp = None
        else:
            delta = dict(original)
            temp = None
    else:
        app_items, user_items, session_items = [], [], []
        delta = None
    try:
        record: bytes = _encode(event) if encode is None else encode(event)
    except BaseException:
        if temp:
            actions.state_delta = dict(original)
        raise
    prepared.events.append(event)
    prepared.deltas.append(delta)
    prepared.temps.append(temp)
    prepared.originals.append(original if temp else None)
    prepared.event_ids.append(event_id)
    # The event's own float where it is one, rather than a new one of the same value.
    prepared.timestamps.append(stamp if type(stamp) is float else timestamp)
    prepared.records.append(record)
    prepared.app_items.append(app_items)
    prepared.user_items.append(user_items)
    prepared.session_items.append(session_items)
    return 0


def abandon_many(model: Any, prepared: PreparedBatch, start: int) -> None:
    """Give the events of a batch from position ``start`` their deltas back, temp keys included."""
    originals: list[Any] = prepared.originals
    events: list[Any] = prepared.events
    index: cython.Py_ssize_t
    for index in range(start, len(originals)):
        original = originals[index]
        if original is not None:
            model.set_state_delta(events[index], dict(original))


@cython.cfunc
def _session_parts(model: Any, session: Any) -> tuple[Any, ...]:
    """Return (session, app, user, session id, marker, last update time, last event id)."""
    app: str = check_app_name(session.app_name, "session.app_name")
    user: str = check_id(session.user_id, "session.user_id")
    sid: str = check_session_id(session.id)
    events = session.events
    return (
        session,
        app,
        user,
        sid,
        model.marker(session),
        session.last_update_time,
        events[-1].id if events else None,
    )


@cython.cfunc
def _prepare_event(
    model: Any,
    pack: Any,
    event: Any,
    shared: tuple[Any, ...],
    locked: cython.bint,
) -> Any:
    """Return the prepared append of one event (see ``prepare_append``)."""
    if not event.id:
        event.id = model.new_event_id()
    event_id: str = check_id(event.id, "event.id")
    timestamp: float = timestamp_of(event.timestamp)
    if timestamp != timestamp or timestamp == _INF or timestamp == -_INF:
        raise ValueError(f"event.timestamp must be a finite number, not {timestamp!r}")
    if type(event.timestamp) is not float:
        # Stored as the float it is read back as, so that an equal retry is a repeat.
        event.timestamp = timestamp
    actions = event.actions
    original: Any = actions.state_delta if actions else None
    app_items: list[tuple[str, bytes]] = []
    user_items: list[tuple[str, bytes]] = []
    session_items: list[tuple[str, bytes]] = []
    delta: Any
    temp: dict[str, Any]
    if original:
        app_items, user_items, session_items, routed_temp = _scoped_items(pack, original)
        temp = routed_temp if routed_temp is not None else {}
        # A copy either way: a single append applies it once the store
        # answers, and the caller's map may have changed by then.
        delta = _without(original, temp) if temp else dict(original)
    else:
        temp = {}
        delta = {}
    if temp:
        actions.state_delta = delta
    try:
        record: bytes = model.encode_event(event)
    except BaseException:
        if temp:
            actions.state_delta = dict(original)
        raise
    prepared = PreparedAppend(
        shared[1],
        shared[2],
        shared[3],
        event_id,
        timestamp,
        record,
        app_items,
        user_items,
        session_items,
        shared[4],
        shared[5],
        shared[6],
        locked,
        locked,
        None,
        delta,
        original if temp else None,
        temp,
    )
    return prepared


@cython.cfunc
def _scoped_items(pack: Any, delta: Any) -> tuple[Any, Any, Any, Any]:
    """Return a delta's packed (app, user, session) items and its temp map (None or empty: none).

    The plain route first; any other delta is partitioned with the checks
    that name what is wrong.
    """
    routed: tuple[Any, Any, Any, Any] | None = _route_plain(delta)
    if routed is not None:
        return routed
    app_delta, user_delta, session_delta, temp = partition_checked(delta)
    return (
        _items(pack, app_delta) if app_delta else [],
        _items(pack, user_delta) if user_delta else [],
        _items(pack, session_delta) if session_delta else [],
        temp,
    )


@cython.cfunc
def _without(delta: Any, temp: dict[str, Any]) -> dict[str, Any]:
    """Return a copy of a delta without its temp keys."""
    kept = dict(delta)
    for key in temp:
        del kept[key]
    return kept


@cython.cfunc
def _route_plain(delta: Any) -> Any:
    """Return a delta's packed (app, user, session) items and temp map (None: no temp key), or None.

    The common delta, ASCII str keys and plain values (see ``pack_plain``,
    which checks and packs each value in one walk), goes straight to packed
    items, in the delta's order, without the maps ``partition_checked``
    builds. Any other key or value gives None: the caller partitions the
    delta with its checks, which name what is wrong, as for a single append.
    """
    app_items: list[tuple[str, bytes]] = []
    user_items: list[tuple[str, bytes]] = []
    session_items: list[tuple[str, bytes]] = []
    # Made at the first temp key: most deltas have none.
    temp: Any = None
    for key, value in delta.items():
        if type(key) is not str:
            return None
        name: str = key
        if name.startswith(TEMP_PREFIX):
            if temp is None:
                temp = {}
            temp[name] = value  # temp values are never stored: anything goes
            continue
        if not name.isascii():
            return None
        packed = pack_plain(value)
        if packed is None:
            return None
        if name.startswith(APP_PREFIX):
            app_items.append((_bare(name, _APP_LEN), packed))
        elif name.startswith(USER_PREFIX):
            user_items.append((_bare(name, _USER_LEN), packed))
        else:
            session_items.append((name, packed))
    return app_items, user_items, session_items, temp


# App and user keys without their prefix, by prefixed key: the same few keys
# recur append after append, and a kept str carries its hash for the store's
# lookups. Bounded: past the limit a key is cut anew each time.
_BARE_KEYS: dict[str, str] = {}
_BARE_KEYS_LIMIT = 4096


@cython.cfunc
def _bare(name: str, prefix_length: cython.Py_ssize_t) -> str:
    """Return an app or user key without its prefix."""
    bare: Any = _BARE_KEYS.get(name)
    if bare is None:
        bare = name[prefix_length:]
        if len(_BARE_KEYS) < _BARE_KEYS_LIMIT:
            _BARE_KEYS[name] = bare
    cut: str = bare
    return cut


# Indexes into the batch's lists are in range by construction: no checks.
@cython.boundscheck(False)
@cython.wraparound(False)
def finish_many(model: Any, prepared: PreparedBatch, result: BatchResult) -> list[Any]:
    """Bring the live sessions up to date with what the store did; return the events it handled.

    Only the events the store handled (``result.applied``, from the first)
    are finished; those after them get their deltas back. Each session's
    time and marker are set once, from its last append the store took.
    """
    owners: list[int] = prepared.owners
    lives: list[Any] = prepared.lives
    events: list[Any] = prepared.events
    deltas: list[Any] = prepared.deltas
    temps: list[Any] = prepared.temps
    applied: cython.Py_ssize_t = result.applied
    repeats: list[int] = result.repeats
    skip: cython.Py_ssize_t = repeats[0] if repeats else applied
    next_repeat: cython.Py_ssize_t = 1
    index: cython.Py_ssize_t
    for index in range(applied):
        if index == skip:
            skip = repeats[next_repeat] if next_repeat < len(repeats) else applied
            next_repeat += 1
            continue
        session = lives[owners[index]]
        event = events[index]
        # The keys of both maps were checked (all str) when the batch was prepared.
        delta = deltas[index]
        temp = temps[index]
        if delta or temp:
            state = session.state
            if delta:
                state.update(delta)
            if temp:
                state.update(temp)
        session.events.append(event)
    markers: list[Any] = result.markers
    times: list[float] = result.times
    for index in range(len(markers)):
        marker = markers[index]
        if marker is not None:
            model.update_session(lives[index], times[index], marker)
    abandon_many(model, prepared, applied)
    return events[:applied]
