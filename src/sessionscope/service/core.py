"""The service's rules, with no I/O: ``ServiceCore`` and the models it reads and builds.

``ServiceCore`` checks a call's arguments and prepares what a store is
handed, and builds the caller's answer from what the store returned; the
facades (``facade``) call the store. What kind of session and event objects
it reads and builds is told by a ``Model``: ``NativeModel`` for this
package's dataclasses, another for google-adk's pydantic models, so the
adapter shares every rule.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from .. import codec
from ..core import TEMP_PREFIX, apply_delta, compiled_or_twin, merge_scopes, partition_checked
from ..model import (
    Event,
    EventActions,
    ListSessionsResponse,
    Session,
    check_filters,
    new_event_id,
    new_session_id,
)
from ..stores.records import (
    AppendResult,
    BatchResult,
    ListPosition,
    LoadedSession,
    PreparedAppend,
    SessionRecord,
)
from ..stores.rules import finite_float, marker_position
from .paging import check_page, cursor_position, page_of

if TYPE_CHECKING:
    # The source is the type source; its compiled build has the same signatures.
    from . import _append as _hot
else:
    _hot = compiled_or_twin("sessionscope.service._append")

# Every append runs these: they live with the compiled append steps.
MAX_ID_BYTES = _hot.MAX_ID_BYTES
check_app_name = _hot.check_app_name
check_id = _hot.check_id
check_session_id = _hot.check_session_id
timestamp_of = _hot.timestamp_of
event_to_record = _hot.event_to_record

__all__ = [
    "MAX_ID_BYTES",
    "FieldModel",
    "Model",
    "NativeModel",
    "PreparedCreate",
    "ServiceCore",
    "check_app_name",
    "check_id",
    "check_session_id",
    "event_from_record",
    "event_to_record",
    "read_filters",
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
    recent = getattr(config, "num_recent_events", _MISSING)
    after = getattr(config, "after_timestamp", _MISSING)
    if recent is _MISSING and after is _MISSING:
        # A dict or a string would otherwise read as no filter at all.
        raise TypeError(
            "config must be a GetSessionConfig (with num_recent_events and after_timestamp), "
            f"not {type(config).__name__}"
        )
    return check_filters(
        None if recent is _MISSING else recent, None if after is _MISSING else after
    )


# What getattr gives for an attribute a config lacks (None is a value it may hold).
_MISSING = object()


class Model(Protocol[S, E]):
    """How the service reads and builds the caller's session and event objects.

    Plain fields (ids, timestamp, partial, delta, state, events, last update
    time) are read by ADK's field names in the compiled append path (see
    ``FieldModel``); what differs between models is asked here.
    """

    # The classes of the session and event objects the service takes: an
    # append names them when it is handed something else.
    session_type: type[S]
    event_type: type[E]

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

    session_type = Session
    event_type = Event

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
    if actions is None:
        return Event(**record)
    # Given to the event as it is made, which would otherwise make an empty one first.
    return Event(**record, actions=EventActions(**actions))


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


def not_of_kind(name: str, obj: object, kind: type) -> TypeError:
    """Return the error for an argument ``name`` that is not a ``kind``, naming both classes."""
    return TypeError(
        f"{name} must be a {kind.__module__}.{kind.__qualname__}, not a "
        f"{type(obj).__module__}.{type(obj).__qualname__}"
    )


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
        app = check_app_name(app_name)
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
        app = check_app_name(app_name)
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
            check_app_name(app_name),
            check_id(user_id, "user_id"),
            check_session_id(session_id),
        )

    @staticmethod
    def check_user(app_name: object, user_id: object) -> tuple[str, str]:
        """Return the checked (app_name, user_id) that name a user."""
        return check_app_name(app_name), check_id(user_id, "user_id")

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
        app = None if app_name is None else check_app_name(app_name)
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
        try:
            return _hot.prepare_append(self.model, session, event, locked)
        except AttributeError:
            # The compiled path reads fields by name: a field missing means
            # an object of another kind (a google-adk Event given to the
            # native service, say), which is named here.
            self._check_pair(session, event, "")
            raise

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

    def prepare_chain(self, session: S, events: list[E]) -> list[PreparedAppend | None]:
        """Check and pack appends of ``events`` to one session, each as ``prepare_append`` does.

        All against the session as it is now: the store checks each one
        after the first against what those before it left
        (``ChainStore.append_chain``). None stands for a partial event. If
        one fails its checks, the events prepared before it get their deltas
        back and its error is raised.
        """
        prepared: list[PreparedAppend | None] = []
        try:
            for event in events:
                prepared.append(self.prepare_append(session, event, False))
        except BaseException:
            self.abandon_chain(events, prepared)
            raise
        return prepared

    def abandon_chain(self, events: list[E], prepared: list[PreparedAppend | None]) -> None:
        """Give the events of a chain that was not stored their deltas back."""
        for event, append in zip(events, prepared, strict=False):
            if append is not None:
                self.abandon_append(event, append)

    def finish_chain(
        self,
        session: S,
        events: list[E],
        prepared: list[PreparedAppend | None],
        results: list[AppendResult],
    ) -> list[E]:
        """Bring the live session up to date with a stored chain, event by event, in order."""
        answers = iter(results)
        for event, append in zip(events, prepared, strict=True):
            if append is not None:
                self.finish_append(session, event, append, next(answers))
        return events

    def slice_many(self, appends: list[tuple[S, E]]) -> _hot.SlicedBatch:
        """Return a bulk append to be checked and packed a slice at a time, as the store asks.

        Nothing is checked yet: each slice is, when the store first asks for
        it (see ``_append.SlicedBatch``). A check's error comes out of the
        store's call: ``check_pairs`` then names a pair of another kind.
        """
        return _hot.SlicedBatch(self.model, appends)

    def check_pairs(self, appends: list[Any]) -> None:
        """Raise a TypeError naming the first of ``appends`` not a pair of the service's kind.

        As ``prepare_append`` does for one append: called once checking a
        batch failed, so that its error names the pair rather than a field
        read from an object of another kind.
        """
        for index, pair in enumerate(appends):
            if not (isinstance(pair, tuple) and len(pair) == 2):
                what = (
                    f"a tuple of {len(pair)}"
                    if isinstance(pair, tuple)
                    else f"a {type(pair).__name__}"
                )
                raise TypeError(
                    f"appends[{index}] must be a (session, event) pair, not {what}"
                ) from None
            self._check_pair(*pair, f"appends[{index}]: ")

    def _check_pair(self, session: object, event: object, where: str) -> None:
        """Raise a TypeError naming ``session`` or ``event`` if it is not of the service's kind.

        Also the event's actions and state delta, which an object of the
        right kind can still have had replaced (``event.actions = None``).
        """
        for name, obj, kind in (
            ("session", session, self.model.session_type),
            ("event", event, self.model.event_type),
        ):
            if not isinstance(obj, kind):
                raise not_of_kind(where + name, obj, kind) from None
        actions = getattr(event, "actions", None)
        if actions is None or not hasattr(actions, "state_delta"):
            raise TypeError(
                f"{where}event.actions must be the event's actions object, "
                f"not {type(actions).__name__}"
            ) from None
        delta = actions.state_delta
        if delta is not None and not isinstance(delta, Mapping):
            raise TypeError(
                f"{where}event.actions.state_delta must be a mapping, not {type(delta).__name__}"
            ) from None

    def abandon_many(self, prepared: _hot.PreparedBatch, start: int) -> None:
        """Give their deltas back to the events of a batch from ``start`` on."""
        _hot.abandon_many(self.model, prepared, start)

    def finish_many(self, prepared: _hot.PreparedBatch, result: BatchResult) -> list[E]:
        """Apply what the store took to the live sessions; the rest get their deltas back."""
        finished: list[E] = _hot.finish_many(self.model, prepared, result)
        return finished

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
