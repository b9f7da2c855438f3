"""The agent mix: its shape, as docs/performance.md defines it, and its determinism."""

from __future__ import annotations

import collections
import statistics
from pathlib import Path
from typing import Any

import pytest

from sessionscope.bench.mix import MixSpec, generate, generate_trace, session_lengths
from sessionscope.bench.replay import NativeTarget, open_target, replay
from sessionscope.bench.trace import load_trace

Record = dict[str, Any]
SessionKey = tuple[str, str, str]


@pytest.fixture(scope="module")
def mix() -> list[Record]:
    return list(generate(MixSpec()))


def _stored(records: list[Record]) -> list[Record]:
    return [r for r in records if r["op"] == "append" and not r["event"].get("partial")]


def _deltas(records: list[Record]) -> list[dict[str, Any]]:
    return [(r["event"].get("actions") or {}).get("state_delta") or {} for r in _stored(records)]


def _scope(key: str) -> str:
    for prefix in ("app:", "user:", "temp:"):
        if key.startswith(prefix):
            return prefix[:-1]
    return "session"


def test_counts_of_sessions_users_and_apps(mix: list[Record]) -> None:
    creates = [r for r in mix if r["op"] == "create"]
    assert len(creates) == 1000
    assert len({(r["app"], r["user"], r["session"]) for r in creates}) == 1000
    assert {r["app"] for r in creates} == {"app-0", "app-1", "app-2"}
    users = {r["user"] for r in creates}
    assert 95 <= len(users) <= 100
    ops = collections.Counter(r["op"] for r in mix)
    assert set(ops) == {"create", "append", "get", "list", "delete"}
    assert 0 < ops["delete"] < 60


def test_session_lengths_are_heavy_tailed_between_5_and_1000(mix: list[Record]) -> None:
    lengths = session_lengths(MixSpec())
    per_session = collections.Counter((r["app"], r["user"], r["session"]) for r in _stored(mix))
    # The lengths the spec draws are the stored events each session gets.
    assert sorted(per_session.values()) == sorted(lengths)
    assert min(lengths) >= 5
    assert max(lengths) <= 1000
    assert 35 <= statistics.median(lengths) <= 45
    # A heavy tail: the mean is well above the median, and some sessions are long.
    assert statistics.mean(lengths) > 1.4 * statistics.median(lengths)
    assert sum(n >= 200 for n in lengths) >= 20
    assert max(lengths) >= 500


def test_fixed_lengths_make_every_session_that_long() -> None:
    records = list(generate(MixSpec(sessions=6, lengths=(40, 40), seed=3)))
    per_session = collections.Counter((r["app"], r["user"], r["session"]) for r in _stored(records))
    assert list(per_session.values()) == [40] * 6


def test_events_are_shaped_as_adks_runner_writes_them(mix: list[Record]) -> None:
    events = [r["event"] for r in _stored(mix)]
    user_texts = [len(e["content"]["parts"][0]["text"]) for e in events if e["author"] == "user"]
    assert min(user_texts) >= 50
    assert max(user_texts) <= 2000
    assert max(user_texts) > 1500
    parts = [p for e in events for p in e["content"]["parts"]]
    calls = [p["function_call"] for p in parts if "function_call" in p]
    replies = [p["function_response"] for p in parts if "function_response" in p]
    assert calls
    # A session may end between a call and its reply (a run cut mid-turn): once at most.
    assert 0 <= len(calls) - len(replies) <= 1000
    assert any(isinstance(v, dict) for c in calls for v in c["args"].values())
    assert any(isinstance(v, dict) for r in replies for v in r["response"].values())
    assert {c["id"] for c in calls} >= {r["id"] for r in replies} - {None}
    # Finals save their answer under the agent's output_key.
    finals = [
        e for e in events
        if e["content"]["role"] == "model"
        and any(k.endswith("_answer") for k in (e.get("actions") or {}).get("state_delta", {}))
    ]  # fmt: skip
    assert finals
    for event in finals[:50]:
        delta = event["actions"]["state_delta"]
        key = next(k for k in delta if k.endswith("_answer"))
        assert delta[key] == event["content"]["parts"][0]["text"]
    partial = [r for r in mix if r["op"] == "append" and r["event"].get("partial")]
    assert partial
    ids = [e["id"] for e in events]
    assert len(ids) == len(set(ids))


def test_deltas_hold_every_type_on_every_scope(mix: list[Record]) -> None:
    seen: dict[str, set[type]] = collections.defaultdict(set)
    for delta in _deltas(mix):
        for key, value in delta.items():
            seen[_scope(key)].add(type(value))
    for scope in ("session", "user", "app"):
        assert seen[scope] >= {str, int, float, bool, list, dict}, scope
    assert seen["temp"] >= {str, int, dict}
    assert type(None) in seen["session"] and type(None) in seen["user"]
    nones = sum(value is None for delta in _deltas(mix) for value in delta.values())
    assert nones > 100


def test_one_append_in_twenty_comes_from_a_second_writer(mix: list[Record]) -> None:
    stored = _stored(mix)
    locked = [r for r in stored if r.get("locked")]
    assert 0.04 <= len(locked) / len(stored) <= 0.06
    assert not any(
        r.get("locked") for r in mix if r["op"] == "append" and r["event"].get("partial")
    )
    assert {r["event"]["author"] for r in locked} == {"memory_writer", "notifier"}
    unlocked = [r for r in stored if not r.get("locked")]
    assert not {r["event"]["author"] for r in unlocked} & {"memory_writer", "notifier"}


def test_reads_between_turns_ask_for_recent_events(mix: list[Record]) -> None:
    gets = [r for r in mix if r["op"] == "get"]
    windows = collections.Counter(
        None if r["config"] is None else r["config"]["num_recent_events"] for r in gets
    )
    assert set(windows) == {10, 20, None}
    assert windows[10] > windows[None]
    # One read per turn: about one for every user message.
    users = sum(r["event"]["author"] == "user" for r in _stored(mix))
    assert len(gets) == pytest.approx(users, rel=0.05)


def test_the_same_seed_gives_the_same_bytes(tmp_path: Path) -> None:
    spec = MixSpec(sessions=30, seed=7)
    first, second, other = tmp_path / "1.jsonl", tmp_path / "2.jsonl", tmp_path / "3.jsonl"
    generate_trace(first, spec)
    generate_trace(second, spec)
    generate_trace(other, MixSpec(sessions=30, seed=8))
    assert first.read_bytes() == second.read_bytes()
    assert first.read_bytes() != other.read_bytes()
    header, records = load_trace(first)
    assert header["generator"]["median_length"] == 40
    assert records == list(generate(spec))


def test_a_spec_that_describes_no_trace_is_refused() -> None:
    with pytest.raises(ValueError, match="lengths"):
        list(generate(MixSpec(lengths=(50, 10))))
    with pytest.raises(ValueError, match="at least 1"):
        list(generate(MixSpec(sessions=0)))


def test_a_replay_of_the_mix_sends_the_second_writer_through_the_locked_path(
    tmp_path: Path,
) -> None:
    records = list(generate(MixSpec(sessions=40, lengths=(5, 80), seed=2)))
    target = NativeTarget(f"lmdb://{tmp_path / 'store'}?durability=deferred")
    locked_calls: list[SessionKey] = []
    plain = target.append_locked

    def counting(key: SessionKey, event: Any) -> None:
        locked_calls.append(key)
        plain(key, event)

    target.append_locked = counting  # type: ignore[method-assign]
    try:
        result = replay(target, records, progress=False)
    finally:
        target.close()
    assert result.problems == []
    assert result.events == len(_stored(records))
    assert len(locked_calls) == sum(bool(r.get("locked")) for r in records)
    assert locked_calls


def test_each_sessions_events_are_in_time_order(mix: list[Record]) -> None:
    last: dict[SessionKey, float] = {}
    for record in mix:
        if record["op"] != "append":
            continue
        key = (record["app"], record["user"], record["session"])
        stamp = record["event"]["timestamp"]
        assert stamp > last.get(key, 0.0)
        last[key] = stamp


def test_adks_sqlite_service_replays_the_mix_to_the_state_it_implies(tmp_path: Path) -> None:
    """ADK's SQLite service orders a session's events by time: the mix must keep time order."""
    pytest.importorskip("google.adk")
    records = list(generate(MixSpec(sessions=6, lengths=(5, 40), seed=4)))
    target = open_target(f"adk-sqlite://{tmp_path / 'adk.db'}")
    try:
        result = replay(target, records, progress=False)
    finally:
        target.close()
    assert result.problems == []
