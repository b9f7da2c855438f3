"""Route state keys by scope and validate storable values: the compiled core or its twin.

The implementation is picked once, at import. ``SESSIONSCOPE_NO_EXTENSIONS``
set to anything but ``""`` or ``"0"`` selects the pure-Python twin, as does any
interpreter other than CPython. Otherwise the compiled ``sessionscope._speedups._core``
is used, falling back to the twin when it is not built, unless
``SESSIONSCOPE_REQUIRE_EXTENSIONS`` is set, which makes a missing compiled core
an ImportError (so a CI job meant to test the compiled core cannot silently
test the twin). ``IMPLEMENTATION`` says which one was picked: ``"c"`` or ``"py"``.

The same switches pick the compiled hot path (``compiled_or_twin``): modules
written once as annotated Python (Cython's pure-Python mode) and compiled a
second time under the same name with a ``_c`` suffix, so the source stays
importable as the twin. ``IMPLEMENTATIONS`` says what runs for each of them.
"""

from __future__ import annotations

import importlib
import os
import platform
from types import ModuleType
from typing import TYPE_CHECKING, Literal

__all__ = [
    "APP_PREFIX",
    "FIELD_AS_IS",
    "FIELD_REFUSED",
    "FIELD_SORTED",
    "IMPLEMENTATION",
    "IMPLEMENTATIONS",
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
    "compiled_or_twin",
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


def _flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


NO_EXTENSIONS = _flag("SESSIONSCOPE_NO_EXTENSIONS") or platform.python_implementation() != "CPython"
REQUIRE_EXTENSIONS = _flag("SESSIONSCOPE_REQUIRE_EXTENSIONS")


def _required_error(name: str, exc: ImportError) -> ImportError:
    return ImportError(
        "SESSIONSCOPE_REQUIRE_EXTENSIONS is set but the compiled module "
        f"{name} cannot be imported ({exc}); reinstall sessionscope "
        "with a C compiler available, or unset SESSIONSCOPE_REQUIRE_EXTENSIONS "
        "to fall back to the pure-Python modules"
    )


# What runs for each module of the hot path: "c" or "py", by source module name.
IMPLEMENTATIONS: dict[str, Literal["c", "py"]] = {}


def compiled_or_twin(name: str) -> ModuleType:
    """Return the compiled build of a pure-Python-mode module (``name`` + ``_c``), or its source.

    The source module is the twin: it runs where the build is switched off
    or missing, as the scope core's twin does (see the module docstring).
    """
    module: ModuleType | None = None
    if not NO_EXTENSIONS:
        try:
            module = importlib.import_module(name + "_c")
        except ImportError as exc:
            if REQUIRE_EXTENSIONS:
                raise _required_error(name + "_c", exc) from exc
    if module is None:
        module = importlib.import_module(name)
    IMPLEMENTATIONS[name] = "c" if module.__name__ == name + "_c" else "py"
    return module


def _load() -> ModuleType:
    if NO_EXTENSIONS:
        from sessionscope._speedups import _core_py

        return _core_py
    try:
        from sessionscope._speedups import _core
    except ImportError as exc:
        if REQUIRE_EXTENSIONS:
            raise _required_error("sessionscope._speedups._core", exc) from exc
        from sessionscope._speedups import _core_py

        return _core_py
    return _core


if TYPE_CHECKING:
    # The twin is the type source; the compiled core has the same signatures.
    from sessionscope._speedups import _core_py as _impl
else:
    _impl = _load()

IMPLEMENTATION: Literal["c", "py"] = (
    "c" if _impl.__name__ == "sessionscope._speedups._core" else "py"
)

APP_PREFIX = _impl.APP_PREFIX
USER_PREFIX = _impl.USER_PREFIX
TEMP_PREFIX = _impl.TEMP_PREFIX
KEY_PREFIX_APP = _impl.KEY_PREFIX_APP
KEY_PREFIX_USER = _impl.KEY_PREFIX_USER
KEY_PREFIX_TEMP = _impl.KEY_PREFIX_TEMP
MAX_DEPTH = _impl.MAX_DEPTH
FIELD_AS_IS = _impl.FIELD_AS_IS
FIELD_SORTED = _impl.FIELD_SORTED
FIELD_REFUSED = _impl.FIELD_REFUSED
Scope = _impl.Scope
scope_of = _impl.scope_of
partition_by_scope = _impl.partition_by_scope
partition_checked = _impl.partition_checked
trim_temp_keys = _impl.trim_temp_keys
merge_scopes = _impl.merge_scopes
apply_delta = _impl.apply_delta
check_storable = _impl.check_storable
check_delta = _impl.check_delta
pack_event = _impl.pack_event
pack_model = _impl.pack_model
pack_plain = _impl.pack_plain
sized_key = _impl.sized_key
sortable_time = _impl.sortable_time
revision_marker = _impl.revision_marker
last_values = _impl.last_values
timed_record = _impl.timed_record
