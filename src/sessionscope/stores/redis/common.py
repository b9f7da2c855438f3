"""What every plan of a Redis store shares: the plan type, names, reply decoding, settings.

A plan is a generator that yields the commands of one round trip (several
are pipelined) and receives their replies; ``runners`` runs it on a sync or
an asyncio client. ``PlanBase`` holds what the plans of every concern
(``sessions``, ``append``, ``retention``) read: settings, keys, the
topology (``cluster``) and the steps they all take.
"""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Generator
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import TYPE_CHECKING, Any, TypeVar

from ...errors import CorruptStoreError, StoreError
from ..records import Items, SessionRecord
from .keys import _Keys

if TYPE_CHECKING:
    from .cluster import _Topology

T = TypeVar("T")

# Format 2 keeps a session's event times as a string of doubles while they
# never go back (the sorted set only after one does); a store of format 1 is
# read and written as it is, every session with the sorted set.
FORMAT_VERSION = 2
MAGIC = "sessionscope"
# The function library's name carries its version: a client never calls an
# older server-side copy by mistake, and two versions can live side by side.
LIBRARY = "sessionscope_8"
_FN = LIBRARY + "_"
_U32 = struct.Struct(">I")
# The fields of a session record hash, in SessionRecord's order.
_RECORD_FIELDS = ("app", "user", "sid", "n", "c", "u", "k", "l", "r")
# What to do about a session record altered outside sessionscope.
RECORD_ALTERED = "it was altered outside sessionscope: delete the session or restore it from a copy"
# (command, arguments...) of one Redis command.
Command = tuple[Any, ...]
# An operation: yields the commands of each round trip, receives their replies.
Plan = Generator[list[Command], list[Any], T]


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
    """Return a session record hash's fields as a record; a damaged one is a CorruptStoreError."""
    app, user, sid, number, created, updated, count, last, removed = fields
    try:
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
    except (AttributeError, TypeError, ValueError) as error:  # UnicodeDecodeError included
        whose = "/".join(repr(part)[:100] for part in (app, user, sid))
        raise CorruptStoreError(
            f"the record of session {whose} is unreadable ({type(error).__name__})",
            hint=RECORD_ALTERED,
        ) from error


def _index_range(index: bytes, low: str, count: int) -> Command:
    """Return the read of a listing index's first ``count`` entries scored from ``low`` on."""
    return ("ZRANGE", index, low, "+inf", "BYSCORE", "LIMIT", 0, count, "WITHSCORES")


def _pack_items(items: Items) -> bytes:
    """Frame app items as one value: each key, then its packed value, after its length."""
    out = bytearray()
    for key, value in items:
        raw = key.encode()
        out += _U32.pack(len(raw)) + raw + _U32.pack(len(value)) + value
    return bytes(out)


def _missing(where: str, what: str) -> CorruptStoreError:
    """Return the error of a read that found part of a session gone (never a partial session)."""
    return CorruptStoreError(
        f"{where} is missing {what}",
        hint="Redis dropped part of the session, as a server does whose maxmemory-policy "
        "is not noeviction (see docs/redis.md): delete the session or restore it from a copy",
    )


@dataclass(slots=True)
class _Settings:
    prefix: str
    ttl: int
    wait: int
    timeout: float
    cluster: bool


class PlanBase:
    """The state and the steps shared by the plans of every concern."""

    def __init__(self, settings: _Settings, keys: _Keys, topology: _Topology) -> None:
        self.settings = settings
        self.keys = keys
        # What differs on a cluster (see ``cluster``), chosen once at open.
        self.topology = topology
        # The append function's keys of each session appended to (sessions recur).
        self._session_keys: dict[tuple[str, str, str], tuple[bytes, ...]] = {}
        # When this process last pushed each app's keys' expiry forward.
        self._app_refreshed: dict[str, float] = {}
        self._refresh_lock = threading.Lock()
        # Whether new sessions keep their times as a string while in order
        # (format 2); check_format clears it for a store of format 1.
        self.times_layout = "1"

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
