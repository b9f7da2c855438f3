"""The scope core: prefixes, routing, merging and storable values, on both implementations."""

from __future__ import annotations

import enum
from collections import OrderedDict
from types import ModuleType
from typing import Any

import pytest

from sessionscope._speedups._core_py import Scope
from sessionscope.errors import StateValueError


class Color(enum.IntEnum):
    RED = 1


class Name(str, enum.Enum):
    ALICE = "alice"


class MyList(list[Any]):
    pass


class MyDict(dict[str, Any]):
    pass


def test_prefixes(core_impl: ModuleType) -> None:
    assert core_impl.APP_PREFIX == core_impl.KEY_PREFIX_APP == "app:"
    assert core_impl.USER_PREFIX == core_impl.KEY_PREFIX_USER == "user:"
    assert core_impl.TEMP_PREFIX == core_impl.KEY_PREFIX_TEMP == "temp:"
    assert core_impl.MAX_DEPTH == 512


def test_scope_enum_is_shared(core_impl: ModuleType) -> None:
    assert core_impl.Scope is Scope
    assert [(s.name, s.value) for s in Scope] == [
        ("APP", "app"),
        ("USER", "user"),
        ("SESSION", "session"),
        ("TEMP", "temp"),
    ]


@pytest.mark.parametrize(
    ("key", "scope"),
    [
        ("app:theme", Scope.APP),
        ("app:", Scope.APP),
        ("app:app:x", Scope.APP),
        ("user:name", Scope.USER),
        ("user:", Scope.USER),
        ("temp:scratch", Scope.TEMP),
        ("temp:", Scope.TEMP),
        ("cart", Scope.SESSION),
        ("", Scope.SESSION),
        ("app", Scope.SESSION),
        ("user", Scope.SESSION),
        ("temp", Scope.SESSION),
        ("App:x", Scope.SESSION),
        ("USER:x", Scope.SESSION),
        ("Temp:x", Scope.SESSION),
        ("ap:x", Scope.SESSION),
        ("usr:x", Scope.SESSION),
        ("tmp:x", Scope.SESSION),
        (" app:x", Scope.SESSION),
        ("x:app:y", Scope.SESSION),
        ("app;x", Scope.SESSION),
        ("äpp:x", Scope.SESSION),
        ("app:ünïcødé", Scope.APP),
        ("user:😀", Scope.USER),
        ("😀", Scope.SESSION),
    ],
)
def test_scope_of(core_impl: ModuleType, key: str, scope: Scope) -> None:
    assert core_impl.scope_of(key) is scope
    assert core_impl.Scope.of(key) is scope


def test_scope_of_str_subclass(core_impl: ModuleType) -> None:
    class Key(str):
        pass

    assert core_impl.scope_of(Key("user:x")) is Scope.USER


@pytest.mark.parametrize("key", [3, None, b"app:x", ("app:", "x"), 1.5])
def test_scope_of_non_str_key(core_impl: ModuleType, key: object) -> None:
    with pytest.raises(StateValueError, match=r"state key .* is not a str") as info:
        core_impl.scope_of(key)
    assert isinstance(info.value, TypeError)
    assert repr(key) in str(info.value)


def test_scope_of_via_enum_rejects_non_str(core_impl: ModuleType) -> None:
    with pytest.raises(TypeError):
        core_impl.Scope.of(7)


DELTA = {
    "s1": 1,
    "app:a1": "x",
    "temp:t1": {1, 2},
    "user:u1": [1],
    "s2": None,
    "app:a2": {"k": 1},
    "user:u2": 2.5,
    "temp:t2": object,
    "app": "session key",
}


def test_partition_by_scope(core_impl: ModuleType) -> None:
    app, user, session, temp = core_impl.partition_by_scope(DELTA)
    assert list(app.items()) == [("a1", "x"), ("a2", {"k": 1})]
    assert list(user.items()) == [("u1", [1]), ("u2", 2.5)]
    assert list(session.items()) == [("s1", 1), ("s2", None), ("app", "session key")]
    assert list(temp.items()) == [("temp:t1", {1, 2}), ("temp:t2", object)]
    # Values are shared, not copied; the keys of app and user are plain str.
    assert app["a2"] is DELTA["app:a2"]
    assert all(type(k) is str for k in [*app, *user])


def test_partition_returns_new_dicts(core_impl: ModuleType) -> None:
    delta = {"s": 1}
    parts = core_impl.partition_by_scope(delta)
    assert type(parts) is tuple
    assert len(parts) == 4
    assert all(type(p) is dict for p in parts)
    assert parts[2] is not delta
    assert core_impl.partition_by_scope({}) == ({}, {}, {}, {})


def test_partition_of_a_mapping_subclass(core_impl: ModuleType) -> None:
    delta = OrderedDict([("user:b", 2), ("app:a", 1), ("c", 3)])
    assert core_impl.partition_by_scope(delta) == ({"a": 1}, {"b": 2}, {"c": 3}, {})


def test_partition_empty_suffix(core_impl: ModuleType) -> None:
    assert core_impl.partition_by_scope({"app:": 1, "user:": 2}) == ({"": 1}, {"": 2}, {}, {})


@pytest.mark.parametrize(
    "name", ["partition_by_scope", "partition_checked", "trim_temp_keys", "check_delta"]
)
def test_non_str_delta_key(core_impl: ModuleType, name: str) -> None:
    with pytest.raises(StateValueError, match=r"^state key 3 is not a str$") as info:
        getattr(core_impl, name)({"a": 1, 3: "x"})
    assert isinstance(info.value, TypeError)


def test_trim_temp_keys(core_impl: ModuleType) -> None:
    trimmed = core_impl.trim_temp_keys(DELTA)
    assert list(trimmed) == ["s1", "app:a1", "user:u1", "s2", "app:a2", "user:u2", "app"]
    assert trimmed is not DELTA
    assert "temp:t1" in DELTA


def test_merge_scopes_order(core_impl: ModuleType) -> None:
    app = {"a1": 1, "a2": 2}
    user = {"u1": 3}
    session = {"s1": 4, "s2": 5}
    merged = core_impl.merge_scopes(app, user, session)
    assert list(merged.items()) == [
        ("s1", 4),
        ("s2", 5),
        ("app:a1", 1),
        ("app:a2", 2),
        ("user:u1", 3),
    ]
    assert merged is not session
    assert session == {"s1": 4, "s2": 5}


def test_merge_scopes_of_mappings(core_impl: ModuleType) -> None:
    merged = core_impl.merge_scopes(MyDict(a=1), OrderedDict(u=2), MyDict(s=3))
    assert type(merged) is dict
    assert merged == {"s": 3, "app:a": 1, "user:u": 2}


@pytest.mark.parametrize(
    ("args", "label"),
    [
        (({1: 1}, {}, {}), "app state"),
        (({}, {1: 1}, {}), "user state"),
        (({}, {}, {1: 1}), "session state"),
    ],
)
def test_merge_scopes_non_str_key(core_impl: ModuleType, args: tuple[Any, ...], label: str) -> None:
    with pytest.raises(StateValueError, match=rf"^{label} key 1 is not a str$"):
        core_impl.merge_scopes(*args)


def test_apply_delta_in_place(core_impl: ModuleType) -> None:
    state = {"a": 1, "b": 2}
    result = core_impl.apply_delta(state, {"b": None, "c": 3, "a": 4})
    assert result is None
    assert list(state.items()) == [("a", 4), ("b", None), ("c", 3)]


def test_apply_delta_to_a_mapping(core_impl: ModuleType) -> None:
    seen: list[tuple[str, object]] = []

    class Recording(dict[str, Any]):
        def __setitem__(self, key: str, value: object) -> None:
            seen.append((key, value))
            super().__setitem__(key, value)

    state = Recording()
    core_impl.apply_delta(state, {"x": 1, "y": None})
    assert seen == [("x", 1), ("y", None)]
    assert state == {"x": 1, "y": None}


def test_apply_delta_bad_key_leaves_state_untouched(core_impl: ModuleType) -> None:
    state = {"a": 1}
    with pytest.raises(StateValueError, match=r"^state key None is not a str$"):
        core_impl.apply_delta(state, {"b": 2, None: 3})
    assert state == {"a": 1}


STORABLE: list[object] = [
    None,
    True,
    False,
    0,
    -(2**63),
    2**64 - 1,
    2**63,
    1.5,
    float("inf"),
    "",
    "ünï",
    b"\x00bytes",
    [],
    (),
    {},
    [1, "a", None, [2.0, {"k": (b"v", True)}]],
    (1, [2, (3,)]),
    {"a": {"b": {"c": [1, {"d": None}]}}},
    Color.RED,
    Name.ALICE,
    MyList([1, MyDict(x=2)]),
    OrderedDict(a=1),
]


@pytest.mark.parametrize("value", STORABLE, ids=repr)
def test_check_storable_accepts(core_impl: ModuleType, value: object) -> None:
    core_impl.check_storable(value, "state['x']")
    core_impl.check_storable({"nested": [value]}, "state['x']")
    core_impl.check_delta({"x": value})


def _nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


def test_check_storable_depth_limit(core_impl: ModuleType) -> None:
    core_impl.check_storable(_nested(512), "v")
    with pytest.raises(StateValueError, match=r"list is nested too deeply"):
        core_impl.check_storable(_nested(513), "v")


class Opaque:
    pass


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({1, 2}, "state['cart']: set is not storable"),
        (frozenset(), "state['cart']: frozenset is not storable"),
        (Opaque(), "state['cart']: Opaque is not storable"),
        (object(), "state['cart']: object is not storable"),
        (1j, "state['cart']: complex is not storable"),
        (bytearray(b"x"), "state['cart']: bytearray is not storable"),
        (memoryview(b"x"), "state['cart']: memoryview is not storable"),
        (Opaque, "state['cart']: type is not storable"),
        (2**64, "state['cart']: int 18446744073709551616 is out of the 64-bit range"),
        (-(2**63) - 1, "state['cart']: int -9223372036854775809 is out of the 64-bit range"),
        ([1, 2, {3}], "state['cart'][2]: set is not storable"),
        ((0, (1, {2})), "state['cart'][1][1]: set is not storable"),
        ({"a": 2**64}, "state['cart']['a']: int 18446744073709551616 is out of the 64-bit range"),
        ({"m": {3: 1}}, "state['cart']['m']: dict key 3 is not a str"),
        ({b"k": 1}, "state['cart']: dict key b'k' is not a str"),
        (
            {"ok": 1, "x": [None, {"it's": frozenset()}]},
            "state['cart']['x'][1][\"it's\"]: frozenset is not storable",
        ),
        (MyList([1, {2}]), "state['cart'][1]: set is not storable"),
        (MyDict(a={1}), "state['cart']['a']: set is not storable"),
        ("x\ud800", "state['cart']: str holds a lone surrogate: it is not storable as UTF-8"),
        (
            ["ok", "é", "\U0001f600\udc00"],
            "state['cart'][2]: str holds a lone surrogate: it is not storable as UTF-8",
        ),
        (
            {"k\udfff": 1},
            "state['cart']: dict key 'k\\udfff' holds a lone surrogate: "
            "it is not storable as UTF-8",
        ),
    ],
)
def test_check_storable_rejects(core_impl: ModuleType, value: object, message: str) -> None:
    with pytest.raises(StateValueError) as info:
        core_impl.check_storable(value, "state['cart']")
    assert str(info.value) == message
    assert isinstance(info.value, TypeError)


@pytest.mark.parametrize("text", ["plain", "héllo", "ключ", "名前", "\U0001f600", ""])
def test_text_of_any_script_is_storable(core_impl: ModuleType, text: str) -> None:
    core_impl.check_storable({text: [text]}, "v")
    assert core_impl.partition_checked({text or "k": text})[2] == {text or "k": text}


def test_a_state_key_with_a_lone_surrogate_is_refused(core_impl: ModuleType) -> None:
    for check in (core_impl.partition_checked, core_impl.check_delta):
        with pytest.raises(StateValueError, match=r"^state key 'app:k\\ud800' holds a lone"):
            check({"ok": 1, "app:k\ud800": 1})
    # Temp keys and values are never stored, so they are not checked.
    assert core_impl.partition_checked({"temp:\ud800": "\udc00"})[3] == {"temp:\ud800": "\udc00"}


def test_check_storable_reports_the_first_problem(core_impl: ModuleType) -> None:
    with pytest.raises(StateValueError, match=r"^p\[0\]: set is not storable$"):
        core_impl.check_storable([{1}, {2: 3}], "p")


def test_check_storable_self_reference(core_impl: ModuleType) -> None:
    loop: list[object] = [1]
    loop.append(loop)
    with pytest.raises(StateValueError) as info:
        core_impl.check_storable(loop, "state['x']")
    assert (
        str(info.value)
        == "state['x']" + "[1]" * 512 + ": list is nested too deeply (over 512 levels)"
    )

    cycle: dict[str, object] = {}
    cycle["self"] = cycle
    with pytest.raises(
        StateValueError, match=r"^state\['y'\]\['self'\]\['self'\].*: dict is nested too deeply"
    ):
        core_impl.check_storable(cycle, "state['y']")


def test_check_delta(core_impl: ModuleType) -> None:
    core_impl.check_delta({"a": 1, "app:b": [1], "temp:c": None})
    with pytest.raises(StateValueError, match=r"^state\['cart'\]\[2\]: set is not storable$"):
        core_impl.check_delta({"a": 1, "cart": [1, 2, {3}]})
    # check_delta checks temp values too: the caller asked for them to be checked.
    with pytest.raises(StateValueError, match=r"^state\['temp:t'\]: set is not storable$"):
        core_impl.check_delta({"temp:t": {1}})


def test_check_delta_root(core_impl: ModuleType) -> None:
    with pytest.raises(StateValueError, match=r"^initial\['x'\]: set is not storable$"):
        core_impl.check_delta({"x": set()}, "initial")
    with pytest.raises(StateValueError, match=r"^initial key 1 is not a str$"):
        core_impl.check_delta({1: 1}, root="initial")


def test_partition_checked(core_impl: ModuleType) -> None:
    delta = {k: v for k, v in DELTA.items() if not k.startswith("temp:") or k == "temp:t1"}
    app, user, session, temp = core_impl.partition_checked(delta)
    assert (app, user, session, temp) == core_impl.partition_by_scope(delta)
    assert list(session) == ["s1", "s2", "app"]
    assert temp == {"temp:t1": {1, 2}}


def test_partition_checked_does_not_check_temp_values(core_impl: ModuleType) -> None:
    unstorable = object()
    assert core_impl.partition_checked({"temp:x": unstorable, "temp:y": {1}}) == (
        {},
        {},
        {},
        {"temp:x": unstorable, "temp:y": {1}},
    )


@pytest.mark.parametrize(
    ("delta", "message"),
    [
        ({"a": 1, "b": {1}}, "state['b']: set is not storable"),
        ({"app:a": [1, {2}], "b": 1}, "state['app:a'][1]: set is not storable"),
        (
            {"s": 1, "user:u": {"k": 2**70}},
            "state['user:u']['k']: int 1180591620717411303424 is out of the 64-bit range",
        ),
        ({"s": 1, "user:u": {1: 1}}, "state['user:u']: dict key 1 is not a str"),
        ({"temp:x": {1}, "x": 1, 5: 1}, "state key 5 is not a str"),
    ],
)
def test_partition_checked_raises(
    core_impl: ModuleType, delta: dict[Any, Any], message: str
) -> None:
    with pytest.raises(StateValueError) as info:
        core_impl.partition_checked(delta)
    assert str(info.value) == message


def test_partition_checked_of_a_mapping_subclass(core_impl: ModuleType) -> None:
    assert core_impl.partition_checked(MyDict({"app:a": 1, "b": 2})) == ({"a": 1}, {}, {"b": 2}, {})
    with pytest.raises(StateValueError, match=r"^state\['b'\]: set is not storable$"):
        core_impl.partition_checked(MyDict({"app:a": 1, "b": {2}}))
