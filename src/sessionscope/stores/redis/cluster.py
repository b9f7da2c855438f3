"""What differs between one Redis server and a Redis Cluster, chosen once when a store opens.

On one server the append and create functions write the app map in the
same atomic step, and a pipeline runs in order. On a cluster the app map
lives in another slot: a function records the app delta in the user's
pending hash under a token (session number and event id), then a second
call applies it to the app map once (the app's applied-tokens set
remembers it) and a third clears it; any later read or append of the same
user finishes a delta left pending by a process that died in between. A
cluster pipeline runs each node's commands apart, in no order between
nodes, so steps that must follow one another are separate round trips,
and a batch is pipelined one user (one slot) at a time.

The plans call a ``_Topology`` wherever the two differ instead of
branching: ``_OneServer`` or ``_Cluster``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...codec import decode_values
from ..records import AppendBatch, LoadedSession
from .common import _FN, Command, Plan, _pairs, _raw_pairs, _Settings
from .keys import _Keys

if TYPE_CHECKING:
    from .append import AppendPlans, BatchRead, _Tally

# Called, when set, after an app delta is recorded and before it is applied
# (cluster): tests stop a process there to check that another finishes it.
between_steps: Callable[[], None] | None = None
# The field of a user's pending hash that counts app deltas recorded.
_ORDER_FIELD = b"#"


class _Topology:
    """The steps that differ between one server and a cluster (see the module doc)."""

    def __init__(self, settings: _Settings, keys: _Keys) -> None:
        self.settings = settings
        self.keys = keys

    def app_keys(self, app_name: str) -> list[bytes]:
        """Return the app keys a function writes directly (the app map on one server)."""
        raise NotImplementedError

    def in_order(self, first: list[Command], then: list[Command]) -> Plan[list[Any]]:
        """Send ``then`` after ``first`` has run; return the replies of both."""
        raise NotImplementedError

    def settle(self, app_name: str, user_id: str, pending: Any) -> Plan[None]:
        """Apply the app deltas ``pending`` (a user's pending hash, read) once, then clear them."""
        raise NotImplementedError

    def settle_user(self, app_name: str, user_id: str) -> Plan[None]:
        """Apply whatever app deltas a user's appends left pending (before deleting the user)."""
        raise NotImplementedError

    def load_commands(self, call: Command, app_name: str) -> list[Command]:
        """Return the round trip of a load: its call and, on a cluster, the app map's read."""
        raise NotImplementedError

    def created_app_map(self, app_name: str, user_id: str, pending: Any, replied: Any) -> Plan[Any]:
        """Return the app map after a create (``replied``: the one its call returned)."""
        raise NotImplementedError

    def loaded_app_map(
        self, app_name: str, user_id: str, pending: Any, replied: Any, beside: Any
    ) -> Plan[Any]:
        """Return the app map of a load: from its call's reply or read ``beside`` it."""
        raise NotImplementedError

    def stored_app_map(self, app_name: str, replied: dict[str, Any]) -> Plan[dict[str, Any]]:
        """Return the app map of a catch-up append's stored state (``replied`` as decoded)."""
        raise NotImplementedError

    def slot_group(self, batch: AppendBatch, start: int, stop: int) -> int:
        """Return how many events from ``start`` may be pipelined under one guard key."""
        raise NotImplementedError

    def append_reading(
        self, plans: AppendPlans, batch: AppendBatch, reads: list[BatchRead]
    ) -> Plan[tuple[_Tally, list[LoadedSession | None]]]:
        """Append a batch and answer the reads placed in it (see ``append_many_reading``)."""
        raise NotImplementedError


class _OneServer(_Topology):
    """One server: functions write the app map themselves, and a pipeline runs in order."""

    def app_keys(self, app_name: str) -> list[bytes]:
        return [self.keys.app(app_name)[0]]

    def in_order(self, first: list[Command], then: list[Command]) -> Plan[list[Any]]:
        return (yield [*first, *then])

    def settle(self, app_name: str, user_id: str, pending: Any) -> Plan[None]:
        # Nothing is ever pending: a plan that sends nothing.
        yield from ()

    def settle_user(self, app_name: str, user_id: str) -> Plan[None]:
        yield from ()

    def load_commands(self, call: Command, app_name: str) -> list[Command]:
        return [call]

    def created_app_map(self, app_name: str, user_id: str, pending: Any, replied: Any) -> Plan[Any]:
        yield from ()
        return replied

    def loaded_app_map(
        self, app_name: str, user_id: str, pending: Any, replied: Any, beside: Any
    ) -> Plan[Any]:
        yield from ()
        return replied

    def stored_app_map(self, app_name: str, replied: dict[str, Any]) -> Plan[dict[str, Any]]:
        yield from ()
        return replied

    def slot_group(self, batch: AppendBatch, start: int, stop: int) -> int:
        return stop - start

    def append_reading(
        self, plans: AppendPlans, batch: AppendBatch, reads: list[BatchRead]
    ) -> Plan[tuple[_Tally, list[LoadedSession | None]]]:
        # The reads travel inside the batch's pipeline, which the server runs in order.
        return (yield from plans._append_reading_pipelined(batch, reads))


class _Cluster(_Topology):
    """A Redis Cluster: app deltas in two more steps, ordered steps as separate round trips."""

    def app_keys(self, app_name: str) -> list[bytes]:
        # The app map lives in another slot than the user's keys a function touches.
        return []

    def in_order(self, first: list[Command], then: list[Command]) -> Plan[list[Any]]:
        replies = yield first
        return replies + (yield then)

    def settle(self, app_name: str, user_id: str, pending: Any) -> Plan[None]:
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

    def settle_user(self, app_name: str, user_id: str) -> Plan[None]:
        # App deltas this user's appends left pending still belong to the app.
        (pending,) = yield [("HGETALL", self.keys.user(app_name, user_id)[2])]
        yield from self.settle(app_name, user_id, pending)

    def load_commands(self, call: Command, app_name: str) -> list[Command]:
        return [call, ("HGETALL", self.keys.app(app_name)[0])]

    def created_app_map(self, app_name: str, user_id: str, pending: Any, replied: Any) -> Plan[Any]:
        yield from self.settle(app_name, user_id, pending)
        (astate,) = yield [("HGETALL", self.keys.app(app_name)[0])]
        return astate

    def loaded_app_map(
        self, app_name: str, user_id: str, pending: Any, replied: Any, beside: Any
    ) -> Plan[Any]:
        if not pending:
            return beside
        yield from self.settle(app_name, user_id, pending)
        (astate,) = yield [("HGETALL", self.keys.app(app_name)[0])]
        return astate

    def stored_app_map(self, app_name: str, replied: dict[str, Any]) -> Plan[dict[str, Any]]:
        (astate,) = yield [("HGETALL", self.keys.app(app_name)[0])]
        return decode_values(_pairs(astate))

    def slot_group(self, batch: AppendBatch, start: int, stop: int) -> int:
        # One user's events at a time: a guard key chains calls of one slot only.
        owners, keys = batch.owners, batch.keys
        app, user, _ = keys[owners[start]]
        end = start
        while end < stop and keys[owners[end]][:2] == (app, user):
            end += 1
        return end - start

    def append_reading(
        self, plans: AppendPlans, batch: AppendBatch, reads: list[BatchRead]
    ) -> Plan[tuple[_Tally, list[LoadedSession | None]]]:
        # A cluster pipeline keeps no order between nodes: a step per read.
        return (yield from plans._append_then_read(batch, reads))


def topology(settings: _Settings, keys: _Keys) -> _Topology:
    """Return the topology of a store's settings."""
    return (_Cluster if settings.cluster else _OneServer)(settings, keys)
