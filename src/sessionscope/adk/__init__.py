"""The google-adk drop-in: session services that take and return ADK's own objects.

``LmdbSessionService`` keeps sessions in a durable LMDB store;
``RedisSessionService`` on a Redis server or cluster shared by several
machines; ``MemorySessionService`` keeps them in process memory, with the same
rules and no aliasing between what a caller holds and what is stored. All
subclass ``google.adk.sessions.BaseSessionService`` and share every rule with
the native services through ``ServiceCore``.

Importing this module registers the ``lmdb`` scheme (and, with the redis
extra installed, ``redis``, ``rediss`` and ``redis+cluster``) with ADK's service
registry, so ``adk web --session_service_uri lmdb:///path/to/store`` works once
something imports it: a ``services.py`` in the agents directory holding
``import sessionscope.adk``, a ``services.yaml`` naming
``sessionscope.adk.LmdbSessionService``, or ``python -m sessionscope.adk web ...``.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from typing import Any, NoReturn

from google.adk.errors.already_exists_error import AlreadyExistsError as _AdkAlreadyExistsError
from google.adk.errors.session_not_found_error import (
    SessionNotFoundError as _AdkSessionNotFoundError,
)
from google.adk.events import Event
from google.adk.sessions import BaseSessionService, Session
from google.adk.sessions.base_session_service import ListSessionsResponse

try:
    from google.adk.errors import StaleSessionError as _AdkStaleSessionError
except ImportError:  # ADK before the stale-session check
    _AdkStaleSessionError = ValueError  # type: ignore[assignment,misc]

from .. import errors
from ..service.core import FieldModel, ServiceCore
from ..service.facade import AsyncSessions
from ..stores import LmdbStore, MemoryStore, Store, open_store, redact
from ..stores.records import SessionRecord
from ..stores.uri import REDIS_SCHEMES, scheme_of
from .codec import decode_events, encode_event
from .migrate import MigrationReport, migrate_from_adk

_log = logging.getLogger(__name__)

__all__ = [
    "AdkModel",
    "AlreadyExistsError",
    "LmdbSessionService",
    "MemorySessionService",
    "MigrationReport",
    "RedisSessionService",
    "SessionNotFoundError",
    "StaleSessionError",
    "main",
    "migrate_from_adk",
    "register",
]


class AlreadyExistsError(_AdkAlreadyExistsError, errors.AlreadyExistsError):
    """A session with this id already exists: ADK's error, and sessionscope's."""


class SessionNotFoundError(_AdkSessionNotFoundError, errors.SessionNotFoundError):
    """The session does not exist: ADK's error, and sessionscope's."""


class StaleSessionError(_AdkStaleSessionError, errors.StaleSessionError):
    """The session object is older than the store: ADK's error, and sessionscope's."""


_ERRORS: dict[type[BaseException], type[BaseException]] = {
    errors.AlreadyExistsError: AlreadyExistsError,
    errors.SessionNotFoundError: SessionNotFoundError,
    errors.StaleSessionError: StaleSessionError,
}


# Where ADK's Session keeps the marker a storage service sets on it.
_MARKER = "_storage_update_marker"
_MARKER_IN_PRIVATE = _MARKER in getattr(Session, "__private_attributes__", {})


class AdkModel(FieldModel[Session, Event]):
    """The Model of google-adk's pydantic ``Session`` and ``Event``."""

    session_type = Session
    event_type = Event

    def new_event_id(self) -> str:
        """Return a fresh event id, as ADK makes them."""
        event_id: str = Event.new_id()
        return event_id

    # The stored record of an event: the codec's function itself, so that an
    # append calls it without a Python frame in between.
    encode_event = staticmethod(encode_event)

    def decode_events(self, records: list[bytes]) -> list[Event]:
        """Return the events stored as ``records``."""
        return decode_events(records)

    def marker(self, session: Session) -> str | None:
        """Return the revision marker a session object carries."""
        if _MARKER_IN_PRIVATE:
            # Read from pydantic's dict of private attributes: reading the
            # attribute goes through BaseModel.__getattr__, about 2 us an append.
            private = session.__pydantic_private__
            if private is not None:
                marker: str | None = private.get(_MARKER)
                return marker
        marker = session._storage_update_marker
        return marker

    def update_session(self, session: Session, last_update_time: float, marker: str) -> None:
        """Set a live session's last update time and marker."""
        session.last_update_time = last_update_time
        if _MARKER_IN_PRIVATE and session.__pydantic_private__ is not None:
            session.__pydantic_private__[_MARKER] = marker  # as marker() reads it
        else:
            session._storage_update_marker = marker

    def build_session(
        self, record: SessionRecord, state: dict[str, Any], events: list[Event]
    ) -> Session:
        """Return a new ADK session object carrying the store's revision marker."""
        session = Session(
            id=record.session_id,
            app_name=record.app_name,
            user_id=record.user_id,
            state=state,
            events=events,
            last_update_time=record.last_update_time,
        )
        session._storage_update_marker = record.marker
        return session


class _AdkService(AsyncSessions[Session, Event], BaseSessionService):
    """Everything both ADK services share; only the store differs.

    The methods are the native async facade's, taking ADK's objects through
    an ``AdkModel``; only the listing and the error classes are ADK's own.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self._core = ServiceCore(AdkModel())
        self._turns = {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.store!r})"

    def _raise(self, error: errors.SessionscopeError) -> NoReturn:
        """Raise the ADK-compatible twin of one of sessionscope's errors."""
        twin = _ERRORS.get(type(error))
        if twin is None:
            raise error
        raise twin(str(error)) from None

    async def list_sessions(
        self, *, app_name: str, user_id: str | None = None
    ) -> ListSessionsResponse:
        """List sessions with their merged state and no events, least recently active first."""
        aio = self.store.aio
        records = await aio.list_sessions(*self._core.check_owner(app_name, user_id))
        sessions = []
        erased = 0
        for record in records:
            try:
                loaded = await aio.load_session(
                    record.app_name, record.user_id, record.session_id, 0, None
                )
            except errors.KeyErasedError:
                # Sealed under an erased key (a restored backup or dump of an
                # erased user): nobody can read it, and everyone else still lists.
                erased += 1
                continue
            if loaded is not None:  # deleted meanwhile
                sessions.append(self._core.finish_load(loaded))
        if erased:
            _log.warning(
                "list_sessions of app %r left out %d session(s) sealed under erased keys; "
                "delete_user or delete_app removes what is left of them",
                app_name[:100],
                erased,
            )
        # The records may have moved on since the listing: order by what was read.
        sessions.sort(key=lambda s: (s.last_update_time, s.user_id, s.id))
        return ListSessionsResponse(sessions=sessions)


class _ChainingAdkService(_AdkService):
    """An ADK service over a store that appends a chain of events at once (memory, LMDB)."""

    async def append_events(self, session: Session, events: list[Event]) -> list[Event]:
        """Append events to a session in order, all or none, in one transaction of the store.

        The same as calling ``append_event`` for each event in turn, on the
        store and on ``session`` (partial events are handed back unstored),
        as ADK asks of a service that overrides it. ADK's
        ``BufferedSessionService`` sends a session's queued events this way:
        on a durable store they cost one sync, not one each. A stale
        ``session`` or a conflicting event id anywhere in ``events`` stores
        none of them and leaves ``session`` as it was.
        """
        return await self._append_chain(session, list(events))


class MemorySessionService(_ChainingAdkService):
    """ADK sessions in process memory: same rules as the durable one, nothing aliased."""

    def __init__(self) -> None:
        super().__init__(MemoryStore())


class LmdbSessionService(_ChainingAdkService):
    """ADK sessions in a durable LMDB store, shared safely by several processes.

    ``path_or_uri`` is a directory or an ``lmdb://`` URI whose query may carry
    store options (``lmdb:///srv/sessions?durability=deferred``); ``uri`` is
    the same, under the name ADK's ``services.yaml`` route passes it. Keyword
    options (``durability``, ``map_size``, ``flush_interval``, ``file_mode``,
    ``max_readers``, ``session_ttl``, ``verify``, ``trust_directory``)
    override those of the query. ``store=`` takes an open
    ``LmdbStore`` instead, for several services over one store in one process
    (LMDB opens a path once per process). ``agents_dir`` is accepted
    because ADK's registry passes it; a relative path resolves against the
    current directory, as ADK's own ``sqlite://`` does.
    """

    def __init__(
        self,
        path_or_uri: str | os.PathLike[str] | None = None,
        *,
        uri: str | None = None,
        store: LmdbStore | None = None,
        agents_dir: str | None = None,
        durability: str | None = None,
        **options: Any,
    ) -> None:
        if store is not None:
            # A process opens a store path once: services share its store.
            if path_or_uri is not None or uri is not None or durability or options:
                raise ValueError("give a store, or a path or URI with options, not both")
            super().__init__(store)
            return
        if (path_or_uri is None) == (uri is None):
            raise ValueError("give exactly one of path_or_uri, uri and store")
        target = uri if uri is not None else path_or_uri
        if durability is not None:
            options["durability"] = durability
        opened: Store
        if isinstance(target, str) and "://" in target:
            if scheme_of(target) != "lmdb":
                raise ValueError(f"LmdbSessionService takes an lmdb:// URI, not {redact(target)!r}")
            opened = open_store(target, **options)
        elif isinstance(target, (str, os.PathLike)):
            opened = LmdbStore(target, **options)
        else:
            raise ValueError(f"path_or_uri must be a path or an lmdb:// URI, not {target!r}")
        super().__init__(opened)


class RedisSessionService(_AdkService):
    """ADK sessions on a Redis 7 server or Redis Cluster, shared by every machine that opens it.

    ``uri`` is a ``redis://``, ``rediss://`` or ``redis+cluster://`` URI whose
    query may carry store options (``?prefix=agents&ttl=86400``); keyword
    options (``prefix``, ``ttl``, ``wait``, ``timeout``) override those of the
    query. ``store=`` takes an open ``RedisStore`` instead. ``agents_dir`` is
    accepted because ADK's registry passes it. Needs the redis extra.
    """

    def __init__(
        self,
        uri: str | None = None,
        *,
        store: Store | None = None,
        agents_dir: str | None = None,
        **options: Any,
    ) -> None:
        if store is not None:
            if uri is not None or options:
                raise ValueError("give a store, or a URI with options, not both")
            super().__init__(store)
            return
        if not isinstance(uri, str) or scheme_of(uri) not in REDIS_SCHEMES:
            raise ValueError(
                f"RedisSessionService takes a redis://, rediss:// or redis+cluster:// URI, "
                f"not {redact(repr(uri))}"
            )
        super().__init__(open_store(uri, **options))


def _redis_factory(uri: str, **kwargs: Any) -> RedisSessionService:
    """Build the service ADK's registry asks for with a Redis URI."""
    return RedisSessionService(uri=uri, **kwargs)


def _lmdb_factory(uri: str, **kwargs: Any) -> LmdbSessionService:
    """Build the service ADK's registry asks for with an lmdb:// URI."""
    return LmdbSessionService(uri=uri, **kwargs)


def register() -> bool:
    """Register our schemes with ADK's service registry; False if ADK has none.

    ``lmdb`` always; the Redis schemes when the redis extra is installed.
    """
    try:
        from google.adk.cli.service_registry import get_service_registry
    except ImportError:
        return False
    registry = get_service_registry()
    registry.register_session_service("lmdb", _lmdb_factory)
    if importlib.util.find_spec("redis") is not None:
        for scheme in REDIS_SCHEMES:
            registry.register_session_service(scheme, _redis_factory)
    return True


register()


def main() -> None:
    """Run ADK's command line with the ``lmdb`` scheme registered."""
    from google.adk.cli.cli_tools_click import main as adk_main

    adk_main()
