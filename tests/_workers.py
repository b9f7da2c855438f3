"""Child-process entry points for the multi-process tests.

Run as ``python _workers.py COMMAND ARGS...``. Each command opens the store
itself (never inherits an open environment), answers on stdout one line at a
time (flushed), and exits 0 when done. Every loop is bounded in count and time.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from sessionscope import Event, EventActions, LmdbStore, SyncSessionService

MAX_SECONDS = 90.0


def _say(*parts: Any) -> None:
    print(*parts, flush=True)


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"bytes": value.hex()}
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value


def _wait_for(path: Path, deadline: float) -> None:
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {path}")
        time.sleep(0.005)


def dump(path: str, app: str, user: str, sid: str) -> None:
    """Print the session's event ids and state as one JSON line."""
    with SyncSessionService(LmdbStore(path)) as svc:
        s = svc.get_session(app_name=app, user_id=user, session_id=sid)
        if s is None:
            _say(json.dumps(None))
            return
        answer = {
            "ids": [e.id for e in s.events],
            "state": _jsonable(s.state),
            "revision": s.revision,
        }
        _say(json.dumps(answer))


def kill_append(path: str, app: str, user: str, sid: str, durability: str = "sync") -> None:
    """Append events forever (bounded); print each event id once its append returned.

    With deferred durability, also flush every 7 events and say "flushed".
    """
    deadline = time.monotonic() + MAX_SECONDS
    with SyncSessionService(LmdbStore(path, durability=durability)) as svc:
        s = svc.get_session(app_name=app, user_id=user, session_id=sid)
        if s is None:
            s = svc.create_session(app_name=app, user_id=user, session_id=sid)
        _say("ready", s.revision)
        for i in range(1_000_000):
            if time.monotonic() > deadline:
                break
            e = Event(author="child", content={"i": i, "pad": "x" * (i % 300)})
            e.actions = EventActions(state_delta={"last": e.id, "user:seen": i})
            svc.append_event(s, e)
            _say(e.id)
            if durability == "deferred" and i % 7 == 6:
                svc.flush()
                _say("flushed")


def concurrent(path: str, app: str, user: str, shared_sid: str, idx: str, n: str, go: str) -> None:
    """Append N locked events to a shared session and N to an own session."""
    me, count = int(idx), int(n)
    deadline = time.monotonic() + MAX_SECONDS
    with SyncSessionService(LmdbStore(path, durability="sync")) as svc:
        shared = svc.get_session(app_name=app, user_id=user, session_id=shared_sid)
        assert shared is not None
        own = svc.create_session(app_name=app, user_id=user, session_id=f"own-{me}")
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
            svc.append_event_locked(
                shared,
                Event(
                    author=f"w{me}",
                    content={"w": me, "i": i},
                    actions=EventActions(state_delta=delta),
                ),
            )
            svc.append_event_locked(
                own,
                Event(
                    author=f"w{me}",
                    content={"w": me, "i": i},
                    actions=EventActions(state_delta={"own": own.state.get("own", 0) + 1}),
                ),
            )
        _say("done")


def append_one(path: str, app: str, user: str, sid: str, event_id: str) -> None:
    """Read the session, append one event with the given id, print its revision."""
    with SyncSessionService(LmdbStore(path)) as svc:
        s = svc.get_session(app_name=app, user_id=user, session_id=sid)
        assert s is not None
        svc.append_event(s, Event(id=event_id, actions=EventActions(state_delta={"by": "child"})))
        _say(json.dumps({"revision": s.revision}))


def stale_reader(path: str, app: str, user: str, sid: str, go: str) -> None:
    """Read a session, wait for go, then append from the old copy; report the outcome."""
    deadline = time.monotonic() + MAX_SECONDS
    with SyncSessionService(LmdbStore(path)) as svc:
        s = svc.get_session(app_name=app, user_id=user, session_id=sid)
        assert s is not None
        _say("ready")
        _wait_for(Path(go), deadline)
        try:
            svc.append_event(s, Event(actions=EventActions(state_delta={"by": "stale"})))
        except Exception as exc:  # reported to the parent
            _say(json.dumps({"error": type(exc).__name__}))
        else:
            _say(json.dumps({"error": None}))


def grow_child(path: str, app: str, user: str, sid: str) -> None:
    """Open with a 1 MiB map, wait while the parent grows it, then read and write."""
    deadline = time.monotonic() + MAX_SECONDS
    with SyncSessionService(LmdbStore(path, map_size=1 << 20)) as svc:
        svc.create_session(app_name=app, user_id=user, session_id="child")
        _say("ready")
        line = sys.stdin.readline()
        if line.strip() != "go":
            raise SystemExit(f"unexpected {line!r}")
        big = svc.get_session(app_name=app, user_id=user, session_id=sid)
        assert big is not None
        sizes = [len(e.content) for e in big.events]
        child = svc.get_session(app_name=app, user_id=user, session_id="child")
        assert child is not None
        ids = []
        for i in range(40):
            if time.monotonic() > deadline:
                raise SystemExit("grow child ran out of time")
            e = Event(content=bytes([i % 256]) * (64 * 1024))
            svc.append_event(child, e)
            ids.append(e.id)
        _say(json.dumps({"events": len(sizes), "bytes": sum(sizes), "ids": ids}))


def fill_to_limit(path: str, durability: str, limit: str) -> None:
    """Append 8 KB events under a file size limit until a write is refused; report.

    The limit is the OS's own (RLIMIT_FSIZE): a write past it fails with EFBIG,
    as a write to a full disk fails with ENOSPC.
    """
    import resource
    import signal

    from sessionscope.errors import StoreError

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(limit), int(limit)))
    deadline = time.monotonic() + MAX_SECONDS
    report: dict[str, Any] = {"acknowledged": []}
    svc = SyncSessionService(LmdbStore(path, durability=durability))  # type: ignore[arg-type]
    s = svc.create_session(app_name="app", user_id="user", session_id="s")
    for n in range(5000):
        if time.monotonic() > deadline:
            raise SystemExit("fill_to_limit ran out of time")
        event = Event(author="agent", content={"blob": f"{n:08d}" * 1000})
        try:
            svc.append_event(s, event)
        except StoreError as error:
            report["error"] = {"type": type(error).__name__, "hint": error.hint}
            break
        report["acknowledged"].append(event.id)
    report["live"] = [e.id for e in s.events]
    stored = svc.get_session(app_name="app", user_id="user", session_id="s")
    report["stored"] = [e.id for e in stored.events] if stored else None
    _say(json.dumps(report))
    svc.close()


def no_pickle(path: str) -> None:
    """Run every operation on both services and stores; report whether pickle was imported."""
    import asyncio

    from sessionscope import MemoryStore, SessionService

    def scenario(svc: Any) -> None:
        s = svc.create_session(
            app_name="a", user_id="u", state={"k": [1, {"b": b"x"}], "app:a": 1, "user:u": 2}
        )
        svc.append_event(s, Event(content={"t": (1, 2)}, actions=EventActions({"x": None})))
        svc.append_event_locked(s, Event(actions=EventActions({"temp:t": 1, "y": 1.5})))
        svc.get_session(app_name="a", user_id="u", session_id=s.id)
        svc.list_sessions(app_name="a", limit=1)
        svc.get_user_state(app_name="a", user_id="u")
        svc.get_app_state(app_name="a")
        svc.delete_session(app_name="a", user_id="u", session_id=s.id)
        svc.flush()

    class Blocking:
        def __init__(self, inner: Any, loop: asyncio.AbstractEventLoop) -> None:
            self.inner, self.loop = inner, loop

        def __getattr__(self, name: str) -> Any:
            method = getattr(self.inner, name)
            return lambda *a, **k: self.loop.run_until_complete(method(*a, **k))

    for store in (
        MemoryStore(),
        LmdbStore(path + "-sync"),
        LmdbStore(path + "-deferred", durability="deferred"),
    ):
        with SyncSessionService(store) as svc:
            scenario(svc)
    loop = asyncio.new_event_loop()
    try:
        for store in (MemoryStore(), LmdbStore(path + "-async")):
            asvc = SessionService(store)
            scenario(Blocking(asvc, loop))
            loop.run_until_complete(asvc.close())
    finally:
        loop.close()
    _say(json.dumps(sorted(m for m in sys.modules if "pickle" in m)))


def _error_line(error: BaseException) -> str:
    return json.dumps(
        {"error": type(error).__name__, "message": str(error), "hint": getattr(error, "hint", None)}
    )


def read_then(path: str, sid: str, how: str) -> None:
    """Open the store, read a session, and end as ``how`` says while still reading.

    Inside a read transaction (which takes a reader slot), say "read", then:
    "exit": leave normally; "os_exit": os._exit; "hold": stay alive (a live
    reader) until a line comes on stdin, or until the parent kills this process.
    """
    import os

    try:
        store = LmdbStore(path)
        svc = SyncSessionService(store)
        found = svc.get_session(app_name="app", user_id="user", session_id=sid)
        assert found is not None
    except Exception as error:
        _say(_error_line(error))
        return

    def inside(txn: Any) -> None:
        _say("read")
        if how == "os_exit":
            os._exit(0)
        if how == "hold":
            sys.stdin.readline()
            os._exit(0)
        raise SystemExit(0)

    store._writer.read(inside)


def hold_open(path: str) -> None:
    """Open (or create) the store without a key, say "open", and close it at a line on stdin."""
    store = LmdbStore(path)
    _say("open")
    sys.stdin.readline()
    store.close()
    _say("closed")


def open_many(path: str, seconds: str) -> None:
    """Open, read and close the store again and again; report every failure."""
    from sessionscope.errors import StoreError

    deadline = time.monotonic() + float(seconds)
    opened = 0
    failures: list[str] = []
    for _ in range(10_000):
        if time.monotonic() > deadline:
            break
        try:
            with SyncSessionService(LmdbStore(path)) as svc:
                svc.list_sessions(app_name="app", user_id="user")
            opened += 1
        except (StoreError, Exception) as error:
            failures.append(f"{type(error).__module__}.{type(error).__name__}: {error}")
    _say(json.dumps({"opened": opened, "failures": failures[:5], "failed": len(failures)}))


def grow_until_told(path: str, limit_mb: str) -> None:
    """Append 256 KiB events (the store grows past every map others opened) until stdin
    says stop or the store holds ``limit_mb`` MiB."""
    import select

    store = LmdbStore(path, map_size=1 << 20, durability="deferred")
    blob = "x" * (256 << 10)
    with SyncSessionService(store) as svc:
        session = svc.create_session(app_name="app", user_id="grower")
        deadline = time.monotonic() + MAX_SECONDS
        said = False
        for n in range(int(limit_mb) * 4):
            if time.monotonic() > deadline or select.select([sys.stdin], [], [], 0)[0]:
                break
            svc.append_event(session, Event(author="g", content={"blob": blob}))
            if n == 300 and not said:
                # Past the 64 MiB map an opener asks for: from now on every
                # commit grows the store past the map an opener just made.
                _say("growing")
                said = True
        _say(json.dumps({"map_size": store.stat()["map_size"]}))


def grow_then_wait(path: str, grown_mb: str) -> None:
    """Grow a deferred store from a 1 MiB map past ``grown_mb`` MiB, say "grown", wait for a
    line on stdin, then append 200 events of 64 KiB more (growing on) and say what it has."""
    store = LmdbStore(path, map_size=1 << 20, durability="deferred")
    blob = "x" * (64 << 10)
    with SyncSessionService(store) as svc:
        session = svc.create_session(app_name="app", user_id="grower")
        appended = 0
        while store.stat()["map_size"] < int(grown_mb) << 20 and appended < 10_000:
            svc.append_event(session, Event(author="g", content={"blob": blob}))
            appended += 1
        _say("grown")
        sys.stdin.readline()
        for _ in range(200):
            svc.append_event(session, Event(author="g", content={"blob": blob}))
            appended += 1
        svc.flush()
        _say(json.dumps({"appended": appended, "session": session.id}))


def _hold_until(release: str, seconds: str) -> None:
    """Say "held", wait for the release file (or time to run out), then say which came."""
    _say("held")
    deadline = time.monotonic() + float(seconds)
    how = "timeout"
    while time.monotonic() < deadline:
        if Path(release).exists():
            how = "file"
            break
        time.sleep(0.002)
    _say(how)


def hold_write_lock(path: str, release: str, seconds: str) -> None:
    """Hold LMDB's write lock, as another program would, until a file appears."""
    import lmdb

    env = lmdb.open(path, max_dbs=8)
    txn = env.begin(write=True)
    _hold_until(release, seconds)
    txn.abort()
    env.close()


def hold_store_writer_lock(path: str, release: str, seconds: str) -> None:
    """Hold a store's writer lock, as a writer about to begin does, until a file appears."""
    store = LmdbStore(path, durability="deferred")
    store._writer.writer_lock.acquire()
    _hold_until(release, seconds)
    store._writer.writer_lock.release()
    store.close()


def foreign_open(path: str) -> None:
    """Keep another application's LMDB database open (not a store) until stdin closes."""
    import lmdb

    env = lmdb.open(path, max_dbs=4)
    other = env.open_db(b"other")
    with env.begin(write=True) as txn:
        txn.put(b"key", b"value", db=other)
    _say("open")
    sys.stdin.readline()
    env.close()


def refused_growth(path: str) -> None:
    """Fill a store near its map, then forbid the address space to grow it; report."""
    import resource

    from sessionscope.errors import StoreError

    store = LmdbStore(path, map_size=32 << 20, durability="deferred")
    svc = SyncSessionService(store)
    session = svc.create_session(app_name="app", user_id="user", session_id="s")
    blob = "x" * (3 << 20)
    for _ in range(8):
        svc.append_event(session, Event(author="a", content={"blob": blob}))
    with open("/proc/self/status") as status:
        vm = next(int(line.split()[1]) for line in status if line.startswith("VmSize:"))
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, ((vm << 10) + (24 << 20), hard))
    report: dict[str, Any] = {}
    try:
        for _ in range(8):
            svc.append_event(session, Event(author="a", content={"blob": blob}))
    except StoreError as error:
        report["error"] = {"type": type(error).__name__, "hint": error.hint}
    # The store reads on at its size (records only: the events would not fit the limit).
    (record,) = store.list_sessions("app", "user")
    report["events_after_refusal"] = record.event_count
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    svc.append_event(session, Event(author="a", content={"blob": blob}))
    stored = svc.get_session(app_name="app", user_id="user", session_id="s")
    report["events_after_limit_lifted"] = len(stored.events) if stored else None
    svc.close()
    _say(json.dumps(report))


def append_under_interrupts(path: str, durability: str, seconds: str) -> None:
    """Append while SIGINT arrives every fraction of a millisecond; then append and close.

    A thread of this process sends the signals, so that they fall anywhere:
    between a lock taken and the ``try`` meant to release it, in a store's
    ``__exit__``, in a wait for the writer thread. Each KeyboardInterrupt is
    caught and the loop goes on. The handler raises only in what the loop
    calls, never in the loop's own code: a KeyboardInterrupt raised at the
    loop's jump back, or in one of its handlers, would escape them and end
    the child (seen in CI). Then, signals stopped, one more append and
    ``close()`` must each end within 10 s (each runs in a thread so that a
    lock left held shows as a timeout, not a hang). Prints one JSON line:
    the ids whose append returned, and whether the last append and the close ended.
    """
    import inspect
    import os
    import signal
    import threading
    from types import FrameType

    store = LmdbStore(path, durability=durability)  # type: ignore[arg-type]
    svc = SyncSessionService(store)
    svc.create_session(app_name="app", user_id="user", session_id="s")
    stop = threading.Event()

    def send() -> None:
        for _ in range(100_000):
            if stop.wait(0.0002):
                return
            os.kill(os.getpid(), signal.SIGINT)

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # not before the loop is ready
    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    acknowledged: list[str] = []
    interrupts = 0
    end = time.monotonic() + float(seconds)
    here = inspect.currentframe()
    loop_code = None if here is None else here.f_code

    def interrupt(signum: int, frame: FrameType | None) -> None:
        if frame is None or frame.f_code is not loop_code:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, interrupt)
    while True:
        try:
            try:
                if time.monotonic() > end:
                    # Inside the handlers: signal.signal runs a pending
                    # handler first. Interrupts pending when it returns are
                    # dropped.
                    signal.signal(signal.SIGINT, signal.SIG_IGN)
                    break
                session = svc.get_session(app_name="app", user_id="user", session_id="s")
                assert session is not None
                event = svc.append_event(session, Event(author="a", content="storm"))
                acknowledged.append(event.id)
            except KeyboardInterrupt:
                interrupts += 1
        except KeyboardInterrupt:  # landed in the handler of the one before
            interrupts += 1
    stop.set()
    sender.join(10)

    def last_append() -> None:
        session = svc.get_session(app_name="app", user_id="user", session_id="s")
        assert session is not None
        acknowledged.append(svc.append_event(session, Event(author="a", content="after")).id)

    ended = {}
    for name, step in (("appended", last_append), ("closed", store.close)):
        worker = threading.Thread(target=step, daemon=True)
        worker.start()
        worker.join(10)
        ended[name] = not worker.is_alive()
        if worker.is_alive():
            break
    _say(json.dumps({"acknowledged": acknowledged, "interrupts": interrupts, **ended}))
    if not ended.get("closed"):
        os._exit(0)  # a lock is held for good: interpreter exit would wait on it too


COMMANDS = {
    "read_then": read_then,
    "open_many": open_many,
    "hold_open": hold_open,
    "grow_until_told": grow_until_told,
    "grow_then_wait": grow_then_wait,
    "hold_write_lock": hold_write_lock,
    "hold_store_writer_lock": hold_store_writer_lock,
    "refused_growth": refused_growth,
    "foreign_open": foreign_open,
    "dump": dump,
    "kill_append": kill_append,
    "concurrent": concurrent,
    "append_one": append_one,
    "stale_reader": stale_reader,
    "grow_child": grow_child,
    "no_pickle": no_pickle,
    "fill_to_limit": fill_to_limit,
    "append_under_interrupts": append_under_interrupts,
}


if __name__ == "__main__":
    COMMANDS[sys.argv[1]](*sys.argv[2:])
