"""A Redis key store whose prefix holds glob characters lists and erases its own keys only.

Its records are named ``prefix + hex(key)`` and listed with SCAN MATCH: the
prefix is the user's, so ``*``, ``?``, ``[``, ``]`` and ``\\`` in it must be
taken literally, or erasure leaves data keys behind and a key rotation
re-wraps nothing. Every test runs on the session's real redis-server, each
under prefixes of its own.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest

from _redis import RedisServer
from sessionscope import SyncSessionService
from sessionscope.stores import open_store

pytest.importorskip("cryptography")
pytest.importorskip("redis")

from sessionscope.crypto import Encryption, Kek, open_key_store, rotate_key
from sessionscope.crypto.keyring import app_prefix, app_scope, user_scope
from sessionscope.errors import EncryptionKeyError

KEK = bytes.fromhex("3c" * 32)
NEW_KEK = bytes.fromhex("d1" * 32)
GLOB_PREFIXES = ["keys*:", "keys?:", "keys[1]:", "keys\\:", "k[^a-z]*?\\]:"]


def _keys_uri(server: RedisServer, prefix: str) -> str:
    return f"{server.url}?prefix={quote(prefix, safe='')}"


def _raw(server: RedisServer, prefix: str) -> dict[bytes, bytes]:
    """Return every Redis key that starts with ``prefix`` (compared as bytes) and its value."""
    import redis

    client = redis.Redis.from_url(server.url)
    try:
        start = prefix.encode()
        names = client.scan_iter(count=1000)
        return {name: client.get(name) for name in names if name.startswith(start)}
    finally:
        client.close()


@pytest.fixture
def tag() -> str:
    """Return a tag that keeps this test's prefixes apart from every other test's."""
    return uuid.uuid4().hex[:12]


@pytest.fixture
def opened() -> Iterator[list[Any]]:
    """Collect what a test opens and close it at the end, even when the test fails."""
    found: list[Any] = []
    yield found
    for thing in found:
        thing.close()


RECORDS = {
    app_scope("shop"): b"app shop",
    user_scope("shop", "ada"): b"user ada",
    user_scope("shop", "bob"): b"user bob",
    app_scope("bank"): b"app bank",
    user_scope("bank", "ada"): b"bank ada",
}


def _fill(keys: Any) -> None:
    keys.add(b"meta", b"the meta record")
    for key, value in RECORDS.items():
        keys.add(key, value)


@pytest.mark.parametrize("glob", GLOB_PREFIXES)
def test_a_prefix_with_glob_characters_lists_and_erases_exactly_its_keys(
    redis_server: RedisServer, tag: str, glob: str, opened: list[Any]
) -> None:
    prefix = tag + glob
    keys = open_key_store(_keys_uri(redis_server, prefix))
    opened.append(keys)
    _fill(keys)
    assert keys.items(b"k") == sorted(RECORDS.items())
    shop = sorted((k, v) for k, v in RECORDS.items() if k.startswith(app_prefix("shop")))
    assert keys.items(app_prefix("shop")) == shop and len(shop) == 3
    assert keys.items(b"meta") == [(b"meta", b"the meta record")]

    assert keys.delete_prefix(app_prefix("shop")) == 3
    left = {name[len(prefix) :] for name in _raw(redis_server, prefix)}
    kept = (b"meta", app_scope("bank"), user_scope("bank", "ada"))
    assert left == {key.hex().encode() for key in kept}
    assert keys.items(app_prefix("shop")) == []
    assert keys.delete_prefix(app_prefix("shop")) == 0
    assert keys.items(b"k") == sorted((k, v) for k, v in RECORDS.items() if b"bank" in v)


@pytest.mark.parametrize("glob", ["a*:", "a?:", "a[b]:", "a[a-z]:", "*"])
def test_a_prefix_that_is_a_glob_of_another_key_stores_prefix_never_reaches_its_keys(
    redis_server: RedisServer, tag: str, glob: str, opened: list[Any]
) -> None:
    # Unescaped, tag+"a*:" + hex + "*" matches tag+"ab:" + hex: erasing an app
    # in one key store would erase it in the other.
    mine, theirs = tag + glob, tag + "ab:"
    keys = open_key_store(_keys_uri(redis_server, mine))
    other = open_key_store(_keys_uri(redis_server, theirs))
    opened += [keys, other]
    _fill(other)
    theirs_before = _raw(redis_server, theirs)
    assert keys.items(b"") == [] and keys.delete_prefix(b"") == 0
    assert keys.delete_prefix(app_prefix("shop")) == 0
    assert _raw(redis_server, theirs) == theirs_before

    keys.add(app_scope("shop"), b"mine")
    assert keys.items(b"k") == [(app_scope("shop"), b"mine")]
    assert keys.delete_prefix(app_prefix("shop")) == 1
    assert _raw(redis_server, theirs) == theirs_before
    assert other.items(b"k") == sorted(RECORDS.items())


def test_a_name_under_the_prefix_the_key_store_did_not_write_is_neither_listed_nor_deleted(
    redis_server: RedisServer, tag: str, opened: list[Any]
) -> None:
    import redis

    prefix = tag + "keys[1]:"
    keys = open_key_store(_keys_uri(redis_server, prefix))
    opened.append(keys)
    _fill(keys)
    client = redis.Redis.from_url(redis_server.url)
    opened.append(client)
    # Not hex, odd hex, hex with a space (bytes.fromhex takes it), upper-case hex.
    strangers = [b"not-hex", b"6b0", b"6b 00", app_scope("shop").hex().upper().encode()]
    for name in strangers:
        client.set(prefix.encode() + name, b"someone else's")
    assert keys.items(b"") == sorted([(b"meta", b"the meta record"), *RECORDS.items()])
    assert keys.delete_prefix(b"") == 1 + len(RECORDS)
    assert set(_raw(redis_server, prefix)) == {prefix.encode() + name for name in strangers}


@pytest.mark.parametrize("glob", ["keys[1]:", "keys*:", "keys\\?:"])
def test_delete_app_and_rotate_key_reach_the_data_keys_under_a_glob_prefix(
    redis_server: RedisServer, tag: str, glob: str, opened: list[Any]
) -> None:
    prefix = tag + glob
    keys_uri = _keys_uri(redis_server, prefix)
    # A key store beside it that the prefix's glob would match: it is not touched.
    neighbour = tag + glob.replace("*", "x").replace("?", "x").replace("[1]", "1")
    neighbour_keys = open_key_store(_keys_uri(redis_server, neighbour))
    opened.append(neighbour_keys)
    _fill(neighbour_keys)
    neighbour_before = _raw(redis_server, neighbour)

    def service(key: bytes) -> SyncSessionService:
        store = open_store(
            f"{redis_server.url}?prefix={tag}-data", encryption=Encryption(keys=keys_uri, key=key)
        )
        opened.append(store)
        return SyncSessionService(store)

    svc = service(KEK)
    for app in ("shop", "bank"):
        for user in ("ada", "bob"):
            svc.create_session(
                app_name=app, user_id=user, session_id="s", state={"v": user, "app:a": 1}
            )
    scopes = {bytes.fromhex(name[len(prefix) :].decode()) for name in _raw(redis_server, prefix)}
    assert sum(scope.startswith(app_prefix("shop")) for scope in scopes) == 3

    svc.delete_app(app_name="shop")
    scopes = {bytes.fromhex(name[len(prefix) :].decode()) for name in _raw(redis_server, prefix)}
    assert not any(scope.startswith(app_prefix("shop")) for scope in scopes)
    assert sum(scope.startswith(app_prefix("bank")) for scope in scopes) == 3

    assert rotate_key(keys_uri, Kek(KEK), Kek(NEW_KEK)) == 3
    with pytest.raises(EncryptionKeyError, match="is not the one"):
        service(KEK)
    rotated = service(NEW_KEK)
    session = rotated.get_session(app_name="bank", user_id="ada", session_id="s")
    assert session is not None and session.state["v"] == "ada"
    assert _raw(redis_server, neighbour) == neighbour_before


def test_erasing_an_app_scans_a_crowded_server_a_thousand_slots_at_a_time(
    redis_server: RedisServer, tag: str, opened: list[Any]
) -> None:
    """The key store shares its server with other keys: erasure's SCAN must not crawl them."""
    import redis

    client = redis.Redis.from_url(redis_server.url)
    opened.append(client)
    crowd = f"{tag}-crowd:".encode()
    try:
        for start in range(0, 20_000, 1_000):
            client.mset({crowd + str(n).encode(): b"x" for n in range(start, start + 1_000)})
        keys_uri = _keys_uri(redis_server, f"{tag}-keys:")
        store = open_store(
            f"{redis_server.url}?prefix={tag}-data", encryption=Encryption(keys=keys_uri, key=KEK)
        )
        opened.append(store)
        svc = SyncSessionService(store)
        for app in ("shop", "bank"):
            svc.create_session(app_name=app, user_id="ada", session_id="s", state={"v": app})
        size = client.dbsize()
        scans_before = client.info("commandstats").get("cmdstat_scan", {}).get("calls", 0)
        svc.delete_app(app_name="shop")
        scans = client.info("commandstats")["cmdstat_scan"]["calls"] - scans_before
        # SCAN COUNT n visits about n of the table's slots (a power of two at
        # least the key count); SCAN's own default of ten would take thousands.
        assert 0 < scans <= 2 * size // 1_000 + 4, (scans, size)
        assert svc.get_session(app_name="shop", user_id="ada", session_id="s") is None
        bank = svc.get_session(app_name="bank", user_id="ada", session_id="s")
        assert bank is not None and bank.state["v"] == "bank"
    finally:
        for start in range(0, 20_000, 1_000):
            client.delete(*(crowd + str(n).encode() for n in range(start, start + 1_000)))
