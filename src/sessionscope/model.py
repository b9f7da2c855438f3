"""The native data model: sessions, events and the options of a read.

Plain slotted dataclasses rather than pydantic models: building one costs a
fraction of a microsecond, which matters when a read returns thousands of
events. Every field holds only storable values (see ``sessionscope.codec``).
"""

from __future__ import annotations

import os
import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Event",
    "EventActions",
    "GetSessionConfig",
    "ListSessionsResponse",
    "Session",
    "SessionMeta",
    "check_filters",
    "new_event_id",
    "new_session_id",
]


# Event ids need uniqueness, not secrecy: a private generator seeded from the
# OS costs a fifth of uuid4 per id. It is reseeded in a forked child, which
# would otherwise repeat its parent's ids, and a caller seeding the global
# ``random`` cannot make two processes draw the same ids.
_ids = random.Random()
os.register_at_fork(after_in_child=_ids.seed)


def new_event_id() -> str:
    """Return a fresh, random event id (128 bits, hex)."""
    return f"{_ids.getrandbits(128):032x}"


def new_session_id() -> str:
    """Return a fresh, random session id."""
    return str(uuid.uuid4())


@dataclass(slots=True)
class EventActions:
    """What an event does besides carrying content: above all, its state delta."""

    state_delta: dict[str, Any] = field(default_factory=dict)
    artifact_delta: dict[str, int] = field(default_factory=dict)
    transfer_to_agent: str | None = None
    escalate: bool | None = None
    skip_summarization: bool | None = None
    # Room for the actions other runtimes carry (auth requests, compaction, ...).
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Event:
    """One entry of a session's append-only log."""

    author: str = ""
    content: Any = None
    id: str = field(default_factory=new_event_id)
    invocation_id: str = ""
    timestamp: float = field(default_factory=time.time)
    partial: bool | None = None
    actions: EventActions = field(default_factory=EventActions)
    branch: str | None = None
    turn_complete: bool | None = None
    interrupted: bool | None = None
    error_code: str | None = None
    error_message: str | None = None
    custom_metadata: dict[str, Any] | None = None
    long_running_tool_ids: list[str] | None = None
    # Room for the other fields an agent runtime carries (usage, grounding, ...).
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Session:
    """A session as read: merged state, events, and the revision it was read at.

    ``revision`` is an opaque marker of the stored revision this object
    reflects; an append from an object whose marker the store has moved past is
    rejected as stale. ``None`` means "built by hand".
    """

    id: str
    app_name: str
    user_id: str
    state: dict[str, Any] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    last_update_time: float = 0.0
    revision: str | None = None


@dataclass(slots=True, frozen=True)
class SessionMeta:
    """What a listing returns for a session: no state, no events.

    Frozen, and every field a str, a float or an int: a meta refers to
    nothing that could refer back to it, so the compiled listing leaves the
    metas it makes out of the cyclic collector (``service/_listing.py``).
    """

    id: str
    app_name: str
    user_id: str
    last_update_time: float
    create_time: float
    event_count: int
    revision: str


@dataclass(slots=True)
class ListSessionsResponse:
    """One page of a listing; ``next_cursor`` is None on the last page."""

    sessions: list[SessionMeta] = field(default_factory=list)
    next_cursor: str | None = None


@dataclass(slots=True, frozen=True)
class GetSessionConfig:
    """Which events a read returns.

    ``num_recent_events``: None for all, 0 for none, n for the last n.
    ``after_timestamp``: only events with ``timestamp >= after_timestamp``
    (0.0 is a real filter). Both may be given: the last n, then the filter.
    """

    num_recent_events: int | None = None
    after_timestamp: float | None = None

    def __post_init__(self) -> None:
        check_filters(self.num_recent_events, self.after_timestamp)


def check_filters(
    num_recent_events: object, after_timestamp: object
) -> tuple[int | None, float | None]:
    """Return the filters of a read, checked; a ValueError names a bad one."""
    n = num_recent_events
    if n is not None and (isinstance(n, bool) or not isinstance(n, int)):
        raise ValueError(f"num_recent_events must be an int or None, not {n!r}")
    if n is not None and n < 0:
        raise ValueError(f"num_recent_events must be >= 0, not {n}")
    t = after_timestamp
    if t is None:
        return n, None
    if isinstance(t, bool) or not isinstance(t, (int, float)):
        raise ValueError(f"after_timestamp must be a number or None, not {t!r}")
    try:
        after = float(t)
    except OverflowError:
        raise ValueError(f"after_timestamp {t!r} is out of the float range") from None
    if after != after:
        raise ValueError("after_timestamp must not be NaN")
    return n, after
