"""The store interface is written once and its faces derived from it.

``STORE_METHODS`` names every method of the ``Store`` protocol; the
``AsyncStore`` protocol and the inline async face (memory, LMDB) have exactly
those, and each inline method answers as its kind says (a write hands back the
store's Completion, never a coroutine wrapped in a task).
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
from pathlib import Path

import pytest

from sessionscope.stores import open_store
from sessionscope.stores.completion import Completion
from sessionscope.stores.protocol import STORE_METHODS, AsyncStore, InlineAsyncStore, Store


def _methods(cls: type) -> set[str]:
    return {
        name
        for name, member in vars(cls).items()
        if not name.startswith("_") and (callable(member) or isinstance(member, property))
    }


def test_every_face_has_the_methods_of_the_store_interface() -> None:
    assert len(STORE_METHODS) == len(set(STORE_METHODS)) == 21
    assert _methods(Store) == {*STORE_METHODS, "aio"}
    assert _methods(AsyncStore) == set(STORE_METHODS)
    assert _methods(InlineAsyncStore) == set(STORE_METHODS)
    for name in STORE_METHODS:
        method = getattr(InlineAsyncStore, name)
        assert method.__name__ == name and f"Store.{name}" in method.__doc__
        # Coroutine or not, each method of the derived face is as the protocol says.
        assert inspect.iscoroutinefunction(method) == inspect.iscoroutinefunction(
            getattr(AsyncStore, name)
        ), name


def test_the_old_base_module_is_gone() -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("sessionscope.stores.base")


@pytest.mark.parametrize("scheme", ["memory", "lmdb"])
def test_the_inline_face_answers_on_a_real_store(scheme: str, tmp_path: Path) -> None:
    uri = "memory://" if scheme == "memory" else f"lmdb://{tmp_path / 'db'}"
    store = open_store(uri)
    aio = store.aio
    assert isinstance(aio, InlineAsyncStore)

    async def run() -> None:
        created = aio.create_session("app", "u", "s", 1.0, [], [], [])
        assert isinstance(created, Completion)  # handed back, not a coroutine
        loaded = await created
        assert loaded.record.session_id == "s"
        await aio.write_app_state("app", [("k", b"\xa1v")])
        assert await aio.read_app_state("app") == {"k": "v"}
        assert [r.session_id for r in await aio.list_sessions("app", None)] == ["s"]
        assert await aio.list_apps() == ["app"]
        assert await aio.delete_user("app", "u") == 1  # run in a worker thread
        assert await aio.load_session("app", "u", "s", None, None) is None
        await aio.flush()
        await aio.close()

    asyncio.run(run())
