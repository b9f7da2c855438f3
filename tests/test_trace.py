"""Traces: the file format, the generator and the exporter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sessionscope import SyncSessionService
from sessionscope.bench.mix import MixSpec, generate_trace
from sessionscope.bench.replay import NativeTarget, replay
from sessionscope.bench.trace import (
    FORMAT,
    VERSION,
    Expectation,
    TraceError,
    decode_value,
    encode_value,
    export_trace,
    load_trace,
    read_trace,
    sample_trace_path,
    write_trace,
)
from sessionscope.stores import MemoryStore

SMALL = MixSpec(sessions=12, users=4, lengths=(5, 20), seed=5)


def test_values_round_trip_through_json() -> None:
    value = {
        "blob": b"\x00\xffbinary",
        "nested": [{"deep": bytearray(b"x")}, (1, 2.5, None, True)],
        "$bytes": "a user key that looks like a tag",
        "alone": {"$bytes": "not base64, a plain string"},
        "also": {"$map": 1},
        "text": "ünïcode ✓",
    }
    decoded = decode_value(json.loads(json.dumps(encode_value(value))))
    assert decoded == {
        "blob": b"\x00\xffbinary",
        "nested": [{"deep": b"x"}, [1, 2.5, None, True]],
        "$bytes": "a user key that looks like a tag",
        "alone": {"$bytes": "not base64, a plain string"},
        "also": {"$map": 1},
        "text": "ünïcode ✓",
    }


def test_unwritable_value_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="set"):
        encode_value({"a": {1, 2}})


@pytest.mark.parametrize("name", ["trace.jsonl", "trace.jsonl.gz"])
def test_write_read_round_trip(tmp_path: Path, name: str) -> None:
    records = [
        {"op": "create", "app": "a", "user": "u", "session": "s", "state": {"k": b"\x01"}},
        {
            "op": "append",
            "app": "a",
            "user": "u",
            "session": "s",
            "event": {"id": "e1", "timestamp": 1.25, "author": "user", "content": None},
        },
        {"op": "get", "app": "a", "user": "u", "session": "s", "config": {"num_recent_events": 3}},
        {"op": "list", "app": "a", "user": None},
        {"op": "delete", "app": "a", "user": "u", "session": "s"},
    ]
    path = tmp_path / name
    assert write_trace(path, records, {"note": "hand-made"}) == len(records)
    header, read = load_trace(path)
    assert header == {"format": FORMAT, "version": VERSION, "note": "hand-made"}
    assert read == records


def test_unknown_version_is_refused_clearly(tmp_path: Path) -> None:
    path = tmp_path / "future.jsonl"
    path.write_text(json.dumps({"format": FORMAT, "version": VERSION + 1}) + "\n")
    with pytest.raises(TraceError, match=f"version {VERSION + 1}.*reads version {VERSION} only"):
        read_trace(path)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "is empty"),
        ("not json\n", "line 1 is not JSON"),
        ('{"format": "something-else", "version": 1}\n', "not a sessionscope trace"),
    ],
)
def test_bad_headers_are_refused(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(TraceError, match=message):
        read_trace(path)


def test_bad_record_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    header = json.dumps({"format": FORMAT, "version": VERSION})
    path.write_text(header + '\n{"op": "list", "app": "a"}\n{"op": "rename", "app": "a"}\n')
    with pytest.raises(TraceError, match=r"bad.jsonl:3: unknown op 'rename'"):
        load_trace(path)


def test_missing_file_is_a_trace_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="does not exist"):
        read_trace(tmp_path / "nope.jsonl")


def test_generator_is_deterministic(tmp_path: Path) -> None:
    first, second, other = tmp_path / "1.jsonl", tmp_path / "2.jsonl", tmp_path / "3.jsonl"
    generate_trace(first, SMALL)
    generate_trace(second, SMALL)
    generate_trace(other, MixSpec(sessions=12, users=4, lengths=(5, 20), seed=6))
    assert first.read_bytes() == second.read_bytes()
    assert first.read_bytes() != other.read_bytes()


def test_expectation_drops_temp_keys_and_deleted_sessions() -> None:
    records = [
        {"op": "create", "app": "a", "user": "u", "session": "s",
         "state": {"k": 1, "temp:t": 1, "app:x": 1, "user:y": 1}},
        {"op": "append", "app": "a", "user": "u", "session": "s",
         "event": {"id": "1", "actions": {"state_delta": {"k": 2, "temp:z": 0, "user:y": 2}}}},
        {"op": "append", "app": "a", "user": "u", "session": "s",
         "event": {"id": "2", "partial": True, "actions": {"state_delta": {"k": 9}}}},
        {"op": "create", "app": "a", "user": "v", "session": "gone", "state": {"app:x": 3}},
        {"op": "delete", "app": "a", "user": "v", "session": "gone"},
    ]  # fmt: skip
    expected = Expectation.of(records)
    assert list(expected.sessions) == [("a", "u", "s")]
    assert expected.merged_state("a", "u", "s") == {"k": 2, "app:x": 3, "user:y": 2}
    assert expected.sessions[("a", "u", "s")].event_count == 1


def test_sample_trace_is_shipped_and_small() -> None:
    path = sample_trace_path()
    assert path.stat().st_size < 200_000
    header, records = load_trace(path)
    assert header["version"] == VERSION
    assert Expectation.of(records).event_count > 50


def test_export_round_trips_a_store(tmp_path: Path) -> None:
    _, records = load_trace(sample_trace_path())
    source = NativeTarget("memory://")
    assert replay(source, records, progress=False).problems == []
    apps = sorted({r["app"] for r in records})
    for app in apps:
        out = tmp_path / f"{app}.jsonl"
        export_trace(source.service.store, app, out)
        _, exported = load_trace(out)
        copy = NativeTarget("memory://")
        result = replay(copy, exported, progress=False)
        assert result.problems == []
        for key in [k for k in Expectation.of(records).sessions if k[0] == app]:
            assert copy.read(*key) == source.read(*key)
        copy.close()
    source.close()


def test_export_keeps_initial_and_orphaned_shared_state(tmp_path: Path) -> None:
    service = SyncSessionService(MemoryStore())
    gone = service.create_session(
        app_name="a", user_id="u", session_id="gone", state={"app:from_gone": 1}
    )
    kept = service.create_session(
        app_name="a", user_id="u", session_id="kept", state={"initial": True, "user:tier": "pro"}
    )
    service.delete_session(app_name="a", user_id="u", session_id=gone.id)
    out = tmp_path / "out.jsonl"
    export_trace(service.store, "a", out)
    _, exported = load_trace(out)
    assert Expectation.of(exported).merged_state("a", "u", kept.id) == {
        "initial": True,
        "user:tier": "pro",
        "app:from_gone": 1,
    }


def test_an_event_as_deep_as_the_service_stores_exports_and_replays(tmp_path: Path) -> None:
    # Each field of an event, and each value of its delta, may nest as deep as
    # the service stores; in a trace they sit a few levels below the record.
    from sessionscope import Event, EventActions
    from sessionscope.core import MAX_DEPTH

    def nested(levels: int, leaf: object) -> object:
        value = leaf
        for _ in range(levels):
            value = [value]
        return value

    deepest = nested(MAX_DEPTH - 1, b"raw")  # bytes, so reading the trace decodes it
    source = SyncSessionService(MemoryStore())
    session = source.create_session(app_name="app", user_id="user", session_id="deep")
    source.append_event(
        session,
        Event(
            author="agent",
            timestamp=1.0,
            custom_metadata={"k": deepest},
            actions=EventActions(state_delta={"deep": deepest}),
        ),
    )
    out = tmp_path / "deep.jsonl"
    export_trace(source.store, "app", out)
    _, records = load_trace(out)
    copy = NativeTarget("memory://")
    assert replay(copy, records, progress=False).problems == []
    back = copy.service.get_session(app_name="app", user_id="user", session_id="deep")
    assert back is not None
    assert back.events[0].custom_metadata == {"k": deepest}
    assert back.state["deep"] == deepest
    copy.close()
