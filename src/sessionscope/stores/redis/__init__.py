"""The Redis and Redis Cluster store: ``store`` holds it, ``functions.lua`` the
server-side functions it loads. Its parts: ``keys`` (the key layout), the
plans by concern (``sessions``, ``append``, ``retention``; ``common`` for what
they share), ``cluster`` (what differs on a cluster), ``runners`` (plans run
on sync and asyncio clients) and ``client`` (redis-py clients).

redis-py is an optional extra: importing this package imports nothing of it;
the first use of a name below does (``open_store`` imports it only for a
``redis://`` URI).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .store import FORMAT_VERSION, LIBRARY, RedisStore

__all__ = ["FORMAT_VERSION", "LIBRARY", "RedisStore"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module(".store", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
