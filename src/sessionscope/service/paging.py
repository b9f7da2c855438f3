"""Paging a listing: a page size and cursor checked, a store's page as metadata.

A cursor is the listing position of the page's last session (last update
time, user id, session id), packed and base64-encoded: opaque to callers.
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING

from .. import codec
from ..core import compiled_or_twin
from ..model import ListSessionsResponse
from ..stores.records import ListPosition, SessionRecord
from ..stores.rules import list_position

if TYPE_CHECKING:
    from . import _listing
else:
    _listing = compiled_or_twin("sessionscope.service._listing")

__all__ = ["check_page", "cursor_position", "page_of"]


def check_page(limit: object, cursor: object) -> None:
    """Refuse a page size or cursor a listing cannot take, before the store is read."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
        raise ValueError(f"limit must be an int or None, not {limit!r}")
    if limit is not None and limit <= 0:
        raise ValueError(f"limit must be positive, not {limit}")
    if cursor is not None:
        _decode_cursor(cursor)


def cursor_position(cursor: str | None) -> ListPosition | None:
    """Return the listing position a cursor names (None: from the start)."""
    return None if cursor is None else _decode_cursor(cursor)


def page_of(page: list[SessionRecord], more: bool) -> ListSessionsResponse:
    """Return a store's listing page as session metadata, with the cursor past it."""
    metas = _listing.metas(page)
    next_cursor = _encode_cursor(list_position(page[-1])) if more and page else None
    return ListSessionsResponse(metas, next_cursor)


def _encode_cursor(position: tuple[float, str, str]) -> str:
    return base64.urlsafe_b64encode(codec.pack(list(position))).decode("ascii")


def _decode_cursor(cursor: object) -> tuple[float, str, str]:
    try:
        if not isinstance(cursor, str):
            raise TypeError
        stamp, user, sid = codec.unpack(base64.urlsafe_b64decode(cursor.encode("ascii")))
        return float(stamp), str(user), str(sid)
    except Exception:
        raise ValueError(f"cursor {cursor!r} is not one a listing returned") from None
