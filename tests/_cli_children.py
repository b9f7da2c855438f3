"""Child processes for the command-line tests: ``python _cli_children.py COMMAND ARGS...``.

Each opens the store itself, says "ready" on stdout once it has, and is
bounded in time; the tests stop them by pid.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from sessionscope import Event, EventActions, LmdbStore, SyncSessionService

MAX_SECONDS = 60.0


def _say(*parts: object) -> None:
    print(*parts, flush=True)


def append(path: str, app: str, user: str, sid: str, count: str, pause: str) -> None:
    """Append ``count`` events to a session, ``pause`` seconds apart; print each id."""
    with SyncSessionService(LmdbStore(path)) as svc:
        session = svc.get_session(app_name=app, user_id=user, session_id=sid)
        assert session is not None
        _say("ready")
        for i in range(int(count)):
            event = Event(author="child", content={"parts": [{"text": f"line {i}"}]})
            event.actions = EventActions(state_delta={"i": i})
            svc.append_event_locked(session, event)
            _say(event.id)
            time.sleep(float(pause))


def hold(path: str) -> None:
    """Open the store, read from it, and keep it open until stopped (bounded)."""
    with SyncSessionService(LmdbStore(path)) as svc:
        svc.list_sessions(app_name="app")
        _say("ready")
        time.sleep(MAX_SECONDS)


def writer(path: str, app: str, name: str, stop: str) -> None:
    """Append to sessions of its own until the file ``stop`` exists (bounded in time)."""
    deadline = time.monotonic() + MAX_SECONDS
    with SyncSessionService(LmdbStore(path)) as svc:
        sessions = [
            svc.create_session(app_name=app, user_id=name, session_id=f"{name}-{n}")
            for n in range(3)
        ]
        _say("ready")
        i = 0
        while not Path(stop).exists() and time.monotonic() < deadline:
            session = sessions[i % len(sessions)]
            event = Event(author=name, content={"parts": [{"text": f"{name} {i} " + "x" * 200}]})
            event.actions = EventActions(state_delta={"n": i, "user:last": i})
            svc.append_event(session, event)
            i += 1
        _say("appended", i)


def open_and_append(path: str) -> None:
    """Say "opening", open the store (waiting if it is held alone), append once, say "appended"."""
    _say("opening")
    with SyncSessionService(LmdbStore(path)) as svc:
        session = svc.create_session(app_name="late", user_id="late", session_id="late")
        svc.append_event(session, Event(author="late"))
    _say("appended")


if __name__ == "__main__":
    command, *arguments = sys.argv[1:]
    commands = {"append": append, "hold": hold, "writer": writer}
    commands["open_and_append"] = open_and_append
    commands[command](*arguments)
