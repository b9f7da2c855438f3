"""Plans of appends: one event, a batch (the guard chain and the tally), a batch with reads.

Every append is one ``FCALL`` of the append function (``functions.lua``)
that checks and writes atomically. A batch goes as calls of about
``_CHUNK`` requests, pipelined and chained by a guard key, so that what is
stored is always a prefix of the batch, which ``_Tally`` sums up.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from typing import Any, TypeAlias

from ...codec import decode_values
from ...errors import StoreError
from ..records import (
    AppendBatch,
    AppendRequest,
    AppendResult,
    BatchResult,
    Items,
    LoadedSession,
    SessionRecord,
)
from ..rules import catch_up_repeat, check_append, marker_position, repeat_result
from .common import _FN, Command, Plan, _number_text, _pack_items, _pairs, _record
from .keys import _remember
from .runners import _RELOADED, _Tolerant
from .sessions import SessionPlans

_FN_APPEND = _FN + "append"
_HAS_MARKER, _HAS_LAST_ID, _LOCKED, _CATCH_UP = 1, 2, 4, 8
# Flags saying which optional parts of a request's arguments follow (see
# functions.lua); item counts under _COUNT_LIMIT ride in the flags,
# from _COUNTED up, sparing two arguments.
_CALLER, _ITEMS, _APP, _COUNTED = 16, 32, 64, 128
_COUNT_LIMIT = 65536
# The flags of a request with neither part, as text: the common bulk request.
_PLAIN_LOCKED = str(_LOCKED)
# Requests per FCALL in a bulk append (runs of one session or several).
_CHUNK = 1000
# How many times in a row a batch's calls are sent again after the runner
# loaded the function library that had gone, before the batch gives up.
_RELOADS = 5
# A read placed in a batch: (how many of the batch's requests come before it,
# app, user, session id, num_recent_events, after_timestamp).
BatchRead = tuple[int, str, str, str, "int | None", "float | None"]
# What an append call carries in order: runs of one session's requests (a
# single append's, or a span of a batch's events), and reads.
Run: TypeAlias = "list[AppendRequest] | _Span | BatchRead"


def _request_args(request: AppendRequest, args: list[Any]) -> None:
    """Add the FCALL arguments of one append request to ``args`` (see functions.lua).

    Event id, time, event and flags always; the caller's copy (marker, time,
    last event id) only where a check or a catch-up reads it, and the state
    items only where there are some: a locked bulk request without state
    travels as four arguments, since every argument costs the client its
    packing and the server a Lua string.
    """
    session_items, user_items, app_items = (
        request.session_items,
        request.user_items,
        request.app_items,
    )
    if request.locked and not request.catch_up and not (session_items or user_items or app_items):
        args += (request.event_id, _number_text(request.timestamp), request.event, _PLAIN_LOCKED)
        return
    caller = not request.locked or request.catch_up
    flags = (
        (_HAS_MARKER if request.marker is not None else 0)
        | (_HAS_LAST_ID if request.caller_last_event_id is not None else 0)
        | (_LOCKED if request.locked else 0)
        | (_CATCH_UP if request.catch_up else 0)
        | (_CALLER if caller else 0)
    )
    head = (request.event_id, _number_text(request.timestamp), request.event)
    if not caller:
        _items_args(head, flags, session_items, user_items, app_items, args)
        return
    items = bool(session_items or user_items or app_items)
    caller_time = _number_text(request.caller_update_time)
    args += (*head, flags | _ITEMS if items else flags, request.marker or "", caller_time,
             request.caller_last_event_id or "")  # fmt: skip
    if items:
        _items_args(None, 0, session_items, user_items, app_items, args)


def _items_args(
    head: tuple[Any, ...] | None,
    flags: int,
    session_items: Items,
    user_items: Items,
    app_items: Items,
    args: list[Any],
) -> None:
    """Add a request's state items to ``args``, after its head and flags when given.

    With ``head`` the item counts ride in the flags where they fit; without
    it (the flags, with _ITEMS, went before the caller's fields) the counts
    go explicitly.
    """
    sessions, users = len(session_items), len(user_items)
    blob = _pack_items(app_items) if app_items else None
    if head is not None and sessions < _COUNT_LIMIT and users < _COUNT_LIMIT:
        flags |= (sessions + _COUNT_LIMIT * users) * _COUNTED
        if blob is None:
            args += (*head, flags)
        else:
            args += (*head, flags | _APP, blob)
    else:
        if head is not None:
            args += (*head, flags | _ITEMS)
        args += (sessions, users, blob or b"")
    for key, value in session_items:
        args += (key, value)
    for key, value in user_items:
        args += (key, value)


class AppendPlans(SessionPlans):
    """The plans of appends."""

    def _append_keys(self, app_name: str, user_id: str, session_id: str) -> tuple[bytes, ...]:
        """Return the append function's keys of one session's run (see functions.lua)."""
        ident = (app_name, user_id, session_id)
        keys = self._session_keys.get(ident)
        if keys is None:
            keys = (
                *self.keys.session(app_name, user_id, session_id),
                *self.keys.user(app_name, user_id),
                *self.topology.app_keys(app_name),
            )
            _remember(self._session_keys, ident, keys, 4096)
        return keys

    def _call(
        self, runs: list[Run], guard: bytes, place: int | None, batch: AppendBatch | None = None
    ) -> Command:
        """Return the FCALL appending runs of requests, each run to one session.

        Each session's keys and id travel once per call, however many runs
        of it the call has (a batch interleaving sessions has many). A read
        placed among the runs (a ``BatchRead``) is answered in its place. A
        ``_Span`` is a run of ``batch``'s events, packed from its columns.
        ``place`` is the call's place among the calls under ``guard`` (see
        ``_send_calls``); None for an append outside a batch.
        """
        keys: list[Any] = []
        sids: list[str] = []
        numbers: dict[tuple[str, str, str], int] = {}
        args: list[Any] = []
        for run in runs:
            if type(run) is _Span:
                assert batch is not None
                ident = batch.keys[run.owner]
            elif type(run) is tuple:
                ident = (run[1], run[2], run[3])
            else:
                assert isinstance(run, list)
                ident = (run[0].app_name, run[0].user_id, run[0].session_id)
            number = numbers.get(ident)
            if number is None:
                number = numbers[ident] = len(sids) + 1
                keys += self._append_keys(*ident)
                sids.append(ident[2])
            if type(run) is _Span:
                assert batch is not None
                args += (number, run.stop - run.start)
                _span_args(batch, run.start, run.stop, args)
            elif type(run) is tuple:
                last_n, after = run[4], run[5]
                args += (number, -1, "" if last_n is None else last_n,
                         "" if after is None else _number_text(after))  # fmt: skip
            else:
                assert isinstance(run, list)
                args += (number, len(run))
                for request in run:
                    _request_args(request, args)
        return ("FCALL", _FN_APPEND, 1 + len(keys), guard, *keys,
                "" if place is None else place, self.settings.ttl, len(sids),
                len(keys) // len(sids), len(runs), *sids, *args)  # fmt: skip

    def _result(self, request: AppendRequest, reply: Any, around: tuple[str, str]) -> AppendResult:
        """Decode one request's result; raise its refusal as ``check_append`` words it.

        An accepted append without catch-up comes back as the session's event
        count alone: its marker is ``around[0] + count + around[1]`` (see
        ``_marker_parts``) and its time the one the client sent.
        """
        if type(reply) is int:
            return AppendResult(around[0] + str(reply) + around[1], float(request.timestamp))
        status = reply[0]
        if status == b"dup":
            # The stored event's position (None for one of this call): a
            # retry after a lost reply answers as the append did.
            seq = reply[1] if len(reply) > 1 else None
            if seq is None or not around[0]:
                return AppendResult(None, duplicate=True)
            return repeat_result(request, int(around[0][:-1]), int(seq))
        if status == b"no":
            record = _record(reply[1]) if reply[1] else None
            seq = reply[3] if len(reply) > 3 else None
            repeat = check_append(record, request, reply[2], None if seq is None else int(seq))
            if repeat is not None:
                # Stored with other bytes but equal content: a repeat.
                return repeat
            raise StoreError(
                "the server refused an append the client would accept",
                hint="the function library and the client disagree: report this as a bug",
            )
        marker, count, stamp = reply[1].decode(), int(reply[2]), float(reply[3])
        number = int(marker.partition(":")[0])
        result = AppendResult(marker, stamp)
        if request.catch_up:
            result.replace_events = bool(reply[4])
            result.missed_events = list(reply[5])
            result.first_missed = 0 if result.replace_events else int(reply[10])
            result.stored_state = LoadedSession(
                SessionRecord(
                    request.app_name,
                    request.user_id,
                    request.session_id,
                    number,
                    float(reply[9]),
                    stamp,
                    count,
                    request.event_id,
                    int(marker.split(":")[2]) if marker.count(":") == 2 else 0,
                ),
                decode_values(_pairs(reply[6])),
                decode_values(_pairs(reply[8] or [])),
                decode_values(_pairs(reply[7])),
                [],
            )
        return result

    def append(self, request: AppendRequest) -> Plan[AppendResult]:
        guard = self.keys.guard(request.app_name, request.user_id, "")
        replies = yield [
            self._call([[request]], guard, None),
            *self._app_upkeep(request.app_name),
            *self._waits(),
        ]
        ((run,), pending) = replies[0]
        results, *marker = run
        if self.settings.wait:
            self._check_wait(replies[-1])
        if pending:
            yield from self.topology.settle(request.app_name, request.user_id, pending)
        result = self._result(request, results[0], _marker_parts(marker))
        if request.catch_up and not result.duplicate and result.stored_state is None:
            # A locked retry after a lost reply (see repeat_result): the maps as stored now.
            loaded = yield from self.load(
                request.app_name, request.user_id, request.session_id, 0, None
            )
            if loaded is None:
                return AppendResult(None, duplicate=True)
            position = marker_position(result.marker)
            assert position is not None
            return catch_up_repeat(result, position[1] - 1, lambda: loaded)
        if result.stored_state is not None:
            result.stored_state.app_state = yield from self.topology.stored_app_map(
                request.app_name, result.stored_state.app_state
            )
        return result

    def append_many(
        self, batch: AppendBatch, start: int = 0, stop: int | None = None
    ) -> Plan[_Tally]:
        """Append a batch's events start..stop in runs of sessions, ``_CHUNK`` per FCALL, pipelined.

        The calls of a group are chained (see ``_send_calls``): a call the
        server refused or never ran holds back those after it, and the
        tally holds exactly what was stored, a prefix of the batch.
        """
        stop = len(batch) if stop is None else stop
        tally = _Tally(batch, start)
        while start < stop:
            group = self.topology.slot_group(batch, start, stop)
            calls = _calls(_spans(batch, start, start + group))
            upkeep = self._batch_upkeep(batch, start, start + group)
            first = batch.keys[batch.owners[start]]
            if (yield from self._send_calls(calls, first, tally, upkeep)):
                if tally.error is not None:
                    return tally
                # A repeat with other bytes but equal content stopped the
                # server; go on after it.
                start = tally.applied
                continue
            start += group
        return tally

    def append_many_reading(
        self, batch: AppendBatch, reads: list[BatchRead]
    ) -> Plan[tuple[_Tally, list[LoadedSession | None]]]:
        """Append a batch and answer reads placed between its events; see ``RedisStore``.

        On one server the whole batch is one pipeline: the append calls of
        the events before a read, the read's own call, the calls up to the
        next read, and so on. The server runs a connection's commands in
        order, so each read answers what a read sent after the events
        before it would. The calls are chained as a batch's are (see
        ``_send_calls``): after a refused event the later calls append
        nothing, and the reads after it are not answered. A cluster takes a
        step per read instead (``_append_then_read``).
        """
        return (yield from self.topology.append_reading(self, batch, reads))

    def _append_reading_pipelined(
        self, batch: AppendBatch, reads: list[BatchRead]
    ) -> Plan[tuple[_Tally, list[LoadedSession | None]]]:
        """Append a batch with its reads in one pipeline (see ``append_many_reading``)."""
        tally = _Tally(batch, 0)
        loaded: list[LoadedSession | None] = []
        start, first_read, total = 0, 0, len(batch)
        while start < total or first_read < len(reads):
            runs: list[Run] = []
            position = start
            for read in (*reads[first_read:], None):
                end = total if read is None else read[0]
                runs.extend(_spans(batch, position, end))
                position = max(position, end)
                if read is not None:
                    runs.append(read)
            calls = _calls(runs)
            first = batch.keys[batch.owners[start]] if start < total else None
            upkeep = self._batch_upkeep(batch, start, total)
            answered = len(loaded)
            stopped = yield from self._send_calls(calls, first, tally, upkeep, loaded)
            first_read += len(loaded) - answered
            if not stopped:
                return tally, loaded
            if tally.error is not None:
                return tally, loaded
            # A repeat with other bytes but equal content stopped the server:
            # go on after it; the reads after it saw too little and are sent again.
            start = tally.applied
        return tally, loaded

    def _append_then_read(
        self, batch: AppendBatch, reads: list[BatchRead]
    ) -> Plan[tuple[_Tally, list[LoadedSession | None]]]:
        """Append the events before each read, then read: one step after another.

        For a cluster, whose pipelines keep no order between nodes.
        """
        tally = _Tally(batch, 0)
        loaded: list[LoadedSession | None] = []
        position = 0
        for read in (*reads, None):
            end = len(batch) if read is None else read[0]
            if end > position:
                part = yield from self.append_many(batch, position, end)
                tally.add(part)
                if tally.error is not None:
                    return tally, loaded
                position = end
            if read is not None:
                loaded.append((yield from self.load(*read[1:])))
        return tally, loaded

    def _send_calls(
        self,
        calls: list[list[Run]],
        first: tuple[str, str, str] | None,
        tally: _Tally,
        upkeep: list[Command],
        loaded: list[LoadedSession | None] | None = None,
    ) -> Plan[bool]:
        """Send a group's append calls, pipelined, and take the reply of every call that ran.

        The calls are chained by a fresh guard key (in the slot of the
        session ``first``; see ``append`` in functions.lua): call k
        runs only once call k-1 has landed, so whatever the server answers
        part-way (a refusal, out of memory, a flushed function library)
        what is stored is a prefix of the group, in order, and ``tally``
        takes exactly that. Calls the server did not run for want of the
        library are sent again, from the first of them, once the runner
        has loaded it. Returns whether the batch stopped: at a refusal
        (``tally.error`` None when the refused event was a repeat after
        all) or with ``tally.error`` set.
        """
        guard = self._new_guard(first)
        done = reloads = 0
        while True:
            sent = calls[done:]
            try:
                replies = yield _Tolerant(
                    [*(self._call(runs, guard, place, tally.batch)
                       for place, runs in enumerate(sent, done)),
                     *upkeep, *self._waits()]
                )  # fmt: skip
            except StoreError as error:  # the network failed: nothing more is known
                tally.error = error
                return True
            upkeep = []
            again = False
            for runs, reply in zip(sent, replies, strict=False):
                if reply is _RELOADED:
                    again = True
                    break
                if isinstance(reply, StoreError):
                    tally.error = reply
                    return True
                if reply[0] is None:
                    # Held back, though the call before it landed: the guard
                    # key went (FLUSHALL, eviction) between the two.
                    tally.error = StoreError(
                        "the server lost the batch's guard key part-way",
                        hint="something flushed or evicted keys: check the server's "
                        "maxmemory-policy and who runs FLUSHALL; the events reported "
                        "applied were stored",
                    )
                    return True
                done += 1
                reloads = 0
                if (yield from self._take(runs, reply, tally, loaded)):
                    return True
            for reply in replies[len(sent) :]:
                if isinstance(reply, StoreError) and tally.error is None:
                    tally.error = reply
            if self.settings.wait and tally.error is None:
                try:
                    self._check_wait(replies[-1])
                except StoreError as error:
                    tally.error = error
            if tally.error is not None:
                return True
            if not again:
                return False
            reloads += 1
            if reloads > _RELOADS:
                tally.error = StoreError(
                    "the server lost its function library again and again",
                    hint="something runs FUNCTION FLUSH or restarts the server without "
                    "persistence: stop it, then retry; the events reported applied were stored",
                )
                return True

    def _new_guard(self, first: tuple[str, str, str] | None) -> bytes:
        """Return a fresh guard key for a batch, in the slot of its first session."""
        if first is None:
            return self.keys.base + b"g:" + secrets.token_hex(8).encode()
        return self.keys.guard(first[0], first[1], secrets.token_hex(8))

    def _batch_upkeep(self, batch: AppendBatch, start: int, stop: int) -> list[Command]:
        apps = {batch.keys[owner][0] for owner in set(batch.owners[start:stop])}
        return [c for app in sorted(apps) for c in self._app_upkeep(app)]

    def _take(
        self,
        runs: list[Run],
        reply: Any,
        tally: _Tally,
        loaded: list[LoadedSession | None] | None = None,
    ) -> Plan[bool]:
        """Decode one append call's reply into ``tally``; return whether the batch stopped.

        A refusal stops the batch, and so does a result the client cannot
        take (its error goes to ``tally.error``); ``tally.applied`` is then
        the stopped event's position. The answers of reads placed in the
        call go to ``loaded``. On a cluster the app deltas the call left
        pending are finished once its results are taken: a failure there
        stops the batch after the events stored (their deltas stay pending
        for the next read or append of the user to finish).
        """
        outcomes, pending = reply
        stopped = yield from self._take_outcomes(runs, outcomes, tally, loaded)
        if pending:
            first = runs[0]
            assert type(first) is _Span
            app_name, user_id, _ = tally.batch.keys[first.owner]
            try:
                yield from self.topology.settle(app_name, user_id, pending)
            except StoreError as error:
                tally.error = tally.error or error
                return True
        return stopped

    def _take_outcomes(
        self,
        runs: list[Run],
        outcomes: list[Any],
        tally: _Tally,
        loaded: list[LoadedSession | None] | None,
    ) -> Plan[bool]:
        """Decode the runs' outcomes of one call's reply (see ``_take``)."""
        batch = tally.batch
        # What surrounds the count in a marker, by (session number, removed count).
        around: dict[tuple[Any, Any], tuple[str, str]] = {}
        for run, outcome in zip(runs, outcomes, strict=False):
            if type(run) is tuple:
                assert loaded is not None
                if type(outcome) is bytes or tally.error is not None:
                    # A call sent again after it ran: the guard kept no
                    # answer of its reads; the appends after them are taken.
                    tally.error = tally.error or StoreError(
                        "the answer of a read placed in the batch was lost with the connection",
                        hint="the events reported applied are stored; read the session again",
                    )
                    continue
                loaded.append((yield from self._loaded(run[1], run[2], run[3], outcome, None)))
                continue
            assert type(run) is _Span
            results, number, removed = outcome
            parts = around.get((number, removed))
            if parts is None:
                parts = around[(number, removed)] = _marker_parts([number, removed])
            if len(results) == run.stop - run.start and all(type(r) is int for r in results):
                # Every event appended: only the session's last marker and time matter.
                tally.appended(run.owner, parts, results[-1], run.stop)
                continue
            for offset, result in enumerate(results):
                index = run.start + offset
                if type(result) is int:
                    tally.appended(run.owner, parts, result, index + 1)
                    continue
                request = batch.request(index)
                try:
                    done = self._result(request, result, parts)
                except Exception as failure:  # it stops the batch; the caller raises it
                    tally.error = failure
                    return True
                tally.took(index, done)
                if result[0] == b"no":
                    return True
        return False


def _marker_parts(reply: list[Any]) -> tuple[str, str]:
    """Return what comes before and after the event count in a session's marker.

    ``reply`` is the session number and truncated count an append call ends
    with (empty when the call tried nothing).
    """
    if not reply or reply[0] is None:
        return ("", "")
    number, removed = reply
    return (number.decode() + ":", f":{removed}" if removed else "")


def _calls(runs: Iterable[Run]) -> list[list[Run]]:
    """Group runs into calls of about ``_CHUNK`` requests (a run is never split here).

    A read placed among them counts as one request.
    """
    calls: list[list[Run]] = []
    size = _CHUNK
    for run in runs:
        weight = 1 if type(run) is tuple else len(run)
        if size + weight > _CHUNK:
            calls.append([])
            size = 0
        calls[-1].append(run)
        size += weight
    return calls


class _Span:
    """A run of a batch's events ``start..stop`` (exclusive), all of session ``keys[owner]``."""

    __slots__ = ("owner", "start", "stop")

    def __init__(self, owner: int, start: int, stop: int) -> None:
        self.owner, self.start, self.stop = owner, start, stop

    def __len__(self) -> int:
        return self.stop - self.start


def _spans(batch: AppendBatch, start: int, stop: int) -> Iterable[_Span]:
    """Split a batch's events start..stop into runs of one session, at most ``_CHUNK`` long."""
    owners = batch.owners
    first = start
    for index in range(start + 1, stop):
        if owners[index] != owners[first] or index - first >= _CHUNK:
            yield _Span(owners[first], first, index)
            first = index
    if first < stop:
        yield _Span(owners[first], first, stop)


def _span_args(batch: AppendBatch, start: int, stop: int, args: list[Any]) -> None:
    """Add the FCALL arguments of a batch's events start..stop (see ``_request_args``).

    Read from the batch's columns, without a request object per event:
    every event of a batch is locked and without catch-up, so one without
    state items is four arguments.
    """
    text = float.__repr__
    for event_id, stamp, event, apps, users, own in zip(
        batch.event_ids[start:stop],
        batch.timestamps[start:stop],
        batch.events[start:stop],
        batch.app_items[start:stop],
        batch.user_items[start:stop],
        batch.session_items[start:stop],
        strict=True,
    ):
        time = text(stamp if type(stamp) is float else float(stamp))
        if apps or users or own:
            _items_args((event_id, time, event), _LOCKED, own, users, apps, args)
        else:
            args += (event_id, time, event, _PLAIN_LOCKED)


class _Tally:
    """What a bulk append did so far, summed up as ``BatchResult`` wants it.

    ``applied`` counts the events handled (appended or skipped as repeats)
    from the batch's start; ``error`` is what stopped it.
    """

    __slots__ = ("applied", "batch", "error", "markers", "repeats", "times")

    def __init__(self, batch: AppendBatch, start: int) -> None:
        self.batch = batch
        self.applied = start
        self.repeats: list[int] = []
        # Per session: (what comes before and after the count, count), or a marker.
        self.markers: list[tuple[tuple[str, str], int] | str | None] = [None] * len(batch.keys)
        self.times = [0.0] * len(batch.keys)
        self.error: BaseException | None = None

    def appended(self, owner: int, parts: tuple[str, str], count: int, applied: int) -> None:
        """Note events appended up to position ``applied``; the last was the session's ``count``."""
        self.markers[owner] = (parts, count)
        self.times[owner] = float(self.batch.timestamps[applied - 1])
        self.applied = applied

    def took(self, index: int, result: AppendResult) -> None:
        """Note the result of event ``index`` decoded one by one (a repeat, a refusal)."""
        if result.duplicate or result.marker is None:
            self.repeats.append(index)
        else:
            owner = self.batch.owners[index]
            self.markers[owner] = result.marker
            self.times[owner] = result.last_update_time
        self.applied = index + 1

    def add(self, later: _Tally) -> None:
        """Take in the tally of the batch's next events (a later step of the same batch)."""
        self.repeats += later.repeats
        for owner, marker in enumerate(later.markers):
            if marker is not None:
                self.markers[owner], self.times[owner] = marker, later.times[owner]
        self.applied = later.applied
        self.error = later.error

    def result(self, applied: int | None = None) -> BatchResult:
        """Return the batch result: the first ``applied`` events (default: those handled)."""
        markers = [
            m if m is None or type(m) is str else f"{m[0][0]}{m[1]}{m[0][1]}" for m in self.markers
        ]
        count = self.applied if applied is None else applied
        return BatchResult(count, self.repeats, markers, self.times, self.error)


def batch_plan(batch: AppendBatch, plans: AppendPlans) -> Plan[BatchResult]:
    """Append a batch (``append_many`` of the plans); sum up what it did."""
    tally = yield from plans.append_many(batch)
    return tally.result()
