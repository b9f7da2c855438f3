"""Store URIs: one scheme table and one parser, which ``open_store`` and every tool use.

``lmdb:///abs/path`` (or ``lmdb://relative/path``), ``memory://``,
``redis://[user:password@]host:port/db``, ``rediss://...`` (TLS) and
``redis+cluster://[user:password@]host:port,host:port``; each takes the
query options of its row in ``SCHEMES``. ``parse_store_uri`` returns a
``StoreSpec``; every message names a URI through ``redact``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

__all__ = [
    "ENCRYPTION_OPTIONS",
    "REDIS_SCHEMES",
    "SCHEMES",
    "StoreSpec",
    "check_server_uri",
    "lmdb_path",
    "parse_store_uri",
    "query_pairs",
    "redact",
    "scheme_of",
    "uri_path",
]

# The userinfo of a URI in a text: what stands between "scheme://" and the
# last "@" before the host ends (a password may hold an unescaped "@").
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/\s?#]*)@")
# A percent escape, either case: a URI nested in another's query
# (``keys=redis%3A%2F%2F...``) is read through them, as many levels deep as
# this (``%253A`` is an escape escaped once more).
_ESCAPE = re.compile(r"%([0-9A-Fa-f]{2})")
_NESTING = 3


def redact(text: str) -> str:
    """Return ``text`` with the password of every URI in it replaced by ``***``.

    ``redis://user:secret@host`` becomes ``redis://user:***@host``; userinfo
    without a colon may be a password alone and is replaced whole. A URI
    percent-encoded inside another (``keys=redis%3A%2F%2Fuser%3Asecret%40host``,
    encoded once or more) loses its password the same way, left encoded
    around it: ``redis%3A%2F%2Fuser%3A***%40host``. Nothing else of ``text``
    changes. Every message, ``repr`` and log line that may carry a store's
    URI goes through here.
    """
    # Each character of the text as read at a level, decoded that many times,
    # stands for the span of ``text`` it was decoded from (None: itself).
    read, origins = text, None
    hidden = _passwords(read, origins)
    for _ in range(_NESTING):
        if _ESCAPE.search(read) is None:
            break
        read, origins = _unquote(read, origins)
        hidden |= _passwords(read, origins)
    pieces: list[str] = []
    end = 0
    for start, stop in sorted(hidden):
        if pieces and (start < end or start == stop == end):  # within one hidden already
            end = max(end, stop)
            continue
        pieces += [text[end:start], "***"]
        end = stop
    pieces.append(text[end:])
    return "".join(pieces)


# Where each character of a decoded text came from: a span of the original.
_Origins = list[tuple[int, int]] | None


def _passwords(read: str, origins: _Origins) -> set[tuple[int, int]]:
    """Return the spans of the original text that the passwords of the URIs in ``read`` take."""
    spans = set()
    for match in _USERINFO.finditer(read):
        start, stop = match.span("userinfo")
        colon = match["userinfo"].find(":")
        if colon >= 0:
            start += colon + 1
        if origins is not None:
            # An empty password is hidden all the same: "***" goes before its "@".
            end = origins[stop - 1][1] if stop > start else origins[start][0]
            start, stop = origins[start][0], end
        spans.add((start, stop))
    return spans


def _unquote(read: str, origins: _Origins) -> tuple[str, list[tuple[int, int]]]:
    """Decode the percent escapes of ``read`` once, with the origin of each character.

    A byte outside ASCII reads as U+FFFD: only the delimiters of a URI matter
    here, and a byte of UTF-8 taken for a character might read as a space.
    """
    if origins is None:
        origins = [(at, at + 1) for at in range(len(read))]
    chars: list[str] = []
    decoded: list[tuple[int, int]] = []
    at = 0
    for escape in _ESCAPE.finditer(read):
        start = escape.start()
        chars.append(read[at:start])
        decoded += origins[at:start]
        value = int(escape[1], 16)
        chars.append(chr(value) if value < 0x80 else "\ufffd")
        decoded.append((origins[start][0], origins[start + 2][1]))
        at = escape.end()
    chars.append(read[at:])
    decoded += origins[at:]
    return "".join(chars), decoded


def flag(text: str) -> bool:
    """Read a yes/no URI option; anything but these words is refused (ValueError)."""
    words = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}
    try:
        return words[text.lower()]
    except KeyError:
        raise ValueError(text) from None


Reader = Callable[[str], Any]

# The options every scheme takes to open its store encrypted (see
# sessionscope.crypto): where the key-encryption key comes from (a file, or
# an environment variable), the key store's URI (percent-encoded), and how
# many bytes of what it opened the store keeps.
ENCRYPTION_OPTIONS: dict[str, Reader] = {
    "key_file": str,
    "key_env": str,
    "keys": str,
    "keep_opened": int,
}

# The options an lmdb:// URI may carry in its query, and how each is read.
_LMDB_OPTIONS: dict[str, Reader] = {
    "durability": str,
    "map_size": int,
    "flush_interval": float,
    "file_mode": lambda text: int(text, 8),
    "max_readers": int,
    "session_ttl": float,
    "verify": flag,
    "trust_directory": flag,
    "read_ahead": flag,
    **ENCRYPTION_OPTIONS,
}
# The options a redis URI may carry in its query (the rest is redis-py's own
# URL syntax: user, password, host, port, database number; TLS settings
# ssl_*=... stay in the URL redis-py reads).
_REDIS_OPTIONS: dict[str, Reader] = {
    "prefix": str,
    "ttl": int,
    "wait": int,
    "timeout": float,
    "session_ttl": float,
    "allow_eviction": flag,
    **ENCRYPTION_OPTIONS,
}

# The scheme table: each scheme's store kind and the query options it takes.
SCHEMES: dict[str, tuple[str, dict[str, Reader]]] = {
    "lmdb": ("lmdb", _LMDB_OPTIONS),
    "memory": ("memory", {"session_ttl": float, **ENCRYPTION_OPTIONS}),
    "redis": ("redis", _REDIS_OPTIONS),
    "rediss": ("redis", _REDIS_OPTIONS),
    "redis+cluster": ("redis", _REDIS_OPTIONS),
}
REDIS_SCHEMES = tuple(name for name, (kind, _) in SCHEMES.items() if kind == "redis")


@dataclass(frozen=True, slots=True)
class StoreSpec:
    """A store URI read: which store, where, and the options of its query.

    ``kind`` is ``lmdb``, ``memory`` or ``redis``. ``path`` is an LMDB
    store's directory; ``url`` the URL of one Redis server (its query keeps
    only the TLS settings); ``nodes`` the host and port of each Redis
    Cluster node, whose credentials are ``username`` and ``password``.
    """

    uri: str
    scheme: str
    kind: str
    options: dict[str, Any] = field(default_factory=dict)
    path: str = ""
    url: str = ""
    nodes: list[tuple[str, int]] = field(default_factory=list)
    username: str | None = None
    password: str | None = None

    def __repr__(self) -> str:
        return f"StoreSpec({redact(self.uri)!r})"


def scheme_of(uri: str) -> str:
    """Return the scheme of a URI (what stands before ``://``), lower case."""
    return urlsplit(uri).scheme


def query_pairs(uri: str) -> list[tuple[str, str]]:
    """Return the (name, text) pairs of a URI's query, blank values kept."""
    return parse_qsl(urlsplit(uri).query, keep_blank_values=True)


def uri_path(uri: str) -> str:
    """Return the path a URI names, unquoted: ``lmdb:///abs/path`` has an empty
    host, ``lmdb://relative/path`` keeps it as the path's first part."""
    parts = urlsplit(uri)
    return unquote(parts.netloc + parts.path)


def lmdb_path(uri: str) -> Path | None:
    """Return the directory an ``lmdb://`` URI names, None for any other scheme."""
    if scheme_of(uri) != "lmdb":
        return None
    return Path(uri_path(uri))


def parse_store_uri(uri: str) -> StoreSpec:
    """Read a store URI; a bad one is a ValueError that names it with its password hidden."""
    if not isinstance(uri, str):
        raise ValueError(f"uri must be a str, not {type(uri).__name__}")
    parts = urlsplit(uri)
    scheme = parts.scheme
    if scheme not in SCHEMES:
        raise ValueError(
            f"unknown store scheme in {redact(uri)!r}: use lmdb://, memory://, redis://, "
            "rediss:// or redis+cluster://"
        )
    kind, known = SCHEMES[scheme]
    if kind == "memory":
        if parts.netloc or parts.path:
            raise ValueError(f"memory:// names no path, not {redact(uri)!r}")
        return StoreSpec(uri, scheme, kind, _options(scheme, parts.query, known))
    if kind == "lmdb":
        path = uri_path(uri)
        if not path:
            raise ValueError(f"{redact(uri)!r} names no path")
        return StoreSpec(uri, scheme, kind, _options(scheme, parts.query, known), path=path)
    check_server_uri(uri)
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    tls = [(name, text) for name, text in pairs if name.startswith("ssl_")]
    if tls and scheme != "rediss":
        raise ValueError(f"{tls[0][0]}= needs a rediss:// URI (TLS to one server)")
    ours = urlencode([(name, text) for name, text in pairs if not name.startswith("ssl_")])
    options = _options(scheme, ours, known)
    if scheme != "redis+cluster":
        return StoreSpec(
            uri, scheme, kind, options, url=parts._replace(query=urlencode(tls)).geturl()
        )
    nodes: list[tuple[str, int]] = []
    for node in parts.netloc.rpartition("@")[2].split(","):
        host, _, port = node.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"{redact(uri)!r}: name each cluster node as host:port, not {node!r}")
        nodes.append((host.strip("[]"), int(port)))
    # redis-py reads a single server's credentials from its URL; a cluster's
    # go to every node it connects to.
    return StoreSpec(
        uri,
        scheme,
        kind,
        options,
        nodes=nodes,
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password is not None else None,
    )


def check_server_uri(uri: str) -> None:
    """Refuse a Redis URI that redis-py would read other than it reads to a person.

    Its credentials must be percent-encoded and its path a database number
    (``_check_userinfo``, ``_check_database``). The messages never repeat
    the URI.
    """
    _check_userinfo(uri)
    _check_database(uri)


def _check_userinfo(uri: str) -> None:
    """Refuse a server URI whose user name or password is not percent-encoded.

    A space, ``/``, ``?`` or ``#`` written as it is in a password ends the
    host part where a URI reader ends it: the rest of the password would be
    read as the host, the path or the query, and the messages that name
    those would show it (and ``redact`` could not tell it from a host). So
    the host part may hold no space, and an ``@`` may not come after it,
    which is where such a password leaves its ``@``. The message never
    repeats the URI.
    """
    scheme, _, rest = uri.partition("://")
    ends = [at for at in (rest.find(c) for c in "/?#") if at >= 0]
    host_part = rest[: min(ends)] if ends else rest
    after = rest[len(host_part) :]
    if any(c.isspace() for c in host_part) or ("@" in after and "@" not in host_part):
        raise ValueError(
            f"a {scheme}:// URI's user name and password must be percent-encoded: a space, "
            "/, ?, # or @ in them written as %20, %2F, %3F, %23 or %40 (and an @ after the "
            "host, in an option's value, as %40)"
        )


def _check_database(uri: str) -> None:
    """Refuse a server URI whose path is not a database number.

    redis-py reads ``redis://host/abc`` as database 0 and ``redis://host/0/1``
    as database 1: a typo would put the sessions in another database without
    a word. The path is empty, ``/`` or ``/N``; a cluster has only database 0.
    """
    scheme, _, _ = uri.partition("://")
    path = urlsplit(uri).path
    number = path[1:] if path.startswith("/") else path
    if not number:
        return
    if not (number.isascii() and number.isdigit()):
        raise ValueError(
            f"the path of a {scheme}:// URI is the number of a database (/0, /1, ...), "
            "and nothing else"
        )
    if scheme == "redis+cluster" and int(number) != 0:
        raise ValueError("a Redis Cluster has only database 0: end its URI with /0 or no path")


def _options(scheme: str, query: str, known: dict[str, Reader]) -> dict[str, Any]:
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
