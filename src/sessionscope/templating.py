"""Fill an agent instruction's ``{key}`` placeholders from session state."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["inject_state"]

# A placeholder is one brace pair around an optional scope prefix, a name and
# an optional '?'. A brace right before it ('{{x}}'), a '$' ('${x}') or a
# backslash ('\{x}') marks text that is not a placeholder, as ADK treats it,
# and so does a second closing brace. The name class is wide on purpose:
# str.isidentifier() has the last word, as \w misses some identifier
# characters (combining marks).
_PLACEHOLDER = re.compile(r"(?<![{$\\])\{((?:app:|user:|temp:)?([^{}\s:?]+))(\?)?\}(?!\})")


def inject_state(template: str, state: Mapping[str, Any]) -> str:
    """Return `template` with each ``{key}`` placeholder replaced from `state`.

    ``{key}`` becomes ``str(state[key])`` and ``{key?}`` the same, or "" when
    the key is missing. A None value renders as "", as ADK 2.13's
    ``inject_session_state`` does. A key is an optional ``app:``, ``user:`` or
    ``temp:`` prefix followed by a Python identifier; braces holding anything
    else (spaces, JSON, ``{1abc}``, ``{{x}}``, ``${x}``) are left as they are.
    ADK's ``{artifact.name}`` placeholders are not state keys and are left
    untouched too: loading artifacts is the caller's business.

    Raise KeyError naming the key when a required key is missing.
    """
    # Most instructions are static: skip the scan when no placeholder can match.
    if "{" not in template:
        return template

    def replace(match: re.Match[str]) -> str:
        key, name, optional = match.group(1, 2, 3)
        if not name.isidentifier():
            return match.group(0)
        if key in state:
            value = state[key]
            return "" if value is None else str(value)
        if optional:
            return ""
        raise KeyError(f"state key {key!r} used by the instruction template is missing")

    return _PLACEHOLDER.sub(replace, template)
