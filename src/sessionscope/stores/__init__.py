"""The stores a SessionService can run on, and ``open_store`` to pick one by URI."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import StoreNotFoundError
from .completion import Completion
from .lmdb.store import LmdbStore
from .memory import MemoryStore
from .protocol import Store
from .uri import SCHEMES, StoreSpec, parse_store_uri, redact

__all__ = ["Completion", "LmdbStore", "MemoryStore", "Store", "open_store", "redact"]


def open_store(uri: str, *, create: bool = True, **options: Any) -> Store:
    """Open the store a URI names: ``memory://``, ``lmdb:///path?durability=deferred``,
    ``redis://host:port/db?ttl=3600&prefix=name``, ``rediss://...`` (TLS) or
    ``redis+cluster://user:password@host:port,host:port?...`` (Redis Cluster).

    Keyword options override those of the query. Both take ``session_ttl``
    (seconds): sessions idle for longer are expired in the background.
    ``create=False`` (for a reader) refuses, with ``StoreNotFoundError``, an
    LMDB path or a Redis prefix that holds no store, and writes nothing.
    """
    spec = parse_store_uri(uri)
    if spec.kind == "memory":
        unknown = sorted(set(options) - set(SCHEMES["memory"][1]))
        if unknown:
            raise ValueError(f"unknown memory:// option {unknown[0]!r}; known: session_ttl")
        return MemoryStore(**{**spec.options, **options})
    if spec.kind == "redis":
        return _open_redis(spec, create, options)
    if not create and not (Path(spec.path) / "data.mdb").is_file():
        raise StoreNotFoundError(
            f"{spec.path} holds no store", hint="check the path; reading never creates a store"
        )
    return LmdbStore(spec.path, **{**spec.options, **options})


def _open_redis(spec: StoreSpec, create: bool, options: dict[str, Any]) -> Store:
    """Open a RedisStore; the redis extra is imported only here."""
    try:
        from .redis.store import RedisStore
    except ImportError as error:
        raise ValueError(
            f"{spec.scheme}:// needs the redis extra: pip install 'sessionscope[redis]' ({error})"
        ) from None
    parsed = {**spec.options, **options, "create": create}
    if spec.scheme != "redis+cluster":
        return RedisStore(spec.url, **parsed)
    if spec.username:
        parsed.setdefault("username", spec.username)
    if spec.password is not None:
        parsed.setdefault("password", spec.password)
    return RedisStore(cluster=spec.nodes, **parsed)
