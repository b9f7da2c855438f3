"""The session contract, retention and dumps again, on every kind of store opened encrypted.

The tests of test_contract.py, test_retention.py, test_service_sync_async.py,
test_dump.py, test_migrate.py (where google-adk runs) and test_openai_agents.py
(where the OpenAI Agents SDK runs) that take a store
from ``store_factory`` run here once more, with this module's
``store_factory``: memory, LMDB and Redis, each wrapped in an
``EncryptedStore`` (sessionscope.crypto) with its key store.
"""

from __future__ import annotations

import importlib.util
import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import _stores
import test_contract
import test_dump
import test_retention
import test_service_sync_async
from _stores import ENCRYPTED_KINDS, StoreFactory

pytest.importorskip("cryptography")

# CI runs these on one Python, compiled and pure (see the marker in pyproject.toml).
pytestmark = pytest.mark.encrypted_kinds

_FIXTURES = {"store_factory", "svc", "asvc"}
# Tests whose targets are plain stores: an encrypted dump imports only into a
# store encrypted with the same key store (test_encryption.py checks that).
_PLAIN_TARGETS = {"test_round_trip_is_exact"}


@pytest.fixture(params=ENCRYPTED_KINDS)
def store_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    """Yield a factory of encrypted stores of one kind, all closed afterwards."""
    yield from _stores.factory_of_param(request, tmp_path)


svc = _stores.svc
asvc = _stores.asvc


def _installed(name: str) -> bool:
    """Tell whether a module can be imported (False where not even its parent package is)."""
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # "google.adk" without the google namespace (Python 3.10)
        return False


_MODULES: list[Any] = [test_contract, test_retention, test_service_sync_async, test_dump]
# Migration from google-adk into encrypted stores, where google-adk runs.
if _installed("google.adk"):
    import test_migrate

    _MODULES.append(test_migrate)
    adk_sources = test_migrate.adk_sources

# The OpenAI Agents SDK's Session on encrypted stores, where the SDK is installed.
if _installed("agents"):
    import test_openai_agents

    _MODULES.append(test_openai_agents)

for _module in _MODULES:
    for _name, _test in vars(_module).items():
        if (
            _name.startswith("test_")
            and callable(_test)
            and _name not in _PLAIN_TARGETS
            and _FIXTURES & set(inspect.signature(_test).parameters)
        ):
            globals()[_name] = _test
good_dump = test_dump.good_dump
