"""Behaviour of State (reads and tracked writes) and ReadonlyState."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest

from sessionscope.errors import SessionscopeError, StateValueError
from sessionscope.state import ReadonlyState, State


def test_prefix_constants() -> None:
    assert State.APP_PREFIX == "app:"
    assert State.USER_PREFIX == "user:"
    assert State.TEMP_PREFIX == "temp:"
    assert ReadonlyState.APP_PREFIX == "app:"


# Construction and reads


def test_new_delta_when_none() -> None:
    state = State({"a": 1})
    assert state.delta == {}
    assert not state.has_delta()
    other = State({"a": 1})
    state["b"] = 2
    assert other.delta == {}


def test_value_and_delta_are_used_in_place() -> None:
    value: dict[str, Any] = {"a": 1}
    delta: dict[str, Any] = {}
    state = State(value, delta)
    assert state.value is value
    assert state.delta is delta
    state["b"] = 2
    assert value == {"a": 1, "b": 2}
    assert delta == {"b": 2}


def test_reads_see_delta_over_value() -> None:
    state = State({"a": 1, "b": 2}, {"a": 10, "c": 3})
    assert state["a"] == 10
    assert state.get("a") == 10
    assert state["b"] == 2
    assert state["c"] == 3
    assert state.get("missing") is None
    assert state.get("missing", 5) == 5


def test_get_returns_stored_none_not_default() -> None:
    state = State({"a": None}, {"b": None})
    assert state.get("a", 1) is None
    assert state.get("b", 1) is None


def test_getitem_missing_names_the_key() -> None:
    state = State({"a": 1})
    with pytest.raises(KeyError) as info:
        state["user:nope"]
    assert info.value.args[0] == "user:nope"


def test_has_and_contains() -> None:
    state = State({"a": None}, {"b": 1})
    assert state.has("a")
    assert state.has("b")
    assert not state.has("c")
    assert "a" in state
    assert "b" in state
    assert "c" not in state
    not_a_key: object = 1
    assert not_a_key not in state


def test_to_dict_overlays_delta_on_value() -> None:
    state = State({"a": 1, "b": 2}, {"b": 20, "c": 30})
    merged = state.to_dict()
    assert merged == {"a": 1, "b": 20, "c": 30}
    assert state.all() == merged


def test_to_dict_is_a_new_dict() -> None:
    value: dict[str, Any] = {"a": 1}
    state = State(value)
    merged = state.to_dict()
    merged["x"] = 1
    assert "x" not in state
    assert state.all() is not state.all()
    assert state.to_dict() is not value


# Writes


def test_set_records_into_value_and_delta() -> None:
    state = State({"a": 1})
    assert state.set("a", 2) == 1
    assert state.set("b", 3) is None
    assert state.value == {"a": 2, "b": 3}
    assert state.delta == {"a": 2, "b": 3}
    assert state.has_delta()


def test_set_returns_previous_from_delta() -> None:
    state = State({"a": 1}, {"a": 5})
    assert state.set("a", 6) == 5


def test_setitem_records_into_value_and_delta() -> None:
    state = State({})
    state["user:name"] = "Ada"
    state["temp:x"] = [1]
    assert state.value == {"user:name": "Ada", "temp:x": [1]}
    assert state.delta == {"user:name": "Ada", "temp:x": [1]}


def test_setting_none_is_recorded() -> None:
    state = State({"a": 1})
    state["a"] = None
    assert state.delta == {"a": None}
    assert "a" in state
    assert state["a"] is None


def test_update_records_every_key() -> None:
    state = State({"a": 1, "b": 2})
    state.update({"a": 10, "c": 30, "app:d": 40})
    assert state.value == {"a": 10, "b": 2, "c": 30, "app:d": 40}
    assert state.delta == {"a": 10, "c": 30, "app:d": 40}


def test_update_with_empty_mapping_records_nothing() -> None:
    state = State({"a": 1})
    state.update({})
    assert not state.has_delta()


def test_update_accepts_any_mapping() -> None:
    state = State({})
    state.update(State({"a": 1}, {"b": 2}))
    assert state.delta == {"a": 1, "b": 2}


def test_setdefault() -> None:
    state = State({"a": 1})
    assert state.setdefault("a", 5) == 1
    assert not state.has_delta()
    assert state.setdefault("b", 5) == 5
    assert state.delta == {"b": 5}
    assert state.setdefault("c") is None
    assert state.delta == {"b": 5, "c": None}


def test_values_are_not_validated_here() -> None:
    state = State({})
    marker = object()
    state["x"] = {1, 2}
    state["y"] = marker
    assert state["y"] is marker


def test_delete_removes_from_value_and_delta() -> None:
    state = State({"a": 1, "b": 2}, {})
    state["a"] = 10
    state.delete("a")
    assert "a" not in state
    assert state.value == {"b": 2}
    assert state.delta == {}
    del state["b"]
    assert state.value == {}
    assert len(state) == 0


def test_delete_key_only_in_delta() -> None:
    state = State({}, {"a": 1})
    del state["a"]
    assert state.delta == {}
    assert "a" not in state


def test_delete_missing_names_the_key() -> None:
    state = State({"a": 1})
    with pytest.raises(KeyError) as info:
        state.delete("user:gone")
    assert info.value.args[0] == "user:gone"
    with pytest.raises(KeyError) as info:
        del state["gone"]
    assert info.value.args[0] == "gone"
    assert state.value == {"a": 1}


def test_delete_key_holding_none() -> None:
    state = State({"a": None})
    del state["a"]
    assert "a" not in state


@pytest.mark.parametrize("key", [1, None, b"a", ("a",), 1.5])
def test_non_str_keys_are_rejected(key: Any) -> None:
    state = State({"a": 1})
    writes: list[Callable[[], object]] = [
        lambda: state.set(key, 1),
        lambda: state.__setitem__(key, 1),
        lambda: state.setdefault(key, 1),
        lambda: state.update({key: 1}),
        lambda: state.delete(key),
        lambda: state.__delitem__(key),
    ]
    for write in writes:
        with pytest.raises(StateValueError) as info:
            write()
        assert repr(key) in str(info.value)
        assert isinstance(info.value, TypeError)
        assert isinstance(info.value, SessionscopeError)
    assert state.value == {"a": 1}
    assert state.delta == {}


def test_update_with_a_bad_key_writes_nothing() -> None:
    state = State({"a": 1})
    with pytest.raises(StateValueError):
        state.update({"b": 2, 3: 4})  # type: ignore[dict-item]
    assert state.value == {"a": 1}
    assert state.delta == {}


# Mapping behaviour


def test_is_a_mapping() -> None:
    state = State({"a": 1})
    assert isinstance(state, Mapping)
    assert isinstance(ReadonlyState({}), Mapping)


def test_iteration_and_len_over_merged_view() -> None:
    state = State({"a": 1, "b": 2}, {"b": 20, "c": 30})
    assert list(state) == ["a", "b", "c"]
    assert len(state) == 3
    assert list(state.keys()) == ["a", "b", "c"]
    assert list(state.items()) == [("a", 1), ("b", 20), ("c", 30)]
    assert list(state.values()) == [1, 20, 30]
    assert dict(state) == {"a": 1, "b": 20, "c": 30}


def test_empty_state() -> None:
    state = State({})
    assert len(state) == 0
    assert list(state) == []
    assert state.to_dict() == {}
    assert not state


def test_equality_compares_merged_view() -> None:
    assert State({"a": 1}, {"b": 2}) == {"a": 1, "b": 2}
    assert State({"a": 1}) != {"a": 2}
    assert ReadonlyState({"a": 1}) == State({}, {"a": 1})


def test_repr_shows_value_and_delta() -> None:
    state = State({"a": 1}, {"b": 2})
    assert repr(state) == "State(value={'a': 1}, delta={'b': 2})"
    assert repr(ReadonlyState({"a": 1})) == "ReadonlyState({'a': 1})"


# ReadonlyState


def test_readonly_reads() -> None:
    state = ReadonlyState({"a": 1, "user:n": None})
    assert state["a"] == 1
    assert state.get("a") == 1
    assert state.get("user:n", 5) is None
    assert state.get("b", 5) == 5
    assert state.has("a")
    assert "user:n" in state
    assert "b" not in state
    assert list(state) == ["a", "user:n"]
    assert len(state) == 2
    assert state.to_dict() == {"a": 1, "user:n": None}
    assert state.all() == {"a": 1, "user:n": None}
    with pytest.raises(KeyError) as info:
        state["b"]
    assert info.value.args[0] == "b"


def test_readonly_has_no_delta() -> None:
    state = ReadonlyState({"a": 1})
    assert not hasattr(state, "delta")
    assert not hasattr(state, "has_delta")


def test_readonly_value_cannot_be_written_through() -> None:
    value = {"a": 1}
    state = ReadonlyState(value)
    assert state.value == value
    with pytest.raises(TypeError):
        state.value["a"] = 2  # type: ignore[index]
    assert value == {"a": 1}


def test_readonly_follows_the_wrapped_mapping() -> None:
    live = State({"a": 1})
    view = ReadonlyState(live)
    live["b"] = 2
    assert view["b"] == 2
    assert len(view) == 2


@pytest.mark.parametrize(
    "write",
    [
        pytest.param(lambda s: s.set("a", 2), id="set"),
        pytest.param(lambda s: s.set("new", 2), id="set-new"),
        pytest.param(lambda s: s.__setitem__("a", 2), id="setitem"),
        pytest.param(lambda s: s.setdefault("new", 2), id="setdefault"),
        pytest.param(lambda s: s.update({"a": 2, "b": 3}), id="update"),
        pytest.param(lambda s: s.update({}), id="update-empty"),
        pytest.param(lambda s: s.delete("a"), id="delete"),
        pytest.param(lambda s: s.__delitem__("a"), id="delitem"),
        pytest.param(lambda s: s.delete("missing"), id="delete-missing"),
    ],
)
def test_readonly_rejects_every_write(write: Callable[[ReadonlyState], object]) -> None:
    value: dict[str, Any] = {"a": 1}
    state = ReadonlyState(value)
    with pytest.raises(TypeError, match="state is read-only here"):
        write(state)
    assert value == {"a": 1}
    assert state.to_dict() == {"a": 1}


def test_readonly_rejects_item_assignment_syntax() -> None:
    state = ReadonlyState({"a": 1})
    with pytest.raises(TypeError, match="read-only"):
        state["a"] = 2
    with pytest.raises(TypeError, match="read-only"):
        del state["a"]
    assert state["a"] == 1


def test_readonly_error_names_the_key() -> None:
    state = ReadonlyState({})
    with pytest.raises(TypeError, match="'user:name'"):
        state["user:name"] = "x"
