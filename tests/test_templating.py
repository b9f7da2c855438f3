"""Behaviour of inject_state on instruction templates."""

from __future__ import annotations

from typing import Any

import pytest

from sessionscope.state import ReadonlyState, State
from sessionscope.templating import inject_state


def test_replaces_a_key() -> None:
    assert inject_state("Hello {name}!", {"name": "Ada"}) == "Hello Ada!"


def test_empty_template() -> None:
    assert inject_state("", {"a": 1}) == ""


def test_template_without_placeholders() -> None:
    assert inject_state("plain text", {}) == "plain text"


def test_multiple_keys_and_occurrences() -> None:
    template = "{a} and {b}, {a} again, {a}{a}"
    assert inject_state(template, {"a": "x", "b": "y"}) == "x and y, x again, xx"


def test_non_string_values_use_str() -> None:
    state: dict[str, Any] = {"n": 3, "f": 1.5, "b": True, "l": [1, "a"], "d": {"k": 1}}
    assert inject_state("{n} {f} {b} {l} {d}", state) == "3 1.5 True [1, 'a'] {'k': 1}"


def test_none_renders_empty() -> None:
    assert inject_state("[{a}][{a?}]", {"a": None}) == "[][]"


def test_falsy_values_render() -> None:
    assert inject_state("{a}|{b}|{c}", {"a": 0, "b": False, "c": ""}) == "0|False|"


def test_optional_present() -> None:
    assert inject_state("Hi {name?}.", {"name": "Ada"}) == "Hi Ada."


def test_optional_missing() -> None:
    assert inject_state("Hi {name?}.", {}) == "Hi ."


def test_missing_required_key_is_a_key_error_naming_it() -> None:
    with pytest.raises(KeyError) as info:
        inject_state("Hello {name}", {})
    assert "'name'" in info.value.args[0]
    assert "missing" in info.value.args[0]


def test_missing_prefixed_key_named_with_prefix() -> None:
    with pytest.raises(KeyError) as info:
        inject_state("{user:name}", {"name": "no prefix"})
    assert "'user:name'" in info.value.args[0]


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("{user:name}", "Ada"),
        ("{app:x}", "1"),
        ("{temp:y?}", ""),
        ("{temp:z?}", "z"),
        ("{user:name} {app:x} {temp:y?}", "Ada 1 "),
    ],
)
def test_prefixed_keys(template: str, expected: str) -> None:
    state = {"user:name": "Ada", "app:x": 1, "temp:z": "z"}
    assert inject_state(template, state) == expected


@pytest.mark.parametrize(
    "template",
    [
        "{ not a key }",
        "{ name }",
        "{1abc}",
        "{a-b}",
        "{a b}",
        "{}",
        "{?}",
        "{name??}",
        "{{name}}",
        "{{name}",
        "{name}}",
        "${name}",
        "\\{name}",
        '{"a": 1}',
        '{"name": "x"}',
        "{other:name}",
        "{app:}",
        "{app:1x}",
        "{user:app:name}",
        "{App:name}",
        "{artifact.name}",
        "{artifact.name?}",
        "{name",
        "name}",
        "def f(): return {name: 1 for name in x}",
    ],
)
def test_invalid_braces_are_left_alone(template: str) -> None:
    # Every candidate key is in the state, so a wrong match would show.
    state = {"name": "X", "app:name": "X", "user:name": "X"}
    assert inject_state(template, state) == template


def test_invalid_braces_next_to_valid_ones() -> None:
    template = 'JSON {"k": 1} for {name}, {{literal}} kept'
    assert inject_state(template, {"name": "Ada"}) == 'JSON {"k": 1} for Ada, {{literal}} kept'


def test_unicode_identifier_keys() -> None:
    assert inject_state("{naïve} {名前}", {"naïve": 1, "名前": 2}) == "1 2"


def test_value_braces_are_not_reinjected() -> None:
    assert inject_state("{a}", {"a": "{b}", "b": "no"}) == "{b}"


def test_accepts_state_views() -> None:
    state = State({"user:name": "Ada"}, {"n": 2})
    assert inject_state("{user:name} {n}", state) == "Ada 2"
    assert inject_state("{user:name}", ReadonlyState({"user:name": "Bo"})) == "Bo"
