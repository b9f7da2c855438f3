"""Route state keys by scope prefix and validate storable values, in pure Python.

This module is the twin of the compiled ``sessionscope._speedups._core``: it is the
oracle the tests compare the compiled core against, the fallback where the
extension is not built, and the source of the types both share (the prefix
constants and the ``Scope`` enum).

Keys may be ``str`` subclasses; they are routed by their characters, as plain
``str``. Containers may be subclasses of ``dict``, ``list`` and ``tuple``;
they are read through their ``items()`` and iteration.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any, Final

import msgpack

from sessionscope.errors import StateValueError

__all__ = [
    "APP_PREFIX",
    "FIELD_AS_IS",
    "FIELD_REFUSED",
    "FIELD_SORTED",
    "KEY_PREFIX_APP",
    "KEY_PREFIX_TEMP",
    "KEY_PREFIX_USER",
    "MAX_DEPTH",
    "TEMP_PREFIX",
    "USER_PREFIX",
    "Scope",
    "apply_delta",
    "check_delta",
    "check_storable",
    "last_values",
    "merge_scopes",
    "pack_event",
    "pack_model",
    "pack_plain",
    "partition_by_scope",
    "partition_checked",
    "revision_marker",
    "scope_of",
    "sized_key",
    "sortable_time",
    "timed_record",
    "trim_temp_keys",
]

APP_PREFIX: Final = "app:"
USER_PREFIX: Final = "user:"
TEMP_PREFIX: Final = "temp:"

# The names ADK uses for the same prefixes (google.adk.sessions.State).
KEY_PREFIX_APP: Final = APP_PREFIX
KEY_PREFIX_USER: Final = USER_PREFIX
KEY_PREFIX_TEMP: Final = TEMP_PREFIX

# Deeper values are refused rather than walked: it stops self-referencing
# containers, and keeps the walk well inside Python's default recursion limit.
MAX_DEPTH: Final = 512

_APP_LEN: Final = len(APP_PREFIX)
_USER_LEN: Final = len(USER_PREFIX)

# msgpack stores integers as int64 or uint64.
_INT_MIN: Final = -(2**63)
_INT_MAX: Final = 2**64 - 1

# Types that are always storable, checked by identity first because almost
# every value is one of them.
# Values storable as they are; a str is plain only when ASCII (see _text_problem).
_PLAIN: Final = frozenset({float, bool, bytes, type(None)})
_SURROGATE: Final = "holds a lone surrogate: it is not storable as UTF-8"

# A refused value: why, and the keys and indexes that lead to it from the
# top. The path is only formatted when a value is refused.
_Problem = tuple[str, list[object]]
_Walk = Iterator[tuple[object, object]]


class Scope(enum.Enum):
    """Where a state key is stored, decided by its prefix."""

    APP = "app"
    USER = "user"
    SESSION = "session"
    TEMP = "temp"

    @classmethod
    def of(cls, key: str) -> Scope:
        """Return the scope of a state key."""
        return scope_of(key)


def _text_problem(text: str) -> bool:
    """Tell whether a str cannot be written as UTF-8 (it holds a lone surrogate)."""
    if text.isascii():
        return False
    try:
        text.encode()
    except UnicodeEncodeError:
        return True
    return False


def _plain(value: object) -> bool:
    cls = type(value)
    return cls in _PLAIN or (cls is str and value.isascii())  # type: ignore[attr-defined]


def _key_error(label: str, key: object) -> StateValueError:
    return StateValueError(f"{label} key {key!r} is not a str")


def scope_of(key: str) -> Scope:
    """Return the scope of a state key."""
    if not isinstance(key, str):
        raise _key_error("state", key)
    if key.startswith(APP_PREFIX):
        return Scope.APP
    if key.startswith(USER_PREFIX):
        return Scope.USER
    if key.startswith(TEMP_PREFIX):
        return Scope.TEMP
    return Scope.SESSION


def partition_by_scope(
    delta: Mapping[str, Any],
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Split a delta into (app, user, session, temp) maps, app and user keys unprefixed."""
    return _partition(delta, check=False)


def _partition(
    delta: Mapping[str, Any], check: bool
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]:
    app: dict[str, Any] = {}
    user: dict[str, Any] = {}
    session: dict[str, Any] = {}
    temp: dict[str, Any] = {}
    for key, value in delta.items():
        if not isinstance(key, str):
            raise _key_error("state", key)
        # Temp values live only on the live session object, so anything goes.
        if key.startswith(TEMP_PREFIX):
            temp[key] = value
            continue
        if check and _text_problem(key):
            raise StateValueError(f"state key {key!r} {_SURROGATE}")
        if check and not _plain(value):
            problem = _find_problem(value)
            if problem is not None:
                raise _refuse(f"state[{key!r}]", problem)
        if key.startswith(APP_PREFIX):
            app[key[_APP_LEN:]] = value
        elif key.startswith(USER_PREFIX):
            user[key[_USER_LEN:]] = value
        else:
            session[key] = value
    return app, user, session, temp


def trim_temp_keys(delta: Mapping[str, Any]) -> dict[str, Any]:
    """Return a copy of a delta without its ``temp:`` keys."""
    trimmed: dict[str, Any] = {}
    for key, value in delta.items():
        if not isinstance(key, str):
            raise _key_error("state", key)
        if not key.startswith(TEMP_PREFIX):
            trimmed[key] = value
    return trimmed


def merge_scopes(
    app: Mapping[str, Any], user: Mapping[str, Any], session: Mapping[str, Any]
) -> dict[str, Any]:
    """Return the state a caller sees: session keys, then prefixed app and user keys."""
    merged = dict(session)
    for key in merged:
        if not isinstance(key, str):
            raise _key_error("session state", key)
    for key, value in app.items():
        if not isinstance(key, str):
            raise _key_error("app state", key)
        merged[APP_PREFIX + key] = value
    for key, value in user.items():
        if not isinstance(key, str):
            raise _key_error("user state", key)
        merged[USER_PREFIX + key] = value
    return merged


def apply_delta(state: MutableMapping[str, Any], delta: Mapping[str, Any]) -> None:
    """Set every key of a delta on a state, in order; a None value is stored."""
    # Keys are checked first so that a bad key leaves the state untouched.
    for key in delta:
        if not isinstance(key, str):
            raise _key_error("state", key)
    for key, value in delta.items():
        state[key] = value


def _check_int(value: int) -> str | None:
    if _INT_MIN <= value <= _INT_MAX:
        return None
    return f"int {value} is out of the 64-bit range"


def _open(value: object, depth: int) -> str | tuple[_Walk, bool] | None:
    # None: storable as it is. str: why it is not. Otherwise the (step, item)
    # pairs of a container to walk, and whether they come from a dict.
    # Subclass tests go through the type, never isinstance(), which would
    # trust an object's __class__ attribute; the compiled core does the same.
    cls = type(value)
    if cls in _PLAIN:
        return None
    if issubclass(cls, str):
        return f"str {_SURROGATE}" if _text_problem(value) else None  # type: ignore[arg-type]
    if cls is int:
        return _check_int(value)  # type: ignore[arg-type]
    if issubclass(cls, (dict, list, tuple)):
        if depth >= MAX_DEPTH:
            return f"{cls.__name__} is nested too deeply (over {MAX_DEPTH} levels)"
        if issubclass(cls, dict):
            return iter(value.items()), True  # type: ignore[attr-defined]
        # A tuple subclass is stored as a list, except msgpack's ExtType (a
        # namedtuple): msgpack packs it as an extension, which reads back as an
        # ExtType. Only a subclass is looked up: exact lists and tuples skip it.
        if cls is not list and cls is not tuple and issubclass(cls, msgpack.ExtType):
            return f"{cls.__name__} is not storable"
        return enumerate(value), False  # type: ignore[arg-type]
    if issubclass(cls, (float, bytes)):
        return None
    if issubclass(cls, int):
        return _check_int(value)  # type: ignore[arg-type]
    return f"{cls.__name__} is not storable"


def _find_problem(value: object) -> _Problem | None:
    # An explicit stack rather than recursion: MAX_DEPTH levels of Python
    # calls would hit the interpreter's recursion limit before the depth limit.
    opened = _open(value, 0)
    if opened is None:
        return None
    if isinstance(opened, str):
        return opened, []
    walks = [opened]
    steps: list[object] = []
    while walks:
        walk, in_dict = walks[-1]
        for step, item in walk:
            if in_dict and not isinstance(step, str):
                return f"dict key {step!r} is not a str", steps
            if in_dict and _text_problem(step):  # type: ignore[arg-type]
                return f"dict key {step!r} {_SURROGATE}", steps
            if _plain(item):
                continue
            opened = _open(item, len(walks))
            if opened is None:
                continue
            steps.append(step)
            if isinstance(opened, str):
                return opened, steps
            walks.append(opened)
            break
        else:
            walks.pop()
            if steps:
                steps.pop()
    return None


def _refuse(path: str, problem: _Problem) -> StateValueError:
    message, steps = problem
    where = "".join([f"[{step!r}]" for step in steps])
    return StateValueError(f"{path}{where}: {message}")


def check_storable(value: object, path: str) -> None:
    """Raise StateValueError, naming the key path, unless a value can be stored."""
    problem = _find_problem(value)
    if problem is not None:
        raise _refuse(path, problem)


def check_delta(delta: Mapping[str, Any], root: str = "state") -> None:
    """Raise StateValueError unless every key of a delta is a str and every value storable."""
    for key, value in delta.items():
        if not isinstance(key, str):
            raise _key_error(root, key)
        if _text_problem(key):
            raise StateValueError(f"{root} key {key!r} {_SURROGATE}")
        if _plain(value):
            continue
        problem = _find_problem(value)
        if problem is not None:
            raise _refuse(f"{root}[{key!r}]", problem)


def partition_checked(
    delta: Mapping[str, Any],
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Validate a delta and split it into (app, user, session, temp) maps in one pass."""
    return _partition(delta, check=True)


# pack_plain walks this deep at most, and leaves deeper values to the checked path
# (the compiled core has the same limit).
_PLAIN_DEPTH: Final = 64


def pack_plain(value: object, prefix: bytes = b"") -> bytes | None:
    """Return ``prefix`` and the msgpack bytes of a plain value, or None: the caller packs it.

    Plain: None, bool, float, bytes, an int of the 64-bit range, a str
    storable as UTF-8, and dicts (str keys) and lists of plain values,
    nested at most 64 deep, each of exactly these types. A plain
    value is storable (``check_storable`` passes it), and its bytes are
    msgpack's with the codec's options (``use_bin_type``): the compiled core
    checks and packs it in one walk. Anything else, storable or not, gives
    None, as does a str, bytes or container too long for a msgpack header.
    ``prefix`` goes in front of the packed bytes, in the same new object.
    """
    if type(prefix) is not bytes:
        raise TypeError(f"prefix must be bytes, not {type(prefix).__name__}")
    if not _all_plain(value, 0):
        return None
    try:
        packed: bytes = msgpack.packb(value, use_bin_type=True, datetime=False)
    except ValueError:  # longer than a msgpack header can say
        return None
    return prefix + packed


def _all_plain(value: object, depth: int) -> bool:
    cls = type(value)
    if cls in _PLAIN:
        return True
    if cls is int:
        return _INT_MIN <= value <= _INT_MAX  # type: ignore[operator]
    if cls is str:
        return not _text_problem(value)  # type: ignore[arg-type]
    if depth >= _PLAIN_DEPTH:
        return False
    if cls is dict:
        return all(
            type(key) is str and not _text_problem(key) and _all_plain(item, depth + 1)
            for key, item in value.items()  # type: ignore[attr-defined]
        )
    if cls is list:
        return all(_all_plain(item, depth + 1) for item in value)  # type: ignore[attr-defined]
    return False


# Field values of these types are packed as they are; any other type gives None.
_FIELD_TYPES: Final = frozenset({dict, list, bool, int, float, bytes})
# A msgpack fixmap holds this many entries at most: pack_event packs no bigger map.
_FIXMAP_MAX: Final = 15


def pack_event(
    event: Any,
    fields: tuple[str, ...],
    action_fields: tuple[str, ...],
    prefix: bytes = b"",
) -> bytes | None:
    """Return ``prefix`` and the msgpack bytes of an event's record, or None: the caller packs it.

    The record is the map of the event's ``id`` and ``timestamp``, each of
    ``fields`` set (not None, not empty text), its ``actions`` when any of
    them is set (a non-empty ``state_delta``, ``artifact_delta`` and
    ``extra``; each of ``action_fields`` not None), and a non-empty ``extra``:
    the bytes ``pack_plain`` gives for that map. None for a record that is not
    plain (see ``pack_plain``), for a field of another type than the plain
    ones, a delta or ``extra`` that is not a dict, and a map of more than 15
    entries. The compiled core packs the map without building it.
    """
    if type(prefix) is not bytes:
        raise TypeError(f"prefix must be bytes, not {type(prefix).__name__}")
    if type(fields) is not tuple or type(action_fields) is not tuple:
        raise TypeError("fields and action_fields must be tuples of str")
    record: dict[str, Any] = {"id": event.id, "timestamp": event.timestamp}
    for name in fields:
        value = getattr(event, name)
        if value is None or (type(value) is str and not value):
            continue
        if type(value) is not str and type(value) not in _FIELD_TYPES:
            return None
        record[name] = value
    actions = event.actions
    packed: dict[str, Any] = {}
    if not _add_map(packed, "state_delta", actions.state_delta):
        return None
    if not _add_map(packed, "artifact_delta", actions.artifact_delta):
        return None
    for name in action_fields:
        value = getattr(actions, name)
        if value is not None:
            packed[name] = value
    if not _add_map(packed, "extra", actions.extra):
        return None
    if packed:
        if len(packed) > _FIXMAP_MAX:
            return None
        record["actions"] = packed
    if not _add_map(record, "extra", event.extra) or len(record) > _FIXMAP_MAX:
        return None
    return pack_plain(record, prefix)


def _add_map(record: dict[str, Any], name: str, value: object) -> bool:
    """Add a dict to ``record`` when it is not empty; False for a value not a dict."""
    if value is None or (type(value) is dict and not value):
        return True
    if type(value) is not dict:
        return False
    record[name] = value
    return True


# -- packing a model's dump -------------------------------------------------------------

# How a planned field packs when it is set (see pack_model): the plans'
# makers and both builds read these.
FIELD_AS_IS: Final = 0
FIELD_SORTED: Final = 1
FIELD_REFUSED: Final = 2


_BAD_PLAN: Final = (
    "plans must map classes to tuples of (name, serialization name, how) tuples, how 0 to 2"
)
# A map16 header counts this many entries at most.
_MAP16_MAX: Final = 0xFFFF


class _NotPacked(Exception):
    """A value pack_model does not pack: the caller dumps the model itself."""


def pack_model(model: Any, plans: dict[type, Any], prefix: bytes = b"") -> bytes | None:
    """Return ``prefix`` and the msgpack bytes of a model's dump, or None: the caller dumps it.

    ``plans`` maps each model class to walk to its fields, in order, as
    ``(name, serialization name, how)``: ``how`` ``FIELD_AS_IS`` packs a set
    value as it is, ``FIELD_SORTED`` a set of str as a sorted list, and
    ``FIELD_REFUSED`` gives None when the field is set. A field whose value
    is None is left out, as ``exclude_none`` leaves it out. Values are plain
    (see ``pack_plain``; a str subclass packs as its text), models of a
    planned class, and dicts and lists of them.
    None for any other value, a model of a class without a plan, and a model
    whose fields are not in its instance dict. The compiled core packs the
    map without building it.
    """
    if type(prefix) is not bytes:
        raise TypeError(f"prefix must be bytes, not {type(prefix).__name__}")
    if type(plans) is not dict:
        raise TypeError(f"plans must be a dict, not {type(plans).__name__}")
    plan = plans.get(type(model))
    if plan is None:
        return None
    try:
        record = _model_dump(model, plan, plans, 0)
    except _NotPacked:
        return None
    return pack_plain(record, prefix)


def _model_dump(model: Any, plan: Any, plans: dict[type, Any], depth: int) -> dict[str, Any]:
    if type(plan) is not tuple:
        raise TypeError(_BAD_PLAN)
    fields = getattr(model, "__dict__", None)
    if type(fields) is not dict:
        raise _NotPacked
    dump: dict[str, Any] = {}
    for entry in plan:
        if type(entry) is not tuple or len(entry) != 3:
            raise TypeError(_BAD_PLAN)
        name, alias, how = entry
        if type(alias) is not str or type(how) is not int:
            raise TypeError(_BAD_PLAN)
        if not FIELD_AS_IS <= how <= FIELD_REFUSED:
            raise TypeError(_BAD_PLAN)
        if name not in fields:
            raise _NotPacked
        value = fields[name]
        if value is None:
            continue
        if how == FIELD_REFUSED:
            raise _NotPacked
        if how == FIELD_SORTED:
            if type(value) not in (set, frozenset) or any(type(item) is not str for item in value):
                raise _NotPacked
            value = sorted(value)
        dump[alias] = _model_value(value, plans, depth + 1)
    if len(dump) > _MAP16_MAX:
        raise _NotPacked
    return dump


def _model_value(value: Any, plans: dict[type, Any], depth: int) -> Any:
    if isinstance(value, str):
        # A str enum member packs as its text, as msgpack packs a str subclass.
        return str.__str__(value)
    cls = type(value)
    if depth >= _PLAIN_DEPTH and (cls is dict or cls is list or cls in plans):
        raise _NotPacked  # deeper than pack_plain packs
    if cls is dict:
        return {key: _model_value(item, plans, depth + 1) for key, item in value.items()}
    if cls is list:
        return [_model_value(item, plans, depth + 1) for item in value]
    plan = plans.get(cls)
    if plan is not None:
        return _model_dump(value, plan, plans, depth)
    # Left for pack_plain to judge: a value that is not plain makes it give None.
    return value


# -- store key and value bytes --------------------------------------------------------

_F64: Final = struct.Struct(">d")


_U64: Final = struct.Struct(">Q")


def sortable_time(timestamp: float) -> bytes:
    """Return 8 bytes that sort as the float ``timestamp`` does, negatives included.

    The IEEE bits, big-endian, with the sign bit set for a positive number
    and every bit flipped for a negative one. -0.0 gives the bytes of 0.0:
    the two zeros compare equal, so they must sort equal.
    """
    (bits,) = _U64.unpack(_F64.pack(timestamp + 0.0))
    bits = bits ^ 0xFFFFFFFFFFFFFFFF if bits >> 63 else bits | 1 << 63
    result: bytes = _U64.pack(bits)
    return result


def revision_marker(number: int, count: int, removed: int) -> str:
    """Return a session's revision marker (``SessionRecord.marker``).

    ``number:count`` (the session's number, the events appended to it),
    then ``:removed`` once a truncation removed events.
    """
    if removed:
        return f"{number}:{count}:{removed}"
    return f"{number}:{count}"


def timed_record(timestamp: float, record: bytes) -> bytes:
    """Return a float timestamp as 8 bytes (big-endian IEEE double), then the bytes ``record``."""
    if type(timestamp) is not float:
        raise TypeError(f"timestamp must be a float, not {type(timestamp).__name__}")
    if type(record) is not bytes:
        raise TypeError(f"record must be bytes, not {type(record).__name__}")
    packed: bytes = _F64.pack(timestamp)
    return packed + record


def sized_key(prefix: bytes, text: str, limit: int) -> bytes | None:
    """Return ``prefix``, the UTF-8 size of ``text`` in two bytes, then its UTF-8, or None.

    None for text longer than ``limit`` bytes of UTF-8 (at most 65,535, the
    two bytes' range) and for anything but an exact str (a subclass may
    encode itself another way: the caller encodes it). Text that is not
    encodable as UTF-8 raises UnicodeEncodeError, as ``str.encode`` does.
    """
    if type(prefix) is not bytes:
        raise TypeError(f"prefix must be bytes, not {type(prefix).__name__}")
    if type(limit) is not int or not 0 <= limit <= 0xFFFF:
        raise ValueError(f"limit must be an int in 0 to 65535, not {limit!r}")
    if type(text) is not str:
        return None
    raw = text.encode()
    if len(raw) > limit:
        return None
    return prefix + len(raw).to_bytes(2, "big") + raw


# -- reading records ------------------------------------------------------------------

# The msgpack types by their first byte, past the fixed ranges: the bytes of
# a length field (or element count), the fixed bytes after the type byte,
# and how many objects each counted element is (1 in an array, 2 in a map).
_SIZED: Final = {0xC4: 1, 0xC5: 2, 0xC6: 4, 0xD9: 1, 0xDA: 2, 0xDB: 4}  # bin, str
_EXT: Final = {0xC7: 1, 0xC8: 2, 0xC9: 4}  # ext: length, then a type byte
_FIXED: Final = {
    0xC0: 0, 0xC2: 0, 0xC3: 0,  # nil, false, true
    0xCA: 4, 0xCB: 8,  # floats
    0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8, 0xD0: 1, 0xD1: 2, 0xD2: 4, 0xD3: 8,  # ints
    0xD4: 2, 0xD5: 3, 0xD6: 5, 0xD7: 9, 0xD8: 17,  # fixext: type byte and data
}  # fmt: skip
_COUNTED: Final = {0xDC: (2, 1), 0xDD: (4, 1), 0xDE: (2, 2), 0xDF: (4, 2)}  # arrays, maps


def _skip(data: bytes, at: int, end: int) -> int:
    """Return where the msgpack object at ``data[at:]`` ends; -1 if it does not end by ``end``."""
    pending = 1
    while pending:
        # Every object left takes at least a byte.
        if pending > end - at:
            return -1
        kind = data[at]
        at += 1
        pending -= 1
        if kind <= 0x7F or kind >= 0xE0:  # fixint
            continue
        if kind <= 0x8F:  # fixmap
            pending += 2 * (kind & 0x0F)
        elif kind <= 0x9F:  # fixarray
            pending += kind & 0x0F
        elif kind <= 0xBF:  # fixstr
            at += kind & 0x1F
        elif kind in _FIXED:
            at += _FIXED[kind]
        else:
            width = _SIZED.get(kind) or _EXT.get(kind)
            if width is not None:
                if at + width > end:
                    return -1
                size = int.from_bytes(data[at : at + width], "big")
                at += width + size + (1 if kind in _EXT else 0)
            elif kind in _COUNTED:
                width, each = _COUNTED[kind]
                if at + width > end:
                    return -1
                pending += each * int.from_bytes(data[at : at + width], "big")
                at += width
            else:  # 0xC1, never used
                return -1
        if at > end:
            return -1
    return at


def _array_head(count: int) -> bytes:
    if count < 16:
        return bytes([0x90 | count])
    if count < 0x10000:
        return b"\xdc" + count.to_bytes(2, "big")
    return b"\xdd" + count.to_bytes(4, "big")


def last_values(records: list[bytes], prefix: bytes, key: str) -> bytes | None:
    """Return one msgpack array of the value each record holds under ``key``, or None.

    Each record must be ``prefix``, then one msgpack map whose last entry is
    ``key`` (packed as msgpack packs a str) and its value, and nothing after
    it. The array's items are those values' bytes as stored, so the caller
    decodes them all in one call and decodes nothing else of the records.
    Every object of every record is walked, so each item is exactly one
    msgpack object. None when a record is laid out otherwise (the caller
    then decodes each record whole, which says what is wrong).
    """
    if type(records) is not list:
        raise TypeError(f"records must be a list, not {type(records).__name__}")
    if type(prefix) is not bytes:
        raise TypeError(f"prefix must be bytes, not {type(prefix).__name__}")
    if type(key) is not str:
        raise TypeError(f"key must be a str, not {type(key).__name__}")
    packed_key = pack_plain(key)
    if packed_key is None:
        raise TypeError("key is not plain")  # cannot happen for a str
    values = [_array_head(len(records))]
    for record in records:
        if type(record) is not bytes or not record.startswith(prefix):
            return None
        end = len(record)
        at = len(prefix)
        if at >= end:
            return None
        kind = record[at]
        at += 1
        if 0x80 <= kind <= 0x8F:
            count = kind & 0x0F
        elif kind in (0xDE, 0xDF):
            width = 2 if kind == 0xDE else 4
            count = int.from_bytes(record[at : at + width], "big")
            at += width
            if at > end:
                return None
        else:
            return None
        if count == 0:
            return None
        for _ in range(2 * (count - 1)):  # the entries before the last
            at = _skip(record, at, end)
            if at < 0:
                return None
        if not record.startswith(packed_key, at):
            return None
        at += len(packed_key)
        if at >= end or _skip(record, at, end) != end:
            return None
        values.append(record[at:])
    return b"".join(values)
