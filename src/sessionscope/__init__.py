"""sessionscope: a fast, durable session store for AI agents.

An append-only log of events per session plus state scoped by key prefix
(``app:``, ``user:``, ``temp:``, none), on an embedded LMDB store by default.
"""

from __future__ import annotations

import logging

from .admin.dump import DumpCounts, export_dump, import_dump
from .core import APP_PREFIX, TEMP_PREFIX, USER_PREFIX, Scope, scope_of
from .errors import (
    AlreadyExistsError,
    CorruptStoreError,
    DumpError,
    DuplicateEventError,
    IncompatibleStoreError,
    SessionNotFoundError,
    SessionscopeError,
    StaleSessionError,
    StateValueError,
    StoreClosedError,
    StoreError,
    StoreNotFoundError,
    UnsafeStoreError,
)
from .model import (
    Event,
    EventActions,
    GetSessionConfig,
    ListSessionsResponse,
    Session,
    SessionMeta,
)
from .service import SessionService, SyncSessionService
from .state import ReadonlyState, State
from .stores import LmdbStore, MemoryStore, Store, open_store
from .templating import inject_state

__version__ = "0.1.0"

# The library logs (``logging.getLogger(__name__)`` per module) and never prints:
# the application decides where records go. Without a handler of its own,
# Python's last-resort handler would print warnings on stderr.
logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = [
    "APP_PREFIX",
    "TEMP_PREFIX",
    "USER_PREFIX",
    "AlreadyExistsError",
    "CorruptStoreError",
    "DumpCounts",
    "DumpError",
    "DuplicateEventError",
    "Event",
    "EventActions",
    "GetSessionConfig",
    "IncompatibleStoreError",
    "ListSessionsResponse",
    "LmdbStore",
    "MemoryStore",
    "ReadonlyState",
    "Scope",
    "Session",
    "SessionMeta",
    "SessionNotFoundError",
    "SessionService",
    "SessionscopeError",
    "StaleSessionError",
    "State",
    "StateValueError",
    "Store",
    "StoreClosedError",
    "StoreError",
    "StoreNotFoundError",
    "SyncSessionService",
    "UnsafeStoreError",
    "__version__",
    "export_dump",
    "import_dump",
    "inject_state",
    "open_store",
    "scope_of",
]
