"""One value sealed under a data key: AES-256-GCM, bound to its place by associated data.

A sealed value is ``version (1 byte) | data-key id (4 bytes) | nonce (12) |
ciphertext and tag (16)``. The associated data names the value's place
(``place``: kind, app, user, session, event id or state key, packed as one
msgpack array), so a ciphertext copied to another place does not open.

An event record's nonce is synthetic: keyed BLAKE2b (under a key of its
own) of the associated data and the plaintext, cut to 12 bytes. Sealing
the same record at the same place twice gives the same bytes, which lets a
store recognise a retried append (it compares the stored record with the
given one); different records never share a nonce unless BLAKE2b collides.
What it reveals: that a record stored twice at one place is the same, which
the store's retry rules reveal anyway. A state value's nonce is random (96
bits: 8 random bytes drawn when a process unwraps the key, then a 4-byte
counter, redrawn when it wraps), so no two values sealed under one data key
share a nonce unless two draws of 64 random bits collide; ``EncryptedStore``
compares restored state in plaintext.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import os
import struct
import threading
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ..codec import pack

__all__ = [
    "HEADER",
    "SEALED_VERSION",
    "Cipher",
    "derive",
    "key_id_of",
    "place",
    "split",
    "state_place",
]

SEALED_VERSION = 1
_blake2b = hashlib.blake2b
_ID = struct.Struct(">BI")
HEADER = _ID.size + 12  # version, key id, nonce
_TAG = 16


def place(*parts: Any) -> bytes:
    """Return the associated data naming a value's place (kind first, then its ids)."""
    result: bytes = pack(parts)
    return result


def _bin(data: bytes) -> bytes:
    """Return ``data`` as a msgpack bin (what a sealed state value is stored as)."""
    size = len(data)
    if size < 0x100:
        return b"\xc4" + bytes((size,)) + data
    if size < 0x10000:
        return b"\xc5" + size.to_bytes(2, "big") + data
    return b"\xc6" + size.to_bytes(4, "big") + data


def state_place(prefix: bytes, key: str) -> bytes:
    """Return the place of a state value: its map's place (a packed array) and its key."""
    return prefix + key.encode()


def derive(key: bytes, label: bytes) -> bytes:
    """Return a 32-byte key of its own for one use (``label``) of a 32-byte key."""
    return hmac.digest(key, b"sessionscope " + label, "sha256")


def key_id_of(key: bytes) -> str:
    """Return the public id of a key: 16 hex digits of an HMAC of it, never the key."""
    return derive(key, b"key id").hex()[:16]


def split(sealed: bytes) -> tuple[int, int]:
    """Return (version, data-key id) from a sealed value's header; ValueError if too short."""
    if len(sealed) < HEADER + _TAG:
        raise ValueError("too short to be a sealed value")
    version, key_id = _ID.unpack_from(sealed)
    if version != SEALED_VERSION:
        raise ValueError(f"sealed with version {version}, this version reads {SEALED_VERSION}")
    return version, key_id


class Cipher:
    """One data key, ready to seal and open values: AES-256-GCM and its nonce key.

    The key's bytes live in the ``AESGCM`` object and the nonce key only;
    ``repr`` shows the key id alone.
    """

    __slots__ = ("_aead", "_count", "_head", "_lock", "_nonce_key", "_salt", "key_id")

    def __init__(self, key_id: int, key: bytes) -> None:
        if len(key) != 32:
            raise ValueError("a data key is 32 bytes")
        self.key_id = key_id
        self._aead = AESGCM(derive(key, b"aes-256-gcm"))
        self._nonce_key = derive(key, b"nonce")
        self._head = _ID.pack(SEALED_VERSION, key_id)
        self._salt = os.urandom(8)
        self._count = itertools.count()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Cipher(key_id={self.key_id:#010x})"

    def seal(self, plaintext: bytes, where: bytes) -> bytes:
        """Return ``plaintext`` sealed at the place ``where``, under a counter nonce."""
        nonce = self._nonce()
        sealed: bytes = self._head + nonce + self._aead.encrypt(nonce, plaintext, where)
        return sealed

    def seal_items(self, items: list[tuple[str, bytes]], prefix: bytes) -> list[tuple[str, bytes]]:
        """Return state items with each value sealed at ``prefix`` and its key, as msgpack bin.

        One loop for the values of a map (what an append hands a store), so
        a value costs its AES-GCM call and little else.
        """
        encrypt = self._aead.encrypt
        head = self._head
        bin_of = _bin
        sealed = []
        for key, value in items:
            nonce = self._nonce()
            sealed.append(
                (key, bin_of(head + nonce + encrypt(nonce, value, prefix + key.encode())))
            )
        return sealed

    def _nonce(self) -> bytes:
        number = next(self._count)  # atomic: itertools.count holds the GIL's promise
        if number < 0xFFFFFFFF:
            return self._salt + number.to_bytes(4, "big")
        with self._lock:
            if next(self._count) >= 0xFFFFFFFF:
                self._salt, self._count = os.urandom(8), itertools.count(1)
        return os.urandom(12)

    def seal_fixed(self, plaintext: bytes, where: bytes) -> bytes:
        """Return ``plaintext`` sealed at ``where``, the same bytes each time (synthetic nonce)."""
        nonce = _blake2b(where + plaintext, key=self._nonce_key, digest_size=12).digest()
        sealed: bytes = self._head + nonce + self._aead.encrypt(nonce, plaintext, where)
        return sealed

    def open(self, sealed: bytes, where: bytes) -> bytes | None:
        """Return the plaintext of ``sealed`` at ``where``; None if it was altered or moved."""
        try:
            result: bytes = self._aead.decrypt(sealed[5:HEADER], sealed[HEADER:], where)
        except InvalidTag:
            return None
        return result
