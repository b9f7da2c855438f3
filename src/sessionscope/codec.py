"""The one place msgpack options live: how values, state maps and events become bytes.

Values are checked against the contract's storable types before they are
packed (``check_storable`` in the compiled core), so an unstorable value is a
``StateValueError`` naming its key path and nothing is written. Event records
carry a one-byte format version so that stored events can evolve.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any

import msgpack

from .core import check_delta, check_storable
from .errors import CorruptStoreError, IncompatibleStoreError, StateValueError

__all__ = [
    "EVENT_FORMAT",
    "UNDECODABLE",
    "check_event_values",
    "decode_event",
    "decode_state_value",
    "decode_stored",
    "decode_value",
    "decode_values",
    "encode_event",
    "encode_items",
    "encode_value",
    "events_equal",
    "pack",
    "pack_event",
    "packer",
    "unpack",
    "unreadable",
    "unreadable_event",
    "unreadable_state_value",
]

# Version byte in front of every stored event record.
EVENT_FORMAT = 1
_EVENT_PREFIX = bytes([EVENT_FORMAT])

# use_bin_type keeps bytes and str apart; datetime stays off because datetimes
# are not storable values. strict_map_key admits only str (and bytes) map keys.
_PACKER_OPTIONS = {"use_bin_type": True, "datetime": False}
# msgpack.packb builds a Packer on every call, which costs more than packing
# a small value; each thread keeps one instead (a Packer is not thread-safe).
_local = threading.local()


def packer() -> Any:
    """Return this thread's packer, for a caller that packs several values in a row."""
    try:
        return _local.packer
    except AttributeError:
        _local.packer = msgpack.Packer(**_PACKER_OPTIONS)
        return _local.packer


def pack(value: Any) -> bytes:
    """Return the msgpack bytes of a value."""
    try:
        packer = _local.packer
    except AttributeError:
        packer = _local.packer = msgpack.Packer(**_PACKER_OPTIONS)
    result: bytes = packer.pack(value)
    return result


# The options unpacking needs are msgpack's defaults since 1.0 (the oldest
# version this package accepts): raw=False (strings come back as str),
# strict_map_key=True, use_list=True. Passing them as keywords on every call
# costs a third of decoding a session record, the whole of a listing's work,
# so they are left to the defaults; tests/test_codec.py checks each of them.
unpack = msgpack.unpackb


# What msgpack raises for bytes that do not decode.
UNDECODABLE = (ValueError, TypeError, msgpack.UnpackException)


def unreadable(what: str, error: Exception) -> CorruptStoreError:
    """Return the error for stored bytes ``what`` that do not decode (``error``: msgpack's)."""
    return CorruptStoreError(f"{what} is unreadable ({error})")


def decode_stored(data: bytes | memoryview, what: str) -> Any:
    """Return a value read back from a store; bytes that do not decode are a CorruptStoreError.

    What a store wrote always decodes: when it does not (invalid UTF-8 in a
    string, a truncated or stray byte), the file was damaged under a value,
    where LMDB's structural check cannot see it. ``what`` names the value.
    """
    try:
        return unpack(data)
    except UNDECODABLE as error:
        raise unreadable(what, error) from error


def decode_state_value(data: bytes | memoryview, key: str) -> Any:
    """Return a state value read back from a store, as ``decode_stored`` does.

    The name in the error (``state value 'key'``) is made only for bytes
    that do not decode: a read decodes every value of three maps, and making
    each one's name up front cost more than decoding it.
    """
    try:
        return unpack(data)
    except UNDECODABLE as error:
        raise unreadable_state_value(key, error) from error


def unreadable_state_value(key: str, error: Exception) -> CorruptStoreError:
    """Return the error for the state value of ``key`` whose bytes do not decode."""
    return unreadable(f"state value {key!r}", error)


def encode_value(value: Any, path: str) -> bytes:
    """Check a value and return its bytes; ``path`` names it in errors."""
    check_storable(value, path)
    result: bytes = pack(value)
    return result


def decode_value(data: bytes) -> Any:
    """Return the value stored as ``data``."""
    return unpack(data)


def encode_items(items: Mapping[str, Any]) -> list[tuple[str, bytes]]:
    """Pack each value of an already checked map, one entry per key.

    The compiled core has validated the values (``partition_checked``), so
    this only packs them; one entry per key lets a store write exactly the
    keys a delta touches.
    """
    return [(key, pack(value)) for key, value in items.items()]


def encode_event(record: Mapping[str, Any], path: str = "event") -> bytes:
    """Check an event record and return its versioned bytes."""
    check_storable(record, path)
    result: bytes = _EVENT_PREFIX + pack(record)
    return result


def pack_event(record: Mapping[str, Any]) -> bytes:
    """Return the versioned bytes of a record whose values are already checked."""
    result: bytes = _EVENT_PREFIX + pack(record)
    return result


def decode_event(data: bytes) -> Any:
    """Return the record stored as ``data``."""
    if not data or data[0] != EVENT_FORMAT:
        version = data[0] if data else None
        raise IncompatibleStoreError(
            f"event record has format {version}, this version reads format {EVENT_FORMAT}",
            hint="upgrade sessionscope to read this store",
        )
    # decode_stored without its call: a read decodes each of its events here.
    try:
        return unpack(memoryview(data)[1:])
    except UNDECODABLE as error:
        raise unreadable("an event record", error) from error


def check_event_values(fields: Mapping[Any, Any], root: str = "event") -> None:
    """Raise StateValueError unless an event record's values are what the service stores.

    For records from outside (dumps, traces). The service bounds the nesting
    of each field of an event, and of each value of its state delta, from
    that value, not from the record holding them: checked whole, an event it
    stores could be up to three levels too deep, and would export but never
    import. ``root`` names the record in messages.
    """
    for name, value in fields.items():
        if not isinstance(name, str):
            raise StateValueError(f"{root} has a field named by a {type(name).__name__}")
        where = f"{root}[{name!r}]"
        if name != "actions" or not isinstance(value, Mapping):
            check_storable(value, where)
            continue
        for action, item in value.items():
            if not isinstance(action, str):
                raise StateValueError(f"{where} has a field named by a {type(action).__name__}")
            if action == "state_delta" and isinstance(item, Mapping):
                check_delta(item, f"{where}[{action!r}]")
            else:
                check_storable(item, f"{where}[{action!r}]")


def unreadable_event(error: Exception) -> CorruptStoreError:
    """Return the error for a stored event record that decodes but makes no event.

    A model (the native one or ADK's) could not build an event from it: a
    damaged byte turned a field into another type or name, or the record was
    written through the other API (the two store events in their own shapes).
    """
    return CorruptStoreError(
        f"an event record is unreadable: {type(error).__name__}: {error}".splitlines()[0],
        hint="a session written through one API reads through that one only (the native "
        "service and the ADK drop-in keep events in their own shapes): read it there; "
        "otherwise the store is damaged: `sessionscope verify` checks it, a backup restores it",
    )


def events_equal(stored: bytes, candidate: bytes) -> bool:
    """Tell whether two event records hold equal content.

    Byte equality is the fast path; records whose maps were built in another
    key order are equal when their decoded values are.
    """
    return stored == candidate or _same(decode_event(stored), decode_event(candidate))


def _same(a: Any, b: Any) -> bool:
    """Tell whether two decoded values are equal in type too: 1, 1.0 and True differ."""
    if type(a) is not type(b):
        return False
    if type(a) is dict:
        return a.keys() == b.keys() and all(_same(value, b[key]) for key, value in a.items())
    if type(a) is list:
        return len(a) == len(b) and all(map(_same, a, b))
    if type(a) is float and a != a:
        return bool(b != b)  # NaN is stored as NaN: a repeat of it is the same value
    return bool(a == b)


def decode_values(items: Iterable[tuple[str, bytes]]) -> dict[str, Any]:
    """Return a map from (key, bytes) pairs read back from a store."""
    return {key: decode_state_value(data, key) for key, data in items}
