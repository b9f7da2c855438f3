"""Damage an encrypted store can meet, and mistakes an operator can make with one.

A key store record altered outside sessionscope, an event whose sealed
framing is damaged, an erased user restored from a dump, a trace export
that would write values in clear, `verify` given a bad option, and a store
another process holds without a key: each is named or refused for what it
is, on real LMDB files, real processes and a real redis-server.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from _stores import run_cli
from sessionscope import SyncSessionService
from sessionscope.codec import pack, unpack
from sessionscope.errors import CorruptStoreError, EncryptionKeyError, IncompatibleStoreError

pytest.importorskip("cryptography")

from sessionscope.crypto import Kek, open_key_store, rotate_key
from sessionscope.crypto.keyring import SCOPES
from test_encryption import KEK, OTHER_KEK, SECRETS, Place, _quote, fill, place, readable

__all__ = ["place"]  # the fixture, taken from test_encryption


def _label_one_record(keys_uri: str, kek_id: str) -> bytes:
    """Make one data-key record name ``kek_id`` as its KEK (its wrapped keys untouched)."""
    keys = open_key_store(keys_uri)
    try:
        scope, raw = next(iter(keys.items(SCOPES)))
        _, current, wrapped = unpack(raw)
        assert keys.swap(scope, raw, pack([kek_id, current, wrapped]))
        return scope
    finally:
        keys.close()


def _reads(store: object) -> None:
    """Read everything fill wrote: both users' sessions and the app's state."""
    for user in ("ada", "bob"):
        readable(store, user)
    store.read_app_state("shop")  # type: ignore[attr-defined]


def test_a_key_record_naming_a_foreign_key_is_corrupt_and_rotation_never_passes_it(
    place: Place,
) -> None:
    store = place.open()
    fill(store)
    store.close()
    _label_one_record(place.keys, "0123456789abcdef")
    store = place.open()
    try:
        # Not "a rotation is unfinished": no rotation ever used that key.
        with pytest.raises(CorruptStoreError, match="none of the store's key-encryption keys"):
            _reads(store)
    finally:
        store.close()
    # The rotation re-wraps the other records, then refuses to call itself done.
    with pytest.raises(CorruptStoreError, match=r"a data-key record .* names key id"):
        rotate_key(place.keys, Kek(KEK), Kek(OTHER_KEK))
    keys = open_key_store(place.keys)
    try:
        labels = sorted(unpack(raw)[0] for _, raw in keys.items(SCOPES))
    finally:
        keys.close()
    assert labels == sorted(["0123456789abcdef"] + [Kek(OTHER_KEK).key_id] * (len(labels) - 1))
    # Unfinished: both keys still open the store, the new one reads the rest.
    place.open(key=KEK).close()
    store = place.open(key=OTHER_KEK)
    try:
        with pytest.raises(CorruptStoreError):
            _reads(store)
    finally:
        store.close()


def test_a_key_record_under_the_key_rotated_from_still_says_the_rotation_is_unfinished(
    place: Place,
) -> None:
    store = place.open()
    fill(store)
    store.close()
    assert rotate_key(place.keys, Kek(KEK), Kek(OTHER_KEK)) == 3
    # As a process still holding the old key leaves a record it wrote meanwhile.
    _label_one_record(place.keys, Kek(KEK).key_id)
    store = place.open(key=OTHER_KEK)
    try:
        with pytest.raises(EncryptionKeyError, match="rotation is unfinished"):
            _reads(store)
    finally:
        store.close()


def test_an_event_whose_sealed_framing_is_damaged_names_its_session(tmp_path: Path) -> None:
    import lmdb

    place = Place("lmdb", tmp_path)
    store = place.open()
    fill(store)
    store.close()
    env = lmdb.open(str(tmp_path / "store"), max_dbs=8)
    try:
        data = env.open_db(b"data", create=False)
        with env.begin(write=True, db=data) as txn:
            # The first event of the first session: its key's kind byte is b"e".
            key = next(k for k in txn.cursor().iternext(values=False) if k[8:9] == b"e")
            value = bytearray(txn.get(key))
            value[9] ^= 1  # inside the record's msgpack framing, before the ciphertext
            txn.put(key, bytes(value))
    finally:
        env.close()
    store = place.open()
    try:
        svc = SyncSessionService(store)
        with pytest.raises(CorruptStoreError, match="an event of session 'shop'/'ada'/'s1'"):
            svc.get_session(app_name="shop", user_id="ada", session_id="s1")
        assert readable(store, "bob")
    finally:
        store.close()


def test_a_trace_of_an_encrypted_store_needs_plaintext_said(tmp_path: Path) -> None:
    place = Place("lmdb", tmp_path)
    store = place.open()
    fill(store)
    store.close()
    env = {"SESSIONSCOPE_TEST_KEK": KEK.hex()}
    keyed = f"{place.uri()}?key_env=SESSIONSCOPE_TEST_KEK&keys={_quote(place.keys)}"
    out = tmp_path / "shop.trace"
    trace = ["export", keyed, str(out), "--format", "trace", "--app", "shop"]
    refused = run_cli(*trace, extra_env=env)
    assert refused.returncode == 2, refused.stderr
    assert "--plaintext" in refused.stderr and "Traceback" not in refused.stderr
    assert not out.exists() and not out.with_name(out.name + ".partial").exists()
    done = run_cli(*trace, "--plaintext", extra_env=env)
    assert done.returncode == 0, done.stderr
    assert SECRETS["session"] in out.read_bytes()
    # A dump needs no such word: it keeps the values sealed.
    dump = tmp_path / "shop.ssd"
    done = run_cli("export", keyed, str(dump), "--app", "shop", extra_env=env)
    assert done.returncode == 0, done.stderr
    assert SECRETS["session"] not in dump.read_bytes()


@pytest.mark.parametrize(
    "option",
    ["keep_opened=-1", "durabilty=deferred", "keys={keys}"],
    ids=["bad-value", "misspelt", "keys-without-key"],
)
def test_verify_calls_a_bad_option_bad_usage_not_a_damaged_store(
    tmp_path: Path, option: str
) -> None:
    place = Place("lmdb", tmp_path)
    store = place.open()
    fill(store)
    store.close()
    data = tmp_path / "store" / "data.mdb"
    before = hashlib.sha256(data.read_bytes()).hexdigest()
    env = {"SESSIONSCOPE_TEST_KEK": KEK.hex()}
    keyed = f"{place.uri()}?key_env=SESSIONSCOPE_TEST_KEK&keys={_quote(place.keys)}"
    given = option.format(keys=_quote(place.keys))
    uri = f"{place.uri()}?{given}" if given.startswith("keys=") else f"{keyed}&{given}"
    done = run_cli("verify", uri, extra_env=env)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "restore" not in done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert hashlib.sha256(data.read_bytes()).hexdigest() == before
    assert run_cli("verify", keyed, extra_env=env).returncode == 0


def test_an_adk_listing_leaves_out_an_erased_user_restored_from_a_dump(
    place: Place, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Everyone else lists as before; the erased user's leftovers are left out, and logged."""
    pytest.importorskip("google.adk")
    import asyncio

    from sessionscope.adk import _AdkService  # the listing every ADK service of ours shares
    from sessionscope.admin.dump import export_dump, import_dump
    from sessionscope.errors import KeyErasedError

    store = place.open()
    fill(store)
    export_dump(store, tmp_path / "before.ssd")
    SyncSessionService(store).delete_user(app_name="shop", user_id="ada")
    store.close()
    copy = place.open("copy")
    import_dump(copy, tmp_path / "before.ssd")
    with pytest.raises(KeyErasedError):
        readable(copy, "ada")

    async def listed() -> list[str]:
        service = _AdkService(copy)
        return [s.user_id for s in (await service.list_sessions(app_name="shop")).sessions]

    with caplog.at_level("WARNING", logger="sessionscope.adk"):
        assert asyncio.run(listed()) == ["bob"]
    assert "left out 1 session(s) sealed under erased keys" in caplog.text
    copy.close()


def test_a_store_another_process_opened_without_a_key_is_not_made_encrypted(
    tmp_path: Path,
) -> None:
    """That process would write plaintext into it, and read sealed values as data."""
    from _children import Child

    place = Place("lmdb", tmp_path)
    plain = Child(tmp_path, "hold_open", str(tmp_path / "store"), stdin=True)
    try:
        plain.expect("open")
        before = (tmp_path / "store" / "data.mdb").read_bytes()
        with pytest.raises(IncompatibleStoreError, match="opened without encryption elsewhere"):
            place.open()
        assert (tmp_path / "store" / "data.mdb").read_bytes() == before
        assert not (tmp_path / "keys").exists()
        plain.send("close")
        plain.expect("closed")
        plain.wait_ok()
    finally:
        plain.reap()
    # Closed everywhere and still empty: the key's open makes it encrypted.
    store = place.open()
    try:
        fill(store)
        assert readable(store, "ada")
    finally:
        store.close()


def test_a_redis_store_this_open_did_not_create_is_not_made_encrypted(tmp_path: Path) -> None:
    """A Redis server does not tell its clients apart: one that created the store may hold it."""
    from sessionscope.stores import open_store

    place = Place("redis", tmp_path)
    open_store(place.uri()).close()  # another client created it, with no key
    with pytest.raises(IncompatibleStoreError, match="opened without encryption elsewhere"):
        place.open()
    # A store the key's own open creates is encrypted, and opens again with it.
    fresh = place.open("fresh")
    try:
        fill(fresh)
    finally:
        fresh.close()
    again = place.open("fresh")
    try:
        assert readable(again, "bob")
    finally:
        again.close()
