"""Format 2 keeps a time index only for sessions whose events went back in time."""

from __future__ import annotations

import struct
from pathlib import Path

import lmdb
import pytest

from _stores import APP, USER, ev
from sessionscope import GetSessionConfig, LmdbStore, MemoryStore, SyncSessionService
from sessionscope.stores.records import SessionCopy, event_copy

AFTERS = [-1.0, 0.0, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 7.0, 8.0, 9.5, 100.0]


def _time_entries(path: Path) -> int:
    """Return how many time index entries (kind b"t") the store's data holds."""
    env = lmdb.open(str(path), readonly=True, lock=False, max_dbs=8)
    try:
        with env.begin() as txn:
            data = env.open_db(b"data", txn=txn, create=False)
            return sum(1 for key in txn.cursor(db=data).iternext(values=False) if key[8:9] == b"t")
    finally:
        env.close()


def _after(service: SyncSessionService, sid: str, after: float, recent: int | None = None) -> list:
    config = GetSessionConfig(after_timestamp=after, num_recent_events=recent)
    session = service.get_session(app_name=APP, user_id=USER, session_id=sid, config=config)
    assert session is not None
    return [(e.id, e.timestamp) for e in session.events]


def _both(tmp_path: Path) -> tuple[SyncSessionService, SyncSessionService, Path]:
    path = tmp_path / "store"
    return SyncSessionService(LmdbStore(path)), SyncSessionService(MemoryStore()), path


@pytest.mark.parametrize("stamps", [
    [1.0, 2.0, 2.0, 3.0, 5.0, 8.0],  # in order, with a repeated time
    [1.0, 2.0, 9.0, 3.0, 4.0, 8.0],  # one step back
    [5.0, 4.0, 3.0, 2.0, 1.0, 0.0],  # always back
])  # fmt: skip
def test_after_timestamp_reads_match_the_memory_store(tmp_path: Path, stamps: list[float]) -> None:
    ours, reference, path = _both(tmp_path)
    for service in (ours, reference):
        session = service.create_session(app_name=APP, user_id=USER, session_id="s")
        for n, stamp in enumerate(stamps):
            service.append_event(session, ev(id=f"e{n}", ts=stamp))
    in_order = stamps == sorted(stamps)
    for after in AFTERS:
        for recent in (None, 2):
            assert _after(ours, "s", after, recent) == _after(reference, "s", after, recent)
    # Truncation leaves gaps in the positions; the reads stay right.
    for service in (ours, reference):
        service.truncate_events(app_name=APP, user_id=USER, session_id="s", before=2.0)
        service.truncate_events(app_name=APP, user_id=USER, session_id="s", keep_last=4)
    for after in AFTERS:
        assert _after(ours, "s", after) == _after(reference, "s", after)
    (record,) = ours.store.list_sessions(APP, USER)
    assert record.time_indexed is not in_order
    assert ours.store.check_layout() == []  # type: ignore[attr-defined]
    ours.close()
    # In order: no index at all; otherwise one entry per stored event.
    assert _time_entries(path) == (0 if in_order else record.stored_count)


def test_a_bulk_append_that_steps_back_indexes_the_batch_before_it(tmp_path: Path) -> None:
    ours, reference, path = _both(tmp_path)
    for service in (ours, reference):
        session = service.create_session(app_name=APP, user_id=USER, session_id="s")
        service.append_event(session, ev(id="first", ts=1.0))
        batch = [(session, ev(id=f"b{n}", ts=stamp)) for n, stamp in enumerate([2.0, 8.0, 3.0])]
        service.append_many(batch)
        service.append_many([(session, ev(id="last", ts=9.0))])
    for after in AFTERS:
        assert _after(ours, "s", after) == _after(reference, "s", after)
    assert ours.store.check_layout() == []  # type: ignore[attr-defined]
    ours.close()
    assert _time_entries(path) == 5


def test_truncating_before_a_time_without_an_index(tmp_path: Path) -> None:
    with SyncSessionService(LmdbStore(tmp_path / "store")) as service:
        session = service.create_session(app_name=APP, user_id=USER, session_id="s")
        for n in range(10):
            service.append_event(session, ev(id=f"e{n}", ts=float(n)))
        assert service.truncate_events(app_name=APP, user_id=USER, session_id="s", before=4.5) == 5
        assert _after(service, "s", -1.0) == [(f"e{n}", float(n)) for n in range(5, 10)]
        assert service.store.check_layout() == []  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("stamps", "last_update", "timed"),
    [([1.0, 2.0, 3.0], 3.0, False), ([1.0, 3.0, 2.0], 3.0, True), ([1.0, 2.0], 1.5, True)],
)
def test_a_restored_session_keeps_an_index_only_when_it_needs_one(
    tmp_path: Path, stamps: list[float], last_update: float, timed: bool
) -> None:
    source = MemoryStore()
    service = SyncSessionService(source)
    session = service.create_session(app_name=APP, user_id=USER, session_id="s")
    for n, stamp in enumerate(stamps):
        service.append_event(session, ev(id=f"e{n}", ts=stamp))
    records = [event_copy(r) for r in source.load_session(APP, USER, "s", None, None).events]  # type: ignore[union-attr]
    copy = SessionCopy(APP, USER, "s", 0.5, last_update, [], records)
    path = tmp_path / "store"
    store = LmdbStore(path)
    assert store.restore_session(copy).result()
    (record,) = store.list_sessions(APP, USER)
    assert record.time_indexed is timed
    assert store.check_layout() == []
    restored = SyncSessionService(store)
    # The next append compares with the record's time: a step back from it indexes.
    live = restored.get_session(app_name=APP, user_id=USER, session_id="s")
    assert live is not None
    restored.append_event(live, ev(id="next", ts=1.7))
    (record,) = store.list_sessions(APP, USER)
    assert record.time_indexed
    assert store.check_layout() == []
    assert [e for e, _ in _after(restored, "s", 1.6)] == [
        f"e{n}" for n, t in enumerate(stamps) if t >= 1.6
    ] + ["next"]
    restored.close()


def test_check_layout_finds_events_out_of_order_without_an_index(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with SyncSessionService(LmdbStore(path)) as service:
        session = service.create_session(app_name=APP, user_id=USER, session_id="s")
        for n in range(3):
            service.append_event(session, ev(id=f"e{n}", ts=float(n)))
    env = lmdb.open(str(path), max_dbs=8)
    with env.begin(write=True) as txn:
        data = env.open_db(b"data", txn=txn, create=False)
        cursor = txn.cursor(db=data)
        keys = [key for key in cursor.iternext(values=False) if key[8:9] == b"e"]
        value = txn.get(keys[2], db=data)
        txn.put(keys[2], struct.pack(">d", -5.0) + value[8:], db=data)
    env.close()
    store = LmdbStore(path)
    try:
        problems = store.check_layout()
        assert any("event 2 is earlier than the one before it" in p for p in problems)
    finally:
        store.close()
