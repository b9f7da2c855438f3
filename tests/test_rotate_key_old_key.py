"""Running a finished key rotation again takes only the key the store was rotated from.

Running ``rotate_key(keys, old, new)`` again re-wraps what a process still
holding ``old`` wrote meanwhile. Once the key store is under ``new``, any
other ``old`` would re-wrap nothing and report success, leaving those
records unconverted: it is refused, naming key ids, before anything is
written. Every test runs on a key store in an LMDB file and in a real
redis-server.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from _stores import FailingAfter
from sessionscope import SyncSessionService
from sessionscope.stores import open_store

pytest.importorskip("cryptography")

from sessionscope.codec import pack, unpack
from sessionscope.crypto import Encryption, Kek, open_key_store, rotate_key
from sessionscope.crypto.keyring import META
from sessionscope.errors import EncryptionKeyError

OLD = bytes.fromhex("41" * 32)
NEW = bytes.fromhex("b2" * 32)
WRONG = bytes.fromhex("c3" * 32)
THIRD = bytes.fromhex("d4" * 32)
EVERY_KEY = (OLD, NEW, WRONG, THIRD)


class Place:
    """One test's key store (LMDB or Redis) and the LMDB data store it keeps the keys of."""

    def __init__(self, kind: str, base: Path, server: Any) -> None:
        self.base = base
        self.server = server
        if server is not None:
            self.prefix = f"{uuid.uuid4().hex}-keys:"
            self.keys = f"{server.url}?prefix={self.prefix}"
        else:
            self.keys = f"lmdb://{base / 'keys'}"
        self.opened: list[Any] = []

    def service(self, key: bytes) -> SyncSessionService:
        """Open the data store with ``key``; it is closed when the test ends."""
        encryption = Encryption(keys=self.keys, key=key)
        store = open_store(f"lmdb://{self.base / 'store'}", encryption=encryption)
        self.opened.append(store)
        return SyncSessionService(store)

    def close(self) -> None:
        """Close every store opened so far (a path is open once in a process)."""
        while self.opened:
            self.opened.pop().close()

    def snapshot(self) -> Any:
        """Return every byte of the key store: its LMDB file, or each Redis key and value."""
        if self.server is None:
            return (self.base / "keys" / "data.mdb").read_bytes()
        import redis

        client = redis.Redis.from_url(self.server.url)
        try:
            start = self.prefix.encode()
            return {n: client.get(n) for n in client.scan_iter(count=1000) if n.startswith(start)}
        finally:
            client.close()

    def meta(self) -> dict[str, Any]:
        keys = open_key_store(self.keys, create=False)
        try:
            raw = keys.get(META)
            assert raw is not None
            found: dict[str, Any] = unpack(raw)
            return found
        finally:
            keys.close()

    def set_meta(self, meta: dict[str, Any]) -> None:
        keys = open_key_store(self.keys, create=False)
        try:
            raw = keys.get(META)
            assert raw is not None and keys.swap(META, raw, pack(meta))
        finally:
            keys.close()


@pytest.fixture(params=["lmdb", "redis"])
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Place]:
    server = request.getfixturevalue("redis_server") if request.param == "redis" else None
    found = Place(request.param, tmp_path, server)
    yield found
    found.close()


def _write(svc: SyncSessionService, *users: str, app_state: bool = True) -> None:
    # Without app state, only the user's data-key record is made or read.
    extra = {"app:a": 1} if app_state else {}
    for user in users:
        svc.create_session(
            app_name="shop", user_id=user, session_id="s", state={"v": user, **extra}
        )


def _read(svc: SyncSessionService, user: str) -> Any:
    session = svc.get_session(app_name="shop", user_id=user, session_id="s")
    assert session is not None
    return session.state["v"]


def _refused(place: Place, old: bytes, new: bytes, match: str) -> EncryptionKeyError:
    """Assert that rotating from ``old`` to ``new`` is refused, leaving the key store as it was."""
    before = place.snapshot()
    with pytest.raises(EncryptionKeyError, match=match) as caught:
        rotate_key(place.keys, Kek(old, "the wrong key"), Kek(new, "the new key"))
    assert place.snapshot() == before
    text = f"{caught.value} {caught.value!r}"
    assert not any(key.hex() in text or key.hex().upper() in text for key in EVERY_KEY)
    return caught.value


def test_a_wrong_old_key_after_a_finished_rotation_is_refused_and_writes_nothing(
    place: Place,
) -> None:
    holding_old = place.service(OLD)  # a process opened before the rotation, still running
    _write(holding_old, "ada", "bob")
    assert rotate_key(place.keys, Kek(OLD), Kek(NEW)) == 3  # the app's record and two users'
    assert place.meta()["kek"] == Kek(NEW).key_id
    assert place.meta()["previous"] == Kek(OLD).key_id
    # Meanwhile, the process holding the old key writes a new user's record under it.
    _write(holding_old, "cy", app_state=False)

    error = _refused(place, WRONG, NEW, "is not the one .* was rotated from")
    assert Kek(WRONG).key_id in str(error) and Kek(OLD).key_id in str(error)
    assert Kek(NEW).key_id in str(error)

    # The right old key catches the record written meanwhile, once.
    assert rotate_key(place.keys, Kek(OLD), Kek(NEW)) == 1
    assert rotate_key(place.keys, Kek(OLD), Kek(NEW)) == 0
    _refused(place, WRONG, NEW, "is not the one")
    place.close()
    rotated = place.service(NEW)
    assert [_read(rotated, user) for user in ("ada", "bob", "cy")] == ["ada", "bob", "cy"]


def test_a_key_store_never_rotated_takes_no_old_key_into_the_key_it_is_under(
    place: Place,
) -> None:
    svc = place.service(NEW)
    _write(svc, "ada")
    error = _refused(place, WRONG, NEW, "wraps no data key")
    assert Kek(WRONG).key_id in str(error) and Kek(NEW).key_id in str(error)
    assert "previous" not in place.meta()
    assert _read(svc, "ada") == "ada"


def test_a_key_store_rotated_before_the_previous_key_was_recorded_checks_its_records(
    place: Place,
) -> None:
    holding_old = place.service(OLD)
    _write(holding_old, "ada")
    assert rotate_key(place.keys, Kek(OLD), Kek(NEW)) == 2
    # What a rotation finished by an earlier version leaves: no "previous".
    place.set_meta({k: v for k, v in place.meta().items() if k != "previous"})
    # Nothing is left under the old key: no old key can be checked, every one is refused.
    _refused(place, OLD, NEW, "wraps no data key")
    _refused(place, WRONG, NEW, "wraps no data key")

    _write(holding_old, "bob", app_state=False)  # a record under the old key: it is the old one
    _refused(place, WRONG, NEW, "wraps no data key")
    assert rotate_key(place.keys, Kek(OLD), Kek(NEW)) == 1
    assert place.meta()["previous"] == Kek(OLD).key_id
    _refused(place, WRONG, NEW, "is not the one")
    place.close()
    rotated = place.service(NEW)
    assert [_read(rotated, user) for user in ("ada", "bob")] == ["ada", "bob"]


def test_a_finished_rotation_is_not_run_again_while_the_next_one_is_unfinished(
    place: Place,
) -> None:
    from sessionscope.crypto.keyring import rotate_kek

    _write(place.service(OLD), "ada", "bob")
    place.close()
    assert rotate_key(place.keys, Kek(OLD), Kek(NEW)) == 3
    keys = open_key_store(place.keys, create=False)
    try:
        with pytest.raises(OSError, match="interrupted"):
            rotate_kek(FailingAfter(keys, 1), Kek(NEW), Kek(THIRD))  # type: ignore[arg-type]
    finally:
        keys.close()
    # The old rotation again, or a wrong key into the unfinished one: refused, nothing written.
    _refused(place, OLD, NEW, "to key id .* is unfinished")
    _refused(place, WRONG, THIRD, "is not the one")
    assert rotate_key(place.keys, Kek(NEW), Kek(THIRD)) == 2
    assert place.meta()["previous"] == Kek(NEW).key_id
    _refused(place, OLD, THIRD, "is not the one")
    rotated = place.service(THIRD)
    assert [_read(rotated, user) for user in ("ada", "bob")] == ["ada", "bob"]


def test_rotate_key_on_the_command_line_exits_non_zero_with_a_wrong_old_key(
    tmp_path: Path,
) -> None:
    from _stores import run_cli

    place = Place("lmdb", tmp_path, None)
    try:
        _write(place.service(OLD), "ada")
    finally:
        place.close()
    env = {"OLD_KEK": OLD.hex(), "NEW_KEK": NEW.hex(), "WRONG_KEK": WRONG.hex()}

    def rotate(old: str) -> Any:
        return run_cli(
            "rotate-key", place.keys, "--old-key-env", old, "--new-key-env", "NEW_KEK",
            extra_env=env,
        )  # fmt: skip

    done = rotate("OLD_KEK")
    assert done.returncode == 0 and done.stdout.startswith("2 data-key records"), done.stderr
    for _ in range(2):  # and again: a wrong key never becomes right by being retried
        before = place.snapshot()
        done = rotate("WRONG_KEK")
        assert done.returncode != 0 and done.stdout == ""
        assert place.snapshot() == before
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
        assert "EncryptionKeyError" in done.stderr and "WRONG_KEK" in done.stderr
        assert Kek(WRONG).key_id in done.stderr and Kek(OLD).key_id in done.stderr
        assert not any(key.hex() in done.stderr for key in EVERY_KEY)
    done = rotate("OLD_KEK")
    assert done.returncode == 0 and done.stdout.startswith("0 data-key records"), done.stderr
