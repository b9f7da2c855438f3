"""Child-process entry points for the Redis multi-process and crash tests.

Run as ``python _redis_workers.py COMMAND URI ARGS...``. Each command opens the
store itself from its URI, answers on stdout one line at a time (flushed), and
exits 0 when done. Every loop is bounded in count and time.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import sessionscope.stores.redis.cluster as redis_cluster
from sessionscope import Event, EventActions, SyncSessionService
from sessionscope.errors import StaleSessionError

MAX_SECONDS = 90.0


def _say(*parts: object) -> None:
    print(*parts, flush=True)


def _wait_for(path: Path, deadline: float) -> None:
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {path}")
        time.sleep(0.005)


def concurrent(uri: str, app: str, user: str, shared_sid: str, idx: str, n: str, go: str) -> None:
    """Append N locked events to a shared session and N to an own session."""
    me, count = int(idx), int(n)
    deadline = time.monotonic() + MAX_SECONDS
    with SyncSessionService(uri) as svc:
        shared = svc.get_session(app_name=app, user_id=user, session_id=shared_sid)
        assert shared is not None
        own = svc.create_session(app_name=app, user_id=f"{user}-{me}", session_id=f"own-{me}")
        _say("ready")
        _wait_for(Path(go), deadline)
        for i in range(count):
            if time.monotonic() > deadline:
                raise SystemExit("concurrent worker ran out of time")
            delta = {
                f"app:count_{me}": shared.state.get(f"app:count_{me}", 0) + 1,
                f"user:count_{me}": shared.state.get(f"user:count_{me}", 0) + 1,
                f"count_{me}": shared.state.get(f"count_{me}", 0) + 1,
            }
            event = Event(author=f"w{me}", content={"w": me, "i": i})
            event.actions = EventActions(state_delta=delta)
            svc.append_event_locked(shared, event)
            own_event = Event(author=f"w{me}", content={"w": me, "i": i})
            own_event.actions = EventActions(state_delta={"own": own.state.get("own", 0) + 1})
            svc.append_event_locked(own, own_event)
        _say("done")


def counter(uri: str, app: str, user: str, sid: str, n: str, go: str) -> None:
    """Increment a shared counter N times by read-modify-append, retrying when stale."""
    deadline = time.monotonic() + MAX_SECONDS
    retries = 0
    with SyncSessionService(uri) as svc:
        _say("ready")
        _wait_for(Path(go), deadline)
        for _ in range(int(n)):
            while True:
                if time.monotonic() > deadline:
                    raise SystemExit("counter worker ran out of time")
                s = svc.get_session(app_name=app, user_id=user, session_id=sid)
                assert s is not None
                value = s.state.get("n", 0) + 1
                event = Event(author="counter", actions=EventActions(state_delta={"n": value}))
                try:
                    svc.append_event(s, event)
                except StaleSessionError:
                    retries += 1
                    continue
                break
        _say("done", retries)


def kill_append(uri: str, app: str, user: str, sid: str) -> None:
    """Append events until killed (bounded); print each event id once its append returned."""
    deadline = time.monotonic() + MAX_SECONDS
    with SyncSessionService(uri) as svc:
        s = svc.get_session(app_name=app, user_id=user, session_id=sid)
        if s is None:
            s = svc.create_session(app_name=app, user_id=user, session_id=sid)
        _say("ready")
        for i in range(1_000_000):
            if time.monotonic() > deadline:
                break
            e = Event(author="child", content={"i": i, "pad": "x" * (i % 300)})
            e.actions = EventActions(state_delta={"last": e.id, "user:seen": i})
            try:
                svc.append_event(s, e)
            except Exception as error:  # the server was killed: report and stop
                _say("error", type(error).__name__)
                return
            _say(e.id)


def stop_between(uri: str, app: str, user: str, sid: str, value: str) -> None:
    """Append an event with an app: delta and stop between its two steps (until killed)."""
    deadline = time.monotonic() + MAX_SECONDS

    def hang() -> None:
        _say("between")
        while time.monotonic() < deadline:
            time.sleep(0.1)
        raise SystemExit("stop_between was not killed")

    with SyncSessionService(uri) as svc:
        s = svc.get_session(app_name=app, user_id=user, session_id=sid)
        assert s is not None
        redis_cluster.between_steps = hang
        event = Event(author="child", actions=EventActions(state_delta={"app:flag": value}))
        svc.append_event(s, event)


COMMANDS = {
    "concurrent": concurrent,
    "counter": counter,
    "kill_append": kill_append,
    "stop_between": stop_between,
}


if __name__ == "__main__":
    COMMANDS[sys.argv[1]](*sys.argv[2:])
