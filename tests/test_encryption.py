"""Encryption at rest: erasure that reaches backups and dumps, tampering, wrong keys, byte scans.

Every test runs on real LMDB files and a real redis-server: the Redis kind
keeps its data keys in Redis under a prefix of their own, the LMDB kind in
an LMDB file beside the store. (The contract, retention and dump suites run
on encrypted stores in test_encryption_contract.py.)
"""

from __future__ import annotations

import asyncio
import copy
import gzip
import json
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import quote

import pytest

import _redis
from _stores import FailingAfter, child_json, ev, run
from sessionscope import Event, EventActions, SessionService, SyncSessionService
from sessionscope.admin.dump import export_dump, import_dump
from sessionscope.admin.ops import backup
from sessionscope.errors import (
    CorruptStoreError,
    DumpError,
    EncryptionKeyError,
    IncompatibleStoreError,
    KeyErasedError,
    StoreNotFoundError,
)
from sessionscope.stores import open_store
from sessionscope.stores.records import EventCopy, SessionCopy

pytest.importorskip("cryptography")

from sessionscope.crypto import (
    EncryptedStore,
    Encryption,
    Kek,
    kek_from,
    new_key_text,
    open_key_store,
    rotate_key,
)
from sessionscope.crypto.keyring import rotate_kek

KEK = bytes.fromhex("5e" * 32)
OTHER_KEK = bytes.fromhex("a7" * 32)
# Plaintext that must never reach a file: one marker per place a value can be.
SECRETS = {
    "session": b"SESSION-SECRET-6b1f",
    "user": b"USER-SECRET-0c9e",
    "app": b"APP-SECRET-77d2",
    "event": b"EVENT-SECRET-e41a",
    "delta": b"DELTA-SECRET-53bb",
    "temp": b"TEMP-SECRET-9f03",
}


class Place:
    """Where one test's encrypted stores live: LMDB directories, or Redis prefixes."""

    def __init__(self, kind: str, base: Path) -> None:
        self.kind = kind
        self.base = base
        self.tag = uuid.uuid4().hex
        self.server = _redis.shared("redis") if kind == "redis" else None

    def uri(self, name: str = "store") -> str:
        if self.server is not None:
            return f"{self.server.url}?prefix={self.tag}-{name}"
        return f"lmdb://{self.base / name}"

    @property
    def keys(self) -> str:
        if self.server is not None:
            return f"{self.server.url}?prefix={self.tag}-keys:"
        return f"lmdb://{self.base / 'keys'}"

    def open(self, name: str = "store", key: bytes = KEK, **options: Any) -> Any:
        return open_store(self.uri(name), encryption=Encryption(keys=self.keys, key=key), **options)

    def raw_bytes(self, name: str = "store") -> bytes:
        """Return every byte the store keeps: its LMDB file, or each Redis value of its prefix."""
        if self.server is None:
            return (self.base / name / "data.mdb").read_bytes()
        return _redis_bytes(self.server.url, f"{self.tag}-{name}")

    def key_bytes(self) -> bytes:
        if self.server is None:
            return (self.base / "keys" / "data.mdb").read_bytes()
        return _redis_bytes(self.server.url, f"{self.tag}-keys:")


def _redis_bytes(url: str, prefix: str) -> bytes:
    """Return every key under ``prefix`` and what it holds, in an order that does not move.

    SCAN, HGETALL and SMEMBERS answer in the order of the server's tables,
    which a rehash (other tests write to the same server) may change: the
    keys and the members of hashes and sets are sorted.
    """
    import redis

    client = redis.Redis.from_url(url)
    found: dict[bytes, list[bytes]] = {}
    try:
        for name in client.scan_iter(prefix.encode() + b"*", count=1000):
            kind = client.type(name)
            if kind == b"string":
                found[name] = [client.get(name)]
            elif kind == b"hash":
                found[name] = [b"%s=%s" % item for item in sorted(client.hgetall(name).items())]
            elif kind == b"list":
                found[name] = client.lrange(name, 0, -1)
            elif kind == b"zset":
                found[name] = [member for member, _ in client.zrange(name, 0, -1, withscores=True)]
            elif kind == b"set":
                found[name] = sorted(client.smembers(name))
            else:
                raise AssertionError(f"unexpected key type {kind!r}")
        assert found, f"no keys under {prefix}"
        return b"\n".join(b"\n".join([name, *found[name]]) for name in sorted(found))
    finally:
        client.close()


def _redis_copy(url: str, prefix: str) -> dict[bytes, bytes]:
    """Return a copy of every key of a prefix (DUMP), as a backup of the server would hold it."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        return {
            name: client.dump(name) for name in client.scan_iter(prefix.encode() + b"*", count=1000)
        }
    finally:
        client.close()


def _redis_restore(url: str, copy: dict[bytes, bytes]) -> None:
    import redis

    client = redis.Redis.from_url(url)
    try:
        for name, value in copy.items():
            client.restore(name, 0, value, replace=True)
    finally:
        client.close()


@pytest.fixture(params=["lmdb", "redis"])
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Place:
    return Place(request.param, tmp_path)


def fill(store: Any) -> None:
    """Write every scope for two users, ada and bob, with a secret in each place."""
    svc = SyncSessionService(store)
    for user in ("ada", "bob"):
        session = svc.create_session(
            app_name="shop",
            user_id=user,
            session_id="s1",
            state={
                "plan": SECRETS["session"].decode() + user,
                "user:card": SECRETS["user"].decode() + user,
                "app:motd": SECRETS["app"].decode(),
                "temp:scratch": SECRETS["temp"].decode(),
            },
        )
        for index in range(3):
            svc.append_event(
                session,
                ev(
                    content={"text": SECRETS["event"].decode() + user, "i": index},
                    delta={
                        "last": SECRETS["delta"].decode() + user,
                        "temp:t": SECRETS["temp"].decode(),
                    },
                ),
            )


def readable(store: Any, user: str) -> bool:
    """Tell whether a user's session reads back whole, with its secrets."""
    got = SyncSessionService(store).get_session(app_name="shop", user_id=user, session_id="s1")
    assert got is not None
    assert got.state["plan"] == SECRETS["session"].decode() + user
    assert got.state["user:card"] == SECRETS["user"].decode() + user
    assert "temp:scratch" not in got.state
    assert [e.content["i"] for e in got.events] == [0, 1, 2]
    return True


def assert_erased(store: Any, user: str) -> None:
    """Every read of an erased user's data raises KeyErasedError, saying the key was erased."""
    svc = SyncSessionService(store)
    with pytest.raises(KeyErasedError, match="erased"):
        svc.get_session(app_name="shop", user_id=user, session_id="s1")
    with pytest.raises(KeyErasedError, match="erased"):
        store.read_user_state("shop", user)
    with pytest.raises(KeyErasedError):
        store.read_events("shop", user, "s1", 0, 10)


def assert_no_plaintext(data: bytes, what: str) -> None:
    for name, secret in SECRETS.items():
        assert secret not in data, f"{name} plaintext found in {what}"
    for key in (KEK, KEK.hex().encode(), OTHER_KEK, OTHER_KEK.hex().encode()):
        assert key not in data, f"a key-encryption key found in {what}"


# -- erasure -------------------------------------------------------------------


def test_erasing_a_user_reaches_every_backup_dump_and_stale_copy(
    place: Place, tmp_path: Path
) -> None:
    store = place.open()
    fill(store)
    dump = tmp_path / "before.ssd"
    export_dump(store, dump)
    if place.kind == "lmdb":
        backup(store, tmp_path / "backup")
    else:
        stale = _redis_copy(place.server.url, f"{place.tag}-store")  # type: ignore[union-attr]
    assert readable(store, "ada") and readable(store, "bob")

    assert SyncSessionService(store).delete_user(app_name="shop", user_id="ada") == 1
    assert readable(store, "bob")
    store.close()

    # The backup, restored, still holds ada's ciphertext: none of it reads.
    if place.kind == "lmdb":
        restored = open_store(
            f"lmdb://{tmp_path / 'backup'}", encryption=Encryption(keys=place.keys, key=KEK)
        )
    else:
        _redis_restore(place.server.url, stale)  # type: ignore[union-attr]
        restored = place.open()
    try:
        assert restored.list_users("shop") == ["ada", "bob"]
        assert_erased(restored, "ada")
        assert readable(restored, "bob")
        assert restored.read_app_state("shop") == {"motd": SECRETS["app"].decode()}
        # What is left of ada is removed as any user is.
        assert SyncSessionService(restored).delete_user(app_name="shop", user_id="ada") == 1
    finally:
        restored.close()

    # The dump, imported elsewhere with the same key store: the same.
    elsewhere = place.open("elsewhere")
    try:
        counts = import_dump(elsewhere, dump)
        assert (counts.apps, counts.users, counts.sessions, counts.events) == (1, 2, 2, 6)
        assert_erased(elsewhere, "ada")
        assert readable(elsewhere, "bob")
    finally:
        elsewhere.close()


def test_erasing_an_app_destroys_its_key_and_its_users_keys(place: Place, tmp_path: Path) -> None:
    store = place.open()
    fill(store)
    SyncSessionService(store).create_session(app_name="other", user_id="ada", state={"k": 1})
    dump = tmp_path / "d.ssd.gz"
    export_dump(store, dump)
    assert SyncSessionService(store).delete_app(app_name="shop") == 2
    store.close()
    elsewhere = place.open("elsewhere")
    try:
        import_dump(elsewhere, dump)
        assert_erased(elsewhere, "ada")
        assert_erased(elsewhere, "bob")
        with pytest.raises(KeyErasedError):
            elsewhere.read_app_state("shop")
        # Another app of the same user keeps its own key.
        [meta] = SyncSessionService(elsewhere).list_sessions(app_name="other").sessions
        got = SyncSessionService(elsewhere).get_session(
            app_name="other", user_id="ada", session_id=meta.id
        )
        assert got is not None and got.state == {"k": 1}
    finally:
        elsewhere.close()


def test_a_user_created_again_after_erasure_gets_a_new_key(place: Place) -> None:
    store = place.open()
    try:
        fill(store)
        old = store.raw.load_session("shop", "ada", "s1", None, None).events[0]
        SyncSessionService(store).delete_user(app_name="shop", user_id="ada")
        fill_one = SyncSessionService(store).create_session(
            app_name="shop", user_id="ada", session_id="s1", state={"plan": "new"}
        )
        assert fill_one.state == {"plan": "new", "app:motd": SECRETS["app"].decode()}
        # The old record, put back where it was, is sealed under the erased key.
        copy = SessionCopy("shop", "ada", "s2", 1.0, 1.0, [], [_raw_event(old)])
        assert store.raw.restore_session(copy).result()
        with pytest.raises(KeyErasedError, match="erased"):
            store.load_session("shop", "ada", "s2", None, None)
    finally:
        store.close()


def test_an_old_dump_imported_after_an_erased_user_came_back_leaves_her_new_state_readable(
    place: Place, tmp_path: Path
) -> None:
    # ada is erased, then comes back (new keys, a new user map). An old
    # dump imported then holds her user map under the erased key: set over
    # the new map, a value no one can read would make every read of her
    # sessions fail. It is left out; her old sessions still come in, and
    # still say the key was erased.
    store = place.open()
    try:
        fill(store)
        dump = tmp_path / "old.ssd"
        export_dump(store, dump)
        svc = SyncSessionService(store)
        svc.delete_user(app_name="shop", user_id="ada")
        svc.create_session(
            app_name="shop", user_id="ada", session_id="back", state={"user:card": "new"}
        )
        counts = import_dump(store, dump)
        assert counts.erased_values == 1
        back = svc.get_session(app_name="shop", user_id="ada", session_id="back")
        assert back is not None and back.state["user:card"] == "new"
        assert store.read_user_state("shop", "ada") == {"card": "new"}
        with pytest.raises(KeyErasedError, match="erased"):
            svc.get_session(app_name="shop", user_id="ada", session_id="s1")
        assert readable(store, "bob")
        # Importing again changes nothing more.
        assert import_dump(store, dump).erased_values == 1
        assert store.read_user_state("shop", "ada") == {"card": "new"}
    finally:
        store.close()


_COME_BACK = """
import json, sys
from sessionscope import SyncSessionService
from sessionscope.crypto import Encryption
from sessionscope.stores import open_store
uri, keys, kek = sys.argv[1], sys.argv[2], bytes.fromhex(sys.argv[3])
svc = SyncSessionService(open_store(uri, encryption=Encryption(keys=keys, key=kek)))
erased = svc.delete_user(app_name="shop", user_id="ada")
svc.create_session(app_name="shop", user_id="ada", session_id="back", state=json.loads(sys.argv[4]))
svc.close()
print(json.dumps(erased))
"""


@pytest.mark.parametrize("state", [{"plan": "back"}, {}], ids=["with-state", "empty"])
def test_a_process_holding_an_erased_key_seals_a_returning_user_under_the_new_one(
    place: Place, state: dict[str, Any]
) -> None:
    # This process keeps ada's key unwrapped; another one erases ada, and
    # she comes back with a new session (so a new key). What this process
    # then writes to that session must be sealed under the new key: under
    # the erased one it would be lost to every other reader. A session
    # with state shows the new key when read; an empty one does not.
    store = place.open()
    try:
        fill(store)
        svc = SyncSessionService(store)
        assert readable(store, "ada")
        erased = child_json("-c", _COME_BACK, place.uri(), place.keys, KEK.hex(), json.dumps(state))
        assert erased == 1
        session = svc.get_session(app_name="shop", user_id="ada", session_id="back")
        assert session is not None and session.state.get("plan") == state.get("plan")
        svc.append_event(session, ev(content={"text": "after"}, delta={"user:card": "new"}))
    finally:
        store.close()
    # A process that never held the erased key reads all of it.
    other = place.open()
    try:
        got = SyncSessionService(other).get_session(
            app_name="shop", user_id="ada", session_id="back"
        )
        assert got is not None
        assert got.state.get("plan") == state.get("plan") and got.state["user:card"] == "new"
        assert [e.content["text"] for e in got.events] == ["after"]
        assert readable(other, "bob")
    finally:
        other.close()


def _raw_event(record: bytes) -> EventCopy:
    from sessionscope.stores.records import event_copy

    return event_copy(record)


# -- tampering and moving --------------------------------------------------------


def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1 :]


def test_a_tampered_or_moved_ciphertext_is_a_corrupt_store_error_naming_it(place: Place) -> None:
    from sessionscope import codec

    store = place.open()
    try:
        fill(store)
        raw = store.raw
        loaded = raw.load_session("shop", "ada", "s1", None, None)
        record = codec.decode_event(loaded.events[1])
        event_id = record["id"]
        # One bit of the sealed bytes flipped, at the same place (ids, times).
        tampered = dict(record, sealed=_flip(record["sealed"], 30))
        copies = [_raw_event(e) for e in loaded.events]
        copies[1] = EventCopy(event_id, copies[1].timestamp, codec.pack_event(tampered))
        # Where it was (the same ids, in a copy of the store with the same keys).
        elsewhere = place.open("elsewhere")
        try:
            copy = SessionCopy("shop", "ada", "s1", 1.0, 2.0, [], copies)
            elsewhere.raw.restore_session(copy).result()
            with pytest.raises(CorruptStoreError, match=rf"event '{event_id}'.*altered") as caught:
                elsewhere.load_session("shop", "ada", "s1", None, None)
            assert not isinstance(caught.value, KeyErasedError)
            page = elsewhere.read_events("shop", "ada", "s1", 0, 1)
            assert page is not None and len(page[1]) == 1  # the event before it reads
        finally:
            elsewhere.close()
        # A state value moved to another session of the same user does not open.
        plan = codec.pack(loaded.session_state["plan"])
        raw.restore_session(
            SessionCopy("shop", "ada", "u", 1.0, 2.0, [("plan", plan)], [])
        ).result()
        with pytest.raises(CorruptStoreError, match=r"state value 'plan'.*altered, or copied"):
            store.load_session("shop", "ada", "u", 0, None)
        # An untouched event moved to another session of the same user: refused too.
        raw.restore_session(SessionCopy("shop", "ada", "moved", 1.0, 2.0, [], [copies[0]])).result()
        with pytest.raises(CorruptStoreError, match=rf"event '{copies[0].event_id}'"):
            store.load_session("shop", "ada", "moved", None, None)
        # Moved to another user: that user has no such key.
        raw.restore_session(SessionCopy("shop", "bob", "moved", 1.0, 2.0, [], [copies[0]])).result()
        with pytest.raises(CorruptStoreError, match="copied from another user"):
            store.load_session("shop", "bob", "moved", None, None)
        # The user state value moved to another user's map.
        card = raw.read_user_state("shop", "ada")["card"]
        raw.write_user_state("shop", "bob", [("card", codec.pack(card))]).result()
        with pytest.raises(CorruptStoreError, match="state value 'card'"):
            store.read_user_state("shop", "bob")
        # The rest of the store reads as before.
        assert readable(store, "ada")
    finally:
        store.close()


@pytest.mark.parametrize("id_size", [1, 31, 32, 255, 256, 4096])
@pytest.mark.parametrize("record_size", [0, 200, 255 - 33, 70_000])
def test_a_sealed_event_is_the_record_the_codec_writes_around_seal(
    id_size: int, record_size: int
) -> None:
    """The event envelope is built piece by piece; its bytes are those of the format."""
    from sessionscope import codec
    from sessionscope.crypto.envelope import (
        Cipher,
        Opened,
        event_parts,
        event_place,
        open_events,
        place,
    )

    cipher = Cipher(0x01020304, bytes(range(32)))
    event_id, stamp, record = (
        "é" * (id_size // 2) + "x" * (id_size % 2),
        1767225600.25,
        b"r" * record_size,
    )
    where = place("e", "app", "u", "s", event_id, stamp)
    assert event_place("app", "u", "s") + codec.pack(event_id) + codec.pack(stamp) == where
    sealed = cipher.seal_event(event_place("app", "u", "s"), event_id, stamp, record)
    fields = codec.decode_event(sealed)
    assert fields == {"id": event_id, "timestamp": stamp, "sealed": fields["sealed"]}
    assert codec.pack_event(fields) == sealed
    # The record sealed at its place, as ``seal`` seals a value there.
    assert cipher.open(fields["sealed"], where) == record
    assert len(fields["sealed"]) == len(cipher.seal(record, where))
    parts = event_parts(sealed)
    assert parts is not None
    tail, start = parts
    assert event_place("app", "u", "s") + tail == where
    assert sealed[start : start + 5] == cipher.head
    heads = {cipher.head: cipher}
    at = event_place("app", "u", "s")
    opened = Opened()  # what a store keeps of the events it sealed or opened
    assert open_events(heads, at, [sealed], opened) == [record]
    # Met before, it is served again only as the same bytes at the same place.
    assert open_events(heads, event_place("app", "u", "t"), [sealed], opened) is None
    assert open_events({}, at, [sealed], Opened()) is None
    assert open_events({}, at, [sealed], opened) == [record]
    if record_size:
        # Its ciphertext altered, its tag (the entry's key) kept: AES-GCM refuses it.
        assert open_events(heads, at, [_flip(sealed, len(sealed) - 17)], opened) is None
    # Truncated or extended, it is not read as a sealed event.
    assert event_parts(sealed[:-1]) is None
    assert event_parts(sealed + b"\x00") is None


def test_opened_keeps_the_newest_within_its_bound_and_forgets_on_clear() -> None:
    from sessionscope.crypto.envelope import Opened

    opened = Opened(limit=10_000)

    def record(number: int) -> bytes:
        return number.to_bytes(2, "big") * 100

    for number in range(100):
        opened.put_record(record(number), b"place", b"p" * 200)
        assert 0 < opened.size <= 10_000
    assert opened.record(record(99), b"place") == b"p" * 200
    assert opened.record(record(99), b"elsewhere") is None
    assert opened.record(record(0), b"place") is None  # dropped: the oldest go first
    # What is read again stays while newer values come and go.
    often = record(98)
    for number in range(100, 200):
        assert opened.record(often, b"place") == b"p" * 200
        opened.put_record(record(number), b"place", b"p" * 200)
    # A value larger than the whole bound is not kept.
    opened.put_record(b"x" * 20_000, b"place", b"big")
    assert opened.record(b"x" * 20_000, b"place") is None
    opened.clear()
    assert opened.size == 0 and opened.record(often, b"place") is None


def _nested(depth: int) -> Any:
    """Return ``{"k": [...]}`` nested ``depth`` lists deep, with a 1 at the bottom."""
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return {"k": value}


@pytest.mark.parametrize(
    "module", ["sessionscope.crypto.envelope", "sessionscope.crypto.envelope_c"]
)
def test_an_opened_list_or_map_is_a_fresh_copy_on_every_read(
    module: str, build_of: Callable[[str], ModuleType]
) -> None:
    """A caller may change the list it was given: no later read may see the change.

    The first read decodes the plaintext; later ones copy what was kept
    decoded (or decode again, for a value nested too deep to keep).
    """
    from sessionscope.codec import pack

    envelope = build_of(module)
    opened = envelope.Opened()
    values = [["a", {"b": 1}], {"k": [1, {"n": [2]}]}, _nested(40), "text", 7, None, b"raw"]
    for number, value in enumerate(values):
        expected = copy.deepcopy(value)
        sealed = bytes([number]) * 40
        opened.put_value(sealed, b"map", "key", pack(value))
        handed = []
        for _ in range(3):
            got = opened.value(sealed, b"map", "key")
            assert got == expected
            if isinstance(got, (list, dict)):
                assert all(got is not earlier for earlier in handed)
            handed.append(got)
            # Change every list and map the caller was handed, at every depth.
            stack = [got]
            while stack:
                item = stack.pop()
                if isinstance(item, list):
                    stack.extend(item)
                    item.append("changed")
                elif isinstance(item, dict):
                    stack.extend(item.values())
                    item["changed"] = True
        # Found only at its own place, and only as the same bytes.
        assert opened.value(sealed, b"map", "other") is envelope.MISSING
        assert opened.value(sealed, b"other map", "key") is envelope.MISSING
        assert opened.value(bytes([number + 1]) * 40, b"map", "key") is envelope.MISSING
    # A value set again at a place replaces the one before, in what it holds and in its size.
    opened.clear()
    for number in range(1_000):
        opened.put_value(number.to_bytes(2, "big") * 20, b"map", "key", pack(number))
    assert opened.value((999).to_bytes(2, "big") * 20, b"map", "key") == 999
    assert opened.value((998).to_bytes(2, "big") * 20, b"map", "key") is envelope.MISSING
    assert 0 < opened.size < 1_000


def test_keep_opened_bounds_what_a_store_keeps_and_zero_keeps_nothing(
    place: Place, monkeypatch: pytest.MonkeyPatch
) -> None:
    def kept_after_reads(store: Any) -> int:
        try:
            fill(store)
            assert readable(store, "ada") and readable(store, "bob")
            kept: int = store.kept_bytes
            SyncSessionService(store).delete_user(app_name="shop", user_id="ada")
            assert store.kept_bytes == 0  # an erasure forgets everything kept
            assert readable(store, "bob")
            return kept
        finally:
            store.close()

    assert kept_after_reads(place.open("default")) > 3_000

    def keeping(name: str, keep: int) -> Any:
        encryption = Encryption(keys=f"{place.keys}-{name}", key=KEK, keep_opened=keep)
        return open_store(place.uri(name), encryption=encryption)

    assert 0 < kept_after_reads(keeping("bounded", 6_000)) <= 6_000
    assert kept_after_reads(keeping("none", 0)) == 0
    # The same through the URI.
    monkeypatch.setenv("TEST_KEK", KEK.hex())
    uri = place.uri("uri")
    options = f"key_env=TEST_KEK&keys={quote(place.keys + '-uri', safe='')}&keep_opened=0"
    assert kept_after_reads(open_store(uri + ("&" if "?" in uri else "?") + options)) == 0


@pytest.mark.parametrize("bad", [-1, "big", True, 1.5])
def test_keep_opened_must_be_a_number_of_bytes(bad: Any) -> None:
    with pytest.raises(ValueError, match="keep_opened"):
        Encryption(key=KEK, keep_opened=bad)
    with pytest.raises(ValueError, match="keep_opened"):
        open_store(f"memory://?key_env=NO_SUCH_KEY&keep_opened={bad}")


def test_values_this_process_met_are_refused_once_altered_there_or_erased(place: Place) -> None:
    """Values sealed or read here are kept opened; the same place's altered bytes still fail.

    And an erasure forgets them: restored where they were, they are unreadable.
    """
    from sessionscope import codec

    store = place.open()
    try:
        fill(store)
        assert readable(store, "ada")
        raw = store.raw
        loaded = raw.load_session("shop", "ada", "s1", None, None)
        copies = [_raw_event(e) for e in loaded.events]
        state = [(key, codec.pack(value)) for key, value in loaded.session_state.items()]
        record = codec.decode_event(loaded.events[1])
        tampered = dict(record, sealed=_flip(record["sealed"], 30))
        altered = list(copies)
        altered[1] = EventCopy(record["id"], copies[1].timestamp, codec.pack_event(tampered))
        raw.delete_session("shop", "ada", "s1").result()
        raw.restore_session(SessionCopy("shop", "ada", "s1", 1.0, 2.0, state, altered)).result()
        with pytest.raises(CorruptStoreError, match=rf"event '{record['id']}'.*altered"):
            store.load_session("shop", "ada", "s1", None, None)
        # Put back as they were, they read again.
        raw.delete_session("shop", "ada", "s1").result()
        raw.restore_session(SessionCopy("shop", "ada", "s1", 1.0, 2.0, state, copies)).result()
        assert readable(store, "ada")

        user_state = raw.read_user_state("shop", "ada")
        assert SyncSessionService(store).delete_user(app_name="shop", user_id="ada") == 1
        raw.restore_session(SessionCopy("shop", "ada", "s1", 1.0, 2.0, state, copies)).result()
        raw.write_user_state(
            "shop", "ada", [(key, codec.pack(value)) for key, value in user_state.items()]
        ).result()
        assert_erased(store, "ada")
        assert readable(store, "bob")
    finally:
        store.close()


def test_state_nonces_draw_a_new_salt_when_the_counter_runs_out() -> None:
    """Counter nonces (salt, then counter) never repeat, also across the counter's end.

    Runs on the source build, whose counter can be set near its end.
    """
    import itertools

    from sessionscope.crypto.envelope import HEADER, Cipher

    cipher = Cipher(7, bytes(32))
    salt, _, forks = cipher._counter
    cipher._counter = (salt, itertools.count(0xFFFFFFFD), forks)
    items = [(f"k{index}", b"v") for index in range(4)]
    sealed = cipher.seal_items(items, b"\x93\xa1s\xa1a\xa1u")
    nonces = [value[2 + 5 : 2 + HEADER] for _, value in sealed]
    assert len(set(nonces)) == 4
    assert [n[:8] == salt.to_bytes(8, "big") for n in nonces] == [True, True, False, False]
    assert [int.from_bytes(n[8:], "big") for n in nonces][:2] == [0xFFFFFFFD, 0xFFFFFFFE]
    assert cipher._counter[0] != salt


@pytest.mark.parametrize(
    "module", ["sessionscope.crypto.envelope", "sessionscope.crypto.envelope_c"]
)
def test_each_build_seals_in_one_format_under_counter_nonces(
    module: str, build_of: Callable[[str], ModuleType]
) -> None:
    """Both builds seal under salt-then-counter nonces, with every width of msgpack bin header.

    A cipher's nonces are its 8 random bytes, then a 4-byte count of what it
    sealed before, big-endian; the sizes cross each bin header's width
    (8, 16 and 32 bits), and what one build seals the source build opens.
    """
    import msgpack

    from sessionscope import codec

    envelope = build_of(module)
    source = build_of("sessionscope.crypto.envelope")
    key = bytes(range(32))
    sealer, opener = envelope.Cipher(5, key), source.Cipher(5, key)
    overhead = envelope.HEADER + envelope.TAG
    sizes = [0, 0xFF - overhead, 0x100 - overhead, 0xFFFF - overhead, 0x10000 - overhead]
    prefix = envelope.place("s", "shop", "ada", "s1")
    items = [(f"k{index}", bytes([index]) * size) for index, size in enumerate(sizes)]
    nonces = []
    for (name, plain), (_, stored) in zip(items, sealer.seal_items(items, prefix), strict=True):
        whole = msgpack.unpackb(stored)
        assert len(stored) - len(whole) == (
            2 if len(whole) < 0x100 else 3 if len(whole) < 0x10000 else 5
        )
        assert whole[:5] == sealer.head
        nonces.append(whole[5 : envelope.HEADER])
        assert opener.open(whole, prefix + name.encode()) == plain
    at = envelope.event_place("shop", "ada", "s1")
    for index, size in enumerate(sizes):
        record = bytes([index]) * size
        whole = codec.decode_event(sealer.seal_event(at, f"e{index}", 1.5, record))["sealed"]
        nonces.append(whole[5 : envelope.HEADER])
        where = envelope.place("e", "shop", "ada", "s1", f"e{index}", 1.5)
        assert opener.open(whole, where) == record
    salt = nonces[0][:8]
    assert salt != bytes(8) and all(nonce[:8] == salt for nonce in nonces)
    assert [int.from_bytes(nonce[8:], "big") for nonce in nonces] == list(range(len(nonces)))


def test_an_event_sealed_twice_gets_two_nonces_and_both_open() -> None:
    """Events are sealed under counter nonces: never the same nonce twice under one key."""
    from sessionscope import codec
    from sessionscope.core import compiled_or_twin

    envelope = compiled_or_twin("sessionscope.crypto.envelope")
    cipher = envelope.Cipher(9, bytes(range(32)))
    at = envelope.event_place("shop", "ada", "s1")
    where = envelope.place("e", "shop", "ada", "s1", "e1", 1.5)
    first, second = (
        codec.decode_event(cipher.seal_event(at, "e1", 1.5, b"the record"))["sealed"]
        for _ in range(2)
    )
    nonces = {sealed[5 : envelope.HEADER] for sealed in (first, second)}
    assert len(nonces) == 2
    assert cipher.open(first, where) == cipher.open(second, where) == b"the record"


def _nonce_of_a_child(cipher: Any, sent: Any) -> None:
    """In a child process: seal a value with a cipher made before the fork and send its nonce."""
    from sessionscope.core import compiled_or_twin

    header = compiled_or_twin("sessionscope.crypto.envelope").HEADER
    sent.send(cipher.seal(b"child", b"here")[5:header])
    sent.close()


def test_a_child_process_after_fork_never_draws_its_parents_nonces() -> None:
    """A cipher crossing fork() counts under a salt of the child's own.

    Parent and child seal under the same data key, into the same store
    where it is Redis: the same counter in both would repeat nonces.
    """
    import multiprocessing

    from sessionscope.core import compiled_or_twin

    envelope = compiled_or_twin("sessionscope.crypto.envelope")
    header = envelope.HEADER
    cipher = envelope.Cipher(5, bytes(32))
    parent_first = cipher.seal(b"parent", b"here")[5:header]
    context = multiprocessing.get_context("fork")
    children = []
    for _ in range(2):
        received, sent = context.Pipe(duplex=False)
        child = context.Process(target=_nonce_of_a_child, args=(cipher, sent))
        child.start()
        sent.close()
        assert received.poll(60), "the child sent nothing"
        children.append(received.recv())
        child.join(60)
        assert child.exitcode == 0
    parent_next = cipher.seal(b"parent", b"here")[5:header]
    salt = parent_first[:8]
    assert parent_next[:8] == salt  # the parent goes on with its counter
    assert int.from_bytes(parent_next[8:], "big") == int.from_bytes(parent_first[8:], "big") + 1
    # Each child drew a salt of its own, and started its count again.
    assert len({salt, children[0][:8], children[1][:8]}) == 3
    assert [int.from_bytes(nonce[8:], "big") for nonce in children] == [0, 0]


def test_a_retried_append_is_a_repeat_though_sealed_again(place: Place) -> None:
    """A retry seals the event under a new nonce; the store still recognises it by its plaintext.

    Also after the user's data key rotated (the retry is sealed under the new
    key), for a locked append and in a batch; other content under the same
    id is still refused, and nothing of the refused or repeated appends is written.
    """
    from sessionscope.errors import DuplicateEventError

    store = place.open()
    try:
        svc = SyncSessionService(store)
        session = svc.create_session(app_name="shop", user_id="ada", session_id="s1")
        first = ev(content={"text": "hello"}, delta={"plan": "a"})
        svc.append_event(session, first)
        stored = store.raw.load_session("shop", "ada", "s1", None, None)
        assert svc.append_event(session, first) is first  # a plain retry
        store.rotate_data_key("shop", "ada")
        assert svc.append_event(session, first) is first  # sealed under the new key
        copy = svc.get_session(app_name="shop", user_id="ada", session_id="s1")
        assert copy is not None
        assert svc.append_event_locked(copy, first) is first
        second = ev(content={"text": "again"}, delta={"plan": "b"})
        assert svc.append_many([(copy, first), (copy, second)]) == [first, second]
        other = ev(content={"text": "other"}, delta={"plan": "c"})
        other.id = first.id
        with pytest.raises(DuplicateEventError):
            svc.append_event(copy, other)
        now = store.raw.load_session("shop", "ada", "s1", None, None)
        assert now.events == [*stored.events, now.events[-1]]
        got = svc.get_session(app_name="shop", user_id="ada", session_id="s1")
        assert got is not None
        assert [e.content["text"] for e in got.events] == ["hello", "again"]
        assert got.state["plan"] == "b"
    finally:
        store.close()


def test_an_event_record_in_another_layout_still_opens_or_says_why(place: Place) -> None:
    """A sealed event stored with its fields in another order, or an int time, opens.

    The quick reading takes only the layout this version writes; anything
    else is decoded as a msgpack map, as before.
    """
    from sessionscope import codec
    from sessionscope.crypto.envelope import event_parts

    store = place.open()
    try:
        fill(store)
        raw = store.raw
        loaded = raw.load_session("shop", "ada", "s1", None, None)
        fields = codec.decode_event(loaded.events[0])
        reordered = codec.pack_event(
            {"sealed": fields["sealed"], "timestamp": fields["timestamp"], "id": fields["id"]}
        )
        assert event_parts(reordered) is None
        copies = [_raw_event(e) for e in loaded.events]
        copies[0] = EventCopy(fields["id"], fields["timestamp"], reordered)
        raw.delete_session("shop", "ada", "s1").result()
        raw.restore_session(SessionCopy("shop", "ada", "s1", 1.0, 2.0, [], copies)).result()
        got = SyncSessionService(store).get_session(app_name="shop", user_id="ada", session_id="s1")
        assert got is not None and [e.content["i"] for e in got.events] == [0, 1, 2]
        # The same record with one bit flipped: the error names it, on either path.
        tampered = codec.pack_event(
            {
                "sealed": _flip(fields["sealed"], 30),
                "timestamp": fields["timestamp"],
                "id": fields["id"],
            }
        )
        copies[0] = EventCopy(fields["id"], fields["timestamp"], tampered)
        raw.delete_session("shop", "ada", "s1").result()
        raw.restore_session(SessionCopy("shop", "ada", "s1", 1.0, 2.0, [], copies)).result()
        with pytest.raises(CorruptStoreError, match=rf"event '{fields['id']}'.*altered"):
            store.load_session("shop", "ada", "s1", None, None)
    finally:
        store.close()


def test_a_byte_flipped_in_the_lmdb_file_is_a_corrupt_store_error(tmp_path: Path) -> None:
    place = Place("lmdb", tmp_path)
    store = place.open()
    svc = SyncSessionService(store)
    session = svc.create_session(app_name="shop", user_id="ada", session_id="s1")
    svc.append_event(session, ev(content={"text": "x" * 64}))
    from sessionscope import codec

    sealed = codec.decode_event(store.raw.load_session("shop", "ada", "s1", None, None).events[0])[
        "sealed"
    ]
    store.close()
    data = (tmp_path / "store" / "data.mdb").read_bytes()
    assert data.count(sealed) == 1
    at = data.index(sealed) + len(sealed) // 2
    (tmp_path / "store" / "data.mdb").write_bytes(_flip(data, at))
    again = place.open()
    try:
        with pytest.raises(CorruptStoreError, match="altered"):
            SyncSessionService(again).get_session(app_name="shop", user_id="ada", session_id="s1")
        # verify checks the file below and authenticates every record through the key.
        from sessionscope.admin.ops import check_store

        report = check_store(again)
        assert not report.clean and report.structural == "ok"
        assert any("fails its authentication" in problem for problem in report.problems)
    finally:
        again.close()


# -- keys at open --------------------------------------------------------------


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.name == "data.mdb"}


def test_a_wrong_or_missing_key_is_refused_at_open_before_anything_is_written(
    place: Place, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = place.open()
    fill(store)
    store.close()
    before = (place.raw_bytes(), place.key_bytes())
    with pytest.raises(EncryptionKeyError, match="is not the one") as caught:
        place.open(key=OTHER_KEK)
    assert OTHER_KEK.hex() not in str(caught.value) and KEK.hex() not in str(caught.value)
    monkeypatch.delenv("SESSIONSCOPE_TEST_KEK", raising=False)
    unset = r"key_env names an environment variable that is not set"
    with pytest.raises(EncryptionKeyError, match=unset):
        open_store(
            place.uri(), encryption=Encryption(keys=place.keys, key_env="SESSIONSCOPE_TEST_KEK")
        )
    with pytest.raises(EncryptionKeyError, match="cannot be read"):
        open_store(place.uri(), encryption=Encryption(keys=place.keys, key_file=tmp_path / "none"))
    (tmp_path / "short").write_text("abcd")
    with pytest.raises(EncryptionKeyError, match="not 32 bytes"):
        open_store(place.uri(), encryption=Encryption(keys=place.keys, key_file=tmp_path / "short"))
    # The right key, but another key store: refused, and that key store is not created.
    other_keys = f"lmdb://{tmp_path / 'other-keys'}"
    with pytest.raises((EncryptionKeyError, StoreNotFoundError), match="key store"):
        open_store(place.uri(), encryption=Encryption(keys=other_keys, key=KEK))
    assert not (tmp_path / "other-keys").exists()
    # Opened without a key: refused, the message says it is encrypted.
    with pytest.raises(IncompatibleStoreError, match=r"is encrypted.*without its key"):
        open_store(place.uri())
    assert (place.raw_bytes(), place.key_bytes()) == before
    # The key from the environment or a file opens it.
    monkeypatch.setenv("SESSIONSCOPE_TEST_KEK", KEK.hex())
    again = open_store(
        place.uri(), encryption=Encryption(keys=place.keys, key_env="SESSIONSCOPE_TEST_KEK")
    )
    try:
        assert readable(again, "ada")
    finally:
        again.close()
    key_file = tmp_path / "kek"
    key_file.write_bytes(KEK)
    query = f"key_file={key_file}&keys={_quote(place.keys)}"
    joined = f"{place.uri()}{'&' if '?' in place.uri() else '?'}{query}"
    again = open_store(joined)
    try:
        assert isinstance(again, EncryptedStore) and readable(again, "bob")
    finally:
        again.close()


def test_a_missing_or_wrong_key_leaves_a_new_store_uncreated(
    place: Place, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = place.open()
    fill(store)
    store.close()
    keys_before = place.key_bytes()
    monkeypatch.delenv("SESSIONSCOPE_TEST_KEK", raising=False)
    missing = [
        Encryption(keys=place.keys, key_env="SESSIONSCOPE_TEST_KEK"),
        Encryption(keys=place.keys, key_file=tmp_path / "none"),
        Encryption(keys=place.keys, key=b"short"),
        # A well-formed key, but not the one the key store's data keys are under.
        Encryption(keys=place.keys, key=OTHER_KEK),
    ]
    for encryption in missing:
        with pytest.raises(EncryptionKeyError):
            open_store(place.uri("new"), encryption=encryption)
    if place.server is None:
        assert not (place.base / "new").exists()
        # Nor beside it, where the key store of a store opened without keys= goes.
        with pytest.raises(EncryptionKeyError):
            open_store(place.uri("new"), key_env="SESSIONSCOPE_TEST_KEK")
        assert sorted(p.name for p in place.base.iterdir()) == ["keys", "store"]
    else:
        import redis

        client = redis.Redis.from_url(place.server.url)
        try:
            assert list(client.scan_iter(f"{place.tag}-new*", count=1000)) == []
        finally:
            client.close()
    assert place.key_bytes() == keys_before


def _quote(text: str) -> str:
    from urllib.parse import quote

    return quote(text, safe="")


def _keyless_opens(place: Place) -> list[Any]:
    """Every way of opening the place's store without its key: each call opens it once."""
    from importlib.util import find_spec

    if place.server is not None:
        from sessionscope.stores.redis.store import RedisStore

        return [
            lambda: RedisStore(place.server.url, prefix=f"{place.tag}-store"),  # type: ignore[union-attr]
            lambda: SyncSessionService(place.uri()),
        ]
    from sessionscope.stores import LmdbStore

    path = place.base / "store"
    opens: list[Any] = [lambda: LmdbStore(path), lambda: SyncSessionService(place.uri())]
    if find_spec("google") is not None and find_spec("google.adk") is not None:
        from sessionscope.adk import LmdbSessionService

        opens.append(lambda: LmdbSessionService(path))
    return opens


def test_an_encrypted_store_is_refused_by_every_way_of_opening_it_without_its_key(
    place: Place,
) -> None:
    store = place.open()
    fill(store)
    store.close()
    before = place.raw_bytes()
    for open_without_key in _keyless_opens(place):
        with pytest.raises(IncompatibleStoreError, match=r"is encrypted.*without its key"):
            open_without_key()
    assert place.raw_bytes() == before
    # encrypted_ok opens it as it is, for what seals every value it writes.
    if place.server is None:
        from sessionscope.crypto import open_encrypted
        from sessionscope.stores import LmdbStore

        inner = LmdbStore(place.base / "store", encrypted_ok=True)
        again = open_encrypted(inner, Encryption(keys=place.keys, key=KEK), None)
        try:
            assert readable(again, "ada")
        finally:
            again.close()


def test_a_plaintext_store_is_not_opened_encrypted_by_mistake(place: Place) -> None:
    plain = open_store(place.uri())
    SyncSessionService(plain).create_session(app_name="shop", user_id="ada", state={"k": 1})
    plain.close()
    before = place.raw_bytes()
    with pytest.raises(IncompatibleStoreError, match="without encryption"):
        place.open()
    assert place.raw_bytes() == before
    if place.kind == "lmdb":
        assert not (place.base / "keys").exists()


def test_a_plaintext_dump_is_sealed_on_its_way_into_an_encrypted_store(
    place: Place, tmp_path: Path
) -> None:
    plain = open_store(place.uri("plain"))
    fill(plain)
    export_dump(plain, tmp_path / "plain.ssd")
    store = place.open()
    try:
        import_dump(store, tmp_path / "plain.ssd")
        assert readable(store, "ada")
        assert_no_plaintext(place.raw_bytes(), "the store")
        # The encrypted dump does not go below a plain store that is encrypted already
        # with other keys, nor into the plain store holding plaintext.
        export_dump(store, tmp_path / "enc.ssd")
        with pytest.raises(DumpError, match="another key store"):
            import_dump(plain, tmp_path / "enc.ssd")
    finally:
        store.close()
        plain.close()


# -- byte scans ------------------------------------------------------------------


def test_no_file_holds_a_plaintext_value_or_key(place: Place, tmp_path: Path) -> None:
    store = place.open()
    fill(store)
    # Retries and locked appends write too.
    svc = SyncSessionService(store)
    session = svc.get_session(app_name="shop", user_id="ada", session_id="s1")
    assert session is not None
    again = ev(content={"text": SECRETS["event"].decode()}, delta={"x": SECRETS["delta"].decode()})
    svc.append_event_locked(session, again)
    svc.append_event(session, again)  # a retry: the same event, nothing written twice
    export_dump(store, tmp_path / "d.ssd")
    export_dump(store, tmp_path / "d.ssd.gz")
    if place.kind == "lmdb":
        backup(store, tmp_path / "backup")
    store.close()
    assert_no_plaintext(place.raw_bytes(), "the data")
    assert_no_plaintext(place.key_bytes(), "the key store")
    assert_no_plaintext((tmp_path / "d.ssd").read_bytes(), "the dump")
    assert_no_plaintext(gzip.decompress((tmp_path / "d.ssd.gz").read_bytes()), "the .gz dump")
    if place.kind == "lmdb":
        assert_no_plaintext((tmp_path / "backup" / "data.mdb").read_bytes(), "the backup")
    # Ids stay plaintext, as documented.
    assert b"shop" in place.raw_bytes()


def test_openai_agents_items_are_sealed_and_a_pop_opens_them(place: Place) -> None:
    agents = pytest.importorskip("sessionscope.openai_agents")
    store = place.open()
    item = {"role": "user", "content": SECRETS["event"].decode(), "raw": SECRETS["delta"]}
    session = agents.AgentsSession("chat", store, user_id="ada")
    run(session.add_items([{"role": "user", "content": "first"}, item]))
    assert run(session.get_items()) == [{"role": "user", "content": "first"}, item]
    assert_no_plaintext(place.raw_bytes(), "the data")
    # The popped item comes back opened, once, and is gone from the store.
    assert run(session.pop_item()) == item
    assert run(session.get_items()) == [{"role": "user", "content": "first"}]
    # Erasing the user reaches the items too.
    store.delete_user("openai-agents", "ada").result()
    assert run(session.get_items()) == []
    store.close()


# -- rotation --------------------------------------------------------------------


def test_rotating_the_key_encryption_key_rewraps_every_data_key_and_resumes(
    place: Place,
) -> None:
    store = place.open()
    fill(store)
    SyncSessionService(store).create_session(app_name="shop", user_id="cy", state={"k": 1})
    store.close()
    data_before = place.raw_bytes()
    old, new = Kek(KEK), Kek(OTHER_KEK)
    keys = open_key_store(place.keys)
    try:
        with pytest.raises(OSError, match="interrupted"):
            rotate_kek(FailingAfter(keys, 2), old, new)  # type: ignore[arg-type]
    finally:
        keys.close()
    # Midway, the new key opens the store, but a user still under the old one says so.
    midway = place.open(key=OTHER_KEK)
    try:
        with pytest.raises(EncryptionKeyError, match="rotation is unfinished"):
            for user in ("ada", "bob", "cy"):
                midway.read_user_state("shop", user)
    finally:
        midway.close()
    # Resumed: the rest is re-wrapped; run again, nothing is left to do.
    assert rotate_key(place.keys, old, new) == 2
    assert rotate_key(place.keys, old, new) == 0
    assert place.raw_bytes() == data_before  # the data was not rewritten
    with pytest.raises(EncryptionKeyError, match="is not the one"):
        place.open(key=KEK)
    again = place.open(key=OTHER_KEK)
    try:
        assert readable(again, "ada") and readable(again, "bob")
    finally:
        again.close()


def test_a_rotated_data_key_seals_new_writes_and_old_records_still_read(place: Place) -> None:
    from sessionscope import codec
    from sessionscope.crypto.envelope import split

    store = place.open()
    try:
        fill(store)
        first = split(
            codec.decode_event(store.raw.load_session("shop", "ada", "s1", 1, None).events[0])[
                "sealed"
            ]
        )[1]
        new_id = store.rotate_data_key("shop", "ada")
        assert new_id != first
        svc = SyncSessionService(store)
        session = svc.get_session(app_name="shop", user_id="ada", session_id="s1")
        assert session is not None
        svc.append_event(session, ev(content={"i": 3}, delta={"plan": "after"}))
        latest = store.raw.load_session("shop", "ada", "s1", 1, None).events[0]
        assert split(codec.decode_event(latest)["sealed"])[1] == new_id
        got = svc.get_session(app_name="shop", user_id="ada", session_id="s1")
        assert got is not None and [e.content["i"] for e in got.events] == [0, 1, 2, 3]
        assert got.state["plan"] == "after"
        assert store.rotate_data_key("shop") != 0  # the app's key
        svc.create_session(app_name="shop", user_id="bob", state={"app:motd": "new"})
        assert store.read_app_state("shop") == {"motd": "new"}
    finally:
        store.close()
    again = place.open()
    try:
        got = SyncSessionService(again).get_session(app_name="shop", user_id="ada", session_id="s1")
        assert got is not None and len(got.events) == 4
    finally:
        again.close()


# -- the async face, secrets in reprs ---------------------------------------------


def test_the_async_service_reads_and_writes_an_encrypted_store(place: Place) -> None:
    async def main() -> None:
        svc = SessionService(place.open())
        try:
            session = await svc.create_session(
                app_name="shop", user_id="ada", state={"user:card": "c", "app:a": 1}
            )
            await svc.append_event(session, ev(content={"i": 0}, delta={"k": "v"}))
            await svc.append_event_locked(session, ev(content={"i": 1}))
            got = await svc.get_session(app_name="shop", user_id="ada", session_id=session.id)
            assert got is not None and [e.content["i"] for e in got.events] == [0, 1]
            assert got.state == {"k": "v", "user:card": "c", "app:a": 1}
            assert await svc.get_user_state(app_name="shop", user_id="ada") == {"card": "c"}
            assert await svc.delete_user(app_name="shop", user_id="ada") == 1
        finally:
            await svc.close()

    asyncio.run(main())


def test_no_key_appears_in_a_repr_or_message(place: Place, tmp_path: Path) -> None:
    store = place.open()
    try:
        fill(store)
        texts = [
            repr(store),
            repr(store.keyring),
            repr(store.keyring.kek),
            repr(Encryption(keys=place.keys, key=KEK)),
            repr(kek_from(key=KEK)),
        ]
    finally:
        store.close()
    for text in texts:
        for key in (KEK, KEK.hex(), repr(KEK)):
            assert str(key) not in text
    assert "key_id=" in repr(kek_from(key=KEK))


def test_new_key_text_is_a_key_a_file_may_hold(tmp_path: Path) -> None:
    text = new_key_text()
    (tmp_path / "k").write_text(text + "\n")
    os.chmod(tmp_path / "k", 0o600)
    assert kek_from(key_file=tmp_path / "k").key_id == Kek(bytes.fromhex(text)).key_id


def test_temp_values_are_applied_live_and_never_stored(place: Place) -> None:
    store = place.open()
    try:
        svc = SyncSessionService(store)
        session = svc.create_session(app_name="shop", user_id="ada")
        event = Event(author="a", actions=EventActions(state_delta={"temp:x": "live", "k": 1}))
        svc.append_event(session, event)
        assert session.state["temp:x"] == "live"
        got = svc.get_session(app_name="shop", user_id="ada", session_id=session.id)
        assert got is not None and got.state == {"k": 1}
    finally:
        store.close()


# -- the command line ----------------------------------------------------------------


def test_the_command_line_needs_the_key_to_show_values_and_says_so(tmp_path: Path) -> None:
    import json

    from _stores import run_cli

    place = Place("lmdb", tmp_path)
    store = place.open()
    fill(store)
    store.close()
    plain_uri = place.uri()
    env = {"SESSIONSCOPE_TEST_KEK": KEK.hex()}
    keyed = f"{plain_uri}?key_env=SESSIONSCOPE_TEST_KEK&keys={_quote(place.keys)}"
    # verify too: an encrypted store opened without its key is not a damaged one.
    for command in (
        ["show", plain_uri, "shop", "ada", "s1"],
        ["ls", plain_uri],
        ["verify", plain_uri],
        ["backup", plain_uri, str(tmp_path / "keyless-copy")],
    ):
        done = run_cli(*command, extra_env=env)
        assert done.returncode == 2, done.stderr
        assert "is encrypted" in done.stderr and "key" in done.stderr
        assert "Traceback" not in done.stderr
        assert "restore" not in done.stdout + done.stderr
    assert not (tmp_path / "keyless-copy").exists()
    done = run_cli("show", keyed, "shop", "ada", "s1", "--json", extra_env=env)
    assert done.returncode == 0, done.stderr
    assert SECRETS["session"].decode() + "ada" in done.stdout
    done = run_cli("ls", keyed, "--json", extra_env=env)
    apps = json.loads(done.stdout)["apps"]
    assert done.returncode == 0 and [a["app"] for a in apps] == ["shop"], done.stdout
    done = run_cli("verify", keyed, extra_env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    done = run_cli("backup", keyed, str(tmp_path / "copy"), extra_env=env)
    assert done.returncode == 0, done.stderr
    assert_no_plaintext((tmp_path / "copy" / "data.mdb").read_bytes(), "the backup")
    # A wrong key: one line, exit non-zero, no key in it.
    done = run_cli(
        "show", keyed, "shop", "ada", "s1", extra_env={"SESSIONSCOPE_TEST_KEK": OTHER_KEK.hex()}
    )
    assert done.returncode != 0 and "is not the one" in done.stderr
    assert OTHER_KEK.hex() not in done.stderr and "Traceback" not in done.stderr


def test_rotate_key_on_the_command_line(tmp_path: Path) -> None:
    import json

    from _stores import run_cli

    place = Place("lmdb", tmp_path)
    store = place.open()
    fill(store)
    store.close()
    (tmp_path / "old").write_text(KEK.hex())
    env = {"NEW_KEK": OTHER_KEK.hex()}
    args = ["rotate-key", place.keys, "--old-key-file", str(tmp_path / "old")]
    done = run_cli(*args, "--new-key-env", "NEW_KEK", "--json", extra_env=env)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["rewrapped"] == 3 and report["new_key_id"] == Kek(OTHER_KEK).key_id
    again = run_cli(*args, "--new-key-env", "NEW_KEK", extra_env=env)
    assert again.returncode == 0 and again.stdout.startswith("0 data-key records"), again.stderr
    store = place.open(key=OTHER_KEK)
    try:
        assert readable(store, "ada")
    finally:
        store.close()
    missing = run_cli(*args, "--new-key-env", "UNSET_NEW_KEK")
    assert missing.returncode != 0
    assert "key_env names an environment variable that is not set" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_a_locked_append_awaited_again_after_a_cancellation_opens_its_answer_once(
    place: Place,
) -> None:
    """The live session is brought up to date from the store's answer, opened once."""

    async def main() -> None:
        svc = SessionService(
            place.open(durability="deferred") if place.kind == "lmdb" else place.open()
        )
        try:
            session = await svc.create_session(app_name="shop", user_id="ada")
            other = await svc.get_session(app_name="shop", user_id="ada", session_id=session.id)
            assert other is not None
            await svc.append_event(other, ev(content={"i": 0}, delta={"k": 1}))
            # The store's answer carries the event the live copy missed (sealed).
            result = svc.store.aio.append(
                svc._core.prepare_append(session, ev(content={"i": 1}), True)
            )
            first = await result
            again = await result
            assert first is again
            from sessionscope import codec

            # Opened once: the records are the plaintext ones, not sealed twice or opened twice.
            missed = [codec.decode_event(record) for record in first.missed_events]
            assert missed[0]["content"]["i"] == 0
            assert "sealed" not in missed[0]
            assert first.stored_state.session_state == {"k": 1}
        finally:
            await svc.close()

    asyncio.run(main())
