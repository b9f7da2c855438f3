"""Traces from outside: any malformed one is a TraceError, and one line on the command line."""

from __future__ import annotations

import gzip
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _stores import child_json, run_cli
from sessionscope.bench.replay import NativeTarget, replay
from sessionscope.bench.trace import FORMAT, MAX_LINE_CHARS, VERSION, TraceError, load_trace

HEADER = json.dumps({"format": FORMAT, "version": VERSION})
CREATE = {"op": "create", "app": "a", "user": "u", "session": "s", "state": {"k": 1}}
APPEND = {
    "op": "append",
    "app": "a",
    "user": "u",
    "session": "s",
    "event": {"id": "e1", "timestamp": 1.0, "author": "x", "actions": {"state_delta": {"n": 1}}},
}


def write(path: Path, *lines: str) -> Path:
    path.write_text("\n".join([HEADER, *lines]) + "\n", encoding="utf-8")
    return path


def with_event(**fields: Any) -> str:
    return json.dumps({**APPEND, "event": {**APPEND["event"], **fields}})


MALFORMED = {
    "deeply nested line": "[" * 100_000 + "]" * 100_000,
    "deeply nested value": json.dumps({**CREATE, "state": {"k": "x"}}).replace(
        '"x"', "[" * 600 + "]" * 600
    ),
    "$map holding a list": json.dumps({**CREATE, "state": {"k": {"$map": [1, 2]}}}),
    "$bytes holding an int": json.dumps({**CREATE, "state": {"k": {"$bytes": 5}}}),
    "$bytes holding no base64": json.dumps({**CREATE, "state": {"k": {"$bytes": "**"}}}),
    "state that is a list": json.dumps({**CREATE, "state": [1, 2]}),
    "event that is a string": json.dumps({**APPEND, "event": "e"}),
    "event without an id": json.dumps({**APPEND, "event": {"timestamp": 1.0}}),
    "actions that is a list": with_event(actions=[1]),
    "state delta that is a list": with_event(actions={"state_delta": [1]}),
    "timestamp that is text": with_event(timestamp="now"),
    "NaN": with_event(timestamp=float("nan")),
    "int beyond 64 bits": json.dumps({**CREATE, "state": {"k": 1 << 70}}),
    "lone surrogate": '{"op": "create", "app": "a", "user": "u", "session": "s", '
    '"state": {"k": "\\ud800"}}',
    "empty app": json.dumps({**CREATE, "app": ""}),
    "session id the service strips": json.dumps({**CREATE, "session": " s "}),
    "config with an unknown key": json.dumps(
        {"op": "get", "app": "a", "user": "u", "session": "s", "config": {"limit": 1}}
    ),
    "config with a bad count": json.dumps(
        {"op": "get", "app": "a", "user": "u", "session": "s", "config": {"num_recent_events": -1}}
    ),
    "list with a user that is a number": json.dumps({"op": "list", "app": "a", "user": 5}),
    "record that is a list": "[1, 2]",
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_line_is_a_trace_error(tmp_path: Path, case: str) -> None:
    path = write(tmp_path / "t.jsonl", json.dumps(CREATE), MALFORMED[case])
    with pytest.raises(TraceError, match=r"t\.jsonl:3: "):
        load_trace(path)


def test_replay_checks_the_records_it_is_given() -> None:
    bad: list[list[Any]] = [
        [{**CREATE, "state": [1]}],
        [{"op": "append"}],
        [APPEND],  # to a session never created
        [CREATE, CREATE],  # created twice
        [CREATE, {**APPEND, "event": {"id": "e", "timestamp": "now"}}],
        [CREATE, {**APPEND, "event": {"id": "e", "timestamp": None}}],
        [CREATE, APPEND, {**APPEND, "event": {**APPEND["event"], "author": "y"}}],
        ["not a record"],
    ]
    for records in bad:
        target = NativeTarget("memory://")
        try:
            with pytest.raises(TraceError, match=r"record [123]: "):
                replay(target, records, progress=False)
        finally:
            target.close()


_MEASURE = """
import json, sys
from sessionscope.bench.trace import TraceError, load_trace
try:
    load_trace(sys.argv[1])
    outcome = "loaded"
except TraceError as error:
    outcome = str(error)
# VmHWM is this process image's own peak: ru_maxrss would carry over the
# forking parent's (pytest's) peak across exec.
peak = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status")
            if line.startswith("VmHWM:"))
print(json.dumps({"outcome": outcome, "peak": peak}))
"""


def test_a_small_gz_holding_a_huge_line_is_refused_in_bounded_memory(tmp_path: Path) -> None:
    path = tmp_path / "long.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as file:
        file.write(HEADER + "\n" + json.dumps(CREATE)[:-2] + ', "big": "')
        for _ in range(256):
            file.write("a" * (1 << 20))
        file.write('"}\n')
    assert path.stat().st_size < 1 << 20
    result = child_json("-c", _MEASURE, str(path), timeout=300)
    assert f"long.jsonl.gz:2: longer than {MAX_LINE_CHARS:,} characters" in result["outcome"]
    assert result["peak"] < 160 << 20, result


# -- fuzzing: only TraceError escapes ------------------------------------------------

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(1 << 70), max_value=1 << 70),
    st.floats(allow_nan=False),
    st.text(max_size=8),
)
_tags = st.sampled_from(["$map", "$bytes", "op", "id", "state", "event", "actions", "k"])
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(_tags, inner, max_size=3),
    ),
    max_leaves=12,
)


@st.composite
def _records(draw: st.DrawFn) -> dict[str, Any]:
    base = draw(st.sampled_from([CREATE, APPEND]))
    record = json.loads(json.dumps(base))
    # Replace one field, at the top or in the event, with anything.
    where = record["event"] if "event" in record and draw(st.booleans()) else record
    where[draw(st.sampled_from([*where, "actions", "config", "timestamp"]))] = draw(_values)
    result: dict[str, Any] = record
    return result


@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(lines=st.lists(st.one_of(_records().map(json.dumps), st.text(max_size=30)), max_size=4))
def test_only_trace_errors_escape_load_and_replay(tmp_path: Path, lines: list[str]) -> None:
    lines = [line.replace("\n", " ") for line in lines]
    path = write(tmp_path / "fuzz.jsonl", json.dumps(CREATE), *lines)
    try:
        _, records = load_trace(path)
    except TraceError:
        return
    target = NativeTarget("memory://")
    try:
        replay(target, records, progress=False)
    except TraceError:
        pass
    finally:
        target.close()


# -- the command line: one line, no traceback ----------------------------------------


def _replay(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("replay", *args, "--no-progress")


@pytest.mark.parametrize(
    "case", ["deeply nested line", "$map holding a list", "$bytes holding an int", "NaN"]
)
def test_the_command_line_says_a_malformed_trace_in_one_line(tmp_path: Path, case: str) -> None:
    path = write(tmp_path / "t.jsonl", json.dumps(CREATE), MALFORMED[case])
    done = _replay(str(path), "--store", "memory://")
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1 and "t.jsonl:3" in done.stderr, done.stderr


def test_replay_into_a_store_that_holds_the_sessions_says_so_in_one_line(tmp_path: Path) -> None:
    path = write(tmp_path / "t.jsonl", json.dumps(CREATE), json.dumps(APPEND))
    store = tmp_path / "store"
    first = _replay(str(path), "--store", f"lmdb://{store}")
    assert first.returncode == 0, first.stderr
    again = _replay(str(path), "--store", f"lmdb://{store}")
    assert again.returncode == 1
    assert "Traceback" not in again.stderr
    assert again.stderr.count("\n") == 1, again.stderr
    assert "AlreadyExistsError" in again.stderr and "new, empty store" in again.stderr
