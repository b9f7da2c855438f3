"""Plans of retention: truncate a session's events, expire idle sessions, delete users, apps."""

from __future__ import annotations

import secrets

from ..rules import BATCH_EVENTS, BATCH_SESSIONS, newest_moved, session_not_found
from .common import _FN, Command, Plan, _number_text
from .sessions import SessionPlans


class RetentionPlans(SessionPlans):
    """The plans that remove what a store keeps."""

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
                raise session_not_found(app_name, user_id, session_id)
            removed += gone
            if gone < BATCH_EVENTS:
                return removed

    def pop(
        self,
        app_name: str,
        user_id: str,
        session_id: str,
        count: int,
        *,
        if_last_event_id: str | None = None,
    ) -> Plan[list[bytes]]:
        """Remove a session's newest ``count`` events in one FCALL; return their records.

        With ``if_last_event_id``, the function pops only if the newest stored
        event has that id, and answers 0 otherwise.
        """
        rec, events, ids, times, _, positions, names = self.keys.session(
            app_name, user_id, session_id
        )
        # The token makes the call idempotent: sent again after a lost reply,
        # it answers with what the first removed.
        token = secrets.token_hex(8)
        condition = () if if_last_event_id is None else (if_last_event_id,)
        (reply,) = yield [
            ("FCALL", _FN + "pop", 6, rec, events, ids, times, positions, names, count, token,
             *condition)
        ]  # fmt: skip
        if reply is None:
            raise session_not_found(app_name, user_id, session_id)
        if type(reply) is int:
            assert if_last_event_id is not None
            raise newest_moved(session_id, if_last_event_id)
        return [bytes(record) for record in reply]

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
        """Delete a user's sessions and state; a session created meanwhile stays, listed.

        The sessions deleted leave the user's index one by one, and Redis
        drops a sorted set that empties, so the index is never deleted: a
        session created during the call keeps its entry. A create touches
        the app's directory before and after it writes, so the directory
        entry removed here is put back when the index lives on after the
        removal: the removal either came before the create's last touch,
        which adds it again, or after its index entry, which is seen.
        """
        # App deltas this user's appends left pending still belong to the app.
        yield from self.topology.settle_user(app_name, user_id)
        removed = yield from self._delete_sessions(app_name, user_id, None)
        ustate, index, pend, counter = self.keys.user(app_name, user_id)
        directory = self.keys.app(app_name)[2]
        yield [("DEL", ustate, pend, counter), ("ZREM", directory, user_id)]
        (alive,) = yield [("EXISTS", index)]
        if alive:
            yield [("ZINCRBY", directory, 1, user_id)]
        return removed

    def delete_app(self, app_name: str) -> Plan[int]:
        """Delete an app's users and state; a user created meanwhile stays, listed.

        As ``delete_user`` does for its directory entry, the app leaves the
        list of apps and comes back when its directory lives on: a create
        adds the app after it writes.
        """
        removed = 0
        for user in (yield from self._users(app_name)):
            removed += yield from self.delete_user(app_name, user)
        app_state, applied, directory = self.keys.app(app_name)
        yield [("DEL", app_state, applied), ("SREM", self.keys.apps, app_name)]
        (alive,) = yield [("EXISTS", directory)]
        if alive:
            yield [("SADD", self.keys.apps, app_name)]
        return removed
