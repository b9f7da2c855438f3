"""The speed targets' machinery: the workload, the raw peer, the verdicts."""

from __future__ import annotations

from pathlib import Path

import lmdb
import msgpack
import pytest

from sessionscope import SyncSessionService
from sessionscope.bench.speed import (
    Figure,
    Workload,
    _adk_memory,
    adk_run,
    mix_spec,
    native_async,
    native_sync,
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
