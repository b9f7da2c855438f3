"""Plans of sessions and state maps: create, load, read events, list, page, delete, restore.

Each plan is a generator (see ``common``); ``store`` runs it on a sync or
an asyncio client.
"""

from __future__ import annotations

import secrets
import struct
from typing import Any

from ...codec import decode_values, pack, unpack
from ...errors import (
    AlreadyExistsError,
    IncompatibleStoreError,
    StoreError,
    StoreNotFoundError,
)
from ..records import (
    EventPage,
    Items,
    ListPosition,
    LoadedSession,
    SessionCopy,
    SessionRecord,
    copies_equal,
    event_copy,
)
from ..rules import check_copy, list_position
from .common import (
    _FN,
    _RECORD_FIELDS,
    FORMAT_VERSION,
    MAGIC,
    Command,
    Plan,
    PlanBase,
    _index_range,
    _missing,
    _number_text,
    _pack_items,
    _pairs,
    _record,
)

# An event time in a session's time string (see functions.lua).
# How often a session copy is read again when a write lands between its reads.
_COPY_TRIES = 5
_DOUBLE = struct.Struct(">d")


# The most entries a read of a listing index asks for (Redis's own bound is 2**63 - 1).
_MOST_ENTRIES = 2**62


def _where(app_name: str, user_id: str, session_id: str) -> str:
    """Name a session in an error (made only for an error: every read would pay for it)."""
    return f"session {session_id!r} of user {user_id!r} in app {app_name!r}"


class SessionPlans(PlanBase):
    """The plans of sessions, their listing and the state maps."""

    def _users(self, app_name: str) -> Plan[list[str]]:
        """Return the users in an app's directory."""
        (members,) = yield [("ZRANGE", self.keys.app(app_name)[2], 0, -1)]
        return [member.decode() for member in members]

    def _apps(self) -> Plan[list[str]]:
        (members,) = yield [("SMEMBERS", self.keys.apps)]
        return sorted(member.decode() for member in members)

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
        directory = keys.app(app_name)[2]
        # Names this create, so that a retry after a lost reply is known as one.
        token = secrets.token_hex(8)
        fkeys = [rec, state, ustate, index, pend, counter, *self.topology.app_keys(app_name)]
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
        replies = yield from self.topology.in_order(
            [touch, create, known], [touch, *self._app_upkeep(app_name), *self._waits()]
        )
        if self.settings.wait:
            self._check_wait(replies[-1])
        reply = replies[1]
        if reply is None:
            raise AlreadyExistsError(f"session {session_id!r} already exists")
        fields, sstate, ustate_reply, astate, pending = reply
        astate = yield from self.topology.created_app_map(app_name, user_id, pending, astate)
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
        replies = yield self.topology.load_commands(call, app_name)
        beside = replies[1] if len(replies) > 1 else None
        return (yield from self._loaded(app_name, user_id, session_id, replies[0], beside))

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
        fkeys = [rec, events, times, state, positions, ustate, pend]
        fkeys += self.topology.app_keys(app_name)
        args = [
            "" if num_recent_events is None else num_recent_events,
            "" if after_timestamp is None else _number_text(after_timestamp),
        ]
        return ("FCALL_RO", _FN + "load", len(fkeys), *fkeys, *args)

    def _loaded(
        self, app_name: str, user_id: str, session_id: str, reply: Any, beside: Any
    ) -> Plan[LoadedSession | None]:
        """Decode a load reply; on a cluster, finish pending app deltas and read the app map.

        ``beside`` is the app map read beside the call (cluster only).
        """
        if reply is None:
            return None
        if type(reply) is bytes:
            # The load function found keys of a session whose part it names is gone.
            raise _missing(_where(app_name, user_id, session_id), "its " + reply.decode())
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
            raise _missing(
                _where(app_name, user_id, session_id),
                f"{gone} of the {len(event_list)} event records read",
            )
        astate = yield from self.topology.loaded_app_map(
            app_name, user_id, pending, astate_reply, beside
        )
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
        # Redis takes a LIMIT count up to 2**63 - 1; no index holds that many.
        count = min(limit + 1, _MOST_ENTRIES)
        reads: list[Command] = []
        for user in users:
            index = keys.user(app_name, user)[1]
            if after is None:
                reads.append(_index_range(index, "-inf", count))
                continue
            stamp, after_user, after_sid = after
            # A later user's sessions at the position's time come after it; an
            # earlier user's do not.
            low = repr(stamp) if user > after_user else f"({stamp!r}"
            reads.append(_index_range(index, low, count))
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
            # Touched before and after, as a create does (see ``create``).
            replies = yield from self.topology.in_order(
                [touch, call], [touch, ("SADD", self.keys.apps, app)]
            )
            if replies[1]:
                return True
            stored = yield from self._copy_of(app, user, sid)
        if stored is not None and copies_equal(stored, copy):
            return False
        raise AlreadyExistsError(f"session {sid!r} already exists with other content")

    def _copy_of(self, app_name: str, user_id: str, session_id: str) -> Plan[SessionCopy | None]:
        """Return the stored session as a copy (times exact, events with their times).

        What ``restore`` compares its copy with. The session, its times and
        its state are read in separate round trips: a write between them (an
        append, a truncation) is seen as a record that moved, and the copy is
        read again. A session that moves at every read is not the copy,
        which is one state of it at most: AlreadyExistsError, as for a
        session stored with other content.
        """
        keys = self.keys.session(app_name, user_id, session_id)
        for _ in range(_COPY_TRIES):
            loaded = yield from self.load(app_name, user_id, session_id, None, None)
            if loaded is None:
                return None
            record = loaded.record
            (kind,) = yield [("TYPE", keys[3])]
            if kind in (b"string", "string"):
                # Times in order: the stored positions run from the removed count on.
                (raw,) = yield [("GETRANGE", keys[3], 8 * record.removed_count, -1)]
                ordered = [stamp for (stamp,) in _DOUBLE.iter_unpack(raw)]
            else:
                (flat,) = yield [("ZRANGE", keys[3], 0, -1, "WITHSCORES")]
                pairs = zip(flat[0::2], flat[1::2], strict=True)
                stamps = {int(s): float(score) for s, score in pairs}
                ordered = [stamps[seq] for seq in sorted(stamps)]
            (items,) = yield [("HGETALL", keys[4])]
            again = yield from self.load(app_name, user_id, session_id, 0, None)
            if (
                again is not None
                and again.record.marker == record.marker
                and len(ordered) == len(loaded.events)
            ):
                return SessionCopy.of_record(
                    record,
                    [(key, value) for key, value in _pairs(items)],
                    [event_copy(e, t) for e, t in zip(loaded.events, ordered, strict=True)],
                )
        raise AlreadyExistsError(
            f"session {session_id!r} already exists and was written to while it was compared"
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
        yield from self.topology.in_order(first, [touch, ("SADD", self.keys.apps, app_name)])

    def read_app(self, app_name: str) -> Plan[dict[str, Any]]:
        (reply,) = yield [("HGETALL", self.keys.app(app_name)[0])]
        return decode_values(_pairs(reply))

    def read_user(self, app_name: str, user_id: str) -> Plan[dict[str, Any]]:
        (reply,) = yield [("HGETALL", self.keys.user(app_name, user_id)[0])]
        return decode_values(_pairs(reply))

    def check_format(self, create: bool = True) -> Plan[bool]:
        """Check the store's format record; write it first when there is none and ``create``.

        Return whether this call wrote it (created the store).
        """
        header = pack({"magic": MAGIC, "format": FORMAT_VERSION})
        # Read first: a read-only replica can open a store that exists.
        (stored,) = yield [("GET", self.keys.format)]
        if stored is None and not create:
            raise StoreNotFoundError(
                f"no sessionscope store under prefix {self.settings.prefix!r}",
                hint="check the URI's prefix= and database number; reading never creates "
                "a store, the first service that writes to it does",
            )
        created = False
        if stored is None:
            wrote, stored = yield [("SETNX", self.keys.format, header), ("GET", self.keys.format)]
            created = bool(wrote)
        if stored == header:
            return created
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
        return created

    def noop(self) -> Plan[None]:
        """One FCALL of a function that does nothing: a round trip's floor."""
        yield [("FCALL_RO", _FN + "noop", 0)]
