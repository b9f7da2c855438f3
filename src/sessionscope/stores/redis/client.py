"""redis-py clients of a Redis store: made from its settings, packing commands with hiredis.

Also the eviction-policy check a store makes when it opens (see
``RedisStore``), ``any_key``, which tells whether a prefix holds a key, and
``delete_keys``, which empties a prefix.
"""

from __future__ import annotations

import logging
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster

from ...errors import UnsafeStoreError
from .common import _text
from .runners import _REDIS_ERRORS, POOL_SIZE, _failure, _retry

hiredis: Any
try:
    import hiredis
except ImportError:  # the redis extra installs it; without it redis-py packs in Python
    hiredis = None

_log = logging.getLogger(__name__)
# The eviction policy that never drops a key (see docs/redis.md): any other
# may remove a session's record, events or state on its own.
_SAFE_POLICY = "noeviction"


class _HiredisPacking:
    """Pack commands with hiredis in C, in one call.

    redis-py's asyncio connections pack in Python, one call per argument, and
    its sync ones walk the arguments in Python before hiredis packs them: for
    an append of thirty arguments (thousands in a bulk call) that costs more
    than the server's work. An asyncio connection packs through its public
    ``pack_command``; a sync one takes a ``command_packer`` (``_CPacker``).
    """

    def pack_command(self, *args: Any) -> list[bytes]:
        return _pack_in_c(*args)


def _pack_in_c(*args: Any) -> list[bytes]:
    if isinstance(args[0], str):
        args = (*args[0].encode().split(), *args[1:])
    # Every argument goes to hiredis as bytes: hiredis 3.5 converting an int
    # or a float itself crashes the process (SIGSEGV) when a signal handler
    # raises meanwhile, as Ctrl-C's does.
    return [hiredis.pack_command(tuple([a if type(a) is bytes else _bytes_of(a) for a in args]))]


def _bytes_of(value: Any) -> Any:
    """Return a command argument as the bytes Redis reads (anything else as it is)."""
    kind = type(value)
    if kind is str:
        return value.encode()
    if kind is int:
        return b"%d" % value
    if kind is float:
        return float.__repr__(value).encode()
    return value


class _CPacker:
    """The command packer of a sync connection: hiredis, in one call."""

    __slots__ = ()
    pack = staticmethod(_pack_in_c)


def _packing_in_c(connection_class: type) -> type:
    """Return ``connection_class`` packing with hiredis (itself without hiredis)."""
    if hiredis is None:
        return connection_class
    return type(f"Hiredis{connection_class.__name__}", (_HiredisPacking, connection_class), {})


# What a sync connection packs with: redis-py's public command_packer argument.
_SYNC_PACKING: dict[str, Any] = {} if hiredis is None else {"command_packer": _CPacker()}


def _async_pool(url: str, options: dict[str, Any]) -> Any:
    """Return an asyncio connection pool for ``url``, its connections packing with hiredis.

    Made as ``ConnectionPool.from_url`` makes it (the URL's options win over
    ``options``), with the URL's connection class (TCP, TLS or Unix socket)
    given at creation.
    """
    settings = {**options, **redis.asyncio.connection.parse_url(url)}
    base = settings.pop("connection_class", redis.asyncio.Connection)
    return redis.asyncio.ConnectionPool(connection_class=_packing_in_c(base), **settings)


def new_client(
    url: str | None,
    nodes: list[tuple[str, int]] | None,
    *,
    ssl: bool,
    credentials: dict[str, Any],
    timeout: float,
    where: str,
    asynchronous: bool,
) -> Any:
    """Return a client of one server (``url``) or of a cluster (its startup ``nodes``).

    ``credentials`` are a cluster's (a URL carries a server's); ``where``
    names the store in logs and messages, without a password.
    """
    common: dict[str, Any] = {
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "retry": _retry(where, asynchronous),
        # Per server or node; a runner runs no more plans at once.
        "max_connections": POOL_SIZE,
        "protocol": 2,
    }
    if url is not None:
        if asynchronous:
            return redis.asyncio.Redis.from_pool(_async_pool(url, common))
        return redis.Redis.from_url(url, **common, **_SYNC_PACKING)
    if asynchronous:
        # (The async cluster client takes no connection class: it packs in Python.)
        async_nodes = [redis.asyncio.cluster.ClusterNode(h, p) for h, p in nodes or []]
        return redis.asyncio.cluster.RedisCluster(
            startup_nodes=async_nodes, ssl=ssl, **credentials, **common
        )
    sync_nodes = [
        redis.cluster.ClusterNode(h, p)  # type: ignore[no-untyped-call]
        for h, p in nodes or []
    ]
    try:
        return redis.cluster.RedisCluster(
            startup_nodes=sync_nodes, ssl=ssl, **credentials, **common
        )
    except _REDIS_ERRORS as error:
        raise _failure(error, where) from error


def _policy_of(client: Any) -> str | None:
    """Return a server's maxmemory-policy, None when neither CONFIG nor INFO tells it.

    CONFIG may be renamed or refused by an ACL; INFO memory carries the same setting.
    """
    try:
        found = client.config_get("maxmemory-policy").get("maxmemory-policy")
    except redis.exceptions.ResponseError:
        found = None
    if found is None:
        try:
            found = client.info("memory").get("maxmemory_policy")
        except redis.exceptions.ResponseError:
            return None
    return _text(found)


def check_policy(client: Any, cluster: bool, where: str, allow_eviction: bool) -> None:
    """Refuse a server (any primary of a cluster) that may evict keys; see ``RedisStore``."""
    try:
        servers = (
            [(f"{n.host}:{n.port}", client.get_redis_connection(n)) for n in client.get_primaries()]
            if cluster
            else [(where, client)]
        )
        policies = [(name, _policy_of(server)) for name, server in servers]
    except _REDIS_ERRORS as error:
        raise _failure(error, where) from error
    unsafe = [(name, policy) for name, policy in policies if policy != _SAFE_POLICY]
    if not unsafe:
        return
    name, policy = unsafe[0]
    said = "an unknown maxmemory-policy" if policy is None else f"maxmemory-policy {policy}"
    message = f"the Redis server at {name} has {said}: it may evict sessions' keys"
    if not allow_eviction:
        raise UnsafeStoreError(
            message,
            hint="set maxmemory-policy noeviction on the server (see docs/redis.md), or "
            "accept lost sessions with ?allow_eviction=true (allow_eviction=True)",
        )
    _log.warning("%s; opened all the same (allow_eviction)", message)


def glob_literal(text: bytes) -> bytes:
    """Return ``text`` as a SCAN MATCH pattern that matches it and nothing else.

    A prefix is the user's: its glob characters (``*?[]\\``) are escaped with
    a backslash, as Redis reads patterns, so ``a*`` never matches ``ab``.
    """
    return b"".join(b"\\" + bytes([c]) if c in b"*?[]\\" else bytes([c]) for c in text)


def scan_prefix(client: Any, cluster: bool, prefix: bytes) -> Any:
    """Yield every key starting with ``prefix`` (on every primary of a cluster).

    SCAN walks the whole keyspace of a node, which the store may share with
    millions of other keys: a thousand slots a call rather than SCAN's ten
    makes that a hundred times fewer round trips.
    """
    pattern = glob_literal(prefix) + b"*"
    for node in client.get_primaries() if cluster else [None]:
        options = {} if node is None else {"target_nodes": node}
        for key in client.scan_iter(match=pattern, count=1000, **options):
            if key.startswith(prefix):
                yield key


def any_key(client: Any, cluster: bool, prefix: bytes, where: str) -> bytes | None:
    """Return a key starting with ``prefix``, None when there is none."""
    try:
        return next(scan_prefix(client, cluster, prefix), None)
    except _REDIS_ERRORS as error:
        raise _failure(error, where) from error


def delete_keys(client: Any, cluster: bool, prefix: bytes, where: str) -> int:
    """Delete every key starting with ``prefix`` (on every primary of a cluster); say how many."""
    deleted = 0
    try:
        keys = list(scan_prefix(client, cluster, prefix))
        for start in range(0, len(keys), 500):
            pipe = client.pipeline(transaction=False)
            for key in keys[start : start + 500]:
                pipe.delete(key)
            deleted += sum(pipe.execute())
    except _REDIS_ERRORS as error:
        raise _failure(error, where) from error
    return deleted
