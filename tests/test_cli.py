"""The ``sessionscope`` command, run as ``python -m sessionscope`` in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sessionscope.bench.replay import open_target, replay
from sessionscope.bench.trace import FORMAT, Expectation, load_trace, sample_trace_path


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run the command; never on a terminal, so no progress bar is drawn."""
    env = {**os.environ, "PYTHONWARNINGS": "error"}
    return subprocess.run(
        [sys.executable, "-m", "sessionscope", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env=env,
        check=False,
    )


def test_help_lists_the_commands() -> None:
    done = run("--help")
    assert done.returncode == 0
    for command in ("bench", "replay", "generate", "export", "ls", "verify", "backup", "migrate"):
        assert command in done.stdout
    assert run("replay", "--help").returncode == 0


def test_no_command_prints_help_and_fails() -> None:
    done = run()
    assert done.returncode == 2
    assert "usage: sessionscope" in done.stdout


def test_replay_sample_on_lmdb(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    store = f"lmdb://{tmp_path / 'store'}?durability=deferred"
    done = run("replay", "sample", "--store", store, "--json", str(out))
    assert done.returncode == 0, done.stderr
    assert "verify   ok" in done.stdout
    assert "p99 us" in done.stdout
    assert done.stderr == ""
    result = json.loads(out.read_text())
    assert result["problems"] == []
    assert result["latency"]["append"]["count"] > 0


def test_replay_with_batches(tmp_path: Path) -> None:
    done = run("replay", str(sample_trace_path()), "--store", "memory://", "--batch", "32")
    assert done.returncode == 0, done.stderr
    assert "bulk path, batches of 32" in done.stdout


def test_replay_into_a_used_store_exits_1(tmp_path: Path) -> None:
    store = f"lmdb://{tmp_path / 'store'}"
    assert run("replay", "sample", "--store", store, "--no-verify").returncode == 0
    done = run("replay", "sample", "--store", store)
    assert done.returncode == 1
    assert "already exists" in done.stderr
    assert "new, empty store" in done.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["replay", "missing.jsonl", "--store", "memory://"], "does not exist"),
        (["replay", "sample", "--store", "mongodb://x"], "unknown target scheme 'mongodb'"),
        (["replay", "sample", "--store", "memory"], "not a target URI"),
        (["replay", "sample", "--store", "lmdb:///tmp/x?bogus=1"], "unknown lmdb:// option"),
        (
            ["export", "lmdb:///no/such/store", "o.jsonl", "--format", "trace", "--app", "a"],
            "no store",
        ),
        (
            ["export", "ftp://x", "o.jsonl", "--format", "trace", "--app", "a"],
            "unknown store scheme",
        ),
        (["export", "memory://", "o.jsonl", "--format", "trace"], "needs --app"),
        (["replay", "sample", "--store", "memory://", "--batch", "0"], "not positive"),
    ],
)
def test_bad_input_exits_2_with_a_clear_error(
    tmp_path: Path, args: list[str], message: str
) -> None:
    done = run(*args, cwd=tmp_path)
    assert done.returncode == 2
    assert message in done.stderr
    assert "Traceback" not in done.stderr


def test_unknown_trace_version_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "future.jsonl"
    path.write_text(json.dumps({"format": FORMAT, "version": 99}) + "\n")
    done = run("replay", str(path), "--store", "memory://")
    assert done.returncode == 2
    assert "version 99" in done.stderr


def test_generate_is_deterministic(tmp_path: Path) -> None:
    for name in ("a.jsonl", "b.jsonl"):
        done = run("generate", str(tmp_path / name), "--sessions", "5", "--seed", "3")
        assert done.returncode == 0, done.stderr
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()


def test_generate_writes_the_mix_of_the_options_given(tmp_path: Path) -> None:
    out = tmp_path / "mix.jsonl"
    done = run(
        "generate", str(out), "--sessions", "8", "--apps", "2", "--users", "3",
        "--lengths", "12", "12", "--seed", "1",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    header, records = load_trace(out)
    assert header["generator"]["lengths"] == [12, 12]
    stored = [r for r in records if r["op"] == "append" and not r["event"].get("partial")]
    assert len(stored) == 8 * 12
    assert {r["app"] for r in records} <= {"app-0", "app-1"}
    assert len({r["user"] for r in records if r["op"] == "create"}) <= 3


def test_generate_refuses_lengths_upside_down_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "mix.jsonl"
    done = run("generate", str(out), "--lengths", "50", "10")
    assert done.returncode == 2
    assert "--lengths 50 10" in done.stderr
    assert not out.exists()


def test_export_then_replay(tmp_path: Path) -> None:
    _, records = load_trace(sample_trace_path())
    uri = f"lmdb://{tmp_path / 'store'}?durability=deferred"
    target = open_target(uri)
    assert replay(target, records, progress=False).problems == []
    target.close()
    out = tmp_path / "export.jsonl"
    done = run("export", uri, str(out), "--format", "trace", "--app", "app-0")
    assert done.returncode == 0, done.stderr
    _, exported = load_trace(out)
    want = {k for k in Expectation.of(records).sessions if k[0] == "app-0"}
    assert set(Expectation.of(exported).sessions) == want
    done = run("replay", str(out), "--store", "memory://")
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("kind", ["results", "other file", "a file"])
def test_bench_refuses_an_out_that_holds_anything_before_it_runs(tmp_path: Path, kind: str) -> None:
    # What --out names is a new or an empty directory: a run never writes over
    # a file, another run's results included, and is refused before it starts.
    out = tmp_path / "bench"
    if kind == "a file":
        out.write_text("keep me")
    else:
        out.mkdir()
        (out / ("results.json" if kind == "results" else "notes.txt")).write_text("keep me")
    before = sorted(
        (p.relative_to(tmp_path), p.read_bytes()) for p in tmp_path.rglob("*") if p.is_file()
    )
    done = run(
        "bench", "--quick", "--sessions", "4", "--no-peers", "--no-progress", "--out", str(out)
    )
    assert done.returncode == 2, done.stderr
    assert str(out) in done.stderr and "replaying" not in done.stderr
    after = sorted(
        (p.relative_to(tmp_path), p.read_bytes()) for p in tmp_path.rglob("*") if p.is_file()
    )
    assert after == before


def test_bench_quick_tiny(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    done = run(
        "bench", "--quick", "--sessions", "4", "--budget", "0.2", "--no-peers",
        "--no-progress", "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "sessionscope lmdb durable" in done.stdout
    assert "raw lmdb put+commit, fsync" in done.stdout
    assert "lift" in done.stdout
    assert "speed targets" in done.stdout
    assert "raw py-lmdb txn, fsync" in done.stdout
    assert "medians over the mix" in done.stdout
    results = json.loads((out / "results.json").read_text())
    names = {figure["name"] for figure in results["targets"]}
    assert {
        "native sync deferred append, over the mix",
        "native durable append (async), over the mix",
        "replay --batch 1000 of the mix",
    } <= names
    # Without peers, the sweep holds our systems and the raw transactions at every length:
    # deferred and durable appends, and the bulk path beside its raw peer.
    sweep = results["mix_sweep_us"]
    for name in (
        "raw py-lmdb txn, no fsync",
        "native durable append (sync)",
        "native durable append (async)",
        "raw py-lmdb txn, fsync",
        "native append_many, batches of 1,000 (us/event)",
        "native replay --batch 1000 (us/event)",
        "raw py-lmdb txn per batch of 1,000 (us/event)",
    ):
        assert set(sweep[name]) == {"10", "40", "200", "1000"}, name
        assert name in done.stdout
    assert "adk InMemory append_event" not in sweep
    assert "adk Sqlite append_event" not in sweep
    # The bulk rows stand beside their raw peer of the same run.
    for figure in results["targets"]:
        if figure["name"] in ("append_many on the mix, batches of 1,000",
                              "replay --batch 1000 of the mix"):  # fmt: skip
            assert figure["peer_name"] == "raw py-lmdb txn per batch of 1,000"
            assert figure["peer"] > 0 and figure["ratio"] > 0
            assert figure["target"] == ">= 150,000 events/s"
    assert results["results"][0]["problems"] == []
    assert set(results["throughput_vs_writers"]) >= {"sessionscope lmdb durable, asyncio tasks"}
    pytest.importorskip("matplotlib")
    assert (out / "latency_vs_length.png").stat().st_size > 0
    assert (out / "throughput_vs_concurrency.png").stat().st_size > 0
    assert (out / "mix_sweep.png").stat().st_size > 0
