"""Differential tests: the same calls on ADK's InMemorySessionService and on ours.

A scenario is a list of operations. ``play`` runs it on one service and
returns what every operation produced (sessions as plain data, events as
dumped dicts, errors as the ADK class they are an instance of). ADK's
``InMemorySessionService`` is the reference; ``MemorySessionService``,
``LmdbSessionService`` and ``RedisSessionService`` (on a real server and a real
cluster) must give the same results, except where the contract
differs on purpose: those tests are named ``test_differs_*`` and assert our side.
"""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from contextlib import asynccontextmanager
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("google.adk")

from google.adk.errors import StaleSessionError
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events import Event, EventActions
from google.adk.sessions import InMemorySessionService, Session
from google.adk.sessions.base_session_service import GetSessionConfig
from hypothesis import given, settings
from hypothesis import strategies as st

from _adk_helpers import APP, realistic_event
from sessionscope import errors
from sessionscope.adk import LmdbSessionService, MemorySessionService, RedisSessionService

pytestmark = pytest.mark.adk

# google-adk 2.15 changed two things its in-memory service did otherwise
# before: it keeps a copy of an appended event (it kept the caller's object),
# and it filters by after_timestamp event by event (it returned the tail after
# the last older event). Before 2.15 those were differences from ours.
ADK_2_15 = tuple(int(part) for part in version("google-adk").split(".")[:2]) >= (2, 15)

ADK_ERRORS = (AlreadyExistsError, SessionNotFoundError, StaleSessionError)
# Our services, each checked against ADK's; "+encrypted": over a store opened
# encrypted (sessionscope.crypto), its data keys in an LMDB key store.
OURS = ("memory", "lmdb", "redis", "redis-cluster", "lmdb+encrypted", "redis+encrypted")
_KEK = bytes(range(32))
# The session's Redis servers, by kind (set by the autouse fixture below).
REDIS_URLS: dict[str, str] = {}


@pytest.fixture(autouse=True, scope="module")
def _redis_urls(redis_server: Any, redis_cluster: Any) -> None:
    REDIS_URLS["redis"] = redis_server.url
    REDIS_URLS["redis-cluster"] = redis_cluster.url


Op = tuple[Any, ...]


@asynccontextmanager
async def open_service(kind: str) -> Any:
    """Yield a fresh service of one kind."""
    if kind == "adk":
        yield InMemorySessionService()
    elif kind.endswith("+encrypted"):
        from sessionscope.crypto import Encryption
        from sessionscope.stores import open_store

        with tempfile.TemporaryDirectory() as tmp:
            encryption = Encryption(keys=f"lmdb://{tmp}/keys", key=_KEK)
            if kind.startswith("redis"):
                uri = f"{REDIS_URLS['redis']}?prefix=d{uuid.uuid4().hex}"
                store = open_store(uri, encryption=encryption)
                async with RedisSessionService(store=store) as service:
                    yield service
            else:
                store = open_store(f"lmdb://{tmp}/store", encryption=encryption)
                async with LmdbSessionService(store=store) as service:  # type: ignore[arg-type]
                    yield service
    elif kind == "memory":
        yield MemorySessionService()
    elif kind in REDIS_URLS:
        # A prefix of its own: a fresh, empty store on the shared server.
        async with RedisSessionService(f"{REDIS_URLS[kind]}?prefix=d{uuid.uuid4().hex}") as service:
            yield service
    else:
        with tempfile.TemporaryDirectory() as tmp:
            async with LmdbSessionService(Path(tmp) / "store") as service:
                yield service


def session_data(session: Session | None) -> Any:
    """Return what a caller can observe of a session, its update time aside."""
    if session is None:
        return None
    return {
        "id": session.id,
        "app_name": session.app_name,
        "user_id": session.user_id,
        "state": session.state,
        "events": [event.model_dump() for event in session.events],
    }


def make_event(spec: dict[str, Any]) -> Event:
    """Return a fresh event from a spec, so each service gets its own object."""
    return Event(
        id=spec["id"],
        author="agent",
        invocation_id="inv",
        timestamp=spec["timestamp"],
        partial=spec.get("partial"),
        actions=EventActions(state_delta=dict(spec.get("delta", {}))),
    )


async def play(kind: str, ops: list[Op]) -> list[Any]:
    """Run the operations on a fresh service; return one result per operation.

    Live sessions are kept under the names the operations give them, so an
    append can target a copy read earlier (stale) or a hand-built one.
    """
    results: list[Any] = []
    live: dict[str, Session] = {}
    async with open_service(kind) as service:
        for op in ops:
            try:
                results.append(await _step(service, live, op))
            except ADK_ERRORS as error:
                results.append(("error", next(c for c in ADK_ERRORS if isinstance(error, c))))
            except errors.DuplicateEventError:
                results.append(("error", "duplicate-event"))
    return results


async def _step(service: Any, live: dict[str, Session], op: Op) -> Any:
    name, *args = op
    if name == "create":
        user, sid, state, handle = args
        session = await service.create_session(
            app_name=APP, user_id=user, state=state, session_id=sid
        )
        live[handle] = session
        data = session_data(session)
        if sid is None or not sid.strip():
            data["id"] = "<generated>"
        return data
    if name == "get":
        user, sid, config, handle = args
        session = await service.get_session(
            app_name=APP, user_id=user, session_id=sid, config=config
        )
        if handle is not None and session is not None:
            live[handle] = session
        return session_data(session)
    if name == "build":  # a session object made by hand, as some callers do
        user, sid, handle = args
        live[handle] = Session(id=sid, app_name=APP, user_id=user)
        return None
    if name == "append":
        handle, spec = args
        session = live[handle]
        event = make_event(spec)
        returned = await service.append_event(session, event)
        return {
            "same_object": returned is event,
            "event": event.model_dump(),
            "live": session_data(session),
            "last_update_time": session.last_update_time if not spec.get("partial") else None,
        }
    if name == "list":
        (user,) = args
        listing = await service.list_sessions(app_name=APP, user_id=user)
        return [(s.user_id, s.id, s.state, s.events) for s in listing.sessions]
    if name == "delete":
        user, sid = args
        return await service.delete_session(app_name=APP, user_id=user, session_id=sid)
    if name == "user_state":
        (user,) = args
        return await service.get_user_state(app_name=APP, user_id=user)
    raise AssertionError(f"unknown operation {name}")


def run_all(ops: list[Op]) -> dict[str, list[Any]]:
    """Play a scenario on ADK's service and both of ours."""
    return {kind: asyncio.run(play(kind, ops)) for kind in ("adk", *OURS)}


def assert_same(ops: list[Op]) -> list[Any]:
    """Assert that all three services agree on every result; return ADK's."""
    results = run_all(ops)
    for kind in OURS:
        for i, (theirs, ours) in enumerate(zip(results["adk"], results[kind], strict=True)):
            assert ours == theirs, f"{kind} differs from ADK at step {i}: {ops[i]}"
    return results["adk"]


def ev(eid: str, stamp: float, delta: dict[str, Any] | None = None, **more: Any) -> dict[str, Any]:
    """Return an event spec."""
    return {"id": eid, "timestamp": stamp, "delta": delta or {}, **more}


def cfg(**fields: Any) -> GetSessionConfig:
    """Return a GetSessionConfig."""
    return GetSessionConfig(**fields)


# -- hand-written scenarios where ADK and we agree ---------------------------

AGREED: dict[str, list[Op]] = {
    "create_routes_state_by_scope": [
        ("create", "u1", "s1", {"app:a": 1, "user:b": 2, "c": 3, "temp:t": 4}, "x"),
        ("create", "u2", "s2", None, "y"),
        ("get", "u1", "s1", None, None),
        ("get", "u2", "s2", None, None),
        ("user_state", "u1"),
        ("user_state", "u2"),
    ],
    "create_generates_ids_for_none_and_blank": [
        ("create", "u1", None, None, "x"),
        ("create", "u1", "   ", None, "y"),
    ],
    "create_duplicate_raises": [
        ("create", "u1", "s1", None, "x"),
        ("create", "u1", "s1", {"k": 1}, "y"),
        ("create", "u2", "s1", None, "z"),
        ("get", "u1", "s1", None, None),
    ],
    "whitespace_is_stripped_on_create_get_delete": [
        ("create", "u1", "  s1  ", None, "x"),
        ("get", "u1", "s1", None, None),
        ("get", "u1", " s1\t", None, None),
        ("delete", "u1", " s1 "),
        ("get", "u1", "s1", None, None),
    ],
    "missing_session_reads_none": [
        ("get", "nobody", "s1", None, None),
        ("create", "u1", "s1", None, "x"),
        ("get", "u1", "other", None, None),
    ],
    "append_applies_every_scope_and_trims_temp": [
        ("create", "u1", "s1", None, "x"),
        ("create", "u2", "s2", None, "y"),
        ("append", "x", ev("e1", 10.0, {"app:a": 1, "user:b": [1, None], "c": {"d": 2}})),
        ("append", "x", ev("e2", 11.0, {"temp:t": "v", "c": None})),
        ("get", "u1", "s1", None, None),
        ("get", "u2", "s2", None, None),
        ("user_state", "u1"),
    ],
    "partial_events_are_returned_untouched": [
        ("create", "u1", "s1", None, "x"),
        ("append", "x", ev("p1", 10.0, {"k": 1, "temp:t": 2}, partial=True)),
        ("get", "u1", "s1", None, None),
    ],
    "equal_retry_is_a_no_op": [
        ("create", "u1", "s1", None, "x"),
        ("append", "x", ev("e1", 10.0, {"n": 1})),
        ("get", "u1", "s1", None, "x"),
        ("append", "x", ev("e1", 10.0, {"n": 1})),
        ("get", "u1", "s1", None, None),
    ],
    "num_recent_events": [
        ("create", "u1", "s1", None, "x"),
        *[("append", "x", ev(f"e{i}", 10.0 + i)) for i in range(5)],
        ("get", "u1", "s1", cfg(num_recent_events=2), None),
        ("get", "u1", "s1", cfg(num_recent_events=0), None),
        ("get", "u1", "s1", cfg(num_recent_events=9), None),
    ],
    "after_timestamp_inclusive_and_zero_is_a_filter": [
        ("create", "u1", "s1", None, "x"),
        *[("append", "x", ev(f"e{i}", stamp)) for i, stamp in enumerate([-2.0, 0.0, 3.0, 4.0])],
        ("get", "u1", "s1", cfg(after_timestamp=3.0), None),
        ("get", "u1", "s1", cfg(after_timestamp=0.0), None),
        ("get", "u1", "s1", cfg(after_timestamp=99.0), None),
        ("get", "u1", "s1", cfg(after_timestamp=0.0, num_recent_events=2), None),
    ],
    "list_orders_by_last_update_then_user_then_id": [
        ("create", "u2", "b", None, "b"),
        ("create", "u1", "a", {"app:x": 1, "user:y": 2}, "a"),
        ("create", "u1", "c", None, "c"),
        ("append", "c", ev("e1", 5.0)),
        ("append", "b", ev("e2", 5.0)),
        ("append", "a", ev("e3", 5.0)),
        ("list", None),
        ("list", "u1"),
        ("list", "nobody"),
        ("delete", "u1", "c"),
        ("list", None),
    ],
    "list_of_unknown_app_is_empty": [("list", None), ("list", "u1")],
    "delete_keeps_shared_state_and_missing_is_a_no_op": [
        ("create", "u1", "s1", {"app:a": 1, "user:b": 2, "c": 3}, "x"),
        ("delete", "u1", "s1"),
        ("delete", "u1", "s1"),
        ("delete", "nobody", "nothing"),
        ("create", "u1", "s1", None, "y"),
        ("get", "u1", "s1", None, None),
    ],
    "append_to_deleted_or_unknown_session_raises": [
        ("create", "u1", "s1", None, "x"),
        ("delete", "u1", "s1"),
        ("append", "x", ev("e1", 1.0)),
        ("build", "u1", "never", "h"),
        ("append", "h", ev("e2", 2.0)),
    ],
    "hand_built_session_that_is_current_may_append": [
        ("create", "u1", "s1", None, "x"),
        ("build", "u1", "s1", "h"),
        ("append", "h", ev("e1", 1.0, {"k": 1})),
        ("get", "u1", "s1", None, None),
    ],
    "rich_events_come_back_equal": [
        ("create", "u1", "s1", None, "x"),
        ("append", "x", ev("e1", 1.0, {"k": b"\x00\x01", "user:l": [1.5, "x", None]})),
        ("get", "u1", "s1", None, None),
    ],
}


@pytest.mark.parametrize("name", sorted(AGREED))
def test_agrees_with_adk(name: str) -> None:
    """ADK's InMemorySessionService and ours give the same results."""
    assert_same(AGREED[name])


def test_agrees_on_realistic_events() -> None:
    """Events with content, function calls and usage round trip identically."""

    async def scenario(kind: str) -> list[Any]:
        async with open_service(kind) as service:
            session = await service.create_session(app_name=APP, user_id="u", session_id="s")
            for i in range(6):
                await service.append_event(session, realistic_event(i, id=f"e{i}", timestamp=i))
            got = await service.get_session(app_name=APP, user_id="u", session_id="s")
            return [session_data(got), session_data(session)]

    theirs = asyncio.run(scenario("adk"))
    for kind in OURS:
        assert asyncio.run(scenario(kind)) == theirs


# -- where the contract differs from ADK on purpose --------------------------


def _differ(ops: list[Op], step: int) -> tuple[Any, Any, Any]:
    """Run a scenario; assert all of ours agree; return ADK's, memory's and lmdb's result."""
    results = run_all(ops)
    for kind in OURS:
        assert results[kind] == results["memory"], f"{kind} differs from memory"
    return results["adk"][step], results["memory"][step], results["lmdb"][step]


def test_differs_whitespace_is_stripped_on_append() -> None:
    """ADK looks the session up with its id unstripped on append; we strip it everywhere."""
    ops: list[Op] = [
        ("create", "u1", "s1", None, "x"),
        ("build", "u1", " s1 ", "h"),
        ("append", "h", ev("e1", 1.0, {"k": 1})),
        ("get", "u1", "s1", None, None),
    ]
    adk, ours, _ = _differ(ops, 2)
    assert adk == ("error", SessionNotFoundError)
    assert ours["same_object"] is True
    assert run_all(ops)["memory"][3]["state"] == {"k": 1}


def test_differs_conflicting_duplicate_event_id_is_an_error() -> None:
    """ADK stores a second, different event under a taken id; we refuse it."""
    ops: list[Op] = [
        ("create", "u1", "s1", None, "x"),
        ("append", "x", ev("e1", 1.0, {"k": 1})),
        ("append", "x", ev("e1", 2.0, {"k": 2})),
        ("get", "u1", "s1", None, None),
    ]
    adk, ours, _ = _differ(ops, 2)
    assert adk != ("error", "duplicate-event")
    assert ours == ("error", "duplicate-event")
    results = run_all(ops)
    assert len(results["adk"][3]["events"]) == 2
    assert [e["id"] for e in results["memory"][3]["events"]] == ["e1"]
    assert results["memory"][3]["state"] == {"k": 1}


def test_differs_stale_copy_is_refused() -> None:
    """ADK appends from a stale copy and loses track of the other writer; we raise."""
    ops: list[Op] = [
        ("create", "u1", "s1", None, "x"),
        ("get", "u1", "s1", None, "old"),
        ("append", "x", ev("e1", 1.0, {"a": 1})),
        ("append", "old", ev("e2", 2.0, {"b": 2})),
        ("get", "u1", "s1", None, None),
    ]
    adk, ours, _ = _differ(ops, 3)
    assert adk != ("error", StaleSessionError)
    assert ours == ("error", StaleSessionError)
    assert [e["id"] for e in run_all(ops)["lmdb"][4]["events"]] == ["e1"]


def test_differs_after_timestamp_with_unordered_timestamps() -> None:
    """We return every event at or after t.

    ADK before 2.15 returned the tail after the last older event; since, it
    filters as we do.
    """
    ops: list[Op] = [
        ("create", "u1", "s1", None, "x"),
        *[("append", "x", ev(f"e{i}", stamp)) for i, stamp in enumerate([5.0, 1.0, 7.0])],
        ("get", "u1", "s1", cfg(after_timestamp=3.0), None),
    ]
    if ADK_2_15:
        assert [e["id"] for e in assert_same(ops)[4]["events"]] == ["e0", "e2"]
        return
    adk, ours, _ = _differ(ops, 4)
    assert [e["id"] for e in adk["events"]] == ["e2"]
    assert [e["id"] for e in ours["events"]] == ["e0", "e2"]


def test_differs_unstorable_values_are_refused() -> None:
    """ADK keeps a set in memory state; we raise TypeError before writing anything."""

    async def scenario(kind: str) -> Any:
        async with open_service(kind) as service:
            session = await service.create_session(app_name=APP, user_id="u", session_id="s")
            try:
                await service.append_event(session, make_event(ev("e1", 1.0, {"k": {1, 2}})))
            except TypeError as error:
                return error
            return (await service.get_session(app_name=APP, user_id="u", session_id="s")).state

    assert asyncio.run(scenario("adk")) == {"k": {1, 2}}
    for kind in OURS:
        assert isinstance(asyncio.run(scenario(kind)), errors.StateValueError)


def test_differs_empty_ids_are_refused() -> None:
    """ADK accepts an empty app or user name; we raise a ValueError naming it."""

    async def scenario(kind: str) -> Any:
        async with open_service(kind) as service:
            try:
                return (await service.create_session(app_name="", user_id="u")).app_name
            except ValueError as error:
                return str(error)

    assert asyncio.run(scenario("adk")) == ""
    for kind in OURS:
        assert "app_name" in asyncio.run(scenario(kind))


def test_differs_appended_event_is_not_aliased() -> None:
    """Changing an event after appending it changes nothing stored.

    ADK before 2.15 stored the caller's event object, so the change showed.
    """

    async def scenario(kind: str) -> str:
        async with open_service(kind) as service:
            session = await service.create_session(app_name=APP, user_id="u", session_id="s")
            event = make_event(ev("e1", 1.0))
            await service.append_event(session, event)
            event.author = "changed later"
            got = await service.get_session(app_name=APP, user_id="u", session_id="s")
            return str(got.events[0].author)

    assert asyncio.run(scenario("adk")) == ("agent" if ADK_2_15 else "changed later")
    assert [asyncio.run(scenario(kind)) for kind in OURS] == ["agent"] * len(OURS)


# -- random call sequences ----------------------------------------------------

USERS = ["u1", "u2"]
SIDS = ["s1", "s2", "s3"]
KEYS = ["a", "b", "app:a", "app:b", "user:a", "user:b", "temp:a"]
values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=5),
    st.binary(max_size=5),
    st.lists(st.integers(0, 9), max_size=3),
)
deltas = st.dictionaries(st.sampled_from(KEYS), values, max_size=4)
configs = st.one_of(
    st.none(),
    st.builds(
        GetSessionConfig,
        num_recent_events=st.one_of(st.none(), st.integers(0, 4)),
        after_timestamp=st.one_of(st.none(), st.sampled_from([0.0, 2.0, 3.0, 100.0])),
    ),
)
steps = st.one_of(
    st.tuples(st.just("create"), st.sampled_from(USERS), st.sampled_from(SIDS), st.none() | deltas),
    st.tuples(st.just("get"), st.sampled_from(USERS), st.sampled_from(SIDS), configs),
    st.tuples(
        st.just("append"), st.sampled_from(USERS), st.sampled_from(SIDS), deltas, st.booleans()
    ),
    st.tuples(st.just("list"), st.none() | st.sampled_from(USERS)),
    st.tuples(st.just("delete"), st.sampled_from(USERS), st.sampled_from(SIDS)),
    st.tuples(st.just("user_state"), st.sampled_from(USERS)),
)


def to_ops(drawn: list[tuple[Any, ...]]) -> list[Op]:
    """Turn drawn steps into operations; an append first reads the session it targets.

    Reading first keeps every append current, so random runs stay off the
    stale-copy difference; event ids and timestamps are unique and rising.
    """
    ops: list[Op] = []
    for n, step in enumerate(drawn):
        kind = step[0]
        if kind == "create":
            ops.append(("create", step[1], step[2], step[3], f"h{n}"))
        elif kind == "get":
            ops.append(("get", step[1], step[2], step[3], None))
        elif kind == "append":
            _, user, sid, delta, partial = step
            ops.append(("build", user, sid, f"h{n}"))
            ops.append(("get", user, sid, None, f"h{n}"))
            spec = ev(f"e{n}", float(n), delta, partial=True if partial and n % 3 == 0 else None)
            ops.append(("append", f"h{n}", spec))
        else:
            ops.append(step)
    return ops


@settings(max_examples=50, deadline=None)
@given(st.lists(steps, min_size=1, max_size=12))
def test_random_sequences_agree_with_adk(drawn: list[tuple[Any, ...]]) -> None:
    """Random sequences of calls give the same results on ADK's service and ours."""
    assert_same(to_ops(drawn))
