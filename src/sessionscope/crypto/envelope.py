"""One value sealed under a data key: AES-256-GCM, bound to its place by associated data.

A sealed value is ``version (1 byte) | data-key id (4 bytes) | nonce (12) |
ciphertext and tag (16)``. The associated data names the value's place
(``place``: kind, app, user, session, event id or state key, packed as one
msgpack array), so a ciphertext copied to another place does not open.

The nonce is synthetic: the first 12 bytes of HMAC-SHA256, under a key of its
own, of the associated data and the plaintext. Sealing the same value at the
same place twice gives the same bytes, which lets a store recognise a
retried append (it compares the stored record with the given one) and a
restored session equal to the stored one; different values never share a
nonce unless HMAC-SHA256 collides. What it reveals: that two values stored
at one place are equal, which the store's retry rules reveal anyway.
"""

from __future__ import annotations

import hmac
import struct
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
]

SEALED_VERSION = 1
_ID = struct.Struct(">BI")
HEADER = _ID.size + 12  # version, key id, nonce
_TAG = 16


def place(*parts: Any) -> bytes:
    """Return the associated data naming a value's place (kind first, then its ids)."""
    result: bytes = pack(parts)
    return result


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
    return version, key_id


class Cipher:
    """One data key, ready to seal and open values: AES-256-GCM and its nonce key.

    The key's bytes live in the ``AESGCM`` object and the nonce key only;
    ``repr`` shows the key id alone.
    """

    __slots__ = ("_aead", "_head", "_nonce_key", "key_id")

    def __init__(self, key_id: int, key: bytes) -> None:
        if len(key) != 32:
            raise ValueError("a data key is 32 bytes")
        self.key_id = key_id
        self._aead = AESGCM(derive(key, b"aes-256-gcm"))
        self._nonce_key = derive(key, b"nonce")
        self._head = _ID.pack(SEALED_VERSION, key_id)

    def __repr__(self) -> str:
        return f"Cipher(key_id={self.key_id:#010x})"

    def seal(self, plaintext: bytes, where: bytes) -> bytes:
        """Return ``plaintext`` sealed at the place ``where``."""
        nonce = hmac.digest(self._nonce_key, where + plaintext, "sha256")[:12]
        return self._head + nonce + self._aead.encrypt(nonce, plaintext, where)

    def open(self, sealed: bytes, where: bytes) -> bytes | None:
        """Return the plaintext of ``sealed`` at ``where``; None if it was altered or moved."""
        try:
            result: bytes = self._aead.decrypt(sealed[5:HEADER], sealed[HEADER:], where)
        except InvalidTag:
            return None
        return result
