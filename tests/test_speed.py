"""The speed targets' machinery: the workload, the recorded append shape, the verdicts."""

from __future__ import annotations

from pathlib import Path

import lmdb

from sessionscope.bench.speed import Figure, append_shapes, turn_records


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


def test_append_shapes_replay_to_the_store_they_were_recorded_from(tmp_path: Path) -> None:
    records = turn_records(5)
    shapes = append_shapes(records, tmp_path / "recorded")
    assert len(shapes) == 5
    # Every append reads before it writes, and writes its event's record.
    for shape in shapes:
        assert shape[0][0] == "get"
        assert any(what == "put" and db == b"data" for what, db, _, _ in shape)
    # Replaying the puts on an empty environment gives the data the store holds.
    env = lmdb.open(str(tmp_path / "replayed"), max_dbs=6)
    names = (b"meta", b"sessions", b"shared", b"data", b"listing")
    handles = {name: env.open_db(name) for name in names}
    with env.begin(write=True) as txn:
        for shape in shapes:
            for what, db, key, value in shape:
                if what == "put":
                    txn.put(key, value, db=handles[db])
                elif what == "delete":
                    txn.delete(key, db=handles[db])
    stored = lmdb.open(str(tmp_path / "recorded"), max_dbs=6, readonly=True)
    with stored.begin() as txn, env.begin() as mine:
        for name in (b"shared", b"listing"):
            theirs = dict(txn.cursor(db=stored.open_db(name, txn=txn)))
            assert dict(mine.cursor(db=handles[name])) == theirs
        record_keys = {key for shape in shapes for _, db, key, _ in shape if db == b"sessions"}
        sessions = stored.open_db(b"sessions", txn=txn)
        for key in record_keys:
            assert mine.get(key, db=handles[b"sessions"]) == txn.get(key, db=sessions)
    stored.close()
    env.close()


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
