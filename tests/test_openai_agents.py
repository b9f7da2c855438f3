"""sessionscope.openai_agents: the OpenAI Agents SDK's Session on every store kind.

Items round trip exactly; limits as the SDK resolves them; pops and adds are
atomic across real processes; retention and the command line see these
sessions; a real ``Runner.run`` with a scripted model, over two turns in two
processes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents")

from agents import RunContextWrapper
from agents.memory import Session, SessionSettings

import _stores
from _children import children
from _stores import LMDB_KINDS, REDIS_KINDS, StoreFactory, run, run_cli, store_factory
from sessionscope import Event, SessionService, SyncSessionService, openai_agents
from sessionscope.admin.ops import check_store
from sessionscope.core import MAX_DEPTH
from sessionscope.errors import (
    CorruptStoreError,
    SessionNotFoundError,
    StaleSessionError,
    StateValueError,
)
from sessionscope.openai_agents import DEFAULT_APP_NAME, DEFAULT_USER_ID, AgentsSession

__all__ = ["store_factory"]

pytestmark = pytest.mark.openai_agents

WORKERS = Path(__file__).with_name("_agents_workers.py")
SHARED_KINDS = (*LMDB_KINDS, *REDIS_KINDS)

RICH = [
    {"role": "user", "content": "héllo \x00 ✓", "type": "message"},
    {
        "type": "function_call",
        "name": "lookup",
        "arguments": '{"q": 1}',
        "call_id": "c1",
        "id": "fc1",
        "status": "completed",
    },
    {"type": "function_call_output", "call_id": "c1", "output": "42"},
    {
        "role": "assistant",
        "type": "message",
        "id": "m1",
        "status": "completed",
        "content": [{"type": "output_text", "text": "the answer", "annotations": []}],
    },
    {"role": "user", "content": [{"type": "input_image", "image": b"\x89PNG\x00\xff"}],
     "meta": {"n": [1, 2.5, None, True, {"deep": [b"", -(2**63)]}]}},
]  # fmt: skip


def items(tag: str, count: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"{tag}{i}"} for i in range(count)]


_SURROGATE = "it is not storable as UTF-8"


def uri_of(factory: StoreFactory) -> str:
    """Return the URI another process opens this factory's store with."""
    if factory.kind in REDIS_KINDS:
        return factory.uri
    return f"lmdb://{factory.path}?durability={factory.durability}"


def test_it_is_a_session_of_the_sdk(store_factory: StoreFactory) -> None:
    session = AgentsSession("s", store_factory())
    assert isinstance(session, Session)
    assert (session.app_name, session.user_id) == (DEFAULT_APP_NAME, DEFAULT_USER_ID)
    assert session.session_settings == SessionSettings()


def test_items_come_back_equal_and_in_order(store_factory: StoreFactory) -> None:
    store = store_factory()

    async def scenario() -> None:
        session = AgentsSession("conv", store)
        assert await session.get_items() == []
        await session.add_items(RICH[:2])
        await session.add_items(RICH[2:])
        await session.add_items([])
        assert await session.get_items() == RICH
        assert await session.get_items(2) == RICH[-2:]
        assert await session.get_items(0) == []
        assert await session.get_items(100) == RICH
        # The values returned are copies: changing them changes nothing stored.
        got = await session.get_items()
        got[0]["content"] = "changed"
        assert await session.get_items() == RICH

    run(scenario())


@pytest.mark.parametrize("kind", SHARED_KINDS)
def test_a_persistent_store_gives_the_items_back_after_a_reopen(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    factory = StoreFactory(kind, tmp_path, _stores.redis_url(request, kind))
    try:
        store = factory()
        run(AgentsSession("conv", store).add_items(RICH))
        store.close()
        reopened = factory.reopen()
        assert run(AgentsSession("conv", reopened).get_items()) == RICH
    finally:
        factory.close_all()


def test_session_settings_limit_is_honoured_as_the_sdk_resolves_it(
    store_factory: StoreFactory,
) -> None:
    store = store_factory()

    async def scenario() -> None:
        typed = AgentsSession("s", store, session_settings=SessionSettings(limit=2))
        await typed.add_items(items("x", 5))
        assert await typed.get_items() == items("x", 5)[-2:]
        # An explicit limit wins over the settings.
        assert await typed.get_items(4) == items("x", 5)[-4:]
        as_dict = AgentsSession("s", store, session_settings={"limit": 3})
        assert await as_dict.get_items() == items("x", 5)[-3:]
        unlimited = AgentsSession("s", store)
        assert await unlimited.get_items() == items("x", 5)

    run(scenario())


def test_pop_item_takes_the_newest_and_none_when_empty(store_factory: StoreFactory) -> None:
    store = store_factory()

    async def scenario() -> None:
        session = AgentsSession("s", store)
        assert await session.pop_item() is None  # never created
        await session.add_items(items("a", 3))
        assert await session.pop_item() == {"role": "user", "content": "a2"}
        await session.add_items(items("b", 1))
        assert await session.get_items() == [*items("a", 2), *items("b", 1)]
        assert await session.get_items(1) == items("b", 1)
        popped = [await session.pop_item() for _ in range(4)]
        assert popped == [items("b", 1)[0], items("a", 2)[1], items("a", 2)[0], None]
        await session.add_items(RICH)
        assert await session.get_items() == RICH

    run(scenario())
    report = check_store(store)
    assert report.clean, report.problems


def test_a_popped_session_stays_consistent_for_the_native_reads(
    store_factory: StoreFactory,
) -> None:
    """After pops, get_session's recent events, the marker and the record agree."""
    store = store_factory()
    svc = SyncSessionService(store)
    run(AgentsSession("s", store).add_items(items("a", 6)))
    before = svc.get_session(app_name=DEFAULT_APP_NAME, user_id=DEFAULT_USER_ID, session_id="s")
    assert before is not None
    popped = store.pop_events(DEFAULT_APP_NAME, DEFAULT_USER_ID, "s", 2).result()
    assert [json.loads(json.dumps(_content(r))) for r in popped] == ["a4", "a5"]
    after = svc.get_session(app_name=DEFAULT_APP_NAME, user_id=DEFAULT_USER_ID, session_id="s")
    assert after is not None and after.revision != before.revision
    assert [e.id for e in after.events] == [e.id for e in before.events[:4]]
    record = store.load_session(DEFAULT_APP_NAME, DEFAULT_USER_ID, "s", 1, None).record
    assert record.stored_count == 4 and record.last_event_id == before.events[3].id
    # More than are stored: what is there, then nothing.
    assert len(store.pop_events(DEFAULT_APP_NAME, DEFAULT_USER_ID, "s", 10).result()) == 4
    assert store.pop_events(DEFAULT_APP_NAME, DEFAULT_USER_ID, "s", 1).result() == []
    record = store.load_session(DEFAULT_APP_NAME, DEFAULT_USER_ID, "s", None, None).record
    assert record.stored_count == 0 and record.last_event_id is None
    assert check_store(store).clean


def _content(record: bytes) -> Any:
    from sessionscope.codec import decode_event

    return decode_event(record)["content"]["content"]


def _stored_ids(store: Any, session_id: str = "s") -> tuple[list[str], str]:
    """Return the ids of a session's stored events, in order, and its revision."""
    svc = SyncSessionService(store)
    session = svc.get_session(app_name=DEFAULT_APP_NAME, user_id=DEFAULT_USER_ID,
                              session_id=session_id)  # fmt: skip
    assert session is not None and session.revision is not None
    return [event.id for event in session.events], session.revision


async def _append_native(store: Any, author: str) -> str:
    """Append an event without content (no OpenAI Agents item) through the native API."""
    svc = SessionService(store)
    session = await svc.get_session(app_name=DEFAULT_APP_NAME, user_id=DEFAULT_USER_ID,
                                    session_id="s")  # fmt: skip
    assert session is not None
    event = await svc.append_event(session, Event(author=author))
    return event.id


def test_pop_item_refuses_an_event_that_holds_no_item_and_removes_nothing(
    store_factory: StoreFactory,
) -> None:
    """As get_items refuses such a session, pop_item does, and the store stays as it was."""
    store = store_factory()
    session = AgentsSession("s", store)
    run(session.add_items(items("a", 1)))
    run(_append_native(store, "native"))
    run(session.add_items(items("b", 2)))
    assert [run(session.pop_item()) for _ in range(2)] == items("b", 2)[::-1]
    before = _stored_ids(store)
    for _ in range(2):  # refused again: nothing went the first time
        with pytest.raises(CorruptStoreError, match=r"newest event .* holds no OpenAI Agents item"):
            run(session.pop_item())
    assert _stored_ids(store) == before and len(before[0]) == 2
    assert check_store(store).clean


class _WrittenDuringPop:
    """A store where another writer appends to the session while a pop of this one runs.

    ``before`` runs just before each of the first ``times`` pops that
    pop_item sends (after its read of the newest event), ``after`` right
    after each, as a writer in another process would land there. Each
    returns the id of the event it appended.
    """

    def __init__(
        self,
        store: Any,
        before: Callable[[], Awaitable[str]] | None = None,
        after: Callable[[], Awaitable[str]] | None = None,
        times: int = 1,
    ) -> None:
        self._store, self._before, self._after, self._times = store, before, after, times
        self.appended: list[str] = []

    @property
    def aio(self) -> Any:
        return self

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store.aio, name)

    async def pop_events(self, *key: Any, **options: Any) -> Any:
        writing = self._times > 0
        self._times -= 1
        if writing and self._before is not None:
            self.appended.append(await self._before())
        try:
            return await self._store.aio.pop_events(*key, **options)
        finally:
            if writing and self._after is not None:
                self.appended.append(await self._after())


def _native_writer(store: Any) -> Callable[[], Awaitable[str]]:
    count = 0

    async def write() -> str:
        nonlocal count
        count += 1
        return await _append_native(store, f"native{count}")

    return write


def _item_writer(store: Any) -> Callable[[], Awaitable[str]]:
    count = 0

    async def write() -> str:
        nonlocal count
        count += 1
        await AgentsSession("s", store).add_items(items("w", count)[-1:])
        ids, _ = _stored_ids(store)
        return ids[-1]

    return write


def test_an_event_without_item_appended_before_the_pop_is_never_removed(
    store_factory: StoreFactory,
) -> None:
    """The pop is conditional on the newest event read: it removes nothing, then refuses."""
    store = store_factory()
    run(AgentsSession("s", store).add_items(items("a", 2)))
    mine, _ = _stored_ids(store)
    writer = _WrittenDuringPop(store, before=_native_writer(store))
    with pytest.raises(CorruptStoreError, match=r"newest event .* holds no OpenAI Agents item"):
        run(AgentsSession("s", writer).pop_item())
    assert _stored_ids(store)[0] == [*mine, *writer.appended]
    assert check_store(store).clean


def test_events_without_item_appended_around_a_pop_all_stay(store_factory: StoreFactory) -> None:
    """One lands before the pop, one after it: neither is removed, none is lost."""
    store = store_factory()
    run(AgentsSession("s", store).add_items(items("a", 2)))
    mine, _ = _stored_ids(store)
    write = _native_writer(store)
    writer = _WrittenDuringPop(store, before=write, after=write)
    with pytest.raises(CorruptStoreError, match=r"newest event .* holds no OpenAI Agents item"):
        run(AgentsSession("s", writer).pop_item())
    assert _stored_ids(store)[0] == [*mine, *writer.appended] and len(writer.appended) == 2
    assert check_store(store).clean


def test_an_item_appended_before_the_pop_is_the_one_popped(store_factory: StoreFactory) -> None:
    """pop_item returns the newest item at the time of the pop; the one it read first stays."""
    store = store_factory()
    run(AgentsSession("s", store).add_items(items("a", 2)))
    mine, _ = _stored_ids(store)
    writer = _WrittenDuringPop(store, before=_item_writer(store))
    assert run(AgentsSession("s", writer).pop_item()) == items("w", 1)[0]
    assert _stored_ids(store)[0] == mine
    assert run(AgentsSession("s", store).get_items()) == items("a", 2)


def test_a_pop_that_always_loses_to_other_writers_gives_up_removing_nothing(
    store_factory: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(openai_agents, "_POP_TRIES", 4)
    store = store_factory()
    run(AgentsSession("s", store).add_items(items("a", 2)))
    mine, _ = _stored_ids(store)
    writer = _WrittenDuringPop(store, before=_item_writer(store), times=10)
    with pytest.raises(StaleSessionError, match="changed by other writers 4 times"):
        run(AgentsSession("s", writer).pop_item())
    assert _stored_ids(store)[0] == [*mine, *writer.appended] and len(writer.appended) == 4


def test_clear_session_leaves_other_sessions_alone(store_factory: StoreFactory) -> None:
    store = store_factory()
    svc = SyncSessionService(store)
    adk_like = svc.create_session(app_name="my-adk-app", user_id=DEFAULT_USER_ID, session_id="s")

    async def scenario() -> None:
        mine = AgentsSession("s", store)
        other = AgentsSession("t", store)
        other_user = AgentsSession("s", store, user_id="someone-else")
        for session in (mine, other, other_user):
            await session.add_items(items(session.session_id + session.user_id, 2))
        await mine.clear_session()
        assert await mine.get_items() == []
        assert await mine.pop_item() is None
        assert await other.get_items() == items("t" + DEFAULT_USER_ID, 2)
        assert await other_user.get_items() == items("ssomeone-else", 2)
        await mine.clear_session()  # clearing an empty session is a no-op
        await mine.add_items(items("new", 1))
        assert await mine.get_items() == items("new", 1)

    run(scenario())
    kept = svc.get_session(app_name="my-adk-app", user_id=DEFAULT_USER_ID, session_id="s")
    assert kept is not None and kept.id == adk_like.id


def test_the_wrapper_keyword_is_accepted(store_factory: StoreFactory) -> None:
    store = store_factory()
    wrapper = RunContextWrapper(context={"user": "x"})

    async def scenario() -> None:
        session = AgentsSession("s", store)
        await session.add_items(items("w", 2), wrapper=wrapper)
        assert await session.get_items(wrapper=wrapper) == items("w", 2)
        assert await session.get_items(1, wrapper=wrapper) == items("w", 2)[1:]
        assert await session.pop_item(wrapper=wrapper) == items("w", 2)[1]
        await session.clear_session(wrapper=wrapper)
        assert await session.get_items() == []

    run(scenario())


def test_bad_items_raise_and_store_nothing(store_factory: StoreFactory) -> None:
    store = store_factory()

    async def scenario() -> None:
        session = AgentsSession("s", store)
        await session.add_items(items("ok", 1))
        with pytest.raises(StateValueError, match=r"items\[1\]"):
            await session.add_items([{"role": "user"}, {"bad": {1, 2}}])
        with pytest.raises(TypeError, match="list of items"):
            await session.add_items({"role": "user"})  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"^items must be a list of items, not int$"):
            await session.add_items(3)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="negative"):
            await session.get_items(-1)
        assert await session.get_items() == items("ok", 1)

    run(scenario())
    with pytest.raises(ValueError, match="session_id"):
        AgentsSession("", store)
    with pytest.raises(ValueError, match="app_name"):
        AgentsSession("s", store, app_name="")


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ([{"role": "user"}, {"role": "user", "bad": {1}}], "items[1]['bad']: set is not storable"),
        ([{"role": "user", "content": {1}}], "items[0]['content']: set is not storable"),
        ([{"role": "user"}, {1: "x"}], "items[1]: dict key 1 is not a str"),
        ([{"content": [(), object()]}], "items[0]['content'][1]: object is not storable"),
        ([{"role": "\ud800"}], "items[0]['role']: str holds a lone surrogate: " + _SURROGATE),
    ],
    ids=["value", "content", "key", "nested", "text"],
)
def test_an_unstorable_value_is_named_by_its_place_in_the_item(
    bad: list[Any], message: str
) -> None:
    """The path runs from the item as given, not through the event record it is kept in."""
    session = AgentsSession("s")
    with pytest.raises(StateValueError) as refused:
        run(session.add_items(bad))
    assert str(refused.value) == message
    assert run(session.get_items()) == []


def test_an_item_nested_as_deep_as_a_value_may_be_is_refused_with_its_own_path() -> None:
    """The record holds the item one level down, so the store's depth limit counts from there.

    Every record the session writes is one a dump import accepts (it checks
    whole records); the message names the place in the item.
    """
    deep: Any = "x"
    for _ in range(MAX_DEPTH - 1):
        deep = [deep]
    session = AgentsSession("s")
    with pytest.raises(StateValueError, match="nested too deeply") as refused:
        run(session.add_items([{"role": "user", "content": deep}]))
    assert str(refused.value).startswith("items[0]['content'][0][0]")
    assert "['content']['content']" not in str(refused.value)
    run(session.add_items([{"role": "user", "content": deep[0]}]))  # one level less is stored
    assert run(session.get_items()) == [{"role": "user", "content": deep[0]}]


def test_the_native_service_reads_the_items_as_event_contents(
    store_factory: StoreFactory,
) -> None:
    store = store_factory()
    run(AgentsSession("s", store).add_items(RICH))
    svc = SyncSessionService(store)
    session = svc.get_session(app_name=DEFAULT_APP_NAME, user_id=DEFAULT_USER_ID, session_id="s")
    assert session is not None
    assert [event.content for event in session.events] == RICH
    assert [event.author for event in session.events] == [
        "user", "function_call", "function_call_output", "assistant", "user"
    ]  # fmt: skip


def test_a_session_written_by_the_adk_drop_in_is_refused(store_factory: StoreFactory) -> None:
    """An ADK event has no content field when it has none: not an item, and said so."""
    store = store_factory()
    svc = SyncSessionService(store)
    session = svc.create_session(app_name=DEFAULT_APP_NAME, user_id=DEFAULT_USER_ID,
                                 session_id="native")  # fmt: skip
    svc.append_event(session, Event(author="me"))
    with pytest.raises(CorruptStoreError, match="no OpenAI Agents item"):
        run(AgentsSession("native", store).get_items())


def test_records_laid_out_otherwise_are_read_one_by_one(store_factory: StoreFactory) -> None:
    """A record whose content is not its last entry still gives its content, in order.

    ``get_items`` gathers the items of records laid out as ``add_items``
    writes them without decoding the rest; a native event with content and
    fields after it is read the slow way, and the order holds.
    """
    store = store_factory()
    run(AgentsSession("mixed", store).add_items(items("a", 2)))
    svc = SyncSessionService(store)
    session = svc.get_session(app_name=DEFAULT_APP_NAME, user_id=DEFAULT_USER_ID,
                              session_id="mixed")  # fmt: skip
    assert session is not None
    content = {"role": "user", "content": "native"}
    svc.append_event(session, Event(author="me", content=content, invocation_id="inv-1"))
    run(AgentsSession("mixed", store).add_items(items("b", 1)))
    expected = [*items("a", 2), content, *items("b", 1)]
    assert run(AgentsSession("mixed", store).get_items()) == expected
    assert run(AgentsSession("mixed", store).get_items(2)) == expected[-2:]


class _ClearedBeforeAppends:
    """A store whose sessions another process clears right before appends of this one.

    Before the first ``times`` appends (every one with None), as a clear in
    a tight loop that wins the race each time.
    """

    def __init__(self, store: Any, times: int | None) -> None:
        self._store, self._times = store, times

    @property
    def aio(self) -> Any:
        return self

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store.aio, name)

    async def append_many(self, batch: Any) -> Any:
        if self._times is None or self._times > 0:
            self._times = None if self._times is None else self._times - 1
            for key in batch.keys:
                await self._store.aio.delete_session(*key)
        return await self._store.aio.append_many(batch)


def test_an_add_succeeds_when_clears_land_before_its_appends_many_times(
    store_factory: StoreFactory,
) -> None:
    """Each lost round is sent again: the items are stored, whole, once."""
    store = store_factory()
    run(AgentsSession("s", store).add_items(items("old", 2)))
    run(AgentsSession("s", _ClearedBeforeAppends(store, 40)).add_items(items("a", 3)))
    assert run(AgentsSession("s", store).get_items()) == items("a", 3)
    assert check_store(store).clean


def test_an_add_that_always_loses_to_a_clear_gives_up_and_says_so(
    store_factory: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rounds are bounded; the error is the session's absence, and nothing is stored."""
    monkeypatch.setattr(openai_agents, "_CREATE_TRIES", 30)
    store = store_factory()
    with pytest.raises(SessionNotFoundError) as refused:
        run(AgentsSession("s", _ClearedBeforeAppends(store, None)).add_items(items("a", 3)))
    assert refused.value.stored == 0  # type: ignore[attr-defined]
    assert run(AgentsSession("s", store).get_items()) == []


def test_a_uri_opens_a_store_the_session_owns(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with AgentsSession("s", f"lmdb://{tmp_path / 'db'}") as session:
            await session.add_items(items("u", 2))
        async with AgentsSession("s", f"lmdb://{tmp_path / 'db'}") as again:
            assert await again.get_items() == items("u", 2)

    run(scenario())


def test_retention_sees_these_sessions(store_factory: StoreFactory) -> None:
    store = store_factory()
    svc = SyncSessionService(store)
    run(AgentsSession("old", store).add_items(items("o", 2)))
    old = store.load_session(DEFAULT_APP_NAME, DEFAULT_USER_ID, "old", 0, None).record
    while time.time() <= old.last_update_time:  # the next add gets a later time
        time.sleep(0.001)
    run(AgentsSession("fresh", store).add_items(items("f", 2)))
    fresh = store.load_session(DEFAULT_APP_NAME, DEFAULT_USER_ID, "fresh", 0, None).record
    assert fresh.last_update_time > old.last_update_time
    # Idle before a time between the two: the store's own cut, no clock involved.
    assert store.expire_sessions(DEFAULT_APP_NAME, fresh.last_update_time).result() == 1
    assert svc.expire_sessions(app_name=DEFAULT_APP_NAME, idle_for=3600) == 0
    assert run(AgentsSession("old", store).get_items()) == []
    assert run(AgentsSession("fresh", store).get_items()) == items("f", 2)
    assert svc.truncate_events(app_name=DEFAULT_APP_NAME, user_id=DEFAULT_USER_ID,
                               session_id="fresh", keep_last=1) == 1  # fmt: skip
    assert run(AgentsSession("fresh", store).get_items()) == items("f", 2)[1:]


def test_a_session_ttl_expires_idle_conversations(tmp_path: Path) -> None:
    store = _stores.StoreFactory("lmdb-sync", tmp_path)(session_ttl=0.2)
    try:
        run(AgentsSession("s", store).add_items(items("t", 1)))
        deadline = time.monotonic() + 30
        while run(AgentsSession("s", store).get_items()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert run(AgentsSession("s", store).get_items()) == []
    finally:
        store.close()


@pytest.mark.parametrize("kind", ["lmdb-sync", "redis"])
def test_the_command_line_sees_these_sessions(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    factory = StoreFactory(kind, tmp_path, _stores.redis_url(request, kind))
    try:
        store = factory()
        run(AgentsSession("conv-1", store).add_items(RICH))
        run(AgentsSession("conv-1", store).pop_item())
        uri = uri_of(factory).split("?durability")[0]
        listed = run_cli("ls", "--json", "--app", DEFAULT_APP_NAME, "--user", DEFAULT_USER_ID, uri)
        assert listed.returncode == 0, listed.stderr
        assert "conv-1" in listed.stdout
        shown = run_cli("show", "--json", uri, DEFAULT_APP_NAME, DEFAULT_USER_ID, "conv-1")
        assert shown.returncode == 0, shown.stderr
        assert "function_call_output" in shown.stdout and "the answer" in shown.stdout
        out = tmp_path / "dump.jsonl"
        exported = run_cli("export", "--app", DEFAULT_APP_NAME, uri, str(out))
        assert exported.returncode == 0, exported.stderr
        assert out.stat().st_size > 0
        verified = run_cli("verify", uri)
        assert verified.returncode == 0, verified.stdout + verified.stderr
    finally:
        factory.close_all()


# -- across processes ----------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("kind", SHARED_KINDS)
def test_processes_adding_to_one_session_interleave_whole_lists(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    factory = StoreFactory(kind, tmp_path, _stores.redis_url(request, kind))
    try:
        store = factory()
        uri = uri_of(factory)
        writers, lists, size = 4, 25, 5
        args = [("add", uri, "shared", f"w{n}", str(lists), str(size)) for n in range(writers)]
        with children(tmp_path, *args, stdin=True, script=WORKERS) as kids:
            for kid in kids:
                kid.expect("ready")
            for kid in kids:
                kid.send("go")
            for kid in kids:
                kid.expect("done")
                kid.wait_ok()
        got = [item["content"] for item in run(AgentsSession("shared", store).get_items())]
        assert len(got) == writers * lists * size
        # Whole lists, each in order, never split by another writer's items.
        runs = [got[i : i + size] for i in range(0, len(got), size)]
        for chunk in runs:
            tag, number, _ = chunk[0].split(":")
            assert chunk == [f"{tag}:{number}:{i}" for i in range(size)]
        # Every writer's lists, in its own order, none lost.
        for n in range(writers):
            numbers = [int(c[0].split(":")[1]) for c in runs if c[0].startswith(f"w{n}:")]
            assert numbers == list(range(lists))
        assert check_store(store).clean
    finally:
        factory.close_all()


@pytest.mark.slow
@pytest.mark.parametrize("kind", SHARED_KINDS)
def test_processes_popping_one_session_never_get_the_same_item(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    factory = StoreFactory(kind, tmp_path, _stores.redis_url(request, kind))
    try:
        store = factory()
        total = 300
        run(AgentsSession("shared", store).add_items(items("p", total)))
        uri = uri_of(factory)
        with children(tmp_path, *[("pop", uri, "shared")] * 3, stdin=True,
                      script=WORKERS) as kids:  # fmt: skip
            for kid in kids:
                kid.expect("ready")
            for kid in kids:
                kid.send("go")
            taken = []
            for kid in kids:
                kid.expect("done")
                line = kid.readline()
                assert line is not None
                mine = json.loads(line)
                # Each process gets its items newest first.
                assert mine == sorted(mine, key=lambda c: -int(c[1:]))
                taken += mine
                kid.wait_ok()
        assert sorted(taken) == sorted(f"p{i}" for i in range(total))
        assert run(AgentsSession("shared", store).get_items()) == []
        assert check_store(store).clean
    finally:
        factory.close_all()


@pytest.mark.slow
@pytest.mark.parametrize("kind", SHARED_KINDS)
def test_pops_racing_a_process_that_appends_events_without_item_never_remove_one(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Another process appends a native event, then an item, over and over, while this one pops.

    Every event without item stays stored; every item is popped once or
    left; a pop that finds such an event newest refuses it, removing nothing.
    """
    factory = StoreFactory(kind, tmp_path, _stores.redis_url(request, kind))
    try:
        store = factory()
        session = AgentsSession("s", store)
        run(session.add_items(items("a", 20)))
        popped: list[str] = []
        refusals = 0
        with children(tmp_path, ("native", uri_of(factory), "s", "150"), stdin=True,
                      script=WORKERS) as kids:  # fmt: skip
            (kid,) = kids
            kid.expect("ready")
            kid.send("go")

            async def pop_while_it_writes() -> None:
                nonlocal refusals
                while kid.proc.poll() is None:
                    try:
                        item = await session.pop_item()
                    except CorruptStoreError as error:
                        assert "the newest event of this session holds no" in str(error)
                        refusals += 1
                        continue
                    if item is not None:
                        popped.append(item["content"])

            run(pop_while_it_writes())
            kid.expect("done")
            line = kid.readline()
            assert line is not None
            written = json.loads(line)
            kid.wait_ok()
        stored, _ = _stored_ids(store)
        assert set(written["natives"]) <= set(stored)
        left = [item["content"] for item in _items_as_stored(store)]
        assert sorted(popped + left) == sorted([f"a{i}" for i in range(20)] + written["added"])
        assert len(set(popped)) == len(popped) and refusals > 0 and popped
        assert check_store(store).clean
    finally:
        factory.close_all()


def _items_as_stored(store: Any) -> list[Any]:
    """Return the items among a session's stored events (its events without item left out)."""
    from sessionscope.codec import decode_event

    loaded = store.load_session(DEFAULT_APP_NAME, DEFAULT_USER_ID, "s", None, None)
    fields = [decode_event(record) for record in loaded.events]
    return [f["content"] for f in fields if isinstance(f, dict) and "content" in f]


@pytest.mark.slow
def test_adds_succeed_while_another_process_keeps_clearing_the_session(tmp_path: Path) -> None:
    """A clear between the session's creation and its items does not make an add fail.

    One process clears the session in a loop while two others add lists to
    it: every add succeeds (a worker whose add raises exits non-zero), and
    what is left is whole lists.
    """
    factory = StoreFactory("lmdb-sync", tmp_path)
    try:
        store = factory()
        uri = uri_of(factory)
        lists, size = 100, 2
        adders = [("add", uri, "shared", f"w{n}", str(lists), str(size)) for n in range(2)]
        clearer = ("clear", uri, "shared", "1000000", "120")
        with children(tmp_path, clearer, *adders, stdin=True, script=WORKERS) as kids:
            for kid in kids:
                kid.expect("ready")
            for kid in kids:
                kid.send("go")
            for kid in kids[1:]:
                kid.expect("done")
                kid.wait_ok()
            kids[0].send("stop")
            kids[0].expect("done")
            line = kids[0].readline()
            assert line is not None and json.loads(line) > 0
            kids[0].wait_ok()
        got = [item["content"] for item in run(AgentsSession("shared", store).get_items())]
        for first in range(0, len(got), size):
            tag, number, _ = got[first].split(":")
            assert got[first : first + size] == [f"{tag}:{number}:{i}" for i in range(size)]
        assert check_store(store).clean
    finally:
        factory.close_all()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["lmdb-sync", "redis"])
def test_a_runner_with_a_tool_over_two_turns_in_two_processes(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    factory = StoreFactory(kind, tmp_path, _stores.redis_url(request, kind))
    try:
        uri = uri_of(factory)
        answers = []
        for question in ("weather in Paris?", "and tomorrow?"):
            with children(tmp_path, ("turn", uri, "chat", question), stdin=True,
                          script=WORKERS) as (kid,):  # fmt: skip
                kid.expect("ready")
                kid.send("go")
                kid.expect("done")
                line = kid.readline()
                assert line is not None
                answers.append(json.loads(line))
                kid.wait_ok()
        assert answers == [
            "sunny in city1 | questions=['weather in Paris?']",
            "sunny in city2 | questions=['weather in Paris?', 'and tomorrow?']",
        ]
        history = run(AgentsSession("chat", factory()).get_items())
        kinds = [item.get("type", item.get("role")) for item in history]
        assert kinds == ["user", "function_call", "function_call_output", "message"] * 2
        assert history[0]["content"] == "weather in Paris?"
        assert history[2]["output"] == "sunny in city1"
    finally:
        factory.close_all()


def test_pop_events_takes_thousands_in_one_call(store_factory: StoreFactory) -> None:
    """More than a Lua call unpacks at once: the Redis function works in slices."""
    store = store_factory()
    run(AgentsSession("big", store).add_items(items("b", 900)))
    run(AgentsSession("big", store).add_items(items("c", 2600)))
    popped = store.pop_events(DEFAULT_APP_NAME, DEFAULT_USER_ID, "big", 3000).result()
    assert [_content(r) for r in popped] == [f"b{i}" for i in range(500, 900)] + [
        f"c{i}" for i in range(2600)
    ]
    assert run(AgentsSession("big", store).get_items()) == items("b", 500)
    assert check_store(store).clean


def test_a_pop_sent_again_after_a_lost_reply_removes_nothing_more(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """The same call (same token) answers as the first: what a retried connection sends."""
    import redis

    from sessionscope.stores.redis.common import LIBRARY
    from sessionscope.stores.redis.keys import _Keys

    factory = StoreFactory("redis", tmp_path, _stores.redis_url(request, "redis"))
    try:
        store = factory()
        run(AgentsSession("s", store).add_items(items("r", 3)))
        assert store.pop_events(DEFAULT_APP_NAME, DEFAULT_USER_ID, "s", 1).result()  # loads
        rec, events, ids, times, _, positions, names = _Keys(factory.prefix).session(
            DEFAULT_APP_NAME, DEFAULT_USER_ID, "s"
        )
        client = redis.Redis.from_url(factory.server_url)
        call = (f"{LIBRARY}_pop", 6, rec, events, ids, times, positions, names, 1, "token-1")
        first, again = client.fcall(*call), client.fcall(*call)
        client.close()
        assert first == again and [_content(r) for r in first] == ["r1"]
        assert run(AgentsSession("s", store).get_items()) == items("r", 1)
    finally:
        factory.close_all()


def test_a_cancelled_write_settles_before_the_cancellation_is_passed_on(
    store_factory: StoreFactory,
) -> None:
    """A caller cancelled mid-write sees the session as it ends up: nothing lands later.

    As the SDK's own sessions: the write (add, pop, clear) runs to its
    outcome, then CancelledError reaches the caller, however often it is
    cancelled meanwhile. A write sent after it finds the session as the
    caller read it right after the cancellation.
    """
    import asyncio

    async def main() -> None:
        session = AgentsSession("cancelled", store_factory())
        await session.add_items([{"role": "user", "content": "first"}])
        many = [{"role": "user", "content": f"item {i} " + "x" * 200} for i in range(400)]
        writes = [
            lambda: session.add_items(many),
            session.pop_item,
            session.clear_session,
        ]
        for number, write in enumerate(writes):
            task = asyncio.ensure_future(write())
            await asyncio.sleep(0)  # the write is under way
            task.cancel()
            await asyncio.sleep(0)
            task.cancel()  # a second cancellation changes nothing
            with pytest.raises(asyncio.CancelledError):
                await task
            seen = await session.get_items()
            marker = {"role": "user", "content": f"after write {number}"}
            await session.add_items([marker])
            assert await session.get_items() == [*seen, marker]

    run(main())
