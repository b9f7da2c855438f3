"""The google-adk drop-in: event round trip, every service method, errors, URIs."""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("google.adk")

from google.adk.errors import StaleSessionError as AdkStale
from google.adk.errors.already_exists_error import AlreadyExistsError as AdkExists
from google.adk.errors.session_not_found_error import (
    SessionNotFoundError as AdkNotFound,
)
from google.adk.events import Event, EventActions
from google.adk.events.event import NodeInfo
from google.adk.sessions import BaseSessionService, Session
from google.adk.sessions.base_session_service import (
    GetSessionConfig,
    ListSessionsResponse,
)
from google.genai import types

from _adk_helpers import APP, dumped_record, realistic_event, rich_event
from sessionscope import codec, errors
from sessionscope.adk import LmdbSessionService, MemorySessionService, RedisSessionService
from sessionscope.adk import codec as _adk_codec
from sessionscope.stores import LmdbStore

pytestmark = pytest.mark.adk


@pytest.fixture(params=["memory", "lmdb", "redis", "redis-cluster", "lmdb+encrypted"])
def make_service(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Any]]:
    """Yield a factory of services over one store.

    For lmdb each call closes the previous service and reopens the path, so a
    read after it comes from disk (a process opens a store path once); for
    Redis each call opens the same prefix on the session's server again.
    """
    made: list[Any] = []
    shared = MemorySessionService() if request.param == "memory" else None
    redis_uri = None
    if request.param.startswith("redis"):
        fixture = "redis_server" if request.param == "redis" else "redis_cluster"
        server = request.getfixturevalue(fixture)
        redis_uri = f"{server.url}?prefix=a{uuid.uuid4().hex}"

    def make() -> Any:
        if shared is not None:
            return shared
        if made:
            made[-1].store.close()
        if redis_uri is not None:
            made.append(RedisSessionService(redis_uri))
        elif request.param == "lmdb+encrypted":
            # The key from the environment, the key store beside: as an operator sets it.
            request.getfixturevalue("monkeypatch").setenv("SESSIONSCOPE_TEST_ADK_KEK", "ab" * 32)
            query = f"key_env=SESSIONSCOPE_TEST_ADK_KEK&keys=lmdb://{tmp_path / 'keys'}"
            made.append(LmdbSessionService(f"lmdb://{tmp_path / 'store'}?{query}"))
        else:
            made.append(LmdbSessionService(tmp_path / "store"))
        return made[-1]

    yield make
    if made:
        made[-1].store.close()


def run(coro: Any) -> Any:
    """Run one coroutine to completion."""
    return asyncio.run(coro)


# -- round trip of every Event field ---------------------------------------

FIELD_EVENTS: dict[str, Callable[[], Event]] = {
    "text": lambda: Event(author="a", content=types.Content(parts=[types.Part(text="hi")])),
    "inline_bytes": lambda: Event(
        author="a",
        content=types.Content(
            parts=[types.Part(inline_data=types.Blob(mime_type="a/b", data=bytes(range(256))))]
        ),
    ),
    "function_call_and_response": lambda: Event(
        author="a",
        content=types.Content(
            parts=[
                types.Part(function_call=types.FunctionCall(id="c", name="f", args={"x": [1]})),
                types.Part(
                    function_response=types.FunctionResponse(id="c", name="f", response={"r": 1})
                ),
            ]
        ),
    ),
    "usage_metadata": lambda: rich_event().model_copy(
        update={"content": None, "actions": EventActions()}
    ),
    "custom_metadata": lambda: Event(author="a", custom_metadata={"k": {"n": None, "b": b"\x00"}}),
    "long_running_tool_ids": lambda: Event(author="a", long_running_tool_ids={"b", "a"}),
    "branch": lambda: Event(author="a", branch="root.child"),
    "node_info": lambda: Event(author="a", node_info=NodeInfo(path="wf/n@2", output_for=["wf"])),
    "artifact_delta": lambda: Event(author="a", actions=EventActions(artifact_delta={"f": 3})),
    "transfer_and_escalate": lambda: Event(
        author="a", actions=EventActions(transfer_to_agent="b", escalate=False)
    ),
    "everything": rich_event,
}


@pytest.mark.parametrize("name", sorted(FIELD_EVENTS))
def test_event_round_trips_through_the_codec(name: str) -> None:
    """What goes in comes back model_dump-equal, as model_validate builds it."""
    event = FIELD_EVENTS[name]()
    (back,) = _adk_codec.decode_events([_adk_codec.encode_event(event)])
    assert type(back) is Event
    assert back.model_dump() == event.model_dump()
    assert back == Event.model_validate(codec.decode_event(_adk_codec.encode_event(event)))


def test_bytes_are_stored_as_bytes() -> None:
    """Inline data and signatures stay binary in the record: no base64."""
    event = rich_event()
    record = codec.decode_event(_adk_codec.encode_event(event))
    parts = record["content"]["parts"]
    assert parts[1]["inlineData"]["data"] == event.content.parts[1].inline_data.data
    assert isinstance(parts[4]["thoughtSignature"], bytes)


# Deltas of every shape: plain ones, and storable ones that are not plain
# (a tuple, a str subclass), which take the codec's general path.
DELTA_EVENTS: dict[str, Callable[[], Event]] = {
    "plain_delta": lambda: realistic_event(3),
    "delta_of_every_value": lambda: Event(
        author="a",
        actions=EventActions(
            state_delta={
                "none": None,
                "nested": {"n": None, "l": [None, 1.5, b"\x00", True, -(2**63)]},
                "user:u": "ünïcode",
                "app:a": 2**64 - 1,
            }
        ),
    ),
    "delta_after_skip_summarization": lambda: Event(
        author="a", actions=EventActions(skip_summarization=True, state_delta={"k": 1})
    ),
    "delta_with_a_tuple": lambda: Event(
        author="a", actions=EventActions(state_delta={"t": (1, (2, "x"))})
    ),
    "delta_with_an_enum": lambda: Event(
        author="a", actions=EventActions(state_delta={"m": types.MediaModality.TEXT})
    ),
    "empty_delta_with_content": lambda: realistic_event(4, actions=EventActions()),
}


@pytest.mark.parametrize("name", sorted({**FIELD_EVENTS, **DELTA_EVENTS}))
def test_record_bytes_are_msgpack_of_the_dump(name: str) -> None:
    """The stored bytes are the codec's of pydantic's dump, whichever path packs them."""
    event = {**FIELD_EVENTS, **DELTA_EVENTS}[name]()
    expected = codec.encode_event(dumped_record(event))
    assert _adk_codec.encode_event(event) == expected
    (back,) = _adk_codec.decode_events([expected])
    assert back == Event.model_validate(codec.decode_event(expected))


def test_record_bytes_of_the_agent_mix_are_msgpack_of_the_dump() -> None:
    """Every event of a slice of the agent mix is stored as the codec packs its dump."""
    from sessionscope.bench.speed import Workload, mix_spec

    work = Workload.of(mix_spec(8, seed=3))
    for _, record, _ in work.appends:
        event = Event.model_validate(record)
        assert _adk_codec.encode_event(event) == codec.encode_event(dumped_record(event))


def test_every_field_round_trips_through_a_store(make_service: Callable[[], Any]) -> None:
    """Stored, read back by another service object: equal dumps, marker set."""

    async def scenario() -> None:
        service = make_service()
        session = await service.create_session(app_name=APP, user_id="u")
        events = [rich_event(), *(make() for make in FIELD_EVENTS.values())]
        for event in events:
            await service.append_event(session, event)
        again = await make_service().get_session(app_name=APP, user_id="u", session_id=session.id)
        assert [e.model_dump() for e in again.events] == [e.model_dump() for e in events]
        assert again._storage_update_marker == session._storage_update_marker

    run(scenario())


def test_unstorable_values_raise_type_error_naming_the_path() -> None:
    """A set inside an Any field is refused before anything is written."""

    async def scenario() -> None:
        service = MemorySessionService()
        session = await service.create_session(app_name=APP, user_id="u")
        with pytest.raises(TypeError, match=r"output"):
            await service.append_event(session, Event(author="a", output={"s": {1, 2}}))
        with pytest.raises(TypeError, match=r"cart"):
            await service.append_event(
                session, Event(author="a", actions=EventActions(state_delta={"cart": {1}}))
            )
        stored = await service.get_session(app_name=APP, user_id="u", session_id=session.id)
        assert stored.events == [] and session.events == []

    run(scenario())


# -- the service API ---------------------------------------------------------


def test_services_are_adk_session_services() -> None:
    """Both are drop-ins for BaseSessionService."""
    assert issubclass(LmdbSessionService, BaseSessionService)
    assert issubclass(MemorySessionService, BaseSessionService)


def test_create_get_list_delete(make_service: Callable[[], Any]) -> None:
    """State is routed by scope and merged back; list and delete behave."""

    async def scenario() -> None:
        service = make_service()
        state = {"app:theme": "dark", "user:lang": "fr", "cart": [], "temp:x": 1}
        s1 = await service.create_session(app_name=APP, user_id="u1", state=state, session_id="s1")
        assert isinstance(s1, Session) and s1.events == []
        assert s1.state == {"app:theme": "dark", "user:lang": "fr", "cart": []}
        s2 = await service.create_session(app_name=APP, user_id="u2")
        assert s2.state == {"app:theme": "dark"}
        got = await service.get_session(app_name=APP, user_id="u1", session_id=" s1 ")
        assert got.id == "s1" and got.state == s1.state
        listing = await service.list_sessions(app_name=APP)
        assert isinstance(listing, ListSessionsResponse)
        assert [s.id for s in listing.sessions] == ["s1", s2.id]
        assert listing.sessions[0].state["user:lang"] == "fr"
        assert [
            s.id for s in (await service.list_sessions(app_name=APP, user_id="u2")).sessions
        ] == [s2.id]
        assert (await service.list_sessions(app_name="nope")).sessions == []
        assert await service.get_user_state(app_name=APP, user_id="u1") == {"lang": "fr"}
        assert await service.get_app_state(app_name=APP) == {"theme": "dark"}
        await service.delete_session(app_name=APP, user_id="u1", session_id="s1")
        await service.delete_session(app_name=APP, user_id="u1", session_id="s1")
        assert await service.get_session(app_name=APP, user_id="u1", session_id="s1") is None
        assert await service.get_user_state(app_name=APP, user_id="u1") == {"lang": "fr"}

    run(scenario())


def test_append_applies_scopes_and_trims_temp(make_service: Callable[[], Any]) -> None:
    """Temp keys reach the live session only; the rest is stored by scope."""

    async def scenario() -> None:
        service = make_service()
        session = await service.create_session(app_name=APP, user_id="u")
        delta = {"temp:t": 1, "app:a": 2, "user:b": 3, "c": 4}
        event = Event(author="a", actions=EventActions(state_delta=dict(delta)))
        returned = await service.append_event(session, event)
        assert returned is event and event.actions.state_delta == {"app:a": 2, "user:b": 3, "c": 4}
        assert session.state == {"temp:t": 1, "app:a": 2, "user:b": 3, "c": 4}
        assert session.events == [event] and session.last_update_time == event.timestamp
        stored = await make_service().get_session(app_name=APP, user_id="u", session_id=session.id)
        assert stored.state == {"app:a": 2, "user:b": 3, "c": 4}
        assert stored.events[0].actions.state_delta == {"app:a": 2, "user:b": 3, "c": 4}
        partial = Event(author="a", partial=True, actions=EventActions(state_delta={"p": 1}))
        assert await service.append_event(session, partial) is partial
        assert "p" not in session.state and len(session.events) == 1

    run(scenario())


def test_get_session_filters(make_service: Callable[[], Any]) -> None:
    """num_recent_events and after_timestamp (0.0 included) select events."""

    async def scenario() -> None:
        service = make_service()
        session = await service.create_session(app_name=APP, user_id="u")
        for i, stamp in enumerate([-1.0, 0.0, 5.0, 7.0]):
            await service.append_event(session, realistic_event(i, timestamp=stamp))

        async def stamps(**config: Any) -> list[float]:
            got = await service.get_session(
                app_name=APP, user_id="u", session_id=session.id, config=GetSessionConfig(**config)
            )
            return [e.timestamp for e in got.events]

        assert await stamps(num_recent_events=2) == [5.0, 7.0]
        assert await stamps(num_recent_events=0) == []
        assert await stamps(after_timestamp=0.0) == [0.0, 5.0, 7.0]
        assert await stamps(after_timestamp=5.0, num_recent_events=3) == [5.0, 7.0]

    run(scenario())


def test_errors_are_adks_own_classes(make_service: Callable[[], Any]) -> None:
    """Duplicate, missing and stale raise ADK's classes (and sessionscope's)."""

    async def scenario() -> None:
        service = make_service()
        session = await service.create_session(app_name=APP, user_id="u", session_id="s")
        with pytest.raises(AdkExists) as exists:
            await service.create_session(app_name=APP, user_id="u", session_id="s")
        assert isinstance(exists.value, errors.AlreadyExistsError)
        copy = await service.get_session(app_name=APP, user_id="u", session_id="s")
        await service.append_event(session, realistic_event(1))
        with pytest.raises(AdkStale) as stale:
            await service.append_event(copy, realistic_event(2))
        assert isinstance(stale.value, ValueError) and copy.events == []
        ghost = Session(id="ghost", app_name=APP, user_id="u")
        with pytest.raises(AdkNotFound):
            await service.append_event(ghost, realistic_event(3))
        with pytest.raises(ValueError, match="num_recent_events"):
            await service.get_session(
                app_name=APP, user_id="u", session_id="s", config=_Config(-1, None)
            )
        with pytest.raises(ValueError, match="app_name"):
            await service.get_session(app_name="", user_id="u", session_id="s")

    run(scenario())


class _Config:
    """A config-like object that skips GetSessionConfig's own validation."""

    def __init__(self, num_recent_events: int | None, after_timestamp: float | None) -> None:
        self.num_recent_events = num_recent_events
        self.after_timestamp = after_timestamp


def test_duplicate_event_ids(make_service: Callable[[], Any]) -> None:
    """An equal retry is a no-op; a different event under the same id is an error."""

    async def scenario() -> None:
        service = make_service()
        session = await service.create_session(app_name=APP, user_id="u")
        event = realistic_event(1, id="e1")
        await service.append_event(session, event)
        retry = event.model_copy(deep=True)
        assert await service.append_event(session, retry) is retry
        with pytest.raises(errors.DuplicateEventError):
            await service.append_event(session, realistic_event(2, id="e1"))
        stored = await service.get_session(app_name=APP, user_id="u", session_id=session.id)
        assert [e.id for e in stored.events] == ["e1"]

    run(scenario())


def test_append_event_locked_catches_up(make_service: Callable[[], Any]) -> None:
    """A locked append on an old copy succeeds and brings the copy up to date."""

    async def scenario() -> None:
        service = make_service()
        first = await service.create_session(app_name=APP, user_id="u")
        second = await service.get_session(app_name=APP, user_id="u", session_id=first.id)
        await service.append_event(first, realistic_event(1))
        await service.append_event_locked(second, realistic_event(2))
        assert [e.invocation_id for e in second.events] == ["inv-0", "inv-0"]
        assert second.state["last"] == "acct-2"
        assert (
            second._storage_update_marker
            == (
                await service.get_session(app_name=APP, user_id="u", session_id=first.id)
            )._storage_update_marker
        )

    run(scenario())


def test_returned_sessions_do_not_alias(make_service: Callable[[], Any]) -> None:
    """Mutating what get_session returned changes nothing stored."""

    async def scenario() -> None:
        service = make_service()
        session = await service.create_session(app_name=APP, user_id="u", state={"l": [1]})
        got = await service.get_session(app_name=APP, user_id="u", session_id=session.id)
        got.state["l"].append(2)
        again = await service.get_session(app_name=APP, user_id="u", session_id=session.id)
        assert again.state == {"l": [1]}

    run(scenario())


# -- lifecycle, durability, URIs ---------------------------------------------


def test_close_flush_and_context_manager(tmp_path: Path) -> None:
    """Deferred appends survive close; async with closes the store."""

    async def scenario() -> None:
        async with LmdbSessionService(tmp_path / "s", durability="deferred") as service:
            session = await service.create_session(app_name=APP, user_id="u", session_id="s")
            await service.append_event(session, realistic_event(1))
            await service.flush()
        with pytest.raises(errors.StoreClosedError):
            await service.get_session(app_name=APP, user_id="u", session_id="s")
        async with LmdbSessionService(f"lmdb://{tmp_path / 's'}") as reopened:
            got = await reopened.get_session(app_name=APP, user_id="u", session_id="s")
            assert len(got.events) == 1

    run(scenario())


def test_uri_options_and_arguments(tmp_path: Path) -> None:
    """Options ride in the query; keywords override them; bad input is a ValueError."""
    service = LmdbSessionService(f"lmdb://{tmp_path / 'a'}?durability=deferred")
    assert isinstance(service.store, LmdbStore) and service.store.durability == "deferred"
    service.store.close()
    service = LmdbSessionService(
        uri=f"lmdb://{tmp_path / 'b'}?durability=deferred", durability="sync"
    )
    assert service.store.durability == "sync"
    service.store.close()
    service = LmdbSessionService(uri=f"lmdb://{tmp_path / 'c'}", agents_dir=str(tmp_path))
    service.store.close()
    with pytest.raises(ValueError):
        LmdbSessionService()
    with pytest.raises(ValueError):
        LmdbSessionService(str(tmp_path / "d"), uri=f"lmdb://{tmp_path / 'd'}")
    with pytest.raises(ValueError, match="lmdb://"):
        LmdbSessionService("sqlite:///x.db")


def test_services_can_share_one_store(tmp_path: Path) -> None:
    """Two services over one open store see the same sessions; both ways are refused."""
    store = LmdbStore(tmp_path / "store")
    first, second = LmdbSessionService(store=store), LmdbSessionService(store=store)

    async def main() -> None:
        created = await first.create_session(app_name="a", user_id="u", state={"k": 1})
        read = await second.get_session(app_name="a", user_id="u", session_id=created.id)
        assert read is not None and read.state == {"k": 1}

    asyncio.run(main())
    with pytest.raises(ValueError, match="not both"):
        LmdbSessionService(tmp_path / "other", store=store)
    store.close()


def test_import_registers_the_lmdb_scheme(tmp_path: Path) -> None:
    """ADK's registry builds our service for lmdb:// URIs, with the CLI's kwargs."""
    from google.adk.cli.service_registry import get_service_registry

    uri = f"lmdb://{tmp_path / 'reg'}?durability=deferred"
    service = get_service_registry().create_session_service(uri, agents_dir=str(tmp_path))
    assert isinstance(service, LmdbSessionService)
    assert service.store.durability == "deferred"
    service.store.close()


def test_services_yaml_route(tmp_path: Path) -> None:
    """A services.yaml naming the class works through ADK's own loader."""
    from google.adk.cli.service_registry import get_service_registry, load_services_module

    from sessionscope.adk import register

    agents = tmp_path / "agents"
    agents.mkdir()
    (agents / "services.yaml").write_text(
        "services:\n"
        "  - scheme: lmdbyaml\n"
        "    type: session\n"
        "    class: sessionscope.adk.LmdbSessionService\n"
    )
    path_before = list(sys.path)
    try:
        load_services_module(str(agents))
        uri = f"lmdbyaml://{tmp_path / 'y'}"
        with pytest.raises(ValueError, match="lmdb://"):
            get_service_registry().create_session_service(uri, agents_dir=str(agents))
        service = get_service_registry().create_session_service(
            f"lmdb://{tmp_path / 'y'}", agents_dir=str(agents)
        )
        assert isinstance(service, LmdbSessionService)
        service.store.close()
    finally:
        sys.path[:] = path_before
        register()


def test_a_session_read_through_the_other_api_is_named_so(tmp_path: Path) -> None:
    """The native service cannot build events the ADK drop-in stored: the error says why first."""
    from sessionscope import SyncSessionService

    async def write() -> None:
        service = LmdbSessionService(str(tmp_path / "store"))
        session = await service.create_session(app_name=APP, user_id="u", session_id="s")
        await service.append_event(session, Event(author="agent", invocation_id="i"))
        await service.close()

    asyncio.run(write())
    native = SyncSessionService(f"lmdb://{tmp_path / 'store'}")
    try:
        with pytest.raises(errors.CorruptStoreError) as caught:
            native.get_session(app_name=APP, user_id="u", session_id="s")
    finally:
        native.close()
    hint = caught.value.hint or ""
    assert hint.startswith("a session written through one API reads through that one only")


def test_two_tasks_appending_through_one_live_session_both_land(
    make_service: Callable[[], Any],
) -> None:
    """ADK's live mode appends from a send task and the receive loop through one session.

    ADK's own services take both appends; so do these, in call order, and the
    live session holds both events and both deltas.
    """

    async def main() -> None:
        service = make_service()
        session = await service.create_session(app_name=APP, user_id="u", session_id="live")
        sent = Event(author="user", invocation_id="i", actions=EventActions(state_delta={"x": 1}))
        answer = Event(
            author="model", invocation_id="i", actions=EventActions(state_delta={"y": 2})
        )
        got = await asyncio.gather(
            service.append_event(session, sent), service.append_event(session, answer)
        )
        assert got == [sent, answer]
        stored = await service.get_session(app_name=APP, user_id="u", session_id="live")
        assert [e.id for e in stored.events] == [sent.id, answer.id]
        assert stored.state == {"x": 1, "y": 2} == session.state
        assert [e.id for e in session.events] == [sent.id, answer.id]

    run(main())
