"""The stores a SessionService can run on, and ``open_store`` to pick one by URI."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import StoreNotFoundError
from .completion import Completion
from .lmdb.opening import open_failure
from .lmdb.store import LmdbStore
from .memory import MemoryStore
from .protocol import Store
from .uri import ENCRYPTION_OPTIONS, SCHEMES, StoreSpec, parse_store_uri, redact

__all__ = ["Completion", "LmdbStore", "MemoryStore", "Store", "open_store", "redact"]


def open_store(uri: str, *, create: bool = True, encryption: Any = None, **options: Any) -> Store:
    """Open the store a URI names: ``memory://``, ``lmdb:///path?durability=deferred``,
    ``redis://host:port/db?ttl=3600&prefix=name``, ``rediss://...`` (TLS) or
    ``redis+cluster://user:password@host:port,host:port?...`` (Redis Cluster).

    Keyword options override those of the query. Both take ``session_ttl``
    (seconds): sessions idle for longer are expired in the background.
    ``create=False`` (for a reader) refuses, with ``StoreNotFoundError``, an
    LMDB path or a Redis prefix that holds no store, and writes nothing.

    ``encryption`` (a ``sessionscope.crypto.Encryption``), or the options
    ``key_file``/``key_env``, ``keys`` and ``keep_opened``, open the store encrypted (see
    docs/encryption.md). A store written encrypted is refused without its
    key (``IncompatibleStoreError``), and one holding plaintext with one.
    """
    spec = parse_store_uri(uri)
    merged = {**spec.options, **options}
    crypto = {name: merged.pop(name) for name in list(merged) if name in ENCRYPTION_OPTIONS}
    if crypto and encryption is not None:
        raise ValueError(
            "give encryption= or the key options (key_file, key_env, keys, keep_opened), not both"
        )
    if crypto and not ({"key_file", "key_env"} & set(crypto)):
        given = ", ".join(f"{name}=" for name in crypto)
        raise ValueError(f"{given} needs the key-encryption key: key_file= or key_env=")
    if crypto:
        encryption = _crypto().Encryption(**crypto)
    if encryption is None:
        # The store refuses itself when it was written encrypted.
        return _open_plain(spec, create, merged)
    if spec.kind != "memory":
        merged["encrypted_ok"] = True
    crypto = _crypto()
    default_keys = None
    if spec.kind == "memory":
        default_keys = "memory://"
    elif spec.kind == "lmdb":
        default_keys = f"lmdb://{Path(spec.path).absolute()}.keys"
    # The key first: a missing or wrong one leaves a new store's path uncreated.
    kek = crypto.checked_kek(encryption, default_keys, create)
    store = _open_plain(spec, create, merged)
    try:
        encrypted: Store = crypto.open_encrypted(store, encryption, default_keys, create, kek)
        return encrypted
    except BaseException:
        store.close()
        raise


def _crypto() -> Any:
    """Return sessionscope.crypto; without cryptography installed, say how to get it."""
    try:
        from .. import crypto
    except ImportError as error:
        raise ValueError(
            f"encryption needs cryptography: pip install 'sessionscope[encryption]' ({error})"
        ) from None
    return crypto


def _open_plain(spec: StoreSpec, create: bool, options: dict[str, Any]) -> Store:
    """Open the store a URI names, as it is."""
    if spec.kind == "memory":
        unknown = sorted(set(options) - set(SCHEMES["memory"][1]))
        if unknown:
            raise ValueError(f"unknown memory:// option {unknown[0]!r}; known: session_ttl")
        return MemoryStore(**options)
    if spec.kind == "redis":
        return _open_redis(spec, create, options)
    try:
        found = create or (Path(spec.path) / "data.mdb").is_file()
    except OSError as error:  # a directory this user may not read: as opening says it
        raise open_failure(Path(spec.path), error) from error
    if not found:
        raise StoreNotFoundError(
            f"{spec.path} holds no store", hint="check the path; reading never creates a store"
        )
    return LmdbStore(spec.path, **options)


def _open_redis(spec: StoreSpec, create: bool, options: dict[str, Any]) -> Store:
    """Open a RedisStore; the redis extra is imported only here."""
    try:
        from .redis.store import RedisStore
    except ImportError as error:
        raise ValueError(
            f"{spec.scheme}:// needs the redis extra: pip install 'sessionscope[redis]' ({error})"
        ) from None
    parsed = {**options, "create": create}
    if spec.scheme != "redis+cluster":
        return RedisStore(spec.url, **parsed)
    if spec.username:
        parsed.setdefault("username", spec.username)
    if spec.password is not None:
        parsed.setdefault("password", spec.password)
    return RedisStore(cluster=spec.nodes, **parsed)
