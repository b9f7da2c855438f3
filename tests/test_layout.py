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
from sessionscope.stores.protocol import (
    CHAIN_METHODS,
    STORE_METHODS,
    AsyncChainStore,
    AsyncStore,
    ChainStore,
    InlineAsyncStore,
    Store,
)


def _methods(cls: type) -> set[str]:
    return {
        name
        for name, member in vars(cls).items()
        if not name.startswith("_") and (callable(member) or isinstance(member, property))
    }


def test_every_face_has_the_methods_of_the_store_interface() -> None:
    assert len(STORE_METHODS) == len(set(STORE_METHODS)) == 22
    # The async face, what the open learned and the sliced bulk append are
    # the sync face's alone.
    assert _methods(Store) == {*STORE_METHODS, "aio", "opened_elsewhere", "append_slices"}
    assert _methods(AsyncStore) == set(STORE_METHODS)
    # The chain of appends, which the inline stores (memory, LMDB) add.
    assert _methods(ChainStore) == {*CHAIN_METHODS, "aio"}
    assert _methods(AsyncChainStore) == set(CHAIN_METHODS)
    assert _methods(InlineAsyncStore) == {*STORE_METHODS, *CHAIN_METHODS}
    for name in (*STORE_METHODS, *CHAIN_METHODS):
        method = getattr(InlineAsyncStore, name)
        face, protocol = (
            (AsyncChainStore, "ChainStore") if name in CHAIN_METHODS else (AsyncStore, "Store")
        )
        assert method.__name__ == name and f"See ``{protocol}.{name}``" in method.__doc__
        # Coroutine or not, each method of the derived face is as the protocol says.
        assert inspect.iscoroutinefunction(method) == inspect.iscoroutinefunction(
            getattr(face, name)
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


def test_the_service_core_does_no_io() -> None:
    """ServiceCore checks and prepares, and finishes what a store returned: it has no store."""
    from sessionscope.service import NativeModel, ServiceCore
    from sessionscope.stores.records import SessionRecord

    core = ServiceCore(NativeModel())
    assert not hasattr(core, "store")
    for gone in ("get_session", "list_page", "read_user_state", "read_app_state"):
        assert not hasattr(core, gone), gone
    assert core.check_list("app", None, 1, None) == ("app", None, 1, None)
    assert core.check_user("app", "u") == ("app", "u")
    assert core.check_get("app", "u", "s", None) == ("app", "u", "s", None, None)
    assert core.finish_get(None) is None
    page = core.finish_list([SessionRecord("app", "u", "s", 1, 1.0, 2.0)], True)
    assert [meta.id for meta in page.sessions] == ["s"] and page.next_cursor
    assert core.check_list("app", "u", 1, page.next_cursor)[3] == (2.0, "u", "s")
    with pytest.raises(ValueError):
        core.check_list("app", None, 0, None)


def test_a_harness_sends_a_batch_through_public_methods(tmp_path: Path) -> None:
    """``append_many_with`` and ``core`` are what replay uses to carry reads in a batch."""
    from sessionscope import Event, EventActions, SyncSessionService
    from sessionscope.errors import StoreError
    from sessionscope.stores.records import AppendBatch, BatchResult

    with SyncSessionService(f"lmdb://{tmp_path / 'db'}") as service:
        session = service.create_session(app_name="app", user_id="u", session_id="s")
        sent: list[AppendBatch] = []

        def send(batch: AppendBatch) -> BatchResult:
            sent.append(batch)
            loaded = service.store.load_session(*service.core.check_get("app", "u", "s", None))
            assert loaded is not None and loaded.events == []  # read beside the batch
            return service.store.append_many(batch).result()

        events = [Event(author="a", actions=EventActions(state_delta={"k": n})) for n in (1, 2)]
        assert service.append_many_with([(session, e) for e in events], send) == events
        assert len(sent) == 1 and len(sent[0]) == 2
        assert session.state == {"k": 2} and len(session.events) == 2

        def refuse(batch: AppendBatch) -> BatchResult:
            raise StoreError("the store is away")

        late = Event(author="a", actions=EventActions(state_delta={"k": 3}))
        with pytest.raises(StoreError):
            service.append_many_with([(session, late)], refuse)
        # Nothing stored, the event's delta given back, the live session as it was.
        assert late.actions.state_delta == {"k": 3}
        assert session.state == {"k": 2} and len(session.events) == 2
        stored = service.get_session(app_name="app", user_id="u", session_id="s")
        assert stored is not None and stored.state == {"k": 2} and len(stored.events) == 2
        assert service.core.finish_get(None) is None
