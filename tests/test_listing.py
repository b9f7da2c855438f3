"""Paged listings: ``Store.list_page`` and the LMDB list index (format 2) behind it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import lmdb
import pytest

import sessionscope.core
from _stores import APP, StoreFactory, child_env, ev, lmdb_factory, store_factory  # noqa: F401
from sessionscope import GetSessionConfig, LmdbStore, SessionMeta, SyncSessionService
from sessionscope.errors import StoreError
from sessionscope.stores.records import SessionCopy
from sessionscope.stores.rules import list_position, page_records

GOLDEN_1 = Path(__file__).parent / "golden" / "format-1"
# Ids that sort by code point, not by length or bytes of a length prefix.
USERS = ["b", "a", "ab", "a\x00", "é", "z" * 200 + "1", "z" * 200 + "0"]


def _fill(service: SyncSessionService) -> None:
    """Sessions with many equal last update times, and some moved by appends."""
    for n, user in enumerate(USERS):
        for sid in ("s2", "s10", "s1"):
            session = service.create_session(app_name=APP, user_id=user, session_id=sid)
            # Three distinct times only: long runs of equal times across users and ids.
            service.append_event(session, ev(ts=1000.0 + (n + len(sid)) % 3))
    service.create_session(app_name="other", user_id="a", session_id="s1")


def _walk(store: object, limit: int, user: str | None = None) -> list[tuple[float, str, str]]:
    """Follow pages of ``limit`` to the end; return every position listed, in order."""
    seen: list[tuple[float, str, str]] = []
    after = None
    for _ in range(100):
        page, more = store.list_page(APP, user, limit, after)  # type: ignore[attr-defined]
        assert len(page) <= limit
        assert more or len(page) <= limit
        seen.extend(list_position(r) for r in page)
        if not more:
            return seen
        after = list_position(page[-1])
    raise AssertionError("the listing never ended")


def test_pages_follow_the_listing_order(store_factory: StoreFactory) -> None:  # noqa: F811
    store = store_factory()
    _fill(SyncSessionService(store))
    whole = sorted(list_position(r) for r in store.list_sessions(APP, None))
    assert len(whole) == 3 * len(USERS)
    for limit in (1, 2, 5, 100):
        assert _walk(store, limit) == whole
    for user in ("a", "z" * 200 + "0"):
        mine = [p for p in whole if p[1] == user]
        assert _walk(store, 2, user) == mine
    page, more = store.list_page(APP, None, None, None)
    assert [list_position(r) for r in page] == whole and not more
    assert store.list_page("nobody", None, 10, None) == ([], False)


def test_a_page_after_a_position_that_is_gone(store_factory: StoreFactory) -> None:  # noqa: F811
    store = store_factory()
    service = SyncSessionService(store)
    _fill(service)
    whole = sorted(list_position(r) for r in store.list_sessions(APP, None))
    gone = whole[4]
    service.delete_session(app_name=APP, user_id=gone[1], session_id=gone[2])
    page, _ = store.list_page(APP, None, 3, gone)
    assert [list_position(r) for r in page] == whole[5:8]
    # A position between two sessions of one time starts right after it.
    between = (whole[5][0], whole[5][1], whole[5][2] + "\x00")
    page, _ = store.list_page(APP, None, 2, between)
    assert [list_position(r) for r in page] == whole[6:8]


def _check_index(store: LmdbStore) -> None:
    assert store.check_layout() == []
    whole = page_records(store.list_sessions(APP, None), None, None)[0]
    assert store.list_page(APP, None, 1000, None) == (whole, False)


def test_the_list_index_follows_every_write(lmdb_factory: StoreFactory) -> None:  # noqa: F811
    store = lmdb_factory()
    assert store.format == 2
    service = SyncSessionService(store)
    _fill(service)
    _check_index(store)
    first = service.get_session(app_name=APP, user_id="a", session_id="s1")
    assert first is not None
    service.append_event(first, ev(ts=5000.0))
    service.append_many([(first, ev(ts=6000.0)), (first, ev(ts=7000.0))])
    _check_index(store)
    assert list_position(store.list_page(APP, None, None, None)[0][-1]) == (7000.0, "a", "s1")
    service.truncate_events(app_name=APP, user_id="a", session_id="s1", keep_last=1)
    service.delete_session(app_name=APP, user_id="b", session_id="s2")
    _check_index(store)
    assert service.expire_sessions(app_name=APP, idle_for=0.0) > 0
    _check_index(store)
    assert store.list_page(APP, None, 10, None) == ([], False)
    copy = SessionCopy(APP, "r", "restored", 10.0, 20.0)
    assert store.restore_session(copy).result()
    _check_index(store)
    assert [list_position(r) for r in store.list_page(APP, None, 10, None)[0]] == [
        (20.0, "r", "restored")
    ]
    service.delete_user(app_name=APP, user_id="r")
    service.create_session(app_name=APP, user_id="q", session_id="s")
    service.delete_app(app_name=APP)
    _check_index(store)
    assert store.list_page(APP, None, 10, None) == ([], False)
    assert len(store.list_page("other", None, 10, None)[0]) == 1


def test_check_layout_finds_a_list_index_out_of_step(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with SyncSessionService(LmdbStore(path)) as service:
        service.create_session(app_name=APP, user_id="u", session_id="kept")
        service.create_session(app_name=APP, user_id="u", session_id="unlisted")
    env = lmdb.open(str(path), max_dbs=8)
    with env.begin(write=True) as txn:
        listing = env.open_db(b"listing", txn=txn, create=False)
        entries = list(txn.cursor(db=listing))
        (unlisted,) = [key for key, value in entries if value.endswith(b"unlisted")]
        txn.delete(unlisted, db=listing)
        txn.put(entries[0][0][:-1] + b"\xff", b"no such session", db=listing)
    env.close()
    store = LmdbStore(path)
    try:
        problems = store.check_layout()
        assert any(p.endswith("/unlisted: missing from the list index") for p in problems)
        assert any("names no session" in p for p in problems)
        assert len(problems) == 2
    finally:
        store.close()


def test_a_format_1_store_lists_and_appends_as_it_is(tmp_path: Path) -> None:
    copy = tmp_path / "store"
    copy.mkdir()
    shutil.copy(GOLDEN_1 / "data.mdb", copy / "data.mdb")
    store = LmdbStore(copy)
    try:
        assert store.format == 1
        service = SyncSessionService(store)
        listing = [(m.user_id, m.id) for m in service.list_sessions(app_name="golden").sessions]
        session = service.get_session(app_name="golden", user_id="ada", session_id="s1")
        assert session is not None
        service.append_event(session, ev(ts=1_800_000_000.0))
        service.create_session(app_name="golden", user_id="cy", session_id="new")
        first = service.list_sessions(app_name="golden", limit=1)
        assert [(m.user_id, m.id) for m in first.sessions] == [listing[1]]
        assert store.check_layout() == []
        assert "listing" not in store.stat()["entries"]
    finally:
        store.close()
    env = lmdb.open(str(copy), readonly=True, lock=False, max_dbs=8)
    try:
        with env.begin() as txn:
            names = [key for key, _ in txn.cursor()]
    finally:
        env.close()
    assert b"listing" not in names


@pytest.mark.parametrize("limit", [0, -1, True, 1.5])
def test_bad_page_sizes_are_refused_before_reading(tmp_path: Path, limit: object) -> None:
    with SyncSessionService(LmdbStore(tmp_path / "store")) as service, pytest.raises(ValueError):
        service.list_sessions(app_name=APP, limit=limit)  # type: ignore[arg-type]


def _golden_1_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "store"
    copy.mkdir()
    shutil.copy(GOLDEN_1 / "data.mdb", copy / "data.mdb")
    return copy


def test_upgrade_gives_a_format_1_store_the_list_index(tmp_path: Path) -> None:
    path = _golden_1_copy(tmp_path)
    assert LmdbStore.upgrade(path) == 1
    store = LmdbStore(path)
    try:
        assert store.format == 2
        assert store.check_layout() == []
        assert store.stat()["entries"]["listing"] == 2
        whole = page_records(store.list_sessions("golden", None), None, None)[0]
        assert store.list_page("golden", None, 1, None) == (whole[:1], True)
        service = SyncSessionService(store)
        session = service.get_session(app_name="golden", user_id="ada", session_id="s1")
        assert session is not None
        # Format 1 indexed every session by time: the index stays and stays in use.
        service.append_event(session, ev(ts=1_600_000_000.0))
        late = service.get_session(
            app_name="golden",
            user_id="ada",
            session_id="s1",
            config=GetSessionConfig(after_timestamp=1_700_000_003.0),
        )
        assert late is not None and [e.id for e in late.events] == ["e3", "e4"]
        assert store.check_layout() == []
        first = store.list_page("golden", None, 1, None)[0][0]
        assert (first.user_id, first.session_id) == ("ada", "s1")
    finally:
        store.close()
    assert LmdbStore.upgrade(path) == 2  # again: nothing to do


def test_upgrade_is_refused_while_another_process_has_the_store_open(tmp_path: Path) -> None:
    path = _golden_1_copy(tmp_path)
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_OPEN, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
        with pytest.raises(StoreError, match="open in another process"):
            LmdbStore.upgrade(path)
    finally:
        holder.communicate("", timeout=30)
    store = LmdbStore(path)
    try:
        assert store.format == 1 and store.check_layout() == []
    finally:
        store.close()


_HOLD_OPEN = """
import sys
from sessionscope import LmdbStore
store = LmdbStore(sys.argv[1])
print("open", flush=True)
sys.stdin.read()
store.close()
"""


def test_the_upgrade_command(tmp_path: Path) -> None:
    path = _golden_1_copy(tmp_path)
    command = [sys.executable, "-m", "sessionscope", "upgrade", f"lmdb://{path}"]
    done = subprocess.run(command, capture_output=True, text=True, env=child_env(), check=False)
    assert done.returncode == 0, done.stderr
    assert "from format 1 to format 2" in done.stdout
    again = subprocess.run(
        [*command, "--json"], capture_output=True, text=True, env=child_env(), check=False
    )
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) == {"path": str(path), "format_before": 2, "format": 2}


def test_listed_metadata_is_the_sessions_own(tmp_path: Path) -> None:
    """Every field of a listed session, before and after a truncation moves its revision."""
    with SyncSessionService(LmdbStore(tmp_path / "store")) as service:
        kept = service.create_session(app_name=APP, user_id="u", session_id="kept")
        cut = service.create_session(app_name=APP, user_id="u", session_id="cut")
        for n in range(3):
            service.append_event(kept, ev(ts=2000.0 + n))
            service.append_event(cut, ev(ts=1000.0 + n))
        service.truncate_events(app_name=APP, user_id="u", session_id="cut", keep_last=1)
        listed = service.list_sessions(app_name=APP).sessions
        assert [meta.id for meta in listed] == ["cut", "kept"]
        for meta in listed:
            session = service.get_session(app_name=APP, user_id="u", session_id=meta.id)
            assert session is not None
            expected = SessionMeta(
                session.id,
                APP,
                "u",
                session.last_update_time,
                meta.create_time,
                len(session.events),
                session.revision,
            )
            assert meta == expected
            assert hash(meta) == hash(expected) and repr(meta) == repr(expected)
        assert listed[0].event_count == 1 and listed[0].revision.count(":") == 2
        assert listed[1].event_count == 3 and listed[1].revision.count(":") == 1
        with pytest.raises(AttributeError):
            listed[0].event_count = 5  # type: ignore[misc]


@pytest.mark.parametrize(
    "module", ["sessionscope.service._listing", "sessionscope.service._listing_c"]
)
def test_listing_metas_are_what_the_dataclass_makes(
    module: str, build_of: Callable[[str], ModuleType]
) -> None:
    """Both builds of metas() give what SessionMeta(...) gives: every field, still frozen.

    The compiled build sets the fields with PyObject_GenericSetAttr, past
    the dataclass's __init__ (see "Internals kept, and why" in
    docs/ARCHITECTURE.md): a field added to SessionMeta, or an __init__ that
    does more than set fields, must show here.
    """
    import dataclasses

    from sessionscope.stores.records import SessionRecord

    listing = build_of(module)
    record = SessionRecord(APP, "u", "s1", 7, 1.5, 2.5, 9, "e9", removed_count=2)
    (meta,) = listing.metas([record])
    expected = SessionMeta(
        id="s1",
        app_name=APP,
        user_id="u",
        last_update_time=2.5,
        create_time=1.5,
        event_count=7,
        revision=record.marker,
    )
    assert type(meta) is SessionMeta
    assert meta == expected
    for field in dataclasses.fields(SessionMeta):
        assert getattr(meta, field.name) == getattr(expected, field.name), field.name
    with pytest.raises(dataclasses.FrozenInstanceError):
        meta.id = "other"  # type: ignore[misc]
    assert meta.id == "s1"


@pytest.mark.parametrize(
    "module", ["sessionscope.stores.lmdb.layout", "sessionscope.stores.lmdb.layout_c"]
)
def test_a_whole_listing_leaves_its_records_and_metas_out_of_the_collector(
    module: str, build_of: Callable[[str], ModuleType], tmp_path: Path
) -> None:
    """The compiled listing untracks the records it reads and the metas it makes; the twin does not.

    Both builds read the same records, in the same order, each equal to
    one made the ordinary way; the store and the service run the build
    this process picked, so a listing here is untracked when that is the
    compiled one.
    """
    import gc

    from sessionscope.stores.records import SessionRecord

    layout = build_of(module)
    listing = build_of(module.replace("stores.lmdb.layout", "service._listing"))
    compiled = module.endswith("_c")
    with SyncSessionService(f"lmdb://{tmp_path / 'store'}?durability=deferred") as service:
        for number in range(5):
            service.create_session(app_name=APP, user_id=f"u{number % 2}", session_id=f"s{number}")
        store = service.store
        writer = store._writer  # the store's own transaction, read as its listing reads it
        prefix = layout.part(APP)
        records = writer.read(lambda txn: layout.records_under(txn, writer.dbs, prefix))
        assert [record.session_id for record in records] == [f"s{n}" for n in (0, 2, 4, 1, 3)]
        assert records == [SessionRecord(*record.to_list()) for record in records]
        assert all(gc.is_tracked(record) is not compiled for record in records)
        metas = listing.metas(records)
        assert [meta.id for meta in metas] == [record.session_id for record in records]
        assert all(gc.is_tracked(meta) is not compiled for meta in metas)
        # The store and the service run the builds this process picked.
        picked = sessionscope.core.IMPLEMENTATIONS
        stored = store.list_sessions(APP, None)
        assert stored == records
        untracked = picked["sessionscope.stores.lmdb.layout"] == "c"
        assert all(gc.is_tracked(record) is not untracked for record in stored)
        listed = service.list_sessions(app_name=APP).sessions
        assert [meta.id for meta in listed] == [f"s{n}" for n in range(5)]
        untracked = picked["sessionscope.service._listing"] == "c"
        assert all(gc.is_tracked(meta) is not untracked for meta in listed)


def test_records_and_metas_hold_only_values_that_refer_to_nothing() -> None:
    """Every field of SessionRecord and SessionMeta is a str, int, float, bool or None.

    The compiled listing leaves both out of the cyclic collector, which is
    safe only while none of them can hold a container: a field added with
    another type must fail here.
    """
    import typing

    from sessionscope.stores.records import SessionRecord

    atomic = {str, int, float, bool, type(None)}
    for kind in (SessionRecord, SessionMeta):
        for name, hint in typing.get_type_hints(kind).items():
            kinds = set(typing.get_args(hint)) or {hint}
            assert kinds <= atomic, f"{kind.__name__}.{name}: {hint}"
