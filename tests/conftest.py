"""Shared fixtures."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from types import ModuleType

import pytest

# The session's Redis servers, started on first use by the Redis store kinds.
from _redis import redis_cluster, redis_server  # noqa: F401


def _pure_build_requested() -> bool:
    return os.environ.get("SESSIONSCOPE_NO_EXTENSIONS", "") not in ("", "0")


def import_build(name: str) -> ModuleType:
    """Import one build of a module by name, for a test that runs on each build.

    A compiled build missing is only expected where the pure build was asked
    for: the test is skipped there, and fails anywhere else (otherwise the
    twin would silently be tested twice).
    """
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        if _pure_build_requested():
            pytest.skip(f"{name} not built (SESSIONSCOPE_NO_EXTENSIONS is set): {exc}")
        pytest.fail(
            f"{name} is not importable ({exc}); build it, "
            "or set SESSIONSCOPE_NO_EXTENSIONS=1 to test the pure-Python twin only"
        )


@pytest.fixture(scope="session", params=["c", "py"])
def core_impl(request: pytest.FixtureRequest) -> ModuleType:
    """Yield the compiled scope core, then its pure-Python twin."""
    if request.param == "py":
        return importlib.import_module("sessionscope._speedups._core_py")
    return import_build("sessionscope._speedups._core")


@pytest.fixture
def build_of() -> Callable[[str], ModuleType]:
    """Return ``import_build``: a test's module, compiled or twin, by name."""
    return import_build


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the tests that need google-adk on the one Python it does not support.

    google-adk needs Python 3.11 or later, so the ``[adk]`` extra brings nothing
    on 3.10 and the drop-in is not offered there. From 3.11 on, a missing
    google-adk is an error, never a silent skip.
    """
    if sys.version_info >= (3, 11):
        return
    skip = pytest.mark.skip(reason="google-adk needs Python 3.11 or later")
    for item in items:
        if item.get_closest_marker("adk") is not None:
            item.add_marker(skip)
