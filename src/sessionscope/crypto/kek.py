"""The key-encryption key (KEK): where the operator keeps it, and wrapping data keys under it.

A KEK is 32 bytes given as a key file (the raw bytes, or their hex or
base64 text), an environment variable (hex or base64 text), or a callable
(bytes or text, e.g. fetched from a KMS or a secret manager). It never
leaves this module but through ``Kek.wrap`` and ``Kek.unwrap``; its public
name is ``Kek.key_id``, an HMAC of it.
"""

from __future__ import annotations

import base64
import binascii
import os
import secrets
from collections.abc import Callable
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ..errors import EncryptionKeyError
from .envelope import derive, key_id_of

__all__ = ["Kek", "kek_from", "new_key_text"]

_HINT = (
    "give the key-encryption key the store was written with: key_file=PATH, "
    "key_env=NAME or a callable (see docs/encryption.md)"
)
# Why a message leaves out what key_file= or key_env= held: see kek_from.
_UNSHOWN = "it may be the key itself, given in the wrong option"


def new_key_text() -> str:
    """Return a new random 32-byte key as 64 hex digits (what a key file may hold)."""
    return secrets.token_hex(32)


def _key_of(raw: bytes | str, where: str) -> bytes:
    """Return the 32 key bytes of raw bytes, or of their hex or base64 text."""
    if isinstance(raw, bytes) and len(raw) == 32:
        return raw
    text = raw.decode("ascii", "replace") if isinstance(raw, bytes) else raw
    text = text.strip()
    try:
        key = bytes.fromhex(text) if len(text) == 64 else base64.b64decode(text, validate=True)
    except (ValueError, binascii.Error):
        key = b""
    if len(key) != 32:
        raise EncryptionKeyError(
            f"the key-encryption key from {where} is not 32 bytes (raw, 64 hex digits or base64)",
            hint=_HINT,
        )
    return key


class Kek:
    """A key-encryption key: wraps and unwraps data keys with AES-256-GCM.

    ``source`` says where it came from (a file's path, a variable's name),
    for messages; ``repr`` shows that and the key id, never the key.
    """

    __slots__ = ("_aead", "key_id", "source")

    def __init__(self, key: bytes, source: str = "a callable") -> None:
        self.key_id = key_id_of(key)
        self.source = source
        self._aead = AESGCM(derive(key, b"kek"))

    def __repr__(self) -> str:
        return f"Kek(key_id={self.key_id!r}, source={self.source!r})"

    def wrap(self, data_key: bytes, where: bytes) -> bytes:
        """Return ``data_key`` wrapped for the place ``where`` (nonce and ciphertext)."""
        nonce = os.urandom(12)
        return nonce + self._aead.encrypt(nonce, data_key, where)

    def unwrap(self, wrapped: bytes, where: bytes) -> bytes | None:
        """Return the data key wrapped for ``where``; None if the bytes or place differ."""
        try:
            result: bytes = self._aead.decrypt(wrapped[:12], wrapped[12:], where)
        except InvalidTag:
            return None
        return result


def kek_from(
    *,
    key_file: str | os.PathLike[str] | None = None,
    key_env: str | None = None,
    key: bytes | Callable[[], bytes | str] | None = None,
) -> Kek:
    """Return the KEK one of the three sources gives; EncryptionKeyError if it is missing."""
    given = [
        name
        for name, value in (("key_file", key_file), ("key_env", key_env), ("key", key))
        if value is not None
    ]
    if len(given) != 1:
        raise ValueError(
            "give the key-encryption key by exactly one of key_file, key_env or key, "
            f"not {', '.join(given) or 'none'}"
        )
    # A name that finds nothing may be the key itself, given in the wrong
    # option: the message then says which option, never what it holds. One
    # that finds a file or a variable is a name, and later messages show it.
    if key_file is not None:
        path = Path(key_file)
        try:
            raw: bytes | str = path.read_bytes()
        except OSError as error:
            raise EncryptionKeyError(
                "key_file names a file that cannot be read: "
                f"{error.strerror or type(error).__name__} (its path is not shown: {_UNSHOWN})",
                hint=_HINT,
            ) from None
        where = f"the key file {str(path)!r}"
        return Kek(_key_of(raw, where), where)
    if key_env is not None:
        text = os.environ.get(key_env)
        if not text:
            raise EncryptionKeyError(
                "key_env names an environment variable that is not set or is empty "
                f"(its name is not shown: {_UNSHOWN})",
                hint=_HINT,
            )
        where = f"the environment variable {key_env!r}"
        return Kek(_key_of(text, where), where)
    assert key is not None
    if isinstance(key, bytes):
        return Kek(_key_of(key, "the key given"), "the key given")
    if not callable(key):
        raise ValueError(f"key must be bytes or a callable, not {type(key).__name__}")
    try:
        fetched = key()
    except Exception as error:
        raise EncryptionKeyError(
            f"the key callable failed: {type(error).__name__}", hint=_HINT
        ) from error
    if not isinstance(fetched, (bytes, str)):
        raise EncryptionKeyError(
            f"the key callable returned {type(fetched).__name__}, not bytes or str", hint=_HINT
        )
    return Kek(_key_of(fetched, "the key callable"), "the key callable")
