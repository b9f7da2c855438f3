"""Retention racing with appends from another process, on one LMDB store.

The child is this module run as a script (``python test_retention_processes.py
COMMAND ...``) in a fresh interpreter; it answers on stdout, one line at a
time, and every loop is bounded in count and time. Children are killed and
reaped in a ``finally``.
"""

from __future__ import annotations

import random
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import _stores
from sessionscope import Event, EventActions, LmdbStore, SyncSessionService
from sessionscope.errors import SessionNotFoundError

pytestmark = pytest.mark.slow

APP, USER = "app", "user"
MAX_SECONDS = 60.0


# -- the child -----------------------------------------------------------


def _say(*parts: Any) -> None:
    print(*parts, flush=True)


def child_append(path: str, count: str) -> None:
    """Append ``count`` events to one session with locked appends; print each id."""
    deadline = time.monotonic() + MAX_SECONDS
    with SyncSessionService(LmdbStore(path)) as svc:
        session = svc.get_session(app_name=APP, user_id=USER, session_id="s")
        assert session is not None
        _say("ready")
        for index in range(int(count)):
            if time.monotonic() > deadline:
                break
            event = Event(
                author="child",
                timestamp=float(index),
                content={"i": index},
                actions=EventActions(state_delta={f"k{index}": index, "user:last": index}),
            )
            svc.append_event_locked(session, event)
            _say(event.id)
    _say("done")


def child_touch(path: str, order: str) -> None:
    """Append one event now to each session named in ``order`` (comma-separated).

    Print ``kept SID`` once an append returned, ``gone SID`` when the session
    was not found (before or at the append).
    """
    deadline = time.monotonic() + MAX_SECONDS
    with SyncSessionService(LmdbStore(path)) as svc:
        _say("ready")
        for sid in order.split(","):
            if time.monotonic() > deadline:
                break
            session = svc.get_session(app_name=APP, user_id=USER, session_id=sid)
            if session is None:
                _say("gone", sid)
                continue
            event = Event(author="child", actions=EventActions(state_delta={"touched": True}))
            try:
                svc.append_event_locked(session, event)
            except SessionNotFoundError:
                _say("gone", sid)
            else:
                _say("kept", sid)
    _say("done")


# -- the parent ----------------------------------------------------------


class Child:
    """A child process whose stdout lines are read with a deadline."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=_stores.child_env(),
        )
        self._buffer = b""

    def line(self, timeout: float = 60.0) -> str:
        """Return the next line; fail if none comes within ``timeout``."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            assert left > 0, f"child said nothing for {timeout}s"
            ready, _, _ = select.select([fd], [], [], min(left, 1.0))
            if ready:
                chunk = self.proc.stdout.read1(65536)  # type: ignore[attr-defined]
                if not chunk:
                    assert self.proc.stderr is not None
                    raise AssertionError(f"child ended early: {self.proc.stderr.read()!r}")
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode()

    def lines_until_done(self) -> list[str]:
        """Return every line up to ``done``."""
        lines = []
        while (line := self.line()) != "done":
            lines.append(line)
        return lines

    def stop(self) -> None:
        """Kill the child if it still runs, and reap it."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


@contextmanager
def child(*args: str) -> Iterator[Child]:
    started = Child(*args)
    try:
        yield started
    finally:
        started.stop()


def test_truncate_while_another_process_appends(tmp_path: Path) -> None:
    path = tmp_path / "store"
    appends = 400
    with SyncSessionService(LmdbStore(path)) as svc:
        svc.create_session(app_name=APP, user_id=USER, session_id="s")
    removed = 0
    passes = 0
    with SyncSessionService(LmdbStore(path)) as svc, child("append", str(path), str(appends)) as c:
        assert c.line() == "ready"
        while c.proc.poll() is None and passes < 10_000:
            passes += 1
            if passes % 3:
                removed += svc.truncate_events(
                    app_name=APP, user_id=USER, session_id="s", keep_last=5
                )
            else:
                latest = svc.get_session(app_name=APP, user_id=USER, session_id="s")
                assert latest is not None
                cutoff = latest.events[-1].timestamp - 3 if latest.events else 0.0
                removed += svc.truncate_events(
                    app_name=APP, user_id=USER, session_id="s", before=cutoff
                )
            time.sleep(0.002)
        acknowledged = c.lines_until_done()
        assert c.proc.wait(timeout=30) == 0
        stored = svc.get_session(app_name=APP, user_id=USER, session_id="s")
    assert stored is not None
    ids = [e.id for e in stored.events]
    assert len(acknowledged) == appends
    # Nothing lost, nothing kept twice: the stored events are the newest ones.
    assert len(ids) + removed == appends
    assert ids == acknowledged[len(acknowledged) - len(ids) :]
    assert [e.timestamp for e in stored.events] == sorted(e.timestamp for e in stored.events)
    # State stays whole whatever was truncated.
    assert all(stored.state[f"k{i}"] == i for i in range(appends))
    assert stored.state["user:last"] == appends - 1
    assert removed > 0


def test_expiry_while_another_process_appends(tmp_path: Path) -> None:
    path = tmp_path / "store"
    count = 600
    sids = [f"s{i:04d}" for i in range(count)]
    old = time.time() - 3600
    with SyncSessionService(LmdbStore(path, durability="deferred")) as svc:
        for sid in sids:
            session = svc.create_session(app_name=APP, user_id=USER, session_id=sid)
            svc.append_event(session, Event(author="setup", timestamp=old, content={"sid": sid}))
    order = list(sids)
    random.Random(7).shuffle(order)
    with _opened(path) as store:
        svc = SyncSessionService(store)
        with child("touch", str(path), ",".join(order)) as c:
            assert c.line() == "ready"
            expired = svc.expire_sessions(app_name=APP, idle_for=600)
            lines = c.lines_until_done()
            assert c.proc.wait(timeout=30) == 0
        kept = {line.split(" ", 1)[1] for line in lines if line.startswith("kept ")}
        gone = {line.split(" ", 1)[1] for line in lines if line.startswith("gone ")}
        assert kept | gone == set(sids) and not kept & gone
        present = {m.id for m in svc.list_sessions(app_name=APP).sessions}
        # A session the child appended to survived whole; one it could not is gone.
        assert present == kept
        assert expired == len(gone)
        for sid in kept:
            session = svc.get_session(app_name=APP, user_id=USER, session_id=sid)
            assert session is not None
            assert [e.author for e in session.events] == ["setup", "child"]
            assert session.state == {"touched": True}
        # No entry of a removed session is left: per event its record and id
        # index entry (these events are in time order: no time index), and
        # 1 per state key; the list index holds the kept sessions only.
        assert store.stat()["entries"]["data"] == len(kept) * (2 * 2 + 1)
        assert store.stat()["entries"]["listing"] == len(kept)
        assert store.stat()["entries"]["meta"] == 2


@contextmanager
def _opened(path: Path) -> Iterator[LmdbStore]:
    store = LmdbStore(path)
    try:
        yield store
    finally:
        store.close()


if __name__ == "__main__":
    commands = {"append": child_append, "touch": child_touch}
    command, *arguments = sys.argv[1:]
    commands[command](*arguments)


def test_delete_app_while_another_process_appends(tmp_path: Path) -> None:
    path = tmp_path / "store"
    sids = [f"s{i:04d}" for i in range(300)]
    with SyncSessionService(LmdbStore(path, durability="deferred")) as svc:
        for sid in sids:
            session = svc.create_session(
                app_name=APP, user_id=USER, session_id=sid, state={"app:a": 1, "user:u": 2}
            )
            svc.append_event(session, Event(author="setup", content={"sid": sid}))
    with _opened(path) as store:
        svc = SyncSessionService(store)
        with child("touch", str(path), ",".join(sids)) as c:
            assert c.line() == "ready"
            removed = svc.delete_app(app_name=APP)
            lines = c.lines_until_done()
            assert c.proc.wait(timeout=30) == 0
        # Every session went, also those the child appended to before the
        # deletion reached them; none it reached later took its append.
        assert all(line.split(" ")[0] in ("kept", "gone") for line in lines)
        assert removed == len(sids)
        assert svc.list_sessions(app_name=APP).sessions == []
        assert svc.get_app_state(app_name=APP) == {}
        assert svc.get_user_state(app_name=APP, user_id=USER) == {}
        entries = store.stat()["entries"]
        assert (entries["sessions"], entries["shared"], entries["data"]) == (0, 0, 0)
        assert entries["listing"] == 0
        assert entries["meta"] == 2
        assert store.check_layout() == []
