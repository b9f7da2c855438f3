"""A write lock the OS refuses fails the writes waiting for it: no waiter hangs, none commits later.

The kernel may refuse a file lock (ENOLCK: out of lock records). The lock
is taken by whichever thread commits the queue, a caller's or the writer
thread; either way every write queued behind it must fail with a
StoreError, and the writer thread must live on for the writes after.
"""

from __future__ import annotations

import asyncio
import errno
from pathlib import Path
from typing import Any

import pytest

from _stores import APP, USER, ev
from sessionscope import LmdbStore, SessionService, SyncSessionService
from sessionscope.errors import StoreError


class RefusedLock:
    """Stands where the store's write lock is while the kernel refuses file locks."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.refusals = 0

    def acquire(self, blocking: bool = True) -> bool:
        if not blocking:
            return False  # an event loop's try: the write is queued for the writer thread
        self.refusals += 1
        raise OSError(errno.ENOLCK, "No locks available")

    def __enter__(self) -> None:
        self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def release(self) -> None:
        raise AssertionError("a refused lock is never released")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def _refuse_locks(store: LmdbStore) -> tuple[Any, RefusedLock]:
    writer = store._writer
    real = writer.writer_lock
    refused = RefusedLock(real)
    writer.writer_lock = refused
    return writer, refused


@pytest.mark.parametrize("durability", ["sync", "deferred"])
def test_a_refused_lock_fails_a_callers_write_and_stores_nothing(
    tmp_path: Path, durability: str
) -> None:
    store = LmdbStore(tmp_path / "s", durability=durability)
    with SyncSessionService(store) as svc:
        session = svc.create_session(app_name=APP, user_id=USER, session_id="s")
        writer, refused = _refuse_locks(store)
        lost = ev(delta={"k": 1})
        with pytest.raises(StoreError, match="write lock") as caught:
            svc.append_event(session, lost)
        assert caught.value.hint and "nothing of these writes was stored" in caught.value.hint
        assert refused.refusals >= 1
        writer.writer_lock = refused.real
        kept = ev(delta={"k": 2})
        svc.append_event(session, kept)
        svc.flush()
        stored = svc.get_session(app_name=APP, user_id=USER, session_id="s")
        assert stored is not None
        assert [e.id for e in stored.events] == [kept.id]
        assert stored.state == {"k": 2}


def test_the_writer_thread_fails_queued_writes_and_lives_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An event loop's deferred write goes to the writer thread: it fails, never hangs."""
    store = LmdbStore(tmp_path / "s", durability="deferred")

    async def run() -> list[str]:
        async with SessionService(store) as svc:
            session = await svc.create_session(app_name=APP, user_id=USER, session_id="s")
            writer, refused = _refuse_locks(store)
            with pytest.raises(StoreError, match="write lock"):
                await asyncio.wait_for(svc.append_event(session, ev(delta={"k": 1})), 60)
            assert refused.refusals >= 1
            writer.writer_lock = refused.real
            kept = ev(delta={"k": 2})
            await asyncio.wait_for(svc.append_event(session, kept), 60)
            await svc.flush()
            stored = await svc.get_session(app_name=APP, user_id=USER, session_id="s")
            assert stored is not None and stored.state == {"k": 2}
            return [e.id for e in stored.events]

    with caplog.at_level("ERROR", logger="sessionscope"):
        ids = asyncio.run(run())
    assert len(ids) == 1
    assert any("taking the write lock" in r.getMessage() for r in caplog.records)
