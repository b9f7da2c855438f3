"""The rules every store enforces alike, decided here once.

An append's checks (not found, duplicate event, stale copy) and the answer to
a repeat or a locked append's catch-up; the order of a listing; the checks of
a session copy and of seconds given as options; the bounds of a retention
batch.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from operator import attrgetter
from typing import Any

from ..codec import events_equal
from ..errors import (
    DuplicateEventError,
    EncryptedStoreError,
    SessionNotFoundError,
    StaleSessionError,
)
from .records import (
    AppendRequest,
    AppendResult,
    ListPosition,
    LoadedSession,
    SessionCopy,
    SessionRecord,
)

__all__ = [
    "BATCH_EVENTS",
    "BATCH_SECONDS",
    "BATCH_SESSIONS",
    "append_chain",
    "catch_up",
    "catch_up_repeat",
    "check_append",
    "check_copy",
    "check_ttl",
    "events_seen",
    "finite_float",
    "list_position",
    "marker_position",
    "newest_moved",
    "page_records",
    "refuse_encrypted",
    "repeat_result",
    "session_not_found",
]


def session_not_found(app_name: str, user_id: str, session_id: str) -> SessionNotFoundError:
    """Return the error of a session that does not exist (every store raises this one)."""
    return SessionNotFoundError(
        f"session {session_id!r} of user {user_id!r} in app {app_name!r} does not exist"
    )


def newest_moved(session_id: str, expected_id: str) -> StaleSessionError:
    """Return the error of a conditional pop whose session's newest event is another one."""
    return StaleSessionError(
        f"the newest event of session {session_id!r} is no longer {expected_id!r} "
        "(or the session has none): nothing was removed; read it again before popping"
    )


# -- retention -------------------------------------------------------------
#
# Retention removes data for good: ``truncate_events`` events of one session
# (its state stays), ``expire_sessions``, ``delete_user`` and ``delete_app``
# whole sessions. A store that other processes write to works in batches
# bounded in count and in time (``BATCH_SECONDS``), so that no append waits
# long for its write lock, and checks each session again inside the batch
# that removes it.

# How long one retention batch may work inside a write transaction.
BATCH_SECONDS = 0.01
# How many sessions (or events) one retention batch removes at most.
BATCH_SESSIONS = 256
BATCH_EVENTS = 500


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
    marker: str | None = None,
) -> AppendResult | None:
    """Decide whether an append may proceed: None when it may, else its answer (a repeat).

    A repeat (same id, equal content: ``events_equal``, or the request's
    ``same_event`` where a store seals records) is checked before staleness so that a
    caller retrying an append whose answer it lost gets the same answer:
    ``stored_seq`` is the stored event's position, which tells whether it is
    the one right after the caller's copy (see ``repeat_result``). ``marker``
    is ``record.marker``, when the caller made it already.
    """
    if record is None:
        raise session_not_found(request.app_name, request.user_id, request.session_id)
    if stored_event is not None:
        same = request.same_event
        if events_equal(stored_event, request.event) or (
            same is not None and same(request, stored_event)
        ):
            return repeat_result(request, record.number, stored_seq)
        raise DuplicateEventError(
            f"session {request.session_id!r} already stores an event with id "
            f"{request.event_id!r} and other content"
        )
    if request.locked:
        return None
    if request.marker is not None:
        if marker is None:
            marker = record.marker
        if request.marker != marker:
            raise StaleSessionError(
                f"session {request.session_id!r} was read at revision {request.marker}, "
                f"the store is at {marker}: read it again before appending"
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


def append_chain(
    requests: list[AppendRequest], append_one: Callable[[AppendRequest], AppendResult]
) -> list[AppendResult]:
    """Append a chain of events to one session in order with ``append_one``; return each answer.

    The service prepares every request of a chain against the session as
    its caller holds it (``ServiceCore.prepare_chain``); each one after the
    first is checked here against what those before it left, as the same
    appends made one by one, each prepared once the one before had landed,
    would be: behind an event stored, at the marker its answer gave; behind
    one not stored (a repeat answered as a duplicate), where the one before
    it stood. The store runs the whole chain in one transaction (or under
    one lock), so that an error anywhere leaves nothing of it stored.
    """
    if not requests:
        return []
    key = (requests[0].app_name, requests[0].user_id, requests[0].session_id)
    if any((r.app_name, r.user_id, r.session_id) != key for r in requests):
        raise ValueError("a chain of appends goes to one session")
    results: list[AppendResult] = []
    before: AppendRequest | None = None
    for request in requests:
        if before is not None:
            answer = results[-1]
            if answer.duplicate or answer.marker is None:
                # Nothing stored: the session stands where it stood before it.
                request = replace(
                    request,
                    marker=before.marker,
                    caller_update_time=before.caller_update_time,
                    caller_last_event_id=before.caller_last_event_id,
                )
            else:
                request = replace(
                    request,
                    marker=answer.marker,
                    caller_update_time=answer.last_update_time,
                    caller_last_event_id=before.event_id,
                )
        results.append(append_one(request))
        before = request
    return results


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


def check_copy(copy: SessionCopy) -> None:
    """Refuse a copy whose events repeat an id; say which."""
    seen: set[str] = set()
    for event in copy.events:
        if event.event_id in seen:
            raise ValueError(
                f"session {copy.session_id!r} copy holds event id {event.event_id!r} twice"
            )
        seen.add(event.event_id)


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


def refuse_encrypted(marker: Mapping[str, Any], where: str) -> None:
    """Refuse a store written encrypted (its marker, the reserved app's state, is set).

    Its values are ciphertext under keys kept elsewhere: a caller without
    them could read nothing, and what it wrote would land there in plaintext.
    ``where`` names the store in the message (a path, or a URI without its
    password).
    """
    if marker:
        raise EncryptedStoreError(
            f"{where} is encrypted: it cannot be read or written without its key",
            hint="give its key-encryption key and key store: key_file= or key_env=, "
            "and keys= (see docs/encryption.md)",
        )
