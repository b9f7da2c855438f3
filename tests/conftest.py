"""Shared fixtures."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest

# The session's Redis servers, started on first use by the Redis store kinds.
from _redis import redis_cluster, redis_server  # noqa: F401


def _pure_build_requested() -> bool:
    return os.environ.get("SESSIONSCOPE_NO_EXTENSIONS", "") not in ("", "0")


@pytest.fixture(scope="session", params=["c", "py"])
def core_impl(request: pytest.FixtureRequest) -> ModuleType:
    """Yield the compiled scope core, then its pure-Python twin."""
    if request.param == "py":
        return importlib.import_module("sessionscope._core_py")
    try:
        return importlib.import_module("sessionscope._core")
    except ImportError as exc:
        # A missing compiled core is only expected when the pure build was
        # asked for; otherwise the twin would silently be tested twice.
        if _pure_build_requested():
            pytest.skip(f"compiled core not built (SESSIONSCOPE_NO_EXTENSIONS is set): {exc}")
        pytest.fail(
            f"compiled core sessionscope._core is not importable ({exc}); build it, "
            "or set SESSIONSCOPE_NO_EXTENSIONS=1 to test the pure-Python twin only"
        )
