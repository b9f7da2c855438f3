"""A deferred LMDB store's writes from an event loop: inline when the write lock is free,
handed to the writer thread when anyone holds it, so the loop never waits for it.

The holders from other processes are in ``test_lmdb_processes.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from pathlib import Path

import pytest

from _stores import while_the_loop_beats
from sessionscope import (
    Event,
    EventActions,
    LmdbStore,
    SessionService,
    SyncSessionService,
)
from sessionscope.errors import StoreClosedError

APP, USER = "app", "user"
WRITER_THREAD = "sessionscope-lmdb-writer"


def ev(n: int, blob: int = 0) -> Event:
    return Event(
        author="agent",
        content={"n": n, "blob": "x" * blob},
        actions=EventActions(state_delta={"n": n, "user:seen": n}),
    )


def writer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == WRITER_THREAD]


def test_a_loop_commits_on_its_own_thread_when_nobody_holds_the_lock(tmp_path: Path) -> None:
    before = len(writer_threads())
    store = LmdbStore(tmp_path / "store", durability="deferred")
    try:
        service = SessionService(store)

        async def scenario() -> list[int]:
            session = await service.create_session(app_name=APP, user_id=USER)
            for n in range(50):
                await service.append_event(session, ev(n))
            again = await service.get_session(app_name=APP, user_id=USER, session_id=session.id)
            assert again is not None
            return [e.content["n"] for e in again.events]

        assert asyncio.run(scenario()) == list(range(50))
        # No write needed the writer thread: none was started for this store.
        assert len(writer_threads()) == before
    finally:
        store.close()


def test_the_loop_runs_while_a_thread_of_its_process_holds_the_lock(tmp_path: Path) -> None:
    store = LmdbStore(tmp_path / "store", durability="deferred")
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        # What a thread in the middle of its own write holds.
        store._writer.writer_lock.acquire()
        holding.set()
        release.wait(30)
        store._writer.writer_lock.release()

    holder = threading.Thread(target=hold)
    try:
        service = SessionService(store)

        async def scenario() -> tuple[bool, int]:
            session = await service.create_session(app_name=APP, user_id=USER)
            holder.start()
            assert holding.wait(10)
            released_first, ticks = await while_the_loop_beats(
                service.append_event(session, ev(1)), release.set, release.is_set
            )
            again = await service.get_session(app_name=APP, user_id=USER, session_id=session.id)
            assert again is not None and [e.content["n"] for e in again.events] == [1]
            return released_first, ticks

        released_first, ticks = asyncio.run(scenario())
        assert released_first, "the loop froze until the holder gave up"
        assert ticks >= 5
    finally:
        release.set()
        holder.join(30)
        store.close()


def test_a_map_that_must_grow_under_a_loop_grows_and_keeps_every_event(tmp_path: Path) -> None:
    store = LmdbStore(tmp_path / "store", durability="deferred", map_size=1 << 20)
    try:
        service = SessionService(store)
        first_size = store.stat()["map_size"]

        async def scenario() -> list[int]:
            session = await service.create_session(app_name=APP, user_id=USER)
            for n in range(200):
                await service.append_event(session, ev(n, blob=20_000))
            again = await service.get_session(app_name=APP, user_id=USER, session_id=session.id)
            assert again is not None
            return [e.content["n"] for e in again.events]

        assert asyncio.run(scenario()) == list(range(200))
        assert store.stat()["map_size"] > first_size
    finally:
        store.close()
    reopened = LmdbStore(tmp_path / "store", durability="deferred")
    try:
        (listed,) = SyncSessionService(reopened).list_sessions(app_name=APP, user_id=USER).sessions
        session = SyncSessionService(reopened).get_session(
            app_name=APP, user_id=USER, session_id=listed.id
        )
        assert session is not None and len(session.events) == 200
    finally:
        reopened.close()


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="lists descriptors via /proc")
def test_closing_the_store_closes_its_lock_file(tmp_path: Path) -> None:
    lock_file = str((tmp_path / "store" / "lock.mdb").resolve())

    def open_on_lock_file() -> int:
        count = 0
        for fd in os.listdir("/proc/self/fd"):
            # The descriptor that listed the directory is gone already.
            with contextlib.suppress(OSError):
                count += os.readlink(f"/proc/self/fd/{fd}") == lock_file
        return count

    store = LmdbStore(tmp_path / "store", durability="deferred")
    assert open_on_lock_file() >= 1
    store.close()
    assert open_on_lock_file() == 0

    async def append_after_close() -> None:
        await SessionService(store).create_session(app_name=APP, user_id=USER)

    with pytest.raises(StoreClosedError):
        asyncio.run(append_after_close())
