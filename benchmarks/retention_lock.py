"""How long retention holds the LMDB write lock, batch by batch, on a large store.

Run as a script (it is not a pytest-benchmark module)::

    python benchmarks/retention_lock.py [--sessions 20000] [--events 10] [--long 100000]

It fills a durable store (in bulk, deferred), reopens it with
``durability="sync"``, then times every write transaction (begin to commit,
fsync included: the span another process's append would wait) of
``truncate_events(keep_last=10)`` on a session of ``--long`` events, of
``truncate_events(before=...)`` on another, and of ``expire_sessions`` over
``--sessions`` idle sessions. Prints the transaction count, and the median
and maximum of each transaction's span and of the work done inside it (the
rest is the commit: fsync and page writes).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sessionscope import Event, EventActions, LmdbStore, SyncSessionService


def fill(path: Path, sessions: int, events: int, long: int) -> None:
    old = time.time() - 86_400
    with SyncSessionService(LmdbStore(path, durability="deferred")) as svc:
        batch: list[tuple[Any, Event]] = []
        for n in range(sessions):
            session = svc.create_session(app_name="app", user_id=f"u{n % 100}", session_id=f"s{n}")
            for i in range(events):
                delta = {"step": i, "user:seen": n}
                batch.append(
                    (
                        session,
                        Event(
                            author="a",
                            timestamp=old + i,
                            content={"t": "x" * 200},
                            actions=EventActions(state_delta=delta),
                        ),
                    )
                )
            if len(batch) >= 5000:
                svc.append_many(batch)
                batch.clear()
        for sid in ("long-keep", "long-before"):
            session = svc.create_session(app_name="app", user_id="heavy", session_id=sid)
            for i in range(long):
                batch.append((session, Event(author="a", timestamp=float(i), content={"i": i})))
                if len(batch) >= 5000:
                    svc.append_many(batch)
                    batch.clear()
        svc.append_many(batch)


def timed(store: LmdbStore, spans: list[tuple[float, float]]) -> None:
    """Record each write transaction's span (begin to commit) and the work done inside it."""
    run_writes: Callable[..., Any] = store._run_writes

    def measured(actions: Any) -> Any:
        work = [0.0]

        def timed_action(action: Callable[[Any], Any]) -> Callable[[Any], Any]:
            def run(txn: Any) -> Any:
                began = time.perf_counter()
                try:
                    return action(txn)
                finally:
                    work[0] += time.perf_counter() - began

            return run

        started = time.perf_counter()
        try:
            return run_writes([timed_action(action) for action in actions])
        finally:
            spans.append((time.perf_counter() - started, work[0]))

    store._run_writes = measured  # type: ignore[method-assign]


def report(name: str, spans: list[tuple[float, float]], total: float, removed: int) -> None:
    held = [s[0] * 1000 for s in spans]
    work = [s[1] * 1000 for s in spans]
    print(
        f"{name:<24} {removed:>6} removed in {total:5.2f} s, {len(held):>4} txns; "
        f"lock held median {statistics.median(held):6.2f} ms, max {max(held):6.2f} ms "
        f"(work inside: median {statistics.median(work):5.2f}, max {max(work):5.2f})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=20_000)
    parser.add_argument("--events", type=int, default=10)
    parser.add_argument("--long", type=int, default=100_000)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "store"
        started = time.perf_counter()
        fill(path, options.sessions, options.events, options.long)
        size = (path / "data.mdb").stat().st_size
        print(f"filled in {time.perf_counter() - started:.1f} s, data.mdb {size / 1e6:.0f} MB")
        store = LmdbStore(path, durability="sync")
        svc = SyncSessionService(store)
        for name, call in (
            (
                "truncate keep_last=10",
                lambda: svc.truncate_events(
                    app_name="app", user_id="heavy", session_id="long-keep", keep_last=10
                ),
            ),
            (
                "truncate before=(90%)",
                lambda: svc.truncate_events(
                    app_name="app",
                    user_id="heavy",
                    session_id="long-before",
                    before=options.long * 0.9,
                ),
            ),
            ("expire_sessions idle 1h", lambda: svc.expire_sessions(idle_for=3600)),
        ):
            spans: list[tuple[float, float]] = []
            timed(store, spans)
            started = time.perf_counter()
            removed = call()
            report(name, spans, time.perf_counter() - started, removed)
            store._run_writes = LmdbStore._run_writes.__get__(store)  # type: ignore[method-assign]
        store.close()


if __name__ == "__main__":
    main()
