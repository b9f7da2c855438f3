"""The speed targets' machinery: the workload, the raw peer, the verdicts."""

from __future__ import annotations

import importlib.util
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import lmdb
import msgpack
import pytest

from sessionscope import SyncSessionService
from sessionscope.bench.mix import generate
from sessionscope.bench.speed import (
    ADK_DATABASE,
    ADK_SQLITE,
    ASYNC,
    BULK,
    DURABLE_ASYNC,
    DURABLE_SYNC,
    GET_RECENT,
    RAW,
    RAW_BULK,
    RAW_BULK_PEER,
    RAW_DURABLE,
    REPLAY,
    SYNC,
    Figure,
    MixEvents,
    SpeedConfig,
    Workload,
    _adk_memory,
    _adk_sqlite,
    _build_adk,
    _build_adk_sqlite,
    _build_native,
    _bulk_round,
    _durable_sweep_build,
    _durable_sweep_round,
    adk_run,
    group,
    measure,
    mix_spec,
    native_async,
    native_sync,
    raw_bulk,
    raw_txn,
    turn_records,
)


def test_turn_records_touch_every_scope_and_cycle_kinds() -> None:
    records = turn_records(6)
    assert [r["content"]["role"] for r in records] == ["user", "model", "user"] * 2
    assert "function_call" in records[1]["content"]["parts"][1]
    assert "function_response" in records[2]["content"]["parts"][0]
    for record in records:
        keys = set(record["actions"]["state_delta"])
        assert {k.partition(":")[0] for k in keys if ":" in k} == {"user", "app", "temp"}
        assert any(":" not in k for k in keys)
    assert len({r["id"] for r in records}) == 6


def test_figure_verdicts() -> None:
    slower = Figure("append", 30.0, "peer", 10.0, "us", 1.5)
    assert slower.ratio == 3.0 and not slower.met and slower.target == "<= 1.5x"
    faster = Figure("append", 12.0, "peer", 10.0, "us", 1.5)
    assert faster.met
    rate = Figure("bulk", 160_000.0, "", None, "events/s", 150_000, most=False)
    assert rate.ratio is None and rate.met and rate.target == ">= 150,000 events/s"
    lift = Figure("lift", 700.0, "one", 100.0, "appends/s", 8.0, most=False)
    assert lift.ratio == 7.0 and not lift.met
    # An absolute target shows its peer for scale but is judged on its own figure.
    page = Figure("page", 1.5, "at 1,000", 0.1, "ms", 2.0, absolute=True)
    assert page.ratio == 15.0 and page.met and page.target == "<= 2 ms"
    assert page.to_dict()["met"] is True
    shown = Figure("get", 5.0, "peer", 10.0, "us", None)
    assert shown.met is None and shown.target == "-" and shown.ratio == 0.5


def test_a_workload_of_the_mix_holds_its_stored_appends_in_order() -> None:
    spec = mix_spec(6, seed=1, length=40)
    work = Workload.of(spec)
    assert len(work.creates) == 6
    assert len(work.appends) == 6 * 40
    assert not any(record.get("partial") for _, record, _ in work.appends)
    assert any(locked for _, _, locked in work.appends)
    head = work.head(10)
    assert head.appends == work.appends[:10]
    assert {key for key, _ in head.creates} == {key for key, _, _ in head.appends}


def test_the_raw_transaction_writes_every_event_and_state_item(tmp_path: Path) -> None:
    work = Workload.of(mix_spec(4, seed=2, length=10))
    samples = raw_txn(work, tmp_path / "raw", durable=False)
    assert len(samples) == len(work.appends)
    env = lmdb.open(str(tmp_path / "raw"), max_dbs=4, readonly=True)
    try:
        with env.begin() as txn:
            events = [msgpack.unpackb(v) for _, v in txn.cursor(db=env.open_db(b"events", txn=txn))]
            state = dict(txn.cursor(db=env.open_db(b"state", txn=txn)))
    finally:
        env.close()
    assert sorted(e["id"] for e in events) == sorted(r["id"] for _, r, _ in work.appends)
    for event in events:
        delta = (event.get("actions") or {}).get("state_delta") or {}
        assert not any(key.startswith("temp:") for key in delta)
    # Every non-temp key a delta set is stored once per scope.
    keys = {k for _, r, _ in work.appends for k in (r.get("actions") or {}).get("state_delta", {})}
    assert len(state) >= len({k for k in keys if not k.startswith(("temp:", "app:", "user:"))})
    # The workload's own records were not changed by the raw appends.
    assert any(
        k.startswith("temp:")
        for _, r, _ in work.appends
        for k in (r.get("actions") or {}).get("state_delta", {})
    )


def test_native_and_adk_runs_time_every_append_and_read(tmp_path: Path) -> None:
    pytest.importorskip("google.adk")
    work = Workload.of(mix_spec(3, seed=3, length=12))
    native = native_async(f"lmdb://{tmp_path / 'n'}?durability=deferred", work, gets=True)
    assert len(native["append"]) == 36
    assert len(native["get"]) == len(native["get_recent"]) == 3
    theirs = adk_run(_adk_memory, work, gets=True)
    assert len(theirs["append"]) == 36
    assert len(theirs["get_recent"]) == 3
    sync, _ = native_sync(f"lmdb://{tmp_path / 's'}?durability=deferred", work)
    assert len(sync) == 36
    with SyncSessionService(f"lmdb://{tmp_path / 's'}") as service:
        for (app, user, sid), _ in work.creates:
            session = service.get_session(app_name=app, user_id=user, session_id=sid)
            assert session is not None and len(session.events) == 12


def test_a_workload_splits_each_session_at_its_last_appends() -> None:
    work = Workload.of(mix_spec(3, seed=4, length=12))
    early, late = work.split(5)
    assert early.creates == late.creates == work.creates
    assert len(early.appends) == 3 * 7 and len(late.appends) == 3 * 5
    for key, _ in work.creates:
        ids = [r["id"] for k, r, _ in work.appends if k == key]
        assert [r["id"] for k, r, _ in late.appends if k == key] == ids[-5:]
        assert [r["id"] for k, r, _ in early.appends if k == key] == ids[:-5]
    # A tail as long as the sessions leaves nothing before it.
    assert work.split(12)[0].appends == [] and work.split(12)[1].appends == work.appends
    first = work.sessions(2)
    assert first.creates == work.creates[:2]
    assert {key for key, _, _ in first.appends} == {key for key, _ in work.creates[:2]}
    assert len(first.appends) == 24


def test_mix_events_cycle_the_mix_with_fresh_ids_and_times() -> None:
    events = MixEvents(sessions=2, seed=5)
    count = len(events.records)
    first, again = events.record(0), events.record(count)
    assert first["content"] == again["content"] == events.records[0]["content"]
    assert first["id"] != again["id"] and again["timestamp"] > first["timestamp"]
    # A shift makes that event the cycle's first.
    assert events.record(7, shift=7)["content"] == events.records[0]["content"]
    assert events.record(6, shift=7)["content"] == events.records[-1]["content"]
    handed = [events.next_record() for _ in range(count + 3)]
    assert len({r["id"] for r in handed}) == count + 3
    # Fresh copies: an append that trims a delta leaves the mix's records alone.
    delta = handed[0].get("actions", {}).get("state_delta")
    if delta is not None:
        delta.clear()
        assert events.record(0).get("actions", {}).get("state_delta")


def test_resumed_runs_append_to_sessions_stored_before(tmp_path: Path) -> None:
    work = Workload.of(mix_spec(2, seed=6, length=15))
    early, late = work.split(4)
    _build_native(f"lmdb://{tmp_path / 'native'}", early)
    samples, _ = native_sync(f"lmdb://{tmp_path / 'native'}", late, resume=True)
    assert len(samples) == 8
    raw_txn(early, tmp_path / "raw", False)
    assert len(raw_txn(late, tmp_path / "raw", True, created=True)) == 8
    with SyncSessionService(f"lmdb://{tmp_path / 'native'}") as service:
        for (app, user, sid), _ in work.creates:
            session = service.get_session(app_name=app, user_id=user, session_id=sid)
            assert session is not None
            want = [r["id"] for k, r, _ in work.appends if k == (app, user, sid)]
            assert [e.id for e in session.events] == want
    env = lmdb.open(str(tmp_path / "raw"), max_dbs=4, readonly=True)
    try:
        with env.begin() as txn:
            sessions = env.open_db(b"sessions", txn=txn)
            counts = [msgpack.unpackb(v)["n"] for _, v in txn.cursor(db=sessions)]
    finally:
        env.close()
    assert counts == [15, 15]


def test_the_durable_sweep_times_the_last_appends_on_a_copy(tmp_path: Path) -> None:
    # google-adk is an extra (not installed on Python 3.10): the sweep runs without it.
    adk = importlib.util.find_spec("google") is not None
    adk = adk and importlib.util.find_spec("google.adk") is not None
    work = Workload.of(mix_spec(1, seed=7, length=30))
    late, built = _durable_sweep_build(work, tmp_path / "built", adk, 6)
    assert len(late.appends) == 6
    names = {DURABLE_SYNC, DURABLE_ASYNC, RAW_DURABLE}
    for number in range(2):
        found = _durable_sweep_round(late, built, tmp_path / f"round-{number}")
        assert names <= set(found) and all(value > 0 for value in found.values())
        if adk:
            assert ADK_SQLITE in found
            if importlib.util.find_spec("aiosqlite") and importlib.util.find_spec("sqlalchemy"):
                assert ADK_DATABASE in found
    # Each round appended to its own copy: the stores built stay as they were.
    with SyncSessionService(f"lmdb://{built / 'native'}") as service:
        (app, user, sid), _ = work.creates[0]
        session = service.get_session(app_name=app, user_id=user, session_id=sid)
        assert session is not None and len(session.events) == 24
    with SyncSessionService(f"lmdb://{tmp_path / 'round-1' / 'sync'}") as service:
        session = service.get_session(app_name=app, user_id=user, session_id=sid)
        assert session is not None and len(session.events) == 30


def test_adk_sqlite_built_in_memory_holds_what_its_appends_store(tmp_path: Path) -> None:
    pytest.importorskip("google.adk")
    work = Workload.of(mix_spec(2, seed=8, length=9))
    _build_adk_sqlite(tmp_path / "copy.db", work)
    _build_adk(_adk_sqlite(tmp_path / "direct.db"), work)

    def stored(path: Path) -> list[tuple[Any, ...]]:
        with closing(sqlite3.connect(path)) as db:
            return sorted(db.execute("SELECT session_id, id FROM events").fetchall())

    assert stored(tmp_path / "copy.db") == stored(tmp_path / "direct.db")
    assert len(stored(tmp_path / "copy.db")) == 18


def test_the_raw_bulk_peer_writes_what_the_raw_transaction_writes(tmp_path: Path) -> None:
    work = Workload.of(mix_spec(5, seed=9, length=30))
    assert raw_bulk(work, tmp_path / "bulk", batch=40) > 0
    raw_txn(work, tmp_path / "single", durable=False)

    def contents(path: Path) -> dict[bytes, list[tuple[bytes, bytes]]]:
        env = lmdb.open(str(path), max_dbs=4, readonly=True)
        try:
            with env.begin() as txn:
                return {
                    name: list(txn.cursor(db=env.open_db(name, txn=txn)))
                    for name in (b"sessions", b"events", b"state")
                }
        finally:
            env.close()

    assert contents(tmp_path / "bulk") == contents(tmp_path / "single")


def test_a_bulk_round_times_append_many_its_raw_peer_and_replay(tmp_path: Path) -> None:
    records = list(generate(mix_spec(4, seed=10, length=20)))
    found = _bulk_round(records, tmp_path / "bulk")
    assert set(found) == {BULK, RAW_BULK, REPLAY}
    assert all(value > 0 for value in found.values())
    with SyncSessionService(f"lmdb://{tmp_path / 'bulk' / 'replay'}") as service:
        listed = service.list_sessions(app_name=records[0]["app"])
        assert listed.sessions
    assert {group(name) for name in found} == {"bulk"}
    assert group(DURABLE_SYNC) == group(ADK_DATABASE) == "durable appends"
    assert group(ASYNC) == group(RAW) == "deferred appends"
    assert group(GET_RECENT) == "reads"


def test_the_bulk_figures_show_their_raw_peer_and_keep_their_absolute_target(
    tmp_path: Path,
) -> None:
    config = SpeedConfig(
        rounds=1, mix_sessions=3, sweep=(10,), sweep_events=20, durable_appends=5,
        sweep_durable=4, bulk_sessions=4, list_sizes=(20, 40), full_listing=30,
    )  # fmt: skip
    report = measure(config, tmp_path, adk=False)
    figures = {figure.name: figure for figure in report.figures}
    for name in ("append_many on the mix, batches of 1,000", "replay --batch 1000 of the mix"):
        figure = figures[name]
        assert figure.peer_name == RAW_BULK_PEER and figure.peer is not None
        assert figure.ratio is not None and figure.unit == "events/s"
        assert figure.met == (figure.ours >= 150_000)
    assert {BULK, RAW_BULK, REPLAY} <= set(report.mix)
    for name in (DURABLE_SYNC, DURABLE_ASYNC, RAW_DURABLE, BULK, RAW_BULK, REPLAY, SYNC, RAW):
        assert set(report.sweep[name]) == {10}


# -- the bench job's sweeps, on events of the mix ----------------------------------------


def test_the_length_sweep_appends_and_reads_the_same_mix_events_at_every_length(
    tmp_path: Path,
) -> None:
    from sessionscope.bench.job import length_sweep
    from sessionscope.bench.replay import open_target

    events = MixEvents(sessions=2, seed=11)
    target = open_target(f"lmdb://{tmp_path / 'sweep'}?durability=deferred")
    try:
        found = length_sweep(target, (10, 40), budget_s=30.0, samples=5, events=events)
    finally:
        target.close()
    assert set(found["append"]) == set(found["get_recent"]) == {10, 40}
    with SyncSessionService(f"lmdb://{tmp_path / 'sweep'}") as service:
        session = service.get_session(app_name="sweep", user_id="user", session_id="long")
    assert session is not None and len(session.events) == 45
    contents = [event.content for event in session.events]
    mix = {repr(record["content"]) for record in events.records}
    assert all(repr(content) in mix for content in contents)
    assert len({event.id for event in session.events}) == 45
    # Each length's timed appends, and the 10 events before them, are the same events.
    assert contents[10:15] == contents[40:45]
    assert contents[0:10] == contents[30:40]


def test_concurrent_writers_append_events_of_the_mix(tmp_path: Path) -> None:
    from sessionscope.bench.job import tasks_throughput, threads_throughput

    events = MixEvents(sessions=2, seed=12)
    mix = {repr(record["content"]) for record in events.records}
    for name, measure_rate in (("tasks", tasks_throughput), ("threads", threads_throughput)):
        uri = f"lmdb://{tmp_path / name}"
        assert measure_rate(uri, 3, 0.3, events) > 0
        with SyncSessionService(uri) as service:
            listed = service.list_sessions(app_name="bench").sessions
            assert len(listed) == 3
            for item in listed:
                session = service.get_session(
                    app_name="bench", user_id=item.user_id, session_id=item.id
                )
                assert session is not None and session.events
                assert all(repr(event.content) in mix for event in session.events)
