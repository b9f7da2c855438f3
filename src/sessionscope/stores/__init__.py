"""The stores a SessionService can run on, and ``open_store`` to pick one by URI."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

from ..errors import StoreNotFoundError
from .completion import Completion
from .lmdb.store import LmdbStore
from .memory import MemoryStore
from .protocol import Store

__all__ = ["Completion", "LmdbStore", "MemoryStore", "Store", "open_store", "redact"]

# The userinfo of a URI in a text: what stands between "scheme://" and the
# last "@" before the host ends (a password may hold an unescaped "@").
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/\s?#]*)@")


def redact(text: str) -> str:
    """Return ``text`` with the password of every URI in it replaced by ``***``.

    ``redis://user:secret@host`` becomes ``redis://user:***@host``; userinfo
    without a colon may be a password alone and is replaced whole. Every
    message, ``repr`` and log line that may carry a store's URI goes through here.
    """

    def hide(match: re.Match[str]) -> str:
        user, colon, _ = match["userinfo"].partition(":")
        return f"{match['scheme']}{user}:***@" if colon else f"{match['scheme']}***@"

    return _USERINFO.sub(hide, text)


def _flag(text: str) -> bool:
    """Read a yes/no URI option; anything but these words is refused."""
    words = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}
    try:
        return words[text.lower()]
    except KeyError:
        raise ValueError(text) from None


# The options an lmdb:// URI may carry in its query, and how each is read.
_LMDB_OPTIONS: dict[str, Any] = {
    "durability": str,
    "map_size": int,
    "flush_interval": float,
    "file_mode": lambda text: int(text, 8),
    "max_readers": int,
    "session_ttl": float,
    "verify": _flag,
    "trust_directory": _flag,
}
# memory:// takes only this one.
_MEMORY_OPTIONS: dict[str, Any] = {"session_ttl": float}


def open_store(uri: str, *, create: bool = True, **options: Any) -> Store:
    """Open the store a URI names: ``memory://``, ``lmdb:///path?durability=deferred``,
    ``redis://host:port/db?ttl=3600&prefix=name``, ``rediss://...`` (TLS) or
    ``redis+cluster://user:password@host:port,host:port?...`` (Redis Cluster).

    Keyword options override those of the query. Both take ``session_ttl``
    (seconds): sessions idle for longer are expired in the background.
    ``create=False`` (for a reader) refuses, with ``StoreNotFoundError``, an
    LMDB path or a Redis prefix that holds no store, and writes nothing.
    """
    if not isinstance(uri, str):
        raise ValueError(f"uri must be a str, not {type(uri).__name__}")
    parts = urlsplit(uri)
    if parts.scheme == "memory":
        if parts.netloc or parts.path:
            raise ValueError(f"memory:// names no path, not {redact(uri)!r}")
        parsed = _options("memory", parts.query, _MEMORY_OPTIONS)
        unknown = sorted(set(options) - set(_MEMORY_OPTIONS))
        if unknown:
            raise ValueError(f"unknown memory:// option {unknown[0]!r}; known: session_ttl")
        parsed.update(options)
        return MemoryStore(**parsed)
    if parts.scheme in _REDIS_SCHEMES:
        return _open_redis(uri, parts.scheme, create, options)
    if parts.scheme != "lmdb":
        raise ValueError(
            f"unknown store scheme in {redact(uri)!r}: use lmdb://, memory://, redis://, "
            "rediss:// or redis+cluster://"
        )
    # lmdb:///abs/path has an empty host; lmdb://relative/path keeps it as the first part.
    path = unquote(parts.netloc + parts.path)
    if not path:
        raise ValueError(f"{uri!r} names no path")
    parsed = _options("lmdb", parts.query, _LMDB_OPTIONS)
    parsed.update(options)
    if not create and not (Path(path) / "data.mdb").is_file():
        raise StoreNotFoundError(
            f"{path} holds no store", hint="check the path; reading never creates a store"
        )
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
    "allow_eviction": _flag,
}


def _open_redis(uri: str, scheme: str, create: bool, options: dict[str, Any]) -> Store:
    """Open a RedisStore; the redis extra is imported only here."""
    try:
        from .redis.store import RedisStore
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
    parsed["create"] = create
    if scheme != "redis+cluster":
        return RedisStore(parts._replace(query=urlencode(tls)).geturl(), **parsed)
    nodes: list[tuple[str, int]] = []
    for node in parts.netloc.rpartition("@")[2].split(","):
        host, _, port = node.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"{redact(uri)!r}: name each cluster node as host:port, not {node!r}")
        nodes.append((host.strip("[]"), int(port)))
    # redis-py reads a single server's credentials from its URL; a cluster's
    # go to every node it connects to.
    if parts.username:
        parsed.setdefault("username", unquote(parts.username))
    if parts.password is not None:
        parsed.setdefault("password", unquote(parts.password))
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
