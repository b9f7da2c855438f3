"""The google-adk drop-in's ``append_events``: several events of a session, all or none.

google-adk 2.15 gave ``BaseSessionService`` an ``append_events(session,
events)`` whose default calls ``append_event`` for each event; a service that
overrides it must store all of the events or none, in order, with the same
effect on the session and the store as those calls. ``BufferedSessionService``
then sends a session's queued events in one call. The memory and LMDB
services override it with one transaction of the store; the Redis service
keeps ADK's default.
"""

from __future__ import annotations

import asyncio
import copy
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("google.adk")

from google.adk.events import Event, EventActions
from google.adk.sessions import BaseSessionService, Session
from google.genai import types

from sessionscope import errors
from sessionscope.adk import (
    LmdbSessionService,
    MemorySessionService,
    RedisSessionService,
    StaleSessionError,
)

pytestmark = pytest.mark.adk

APP, USER = "shop", "ann"
KIND = ["memory", "lmdb deferred", "lmdb durable", "lmdb+encrypted"]


@pytest.fixture(params=KIND)
def make_service(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[str], Any]]:
    """Yield a factory of services, each over a store of its own, named by the caller."""
    made: list[Any] = []

    def make(name: str) -> Any:
        if request.param == "memory":
            service: Any = MemorySessionService()
        elif request.param == "lmdb+encrypted":
            monkeypatch.setenv("SESSIONSCOPE_TEST_CHAIN_KEK", "cd" * 32)
            keys = f"lmdb://{tmp_path / (name + '-keys')}"
            service = LmdbSessionService(
                f"lmdb://{tmp_path / name}?key_env=SESSIONSCOPE_TEST_CHAIN_KEK&keys={keys}"
            )
        else:
            durability = request.param.split()[1].replace("durable", "sync")
            service = LmdbSessionService(tmp_path / name, durability=durability)
        made.append(service)
        return service

    yield make
    for service in made:
        service.store.close()


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def turn(number: int, **fields: Any) -> Event:
    """Return an event of an agent's turn: text, and a delta on every scope."""
    return Event(
        author="user" if number % 2 else "model",
        invocation_id=f"inv-{number // 4}",
        content=types.Content(role="user", parts=[types.Part(text=f"turn {number} " * 5)]),
        actions=EventActions(
            state_delta={
                "step": number,
                "notes": [number, {"deep": float(number)}],
                "user:seen": number,
                "app:calls": number,
                "temp:scratch": f"t{number}",
            }
        ),
        **fields,
    )


def stored(service: Any, session: Session) -> Session:
    got = run(service.get_session(app_name=APP, user_id=USER, session_id=session.id))
    assert got is not None
    return got


def dumped(session: Session) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Return a session's events and state as data: what two stores are compared by."""
    return [e.model_dump(mode="json") for e in session.events], dict(session.state)


def test_the_memory_and_lmdb_services_override_it_and_redis_keeps_adks() -> None:
    for service in (MemorySessionService, LmdbSessionService):
        assert service.append_events is not getattr(BaseSessionService, "append_events", None)
    default = getattr(BaseSessionService, "append_events", None)
    if default is not None:  # google-adk 2.15 and later
        assert RedisSessionService.append_events is default


def test_it_does_what_append_event_for_each_does(make_service: Callable[[str], Any]) -> None:
    chained, one_by_one = make_service("chained"), make_service("one-by-one")
    events = [turn(n) for n in range(12)]
    twins = copy.deepcopy(events)
    partial = turn(99, partial=True)  # handed back unstored, as by append_event
    events.insert(5, partial)
    twins.insert(5, copy.deepcopy(partial))

    async def both() -> tuple[Session, Session, list[Event]]:
        a = await chained.create_session(app_name=APP, user_id=USER, state={"start": 1})
        b = await one_by_one.create_session(
            app_name=APP, user_id=USER, state={"start": 1}, session_id=a.id
        )
        answered = await chained.append_events(a, events)
        for event in twins:
            await one_by_one.append_event(b, event)
        return a, b, answered

    a, b, answered = run(both())
    assert answered == events and all(x is y for x, y in zip(answered, events, strict=True))
    assert len(a.events) == 12 and partial not in a.events
    # The live sessions match, temp keys and all, and so do the stores.
    assert dumped(a) == dumped(b)
    assert a.state["temp:scratch"] == "t11" and a.last_update_time == b.last_update_time
    assert dumped(stored(chained, a)) == dumped(stored(one_by_one, b))
    assert "temp:scratch" not in stored(chained, a).state
    assert all("temp:scratch" not in e.actions.state_delta for e in stored(chained, a).events)
    # The live session goes on as one read again would.
    run(chained.append_event(a, turn(100)))
    assert dumped(stored(chained, a))[0][-1]["id"] == a.events[-1].id


def test_a_conflicting_event_id_anywhere_stores_none_of_them(
    make_service: Callable[[str], Any],
) -> None:
    service = make_service("store")
    session = run(service.create_session(app_name=APP, user_id=USER))
    run(service.append_events(session, [turn(0), turn(1)]))
    before_store = dumped(stored(service, session))
    before_live = (dumped(session), session.last_update_time)
    clash = turn(7, id=session.events[0].id)  # another event under a stored id
    chain = [turn(5), turn(6), clash, turn(8)]
    with pytest.raises(errors.DuplicateEventError, match="already stores an event"):
        run(service.append_events(session, chain))
    assert dumped(stored(service, session)) == before_store
    assert (dumped(session), session.last_update_time) == before_live
    # Each event has its delta back, temp keys included: it can be sent again.
    assert all("temp:scratch" in e.actions.state_delta for e in chain)
    chain.remove(clash)
    run(service.append_events(session, chain))
    assert [e.id for e in stored(service, session).events] == [e.id for e in session.events]
    assert len(session.events) == 5


def test_a_stale_copy_stores_none_of_them(make_service: Callable[[str], Any]) -> None:
    service = make_service("store")
    live = run(service.create_session(app_name=APP, user_id=USER))
    stale = stored(service, live)
    run(service.append_event(live, turn(0)))
    before = dumped(stored(service, live))
    with pytest.raises(StaleSessionError, match="read it again"):
        run(service.append_events(stale, [turn(1), turn(2)]))
    assert dumped(stored(service, live)) == before
    assert stale.events == [] and "step" not in stale.state


def test_a_repeat_inside_the_chain_is_told_as_append_event_tells_it(
    make_service: Callable[[str], Any],
) -> None:
    chained, one_by_one = make_service("chained"), make_service("one-by-one")
    first = turn(0)
    events = [first, turn(1), copy.deepcopy(first), turn(2)]
    twins = copy.deepcopy(events)

    async def both() -> tuple[Session, Session]:
        a = await chained.create_session(app_name=APP, user_id=USER)
        b = await one_by_one.create_session(app_name=APP, user_id=USER, session_id=a.id)
        await chained.append_events(a, events)
        for event in twins:
            await one_by_one.append_event(b, event)
        return a, b

    a, b = run(both())
    assert [e.id for e in a.events] == [e.id for e in b.events]
    assert len(a.events) == 3
    assert dumped(stored(chained, a)) == dumped(stored(one_by_one, b))


def test_nothing_to_store_touches_nothing(make_service: Callable[[str], Any]) -> None:
    service = make_service("store")
    session = run(service.create_session(app_name=APP, user_id=USER))
    assert run(service.append_events(session, [])) == []
    partial = turn(1, partial=True)
    assert run(service.append_events(session, [partial])) == [partial]
    assert stored(service, session).events == [] and session.events == []


def test_a_bad_value_stores_none_and_names_itself(make_service: Callable[[str], Any]) -> None:
    service = make_service("store")
    session = run(service.create_session(app_name=APP, user_id=USER))
    good = turn(0)
    bad = turn(1)
    bad.actions.state_delta["step"] = {1, 2}  # a set: not storable
    with pytest.raises(TypeError, match="step"):
        run(service.append_events(session, [good, bad, turn(2)]))
    assert stored(service, session).events == [] and session.events == []
    assert "temp:scratch" in good.actions.state_delta


def test_lmdb_takes_a_chain_in_one_transaction(tmp_path: Path) -> None:
    service = LmdbSessionService(tmp_path / "store", durability="sync")
    try:
        session = run(service.create_session(app_name=APP, user_id=USER))
        before = service.store.stat()["last_txnid"]
        run(service.append_events(session, [turn(n) for n in range(20)]))
        assert service.store.stat()["last_txnid"] == before + 1
        run(service.append_event(session, turn(20)))
        assert service.store.stat()["last_txnid"] == before + 2
        assert len(stored(service, session).events) == 21
    finally:
        service.store.close()


def test_chains_of_one_live_session_from_many_tasks_take_turns(
    make_service: Callable[[str], Any],
) -> None:
    service = make_service("store")

    async def many() -> Session:
        session = await service.create_session(app_name=APP, user_id=USER)
        await asyncio.gather(
            *(
                service.append_events(session, [turn(10 * t + n) for n in range(5)])
                for t in range(8)
            ),
            *(service.append_event(session, turn(1000 + t)) for t in range(4)),
        )
        return session

    session = run(many())
    assert len(session.events) == 44
    assert [e.id for e in stored(service, session).events] == [e.id for e in session.events]


def test_buffered_session_service_sends_queued_events_in_one_call(tmp_path: Path) -> None:
    sessions = pytest.importorskip("google.adk.sessions")
    if not hasattr(sessions, "BufferedSessionService"):
        pytest.skip("BufferedSessionService came with google-adk 2.15")
    calls: list[int] = []

    class Counting(LmdbSessionService):
        async def append_events(self, session: Session, events: list[Event]) -> list[Event]:
            calls.append(len(events))
            return await super().append_events(session, events)

    inner = Counting(tmp_path / "store", durability="sync")

    async def buffered() -> Session:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # ADK marks the service experimental
            service = sessions.BufferedSessionService(inner)
        live = await service.create_session(app_name=APP, user_id=USER)
        stale = await inner.get_session(app_name=APP, user_id=USER, session_id=live.id)
        for number in range(30):
            await service.append_event(live, turn(number))
        await service.flush()
        # A copy read before those: its write fails, and nothing of it is stored.
        await service.append_event(stale, turn(99))
        with pytest.raises(Exception, match="could not be persisted"):
            await service.flush()
        await service.aclose()
        return live

    try:
        live = run(buffered())
        got = stored(inner, live)
        assert [e.id for e in got.events] == [e.id for e in live.events] and len(got.events) == 30
        assert got.state == {k: v for k, v in live.state.items() if not k.startswith("temp:")}
        assert sum(calls[:-1]) == 30 and len(calls) - 1 < 30  # batched
    finally:
        inner.store.close()
