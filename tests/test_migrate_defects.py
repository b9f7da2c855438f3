"""Migration from google-adk: sources the store must refuse, and sources it must not touch.

Every source is built through ADK's own public API (or, for a foreign
database, through sqlite3); every refusal is checked to have written nothing
to the target and changed nothing at the source.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sqlite3
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("google.adk")

from google.adk.events import Event, EventActions
from google.adk.sessions.database_session_service import DatabaseSessionService

import _stores
from _adk_helpers import sqlite_service
from sessionscope import LmdbStore, MemoryStore
from sessionscope.adk import migrate as migrate_module
from sessionscope.adk.migrate import migrate_from_adk
from sessionscope.codec import pack
from sessionscope.stores.records import ENCRYPTION_MARKER_APP

pytestmark = pytest.mark.adk

Filler = Callable[[Any], Awaitable[None]]


def _sqlite_source(path: Path, fill: Filler) -> str:
    async def build() -> None:
        service = sqlite_service(str(path))
        await fill(service)
        await service.close()

    asyncio.run(build())
    return f"sqlite:///{path}"


def _database_source(path: Path, fill: Filler) -> str:
    url = f"sqlite+aiosqlite:///{path}"

    async def build() -> None:
        service = DatabaseSessionService(url)
        await fill(service)
        await service.close()

    asyncio.run(build())
    return url


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sessionscope", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**_stores.child_env(), "PYTHONWARNINGS": "error"},
        check=False,
    )


async def _event(service: Any, app: str, user: str, sid: str, **state: Any) -> None:
    session = await service.create_session(
        app_name=app, user_id=user, session_id=sid, state=state or None
    )
    await service.append_event(session, Event(author="agent", invocation_id="i"))


# -- the app name that holds a store's encryption marker -------------------------


def test_a_source_with_the_reserved_app_name_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    target = tmp_path / "store"
    store = LmdbStore(target)
    try:
        store.write_user_state("shop", "ada", [("keep", pack("me"))])
    finally:
        store.close()

    async def fill(service: Any) -> None:
        await _event(service, "a-first", "u", "s", **{"app:k": 1})
        await _event(service, ENCRYPTION_MARKER_APP, "u", "s", **{"app:k": 1})

    url = _sqlite_source(tmp_path / "adk.db", fill)
    store = LmdbStore(target)
    try:
        with pytest.raises(ValueError, match="reserved") as refused:
            migrate_from_adk(url, store)
    finally:
        store.close()
    assert "nothing was written" in str(refused.value)
    # The store still opens (no encryption marker was forged) and holds what it held.
    store = LmdbStore(target)
    try:
        assert store.read_user_state("shop", "ada") == {"keep": "me"}
        assert store.read_app_state("a-first") == {}
    finally:
        store.close()


# -- ids the service refuses or changes ------------------------------------------


@pytest.mark.parametrize(
    ("kind", "user", "sid", "match"),
    [
        ("database", "u", " pad ", "surrounding whitespace"),
        ("database", "u", "\tpad", "surrounding whitespace"),
        ("sqlite", "", "s", "user_id must not be empty"),
        ("sqlite", "u", "x" * 5000, "5000 bytes"),
    ],
)
def test_a_session_with_an_id_the_service_refuses_is_refused_up_front(
    tmp_path: Path, kind: str, user: str, sid: str, match: str
) -> None:
    async def fill(service: Any) -> None:
        # A good session on either side of the bad one, in the copy's order.
        await _event(service, "app", "a", "good-1", **{"app:k": 1, "user:k": 2})
        await _event(service, "app", user, sid)
        await _event(service, "app", "zz", "good-2")

    make = _database_source if kind == "database" else _sqlite_source
    url = make(tmp_path / "adk.db", fill)
    store = MemoryStore()
    with pytest.raises(ValueError, match=match) as refused:
        migrate_from_adk(url, store)
    assert "nothing was written" in str(refused.value)
    assert len(str(refused.value)) < 1000  # a long id is shown cut
    assert store.list_apps() == []
    assert store.read_app_state("app") == {}
    assert store.read_user_state("app", "a") == {}


def test_every_refused_session_is_named_in_one_refusal(tmp_path: Path) -> None:
    async def fill(service: Any) -> None:
        await _event(service, "app", "u", " one ")
        await _event(service, "app", "u", "two", big=2**70)
        await _event(service, "app", "u", "ok")

    store = MemoryStore()
    with pytest.raises(ValueError) as refused:
        migrate_from_adk(_database_source(tmp_path / "adk.db", fill), store)
    message = str(refused.value)
    assert "2 things" in message
    assert "session ' one '" in message
    assert "session 'two': state['big']" in message
    assert store.list_apps() == []


# -- state values the store cannot hold ------------------------------------------


@pytest.mark.parametrize(
    ("state", "path"),
    [
        ({"big": 2**70}, "state['big']"),
        ({"cart": [1, {"n": -(2**70)}]}, "state['cart'][1]['n']"),
        ({"user:big": 2**70}, "state['user:big']"),
        ({"app:big": 2**70}, "state['app:big']"),
    ],
)
def test_an_unstorable_value_is_refused_before_anything_is_written(
    tmp_path: Path, state: dict[str, Any], path: str
) -> None:
    async def fill(service: Any) -> None:
        for sid in ("a", "b", "c"):
            await _event(service, "app", "u", sid, **(state if sid == "b" else {"ok": 1}))
        back = await service.get_session(app_name="app", user_id="u", session_id="b")
        assert back is not None and back.state == state  # ADK holds it exactly

    store = MemoryStore()
    with pytest.raises(ValueError) as refused:
        migrate_from_adk(_sqlite_source(tmp_path / "adk.db", fill), store)
    message = str(refused.value)
    assert "app 'app', user 'u'" in message
    assert path in message
    assert "64-bit" in message
    assert "nothing was written" in message
    assert store.list_apps() == []


def test_a_source_changed_after_the_check_says_what_was_stored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "adk.db"

    async def fill(service: Any) -> None:
        for sid in ("a", "b", "c"):
            await _event(service, "app", "u", sid)

    url = _sqlite_source(path, fill)
    checked = migrate_module._check_all

    async def check_then_change(*args: Any) -> None:
        await checked(*args)
        # Another writer puts a value the store cannot hold into session b.
        service = sqlite_service(str(path))
        session = await service.get_session(app_name="app", user_id="u", session_id="b")
        assert session is not None
        delta = EventActions(state_delta={"big": 2**70})
        await service.append_event(session, Event(author="a", invocation_id="i", actions=delta))
        await service.close()

    monkeypatch.setattr(migrate_module, "_check_all", check_then_change)
    store = MemoryStore()
    with pytest.raises(ValueError) as refused:
        migrate_from_adk(url, store)
    message = str(refused.value)
    assert "session 'b': event 1: " in message
    assert "['big']: int" in message
    assert "changed after it was checked" in message
    assert "1 sessions copied" in message
    assert [s.session_id for s in store.list_sessions("app", None)] == ["a"]


# -- NaN ---------------------------------------------------------------------------


def test_a_nan_copied_exactly_is_no_difference(tmp_path: Path) -> None:
    async def fill(service: Any) -> None:
        session = await service.create_session(
            app_name="app", user_id="u", session_id="s", state={"score": float("nan")}
        )
        event = Event(
            author="a",
            invocation_id="i",
            custom_metadata={"m": [float("nan"), {"x": float("nan")}]},
            actions=EventActions(state_delta={"user:nan": float("nan")}),
        )
        await service.append_event(session, event)

    url = _database_source(tmp_path / "adk.db", fill)
    store = MemoryStore()
    first = migrate_from_adk(url, store)
    assert (first.copied, first.differences) == (1, [])
    again = migrate_from_adk(url, store)
    assert (again.skipped, again.differences) == (1, [])


def test_a_different_value_is_still_a_difference(tmp_path: Path) -> None:
    async def fill(service: Any) -> None:
        await _event(service, "app", "u", "s", score=1.5)

    url = _database_source(tmp_path / "adk.db", fill)
    store = MemoryStore()
    assert migrate_from_adk(url, store).differences == []

    async def change() -> None:
        service = DatabaseSessionService(url)
        session = await service.get_session(app_name="app", user_id="u", session_id="s")
        assert session is not None
        delta = EventActions(state_delta={"score": float("nan")})
        await service.append_event(session, Event(author="a", invocation_id="i", actions=delta))
        await service.close()

    asyncio.run(change())
    report = migrate_from_adk(url, store)
    assert any("other content" in line for line in report.differences)
    assert any("state differs" in line for line in report.differences)


# -- sources that are not ADK's, and must not be touched ---------------------------


@pytest.mark.parametrize("scheme", ["lmdb", "redis", "memory"])
def test_a_source_that_is_not_an_adk_database_creates_nothing(tmp_path: Path, scheme: str) -> None:
    source = tmp_path / "no-such-store"
    url = f"{scheme}://{source}" if scheme == "lmdb" else f"{scheme}://127.0.0.1:1/0"
    with pytest.raises(ValueError, match="not a source migrate reads"):
        migrate_from_adk(url, MemoryStore())
    assert list(tmp_path.iterdir()) == []


def test_the_command_refuses_an_lmdb_source_and_creates_nothing(tmp_path: Path) -> None:
    source, target = tmp_path / "no-such-store", tmp_path / "target"
    done = _run(
        "migrate", "--no-progress", "--from", f"lmdb://{source}", "--to", f"lmdb://{target}"
    )
    assert done.returncode == 2
    assert "not a source migrate reads" in done.stderr
    assert "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == []


def _foreign(path: Path) -> None:
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE invoices (id INTEGER, amount REAL)")
    connection.close()


@pytest.mark.parametrize("scheme", ["sqlite", "sqlite+aiosqlite"])
def test_a_foreign_sqlite_file_is_refused_and_left_as_it_is(tmp_path: Path, scheme: str) -> None:
    source = tmp_path / "invoices.db"
    _foreign(source)
    before = _digest(source)
    store = MemoryStore()
    with pytest.raises(ValueError, match="not an ADK session database"):
        migrate_from_adk(f"{scheme}:///{source}", store)
    assert _digest(source) == before
    assert store.list_apps() == []
    target = tmp_path / "store"
    done = _run(
        "migrate", "--no-progress", "--from", f"{scheme}:///{source}", "--to", f"lmdb://{target}"
    )
    assert done.returncode == 2, done.stderr
    assert "not an ADK session database" in done.stderr
    assert "Traceback" not in done.stderr
    assert _digest(source) == before
    assert not target.exists()


def test_a_file_that_is_no_database_is_refused(tmp_path: Path) -> None:
    source = tmp_path / "notes.db"
    source.write_text("not a database at all\n" * 100)
    before = _digest(source)
    for scheme in ("sqlite", "sqlite+aiosqlite"):
        with pytest.raises(ValueError, match="cannot read"):
            migrate_from_adk(f"{scheme}:///{source}", MemoryStore())
    assert _digest(source) == before


def test_a_sqlite_service_file_read_as_a_database_url_is_refused_untouched(
    tmp_path: Path,
) -> None:
    async def fill(service: Any) -> None:
        await _event(service, "app", "u", "s")

    url = _sqlite_source(tmp_path / "adk.db", fill)
    before = _digest(tmp_path / "adk.db")
    with pytest.raises(ValueError, match="read it with sqlite:///path"):
        migrate_from_adk(url.replace("sqlite://", "sqlite+aiosqlite://"), MemoryStore())
    assert _digest(tmp_path / "adk.db") == before
    # Read the way it was written, it migrates.
    report = migrate_from_adk(url, MemoryStore())
    assert (report.copied, report.differences) == (1, [])


# -- secrets -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "redis://:s3cretpw@127.0.0.1:1/0",
        "postgresql+asyncpg://bob:s3cretpw@127.0.0.1:1/db",
        "mysql+nosuchdriver://bob:s3cretpw@127.0.0.1:1/db",
        "sqlite+aiosqlite://bob:s3cretpw@/nonexist.db",
    ],
)
def test_no_refusal_holds_the_source_password(url: str) -> None:
    with pytest.raises(ValueError) as refused:
        migrate_from_adk(url, MemoryStore())
    assert "s3cretpw" not in str(refused.value)
    assert "s3cretpw" not in repr(refused.value)
    assert refused.value.__cause__ is None


def test_the_command_shows_no_source_password(tmp_path: Path) -> None:
    url = "postgresql+asyncpg://bob:s3cretpw@127.0.0.1:1/db"
    done = _run("migrate", "--json", "--no-progress", "--from", url, "--to", "memory://")
    assert done.returncode == 2
    assert "s3cretpw" not in done.stdout + done.stderr
    assert json.loads(done.stdout)["error"]["message"]
