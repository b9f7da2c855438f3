"""Route state keys by scope and validate storable values: the compiled core or its twin.

The implementation is picked once, at import. ``SESSIONSCOPE_NO_EXTENSIONS``
set to anything but ``""`` or ``"0"`` selects the pure-Python twin, as does any
interpreter other than CPython. Otherwise the compiled ``sessionscope._core``
is used, falling back to the twin when it is not built, unless
``SESSIONSCOPE_REQUIRE_EXTENSIONS`` is set, which makes a missing compiled core
an ImportError (so a CI job meant to test the compiled core cannot silently
test the twin). ``IMPLEMENTATION`` says which one was picked: ``"c"`` or ``"py"``.
"""

from __future__ import annotations

import os
import platform
from types import ModuleType
from typing import TYPE_CHECKING, Literal

__all__ = [
    "APP_PREFIX",
    "IMPLEMENTATION",
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
    "merge_scopes",
    "partition_by_scope",
    "partition_checked",
    "scope_of",
    "trim_temp_keys",
]


def _flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


NO_EXTENSIONS = _flag("SESSIONSCOPE_NO_EXTENSIONS") or platform.python_implementation() != "CPython"
REQUIRE_EXTENSIONS = _flag("SESSIONSCOPE_REQUIRE_EXTENSIONS")


def _load() -> ModuleType:
    if NO_EXTENSIONS:
        from sessionscope import _core_py

        return _core_py
    try:
        from sessionscope import _core
    except ImportError as exc:
        if REQUIRE_EXTENSIONS:
            raise ImportError(
                "SESSIONSCOPE_REQUIRE_EXTENSIONS is set but the compiled core "
                f"sessionscope._core cannot be imported ({exc}); reinstall sessionscope "
                "with a C compiler available, or unset SESSIONSCOPE_REQUIRE_EXTENSIONS "
                "to fall back to the pure-Python core"
            ) from exc
        from sessionscope import _core_py

        return _core_py
    return _core


if TYPE_CHECKING:
    # The twin is the type source; the compiled core has the same signatures.
    from sessionscope import _core_py as _impl
else:
    _impl = _load()

IMPLEMENTATION: Literal["c", "py"] = "c" if _impl.__name__ == "sessionscope._core" else "py"

APP_PREFIX = _impl.APP_PREFIX
USER_PREFIX = _impl.USER_PREFIX
TEMP_PREFIX = _impl.TEMP_PREFIX
KEY_PREFIX_APP = _impl.KEY_PREFIX_APP
KEY_PREFIX_USER = _impl.KEY_PREFIX_USER
KEY_PREFIX_TEMP = _impl.KEY_PREFIX_TEMP
MAX_DEPTH = _impl.MAX_DEPTH
Scope = _impl.Scope
scope_of = _impl.scope_of
partition_by_scope = _impl.partition_by_scope
partition_checked = _impl.partition_checked
trim_temp_keys = _impl.trim_temp_keys
merge_scopes = _impl.merge_scopes
apply_delta = _impl.apply_delta
check_storable = _impl.check_storable
check_delta = _impl.check_delta
