"""A shared store on Redis 7 or a Redis Cluster, for agents that run on several machines.

Every append is one ``FCALL`` of a server-side function (``functions.lua``)
that checks and writes atomically; reads of the last n events read n. Each
operation is described once, as a *plan*: a generator that yields the
commands of one round trip (several are pipelined) and receives their
replies. The sync face runs plans on ``redis.Redis`` / ``redis.cluster.RedisCluster``,
the async face on their ``redis.asyncio`` twins, so both share key building,
argument packing and reply decoding, as redis-py's own clients share their
command definitions.

Keys (``P`` the prefix, ``{u}`` a digest of (app, user), ``{a}`` of the app;
the braces are Redis Cluster hash tags, so a session, its events and its
user's state share one slot, and an app's own keys another):

    P:{u}r:<sid>   hash     the session record (app, user, sid, n, c, u, k, l, r, ts, sm)
    P:{u}e:<sid>   hash     seq -> event record
    P:{u}i:<sid>   hash     event id -> seq
    P:{u}t:<sid>   string   event times as 8-byte doubles by position, while in order
                   or zset  seq scored by event timestamp (after a time went back)
    P:{u}s:<sid>   hash     session state: key -> packed value
    P:{u}u         hash     user state
    P:{u}x         zset     the user's session ids scored by last update time
    P:{u}p         hash     app deltas recorded but not yet applied (cluster)
    P:{u}g:<token> hash     chains a batch's calls: how many landed, their replies (60 s)
    P:{a}a         hash     app state
    P:{a}k         zset     app deltas applied, by token (cluster; kept a day)
    P:{a}d         zset     the app's users (a directory for listing)
    P:format       string   the store's format record

On a single server the append function also writes the app map in the same
atomic step. On a cluster the app map lives in another slot: the function
records the app delta in ``P:{u}p`` under a token (session number and event
id), then a second call applies it to the app map once (``P:{a}k`` remembers
applied tokens) and a third clears it. Any later read or append of the same
user finishes a pending delta left behind by a process that died in between.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import struct
import threading
import time
from collections.abc import Awaitable, Callable, Generator, Iterable
from dataclasses import dataclass
from functools import lru_cache
from hashlib import blake2b
from importlib import resources
from typing import Any, TypeAlias, TypeVar
from urllib.parse import quote

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from ...codec import decode_values, pack, unpack
from ...errors import (
    AlreadyExistsError,
    CorruptStoreError,
    IncompatibleStoreError,
    SessionNotFoundError,
    StoreClosedError,
    StoreError,
    StoreNotFoundError,
    UnsafeStoreError,
)
from .. import redact
from ..completion import Completion
from ..expiry import Expirer
from ..records import (
    AppendBatch,
    AppendRequest,
    AppendResult,
    BatchResult,
    EventPage,
    Items,
    ListPosition,
    LoadedSession,
    SessionCopy,
    SessionRecord,
    copies_equal,
    event_copy,
    result_of_batch,
)
from ..rules import (
    BATCH_EVENTS,
    BATCH_SESSIONS,
    catch_up_repeat,
    check_append,
    check_copy,
    check_ttl,
    list_position,
    marker_position,
    page_records,
    repeat_result,
)

hiredis: Any
try:
    import hiredis
except ImportError:  # the redis extra installs it; without it redis-py packs in Python
    hiredis = None

__all__ = ["FORMAT_VERSION", "LIBRARY", "RedisStore"]

T = TypeVar("T")

_log = logging.getLogger(__name__)
# The eviction policy that never drops a key (see docs/redis.md): any other
# may remove a session's record, events or state on its own.
_SAFE_POLICY = "noeviction"
# What a Redis client raises: redis-py's cluster client also raises
# RedisClusterException (no reachable node, cluster mode off), which is no RedisError.
_REDIS_ERRORS = (redis.exceptions.RedisError, redis.exceptions.RedisClusterException)

# Format 2 keeps a session's event times as a string of doubles while they
# never go back (the sorted set only after one does); a store of format 1 is
# read and written as it is, every session with the sorted set.
FORMAT_VERSION = 2
MAGIC = "sessionscope"
# The function library's name carries its version: a client never calls an
# older server-side copy by mistake, and two versions can live side by side.
LIBRARY = "sessionscope_6"
_FN = LIBRARY + "_"
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
_U32 = struct.Struct(">I")
# An event time in a session's time string (see functions.lua).
_DOUBLE = struct.Struct(">d")
# Called, when set, after an app delta is recorded and before it is applied
# (cluster): tests stop a process there to check that another finishes it.
between_steps: Callable[[], None] | None = None
# The field of a user's pending hash that counts app deltas recorded.
_ORDER_FIELD = b"#"
# The fields of a session record hash, in SessionRecord's order.
_RECORD_FIELDS = ("app", "user", "sid", "n", "c", "u", "k", "l", "r")
# (command, arguments...) of one Redis command.
Command = tuple[Any, ...]
# An operation: yields the commands of each round trip, receives their replies.
Plan = Generator[list[Command], list[Any], T]
# A read placed in a batch: (how many of the batch's requests come before it,
# app, user, session id, num_recent_events, after_timestamp).
BatchRead = tuple[int, str, str, str, "int | None", "float | None"]
# What an append call carries in order: runs of one session's requests (a
# single append's, or a span of a batch's events), and reads.
Run: TypeAlias = "list[AppendRequest] | _Span | BatchRead"


@lru_cache(maxsize=1)
def _library_code() -> str:
    return resources.files(__package__).joinpath("functions.lua").read_text()


def _number_text(value: float) -> str:
    """Return a float as text that reads back as the same float (Lua and Redis parse it)."""
    return float.__repr__(float(value))


def _text(value: bytes | str | None) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else value


def _pairs(reply: Any) -> list[tuple[str, bytes]]:
    """Return (field, value) pairs of an HGETALL reply (a flat list or a dict)."""
    if not reply:
        return []
    if isinstance(reply, dict):
        return [(k.decode(), v) for k, v in reply.items()]
    it = iter(reply)
    return [(k.decode(), v) for k, v in zip(it, it, strict=False)]


def _raw_pairs(reply: Any) -> list[tuple[bytes, bytes]]:
    if not reply:
        return []
    if isinstance(reply, dict):
        return list(reply.items())
    it = iter(reply)
    return list(zip(it, it, strict=False))


def _record(fields: list[Any]) -> SessionRecord:
    app, user, sid, number, created, updated, count, last, removed = fields
    return SessionRecord(
        app.decode(),
        user.decode(),
        sid.decode(),
        int(number),
        float(created),
        float(updated),
        int(count),
        _text(last),
        int(removed or 0),
    )


def _index_range(index: bytes, low: str, count: int) -> Command:
    """Return the read of a listing index's first ``count`` entries scored from ``low`` on."""
    return ("ZRANGE", index, low, "+inf", "BYSCORE", "LIMIT", 0, count, "WITHSCORES")


def _remember(known: dict[Any, Any], key: Any, value: Any, most: int) -> None:
    """Keep ``value`` under ``key``, emptying ``known`` first once it holds ``most`` entries."""
    if len(known) >= most:
        known.clear()
    known[key] = value


class _Keys:
    """Build every key name of one prefix: the one place the layout is written down."""

    def __init__(self, prefix: str) -> None:
        self.base = prefix.encode() + b":"
        self.format = self.base + b"format"
        # The store's apps (a set; its own slot on a cluster).
        self.apps = self.base + b"apps"
        # Tags computed before (ids recur), each dict emptied when full.
        self._user_tags: dict[tuple[str, str], bytes] = {}
        self._app_tags: dict[str, bytes] = {}

    def user_tag(self, app_name: str, user_id: str) -> bytes:
        tag = self._user_tags.get((app_name, user_id))
        if tag is None:
            digest = blake2b(pack([app_name, user_id]), digest_size=16).hexdigest()
            tag = self.base + b"{u" + digest.encode() + b"}"
            _remember(self._user_tags, (app_name, user_id), tag, 4096)
        return tag

    def app_tag(self, app_name: str) -> bytes:
        tag = self._app_tags.get(app_name)
        if tag is None:
            digest = blake2b(pack([app_name]), digest_size=16).hexdigest()
            tag = self.base + b"{a" + digest.encode() + b"}"
            _remember(self._app_tags, app_name, tag, 1024)
        return tag

    def session(self, app_name: str, user_id: str, session_id: str) -> list[bytes]:
        """Return record, events, ids, times, state, positions and names keys of a session."""
        tag = self.user_tag(app_name, user_id)
        sid = session_id.encode()
        return [tag + b"r:" + sid, tag + b"e:" + sid, tag + b"i:" + sid, tag + b"t:" + sid,
                tag + b"s:" + sid, tag + b"o:" + sid, tag + b"n:" + sid]  # fmt: skip

    def user(self, app_name: str, user_id: str) -> list[bytes]:
        """Return the user state, session index, pending and number counter keys of a user."""
        tag = self.user_tag(app_name, user_id)
        return [tag + b"u", tag + b"x", tag + b"p", tag + b"c"]

    def guard(self, app_name: str, user_id: str, token: str) -> bytes:
        return self.user_tag(app_name, user_id) + b"g:" + token.encode()

    def app(self, app_name: str) -> list[bytes]:
        """Return the app state, applied tokens and user directory keys of an app."""
        tag = self.app_tag(app_name)
        return [tag + b"a", tag + b"k", tag + b"d"]


def _pack_items(items: Items) -> bytes:
    """Frame app items as one value: each key, then its packed value, after its length."""
    out = bytearray()
    for key, value in items:
        raw = key.encode()
        out += _U32.pack(len(raw)) + raw + _U32.pack(len(value)) + value
    return bytes(out)


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


@dataclass(slots=True)
class _Settings:
    prefix: str
    ttl: int
    wait: int
    timeout: float
    cluster: bool


class _Operations:
    """Each store operation as a plan; shared by the sync and the async face."""

    def __init__(self, settings: _Settings) -> None:
        self.settings = settings
        self.keys = _Keys(settings.prefix)
        # The append function's keys of each session appended to (sessions recur).
        self._session_keys: dict[tuple[str, str, str], tuple[bytes, ...]] = {}
        self.cluster = settings.cluster
        # When this process last pushed each app's keys' expiry forward.
        self._app_refreshed: dict[str, float] = {}
        self._refresh_lock = threading.Lock()
        # Whether new sessions keep their times as a string while in order
        # (format 2); check_format clears it for a store of format 1.
        self.times_layout = "1"

    # -- shared steps ----------------------------------------------------

    def _app_upkeep(self, app_name: str) -> list[Command]:
        """Return commands that keep an app's keys alive while its sessions live.

        Every session's keys expire ``ttl`` after its last append. The app's
        keys are pushed to ``2 * ttl`` from now at most every ``ttl / 2``
        seconds per process, so they outlive every session appended to since.
        """
        ttl = self.settings.ttl
        if not ttl:
            return []
        now = time.monotonic()
        with self._refresh_lock:
            if now - self._app_refreshed.get(app_name, -1e18) < ttl / 2:
                return []
            self._app_refreshed[app_name] = now
        return [("EXPIRE", key, 2 * ttl) for key in self.keys.app(app_name) if key[-1:] != b"k"]

    def _waits(self) -> list[Command]:
        wait = self.settings.wait
        # Half the socket timeout: WAIT answers before the socket gives up on it.
        return [("WAIT", wait, max(1, int(self.settings.timeout * 500)))] if wait else []

    def _check_wait(self, reply: Any) -> None:
        wait = self.settings.wait
        if wait and int(reply) < wait:
            raise StoreError(
                f"the write reached {int(reply)} of {wait} replicas in time",
                hint="it is stored on the primary; check the replicas, then retry "
                "(a retried append with the same event id is a no-op)",
            )

    def _app_keys(self, app_name: str) -> list[bytes]:
        """Return the app key a function writes directly (single server only)."""
        return [] if self.cluster else [self.keys.app(app_name)[0]]

    def _finish_pending(self, app_name: str, user_id: str, pending: Any) -> Plan[None]:
        """Apply recorded app deltas once, then clear them (cluster only)."""
        entries = sorted(
            (token, blob) for token, blob in _raw_pairs(pending) if token != _ORDER_FIELD
        )
        if not entries:
            return
        # Tokens start with a per-user counter: sorted, they apply in append order.
        flat = [x for entry in entries for x in entry]
        tokens = flat[0::2]
        if between_steps is not None:
            between_steps()
        app_state, applied, _ = self.keys.app(app_name)
        yield [("FCALL", _FN + "apply", 2, app_state, applied, self.settings.ttl, *flat)]
        pend = self.keys.user(app_name, user_id)[2]
        yield [("FCALL", _FN + "clear", 1, pend, *tokens)]

    # -- operations ------------------------------------------------------

    def create(
        self,
        app_name: str,
        user_id: str,
        session_id: str,
        create_time: float,
        app_items: Items,
        user_items: Items,
        session_items: Items,
    ) -> Plan[LoadedSession]:
        keys = self.keys
        rec, _, _, _, state, _, _ = keys.session(app_name, user_id, session_id)
        ustate, index, pend, counter = keys.user(app_name, user_id)
        app_state, _, directory = keys.app(app_name)
        # Names this create, so that a retry after a lost reply is known as one.
        token = secrets.token_hex(8)
        fkeys = [rec, state, ustate, index, pend, counter, *self._app_keys(app_name)]
        args: list[Any] = [
            app_name, user_id, session_id, token, _number_text(create_time),
            self.settings.ttl, len(session_items), len(user_items), _pack_items(app_items),
            self.times_layout,
        ]  # fmt: skip
        for key, value in (*session_items, *user_items):
            args.extend((key, value))
        # The directory entry is touched before (so that a process dying
        # after the create leaves it listed) and after the create (so that a
        # listing that prunes users without sessions cannot remove it; see
        # the prune function).
        touch = ("ZINCRBY", directory, 1, user_id)
        create = ("FCALL", _FN + "create", len(fkeys), *fkeys, *args)
        known = ("SADD", keys.apps, app_name)
        if self.cluster:
            replies = yield [touch, create, known]
            replies += yield [touch, *self._app_upkeep(app_name)]
        else:
            replies = yield [touch, create, touch, known, *self._app_upkeep(app_name),
                             *self._waits()]  # fmt: skip
            if self.settings.wait:
                self._check_wait(replies[-1])
        reply = replies[1]
        if reply is None:
            raise AlreadyExistsError(f"session {session_id!r} already exists")
        fields, sstate, ustate_reply, astate, pending = reply
        if self.cluster:
            yield from self._finish_pending(app_name, user_id, pending)
            (astate,) = yield [("HGETALL", app_state)]
        return LoadedSession(
            _record(fields),
            decode_values(_pairs(sstate)),
            decode_values(_pairs(astate)),
            decode_values(_pairs(ustate_reply)),
            [],
        )

    def read_events(
        self, app_name: str, user_id: str, session_id: str, start: int, limit: int
    ) -> Plan[EventPage | None]:
        """Return a session's record and up to ``limit`` stored events from position ``start``.

        The positions, then the events and the record again: a session
        deleted, created again or truncated between the two reads comes
        back with its new record and no events, which the caller checks.
        """
        rec, events, _, _, _, positions, _ = self.keys.session(app_name, user_id, session_id)
        (fields,) = yield [("HMGET", rec, *_RECORD_FIELDS)]
        if fields[3] is None:
            return None
        record = _record(fields)
        first = max(0, start)
        if limit <= 0:
            return record, []
        if record.removed_count == 0:
            # Until a truncation the positions are all of 0..count-1.
            seqs = list(range(first, min(record.event_count, first + limit)))
        else:
            (found,) = yield [("ZRANGE", positions, first, "+inf", "BYSCORE", "LIMIT", 0, limit)]
            seqs = [int(seq) for seq in found]
        if not seqs:
            return record, []
        values, again = yield [("HMGET", events, *seqs), ("HMGET", rec, *_RECORD_FIELDS)]
        if again[3] is None:
            return None
        now = _record(again)
        if (now.number, now.removed_count) != (record.number, record.removed_count):
            return now, []
        return now, [(seq, bytes(v)) for seq, v in zip(seqs, values, strict=True) if v is not None]

    def load(
        self,
        app_name: str,
        user_id: str,
        session_id: str,
        num_recent_events: int | None,
        after_timestamp: float | None,
    ) -> Plan[LoadedSession | None]:
        call = self._load_call(app_name, user_id, session_id, num_recent_events, after_timestamp)
        if self.cluster:
            reply, astate = yield [call, ("HGETALL", self.keys.app(app_name)[0])]
        else:
            (reply,) = yield [call]
            astate = None
        return (yield from self._loaded(app_name, user_id, session_id, reply, astate))

    def _load_call(
        self,
        app_name: str,
        user_id: str,
        session_id: str,
        num_recent_events: int | None,
        after_timestamp: float | None,
    ) -> Command:
        """Return the FCALL_RO reading a session (see ``load`` in functions.lua)."""
        rec, events, _, times, state, positions, _ = self.keys.session(
            app_name, user_id, session_id
        )
        ustate, _, pend, _ = self.keys.user(app_name, user_id)
        fkeys = [rec, events, times, state, positions, ustate, pend, *self._app_keys(app_name)]
        args = [
            "" if num_recent_events is None else num_recent_events,
            "" if after_timestamp is None else _number_text(after_timestamp),
        ]
        return ("FCALL_RO", _FN + "load", len(fkeys), *fkeys, *args)

    def _loaded(
        self, app_name: str, user_id: str, session_id: str, reply: Any, astate: Any
    ) -> Plan[LoadedSession | None]:
        """Decode a load reply; on a cluster, finish pending app deltas and read the app map.

        ``astate`` is the app map read beside the call (cluster only).
        """
        if reply is None:
            return None
        where = f"session {session_id!r} of user {user_id!r} in app {app_name!r}"
        if type(reply) is bytes:
            # The load function found keys of a session whose part it names is gone.
            raise _missing(where, "its " + reply.decode())
        fields, event_list, sstate, ustate_reply, astate_reply, pending = reply
        record = _record(fields)
        if (record.app_name, record.user_id, record.session_id) != (
            app_name,
            user_id,
            session_id,
        ):
            raise StoreError("two ids share a key digest", hint="report this as a bug")
        if None in event_list:
            gone = sum(1 for event in event_list if event is None)
            raise _missing(where, f"{gone} of the {len(event_list)} event records read")
        if self.cluster:
            if pending:
                yield from self._finish_pending(app_name, user_id, pending)
                (astate,) = yield [("HGETALL", self.keys.app(app_name)[0])]
        else:
            astate = astate_reply
        return LoadedSession(
            record,
            decode_values(_pairs(sstate)),
            decode_values(_pairs(astate)),
            decode_values(_pairs(ustate_reply)),
            list(event_list),
        )

    def list_records(self, app_name: str, user_id: str | None) -> Plan[list[SessionRecord]]:
        keys = self.keys
        directory = keys.app(app_name)[2]
        scores: list[bytes] = []
        if user_id is None:
            (flat,) = yield [("ZRANGE", directory, 0, -1, "WITHSCORES")]
            users = [u.decode() for u in flat[0::2]]
            scores = list(flat[1::2])
        else:
            users = [user_id]
        if not users:
            return []
        indexes = yield [("ZRANGE", keys.user(app_name, u)[1], 0, -1) for u in users]
        reads: list[Command] = []
        for user, sids in zip(users, indexes, strict=True):
            for sid in sids:
                rec = keys.session(app_name, user, sid.decode())[0]
                reads.append(("HMGET", rec, *_RECORD_FIELDS))
        records: list[SessionRecord] = []
        if reads:
            # A session deleted between the two reads is left out.
            records = [_record(fields) for fields in (yield reads) if fields[3] is not None]
        empty = [
            (u, score) for u, sids, score in zip(users, indexes, scores, strict=False) if not sids
        ]
        if empty:
            # A user with no session but with state stays in the directory.
            lives = yield from self._user_lives(app_name, [user for user, _ in empty])
            prunes: list[Command] = [
                ("FCALL", _FN + "prune", 1, directory, user, score)
                for (user, score), alive in zip(empty, lives, strict=True)
                if not alive
            ]
            if prunes:
                yield prunes
        return records

    def page(
        self, app_name: str, user_id: str | None, limit: int, after: ListPosition | None
    ) -> Plan[tuple[list[SessionRecord], bool]]:
        """Return one page of ``list_page`` from the users' listing indexes.

        Each user's index is a sorted set of session ids scored by last update
        time, so it is ordered as a listing is within one user: by time, then
        id (equal scores sort by member bytes, and UTF-8 bytes sort as code
        points do). A page reads at most ``limit + 1`` entries after the
        position from each user's index (every user of the app when
        ``user_id`` is None), merges them, and then reads the records of the
        page only: three round trips for an app, two for a user, whatever the
        number of sessions.
        """
        keys = self.keys
        if user_id is None:
            (flat,) = yield [("ZRANGE", keys.app(app_name)[2], 0, -1)]
            users = [u.decode() for u in flat]
        else:
            users = [user_id]
        if not users:
            return [], False
        reads: list[Command] = []
        for user in users:
            index = keys.user(app_name, user)[1]
            if after is None:
                reads.append(_index_range(index, "-inf", limit + 1))
                continue
            stamp, after_user, after_sid = after
            # A later user's sessions at the position's time come after it; an
            # earlier user's do not.
            low = repr(stamp) if user > after_user else f"({stamp!r}"
            reads.append(_index_range(index, low, limit + 1))
            if user == after_user:
                # This user's ties after the position's id: every tie is read, then sifted.
                reads.append(("ZRANGE", index, repr(stamp), repr(stamp), "BYSCORE"))
        replies = iter((yield reads))
        found: list[tuple[float, str, str]] = []
        for user in users:
            flat = next(replies)
            found.extend(
                (float(score), user, sid.decode())
                for sid, score in zip(flat[0::2], flat[1::2], strict=True)
            )
            if after is not None and user == after[1]:
                stamp, after_sid = after[0], after[2]
                found.extend(
                    (stamp, user, sid) for sid in (m.decode() for m in next(replies))
                    if sid > after_sid
                )  # fmt: skip
        found.sort()
        chosen, more = found[:limit], len(found) > limit
        if not chosen:
            return [], more
        fields = yield [
            ("HMGET", keys.session(app_name, user, sid)[0], *_RECORD_FIELDS)
            for _, user, sid in chosen
        ]
        # A session deleted between the two reads is left out; one appended to
        # meanwhile is listed where its record now says.
        records = [_record(f) for f in fields if f[3] is not None]
        if after is not None:
            records = [r for r in records if list_position(r) > after]
        records.sort(key=list_position)
        return records, more

    def delete(self, app_name: str, user_id: str, session_id: str) -> Plan[None]:
        session_keys = self.keys.session(app_name, user_id, session_id)
        index = self.keys.user(app_name, user_id)[1]
        call = ("FCALL", _FN + "delete", 8, *session_keys, index, session_id)
        replies = yield [call, *self._waits()]
        if self.settings.wait:
            self._check_wait(replies[-1])

    def _append_keys(self, app_name: str, user_id: str, session_id: str) -> tuple[bytes, ...]:
        """Return the append function's keys of one session's run (see functions.lua)."""
        ident = (app_name, user_id, session_id)
        keys = self._session_keys.get(ident)
        if keys is None:
            keys = (
                *self.keys.session(app_name, user_id, session_id),
                *self.keys.user(app_name, user_id),
                *self._app_keys(app_name),
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
        if self.cluster and pending:
            yield from self._finish_pending(request.app_name, request.user_id, pending)
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
        if self.cluster and result.stored_state is not None:
            (astate,) = yield [("HGETALL", self.keys.app(request.app_name)[0])]
            result.stored_state.app_state = decode_values(_pairs(astate))
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
            group = self._slot_group(batch, start, stop)
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
        nothing, and the reads after it are not answered.
        """
        if self.cluster:
            return (yield from self._append_then_read(batch, reads))
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
        if self.cluster and pending:
            first = runs[0]
            assert type(first) is _Span
            app_name, user_id, _ = tally.batch.keys[first.owner]
            try:
                yield from self._finish_pending(app_name, user_id, pending)
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

    def _slot_group(self, batch: AppendBatch, start: int, stop: int) -> int:
        """Return how many events from ``start`` may be pipelined under one guard key."""
        if not self.cluster:
            return stop - start
        owners, keys = batch.owners, batch.keys
        app, user, _ = keys[owners[start]]
        end = start
        while end < stop and keys[owners[end]][:2] == (app, user):
            end += 1
        return end - start

    # -- retention and copies ----------------------------------------------

    def truncate(
        self,
        app_name: str,
        user_id: str,
        session_id: str,
        before: float | None,
        keep_last: int | None,
    ) -> Plan[int]:
        """Remove old events in calls of at most BATCH_EVENTS, oldest first."""
        rec, events, ids, times, _, positions, names = self.keys.session(
            app_name, user_id, session_id
        )
        mode = ("before", _number_text(before)) if before is not None else ("keep", keep_last)
        call = ("FCALL", _FN + "truncate", 6, rec, events, ids, times, positions, names,
                *mode, BATCH_EVENTS)  # fmt: skip
        removed = 0
        while True:
            (reply,) = yield [call]
            gone = int(reply)
            if gone < 0:
                raise SessionNotFoundError(
                    f"session {session_id!r} of user {user_id!r} in app {app_name!r} does not exist"
                )
            removed += gone
            if gone < BATCH_EVENTS:
                return removed

    def _users(self, app_name: str) -> Plan[list[str]]:
        """Return the users in an app's directory."""
        (members,) = yield [("ZRANGE", self.keys.app(app_name)[2], 0, -1)]
        return [member.decode() for member in members]

    def _apps(self) -> Plan[list[str]]:
        (members,) = yield [("SMEMBERS", self.keys.apps)]
        return sorted(member.decode() for member in members)

    def _delete_sessions(self, app_name: str, user_id: str, idle_before: float | None) -> Plan[int]:
        """Delete a user's sessions (only those idle since ``idle_before``, when given)."""
        index = self.keys.user(app_name, user_id)[1]
        if idle_before is None:
            (sids,) = yield [("ZRANGE", index, 0, -1)]
        else:
            stop = "(" + _number_text(idle_before)
            (sids,) = yield [("ZRANGE", index, "-inf", stop, "BYSCORE")]
        removed = 0
        extra = [] if idle_before is None else [_number_text(idle_before)]
        for start in range(0, len(sids), BATCH_SESSIONS):
            calls: list[Command] = [
                ("FCALL", _FN + "delete", 8,
                 *self.keys.session(app_name, user_id, sid.decode()), index, sid, *extra)
                for sid in sids[start : start + BATCH_SESSIONS]
            ]  # fmt: skip
            removed += sum((yield calls))
        return removed

    def expire(self, app_name: str | None, idle_before: float) -> Plan[int]:
        apps = [app_name] if app_name is not None else (yield from self._apps())
        removed = 0
        for app in apps:
            for user in (yield from self._users(app)):
                removed += yield from self._delete_sessions(app, user, idle_before)
        return removed

    def delete_user(self, app_name: str, user_id: str) -> Plan[int]:
        # App deltas this user's appends left pending still belong to the app.
        if self.cluster:
            (pending,) = yield [("HGETALL", self.keys.user(app_name, user_id)[2])]
            yield from self._finish_pending(app_name, user_id, pending)
        removed = yield from self._delete_sessions(app_name, user_id, None)
        ustate, index, pend, counter = self.keys.user(app_name, user_id)
        yield [
            ("DEL", ustate, index, pend, counter),
            ("ZREM", self.keys.app(app_name)[2], user_id),
        ]
        return removed

    def delete_app(self, app_name: str) -> Plan[int]:
        removed = 0
        for user in (yield from self._users(app_name)):
            removed += yield from self.delete_user(app_name, user)
        app_state, applied, directory = self.keys.app(app_name)
        yield [("DEL", app_state, applied, directory), ("SREM", self.keys.apps, app_name)]
        return removed

    def _user_lives(self, app_name: str, users: list[str]) -> Plan[list[bool]]:
        """Tell, per user, whether it has a session or user state."""
        commands: list[Command] = []
        for user in users:
            ustate, index, _, _ = self.keys.user(app_name, user)
            commands += [("EXISTS", index), ("EXISTS", ustate)]
        if not commands:
            return []
        replies = yield commands
        return [bool(a or b) for a, b in zip(replies[0::2], replies[1::2], strict=True)]

    def list_apps(self) -> Plan[list[str]]:
        apps = yield from self._apps()
        known = []
        for app in apps:
            (app_state,) = yield [("EXISTS", self.keys.app(app)[0])]
            users = yield from self._users(app)
            if app_state or any((yield from self._user_lives(app, users))):
                known.append(app)
        return known

    def list_users(self, app_name: str) -> Plan[list[str]]:
        users = yield from self._users(app_name)
        lives = yield from self._user_lives(app_name, users)
        return sorted(user for user, alive in zip(users, lives, strict=True) if alive)

    def restore(self, copy: SessionCopy) -> Plan[bool]:
        check_copy(copy)
        app, user, sid = copy.app_name, copy.user_id, copy.session_id
        stored = yield from self._copy_of(app, user, sid)
        if stored is None:
            rec, events, ids, times, state, _, names = self.keys.session(app, user, sid)
            _, index, _, counter = self.keys.user(app, user)
            last = copy.events[-1].event_id if copy.events else ""
            args: list[Any] = [
                app, user, sid, _number_text(copy.create_time),
                _number_text(copy.last_update_time), last, self.settings.ttl,
                len(copy.session_items), len(copy.events), self.times_layout,
            ]  # fmt: skip
            for key, value in copy.session_items:
                args.extend((key, value))
            for event in copy.events:
                args.extend((event.event_id, _number_text(event.timestamp), event.record))
            touch = ("ZINCRBY", self.keys.app(app)[2], 1, user)
            call = ("FCALL", _FN + "restore", 8, rec, events, ids, times, state, names, index,
                    counter, *args)  # fmt: skip
            # Touched before and after, as a create does (see _Operations.create).
            replies = yield from self._in_order(
                [touch, call], [touch, ("SADD", self.keys.apps, app)]
            )
            if replies[1]:
                return True
            stored = yield from self._copy_of(app, user, sid)
        if stored is not None and copies_equal(stored, copy):
            return False
        raise AlreadyExistsError(f"session {sid!r} already exists with other content")

    def _copy_of(self, app_name: str, user_id: str, session_id: str) -> Plan[SessionCopy | None]:
        """Return the stored session as a copy (times exact, events with their times)."""
        loaded = yield from self.load(app_name, user_id, session_id, None, None)
        if loaded is None:
            return None
        record = loaded.record
        times = self.keys.session(app_name, user_id, session_id)[3]
        (kind,) = yield [("TYPE", times)]
        if kind in (b"string", "string"):
            # Times in order: the stored positions run from the removed count on.
            (raw,) = yield [("GETRANGE", times, 8 * record.removed_count, -1)]
            ordered = [stamp for (stamp,) in _DOUBLE.iter_unpack(raw)]
        else:
            (flat,) = yield [("ZRANGE", times, 0, -1, "WITHSCORES")]
            stamps = {int(s): float(score) for s, score in zip(flat[0::2], flat[1::2], strict=True)}
            ordered = [stamps[seq] for seq in sorted(stamps)]
        state = self.keys.session(app_name, user_id, session_id)[4]
        (items,) = yield [("HGETALL", state)]
        return SessionCopy.of_record(
            record,
            [(key, value) for key, value in _pairs(items)],
            [event_copy(e, t) for e, t in zip(loaded.events, ordered, strict=True)],
        )

    def write_app_state(self, app_name: str, items: Items) -> Plan[None]:
        flat = [x for item in items for x in item]
        commands: list[Command] = [("SADD", self.keys.apps, app_name)]
        if flat:
            commands.append(("HSET", self.keys.app(app_name)[0], *flat))
        yield commands

    def write_user_state(self, app_name: str, user_id: str, items: Items) -> Plan[None]:
        flat = [x for item in items for x in item]
        touch = ("ZINCRBY", self.keys.app(app_name)[2], 1, user_id)
        first: list[Command] = [touch]
        if flat:
            first.append(("HSET", self.keys.user(app_name, user_id)[0], *flat))
        yield from self._in_order(first, [touch, ("SADD", self.keys.apps, app_name)])

    def _in_order(self, first: list[Command], then: list[Command]) -> Plan[list[Any]]:
        """Send ``then`` after ``first`` has run: one pipeline on a server, two on a cluster.

        A cluster pipeline runs each node's commands apart, in no order between nodes.
        """
        if not self.cluster:
            return (yield [*first, *then])
        replies = yield first
        return replies + (yield then)

    def read_app(self, app_name: str) -> Plan[dict[str, Any]]:
        (reply,) = yield [("HGETALL", self.keys.app(app_name)[0])]
        return decode_values(_pairs(reply))

    def read_user(self, app_name: str, user_id: str) -> Plan[dict[str, Any]]:
        (reply,) = yield [("HGETALL", self.keys.user(app_name, user_id)[0])]
        return decode_values(_pairs(reply))

    def check_format(self, create: bool = True) -> Plan[None]:
        """Check the store's format record; write it first when there is none and ``create``."""
        header = pack({"magic": MAGIC, "format": FORMAT_VERSION})
        # Read first: a read-only replica can open a store that exists.
        (stored,) = yield [("GET", self.keys.format)]
        if stored is None and not create:
            raise StoreNotFoundError(
                f"no sessionscope store under prefix {self.settings.prefix!r}",
                hint="check the URI's prefix= and database number; reading never creates "
                "a store, the first service that writes to it does",
            )
        if stored is None:
            _, stored = yield [("SETNX", self.keys.format, header), ("GET", self.keys.format)]
        if stored == header:
            return
        try:
            fields = unpack(stored)
        except Exception:
            fields = None
        if not isinstance(fields, dict) or fields.get("magic") != MAGIC:
            raise IncompatibleStoreError(
                f"{self.keys.format!r} holds something else",
                hint="pick another prefix= for this store",
            )
        version = fields.get("format")
        if not isinstance(version, int) or version > FORMAT_VERSION or version < 1:
            raise IncompatibleStoreError(
                f"the store under prefix {self.settings.prefix!r} has format {version}; "
                f"this version reads up to {FORMAT_VERSION}",
                hint="upgrade sessionscope",
            )
        if version == 1:
            # Clients of format 1 may still share it: they know only the sorted set.
            self.times_layout = "0"

    def noop(self) -> Plan[None]:
        """One FCALL of a function that does nothing (a benchmark's baseline)."""
        yield [("FCALL_RO", _FN + "noop", 0)]


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


def _failure(error: BaseException, where: str) -> StoreError:
    """Return the StoreError a caller sees for a Redis failure."""
    if isinstance(error, redis.exceptions.TimeoutError):
        hint = f"{where} did not answer in time: check that it runs and is not overloaded"
    elif isinstance(error, redis.exceptions.ConnectionError):
        hint = f"cannot reach {where}: check that redis-server runs and the URI is right"
    elif _out_of_memory(error):
        # (redis-py's OutOfMemoryError drops the reply's "OOM" prefix.)
        failure = StoreError(
            f"Redis is out of memory: {redact(str(error))}",
            hint="raise the server's maxmemory or free space, then retry (events already "
            "stored answer as repeats); keep maxmemory-policy noeviction, so that nothing "
            "stored is evicted",
        )
        failure.__cause__ = error
        return failure
    elif isinstance(error, redis.exceptions.RedisClusterException):
        hint = (
            f"no cluster at {where}: check that the nodes run with cluster-enabled yes "
            "and that the URI names them (redis:// for a single server)"
        )
    else:
        hint = "the server refused the command; what was stored before is intact"
    failure = StoreError(f"Redis failed: {redact(str(error))}", hint=hint)
    failure.__cause__ = error
    return failure


def _missing(where: str, what: str) -> CorruptStoreError:
    """Return the error of a read that found part of a session gone (never a partial session)."""
    return CorruptStoreError(
        f"{where} is missing {what}",
        hint="Redis dropped part of the session, as a server does whose maxmemory-policy "
        "is not noeviction (see docs/redis.md): delete the session or restore it from a copy",
    )


def _policy_of(client: Any) -> str | None:
    """Return a server's maxmemory-policy, None when neither CONFIG nor INFO tells it.

    CONFIG may be renamed or refused by an ACL; INFO memory carries the same setting.
    """
    try:
        found = client.config_get("maxmemory-policy").get("maxmemory-policy")
    except redis.exceptions.ResponseError:
        found = None
    if found is None:
        try:
            found = client.info("memory").get("maxmemory_policy")
        except redis.exceptions.ResponseError:
            return None
    return _text(found)


def _out_of_memory(error: BaseException) -> bool:
    return isinstance(error, redis.exceptions.OutOfMemoryError) or (
        isinstance(error, redis.exceptions.ResponseError) and str(error).startswith("OOM")
    )


def _missing_library(replies: Iterable[Any]) -> bool:
    return any(_not_found(r) for r in replies)


def _not_found(reply: Any) -> bool:
    return isinstance(reply, redis.exceptions.ResponseError) and "Function not found" in str(reply)


class _Tolerant(list[Command]):
    """Commands of a plan that takes their error replies itself (a bulk append's calls).

    The runner hands each error reply back in its place as the StoreError a
    caller sees, and a call the server did not run for want of the function
    library as ``_RELOADED``, after loading the library: the plan sends
    again only what did not run. Other plans get the first error raised,
    and every command sent again after a load (each is idempotent).
    """


# In place of a reply to a call that found no function library (see _Tolerant).
_RELOADED = object()


def _tolerated(replies: list[Any], reloaded: bool, where: str) -> list[Any]:
    """Return the replies of ``_Tolerant`` commands as the plan takes them."""
    return [
        _RELOADED if reloaded and _not_found(reply)
        else _failure(reply, where) if isinstance(reply, redis.exceptions.RedisError)
        else reply
        for reply in replies
    ]  # fmt: skip


class _LoggedBackoff(ExponentialBackoff):
    """redis-py's exponential backoff, logging each retry (it is asked before each one)."""

    def __init__(self, where: str) -> None:
        super().__init__(cap=0.2, base=0.02)
        self.where = where

    def compute(self, failures: int) -> float:
        _log.info("lost the connection to the Redis server at %s: retrying", self.where)
        return super().compute(failures)


def _retry(where: str) -> Retry:
    # A lost connection is retried once: every command a plan sends is
    # idempotent (appends by event id, creates by session number). A timeout
    # is not: a server that did not answer in ``timeout`` (stopped, or
    # overloaded) would only make the caller wait a second full timeout.
    return Retry(
        _LoggedBackoff(where),
        retries=1,
        supported_errors=(redis.exceptions.ConnectionError,),
    )


class _SyncRunner:
    """Run plans on a sync client."""

    def __init__(self, client: Any, where: str, cluster: bool) -> None:
        self.client = client
        self.where = where
        self.cluster = cluster

    def run(self, plan: Plan[T]) -> T:
        try:
            commands = next(plan)
            while True:
                try:
                    replies = self._execute(commands)
                except StoreError as error:
                    # Raised where the plan waits: a bulk append keeps what it took.
                    commands = plan.throw(error)
                else:
                    commands = plan.send(replies)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]

    def _execute(self, commands: list[Command]) -> list[Any]:
        try:
            replies = self._send(commands)
            reloaded = _missing_library(replies)
            if reloaded:
                self.load_library()
                if type(commands) is not _Tolerant:
                    replies = self._send(commands)
        except _REDIS_ERRORS as error:
            raise _failure(error, self.where) from error
        if type(commands) is _Tolerant:
            return _tolerated(replies, reloaded, self.where)
        for reply in replies:
            if isinstance(reply, redis.exceptions.RedisError):
                raise _failure(reply, self.where) from reply
        return replies

    def _send(self, commands: list[Command]) -> list[Any]:
        if len(commands) == 1:
            try:
                return [self.client.execute_command(*commands[0])]
            except redis.exceptions.ResponseError as error:
                return [error]
        pipe = self.client.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        return list(pipe.execute(raise_on_error=False))

    def load_library(self) -> None:
        _log.info("loading sessionscope's functions on %s (new, restarted or flushed)", self.where)
        code = _library_code()
        if self.cluster:
            self.client.execute_command(
                "FUNCTION LOAD", "REPLACE", code, target_nodes=self.client.PRIMARIES
            )
        else:
            self.client.execute_command("FUNCTION LOAD", "REPLACE", code)


class _AsyncRunner:
    """Run plans on an asyncio client."""

    def __init__(self, client: Any, where: str, cluster: bool) -> None:
        self.client = client
        self.where = where
        self.cluster = cluster

    async def run(self, plan: Plan[T]) -> T:
        try:
            commands = next(plan)
            while True:
                try:
                    replies = await self._execute(commands)
                except StoreError as error:
                    # Raised where the plan waits: a bulk append keeps what it took.
                    commands = plan.throw(error)
                else:
                    commands = plan.send(replies)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]

    async def _execute(self, commands: list[Command]) -> list[Any]:
        try:
            replies = await self._send(commands)
            reloaded = _missing_library(replies)
            if reloaded:
                await self.load_library()
                if type(commands) is not _Tolerant:
                    replies = await self._send(commands)
        except _REDIS_ERRORS as error:
            raise _failure(error, self.where) from error
        except OSError as error:
            raise _failure(redis.exceptions.ConnectionError(str(error)), self.where) from error
        if type(commands) is _Tolerant:
            return _tolerated(replies, reloaded, self.where)
        for reply in replies:
            if isinstance(reply, redis.exceptions.RedisError):
                raise _failure(reply, self.where) from reply
        return replies

    async def _send(self, commands: list[Command]) -> list[Any]:
        if len(commands) == 1:
            try:
                return [await self.client.execute_command(*commands[0])]
            except redis.exceptions.ResponseError as error:
                return [error]
        pipe = self.client.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        return list(await pipe.execute(raise_on_error=False))

    async def load_library(self) -> None:
        _log.info("loading sessionscope's functions on %s (new, restarted or flushed)", self.where)
        code = _library_code()
        if self.cluster:
            await self.client.execute_command(
                "FUNCTION LOAD", "REPLACE", code, target_nodes=self.client.PRIMARIES
            )
        else:
            await self.client.execute_command("FUNCTION LOAD", "REPLACE", code)


def _batch_plan(batch: AppendBatch, ops: _Operations) -> Plan[BatchResult]:
    """Append a batch (``append_many`` of the ops); sum up what it did."""
    tally = yield from ops.append_many(batch)
    return tally.result()


class _Shielded(Awaitable[T]):
    """A write running as its own task: awaiting it again after a cancellation is safe."""

    __slots__ = ("_task",)

    def __init__(self, task: asyncio.Task[T]) -> None:
        self._task = task

    def __await__(self) -> Generator[Any, None, T]:
        return asyncio.shield(self._task).__await__()


async def _close_with_loop(client: Any) -> Any:
    """An async generator the loop finalizes at shutdown: it closes the loop's client."""
    try:
        yield None
    finally:
        await client.aclose()


class _HiredisPacking:
    """Pack commands with hiredis in C, in one call.

    redis-py's asyncio connections pack in Python, one call per argument, and
    its sync ones walk the arguments in Python before hiredis packs them: for
    an append of thirty arguments (thousands in a bulk call) that costs more
    than the server's work. An asyncio connection packs through its public
    ``pack_command``; a sync one takes a ``command_packer`` (``_CPacker``).
    """

    def pack_command(self, *args: Any) -> list[bytes]:
        return _pack_in_c(*args)


def _pack_in_c(*args: Any) -> list[bytes]:
    if isinstance(args[0], str):
        args = (*args[0].encode().split(), *args[1:])
    return [hiredis.pack_command(args)]


class _CPacker:
    """The command packer of a sync connection: hiredis, in one call."""

    __slots__ = ()
    pack = staticmethod(_pack_in_c)


def _packing_in_c(connection_class: type) -> type:
    """Return ``connection_class`` packing with hiredis (itself without hiredis)."""
    if hiredis is None:
        return connection_class
    return type(f"Hiredis{connection_class.__name__}", (_HiredisPacking, connection_class), {})


# What a sync connection packs with: redis-py's public command_packer argument.
_SYNC_PACKING: dict[str, Any] = {} if hiredis is None else {"command_packer": _CPacker()}


def _async_pool(url: str, options: dict[str, Any]) -> Any:
    """Return an asyncio connection pool for ``url``, its connections packing with hiredis.

    Made as ``ConnectionPool.from_url`` makes it (the URL's options win over
    ``options``), with the URL's connection class (TCP, TLS or Unix socket)
    given at creation.
    """
    settings = {**options, **redis.asyncio.connection.parse_url(url)}
    base = settings.pop("connection_class", redis.asyncio.Connection)
    return redis.asyncio.ConnectionPool(connection_class=_packing_in_c(base), **settings)


class _AsyncRedisStore:
    """The async face of a RedisStore: one asyncio client per running event loop."""

    def __init__(self, store: RedisStore) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._runners: dict[asyncio.AbstractEventLoop, tuple[_AsyncRunner, Any]] = {}

    async def _runner(self) -> _AsyncRunner:
        self._store._check_open()
        loop = asyncio.get_running_loop()
        # The usual case, without the lock: a dict read is atomic.
        known = self._runners.get(loop)
        if known is not None:
            return known[0]
        with self._lock:
            found = self._runners.get(loop)
            # Clients of loops that have closed were closed with them.
            for other in [lp for lp in self._runners if lp.is_closed()]:
                del self._runners[other]
        if found is not None:
            return found[0]
        client = self._store._new_client(asynchronous=True)
        if self._store.cluster:
            # Its first command would find the nodes: find them here, so that
            # a cluster that is not there is a StoreError like any other.
            try:
                await client.initialize()
            except (*_REDIS_ERRORS, OSError) as error:
                await client.aclose()
                raise _failure(error, self._store.where) from error
        runner = _AsyncRunner(client, self._store.where, self._store.cluster)
        # asyncio.run finalizes live async generators before closing its
        # loop: this one closes the client there, inside the loop.
        guard = _close_with_loop(client)
        await guard.__anext__()
        with self._lock:
            self._runners[loop] = (runner, guard)
        return runner

    async def _run(self, make: Callable[[], Plan[T]]) -> T:
        runner = await self._runner()
        return await runner.run(make())

    def _write(self, make: Callable[[], Plan[T]]) -> _Shielded[T]:
        return _Shielded(asyncio.get_running_loop().create_task(self._run(make)))

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
        ops = self._store._ops
        return self._write(
            lambda: ops.create(
                app_name, user_id, session_id, create_time, app_items, user_items, session_items
            )
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
        ops = self._store._ops
        return await self._run(
            lambda: ops.load(app_name, user_id, session_id, num_recent_events, after_timestamp)
        )

    async def read_events(
        self, app_name: str, user_id: str, session_id: str, start: int, limit: int
    ) -> EventPage | None:
        """Return a page of a session's events; see ``Store.read_events``."""
        ops = self._store._ops
        return await self._run(lambda: ops.read_events(app_name, user_id, session_id, start, limit))

    async def list_sessions(self, app_name: str, user_id: str | None) -> list[SessionRecord]:
        """Return session records; see ``Store.list_sessions``."""
        return await self._run(lambda: self._store._ops.list_records(app_name, user_id))

    async def list_page(
        self,
        app_name: str,
        user_id: str | None,
        limit: int | None,
        after: ListPosition | None,
    ) -> tuple[list[SessionRecord], bool]:
        """Return one page of sessions; see ``Store.list_page`` (from the listing indexes)."""
        if limit is None:
            return page_records(await self.list_sessions(app_name, user_id), None, after)
        return await self._run(lambda: self._store._ops.page(app_name, user_id, limit, after))

    def delete_session(self, app_name: str, user_id: str, session_id: str) -> Awaitable[None]:
        """Remove a session; see ``Store.delete_session``."""
        return self._write(lambda: self._store._ops.delete(app_name, user_id, session_id))

    def append(self, request: AppendRequest) -> Awaitable[AppendResult]:
        """Append one event; see ``Store.append``."""
        return self._write(lambda: self._store._ops.append(request))

    def append_many(self, batch: AppendBatch) -> Awaitable[BatchResult]:
        """Append a batch; see ``Store.append_many``."""
        return self._write(lambda: _batch_plan(batch, self._store._ops))

    async def read_app_state(self, app_name: str) -> dict[str, Any]:
        """Return the app map; see ``Store.read_app_state``."""
        return await self._run(lambda: self._store._ops.read_app(app_name))

    async def read_user_state(self, app_name: str, user_id: str) -> dict[str, Any]:
        """Return the user map; see ``Store.read_user_state``."""
        return await self._run(lambda: self._store._ops.read_user(app_name, user_id))

    async def noop(self) -> None:
        """Make one FCALL of a function that does nothing (a benchmark's baseline)."""
        await self._run(self._store._ops.noop)

    async def truncate_events(
        self,
        app_name: str,
        user_id: str,
        session_id: str,
        before: float | None,
        keep_last: int | None,
    ) -> int:
        """Remove old events of a session; see ``Store.truncate_events``."""
        ops = self._store._ops
        return await self._write(
            lambda: ops.truncate(app_name, user_id, session_id, before, keep_last)
        )

    async def expire_sessions(self, app_name: str | None, idle_before: float) -> int:
        """Delete idle sessions; see ``Store.expire_sessions``."""
        return await self._write(lambda: self._store._ops.expire(app_name, idle_before))

    async def delete_user(self, app_name: str, user_id: str) -> int:
        """Delete a user's sessions and state; see ``Store.delete_user``."""
        return await self._write(lambda: self._store._ops.delete_user(app_name, user_id))

    async def delete_app(self, app_name: str) -> int:
        """Delete everything of an app; see ``Store.delete_app``."""
        return await self._write(lambda: self._store._ops.delete_app(app_name))

    async def list_apps(self) -> list[str]:
        """Return the apps of the store; see ``Store.list_apps``."""
        return await self._run(self._store._ops.list_apps)

    async def list_users(self, app_name: str) -> list[str]:
        """Return the users of an app; see ``Store.list_users``."""
        return await self._run(lambda: self._store._ops.list_users(app_name))

    async def restore_session(self, copy: SessionCopy) -> bool:
        """Write a whole session as given; see ``Store.restore_session``."""
        return await self._write(lambda: self._store._ops.restore(copy))

    async def write_app_state(self, app_name: str, items: Items) -> None:
        """Set keys of the app map; see ``Store.write_app_state``."""
        await self._write(lambda: self._store._ops.write_app_state(app_name, items))

    async def write_user_state(self, app_name: str, user_id: str, items: Items) -> None:
        """Set keys of a user map; see ``Store.write_user_state``."""
        await self._write(lambda: self._store._ops.write_user_state(app_name, user_id, items))

    async def flush(self) -> None:
        """Return: every acknowledged write is as durable as the server's settings make it."""
        self._store._check_open()

    async def close(self) -> None:
        """Close this loop's client, then the store."""
        loop = asyncio.get_running_loop()
        with self._lock:
            found = self._runners.pop(loop, None)
        if found is not None:
            await found[1].aclose()
        self._store.close()

    def _forget(self) -> None:
        with self._lock:
            self._runners.clear()


class RedisStore:
    """Sessions on a Redis 7 server or cluster, shared by every process that opens it.

    ``url`` is a ``redis://`` or ``rediss://`` URL for one server; ``cluster``
    lists ``(host, port)`` startup nodes of a Redis Cluster instead, and
    ``username`` / ``password`` its credentials (a URL carries its own). Options:
    ``prefix`` keeps stores apart on one server, ``ttl`` (seconds) expires a
    session idle that long, ``wait`` makes every write wait for that many
    replicas, ``timeout`` bounds every network wait. ``create=False`` refuses
    a prefix that holds no store (``StoreNotFoundError``) and writes nothing.

    A server (on a cluster, any primary) whose ``maxmemory-policy`` is not
    ``noeviction`` may drop a session's keys on its own: it is refused with
    ``UnsafeStoreError`` unless ``allow_eviction=True``, which logs a warning.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        cluster: list[tuple[str, int]] | None = None,
        prefix: str = "sessionscope",
        ttl: int | None = None,
        wait: int = 0,
        timeout: float = 5.0,
        ssl: bool = False,
        session_ttl: float | None = None,
        username: str | None = None,
        password: str | None = None,
        create: bool = True,
        allow_eviction: bool = False,
    ) -> None:
        session_ttl = check_ttl(session_ttl)
        if (url is None) == (cluster is None):
            raise ValueError("give either url (one server) or cluster (startup nodes)")
        if not isinstance(prefix, str) or not prefix or "{" in prefix or "}" in prefix:
            raise ValueError(f"prefix must be a non-empty str without braces, not {prefix!r}")
        if ttl is not None and (not isinstance(ttl, int) or ttl <= 0):
            raise ValueError(f"ttl must be a positive number of seconds, not {ttl!r}")
        if not isinstance(wait, int) or wait < 0:
            raise ValueError(f"wait must be a number of replicas (>= 0), not {wait!r}")
        if cluster is not None and wait:
            raise ValueError("wait= needs one server: a cluster write goes to several")
        if url is not None and (username is not None or password is not None):
            raise ValueError("give a server's credentials in its URL: redis://user:password@host")
        if not timeout > 0:
            raise ValueError(f"timeout must be positive, not {timeout!r}")
        self.url = url
        self.nodes = cluster
        self.cluster = cluster is not None
        self.ssl = ssl
        self._allow_eviction = allow_eviction
        # A cluster's credentials, handed to every node (a URL carries a server's).
        self._credentials: dict[str, Any] = (
            {"username": username, "password": password} if cluster else {}
        )
        # Where the store is, as messages and logs show it: without a password.
        self.where = (
            redact(url) if url is not None else ",".join(f"{h}:{p}" for h, p in cluster or [])
        )
        self._settings = _Settings(prefix, ttl or 0, wait, timeout, self.cluster)
        self._ops = _Operations(self._settings)
        self._closed = False
        self._client = self._new_client(asynchronous=False)
        self._sync = _SyncRunner(self._client, self.where, self.cluster)
        self.aio = _AsyncRedisStore(self)
        try:
            self._check_policy(allow_eviction)
            self._sync.run(self._ops.check_format(create))
        except BaseException:
            self._client.close()
            raise
        # session_ttl expires by last update time (the event timestamps), like
        # the other stores; ttl= is Redis's own expiry, by idle wall-clock time.
        self.session_ttl = session_ttl
        self._expirer = Expirer(self, session_ttl) if session_ttl is not None else None
        if self._expirer is not None:
            self._expirer.start()

    def __repr__(self) -> str:
        return f"RedisStore({self.uri!r})"

    def _check_policy(self, allow_eviction: bool) -> None:
        """Refuse a server (any primary of a cluster) that may evict keys; see the class doc."""
        client = self._client
        try:
            servers = (
                [
                    (f"{n.host}:{n.port}", client.get_redis_connection(n))
                    for n in client.get_primaries()
                ]
                if self.cluster
                else [(self.where, client)]
            )
            policies = [(where, _policy_of(server)) for where, server in servers]
        except _REDIS_ERRORS as error:
            raise _failure(error, self.where) from error
        unsafe = [(where, policy) for where, policy in policies if policy != _SAFE_POLICY]
        if not unsafe:
            return
        where, policy = unsafe[0]
        said = "an unknown maxmemory-policy" if policy is None else f"maxmemory-policy {policy}"
        message = f"the Redis server at {where} has {said}: it may evict sessions' keys"
        if not allow_eviction:
            raise UnsafeStoreError(
                message,
                hint="set maxmemory-policy noeviction on the server (see docs/redis.md), or "
                "accept lost sessions with ?allow_eviction=true (allow_eviction=True)",
            )
        _log.warning("%s; opened all the same (allow_eviction)", message)

    @property
    def prefix(self) -> str:
        return self._settings.prefix

    @property
    def uri(self) -> str:
        """Return the URI ``open_store`` takes to open this store again, its password as ``***``.

        (A URI is shown in messages and logs: give the password again to reopen.)
        """
        options = f"prefix={self.prefix}"
        if self._settings.ttl:
            options += f"&ttl={self._settings.ttl}"
        if self._settings.wait:
            options += f"&wait={self._settings.wait}"
        if self._allow_eviction:
            options += "&allow_eviction=true"
        if self.url is not None:
            # The URL keeps redis-py's own settings (TLS) in its query.
            return f"{self.where}{'&' if '?' in self.where else '?'}{options}"
        user = quote(self._credentials.get("username") or "", safe="")
        login = f"{user}:***@" if self._credentials.get("password") else ""
        login = login or (f"{user}@" if user else "")
        return f"redis+cluster://{login}{self.where}?{options}"

    def _new_client(self, asynchronous: bool) -> Any:
        timeout = self._settings.timeout
        common: dict[str, Any] = {
            "socket_timeout": timeout,
            "socket_connect_timeout": timeout,
            "retry": _retry(self.where),
            "protocol": 2,
        }
        if self.url is not None:
            if asynchronous:
                return redis.asyncio.Redis.from_pool(_async_pool(self.url, common))
            return redis.Redis.from_url(self.url, **common, **_SYNC_PACKING)
        if asynchronous:
            # (The async cluster client takes no connection class: it packs in Python.)
            nodes = [redis.asyncio.cluster.ClusterNode(h, p) for h, p in self.nodes or []]
            return redis.asyncio.cluster.RedisCluster(
                startup_nodes=nodes, ssl=self.ssl, **self._credentials, **common
            )
        sync_nodes = [
            redis.cluster.ClusterNode(h, p)  # type: ignore[no-untyped-call]
            for h, p in self.nodes or []
        ]
        try:
            return redis.cluster.RedisCluster(
                startup_nodes=sync_nodes, ssl=self.ssl, **self._credentials, **common
            )
        except _REDIS_ERRORS as error:
            raise _failure(error, self.where) from error

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError("the Redis store is closed", hint="open it again")

    def _run(self, plan: Plan[T]) -> T:
        self._check_open()
        return self._sync.run(plan)

    def _write(self, plan: Plan[T]) -> Completion[T]:
        self._check_open()
        try:
            return Completion.done(self._sync.run(plan))
        except Exception as error:  # handed to the caller
            return Completion.failed(error)

    # -- the Store protocol ----------------------------------------------

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
        """Store a new session and return it with the shared maps merged in."""
        return self._write(
            self._ops.create(
                app_name, user_id, session_id, create_time, app_items, user_items, session_items
            )
        )

    def load_session(
        self,
        app_name: str,
        user_id: str,
        session_id: str,
        num_recent_events: int | None,
        after_timestamp: float | None,
    ) -> LoadedSession | None:
        """Read a session with the events the filters select, in append order."""
        return self._run(
            self._ops.load(app_name, user_id, session_id, num_recent_events, after_timestamp)
        )

    def read_events(
        self, app_name: str, user_id: str, session_id: str, start: int, limit: int
    ) -> EventPage | None:
        """Return a session's record and up to ``limit`` events from position ``start``."""
        return self._run(self._ops.read_events(app_name, user_id, session_id, start, limit))

    def list_sessions(self, app_name: str, user_id: str | None) -> list[SessionRecord]:
        """Return the records of an app's (or one user's) sessions."""
        return self._run(self._ops.list_records(app_name, user_id))

    def list_page(
        self,
        app_name: str,
        user_id: str | None,
        limit: int | None,
        after: ListPosition | None,
    ) -> tuple[list[SessionRecord], bool]:
        """Return one page of sessions; see ``Store.list_page``.

        A page reads the users' listing indexes and the records it returns
        (``_Operations.page``); no limit reads the whole listing.
        """
        if limit is None:
            return page_records(self.list_sessions(app_name, user_id), None, after)
        return self._run(self._ops.page(app_name, user_id, limit, after))

    def delete_session(self, app_name: str, user_id: str, session_id: str) -> Completion[None]:
        """Remove a session with its state and events; a missing one is a no-op."""
        return self._write(self._ops.delete(app_name, user_id, session_id))

    def append(self, request: AppendRequest) -> Completion[AppendResult]:
        """Append one event and apply its packed delta, all or nothing, in one FCALL."""
        return self._write(self._ops.append(request))

    def append_many(self, batch: AppendBatch) -> Completion[BatchResult]:
        """Append a batch, pipelined; stop at the first refused request."""
        self._check_open()
        try:
            return Completion.done(self._sync.run(_batch_plan(batch, self._ops)))
        except Exception as error:  # a network failure stops the batch too
            return Completion.done(result_of_batch(batch, [], error))

    def append_many_reading(
        self, batch: AppendBatch, reads: list[BatchRead]
    ) -> tuple[BatchResult, list[LoadedSession | None]]:
        """Append a batch, as ``append_many``, and answer reads placed between its events.

        Each read ``(position, app, user, session id, num_recent_events,
        after_timestamp)`` is answered as ``load_session`` would answer it
        once the batch's first ``position`` events are stored, and before
        the others are: a replay that reads between appends keeps its
        batches whole. On one server the reads travel inside the batch's
        calls (a cluster takes a step per read). A refused event stops the
        batch as in ``append_many``; the reads placed after it are not
        answered.
        """
        self._check_open()
        try:
            tally, loaded = self._sync.run(self._ops.append_many_reading(batch, reads))
        except Exception as error:  # a network failure stops the batch too
            return result_of_batch(batch, [], error), []
        return tally.result(), loaded

    def read_app_state(self, app_name: str) -> dict[str, Any]:
        """Return the app map, keys without prefix."""
        return self._run(self._ops.read_app(app_name))

    def read_user_state(self, app_name: str, user_id: str) -> dict[str, Any]:
        """Return the user map, keys without prefix."""
        return self._run(self._ops.read_user(app_name, user_id))

    def noop(self) -> None:
        """Make one FCALL of a function that does nothing (a benchmark's baseline)."""
        self._run(self._ops.noop())

    # -- retention and copies --------------------------------------------

    def truncate_events(
        self,
        app_name: str,
        user_id: str,
        session_id: str,
        before: float | None,
        keep_last: int | None,
    ) -> Completion[int]:
        """Remove events with ``timestamp < before``, or all but the last ``keep_last``."""
        return self._write(self._ops.truncate(app_name, user_id, session_id, before, keep_last))

    def expire_sessions(self, app_name: str | None, idle_before: float) -> Completion[int]:
        """Delete the sessions whose last update is before ``idle_before``."""
        return self._write(self._ops.expire(app_name, idle_before))

    def delete_user(self, app_name: str, user_id: str) -> Completion[int]:
        """Delete every session of a user and the user's state map."""
        return self._write(self._ops.delete_user(app_name, user_id))

    def delete_app(self, app_name: str) -> Completion[int]:
        """Delete every session, user map and the app map of an app."""
        return self._write(self._ops.delete_app(app_name))

    def list_apps(self) -> list[str]:
        """Return the apps that have a session, app state or user state, sorted."""
        return self._run(self._ops.list_apps())

    def list_users(self, app_name: str) -> list[str]:
        """Return the users of an app that have a session or user state, sorted."""
        return self._run(self._ops.list_users(app_name))

    def restore_session(self, copy: SessionCopy) -> Completion[bool]:
        """Write a whole session as given; False when an equal one is stored."""
        return self._write(self._ops.restore(copy))

    def write_app_state(self, app_name: str, items: Items) -> Completion[None]:
        """Set keys of the app map, leaving other keys as they are."""
        return self._write(self._ops.write_app_state(app_name, items))

    def write_user_state(self, app_name: str, user_id: str, items: Items) -> Completion[None]:
        """Set keys of a user map, leaving other keys as they are."""
        return self._write(self._ops.write_user_state(app_name, user_id, items))

    def destroy(self) -> int:
        """Delete every key under this store's prefix (on every node); return how many.

        For benchmarks and tests that share a server; not part of the Store protocol.
        """
        self._check_open()
        pattern = self._ops.keys.base + b"*"
        client = self._client
        deleted = 0
        try:
            nodes = client.get_primaries() if self.cluster else [None]
            for node in nodes:
                scan = (
                    client.scan_iter(match=pattern, count=1000, target_nodes=node)
                    if node is not None
                    else client.scan_iter(match=pattern, count=1000)
                )
                keys = list(scan)
                for start in range(0, len(keys), 500):
                    pipe = client.pipeline(transaction=False)
                    for key in keys[start : start + 500]:
                        pipe.delete(key)
                    deleted += sum(pipe.execute())
        except _REDIS_ERRORS as error:
            raise _failure(error, self.where) from error
        finally:
            self.close()
        return deleted

    def flush(self) -> Completion[None]:
        """Return at once: a write is as durable as the server's appendfsync makes it."""
        self._check_open()
        return Completion.done(None)

    def close(self) -> None:
        """Release the connections; later calls raise StoreClosedError."""
        if self._closed:
            return
        if self._expirer is not None:
            self._expirer.stop()
        self._closed = True
        self.aio._forget()
        self._client.close()
