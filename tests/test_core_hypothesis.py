"""Property tests: the compiled core and its twin agree, and routing round-trips."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sessionscope import codec
from sessionscope._speedups import _core_py

try:
    _compiled: ModuleType | None = importlib.import_module("sessionscope._speedups._core")
except ImportError:
    # Same rule as the core_impl fixture: a missing compiled core is an error
    # unless the pure build was asked for.
    if os.environ.get("SESSIONSCOPE_NO_EXTENSIONS", "") in ("", "0"):
        raise
    _compiled = None

needs_compiled = pytest.mark.skipif(
    _compiled is None, reason="compiled core not built (SESSIONSCOPE_NO_EXTENSIONS is set)"
)

SETTINGS = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

PREFIXES = ["app:", "user:", "temp:"]
NEAR_MISSES = ["app", "user", "temp", "App:", "USER:", "tmp:", "ap:", "users:", " app:", "äpp:"]

text = st.text(max_size=8)
keys = st.one_of(
    text,
    st.builds(lambda p, t: p + t, st.sampled_from(PREFIXES + NEAR_MISSES), text),
    st.sampled_from(PREFIXES + NEAR_MISSES + [""]),
)
non_str_keys = st.one_of(st.integers(), st.none(), st.binary(max_size=3), st.tuples(st.integers()))

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False),
    text,
    st.binary(max_size=8),
)
unstorable = st.one_of(
    st.integers(min_value=2**64, max_value=2**70),
    st.integers(max_value=-(2**63) - 1, min_value=-(2**70)),
    st.frozensets(st.integers(), max_size=2),
    st.sets(st.integers(), max_size=2),
    st.complex_numbers(allow_nan=False),
    st.builds(bytearray, st.binary(max_size=3)),
    st.builds(object),
)


def _values(leaves: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.recursive(
        leaves,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4),
            st.lists(inner, max_size=3).map(tuple),
            st.dictionaries(keys, inner, max_size=4),
        ),
        max_leaves=8,
    )


storable_values = _values(scalars)
# Mostly storable, sometimes not, and sometimes with a non-str dict key deep inside.
any_values = _values(st.one_of(scalars, scalars, scalars, unstorable)) | st.dictionaries(
    non_str_keys, scalars, min_size=1, max_size=2
)

deltas = st.dictionaries(keys, storable_values, max_size=10)
any_deltas = st.dictionaries(st.one_of(keys, keys, keys, non_str_keys), any_values, max_size=10)
str_maps = st.dictionaries(text, storable_values, max_size=6)


def _outcome(func: Callable[..., Any], *args: Any) -> tuple[str, Any]:
    try:
        return "ok", func(*args)
    except Exception as exc:
        return type(exc).__name__, str(exc)


def _agree(name: str, *args: Any) -> tuple[str, Any]:
    assert _compiled is not None
    expected = _outcome(getattr(_core_py, name), *args)
    actual = _outcome(getattr(_compiled, name), *args)
    assert actual == expected
    if expected[0] == "ok":
        # Same maps in the same order, not just equal as dicts.
        maps = expected[1] if isinstance(expected[1], tuple) else (expected[1],)
        actual_maps = actual[1] if isinstance(actual[1], tuple) else (actual[1],)
        for got, want in zip(actual_maps, maps, strict=True):
            if isinstance(want, dict):
                assert list(got.items()) == list(want.items())
    return expected


@needs_compiled
@SETTINGS
@given(st.one_of(keys, non_str_keys))
def test_scope_of_agrees(key: Any) -> None:
    _agree("scope_of", key)


@needs_compiled
@SETTINGS
@given(st.one_of(deltas, any_deltas))
def test_partition_agrees(delta: dict[Any, Any]) -> None:
    _agree("partition_by_scope", delta)
    _agree("partition_checked", delta)
    _agree("trim_temp_keys", delta)
    _agree("check_delta", delta)


@needs_compiled
@SETTINGS
@given(any_values, st.sampled_from(["state['x']", "initial['k']", ""]))
def test_check_storable_agrees(value: Any, path: str) -> None:
    _agree("check_storable", value, path)


@needs_compiled
@SETTINGS
@given(
    st.one_of(str_maps, st.dictionaries(non_str_keys, scalars, max_size=2)),
    str_maps,
    st.one_of(str_maps, st.dictionaries(st.one_of(text, non_str_keys), scalars, max_size=3)),
)
def test_merge_agrees(app: dict[Any, Any], user: dict[Any, Any], session: dict[Any, Any]) -> None:
    _agree("merge_scopes", app, user, session)


@needs_compiled
@SETTINGS
@given(str_maps, st.one_of(deltas, any_deltas))
def test_apply_delta_agrees(state: dict[str, Any], delta: dict[Any, Any]) -> None:
    assert _compiled is not None
    py_state, c_state = dict(state), dict(state)
    assert _outcome(_compiled.apply_delta, c_state, delta) == _outcome(
        _core_py.apply_delta, py_state, delta
    )
    assert list(c_state.items()) == list(py_state.items())


@SETTINGS
@given(deltas)
def test_partition_then_merge_round_trips(core_impl: ModuleType, delta: dict[str, Any]) -> None:
    app, user, session, temp = core_impl.partition_checked(delta)
    assert core_impl.merge_scopes(app, user, session) == core_impl.trim_temp_keys(delta)
    assert temp == {k: v for k, v in delta.items() if k.startswith("temp:")}
    assert (app, user, session, temp) == core_impl.partition_by_scope(delta)


@SETTINGS
@given(str_maps, deltas)
def test_apply_partition_equals_update(
    core_impl: ModuleType, state: dict[str, Any], delta: dict[str, Any]
) -> None:
    # Applying each scope's part to that scope's stored map, then merging,
    # gives what a plain dict update of the merged view gives.
    app_state = {"seen": 1}
    user_state: dict[str, Any] = {}
    expected = core_impl.merge_scopes(app_state, user_state, state)
    expected.update(core_impl.trim_temp_keys(delta))

    app, user, session, _temp = core_impl.partition_by_scope(delta)
    core_impl.apply_delta(app_state, app)
    core_impl.apply_delta(user_state, user)
    core_impl.apply_delta(state, session)
    assert core_impl.merge_scopes(app_state, user_state, state) == expected


@SETTINGS
@given(storable_values)
def test_storable_values_pass(core_impl: ModuleType, value: Any) -> None:
    core_impl.check_storable(value, "state['x']")


# Ints at every boundary of msgpack's forms, long text and bytes at its header
# sizes, and nesting around the plain depth limit (64).
_FORM_EDGES = [
    n + d
    for n in (0, 2**5, 2**7, 2**8, 2**15, 2**16, 2**31, 2**32, 2**63, 2**64)
    for d in (-1, 0, 1)
] + [-(n + d) for n in (2**5, 2**7, 2**15, 2**31, 2**63) for d in (-1, 0, 1)]
edge_scalars = st.one_of(
    st.sampled_from(_FORM_EDGES),
    st.floats(),
    st.builds(lambda n, c: c * n, st.sampled_from([31, 32, 255, 256, 65535, 65536]),
              st.sampled_from(["a", "é", "\ud800"])),
    st.builds(lambda n: b"x" * n, st.sampled_from([255, 256, 65535, 65536])),
)  # fmt: skip


def _nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


@needs_compiled
@SETTINGS
@given(st.one_of(any_values, _values(edge_scalars), st.integers(60, 68).map(_nested)))
def test_pack_plain_agrees_and_packs_as_msgpack(value: Any) -> None:
    """Both builds decline the same values, and pack the others to the codec's bytes."""
    kind, packed = _agree("pack_plain", value)
    assert kind == "ok"
    if packed is not None:
        assert packed == codec.pack(value)
        # Plain values are storable: the checked path takes them as they are.
        _core_py.check_storable(value, "v")


def test_pack_plain_declines_what_it_does_not_walk(core_impl: ModuleType) -> None:
    """Unstorable values, subclasses, tuples and deep nesting go to the checked path."""
    declined = [
        2**64,
        -(2**63) - 1,
        "lone \ud800",
        {"k": {1, 2}},
        {1: "int key"},
        {"\ud800": 1},
        (1, 2),
        [1, (2,)],
        _Text("a str subclass"),
        _nested(64),
    ]
    for value in declined:
        assert core_impl.pack_plain(value) is None, value
    assert core_impl.pack_plain(_nested(63)) == codec.pack(_nested(63))


def test_pack_plain_puts_the_prefix_first(core_impl: ModuleType) -> None:
    """The prefix and the packed value in one bytes object; a prefix of another type is refused."""
    value = {"text": "x" * 70_000, "n": [1, 2.5, None]}
    assert core_impl.pack_plain(value, b"\x01") == b"\x01" + codec.pack(value)
    # The buffer a large value grew is not kept: a small value after it packs alone.
    assert core_impl.pack_plain("ok", b"") == codec.pack("ok")
    assert core_impl.pack_plain({1: 2}, b"\x01") is None
    with pytest.raises(TypeError, match="prefix must be bytes"):
        core_impl.pack_plain(1, "x")


class _Text(str):
    pass


# -- pack_event: an event's record packed from its fields ---------------------------

# Field values as callers set them: plain ones, empty text, and values only
# the checked path packs (tuples, a str subclass, unstorable values).
event_fields = st.one_of(
    st.none(),
    st.just(""),
    storable_values,
    any_values,
    st.builds(_Text, text),
)
event_maps = st.one_of(
    st.none(), st.just({}), str_maps, st.dictionaries(keys, any_values, max_size=2)
)


@st.composite
def events(draw: st.DrawFn) -> Any:
    from sessionscope.model import Event, EventActions

    actions = EventActions(
        state_delta=draw(st.one_of(event_maps, st.builds(_Map, str_maps))),
        artifact_delta=draw(event_maps),
        transfer_to_agent=draw(event_fields),
        escalate=draw(st.one_of(st.none(), st.booleans())),
        extra=draw(event_maps),
    )
    return Event(
        author=draw(event_fields),
        content=draw(event_fields),
        id=draw(st.one_of(text, st.just("e1"))),
        timestamp=draw(st.one_of(st.floats(allow_nan=False), st.integers(-5, 5))),
        invocation_id=draw(event_fields),
        turn_complete=draw(st.one_of(st.none(), st.booleans())),
        custom_metadata=draw(event_maps),
        long_running_tool_ids=draw(st.one_of(st.none(), st.lists(text, max_size=2))),
        actions=actions,
        extra=draw(event_maps),
    )


def _pack_event(core: ModuleType, event: Any) -> bytes | None:
    from sessionscope.service import _append

    packed: bytes | None = core.pack_event(
        event, _append._EVENT_FIELDS, _append._ACTION_FIELDS, b"\x01"
    )
    return packed


@needs_compiled
@SETTINGS
@given(events())
def test_pack_event_agrees_and_packs_the_checked_record(event: Any) -> None:
    """Both builds decline the same events, and pack the others to their checked record's bytes."""
    from sessionscope.service import _append

    assert _compiled is not None
    expected = _outcome(_pack_event, _core_py, event)
    assert _outcome(_pack_event, _compiled, event) == expected
    kind, packed = expected
    assert kind == "ok"
    if packed is not None:
        assert packed == b"\x01" + codec.pack(_append.event_to_record(event))


def test_pack_event_leaves_what_it_does_not_walk_to_the_caller(core_impl: ModuleType) -> None:
    """A field of another type, a delta that is not a dict or a value not plain gives None."""
    from sessionscope.model import Event, EventActions

    plain = Event(author="a", id="e1", timestamp=1.0, content={"parts": [{"text": "hé"}]})
    assert _pack_event(core_impl, plain) == b"\x01" + codec.pack(
        {"id": "e1", "timestamp": 1.0, "author": "a", "content": {"parts": [{"text": "hé"}]}}
    )
    declined = [
        Event(author=_Text("a str subclass"), id="e1", timestamp=1.0),
        Event(content=(1, 2), id="e1", timestamp=1.0),
        Event(content={"k": {1}}, id="e1", timestamp=1.0),
        Event(author="lone \ud800", id="e1", timestamp=1.0),
        Event(id="e1", timestamp=1.0, actions=EventActions(state_delta=_Map({"k": 1}))),
        Event(id="e1", timestamp=1.0, actions=EventActions(escalate=(True,))),  # type: ignore[arg-type]
        Event(id="e1", timestamp=1.0, extra={"k": 2**64}),
        Event(id=("e", 1), timestamp=1.0),  # type: ignore[arg-type]
    ]
    for event in declined:
        assert _pack_event(core_impl, event) is None, event
    # Empty text and maps are left out, as the record leaves them out.
    empty = Event(author="", id="e1", timestamp=2, actions=EventActions(state_delta={}), extra={})
    assert _pack_event(core_impl, empty) == b"\x01" + codec.pack({"id": "e1", "timestamp": 2})
    with pytest.raises(TypeError, match="prefix must be bytes"):
        core_impl.pack_event(plain, (), (), "x")
    with pytest.raises(TypeError, match="must be tuples"):
        core_impl.pack_event(plain, ["author"], (), b"")


class _Map(dict):  # type: ignore[type-arg]
    pass


def test_pack_event_reads_what_getattr_reads(core_impl: ModuleType) -> None:
    """Slots read directly give what getattr gives: subclasses, changed classes, empty slots."""
    from dataclasses import dataclass, field

    from sessionscope.model import Event, EventActions

    def record_of(event: Any) -> bytes | None:
        return core_impl.pack_event(event, ("author",), (), b"")  # type: ignore[no-any-return]

    def packed(**record: Any) -> bytes:
        return codec.pack(record)

    @dataclass(slots=True)
    class Slotted:
        id: str = "e1"
        timestamp: float = 1.0
        author: str = "slot"
        actions: EventActions = field(default_factory=EventActions)
        extra: dict[str, Any] = field(default_factory=dict)

    class Renamed(Event):
        """A subclass that reads ``author`` through a property, not the slot."""

        __slots__ = ()
        author = property(lambda self: "property", lambda self, value: None)  # type: ignore[assignment]

    assert record_of(Slotted()) == packed(id="e1", timestamp=1.0, author="slot")
    assert record_of(Event(author="plain", id="e1", timestamp=1.0)) == packed(
        id="e1", timestamp=1.0, author="plain"
    )
    assert record_of(Renamed(author="slot", id="e1", timestamp=1.0)) == packed(
        id="e1", timestamp=1.0, author="property"
    )
    # A class changed after its slots were read: the change is seen at once.
    made = Slotted()
    kept = Slotted.author
    Slotted.author = property(lambda self: "changed")  # type: ignore[assignment, method-assign]
    try:
        assert record_of(made) == packed(id="e1", timestamp=1.0, author="changed")
    finally:
        Slotted.author = kept  # type: ignore[method-assign]
    assert record_of(made) == packed(id="e1", timestamp=1.0, author="slot")
    # An empty slot raises as getattr does.
    empty = Slotted()
    del empty.author
    with pytest.raises(AttributeError):
        record_of(empty)
    # An object without slots, and the same fields named by another tuple.
    plain = type("Plain", (), {})()
    for name, value in {"id": "e2", "timestamp": 2.0, "author": "dict", "extra": {}}.items():
        setattr(plain, name, value)
    plain.actions = EventActions()  # type: ignore[attr-defined]
    assert record_of(plain) == packed(id="e2", timestamp=2.0, author="dict")
    assert core_impl.pack_event(Slotted(), (), (), b"") == packed(id="e1", timestamp=1.0)
    assert record_of(Slotted()) == packed(id="e1", timestamp=1.0, author="slot")


# -- store key and value bytes --------------------------------------------------------


@needs_compiled
@SETTINGS
@given(
    st.one_of(st.floats(), st.integers(-3, 3), st.none()),
    st.one_of(st.binary(max_size=40), st.text(max_size=2)),
)
def test_timed_record_agrees_and_puts_the_time_first(timestamp: Any, record: Any) -> None:
    """Both builds refuse the same arguments and give the same bytes: the time, then the record."""
    import struct

    kind, stamped = _agree("timed_record", timestamp, record)
    if kind == "ok":
        assert stamped == struct.pack(">d", timestamp) + record
    else:
        assert type(timestamp) is not float or type(record) is not bytes


@needs_compiled
@SETTINGS
@given(
    st.one_of(st.floats(), st.integers(-(2**64), 2**64), st.booleans(), st.none(), st.text()),
    st.floats(allow_nan=False),
)
def test_sortable_time_agrees_and_sorts_as_the_floats(timestamp: Any, other: float) -> None:
    """Both builds give the same 8 bytes, or the same error; bytes sort as the numbers do."""
    kind, key = _agree("sortable_time", timestamp)
    if kind != "ok":
        assert not isinstance(timestamp, int | float)
        return
    assert len(key) == 8
    number = timestamp + 0.0
    if number == number:  # not NaN
        other_key = _core_py.sortable_time(other)
        assert (key < other_key) == (number < other) and (key == other_key) == (number == other)


@needs_compiled
@SETTINGS
@given(
    st.one_of(st.integers(-(2**70), 2**70), st.booleans(), st.floats(), st.text(max_size=3)),
    st.one_of(st.integers(-(2**70), 2**70), st.booleans()),
    st.one_of(st.integers(-(2**70), 2**70), st.booleans(), st.none()),
)
def test_revision_marker_agrees(number: Any, count: Any, removed: Any) -> None:
    """Both builds give the same text for any values, in and out of the 64-bit range."""
    _agree("revision_marker", number, count, removed)


def test_revision_marker_counts_removals_once_there_are_any(core_impl: ModuleType) -> None:
    assert core_impl.revision_marker(7, 0, 0) == "7:0"
    assert core_impl.revision_marker(12, 40, 0) == "12:40"
    assert core_impl.revision_marker(12, 40, 3) == "12:40:3"
    top = 2**63 - 1
    assert core_impl.revision_marker(top, top, top) == f"{top}:{top}:{top}"
    assert core_impl.revision_marker(2**64, 1, 0) == f"{2**64}:1"


def test_sortable_time_keeps_the_zeros_and_the_extremes_in_order(core_impl: ModuleType) -> None:
    ordered = [float("-inf"), -1e308, -1.0, -5e-324, 0.0, 5e-324, 1.0, 1767225600.5, float("inf")]
    keys = [core_impl.sortable_time(number) for number in ordered]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    assert core_impl.sortable_time(-0.0) == core_impl.sortable_time(0.0) == b"\x80" + bytes(7)
    assert core_impl.sortable_time(2) == core_impl.sortable_time(2.0)
    with pytest.raises(OverflowError):
        core_impl.sortable_time(10**400)


@needs_compiled
@SETTINGS
@given(
    st.binary(max_size=12),
    st.one_of(st.text(max_size=160), st.just("é" * 80), st.just("lone \ud800"), st.builds(_Text)),
    st.sampled_from([0, 3, 150, 65535]),
)
def test_sized_key_agrees_and_is_the_stores_key_part(prefix: bytes, text: str, limit: int) -> None:
    """Both builds give the prefix and the store's key part of short text, None past the limit."""
    from sessionscope.stores.lmdb.layout import unique_part

    kind, key = _agree("sized_key", prefix, text, limit)
    if type(text) is not str:
        assert (kind, key) == ("ok", None)
    elif kind == "UnicodeEncodeError":
        with pytest.raises(UnicodeEncodeError):
            text.encode()
    elif len(text.encode()) > limit:
        assert key is None
    else:
        assert key == prefix + len(text.encode()).to_bytes(2, "big") + text.encode()
        if limit == 150:
            assert key == prefix + unique_part(text)


def test_key_and_value_helpers_refuse_other_types(core_impl: ModuleType) -> None:
    """A time that is not a float, a record or prefix that is not bytes, a limit out of range."""
    with pytest.raises(TypeError, match="timestamp must be a float"):
        core_impl.timed_record(1, b"")
    with pytest.raises(TypeError, match="record must be bytes"):
        core_impl.timed_record(1.0, bytearray(b"x"))
    with pytest.raises(TypeError, match="prefix must be bytes"):
        core_impl.sized_key("p", "x", 10)
    for limit in (-1, 65536, 1.0, True):
        with pytest.raises(ValueError, match="limit must be an int"):
            core_impl.sized_key(b"p", "x", limit)
    assert core_impl.timed_record(-0.0, b"r") == b"\x80" + bytes(7) + b"r"
    assert core_impl.sized_key(b"p", "", 0) == b"p\x00\x00"


# -- last_values: the value under a record map's last key, without decoding the rest ----

record_maps = st.dictionaries(st.text(max_size=6), storable_values, max_size=5)


def _record(prefix: bytes, fields: dict[str, Any], key: str, value: Any) -> bytes:
    """Return ``prefix`` and a packed map of ``fields`` whose last entry is ``key``."""
    fields = {name: field for name, field in fields.items() if name != key}
    fields[key] = value
    return prefix + codec.pack(fields)


@needs_compiled
@SETTINGS
@given(
    st.lists(st.tuples(record_maps, storable_values), max_size=20),
    st.binary(max_size=2),
    st.sampled_from(["content", "", "é" * 20, "k" * 40]),
)
def test_last_values_agrees_and_holds_each_records_last_value(
    maps: list[tuple[dict[str, Any], Any]], prefix: bytes, key: str
) -> None:
    """One msgpack array of each record's value under its last key, bytes as stored."""
    records = [_record(prefix, fields, key, value) for fields, value in maps]
    kind, gathered = _agree("last_values", records, prefix, key)
    assert kind == "ok" and gathered is not None
    expected = [codec.unpack(record[len(prefix) :])[key] for record in records]
    assert codec.unpack(gathered) == expected
    # The items are the stored bytes: nothing was decoded and packed again.
    assert gathered.endswith(b"".join(codec.pack(value) for value in expected))


@needs_compiled
@SETTINGS
@given(
    st.lists(st.tuples(record_maps, storable_values), min_size=1, max_size=4),
    st.data(),
)
def test_last_values_agrees_on_damage_and_never_misframes(
    maps: list[tuple[dict[str, Any], Any]], data: st.DataObject
) -> None:
    """Cut, extended or altered records: None, or an array of exactly one object per record."""
    records = [_record(b"\x01", fields, "content", value) for fields, value in maps]
    index = data.draw(st.integers(0, len(records) - 1))
    record = records[index]
    damage = data.draw(st.sampled_from(["cut", "extend", "flip", "other key last"]))
    if damage == "cut":
        record = record[: data.draw(st.integers(0, len(record) - 1))]
    elif damage == "extend":
        record += data.draw(st.binary(min_size=1, max_size=4))
    elif damage == "flip":
        at = data.draw(st.integers(0, len(record) - 1))
        record = record[:at] + bytes([data.draw(st.integers(0, 255))]) + record[at + 1 :]
    else:
        record = b"\x01" + codec.pack({"content": 1, "id": "x"})
    records[index] = record
    kind, gathered = _agree("last_values", records, b"\x01", "content")
    assert kind == "ok"
    if damage in ("cut", "extend", "other key last"):
        assert gathered is None
    if gathered is not None:
        # Exactly one whole object per record: unpacking consumes it all.
        items = codec.unpack(gathered) if _decodes(gathered) else None
        if items is not None:
            assert len(items) == len(records)


def _decodes(data: bytes) -> bool:
    import msgpack

    try:
        codec.unpack(data)
    except msgpack.ExtraData:  # an object left over: the array was misframed
        raise
    except (ValueError, TypeError):  # invalid UTF-8, a non-str key: not a framing error
        return False
    return True


def test_last_values_refuses_other_types_and_reads_every_msgpack_type(
    core_impl: ModuleType,
) -> None:
    """Wrong argument types are TypeErrors; ext, 16- and 32-bit sizes are walked like the rest."""
    import struct

    import msgpack

    with pytest.raises(TypeError, match="records must be a list"):
        core_impl.last_values((b"",), b"", "k")
    with pytest.raises(TypeError, match="prefix must be bytes"):
        core_impl.last_values([], "", "k")
    with pytest.raises(TypeError, match="key must be a str"):
        core_impl.last_values([], b"", b"k")
    assert core_impl.last_values([], b"", "k") == b"\x90"
    assert core_impl.last_values([bytearray(b"\x81\xa1k\x01")], b"", "k") is None
    assert core_impl.last_values([b"\x80"], b"", "k") is None  # an empty map
    assert core_impl.last_values([b"\x92\xa1k\x01"], b"", "k") is None  # not a map
    # Every msgpack type before the last key, each size class of each.
    before = [
        *(msgpack.ExtType(5, b"x" * n) for n in (100, 300, 70_000)),  # ext 8, 16, 32
        *(msgpack.ExtType(1, b"y" * n) for n in (1, 2, 4, 8, 16)),  # fixext
        *("s" * n for n in (5, 40, 300, 70_000)),  # fixstr, str 8, 16, 32
        *(b"b" * n for n in (10, 300, 70_000)),  # bin 8, 16, 32
        list(range(3)), list(range(20)), list(range(70_000)),  # fixarray, array 16, 32
        {"a": 1}, {str(n): n for n in range(20)}, {str(n): n for n in range(70_000)},
        1.5, 5, -5, 200, -100, 300, -300, 70_000, -70_000, 2**40, -(2**40), 2**64 - 1,
        True, False, None,
    ]  # fmt: skip
    entries = [(msgpack.packb(f"f{n}"), msgpack.packb(v)) for n, v in enumerate(before)]
    entries.append((msgpack.packb("f32"), b"\xca" + struct.pack(">f", 0.25)))  # float 32
    value = {"nested": [list(range(70_000))]}
    body = b"".join(k + v for k, v in entries) + msgpack.packb("k") + msgpack.packb(value)
    count = len(entries) + 1
    for head in (b"\xde" + count.to_bytes(2, "big"), b"\xdf" + count.to_bytes(4, "big")):
        record = b"\x01" + head + body  # map 16 and map 32
        gathered = core_impl.last_values([record] * 17, b"\x01", "k")
        assert gathered is not None and gathered[:3] == b"\xdc\x00\x11"
        assert msgpack.unpackb(gathered) == [value] * 17
    small = b"\x82" + msgpack.packb("a") + b"\x01" + msgpack.packb("k") + b"\x02"
    assert msgpack.unpackb(core_impl.last_values([small], b"", "k")) == [2]
    never_used = small.replace(b"\x01", b"\xc1")  # 0xc1 is no msgpack type
    assert core_impl.last_values([never_used], b"", "k") is None
    assert core_impl.last_values([small[:-1] + b"\xc1"], b"", "k") is None
