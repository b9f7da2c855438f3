"""Encryption at rest with a data key per user, wrapped by a key-encryption key.

``Encryption`` says where the data keys live and where the key-encryption
key comes from; ``open_store(uri, encryption=...)`` (or ``key_file=``,
``key_env=`` and ``keys=`` in the URI) opens any store encrypted, as an
``EncryptedStore``. ``rotate_key`` re-wraps every data key under a new
key-encryption key. See docs/encryption.md. Needs the ``cryptography``
package (the ``encryption`` extra).
"""

from __future__ import annotations

from .kek import Kek, kek_from, new_key_text
from .keyring import rotate_kek
from .keystore import open_key_store
from .store import (
    MARKER_APP,
    EncryptedStore,
    Encryption,
    checked_kek,
    open_encrypted,
    raw_store,
)

__all__ = [
    "MARKER_APP",
    "EncryptedStore",
    "Encryption",
    "Kek",
    "checked_kek",
    "kek_from",
    "new_key_text",
    "open_encrypted",
    "open_key_store",
    "raw_store",
    "rotate_kek",
    "rotate_key",
]


def rotate_key(keys: str, old: Kek, new: Kek) -> int:
    """Re-wrap every data key of the key store ``keys`` (a URI) from ``old`` to ``new``.

    Return how many scopes' records were re-wrapped; the data is not
    touched. Crash-safe and resumable: run it again after an interruption.
    """
    backend = open_key_store(keys, create=False)
    try:
        return rotate_kek(backend, old, new)
    finally:
        backend.close()
