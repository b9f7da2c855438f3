"""The stores a SessionService can run on, and ``open_store`` to pick one by URI."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

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
    "session_ttl": float,
}
# memory:// takes only this one.
_MEMORY_OPTIONS: dict[str, Any] = {"session_ttl": float}


def open_store(uri: str, **options: Any) -> Store:
    """Open the store a URI names: ``memory://``, ``lmdb:///path?durability=deferred``,
    ``redis://host:port/db?ttl=3600&prefix=name``, ``rediss://...`` (TLS) or
    ``redis+cluster://host:port,host:port?...`` (Redis Cluster).

    Keyword options override those of the query. Both take ``session_ttl``
    (seconds): sessions idle for longer are expired in the background.
    """
    if not isinstance(uri, str):
        raise ValueError(f"uri must be a str, not {type(uri).__name__}")
    parts = urlsplit(uri)
    if parts.scheme == "memory":
        if parts.netloc or parts.path:
            raise ValueError(f"memory:// names no path, not {uri!r}")
        parsed = _options("memory", parts.query, _MEMORY_OPTIONS)
        unknown = sorted(set(options) - set(_MEMORY_OPTIONS))
        if unknown:
            raise ValueError(f"unknown memory:// option {unknown[0]!r}; known: session_ttl")
        parsed.update(options)
        return MemoryStore(**parsed)
    if parts.scheme in _REDIS_SCHEMES:
        return _open_redis(uri, parts.scheme, options)
    if parts.scheme != "lmdb":
        raise ValueError(
            f"unknown store scheme in {uri!r}: use lmdb://, memory://, redis://, rediss:// "
            "or redis+cluster://"
        )
    # lmdb:///abs/path has an empty host; lmdb://relative/path keeps it as the first part.
    path = unquote(parts.netloc + parts.path)
    if not path:
        raise ValueError(f"{uri!r} names no path")
    parsed = _options("lmdb", parts.query, _LMDB_OPTIONS)
    parsed.update(options)
    return LmdbStore(path, **parsed)


_REDIS_SCHEMES = ("redis", "rediss", "redis+cluster")
# The options a redis URI may carry in its query (the rest is redis-py's own
# URL syntax: user, password, host, port, database number).
_REDIS_OPTIONS: dict[str, Any] = {
    "prefix": str,
    "ttl": int,
    "wait": int,
    "timeout": float,
    "session_ttl": float,
}


def _open_redis(uri: str, scheme: str, options: dict[str, Any]) -> Store:
    """Open a RedisStore; the redis extra is imported only here."""
    try:
        from .redis import RedisStore
    except ImportError as error:
        raise ValueError(
            f"{scheme}:// needs the redis extra: pip install 'sessionscope[redis]' ({error})"
        ) from None
    parts = urlsplit(uri)
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    # TLS settings (ssl_ca_certs=..., ssl_cert_reqs=...) are redis-py's own:
    # they stay in the URL it reads.
    tls = [(name, text) for name, text in pairs if name.startswith("ssl_")]
    if tls and scheme != "rediss":
        raise ValueError(f"{tls[0][0]}= needs a rediss:// URI (TLS to one server)")
    ours = urlencode([(name, text) for name, text in pairs if not name.startswith("ssl_")])
    parsed = _options(scheme, ours, _REDIS_OPTIONS)
    parsed.update(options)
    if scheme != "redis+cluster":
        return RedisStore(parts._replace(query=urlencode(tls)).geturl(), **parsed)
    nodes: list[tuple[str, int]] = []
    for node in parts.netloc.rpartition("@")[2].split(","):
        host, _, port = node.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"{uri!r}: name each cluster node as host:port, not {node!r}")
        nodes.append((host.strip("[]"), int(port)))
    return RedisStore(cluster=nodes, **parsed)


def _options(scheme: str, query: str, known: dict[str, Any]) -> dict[str, Any]:
    """Return the options of a URI's query, each read as ``known`` says."""
    parsed: dict[str, Any] = {}
    for name, text in parse_qsl(query, keep_blank_values=True):
        if name not in known:
            raise ValueError(f"unknown {scheme}:// option {name!r}; known: {sorted(known)}")
        try:
            parsed[name] = known[name](text)
        except ValueError:
            raise ValueError(f"{scheme}:// option {name}={text!r} is not valid") from None
    return parsed
