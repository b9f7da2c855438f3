"""Data keys: one per user (events, session and user state) and one per app (app state).

Each scope's record in the key store holds the id of the KEK that wraps it,
the id of its current data key and every data key it ever had (so records
sealed before a data-key rotation still open), each wrapped with AES-256-GCM
under the KEK for its place (key store, scope, key id): a wrapped key copied
to another user does not unwrap. Erasing a scope deletes its record: every
value sealed under its keys, wherever a copy of it lies, can no longer be
opened.

The key store's ``meta`` record names it (a random id the data store's
marker repeats) and the KEK its keys are under (``kek``), plus the one a
rotation is moving them to (``next``) and, once a rotation is done, the one
it moved them from (``previous``).
"""

from __future__ import annotations

import hashlib
import secrets
import threading
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from ..codec import pack, unpack
from ..core import compiled_or_twin
from ..errors import (
    CorruptStoreError,
    EncryptionKeyError,
    KeyErasedError,
    RotationUnfinishedError,
)
from .envelope import Cipher
from .kek import Kek
from .keystore import KeyBackend

__all__ = ["META", "Keyring", "app_scope", "rotate_kek", "user_scope"]

META = b"meta"
# Sealing and opening run the compiled build of the envelope when there is one.
_envelope = compiled_or_twin("sessionscope.crypto.envelope")
_CACHED_SCOPES = 65536
_NONE: Mapping[bytes, Cipher] = MappingProxyType({})
SCOPES = b"k"


def _h(name: str) -> bytes:
    return hashlib.sha256(name.encode("utf-8", "surrogatepass")).digest()[:16]


def app_scope(app_name: str) -> bytes:
    """Return the key-store key of an app's data keys."""
    return SCOPES + _h(app_name) + b"A"


def user_scope(app_name: str, user_id: str) -> bytes:
    """Return the key-store key of a user's data keys; it starts with the app's prefix."""
    return SCOPES + _h(app_name) + b"U" + _h(user_id)


def app_prefix(app_name: str) -> bytes:
    """Return the prefix of every scope of an app (the app's and its users')."""
    return SCOPES + _h(app_name)


def read_meta(keys: KeyBackend) -> dict[str, Any] | None:
    """Return the key store's meta record, None when it holds none yet."""
    raw = keys.get(META)
    if raw is None:
        return None
    try:
        meta = unpack(raw)
        if not isinstance(meta, dict) or not isinstance(meta.get("id"), str):
            raise ValueError("not a meta record")
    except ValueError as error:
        raise CorruptStoreError(
            f"the key store {keys.where} has an unreadable meta record"
        ) from error
    return meta


def _wrap_place(store_id: str, scope: bytes, key_id: int) -> bytes:
    result: bytes = pack(["sessionscope data key", store_id, scope, key_id])
    return result


def _parse(keys: KeyBackend, raw: bytes) -> tuple[str, int, list[list[Any]]]:
    try:
        kek_id, current, wrapped = unpack(raw)
        if not isinstance(kek_id, str) or not isinstance(current, int):
            raise ValueError("bad fields")
    except (ValueError, TypeError) as error:
        raise CorruptStoreError(f"a data-key record of {keys.where} is unreadable") from error
    return kek_id, current, wrapped


# A scope's data keys unwrapped: its current cipher, every cipher by key id and
# by sealed header, and the key-store record they came from.
_Loaded = tuple[Cipher, dict[int, Cipher], dict[bytes, Cipher], bytes]


class Keyring:
    """The data keys of one store: created on first use, cached unwrapped, erased on demand.

    ``repr`` names the key store and the KEK's id, never a key.
    """

    def __init__(self, kek: Kek, keys: KeyBackend, store_id: str) -> None:
        self._kek = kek
        self._keys = keys
        self.store_id = store_id
        self._lock = threading.Lock()
        # scope -> (current cipher, every cipher by key id, and by sealed header,
        # the record they were unwrapped from: ``refresh`` compares it)
        self._cache: dict[bytes, _Loaded] = {}

    def __repr__(self) -> str:
        return f"Keyring(keys={self._keys.where!r}, kek_id={self._kek.key_id!r})"

    @property
    def kek(self) -> Kek:
        """Return the KEK this keyring unwraps with."""
        return self._kek

    @property
    def keys(self) -> KeyBackend:
        """Return the key store."""
        return self._keys

    def current(self, scope: bytes, fresh: bool = False) -> Cipher:
        """Return the cipher new values of a scope are sealed with, making its first key.

        ``fresh`` reads the key store even when the scope is cached: a new
        session must not be sealed under a key another process erased.
        """
        if not fresh:
            known = self._cache.get(scope)
            if known is not None:
                return known[0]
        raw = self._keys.get(scope)
        if raw is None:
            raw = self._keys.add(scope, self._record(scope, None))
        return self._load(scope, raw)[0]

    def refresh(self, scope: bytes) -> None:
        """Forget a cached scope whose record changed: another process erased or rotated it.

        Reads the key store only when the scope is cached; an unchanged
        record keeps its ciphers (nothing is unwrapped again).
        """
        known = self._cache.get(scope)
        if known is None or self._keys.get(scope) == known[3]:
            return
        with self._lock:
            self._cache.pop(scope, None)

    def cached(self, scope: bytes, key_id: int) -> Cipher | None:
        """Return the cipher of a data key if this keyring holds it unwrapped, else None."""
        known = self._cache.get(scope)
        return None if known is None else known[1].get(key_id)

    def heads(self, scope: bytes) -> Mapping[bytes, Cipher]:
        """Return the ciphers this keyring holds unwrapped for a scope, by ``Cipher.head``.

        Empty when it holds none: the caller takes the path that reads the
        key store (``cipher``), which also says when a key was erased.
        """
        known = self._cache.get(scope)
        return _NONE if known is None else known[2]

    def cipher(self, scope: bytes, key_id: int, what: str) -> Cipher:
        """Return the cipher of data key ``key_id`` of a scope; KeyErasedError if it is gone."""
        known = self._cache.get(scope)
        if known is not None:
            found = known[1].get(key_id)
            if found is not None:
                return found
        raw = self._keys.get(scope)
        if raw is not None:
            found = self._load(scope, raw)[1].get(key_id)
            if found is not None:
                return found
        raise KeyErasedError(
            f"{what} is sealed under a data key its user or app does not have (key id "
            f"{key_id:#010x}): the key was erased, or the record was copied from another user",
            hint="an erased user's or app's data (delete_user, delete_app) can be read by "
            "nobody; delete what is left of it with delete_user or delete_app",
        )

    def rotate(self, scope: bytes) -> int:
        """Give a scope a new current data key (older ones stay for reading); return its id."""
        while True:
            raw = self._keys.get(scope)
            if raw is None:
                raw = self._keys.add(scope, self._record(scope, None))
            new = self._record(scope, raw)
            if self._keys.swap(scope, raw, new):
                return int(self._load(scope, new)[0].key_id)

    def erase(self, scope: bytes, *, prefix: bool = False) -> None:
        """Destroy a scope's data keys (with ``prefix``, of every scope under it)."""
        with self._lock:
            for known in [s for s in self._cache if s.startswith(scope)] if prefix else [scope]:
                self._cache.pop(known, None)
        if prefix:
            self._keys.delete_prefix(scope)
        else:
            self._keys.delete(scope)

    def _record(self, scope: bytes, raw: bytes | None) -> bytes:
        """Return the record with a new current key added (to ``raw``, or to nothing)."""
        wrapped: list[list[Any]] = []
        if raw is not None:
            kek_id, _, wrapped = _parse(self._keys, raw)
            self._check_kek(kek_id)
        taken = {entry[0] for entry in wrapped}
        key_id = 0
        while key_id == 0 or key_id in taken:
            key_id = secrets.randbits(32)
        data_key = secrets.token_bytes(32)
        entry = [key_id, self._kek.wrap(data_key, _wrap_place(self.store_id, scope, key_id))]
        result: bytes = pack([self._kek.key_id, key_id, [*wrapped, entry]])
        return result

    def _check_kek(self, kek_id: str) -> None:
        if kek_id != self._kek.key_id:
            meta = read_meta(self._keys) or {}
            if kek_id not in (meta.get("kek"), meta.get("next"), meta.get("previous")):
                raise _foreign(self._keys, kek_id)
            raise RotationUnfinishedError(
                f"a data key of {self._keys.where} is wrapped under key id {kek_id}, "
                f"not under {self._kek.key_id} ({self._kek.source})",
                hint="a key rotation is unfinished: run `sessionscope rotate-key` again "
                "with the old and the new key",
            )

    def _load(self, scope: bytes, raw: bytes) -> _Loaded:
        kek_id, current, wrapped = _parse(self._keys, raw)
        self._check_kek(kek_id)
        ciphers: dict[int, Cipher] = {}
        for key_id, blob in wrapped:
            data_key = self._kek.unwrap(blob, _wrap_place(self.store_id, scope, key_id))
            if data_key is None:
                raise CorruptStoreError(
                    f"a data key of {self._keys.where} does not unwrap (key id {key_id:#010x}): "
                    "its record was altered or moved"
                )
            ciphers[key_id] = _envelope.Cipher(key_id, data_key)
        if current not in ciphers:
            raise CorruptStoreError(
                f"a data-key record of {self._keys.where} lacks its current key"
            )
        loaded = (ciphers[current], ciphers, {c.head: c for c in ciphers.values()}, raw)
        with self._lock:
            # Bounded: a long-lived process meets many users; a scope dropped
            # is unwrapped again on its next use.
            if len(self._cache) >= _CACHED_SCOPES:
                self._cache.clear()
            self._cache[scope] = loaded
        return loaded


def rotate_kek(keys: KeyBackend, old: Kek, new: Kek) -> int:
    """Re-wrap every data key of a key store from ``old`` to ``new``; return how many records.

    The data is not touched. Crash-safe and resumable: the meta record names
    the rotation's target first, each record is re-wrapped on its own by
    compare-and-swap and names its KEK, and the meta record names ``new`` as
    the store's KEK, and ``old`` as the one it was rotated from, last.
    Running it again (after a crash, or to catch a record a process still
    holding ``old`` wrote meanwhile) re-wraps what is left under ``old`` and
    nothing else. A wrong ``old`` is refused before anything is written.
    """
    meta = read_meta(keys)
    if meta is None:
        raise EncryptionKeyError(f"the key store {keys.where} holds no keys", hint="check keys=")
    if old.key_id == new.key_id:
        raise ValueError("the new key-encryption key is the old one")
    if meta.get("kek") == new.key_id:
        _check_done(keys, meta, old, new)
    else:
        if old.key_id not in (meta.get("kek"), meta.get("next")):
            raise EncryptionKeyError(
                f"the old key-encryption key ({old.source}, key id {old.key_id}) is not the "
                f"one of {keys.where} (key id {meta.get('kek')})",
                hint="give the key the store's data keys are wrapped under as the old key",
            )
        if meta.get("next") not in (None, new.key_id):
            raise _unfinished(keys, meta)
    store_id = meta["id"]
    if meta.get("kek") != new.key_id:
        _set_meta(keys, {**meta, "kek": old.key_id, "next": new.key_id})
    rewrapped = 0
    # Key ids of records wrapped under neither key: altered, never skipped in silence.
    foreign: list[str] = []
    for scope, raw in keys.items(SCOPES):
        while True:
            kek_id, current, wrapped = _parse(keys, raw)
            if kek_id != old.key_id:
                if kek_id != new.key_id:
                    foreign.append(kek_id)
                break
            moved = []
            for key_id, blob in wrapped:
                place = _wrap_place(store_id, scope, key_id)
                data_key = old.unwrap(blob, place)
                if data_key is None:
                    raise CorruptStoreError(f"a data key of {keys.where} does not unwrap")
                moved.append([key_id, new.wrap(data_key, place)])
            if keys.swap(scope, raw, pack([new.key_id, current, moved])):
                rewrapped += 1
                break
            again = keys.get(scope)
            if again is None:  # erased meanwhile
                break
            raw = again
    if foreign:
        # The rotation stays unfinished: the old key is still needed for
        # nothing, but a record no key opens must not pass for re-wrapped.
        raise _foreign(keys, foreign[0], len(foreign))
    final = read_meta(keys) or meta
    done = {"kek": new.key_id, "previous": old.key_id}
    _set_meta(keys, {key: value for key, value in final.items() if key != "next"} | done)
    return rewrapped


def _check_done(keys: KeyBackend, meta: dict[str, Any], old: Kek, new: Kek) -> None:
    """Refuse to run a rotation to ``new`` again, once done, with an ``old`` it was not from.

    Running it again only re-wraps what a process still holding the old key
    wrote meanwhile, so any other key would re-wrap nothing and report
    success. A key store rotated before ``previous`` was recorded names no
    old key: one is taken when some record is still wrapped under it.
    """
    if meta.get("next") not in (None, new.key_id):
        raise _unfinished(keys, meta)
    previous = meta.get("previous")
    if previous == old.key_id:
        return
    if previous is None and any(
        _parse(keys, raw)[0] == old.key_id for _, raw in keys.items(SCOPES)
    ):
        return
    given = f"the old key-encryption key ({old.source}, key id {old.key_id})"
    if previous is None:
        wrong = f"wraps no data key of {keys.where}, which is under key id {new.key_id} already"
    else:
        wrong = (
            f"is not the one {keys.where} was rotated from (key id {previous}) "
            f"to key id {new.key_id}"
        )
    raise EncryptionKeyError(
        f"{given} {wrong}",
        hint="the rotation is done; to catch records written under the old key meanwhile, "
        "give the key the store was rotated from as the old key",
    )


def _foreign(keys: KeyBackend, kek_id: object, count: int = 1) -> CorruptStoreError:
    """Return the error of data-key records that name a key-encryption key the store never had."""
    records = "a data-key record" if count == 1 else f"{count:,} data-key records"
    names = "names" if count == 1 else "name (the first)"
    return CorruptStoreError(
        f"{records} of {keys.where} {names} key id {str(kek_id)[:64]!r}, none of the store's "
        "key-encryption keys: altered outside sessionscope",
        hint="the data of the users or apps whose keys these are cannot be read; restore the "
        "key store from a copy of it, or erase those users or apps",
    )


def _unfinished(keys: KeyBackend, meta: dict[str, Any]) -> RotationUnfinishedError:
    return RotationUnfinishedError(
        f"a rotation of {keys.where} to key id {meta.get('next')} is unfinished",
        hint="finish it first: run rotate-key again with that new key",
    )


def _set_meta(keys: KeyBackend, meta: dict[str, Any]) -> None:
    while True:
        raw = keys.get(META)
        if raw is None or keys.swap(META, raw, pack(meta)):
            return
