"""The one exception hierarchy shared by every layer of sessionscope.

Each error also subclasses the builtin a caller would naturally catch, so code
written against ADK's services (which raise ValueError and TypeError) keeps
working unchanged.
"""

from __future__ import annotations

__all__ = [
    "AlreadyExistsError",
    "CorruptStoreError",
    "DumpError",
    "DuplicateEventError",
    "EncryptedStoreError",
    "EncryptionKeyError",
    "IncompatibleStoreError",
    "KeyErasedError",
    "ReadonlyStateError",
    "RotationUnfinishedError",
    "SessionNotFoundError",
    "SessionscopeError",
    "StaleSessionError",
    "StateValueError",
    "StoreClosedError",
    "StoreError",
    "StoreNotFoundError",
    "UnsafeStoreError",
]


class SessionscopeError(Exception):
    """Base class of every error raised by sessionscope."""


class SessionNotFoundError(SessionscopeError, ValueError):
    """The session does not exist (never created, or deleted)."""


class StaleSessionError(SessionscopeError, ValueError):
    """The session object was read before the store last moved on."""


class AlreadyExistsError(SessionscopeError, ValueError):
    """A session with this id already exists for the app and user."""


class DuplicateEventError(SessionscopeError, ValueError):
    """An event id the session already stores was appended with other content."""


class StateValueError(SessionscopeError, TypeError):
    """A state or event value is not of a storable type.

    The message names the key path, e.g. ``state['cart'][2]: set is not storable``.
    """


class ReadonlyStateError(SessionscopeError, TypeError):
    """A write went through a read-only view of state."""


class StoreError(SessionscopeError, RuntimeError):
    """The storage layer failed; the message carries a hint on what to do."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        self.hint = hint
        super().__init__(f"{message} (hint: {hint})" if hint else message)


class IncompatibleStoreError(StoreError):
    """The path holds something that is not a store this version can open."""


class EncryptedStoreError(IncompatibleStoreError):
    """The store was written encrypted, and is opened without its key.

    Nothing is read or written: give the key-encryption key and the key
    store (see docs/encryption.md).
    """


class StoreClosedError(StoreError):
    """The store was used after close()."""


class CorruptStoreError(StoreError):
    """The store's files are damaged: truncated, overwritten or unreadable."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(
            message,
            hint
            or "the store is damaged: restore it from a backup; `sessionscope verify` "
            "checks a store without opening it",
        )


class UnsafeStoreError(StoreError):
    """The store's directory or files could be changed by someone else, or were.

    Also a Redis server that may evict keys, which would drop sessions silently.
    """


class StoreNotFoundError(StoreError, ValueError):
    """A read-only open found no store where the URI points (nothing was created)."""


class DumpError(SessionscopeError, ValueError):
    """A dump is truncated, altered, of a newer format, or conflicts with the store."""


class EncryptionKeyError(StoreError):
    """The key-encryption key of an encrypted store is missing, or not the store's.

    Raised when the store is opened, before anything is written; the message
    names where the key was looked for and its key id, never the key.
    """


class RotationUnfinishedError(EncryptionKeyError):
    """A key rotation of the store's key store is unfinished: run ``rotate-key`` again.

    A data key still wrapped under the key the store is rotated from (or to),
    read with the other one; nothing is damaged.
    """


class KeyErasedError(CorruptStoreError):
    """A record of an encrypted store is sealed under a data key its user or app does not have.

    ``delete_user`` and ``delete_app`` destroy their data keys: a backup, a
    dump or a stale copy of what they held can no longer be read by anyone.
    (A record copied from another user's place looks the same.)
    """


def batch_stopped(error: BaseException, stored: int, total: int) -> BaseException:
    """Return ``error``, which stopped a batch of ``total`` appends, saying how many are stored.

    The error keeps its class (a caller catching ``SessionNotFoundError``
    still does) and gains ``stored``: the batch's first ``stored`` appends
    are stored (appended, or found already stored as repeats), none after.
    From Python 3.11 on a note on the error says it too, so that a
    traceback shows it.
    """
    error.stored = stored  # type: ignore[attr-defined]
    add_note = getattr(error, "add_note", None)
    if add_note is not None:
        add_note(
            f"the batch stopped here: its first {stored} of {total} appends are stored, none after"
        )
    return error
