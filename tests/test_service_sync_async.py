"""The asynchronous facade: a representative part of the contract, and equal results.

SessionService and SyncSessionService share one logic; the second half runs
one scenario through both over every store and compares what they return.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from typing import Any

import pytest

import _stores
from _stores import (
    APP,
    USER,
    StoreFactory,
    as_plain,
    clone,
    ev,
    event_ids,
    run,
)
from sessionscope import (
    GetSessionConfig,
    ListSessionsResponse,
    Session,
    SessionService,
    SyncSessionService,
)
from sessionscope.errors import (
    AlreadyExistsError,
    DuplicateEventError,
    SessionNotFoundError,
    StaleSessionError,
    StateValueError,
    StoreClosedError,
)

# Fixtures shared with the other modules (bound here so pytest finds them).
asvc = _stores.asvc
store_factory = _stores.store_factory


async def _stored(asvc: SessionService, sid: str, user: str = USER) -> Session:
    got = await asvc.get_session(app_name=APP, user_id=user, session_id=sid)
    assert got is not None
    return got


def test_async_create_get_and_scopes(asvc: SessionService) -> None:
    """create routes scopes, drops temp:, and get reads the merged state back."""

    async def main() -> None:
        s = await asvc.create_session(
            app_name=APP,
            user_id=USER,
            session_id=" s ",
            state={"k": 1, "app:a": 2, "user:u": 3, "temp:t": 4, "b": b"\x00"},
        )
        assert s.id == "s"
        assert s.state == {"k": 1, "app:a": 2, "user:u": 3, "b": b"\x00"}
        assert s.events == []
        assert isinstance(s.revision, str)
        assert await _stored(asvc, "s") == s
        assert await asvc.get_app_state(app_name=APP) == {"a": 2}
        assert await asvc.get_user_state(app_name=APP, user_id=USER) == {"u": 3}
        assert await asvc.get_user_state(app_name=APP, user_id="nobody") == {}
        assert await asvc.get_session(app_name=APP, user_id=USER, session_id="no") is None
        with pytest.raises(AlreadyExistsError):
            await asvc.create_session(app_name=APP, user_id=USER, session_id="s")
        fresh = await asvc.create_session(app_name=APP, user_id=USER, session_id="  ")
        assert fresh.id.strip() and fresh.id != "s"

    run(main())


def test_async_bad_input(asvc: SessionService) -> None:
    """Bad ids are ValueErrors naming the argument; unstorable values StateValueErrors."""

    async def main() -> None:
        with pytest.raises(ValueError, match="app_name"):
            await asvc.create_session(app_name="", user_id=USER)
        with pytest.raises(ValueError, match="user_id"):
            await asvc.create_session(app_name=APP, user_id=5)
        with pytest.raises(ValueError, match="session_id"):
            await asvc.create_session(app_name=APP, user_id=USER, session_id="x" * 4097)
        with pytest.raises(ValueError, match="session_id"):
            await asvc.get_session(app_name=APP, user_id=USER, session_id="")
        with pytest.raises(StateValueError, match=r"state\['cart'\]\[2\]: set is not storable"):
            await asvc.create_session(
                app_name=APP, user_id=USER, state={"app:x": 1, "cart": [1, 2, {3}]}
            )
        assert await asvc.get_app_state(app_name=APP) == {}
        s = await asvc.create_session(app_name=APP, user_id=USER, session_id="s")
        with pytest.raises(StateValueError, match=r"event\."):
            await asvc.append_event(s, ev(content={1}))
        with pytest.raises(StateValueError, match=r"state\['k'\]"):
            await asvc.append_event(s, ev(delta={"k": {1}}))
        assert (await _stored(asvc, "s")).events == []

    run(main())


def test_async_get_filters(asvc: SessionService) -> None:
    """num_recent_events and after_timestamp, alone and together."""

    async def main() -> None:
        s = await asvc.create_session(app_name=APP, user_id=USER, session_id="s")
        for t in [-1.0, 10.0, 50.0, 20.0, 40.0, 30.0]:
            await asvc.append_event(s, ev(ts=t))

        async def stamps(**config: Any) -> list[float]:
            got = await asvc.get_session(
                app_name=APP, user_id=USER, session_id="s", config=GetSessionConfig(**config)
            )
            assert got is not None
            return [e.timestamp for e in got.events]

        assert await stamps() == [-1.0, 10.0, 50.0, 20.0, 40.0, 30.0]
        assert await stamps(num_recent_events=0) == []
        assert await stamps(num_recent_events=2) == [40.0, 30.0]
        assert await stamps(after_timestamp=0.0) == [10.0, 50.0, 20.0, 40.0, 30.0]
        assert await stamps(after_timestamp=40.0) == [50.0, 40.0]
        assert await stamps(num_recent_events=3, after_timestamp=25.0) == [40.0, 30.0]

    run(main())


def test_async_list_page_and_delete(asvc: SessionService) -> None:
    """list_sessions orders and pages; delete removes a session, shared state stays."""

    async def main() -> None:
        t = time.time() + 1000.0
        for n in range(7):
            s = await asvc.create_session(
                app_name=APP, user_id=f"u{n % 2}", session_id=f"s{n}", state={"app:n": n}
            )
            await asvc.append_event(s, ev(ts=t + n % 3))
        full = await asvc.list_sessions(app_name=APP)
        assert isinstance(full, ListSessionsResponse)
        keys = [(m.last_update_time, m.user_id, m.id) for m in full.sessions]
        assert keys == sorted(keys) and len(keys) == 7
        paged = []
        cursor = None
        for _ in range(20):
            page = await asvc.list_sessions(app_name=APP, limit=3, cursor=cursor)
            paged.extend(page.sessions)
            cursor = page.next_cursor
            if cursor is None:
                break
        assert paged == full.sessions
        only_u1 = await asvc.list_sessions(app_name=APP, user_id="u1")
        assert [m.id for m in only_u1.sessions] == [
            m.id for m in full.sessions if m.user_id == "u1"
        ]
        assert (await asvc.list_sessions(app_name="nope")).sessions == []
        await asvc.delete_session(app_name=APP, user_id="u0", session_id="s0")
        await asvc.delete_session(app_name=APP, user_id="u0", session_id="s0")
        assert await asvc.get_session(app_name=APP, user_id="u0", session_id="s0") is None
        assert len((await asvc.list_sessions(app_name=APP)).sessions) == 6
        assert await asvc.get_app_state(app_name=APP) == {"n": 6}

    run(main())


def test_async_append_rules(asvc: SessionService) -> None:
    """partial, temp:, live update, not found, stale, duplicates."""

    async def main() -> None:
        s = await asvc.create_session(app_name=APP, user_id=USER, session_id="s")
        partial = ev(delta={"k": 1}, partial=True)
        assert await asvc.append_event(s, partial) is partial
        assert s.events == [] and s.state == {}
        other = await _stored(asvc, "s")
        e = ev(delta={"k": 1, "temp:t": 2, "app:a": 3}, ts=123.0)
        old_revision = s.revision
        await asvc.append_event(s, e)
        assert s.state == {"k": 1, "temp:t": 2, "app:a": 3}
        assert e.actions.state_delta == {"k": 1, "app:a": 3}
        assert s.events[-1] == e and s.last_update_time == 123.0
        assert s.revision != old_revision and isinstance(s.revision, str)
        stored = await _stored(asvc, "s")
        assert stored.state == {"k": 1, "app:a": 3}
        assert stored.revision == s.revision
        with pytest.raises(StaleSessionError):
            await asvc.append_event(other, ev(delta={"x": 1}))
        assert await asvc.append_event(s, clone(e)) == e
        with pytest.raises(DuplicateEventError):
            await asvc.append_event(s, ev(id=e.id, content="other"))
        assert await _stored(asvc, "s") == stored
        with pytest.raises(SessionNotFoundError):
            await asvc.append_event(Session(id="ghost", app_name=APP, user_id=USER), ev())

    run(main())


def test_async_locked_appends_from_tasks(asvc: SessionService) -> None:
    """append_event_locked from many tasks: serialized, never stale, live copies catch up."""

    async def main() -> None:
        await asvc.create_session(app_name=APP, user_id=USER, session_id="s")
        n_tasks, per_task = 5, 20

        async def worker(idx: int) -> None:
            live = await _stored(asvc, "s")
            for i in range(per_task):
                key = f"count_{idx}"
                await asvc.append_event_locked(
                    live, ev(delta={key: live.state.get(key, 0) + 1}, content=[idx, i])
                )
                await asyncio.sleep(0)

        await asyncio.wait_for(asyncio.gather(*(worker(i) for i in range(n_tasks))), 60)
        got = await _stored(asvc, "s")
        assert len(set(event_ids(got))) == len(got.events) == n_tasks * per_task
        for idx in range(n_tasks):
            assert [e.content[1] for e in got.events if e.content[0] == idx] == list(
                range(per_task)
            )
            assert got.state[f"count_{idx}"] == per_task

    run(main())


def test_async_context_manager_and_close(store_factory: StoreFactory) -> None:
    """`async with SessionService(store)` closes it; later calls raise StoreClosedError."""

    async def main() -> SessionService:
        async with SessionService(store_factory()) as svc:
            s = await svc.create_session(app_name=APP, user_id=USER, session_id="s")
            await svc.append_event(s, ev(delta={"k": 1}))
            await svc.flush()
        with pytest.raises(StoreClosedError):
            await svc.get_session(app_name=APP, user_id=USER, session_id="s")
        with pytest.raises(StoreClosedError):
            await svc.append_event(s, ev())
        return svc

    run(main())

    async def explicit_close() -> None:
        svc = SessionService(store_factory())
        await svc.create_session(app_name=APP, user_id=USER, session_id="s2")
        await svc.close()
        with pytest.raises(StoreClosedError):
            await svc.list_sessions(app_name=APP)

    run(explicit_close())
    if store_factory.persistent:

        async def read_back() -> None:
            async with SessionService(store_factory.reopen()) as svc:
                assert (await _stored(svc, "s")).state == {"k": 1}
                assert (await _stored(svc, "s2")).events == []

        run(read_back())


# One scenario through both facades


class _AsyncAsSync:
    """Call the async service's methods from sync code, one loop for the scenario."""

    def __init__(self, service: SessionService, loop: asyncio.AbstractEventLoop) -> None:
        self._service = service
        self._loop = loop

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._service, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._loop.run_until_complete(method(*args, **kwargs))

        return call


def _scenario(svc: Any) -> list[Any]:
    """Run a fixed scenario; return every answer, normalized for comparison."""
    out: list[Any] = []

    def record(label: str, call: Callable[[], Any]) -> Any:
        try:
            value = call()
        except Exception as exc:
            out.append((label, "raised", type(exc).__name__))
            return None
        out.append((label, _normalize(value)))
        return value

    a = record(
        "create-a",
        lambda: svc.create_session(
            app_name=APP,
            user_id=USER,
            session_id=" a ",
            state={"k": 1, "app:x": [1, (2,)], "user:y": b"y", "temp:t": 1},
        ),
    )
    record("create-dup", lambda: svc.create_session(app_name=APP, user_id=USER, session_id="a"))
    record("create-bad", lambda: svc.create_session(app_name=APP, user_id=USER, state={"s": {1}}))
    record("create-b", lambda: svc.create_session(app_name=APP, user_id="u2", session_id="b"))
    old = record("get-a", lambda: svc.get_session(app_name=APP, user_id=USER, session_id="a"))
    for n in range(4):
        e = ev(delta={"n": n, "temp:z": n, "user:n": n}, content={"n": n}, ts=1000.0 + n)
        e.id = f"e{n}"
        record(f"append-{n}", lambda e=e: svc.append_event(a, e))
        out.append((f"live-{n}", _normalize(a)))
    record("append-stale", lambda: svc.append_event(old, ev(delta={"x": 1})))
    record("append-partial", lambda: svc.append_event(a, ev(delta={"x": 1}, partial=True)))
    retry = ev(delta={"n": 0, "user:n": 0}, content={"n": 0}, ts=1000.0, id="e0")
    record("append-retry", lambda: svc.append_event(a, retry))
    record("append-dup", lambda: svc.append_event(a, ev(id="e1", ts=5.0)))
    record("append-locked", lambda: svc.append_event_locked(old, ev(id="L", ts=2000.0)))
    out.append(("old-after-locked", _normalize(old)))
    for config in [None, GetSessionConfig(2), GetSessionConfig(None, 1002.0)]:
        record(
            f"get-{config}",
            lambda config=config: svc.get_session(
                app_name=APP, user_id=USER, session_id="a", config=config
            ),
        )
    record("list", lambda: svc.list_sessions(app_name=APP))
    record("list-page", lambda: svc.list_sessions(app_name=APP, limit=1))
    record("app-state", lambda: svc.get_app_state(app_name=APP))
    record("user-state", lambda: svc.get_user_state(app_name=APP, user_id=USER))
    record("delete", lambda: svc.delete_session(app_name=APP, user_id="u2", session_id="b"))
    record("get-deleted", lambda: svc.get_session(app_name=APP, user_id="u2", session_id="b"))
    record("bad-id", lambda: svc.get_session(app_name=APP, user_id=USER, session_id=""))
    record("flush", lambda: svc.flush())
    return out


def _normalize(value: Any) -> Any:
    """Drop what legitimately differs between two runs: clocks, random ids, cursors."""
    plain = as_plain(value)

    def scrub(x: Any) -> Any:
        if isinstance(x, dict):
            result = {}
            for k, v in x.items():
                if k in ("revision", "next_cursor") and v is not None:
                    result[k] = "<set>"
                elif k in ("create_time", "last_update_time", "timestamp") and isinstance(v, float):
                    result[k] = v if v < 1e6 else "<now>"
                elif k == "id" and isinstance(v, str) and len(v) >= 32:
                    result[k] = "<generated>"
                else:
                    result[k] = scrub(v)
            return result
        if isinstance(x, list):
            return [scrub(v) for v in x]
        return x

    return scrub(plain)


def test_sync_and_async_facades_give_equal_results(store_factory: StoreFactory) -> None:
    """The same scenario gives the same answers through both facades."""
    with SyncSessionService(store_factory()) as sync_svc:
        sync_out = _scenario(sync_svc)
    loop = asyncio.new_event_loop()
    try:
        async_svc = SessionService(store_factory.fresh("async-store"))
        try:
            async_out = _scenario(_AsyncAsSync(async_svc, loop))
        finally:
            loop.run_until_complete(async_svc.close())
    finally:
        loop.close()
    assert len(sync_out) == len(async_out)
    for left, right in zip(sync_out, async_out, strict=True):
        assert left == right
    # The scenario exercised what it meant to.
    outcomes = dict((x[0], x[1:]) for x in sync_out)
    assert outcomes["create-dup"] == ("raised", "AlreadyExistsError")
    assert outcomes["create-bad"] == ("raised", "StateValueError")
    assert outcomes["append-stale"] == ("raised", "StaleSessionError")
    assert outcomes["append-dup"] == ("raised", "DuplicateEventError")
    assert outcomes["bad-id"] == ("raised", "ValueError")
    assert outcomes["get-deleted"] == (None,)


def test_both_facades_share_one_store(store_factory: StoreFactory) -> None:
    """What one facade writes the other reads, over the same store object."""
    store = store_factory()
    sync_svc = SyncSessionService(store)
    async_svc = SessionService(store)

    async def main() -> None:
        s = await async_svc.create_session(app_name=APP, user_id=USER, session_id="s")
        await async_svc.append_event(s, ev(delta={"k": 1}))
        got = sync_svc.get_session(app_name=APP, user_id=USER, session_id="s")
        assert got is not None
        assert dataclasses.asdict(got) == dataclasses.asdict(s)
        sync_svc.append_event(got, ev(delta={"k": 2}))
        with pytest.raises(StaleSessionError):
            await async_svc.append_event(s, ev())
        assert (await _stored(async_svc, "s")) == got

    run(main())


def test_appends_in_flight_on_one_live_session_all_land_in_call_order(
    asvc: SessionService,
) -> None:
    """Two tasks appending through one current session object: neither is stale.

    The object is the only copy; each append lands on top of the one before
    it, in the order they were called, and the object ends with them all.
    """

    async def main() -> None:
        s = await asvc.create_session(app_name=APP, user_id=USER, session_id="one-object")
        events = [ev(delta={f"k{i}": i}, content={"i": i}) for i in range(6)]
        locked = {2, 5}  # a locked append waits its turn as well
        got = await asyncio.gather(
            *(
                (asvc.append_event_locked if i in locked else asvc.append_event)(s, e)
                for i, e in enumerate(events)
            )
        )
        assert got == events
        assert [e.content["i"] for e in s.events] == list(range(6))
        stored = await _stored(asvc, "one-object")
        assert [e.content["i"] for e in stored.events] == list(range(6))
        assert {k: stored.state[k] for k in stored.state if k.startswith("k")} == {
            f"k{i}": i for i in range(6)
        }
        assert stored.revision == s.revision
        # A stale copy is still refused: the turns are per object, not per session.
        copy = clone(stored)
        await asvc.append_event(s, ev(content={"i": 6}))
        with pytest.raises(StaleSessionError):
            await asvc.append_event(copy, ev(content={"i": 7}))

    run(main())


def test_an_append_cancelled_while_waiting_its_turn_leaves_the_others_going(
    asvc: SessionService,
) -> None:
    async def main() -> None:
        s = await asvc.create_session(app_name=APP, user_id=USER, session_id="cancelled-turn")
        first = asyncio.ensure_future(asvc.append_event(s, ev(content={"i": 0})))
        waiting = asyncio.ensure_future(asvc.append_event(s, ev(content={"i": 1})))
        last = asyncio.ensure_future(asvc.append_event(s, ev(content={"i": 2})))
        await asyncio.sleep(0)  # all three have started; the later two wait
        waiting.cancel()
        await asyncio.gather(first, last, return_exceptions=True)
        assert first.exception() is None and last.exception() is None
        stored = await _stored(asvc, "cancelled-turn")
        contents = [e.content["i"] for e in stored.events]
        # The cancelled one either never ran, or ran whole before the last.
        assert contents in ([0, 2], [0, 1, 2])
        assert [e.content["i"] for e in s.events] == contents
        # Nothing is left waiting: a later append goes straight through.
        await asvc.append_event(s, ev(content={"i": 3}))
        assert len((await _stored(asvc, "cancelled-turn")).events) == len(contents) + 1

    run(main())
