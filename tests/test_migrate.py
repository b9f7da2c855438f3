"""Migrating from google-adk's own SqliteSessionService and DatabaseSessionService.

The sources are real ADK stores filled through ADK's own API; the copies are
read back through ADK's API on both sides (the store's side through the
drop-in service) and compared field by field.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("google.adk")

from google.adk.events import Event, EventActions
from google.adk.sessions import BaseSessionService
from google.adk.sessions.database_session_service import DatabaseSessionService
from google.genai import types

import _stores
from _adk_helpers import realistic_event, rich_event, sqlite_service
from _stores import StoreFactory
from sessionscope import LmdbStore
from sessionscope.adk import _AdkService
from sessionscope.adk.migrate import MigrationReport, migrate_from_adk

store_factory = _stores.store_factory

APPS = ("shop", "clinic")
USERS = ("ada", "bob", "carol")
SESSIONS_PER_USER = 3


def _text(text: str, stamp: float, delta: dict[str, Any] | None = None) -> Event:
    return Event(
        author="user",
        invocation_id="inv",
        timestamp=stamp,
        content=types.Content(role="user", parts=[types.Part(text=text)]),
        actions=EventActions(state_delta=delta or {}),
    )


def _call(stamp: float) -> Event:
    return Event(
        author="agent",
        invocation_id="inv",
        timestamp=stamp,
        content=types.Content(
            role="model",
            parts=[types.Part(function_call=types.FunctionCall(id="c1", name="f", args={"a": 1}))],
        ),
    )


def _response(stamp: float) -> Event:
    return Event(
        author="agent",
        invocation_id="inv",
        timestamp=stamp,
        content=types.Content(
            role="user",
            parts=[
                types.Part(
                    function_response=types.FunctionResponse(
                        id="c1", name="f", response={"ok": [1, None, {"x": "y"}]}
                    )
                )
            ],
        ),
    )


def _blob(stamp: float) -> Event:
    return Event(
        author="agent",
        invocation_id="inv",
        timestamp=stamp,
        content=types.Content(
            role="model",
            parts=[types.Part(inline_data=types.Blob(mime_type="image/png", data=b"\x89PNG\x00"))],
        ),
    )


async def _fill(service: BaseSessionService) -> int:
    """Fill an ADK service through its own API; return how many events it took."""
    events = 0
    base = time.time() - 10_000
    for a, app in enumerate(APPS):
        for u, user in enumerate(USERS):
            for n in range(SESSIONS_PER_USER):
                session = await service.create_session(
                    app_name=app,
                    user_id=user,
                    session_id=f"{user}-{n}",
                    state={"app:tier": "gold", f"user:n{n}": n, "topic": f"t{n}", "temp:x": 1},
                )
                if n == 0 and u == 0:
                    continue  # a session without events
                stamp = base + a * 1000 + u * 100 + n * 10
                batch = [
                    _text("hello", stamp, {"turn": 1, "app:count": n, "user:last": app}),
                    _call(stamp + 1),
                    _response(stamp + 2),
                    _blob(stamp + 3),
                    # An event older than the ones before it.
                    _text("late", stamp - 5, {"late": True, "temp:t": 2}),
                    realistic_event(n, timestamp=stamp + 4),
                    rich_event(timestamp=stamp + 5),
                ]
                for event in batch:
                    await service.append_event(session, event)
                events += len(batch)
    return events


@pytest.fixture(scope="module")
def adk_sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, int]]:
    """Build one SqliteSessionService and one DatabaseSessionService file, filled alike."""
    base = tmp_path_factory.mktemp("adk")

    async def build() -> dict[str, tuple[Path, int]]:
        sqlite_path = base / "sqlite.db"
        sqlite = sqlite_service(str(sqlite_path))
        sqlite_events = await _fill(sqlite)
        await sqlite.close()
        database_path = base / "database.db"
        database = DatabaseSessionService(db_url=f"sqlite+aiosqlite:///{database_path}")
        database_events = await _fill(database)
        await database.close()
        return {
            "sqlite": (sqlite_path, sqlite_events),
            "database": (database_path, database_events),
        }

    return asyncio.run(build())


def _source(adk_sources: dict[str, tuple[Path, int]], kind: str, tmp_path: Path) -> str:
    """Copy a filled source into the test's directory; return its URL as ADK reads it."""
    original, _ = adk_sources[kind]
    path = tmp_path / original.name
    shutil.copy(original, path)
    if kind == "sqlite":
        # ADK reads sqlite:///x as the relative path x: an absolute one takes four slashes.
        return f"sqlite:///{path}"
    return f"sqlite+aiosqlite:///{path}"


def _open_source(url: str) -> BaseSessionService:
    if url.startswith("sqlite+aiosqlite"):
        return DatabaseSessionService(db_url=url)
    return sqlite_service(url.removeprefix("sqlite:///"))


def _target(store: Any) -> Any:
    """Return the ADK drop-in service over a store of any kind."""
    return _AdkService(store)


async def _compare_all(url: str, store: Any) -> int:
    """Compare every session of the source and the store through ADK's API; return the count."""
    source = _open_source(url)
    target = _target(store)
    compared = 0
    try:
        for app in APPS:
            theirs = (await source.list_sessions(app_name=app)).sessions
            ours = (await target.list_sessions(app_name=app)).sessions
            assert sorted((s.user_id, s.id) for s in theirs) == sorted(
                (s.user_id, s.id) for s in ours
            )
            for meta in theirs:
                key = {"app_name": app, "user_id": meta.user_id, "session_id": meta.id}
                a = await source.get_session(**key)
                b = await target.get_session(**key)
                assert a is not None and b is not None
                assert a.state == b.state
                assert a.last_update_time == b.last_update_time
                assert [e.model_dump() for e in a.events] == [e.model_dump() for e in b.events]
                assert [e.timestamp for e in a.events] == [e.timestamp for e in b.events]
                compared += 1
            for user in USERS:
                assert await source.get_user_state(
                    app_name=app, user_id=user
                ) == await target.get_user_state(app_name=app, user_id=user)
    finally:
        await source.close()
    return compared


TOTAL_SESSIONS = len(APPS) * len(USERS) * SESSIONS_PER_USER


@pytest.mark.parametrize("kind", ["sqlite", "database"])
def test_migration_copies_everything_exactly(
    store_factory: StoreFactory,
    adk_sources: dict[str, tuple[Path, int]],
    tmp_path: Path,
    kind: str,
) -> None:
    url = _source(adk_sources, kind, tmp_path)
    store = store_factory()
    handled: list[int] = []
    report = migrate_from_adk(url, store, progress=handled.append)
    events = adk_sources[kind][1]
    assert report == MigrationReport(
        apps=2,
        users=6,
        sessions=TOTAL_SESSIONS,
        events=events,
        copied=TOTAL_SESSIONS,
        skipped=0,
        differences=[],
    )
    assert sum(handled) == TOTAL_SESSIONS + events
    assert asyncio.run(_compare_all(url, store)) == TOTAL_SESSIONS
    # Running again writes no session and finds no difference.
    revisions = {
        (r.app_name, r.user_id, r.session_id): r.marker
        for app in APPS
        for r in store.list_sessions(app, None)
    }
    again = migrate_from_adk(url, store)
    assert (again.copied, again.skipped, again.differences) == (0, TOTAL_SESSIONS, [])
    assert {
        (r.app_name, r.user_id, r.session_id): r.marker
        for app in APPS
        for r in store.list_sessions(app, None)
    } == revisions


def test_an_interrupted_migration_resumes(
    store_factory: StoreFactory, adk_sources: dict[str, tuple[Path, int]], tmp_path: Path
) -> None:
    url = _source(adk_sources, "sqlite", tmp_path)
    store = store_factory()
    seen: list[int] = []

    def stop_after_five(records: int) -> None:
        seen.append(records)
        if len(seen) == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        migrate_from_adk(url, store, progress=stop_after_five)
    stored = sum(len(store.list_sessions(app, None)) for app in APPS)
    assert stored == 5
    report = migrate_from_adk(url, store)
    assert (report.copied, report.skipped, report.differences) == (TOTAL_SESSIONS - 5, 5, [])
    assert asyncio.run(_compare_all(url, store)) == TOTAL_SESSIONS


def test_migrating_one_app(store_factory: StoreFactory, adk_sources: Any, tmp_path: Path) -> None:
    url = _source(adk_sources, "database", tmp_path)
    store = store_factory()
    report = migrate_from_adk(url, store, app_name="clinic")
    assert (report.apps, report.sessions, report.differences) == (1, TOTAL_SESSIONS // 2, [])
    assert store.list_apps() == ["clinic"]
    assert migrate_from_adk(url, store, app_name="nowhere").sessions == 0


def test_a_session_changed_in_the_store_is_reported_not_overwritten(
    store_factory: StoreFactory, adk_sources: Any, tmp_path: Path
) -> None:
    url = _source(adk_sources, "sqlite", tmp_path)
    store = store_factory()
    migrate_from_adk(url, store)

    async def append_one() -> None:
        target = _target(store)
        session = await target.get_session(app_name="shop", user_id="bob", session_id="bob-1")
        await target.append_event(session, _text("after the move", time.time()))

    asyncio.run(append_one())
    report = migrate_from_adk(url, store)
    assert report.skipped == TOTAL_SESSIONS - 1
    assert any("shop/bob/bob-1" in line and "other content" in line for line in report.differences)
    assert any("shop/bob/bob-1" in line and "events" in line for line in report.differences)
    kept = store.load_session("shop", "bob", "bob-1", None, None)
    assert kept is not None and len(kept.events) == 8


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("sqlite:///{dir}/missing.db", "no existing database"),
        ("sqlite+aiosqlite:///{dir}/missing.db", "no existing database"),
        ("memory://", "not a source migrate reads"),
        ("nosuchdriver://x/y", "not a source migrate reads"),
        ("not a url", "source_url"),
    ],
)
def test_bad_sources_are_refused_and_create_nothing(
    store_factory: StoreFactory, tmp_path: Path, url: str, match: str
) -> None:
    store = store_factory()
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(ValueError, match=match):
        migrate_from_adk(url.format(dir=tmp_path), store)
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert store.list_apps() == []


def test_bad_arguments(store_factory: StoreFactory) -> None:
    store = store_factory()
    with pytest.raises(ValueError, match="source_url"):
        migrate_from_adk(3, store)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="app_name"):
        migrate_from_adk("sqlite:///x.db", store, app_name="")
    assert store.list_apps() == []


# Each session's progress is printed once it is stored; the pause leaves the
# parent time to kill the child midway.
_CHILD = """
import sys
import time
from sessionscope import LmdbStore
from sessionscope.adk.migrate import migrate_from_adk

def say(records):
    print(records, flush=True)
    time.sleep(0.1)

migrate_from_adk(sys.argv[1], LmdbStore(sys.argv[2]), progress=say)
print("done", flush=True)
"""


@pytest.mark.slow
def test_a_migration_killed_midway_resumes(
    adk_sources: dict[str, tuple[Path, int]], tmp_path: Path
) -> None:
    url = _source(adk_sources, "database", tmp_path)
    target = tmp_path / "store"
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, url, str(target)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=_stores.child_env(),
    )
    try:
        assert child.stdout is not None
        reported = [child.stdout.readline() for _ in range(4)]
        assert all(line.strip().isdigit() for line in reported)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=30)
        if child.stdout is not None:
            child.stdout.close()
    store = LmdbStore(target)
    try:
        already = sum(len(store.list_sessions(app, None)) for app in APPS)
        assert 4 <= already < TOTAL_SESSIONS
        report = migrate_from_adk(url, store)
        assert report.skipped == already
        assert report.copied == TOTAL_SESSIONS - already
        assert report.differences == []
        assert asyncio.run(_compare_all(url, store)) == TOTAL_SESSIONS
    finally:
        store.close()
