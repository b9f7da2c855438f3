"""Which core sessionscope.core picks, and that both export the same names."""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
from types import ModuleType

import pytest

import sessionscope.core
from _children import python_output, run_python

# One literal list, as py-lmdb's package_test does: a name added to one
# implementation and not the other, or not here, fails.
EXPORTED = [
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

PURE_BUILD = os.environ.get("SESSIONSCOPE_NO_EXTENSIONS", "") not in ("", "0")
# A pure install has no compiled module at all; a compiled one is tested
# even when this process runs on the twin.
COMPILED_BUILT = importlib.util.find_spec("sessionscope._speedups._core") is not None

# Hides the compiled core from the child, as if it had not been built.
HIDE_COMPILED = "import sys; sys.modules['sessionscope._speedups._core'] = None; "
FAKE_PYPY = "import platform; platform.python_implementation = lambda: 'PyPy'; "


# What the child prints: the core it runs.
SHOW = "import sessionscope.core as c; print(c.IMPLEMENTATION)"


def _run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return run_python(code + SHOW, **env)


def _picked(code: str = "", **env: str) -> str:
    return python_output(code + SHOW, **env)


def test_exported_names(core_impl: ModuleType) -> None:
    assert core_impl.__all__ == EXPORTED
    for name in EXPORTED:
        assert getattr(core_impl, name) is not None


def test_dispatcher_exports() -> None:
    # Besides the core's names: what picks and reports the hot-path modules.
    picking = ["IMPLEMENTATION", "IMPLEMENTATIONS", "compiled_or_twin"]
    assert sorted(sessionscope.core.__all__) == sorted([*EXPORTED, *picking])
    assert sessionscope.core.IMPLEMENTATION in ("c", "py")
    impl = importlib.import_module(
        "sessionscope._speedups._core"
        if sessionscope.core.IMPLEMENTATION == "c"
        else "sessionscope._speedups._core_py"
    )
    for name in EXPORTED:
        assert getattr(sessionscope.core, name) is getattr(impl, name)


def test_this_process_picked_as_configured() -> None:
    picked = sessionscope.core.IMPLEMENTATION
    assert picked == ("py" if PURE_BUILD else "c")


@pytest.mark.parametrize("value", ["1", "yes", "true"])
def test_no_extensions_picks_the_twin(value: str) -> None:
    assert _picked(SESSIONSCOPE_NO_EXTENSIONS=value) == "py"


def test_no_extensions_wins_over_require() -> None:
    assert _picked(SESSIONSCOPE_NO_EXTENSIONS="1", SESSIONSCOPE_REQUIRE_EXTENSIONS="1") == "py"


def test_other_interpreters_use_the_twin() -> None:
    assert _picked(FAKE_PYPY, SESSIONSCOPE_REQUIRE_EXTENSIONS="1") == "py"


@pytest.mark.skipif(not COMPILED_BUILT, reason="a pure install has no compiled core")
@pytest.mark.parametrize("no_ext", ["", "0"])
def test_compiled_core_is_picked(no_ext: str) -> None:
    assert _picked(SESSIONSCOPE_NO_EXTENSIONS=no_ext, SESSIONSCOPE_REQUIRE_EXTENSIONS="1") == "c"
    assert _picked() == "c"


def test_missing_compiled_core_falls_back() -> None:
    assert _picked(HIDE_COMPILED) == "py"
    assert _picked(HIDE_COMPILED, SESSIONSCOPE_REQUIRE_EXTENSIONS="0") == "py"


def test_missing_compiled_core_is_an_error_when_required() -> None:
    result = _run(HIDE_COMPILED, SESSIONSCOPE_REQUIRE_EXTENSIONS="1")
    assert result.returncode != 0
    assert "ImportError" in result.stderr
    assert "SESSIONSCOPE_REQUIRE_EXTENSIONS is set" in result.stderr
    assert "sessionscope._speedups._core" in result.stderr
