"""Which build of each hot-path module runs: the compiled one, or its source as the twin."""

from __future__ import annotations

import importlib.util
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

import sessionscope.core
import sessionscope.crypto.store
import sessionscope.service.core
import sessionscope.service.paging
import sessionscope.stores.lmdb.store
import sessionscope.stores.lmdb.writer
from _children import python_output, run_python

# Every module compiled from annotated Python, by source name.
# The order is the order the child below prints what each of them runs.
HOT_PATH = [
    "sessionscope.service._append",
    "sessionscope.stores.lmdb._append",
    "sessionscope.service._listing",
    "sessionscope.stores.lmdb._locks",
    "sessionscope.stores.lmdb.layout",
    "sessionscope.crypto.envelope",
]

PURE_BUILD = os.environ.get("SESSIONSCOPE_NO_EXTENSIONS", "") not in ("", "0")
BUILT = {name: importlib.util.find_spec(name + "_c") is not None for name in HOT_PATH}
# The compiled scope core, which sessionscope imports before the hot path.
CORE_BUILT = importlib.util.find_spec("sessionscope._speedups._core") is not None
HIDE_COMPILED = "".join(f"sys.modules[{name + '_c'!r}] = None; " for name in HOT_PATH)


# What the child prints: the build each module of the hot path runs.
SHOW = (
    "import sessionscope.service.core as s, sessionscope.service.paging as p, "
    "sessionscope.stores.lmdb.store as l, sessionscope.stores.lmdb.writer as w, "
    "sessionscope.crypto.store as e, sessionscope.core as c; "
    "print(s._hot.__name__, l._hot.__name__, p._listing.__name__, w._locks.__name__, "
    "l._layout.__name__, e._envelope.__name__, "
    "*sorted(c.IMPLEMENTATIONS.items()))"
)


def _run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return run_python("import sys; " + code + SHOW, **env)


def _picked(code: str = "", **env: str) -> str:
    return python_output("import sys; " + code + SHOW, **env)


def _expected(kind: str) -> str:
    """Return what a child prints when every hot-path module runs ``kind``."""
    suffix = "_c" if kind == "c" else ""
    running = " ".join(name + suffix for name in HOT_PATH)
    return running + " " + " ".join(str((name, kind)) for name in sorted(HOT_PATH))


def test_this_process_runs_what_it_says() -> None:
    expected = "py" if PURE_BUILD else "c"
    assert dict.fromkeys(HOT_PATH, expected) == sessionscope.core.IMPLEMENTATIONS
    suffix = "_c" if expected == "c" else ""
    assert sessionscope.service.core._hot.__name__ == HOT_PATH[0] + suffix
    assert sessionscope.stores.lmdb.store._hot.__name__ == HOT_PATH[1] + suffix
    assert sessionscope.service.paging._listing.__name__ == HOT_PATH[2] + suffix
    assert sessionscope.stores.lmdb.writer._hot.__name__ == HOT_PATH[1] + suffix
    assert sessionscope.stores.lmdb.writer._locks.__name__ == HOT_PATH[3] + suffix
    assert sessionscope.stores.lmdb.store._layout.__name__ == HOT_PATH[4] + suffix
    assert sessionscope.stores.lmdb.store._hot.layout.__name__ == HOT_PATH[4] + suffix
    assert sessionscope.crypto.store._envelope.__name__ == HOT_PATH[5] + suffix
    assert sessionscope.crypto.keyring._envelope.__name__ == HOT_PATH[5] + suffix


def test_no_extensions_runs_the_source() -> None:
    assert _picked(SESSIONSCOPE_NO_EXTENSIONS="1") == _expected("py")
    both = {"SESSIONSCOPE_NO_EXTENSIONS": "1", "SESSIONSCOPE_REQUIRE_EXTENSIONS": "1"}
    assert _picked(**both) == _expected("py")


@pytest.mark.skipif(not all(BUILT.values()), reason="a pure install compiles nothing")
def test_the_compiled_build_is_picked() -> None:
    assert _picked(SESSIONSCOPE_REQUIRE_EXTENSIONS="1") == _expected("c")
    assert _picked(SESSIONSCOPE_NO_EXTENSIONS="0") == _expected("c")


def test_a_missing_build_falls_back_to_the_source() -> None:
    assert _picked(HIDE_COMPILED) == _expected("py")


def test_a_missing_build_is_an_error_when_required() -> None:
    result = _run(HIDE_COMPILED, SESSIONSCOPE_REQUIRE_EXTENSIONS="1")
    assert result.returncode != 0
    assert "ImportError" in result.stderr
    # The first module imported names itself: on a pure install, where no
    # module is compiled, that is the scope core.
    if CORE_BUILT:
        assert "_c cannot be imported" in result.stderr
    else:
        assert "sessionscope._speedups._core cannot be imported" in result.stderr


@pytest.mark.skipif(not all(BUILT.values()), reason="a pure install compiles nothing")
@pytest.mark.parametrize("name", HOT_PATH)
def test_both_builds_export_the_same_names(name: str) -> None:
    source = importlib.import_module(name)
    compiled = importlib.import_module(name + "_c")
    assert compiled.__all__ == source.__all__
    for export in source.__all__:
        ours, theirs = getattr(compiled, export), getattr(source, export)
        assert callable(ours) == callable(theirs)
        if isinstance(ours, struct.Struct):
            assert ours.format == theirs.format
        elif not callable(ours):
            assert ours == theirs
    # The compiled build really is compiled, the source really is not.
    assert compiled.__file__ is not None and not compiled.__file__.endswith(".py")
    assert source.__file__ is not None and source.__file__.endswith(".py")
    # (layout is plain Python, compiled as it is: it has no cython import.)
    assert not getattr(source, "cython", None) or not source.cython.compiled


def test_the_source_runs_without_cython_installed(tmp_path: Path) -> None:
    # A pure install may lack Cython: the source then takes its stand-ins.
    code = (
        "sys.modules['cython'] = None; "
        "import sessionscope.stores.lmdb.store as l, sessionscope.service as s; "
        f"store = l.LmdbStore({str(tmp_path)!r}, durability='deferred'); "
        "service = s.SyncSessionService(store); "
        "session = service.create_session(app_name='a', user_id='u'); "
        "from sessionscope.model import Event; "
        "service.append_event(session, Event(author='x', actions=__import__("
        "'sessionscope.model').model.EventActions(state_delta={'k': 1}))); "
        "print(l._hot.cython.__name__, service.get_session(app_name='a', user_id='u', "
        "session_id=session.id).state); store.close(); "
    )
    result = subprocess.run(
        [sys.executable, "-c", "import sys; " + code],
        env={**os.environ, "SESSIONSCOPE_NO_EXTENSIONS": "1"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["sessionscope._speedups._no_cython", "{'k':", "1}"]


@pytest.mark.skipif(not all(BUILT.values()), reason="a pure install compiles nothing")
def test_one_build_missing_runs_the_other_compiled() -> None:
    # Each module falls back on its own; IMPLEMENTATIONS says which ran.
    hide = f"sys.modules[{HOT_PATH[0] + '_c'!r}] = None; "
    printed = _picked(hide).split(" ", len(HOT_PATH))
    assert printed[: len(HOT_PATH)] == [HOT_PATH[0]] + [name + "_c" for name in HOT_PATH[1:]]
    kinds = {name: "py" if name == HOT_PATH[0] else "c" for name in HOT_PATH}
    assert printed[-1] == " ".join(str((name, kinds[name])) for name in sorted(HOT_PATH))
