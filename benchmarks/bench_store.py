"""Append, read and list: sessionscope against raw LMDB and google-adk's services.

Under pytest-benchmark (each comparison in one run, grouped)::

    pytest benchmarks/bench_store.py --benchmark-only

Groups:

- ``append``: durable, deferred and in-memory native appends, the ADK adapter,
  raw LMDB put+commit with and without fsync (the floor), ADK's
  ``InMemorySessionService``, ``SqliteSessionService`` and
  ``DatabaseSessionService`` on SQLite;
- ``append at N`` / ``get10 at N``: one append and ``get_session(num_recent_events=10)``
  on a session holding 100, 1,000 and 10,000 events (flat for sessionscope);
- ``get full N``: a whole session of 50 and 500 events;
- ``list 10000``: ``list_sessions`` of an app with 10,000 sessions, and the
  native paged list (first page of 100).

ADK's SQL services take milliseconds per call, so they run fewer rounds and
stop at the sizes they can fill in seconds.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lmdb
import pytest

from sessionscope import codec
from sessionscope.bench.replay import Target, open_target
from sessionscope.service import SyncSessionService

TEXT = "Here is what I found about your order and the delivery window. " * 12
NATIVE = ("lmdb-durable", "lmdb-deferred", "memory")
ADK = ("adk-memory", "adk-sqlite", "adk-database", "adk-lmdb")
SLOW = {"adk-sqlite", "adk-database", "lmdb-durable", "adk-lmdb", "raw-sync"}
_ids = itertools.count()


def event_record(number: int) -> dict[str, Any]:
    """Return a realistic model event of about 1 KB with a small state delta."""
    return {
        "id": f"ev-{next(_ids):012d}",
        "timestamp": 1_767_225_600.0 + number / 1000,
        "author": "model",
        "invocation_id": f"inv-{number // 4}",
        "content": {"role": "model", "parts": [{"text": TEXT}]},
        "actions": {"state_delta": {"turn": number, "user:seen": number, "temp:step": 1}},
    }


def _uri(kind: str, directory: Path) -> str:
    return {
        "lmdb-durable": f"lmdb://{directory / 'store'}?durability=sync",
        "lmdb-deferred": f"lmdb://{directory / 'store'}?durability=deferred",
        "memory": "memory://",
        "adk-memory": "adk-memory://",
        "adk-sqlite": f"adk-sqlite://{directory / 'adk.db'}",
        "adk-database": f"adk-database://sqlite+aiosqlite:///{directory / 'db.db'}",
        "adk-lmdb": f"adk-lmdb://{directory / 'adk-lmdb'}?durability=sync",
    }[kind]


@pytest.fixture
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    """Yield the target named by the test's ``kind`` parameter, on a fresh directory."""
    kind = request.param
    if kind.startswith("adk"):
        pytest.importorskip("google.adk")
    if kind == "adk-lmdb":
        pytest.importorskip("sessionscope.adk")
    directory = Path(tempfile.mkdtemp(prefix="sessionscope-bench-"))
    opened = open_target(_uri(kind, directory))
    opened.name = kind
    try:
        yield opened
    finally:
        opened.close()
        shutil.rmtree(directory, ignore_errors=True)


def _rounds(kind: str, fast: int = 2000, slow: int = 60) -> int:
    return slow if kind in SLOW else fast


def _session(target: Target, events: int, sid: str = "s") -> tuple[str, str, str]:
    """Create a session and fill it with ``events`` events (bulk path where there is one)."""
    key = ("bench", "user", sid)
    target.create(*key, {"user:tier": "pro"})
    for start in range(0, events, 500):
        batch = [
            (key, target.make_event(event_record(n)))
            for n in range(start, min(events, start + 500))
        ]
        target.append_many(batch)
    return key


# -- append --------------------------------------------------------------------------


@pytest.mark.parametrize("target", [*NATIVE, *ADK], indirect=True)
def test_append(benchmark: Any, target: Target) -> None:
    """Append one event to a session."""
    key = _session(target, 0)
    benchmark.group = "append"
    benchmark.name = f"append_{target.name}"
    benchmark.pedantic(
        lambda event: target.append(key, event),
        setup=lambda: ((target.make_event(event_record(0)),), {}),
        rounds=_rounds(target.name),
        warmup_rounds=3,
    )


@pytest.mark.parametrize("sync", [True, False], ids=["raw-sync", "raw-nosync"])
def test_append_raw_lmdb(benchmark: Any, tmp_path: Path, sync: bool) -> None:
    """Put one packed event and commit: the floor any LMDB store pays."""
    env = lmdb.open(str(tmp_path / "raw"), map_size=1 << 30, sync=sync, metasync=sync)
    data = codec.pack(event_record(0))
    keys = (n.to_bytes(8, "big") for n in itertools.count())

    def put() -> None:
        with env.begin(write=True) as txn:
            txn.put(next(keys), data)

    benchmark.group = "append"
    benchmark.name = f"append_raw_lmdb_{'fsync' if sync else 'nofsync'}"
    try:
        benchmark.pedantic(put, rounds=_rounds("raw-sync" if sync else "raw"), warmup_rounds=3)
    finally:
        env.close()


# -- cost against session length --------------------------------------------------


def _length_cases() -> list[Any]:
    cases = []
    for kind in ("lmdb-deferred", "adk-memory", "adk-sqlite"):
        for size in (100, 1000, 10_000):
            if kind == "adk-sqlite" and size > 1000:
                continue  # ADK's SQLite appends one by one: 10,000 take a minute to fill
            cases.append(pytest.param(kind, size, id=f"{kind}-{size}"))
    return cases


@pytest.mark.parametrize(("target", "size"), _length_cases(), indirect=["target"])
def test_append_at_length(benchmark: Any, target: Target, size: int) -> None:
    """Append one event to a session that holds ``size`` events."""
    key = _session(target, size)
    benchmark.group = f"append at {size}"
    benchmark.name = f"append_at_{size}_{target.name}"
    benchmark.pedantic(
        lambda event: target.append(key, event),
        setup=lambda: ((target.make_event(event_record(size)),), {}),
        rounds=_rounds(target.name, 300, 30),
    )


@pytest.mark.parametrize("keys", [10, 1000])
@pytest.mark.parametrize("target", ["lmdb-deferred", "lmdb-durable"], indirect=True)
def test_append_with_state_size(benchmark: Any, target: Target, keys: int) -> None:
    """Append to a session whose state holds ``keys`` keys: the cost must not follow it.

    State is stored one entry per key, so an append writes only what its delta
    touches; 10 keys and 1,000 keys should cost the same.
    """
    key = ("bench", "user", "s")
    target.create(*key, {f"k{n}": {"n": n, "text": TEXT[:64]} for n in range(keys)})
    benchmark.group = f"append with state of n keys ({target.name})"
    benchmark.name = f"append_state_{keys}_keys_{target.name}"
    benchmark.pedantic(
        lambda event: target.append(key, event),
        setup=lambda: ((target.make_event(event_record(0)),), {}),
        rounds=_rounds(target.name, 1000, 60),
    )


@pytest.mark.parametrize(("target", "size"), _length_cases(), indirect=["target"])
def test_get_recent_at_length(benchmark: Any, target: Target, size: int) -> None:
    """Read the last 10 events of a session that holds ``size`` events."""
    key = _session(target, size)
    benchmark.group = f"get10 at {size}"
    benchmark.name = f"get10_at_{size}_{target.name}"
    benchmark.pedantic(
        lambda: target.get(*key, {"num_recent_events": 10}), rounds=_rounds(target.name, 300, 30)
    )


@pytest.mark.parametrize("size", [50, 500])
@pytest.mark.parametrize(
    "target", ["lmdb-deferred", "memory", "adk-memory", "adk-sqlite", "adk-database"], indirect=True
)
def test_get_full(benchmark: Any, target: Target, size: int) -> None:
    """Read a whole session of ``size`` events."""
    key = _session(target, size)
    benchmark.group = f"get full {size}"
    benchmark.name = f"get_full_{size}_{target.name}"
    benchmark.pedantic(lambda: target.get(*key, None), rounds=_rounds(target.name, 200, 20))


# -- listing ------------------------------------------------------------------------


SESSIONS = 10_000


def _fill_sessions(target: Target, count: int) -> None:
    if isinstance(getattr(target, "service", None), SyncSessionService):
        for number in range(count):
            target.create("bench", f"user-{number % 100}", f"s-{number}", {"n": number})
        return
    service = target.service  # type: ignore[attr-defined]

    async def create_all() -> None:
        for number in range(count):
            await service.create_session(
                app_name="bench", user_id=f"user-{number % 100}", session_id=f"s-{number}",
                state={"n": number},
            )  # fmt: skip

    target._run(create_all())  # type: ignore[attr-defined]


@pytest.mark.parametrize("target", ["lmdb-deferred", "memory", "adk-memory"], indirect=True)
def test_list_sessions(benchmark: Any, target: Target) -> None:
    """List every session of an app of 10,000 sessions (100 users)."""
    _fill_sessions(target, SESSIONS)
    benchmark.group = f"list {SESSIONS}"
    benchmark.name = f"list_{SESSIONS}_{target.name}"
    result = benchmark.pedantic(lambda: target.listing("bench", None), rounds=10)
    sessions = result.sessions
    assert len(sessions) == SESSIONS


@pytest.mark.parametrize("target", ["lmdb-deferred", "memory"], indirect=True)
def test_list_sessions_paged(benchmark: Any, target: Target) -> None:
    """Read the first page of 100 of an app of 10,000 sessions: the native paged list."""
    _fill_sessions(target, SESSIONS)
    service: SyncSessionService = target.service  # type: ignore[attr-defined]
    benchmark.group = f"list {SESSIONS}"
    benchmark.name = f"list_{SESSIONS}_paged100_{target.name}"
    page = benchmark.pedantic(lambda: service.list_sessions(app_name="bench", limit=100), rounds=10)
    assert len(page.sessions) == 100


if __name__ == "__main__":
    raise SystemExit(
        pytest.main([__file__, "--benchmark-only", "--benchmark-columns=median,iqr,rounds"])
    )
