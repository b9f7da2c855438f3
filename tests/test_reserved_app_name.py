"""The app name a store keeps its encryption marker under is refused by every service call.

An encrypted store marks its data with the app state of ``MARKER_APP``. Were
that name an ordinary app name, ``delete_app`` would strip the marker (the
store then opens without a key and takes plaintext), and ``create_session``
would forge one (a plain store then refuses to open). Each call that names
an app, or appends to a session that does, raises a ValueError before
anything is written; the store reads as before and reopens as before.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from sessionscope import Event, EventActions, Session, SessionService, SyncSessionService
from sessionscope.errors import EncryptedStoreError, SessionscopeError
from sessionscope.stores import open_store

pytest.importorskip("cryptography")

from sessionscope.crypto import MARKER_APP, new_key_text, raw_store

KEY_ENV = "SESSIONSCOPE_TEST_RESERVED_KEK"
APP_ERROR = re.escape(f"app_name {MARKER_APP!r} is reserved for the store's encryption marker")
SESSION_ERROR = re.escape(
    f"session.app_name {MARKER_APP!r} is reserved for the store's encryption marker"
)


class Place:
    """One test's LMDB store: plain, or encrypted with a key from the environment."""

    def __init__(self, kind: str, base: Path) -> None:
        self.kind = kind
        self.plain = f"lmdb://{base / 'store'}"
        keys = quote(f"lmdb://{base / 'keys'}", safe="")
        self.uri = self.plain if kind == "plain" else f"{self.plain}?key_env={KEY_ENV}&keys={keys}"

    def seed(self) -> None:
        """Write one session with state in every scope, and one event."""
        with SyncSessionService(self.uri) as svc:
            session = svc.create_session(
                app_name="shop",
                user_id="ada",
                session_id="s",
                state={"app:a": 1, "user:u": 2, "k": 3},
            )
            svc.append_event(
                session,
                Event(author="user", actions=EventActions(state_delta={"k": 4})),
            )


@pytest.fixture(params=["plain", "encrypted"])
def place(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Place:
    monkeypatch.setenv(KEY_ENV, new_key_text())
    where = Place(request.param, tmp_path)
    where.seed()
    return where


def snapshot(svc: SyncSessionService) -> dict[str, Any]:
    """Return what a store holds, read below any encryption, marker app included."""
    raw = raw_store(svc.store)
    held: dict[str, Any] = {}
    for app in sorted({*raw.list_apps(), MARKER_APP, "shop"}):
        held[app] = (
            raw.read_app_state(app),
            {user: raw.read_user_state(app, user) for user in raw.list_users(app)},
            sorted(
                (r.user_id, r.session_id, r.last_update_time) for r in raw.list_sessions(app, None)
            ),
        )
    session = svc.get_session(app_name="shop", user_id="ada", session_id="s")
    assert session is not None
    held["read"] = (session.state, [e.id for e in session.events])
    return held


def marker_of(store: Any) -> dict[str, Any]:
    """Return the encryption marker a store's data holds ({} on a plain store)."""
    return dict(raw_store(store).read_app_state(MARKER_APP))


def forged(app_name: str = MARKER_APP) -> Session:
    return Session(id="s", app_name=app_name, user_id="ada")


def reserved_event() -> Event:
    return Event(author="user", actions=EventActions(state_delta={"app:keystore": "forged"}))


# (name, keyword arguments) of each call that names an app.
NAMED_CALLS: list[tuple[str, dict[str, Any]]] = [
    ("create_session", {"user_id": "ada", "state": {"app:keystore": "forged"}}),
    ("create_session", {"user_id": "ada", "session_id": "s"}),
    ("get_session", {"user_id": "ada", "session_id": "s"}),
    ("list_sessions", {}),
    ("list_sessions", {"user_id": "ada"}),
    ("delete_session", {"user_id": "ada", "session_id": "s"}),
    ("get_user_state", {"user_id": "ada"}),
    ("get_app_state", {}),
    ("truncate_events", {"user_id": "ada", "session_id": "s", "keep_last": 0}),
    ("expire_sessions", {"idle_for": 0}),
    ("delete_user", {"user_id": "ada"}),
    ("delete_app", {}),
]
# The appends: each takes a session object whose app is the reserved name.
APPENDS: dict[str, Callable[[Any, Session], Any]] = {
    "append_event": lambda svc, s: svc.append_event(s, reserved_event()),
    "append_event_locked": lambda svc, s: svc.append_event_locked(s, reserved_event()),
}


def call_ids(calls: list[tuple[str, dict[str, Any]]]) -> list[str]:
    return [f"{name}({','.join(kwargs)})" for name, kwargs in calls]


def assert_reopens_as_before(place: Place, before: dict[str, Any], marker: dict[str, Any]) -> None:
    """The store reopens as it did, its marker unchanged; an encrypted one still needs its key."""
    with SyncSessionService(place.uri) as svc:
        assert snapshot(svc) == before
        assert marker_of(svc.store) == marker
    if place.kind == "encrypted":
        assert marker  # the store is marked encrypted...
        with pytest.raises(EncryptedStoreError):  # ...so it does not open without its key
            open_store(place.plain)
    else:
        assert marker == {}


@pytest.mark.parametrize(("name", "kwargs"), NAMED_CALLS, ids=call_ids(NAMED_CALLS))
def test_sync_call_refuses_the_marker_app(place: Place, name: str, kwargs: dict[str, Any]) -> None:
    with SyncSessionService(place.uri) as svc:
        before, marker = snapshot(svc), marker_of(svc.store)
        with pytest.raises(ValueError, match=APP_ERROR) as caught:
            getattr(svc, name)(app_name=MARKER_APP, **kwargs)
        # An argument error, not a store error: nothing was sent to the store.
        assert type(caught.value) is ValueError
        assert snapshot(svc) == before
    assert_reopens_as_before(place, before, marker)


@pytest.mark.parametrize(("name", "kwargs"), NAMED_CALLS, ids=call_ids(NAMED_CALLS))
def test_async_call_refuses_the_marker_app(place: Place, name: str, kwargs: dict[str, Any]) -> None:
    async def refused(svc: SessionService) -> ValueError:
        with pytest.raises(ValueError, match=APP_ERROR) as caught:
            await getattr(svc, name)(app_name=MARKER_APP, **kwargs)
        return caught.value

    with SyncSessionService(place.uri) as sync:
        before, marker = snapshot(sync), marker_of(sync.store)
        error = asyncio.run(refused(SessionService(sync.store)))
        assert type(error) is ValueError
        assert snapshot(sync) == before
    assert_reopens_as_before(place, before, marker)


@pytest.mark.parametrize("name", sorted(APPENDS))
@pytest.mark.parametrize("face", ["sync", "async"])
def test_append_to_a_session_in_the_marker_app_is_refused(
    place: Place, name: str, face: str
) -> None:
    session = forged()
    with SyncSessionService(place.uri) as sync:
        before, marker = snapshot(sync), marker_of(sync.store)
        with pytest.raises(ValueError, match=SESSION_ERROR):
            if face == "sync":
                APPENDS[name](sync, session)
            else:
                asyncio.run(APPENDS[name](SessionService(sync.store), session))
        assert session.events == [] and session.state == {}
        assert snapshot(sync) == before
    assert_reopens_as_before(place, before, marker)


def test_append_many_with_one_session_in_the_marker_app_stores_nothing(place: Place) -> None:
    with SyncSessionService(place.uri) as svc:
        before, marker = snapshot(svc), marker_of(svc.store)
        good = svc.get_session(app_name="shop", user_id="ada", session_id="s")
        assert good is not None
        first = Event(author="user", actions=EventActions(state_delta={"k": 5}))
        with pytest.raises(ValueError, match=SESSION_ERROR):
            svc.append_many([(good, first), (forged(), reserved_event())])
        # The batch is checked whole before it is sent: the good append is not stored either.
        assert first.actions.state_delta == {"k": 5}
        assert snapshot(svc) == before
    assert_reopens_as_before(place, before, marker)


@pytest.mark.parametrize(
    "name", ["sessionscope:encryption", "\x00sessionscope:encryption2", "\x00", "shop\x00"]
)
def test_names_like_the_marker_stay_ordinary_app_names(place: Place, name: str) -> None:
    with SyncSessionService(place.uri) as svc:
        marker = marker_of(svc.store)
        session = svc.create_session(app_name=name, user_id="ada", state={"app:x": 1})
        svc.append_event(session, Event(author="user"))
        assert svc.get_app_state(app_name=name) == {"x": 1}
        assert [m.id for m in svc.list_sessions(app_name=name).sessions] == [session.id]
        assert svc.delete_app(app_name=name) == 1
        assert marker_of(svc.store) == marker


def test_other_bad_app_names_keep_their_own_errors(place: Place) -> None:
    with SyncSessionService(place.uri) as svc:
        with pytest.raises(ValueError, match="app_name must not be empty"):
            svc.delete_app(app_name="")
        with pytest.raises(ValueError, match="app_name must be a str, not int"):
            svc.delete_app(app_name=5)  # type: ignore[arg-type]


@pytest.fixture
def adk_service(place: Place) -> Iterator[tuple[Any, Place]]:
    pytest.importorskip("google.adk")
    from sessionscope.adk import LmdbSessionService

    service = LmdbSessionService(uri=place.uri)
    try:
        yield service, place
    finally:
        service.store.close()


def test_adk_drop_in_refuses_the_marker_app(adk_service: tuple[Any, Place]) -> None:
    from google.adk.events import Event as AdkEvent
    from google.adk.sessions import Session as AdkSession

    service, place = adk_service
    # A native facade over the same store, to read it as the other tests do.
    reader = SyncSessionService(service.store)
    before, marker = snapshot(reader), marker_of(service.store)
    m = MARKER_APP

    async def calls() -> None:
        for call in (
            lambda: service.create_session(app_name=m, user_id="ada", state={"app:k": "x"}),
            lambda: service.get_session(app_name=m, user_id="ada", session_id="s"),
            lambda: service.list_sessions(app_name=m),
            lambda: service.delete_session(app_name=m, user_id="ada", session_id="s"),
        ):
            with pytest.raises(ValueError, match=APP_ERROR) as caught:
                await call()
            assert not isinstance(caught.value, SessionscopeError)
        with pytest.raises(ValueError, match=SESSION_ERROR):
            await service.append_event(
                AdkSession(id="s", app_name=m, user_id="ada"),
                AdkEvent(author="user", invocation_id="i"),
            )

    asyncio.run(calls())
    assert snapshot(reader) == before
    service.store.close()
    assert_reopens_as_before(place, before, marker)


def test_openai_agents_session_refuses_the_marker_app(place: Place) -> None:
    pytest.importorskip("agents")
    from sessionscope.openai_agents import AgentsSession

    with SyncSessionService(place.uri) as reader:
        before, marker = snapshot(reader), marker_of(reader.store)
        with pytest.raises(ValueError, match=APP_ERROR) as caught:
            AgentsSession("s", reader.store, app_name=MARKER_APP)
        assert not isinstance(caught.value, SessionscopeError)
        assert snapshot(reader) == before
    assert_reopens_as_before(place, before, marker)
