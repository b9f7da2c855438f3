"""Group commit of a durable LMDB store: threads and event loops writing at once."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from _stores import child_env
from sessionscope import (
    Event,
    EventActions,
    LmdbStore,
    SessionService,
    SyncSessionService,
)
from sessionscope.errors import SessionNotFoundError, StoreClosedError

APP = "app"


def ev(n: int) -> Event:
    return Event(author="agent", content={"n": n}, actions=EventActions(state_delta={"n": n}))


def run_threads(targets: list[threading.Thread], timeout: float = 60) -> None:
    for thread in targets:
        thread.start()
    for thread in targets:
        thread.join(timeout)
    assert not any(thread.is_alive() for thread in targets)


def test_threads_and_tasks_share_the_group_commit(tmp_path: Path) -> None:
    """Threads (which may lead a commit) and tasks (which never do) all land, in order."""
    store = LmdbStore(tmp_path / "store", durability="sync")
    sync_service, async_service = SyncSessionService(store), SessionService(store)
    per_writer, errors = 40, []

    def thread_writer(index: int) -> None:
        try:
            session = sync_service.create_session(app_name=APP, user_id="t", session_id=f"t{index}")
            for n in range(per_writer):
                sync_service.append_event(session, ev(n))
        except BaseException as error:  # reported below
            errors.append(error)

    def loop_writer() -> None:
        async def task(index: int) -> None:
            session = await async_service.create_session(
                app_name=APP, user_id="a", session_id=f"a{index}"
            )
            for n in range(per_writer):
                await async_service.append_event(session, ev(n))

        async def main() -> None:
            await asyncio.gather(*(task(i) for i in range(16)))

        try:
            asyncio.run(main())
        except BaseException as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=thread_writer, args=(i,)) for i in range(4)]
    run_threads([*threads, threading.Thread(target=loop_writer)])
    assert errors == []
    listed = sync_service.list_sessions(app_name=APP).sessions
    assert len(listed) == 20 and all(meta.event_count == per_writer for meta in listed)
    for meta in listed:
        stored = sync_service.get_session(app_name=APP, user_id=meta.user_id, session_id=meta.id)
        assert stored is not None
        assert [e.content for e in stored.events] == [{"n": n} for n in range(per_writer)]
        assert stored.state == {"n": per_writer - 1}
    store.close()


def test_a_failing_write_does_not_fail_its_batch(tmp_path: Path) -> None:
    """Appends to a deleted session fail alone; the writes committed beside them land."""
    store = LmdbStore(tmp_path / "store", durability="sync")
    service = SessionService(store)

    async def main() -> tuple[list[BaseException | None], list[str]]:
        good = [
            await service.create_session(app_name=APP, user_id="u", session_id=f"g{i}")
            for i in range(8)
        ]
        gone = [
            await service.create_session(app_name=APP, user_id="u", session_id=f"x{i}")
            for i in range(8)
        ]
        for session in gone:
            await service.delete_session(app_name=APP, user_id="u", session_id=session.id)
        # Queued together, so that good and failing appends share transactions.
        outcomes = await asyncio.gather(
            *(service.append_event(s, ev(i)) for i, s in enumerate([*good, *gone])),
            return_exceptions=True,
        )
        return [o if isinstance(o, BaseException) else None for o in outcomes], [s.id for s in good]

    outcomes, good_ids = asyncio.run(main())
    assert outcomes[:8] == [None] * 8
    assert all(isinstance(o, SessionNotFoundError) for o in outcomes[8:])
    sync_service = SyncSessionService(store)
    for i, sid in enumerate(good_ids):
        stored = sync_service.get_session(app_name=APP, user_id="u", session_id=sid)
        assert stored is not None and [e.content for e in stored.events] == [{"n": i}]
    assert len(sync_service.list_sessions(app_name=APP).sessions) == 8
    store.close()


def test_writes_racing_a_close_finish_or_are_refused(tmp_path: Path) -> None:
    """No writer is left waiting when the store closes under it."""
    store = LmdbStore(tmp_path / "store", durability="sync")
    service = SyncSessionService(store)
    sessions = [
        service.create_session(app_name=APP, user_id="u", session_id=f"s{i}") for i in range(4)
    ]
    started = threading.Barrier(5)
    outcomes: list[str] = []
    acknowledged: dict[int, list[str]] = {i: [] for i in range(4)}

    def writer(index: int) -> None:
        started.wait()
        for n in range(200):
            event = ev(n)
            try:
                service.append_event(sessions[index], event)
            except StoreClosedError:
                outcomes.append("closed")
                return
            acknowledged[index].append(event.id)
        outcomes.append("done")

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    started.wait()
    store.close()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads)
    assert sorted(set(outcomes)) <= ["closed", "done"] and len(outcomes) == 4
    with pytest.raises(StoreClosedError):
        service.get_session(app_name=APP, user_id="u", session_id="s0")
    # What returned is stored, and what was refused is not.
    with SyncSessionService(LmdbStore(tmp_path / "store")) as reopened:
        for index in range(4):
            stored = reopened.get_session(app_name=APP, user_id="u", session_id=f"s{index}")
            assert stored is not None and [e.id for e in stored.events] == acknowledged[index]


def test_the_sync_api_called_inside_a_running_event_loop_completes(tmp_path: Path) -> None:
    """A thread running an event loop never leads a commit: the writer thread takes its writes.

    Blocking calls from inside a loop (a notebook, a sync helper in async code)
    must still finish, each committed by the writer thread.
    """
    store = LmdbStore(tmp_path / "store", durability="sync")
    service = SyncSessionService(store)

    async def main() -> list[str]:
        session = service.create_session(app_name=APP, user_id="u", session_id="s")
        return [service.append_event(session, ev(n)).id for n in range(20)]

    appended = asyncio.run(main())
    stored = service.get_session(app_name=APP, user_id="u", session_id="s")
    assert stored is not None and [e.id for e in stored.events] == appended
    store.close()


def test_writes_queued_while_a_thread_leads_are_all_committed(tmp_path: Path) -> None:
    """Threads that find the commit led by another leave their writes to the writer thread.

    Many threads on one session each append through append_event_locked; every
    event lands exactly once and the counter kept in state counts them all.
    """
    store = LmdbStore(tmp_path / "store", durability="sync")
    service = SyncSessionService(store)
    service.create_session(app_name=APP, user_id="u", session_id="s")
    per_thread, errors = 25, []

    def writer(index: int) -> None:
        try:
            session = service.get_session(app_name=APP, user_id="u", session_id="s")
            assert session is not None
            for n in range(per_thread):
                event = Event(
                    author=f"w{index}",
                    actions=EventActions(state_delta={f"w{index}": n}),
                )
                service.append_event_locked(session, event)
        except BaseException as error:  # reported below
            errors.append(error)

    run_threads([threading.Thread(target=writer, args=(i,)) for i in range(8)])
    assert errors == []
    stored = service.get_session(app_name=APP, user_id="u", session_id="s")
    assert stored is not None and len(stored.events) == 8 * per_thread
    assert stored.state == {f"w{i}": per_thread - 1 for i in range(8)}
    store.close()


ASYNC_DURABLE_CHILD = """
import asyncio, sys
from sessionscope import Event, EventActions, SessionService

async def main(path, count):
    async with SessionService(f"lmdb://{path}") as service:
        session = await service.create_session(app_name="app", user_id="u", session_id="s")
        for n in range(count):
            await service.append_event(
                session, Event(author="a", actions=EventActions(state_delta={"n": n}))
            )

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


def _writer_locks_taken(path: Path, trace: Path, count: int) -> int:
    """Return how often a child making ``count`` async durable appends took the writers' flock."""
    done = subprocess.run(
        ["strace", "-f", "-qq", "-e", "trace=flock", "-e", "signal=none", "-o", str(trace),
         sys.executable, "-c", ASYNC_DURABLE_CHILD, str(path), str(count)],
        env=child_env(), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return sum("LOCK_EX" in line for line in trace.read_text().splitlines())


def test_the_writer_thread_takes_the_write_lock_once_per_commit(tmp_path: Path) -> None:
    """An event loop's durable append costs one flock of the writers' lock, not two.

    The writer thread commits a task's append; it used to take the lock once
    more after every commit only to find the queue empty: two system calls
    an append, and the thread holding the GIL while the woken loop wanted it.
    """
    if shutil.which("strace") is None:
        pytest.skip("strace is not installed")
    few = _writer_locks_taken(tmp_path / "few", tmp_path / "few.txt", 5)
    many = _writer_locks_taken(tmp_path / "many", tmp_path / "many.txt", 45)
    # The difference is the 40 appends alone (opening and closing cancel out).
    assert many - few == 40, (few, many)
