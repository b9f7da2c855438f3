"""The session services: ``SessionService`` (async) and ``SyncSessionService``.

``core`` holds the rules (``ServiceCore``, no I/O), ``paging`` the listing's
pages and cursors, ``facade`` both shells that call the store; ``_append``
and ``_listing`` are the hot path, compiled as ``_append_c`` and
``_listing_c`` (``sessionscope.core.compiled_or_twin`` picks the build).
"""

from __future__ import annotations

from .facade import (
    MAX_ID_BYTES,
    AsyncSessions,
    FieldModel,
    Model,
    NativeModel,
    ServiceCore,
    SessionService,
    SyncSessionService,
    check_app_name,
    check_id,
    check_page,
    check_session_id,
    cursor_position,
    event_from_record,
    event_to_record,
    page_of,
    timestamp_of,
)

__all__ = [
    "MAX_ID_BYTES",
    "AsyncSessions",
    "FieldModel",
    "Model",
    "NativeModel",
    "ServiceCore",
    "SessionService",
    "SyncSessionService",
    "check_app_name",
    "check_id",
    "check_page",
    "check_session_id",
    "cursor_position",
    "event_from_record",
    "event_to_record",
    "page_of",
    "timestamp_of",
]
