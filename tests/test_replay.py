"""Replay: targets, verification (which must be able to fail) and latency figures."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from sessionscope import Event, EventActions
from sessionscope.bench.mix import MixSpec, generate
from sessionscope.bench.replay import (
    LatencyStats,
    NativeTarget,
    ReplayResult,
    RichProgressBar,
    TargetError,
    native_event,
    open_target,
    percentile,
    replay,
    verify,
)
from sessionscope.bench.trace import Expectation, load_trace, sample_trace_path

Record = dict[str, Any]


@pytest.fixture(scope="module")
def records() -> list[Record]:
    return load_trace(sample_trace_path())[1]


def _uri(kind: str, tmp_path: Path) -> str:
    if kind == "memory":
        return "memory://"
    return f"lmdb://{tmp_path / 'store'}?durability={kind.removeprefix('lmdb-')}"


def _replay_on(kind: str, tmp_path: Path, records: list[Record], batch: int = 0) -> ReplayResult:
    """Replay ``records`` on a fresh target of ``kind``, closed afterwards."""
    target = open_target(_uri(kind, tmp_path))
    try:
        return replay(target, records, batch=batch, progress=False)
    finally:
        target.close()


@pytest.mark.parametrize("kind", ["memory", "lmdb-sync", "lmdb-deferred"])
def test_replay_verifies(kind: str, tmp_path: Path, records: list[Record]) -> None:
    result = _replay_on(kind, tmp_path, records)
    assert result.verified
    assert result.problems == []
    appended = [r for r in records if r["op"] == "append" and not r["event"].get("partial")]
    assert result.events == len(appended)
    assert {"create", "append", "get_recent", "list", "delete"} <= set(result.latency)
    stats = result.latency["append"]
    assert stats.p50 <= stats.p90 <= stats.p99 <= stats.max


@pytest.mark.parametrize("kind", ["memory", "lmdb-deferred"])
def test_bulk_replay_verifies(kind: str, tmp_path: Path) -> None:
    spec = MixSpec(sessions=30, lengths=(5, 60), seed=2, get_every_turn=False, list_every=0)
    records = list(generate(spec))
    result = _replay_on(kind, tmp_path, records, batch=64)
    assert result.problems == []
    assert result.batch == 64
    assert "append_batch" in result.latency


@pytest.mark.parametrize("kind", ["memory", "lmdb-deferred"])
def test_a_create_waits_for_a_batch_that_sets_the_same_shared_key(
    kind: str, tmp_path: Path
) -> None:
    """A create goes ahead of a pending batch unless it sets an app or user key the batch sets."""
    ids = {"app": "a", "user": "u"}
    records: list[Record] = [
        {"op": "create", **ids, "session": "s", "state": {}},
        {"op": "append", **ids, "session": "s",
         "event": {"id": "e1", "timestamp": 1.0, "author": "x",
                   "actions": {"state_delta": {"user:tier": "old", "app:v": 1}}}},
        {"op": "create", **ids, "session": "t", "state": {"user:tier": "new"}},
        {"op": "create", **ids, "session": "w", "state": {"app:v": 2, "user:other": 0}},
    ]  # fmt: skip
    result = _replay_on(kind, tmp_path, records, batch=10)
    assert result.problems == []
    # The first create waited for the batch (one batch before it, none after).
    assert result.latency["append_batch"].count == 1


@pytest.mark.parametrize("kind", ["memory", "lmdb-deferred"])
def test_bulk_replay_with_reads_verifies(kind: str, tmp_path: Path) -> None:
    """Where reads cannot ride in a batch, each read sends the pending batch first."""
    records = list(generate(MixSpec(sessions=20, lengths=(5, 60), seed=4)))
    result = _replay_on(kind, tmp_path, records, batch=64)
    assert result.problems == []
    assert "get_in_batch" not in result.latency
    assert result.latency["get_recent"].count > 0


def test_verification_fails_on_a_tampered_store(tmp_path: Path, records: list[Record]) -> None:
    target = NativeTarget(_uri("lmdb-deferred", tmp_path))
    try:
        assert replay(target, records, progress=False).problems == []
        expected = Expectation.of(records)
        (app, user, sid), _ = sorted(expected.sessions.items())[0]
        service = target.service
        session = service.get_session(app_name=app, user_id=user, session_id=sid)
        assert session is not None
        # One more event, a changed user key, a leaked temp key, a vanished session.
        service.append_event(
            session,
            Event(author="intruder", actions=EventActions(state_delta={"user:tier": "hacked"})),
        )
        (app2, user2, sid2), _ = sorted(expected.sessions.items())[-1]
        service.delete_session(app_name=app2, user_id=user2, session_id=sid2)
        problems = verify(target, expected)
    finally:
        target.close()
    text = "\n".join(problems)
    assert f"{app}/{user}/{sid}: " in text
    assert "events stored" in text
    assert "state differs" in text
    assert f"{app2}/{user2}/{sid2}: not listed" in text
    assert f"{app2}/{user2}/{sid2}: missing" in text


def test_verification_catches_stored_temp_keys(records: list[Record]) -> None:
    target = NativeTarget("memory://")
    replay(target, records, verify_result=False, progress=False)
    expected = Expectation.of(records)
    key = sorted(expected.sessions)[0]

    class Leaky(NativeTarget):
        def read(self, app: str, user: str, sid: str) -> tuple[dict[str, Any], list[str]] | None:
            found = super().read(app, user, sid)
            if found is not None and (app, user, sid) == key:
                found[0]["temp:leaked"] = 1
            return found

    leaky = Leaky("memory://", service=target.service)
    problems = verify(leaky, expected)
    assert any("temp keys stored: ['temp:leaked']" in p for p in problems)
    target.close()


def test_replay_into_used_store_fails_loudly(tmp_path: Path, records: list[Record]) -> None:
    uri = _uri("lmdb-deferred", tmp_path)
    target = open_target(uri)
    replay(target, records, verify_result=False, progress=False)
    target.close()
    again = open_target(uri)
    try:
        with pytest.raises(ValueError, match="already exists"):
            replay(again, records, progress=False)
    finally:
        again.close()


def test_budget_stops_early_and_verifies_the_prefix(records: list[Record]) -> None:
    target = open_target("memory://")
    result = replay(target, records, progress=False, budget_s=0.0)
    target.close()
    assert result.truncated
    assert 0 < result.ops < len(records)
    assert result.problems == []


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("nonsense", "not a target URI"),
        ("mongodb://localhost", "unknown target scheme 'mongodb'"),
        ("lmdb://", "names no path"),
        ("lmdb:///tmp/x?colour=red", "unknown lmdb:// option"),
    ],
)
def test_bad_uris_are_clear(uri: str, message: str) -> None:
    with pytest.raises(TargetError, match=message):
        open_target(uri)


def test_native_event_keeps_unknown_fields() -> None:
    event = native_event(
        {"id": "e", "timestamp": 2.0, "author": "m", "usage_metadata": {"tokens": 3},
         "actions": {"state_delta": {"a": 1}, "requested_auth_configs": {}}}
    )  # fmt: skip
    assert event.extra == {"usage_metadata": {"tokens": 3}}
    assert event.actions.state_delta == {"a": 1}
    assert event.actions.extra == {"requested_auth_configs": {}}


def test_percentiles() -> None:
    assert percentile(list(range(1, 101)), 0.5) == 50
    assert percentile(list(range(1, 101)), 0.99) == 99
    stats = LatencyStats.of([1000, 2000, 3000, 4000])
    assert (stats.p50, stats.max, stats.count) == (2.0, 4.0, 4)


def test_progress_bar_draws_only_on_a_terminal() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    plain, terminal = io.StringIO(), Terminal()
    for stream in (plain, terminal):
        bar = RichProgressBar(10, "replay", stream)
        bar.update(5)
        bar.close()
    assert plain.getvalue() == ""
    drawn = terminal.getvalue()
    assert "replay" in drawn
    # rich's count column: the last drawing shows how far the bar got.
    assert "5/10" in drawn
    # The bar's line is ended (before rich shows the cursor again).
    assert drawn.replace("\x1b[?25h", "").endswith("\n")


def test_replay_report_lays_out_its_table(records: list[Record]) -> None:
    target = open_target("memory://")
    try:
        result = replay(target, records, progress=False)
    finally:
        target.close()
    text = result.format()
    header = next(line for line in text.splitlines() if "p50 us" in line)
    assert header.split() == ["operation", "count", "p50", "us", "p90", "us", "p99", "us",
                              "total", "s"]  # fmt: skip
    row = next(line for line in text.splitlines() if line.split()[:1] == ["append"])
    # Numbers are right-aligned under their headings.
    assert row.index(f"{result.latency['append'].count:,}") + len(
        f"{result.latency['append'].count:,}"
    ) == header.index("count") + len("count")


@pytest.mark.adk
@pytest.mark.parametrize("scheme", ["adk-memory", "adk-sqlite", "adk-database"])
def test_replay_on_adk_services(scheme: str, tmp_path: Path, records: list[Record]) -> None:
    pytest.importorskip("google.adk")
    uri = {
        "adk-memory": "adk-memory://",
        "adk-sqlite": f"adk-sqlite://{tmp_path / 'adk.db'}",
        "adk-database": f"adk-database://sqlite+aiosqlite:///{tmp_path / 'db.db'}",
    }[scheme]
    target = open_target(uri)
    try:
        # ADK's SQL services take milliseconds a call: a prefix is enough.
        prefix = records if scheme == "adk-memory" else records[:60]
        result = replay(target, prefix, progress=False)
    finally:
        target.close()
    assert result.problems == []
