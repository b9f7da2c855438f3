"""The stores a SessionService can run on, and ``open_store`` to pick one by URI."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from .base import Completion, Store
from .lmdb import LmdbStore
from .memory import MemoryStore

__all__ = ["Completion", "LmdbStore", "MemoryStore", "Store", "open_store"]

# The options an lmdb:// URI may carry in its query, and how each is read.
_LMDB_OPTIONS: dict[str, Any] = {
    "durability": str,
    "map_size": int,
    "flush_interval": float,
    "file_mode": lambda text: int(text, 8),
    "max_readers": int,
}


def open_store(uri: str, **options: Any) -> Store:
    """Open the store a URI names: ``memory://`` or ``lmdb:///path?durability=deferred``.

    Keyword options override those of the query.
    """
    if not isinstance(uri, str):
        raise ValueError(f"uri must be a str, not {type(uri).__name__}")
    parts = urlsplit(uri)
    if parts.scheme == "memory":
        if options or parts.query:
            raise ValueError("memory:// takes no options")
        return MemoryStore()
    if parts.scheme != "lmdb":
        raise ValueError(f"unknown store scheme in {uri!r}: use lmdb:// or memory://")
    # lmdb:///abs/path has an empty host; lmdb://relative/path keeps it as the first part.
    path = unquote(parts.netloc + parts.path)
    if not path:
        raise ValueError(f"{uri!r} names no path")
    parsed: dict[str, Any] = {}
    for name, text in parse_qsl(parts.query, keep_blank_values=True):
        if name not in _LMDB_OPTIONS:
            raise ValueError(f"unknown lmdb:// option {name!r}; known: {sorted(_LMDB_OPTIONS)}")
        try:
            parsed[name] = _LMDB_OPTIONS[name](text)
        except ValueError:
            raise ValueError(f"lmdb:// option {name}={text!r} is not valid") from None
    parsed.update(options)
    return LmdbStore(path, **parsed)
