"""What the command line writes and which files it opens: real processes, real files.

Output files (export, backup, generate) are new and owner-only, written
whole or not at all, never through a link, never over another file and
never into a store; compact and upgrade refuse the store files opening
refuses. Errors are one line on stderr, and one JSON object on stdout with
``--json``.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from _stores import child_env, refused
from _stores import run_cli_strict as run
from sessionscope import Event, EventActions, LmdbStore, SyncSessionService
from sessionscope.admin.dump import export_dump
from sessionscope.admin.outfile import OutputPathError

CHILDREN = Path(__file__).with_name("_cli_children.py")


def build(path: Path, sessions: int = 3, events: int = 4) -> None:
    with SyncSessionService(LmdbStore(path)) as svc:
        for k in range(sessions):
            session = svc.create_session(
                app_name="app", user_id="u", session_id=f"s{k}", state={"n": k}
            )
            for i in range(events):
                event = Event(author="agent", content={"parts": [{"text": f"line {i}"}]})
                event.actions = EventActions(state_delta={"i": i})
                svc.append_event(session, event)


@pytest.fixture
def store(tmp_path: Path) -> Path:
    path = tmp_path / "store"
    build(path)
    return path


def uri(path: Path) -> str:
    return f"lmdb://{path}"


def listing(path: Path) -> list[str]:
    return sorted(os.listdir(path))


# -- item 8: output files ------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "extra"),
    [("all.dump", []), ("all.dump.gz", []), ("app.jsonl", ["--format", "trace", "--app", "app"])],
)
def test_export_writes_a_new_owner_only_file(
    store: Path, tmp_path: Path, name: str, extra: list[str]
) -> None:
    out = tmp_path / name
    done = run("export", uri(store), str(out), *extra)
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert not (tmp_path / f"{name}.partial").exists()


@pytest.mark.parametrize("extra", [[], ["--format", "trace", "--app", "app"]])
def test_export_never_overwrites(store: Path, tmp_path: Path, extra: list[str]) -> None:
    out = tmp_path / "out"
    out.write_text("mine")
    refused(run("export", uri(store), str(out), *extra), "exists")
    assert out.read_text() == "mine"
    assert not (tmp_path / "out.partial").exists()


def test_a_planted_partial_link_is_neither_followed_nor_removed(
    store: Path, tmp_path: Path
) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    os.symlink(victim, tmp_path / "out.dump.partial")
    for extra in ([], ["--format", "trace", "--app", "app"]):
        refused(run("export", uri(store), str(tmp_path / "out.dump"), *extra), "partial")
        assert victim.read_text() == "keep me"
        assert (tmp_path / "out.dump.partial").is_symlink()
        assert not (tmp_path / "out.dump").exists()


@pytest.mark.parametrize("kind", ["directory", "fifo", "device", "link"])
def test_export_refuses_what_is_not_a_new_file(store: Path, tmp_path: Path, kind: str) -> None:
    if kind == "directory":
        out = tmp_path / "dir"
        out.mkdir()
    elif kind == "fifo":
        out = tmp_path / "fifo"
        os.mkfifo(out)
    elif kind == "device":
        out = Path("/dev/null")
    else:
        target = tmp_path / "target"
        target.write_text("keep me")
        out = tmp_path / "link"
        os.symlink(target, out)
    before = listing(tmp_path)
    refused(run("export", uri(store), str(out)), str(out))
    assert listing(tmp_path) == before  # no .partial, nothing else
    if kind == "link":
        assert (tmp_path / "target").read_text() == "keep me"


def test_export_never_writes_into_a_store(store: Path, tmp_path: Path) -> None:
    data = store / "data.mdb"
    before = data.read_bytes()
    for out in (data, store / "lock.mdb", store / "new.dump", store / ".." / "store" / "x"):
        refused(run("export", uri(store), str(out)), "store")
    # Through a link to the store's directory too.
    os.symlink(store, tmp_path / "alias")
    refused(run("export", uri(store), str(tmp_path / "alias" / "data.mdb")), "store")
    assert data.read_bytes() == before
    assert listing(store) == ["data.mdb", "lock.mdb"]
    assert run("verify", uri(store)).returncode == 0


def test_export_never_writes_over_a_store_another_process_has_open(
    store: Path, tmp_path: Path
) -> None:
    other = tmp_path / "other"
    build(other)
    before = (other / "data.mdb").read_bytes()
    holder = subprocess.Popen(
        [sys.executable, str(CHILDREN), "hold", str(other)],
        stdout=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "ready"
        for name in ("data.mdb", "lock.mdb", "new.dump"):
            refused(run("export", uri(store), str(other / name)), "store directory")
        refused(run("backup", uri(store), str(other / "copy")), "store directory")
    finally:
        if holder.poll() is None:
            os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)
        assert holder.stdout is not None
        holder.stdout.close()
    assert (other / "data.mdb").read_bytes() == before
    assert listing(other) == ["data.mdb", "lock.mdb"]


@pytest.mark.parametrize("command", ["export", "export-trace", "generate", "backup"])
def test_a_missing_parent_is_refused_and_never_made(
    store: Path, tmp_path: Path, command: str
) -> None:
    missing = tmp_path / "no" / "such"
    args = {
        "export": ["export", uri(store), str(missing / "out.dump")],
        "export-trace": [
            "export",
            uri(store),
            str(missing / "t.jsonl"),
            "--format",
            "trace",
            "--app",
            "app",
        ],
        "generate": ["generate", str(missing / "t.jsonl"), "--sessions", "2"],
        "backup": ["backup", uri(store), str(missing / "copy")],
    }[command]
    refused(run(*args), "does not exist")
    assert not (tmp_path / "no").exists()


def test_generate_writes_a_new_owner_only_file_once(tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl.gz"
    assert run("generate", str(out), "--sessions", "2").returncode == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    first = out.read_bytes()
    refused(run("generate", str(out), "--sessions", "3"), "exists")
    assert out.read_bytes() == first
    assert listing(tmp_path) == ["t.jsonl.gz"]


def test_backup_makes_an_owner_only_copy_and_refuses_links_and_stores(
    store: Path, tmp_path: Path
) -> None:
    copy = tmp_path / "copy"
    assert run("backup", uri(store), str(copy)).returncode == 0
    assert stat.S_IMODE(copy.stat().st_mode) == 0o700
    assert stat.S_IMODE((copy / "data.mdb").stat().st_mode) == 0o600
    empty = tmp_path / "empty"
    empty.mkdir()
    os.symlink(empty, tmp_path / "link")
    refused(run("backup", uri(store), str(tmp_path / "link")), "symbolic link")
    assert listing(empty) == []
    refused(run("backup", uri(store), str(store / "inside")), "store")
    refused(run("backup", uri(store), str(copy)), "not empty")
    assert listing(store) == ["data.mdb", "lock.mdb"]


def test_backup_never_writes_through_a_planted_data_file(store: Path, tmp_path: Path) -> None:
    source = LmdbStore(store)
    try:
        dest = tmp_path / "dest"
        dest.mkdir()
        victim = tmp_path / "victim"
        victim.write_text("keep me")
        os.symlink(victim, dest / "data.mdb")
        with pytest.raises(OutputPathError):
            source.copy_to(dest)
        assert victim.read_text() == "keep me"
        assert (dest / "data.mdb").is_symlink()
    finally:
        source.close()


def test_export_dump_refuses_an_existing_file_and_leaves_nothing(
    store: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out.dump"
    out.write_bytes(b"mine")
    source = LmdbStore(store)
    try:
        with pytest.raises(OutputPathError, match="exists"):
            export_dump(source, out)
        with pytest.raises(OutputPathError, match="store"):
            export_dump(source, store / "copy.dump")
    finally:
        source.close()
    assert out.read_bytes() == b"mine"
    assert listing(tmp_path) == ["out.dump", "store"]


# -- item 9: compact and upgrade check the store's files ---------------------------------


@pytest.mark.parametrize("command", ["compact", "upgrade"])
def test_a_linked_lock_file_is_refused_and_its_target_untouched(
    store: Path, tmp_path: Path, command: str
) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"x" * 5000)
    (store / "lock.mdb").unlink()
    os.symlink(victim, store / "lock.mdb")
    refused(run(command, uri(store)), "lock.mdb is a symbolic link")
    assert victim.read_bytes() == b"x" * 5000
    assert (store / "lock.mdb").is_symlink()


@pytest.mark.parametrize("command", ["compact", "upgrade"])
@pytest.mark.parametrize("name", ["lock.mdb", "data.mdb"])
def test_a_fifo_store_file_is_refused_without_waiting(
    tmp_path: Path, command: str, name: str
) -> None:
    path = tmp_path / "store"
    build(path)
    if name == "data.mdb":
        (path / "lock.mdb").unlink()
        (path / "data.mdb").rename(tmp_path / "moved")
    else:
        (path / name).unlink()
    os.mkfifo(path / name)
    done = run(command, uri(path))
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert stat.S_ISFIFO(os.lstat(path / name).st_mode)


@pytest.mark.parametrize("command", ["compact", "upgrade"])
def test_a_directory_others_may_write_is_refused_as_opening_refuses_it(
    store: Path, command: str
) -> None:
    before = (store / "data.mdb").read_bytes()
    store.chmod(0o770)
    try:
        # A refusal of the store, as every other command says it (exit 1);
        # a link in place of a store file is bad input (exit 2), for all.
        done = run(command, uri(store))
        assert done.returncode == 1, (done.returncode, done.stderr)
        assert done.stderr.count("\n") == 1, done.stderr
        assert "UnsafeStoreError" in done.stderr and "Traceback" not in done.stderr
        assert "writable by group" in done.stderr and "?file_mode=660" in done.stderr
        assert run("ls", uri(store)).returncode == 1
        assert (store / "data.mdb").read_bytes() == before
        # The URI options opening takes are taken here too.
        assert run(command, uri(store) + "?file_mode=660").returncode == 0
        assert run(command, uri(store) + "?trust_directory=yes").returncode == 0
        refused(run(command, uri(store) + "?file_mode=nine"), "file_mode")
    finally:
        store.chmod(0o700)


def test_a_refused_upgrade_says_what_to_run(store: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, str(CHILDREN), "hold", str(store)],
        stdout=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "ready"
        for command in ("upgrade", "compact"):
            done = run(command, uri(store))
            assert done.returncode == 1
            assert done.stderr.count("\n") == 1
            assert f"then run `sessionscope {command} lmdb://{store.resolve()}` again" in (
                done.stderr
            )
    finally:
        if holder.poll() is None:
            os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)
        assert holder.stdout is not None
        holder.stdout.close()


# -- item 15: what the errors and the help say ---------------------------------------


def test_verify_lists_a_damaged_event_once_with_one_hint(store: Path) -> None:
    import lmdb

    from sessionscope.codec import unpack

    env = lmdb.open(str(store), max_dbs=8)
    sessions, data = env.open_db(b"sessions"), env.open_db(b"data")
    with env.begin(write=True) as txn:
        record = next(unpack(v) for _, v in txn.cursor(db=sessions) if unpack(v)[2] == "s1")
        key = int(record[3]).to_bytes(8, "big") + b"e" + (2).to_bytes(8, "big")
        value = txn.get(key, db=data)
        txn.put(key, value[:8] + b"\x01\xc1\xc1", db=data)  # format byte, then garbage
    env.close()
    done = run("verify", uri(store))
    assert done.returncode == 1
    problems = [line for line in done.stdout.splitlines() if line.startswith("  - ")]
    assert len(problems) == 1, done.stdout
    assert "session app/u/s1: event 2 does not decode" in problems[0]
    assert "hint" not in problems[0]
    assert done.stdout.count("sessionscope verify") == 1
    assert done.stdout.count("hint") == 1
    doc = json.loads(run("verify", uri(store), "--json").stdout)
    assert len(doc["problems"]) == 1
    assert "backup" in doc["hint"]


def _json_error(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    document = json.loads(done.stdout)
    assert set(document) == {"error"}
    assert set(document["error"]) == {"type", "message", "hint"}
    return document["error"]  # type: ignore[no-any-return]


def test_json_errors_are_one_object_on_stdout(store: Path, tmp_path: Path) -> None:
    missing = run("ls", uri(tmp_path / "missing"), "--json")
    assert missing.returncode == 2
    assert missing.stderr.count("\n") == 1
    error = _json_error(missing)
    assert error["type"] == "UsageError"
    assert "does not exist" in error["message"]

    exists = tmp_path / "out"
    exists.write_text("mine")
    done = run("export", uri(store), str(exists), "--json")
    assert done.returncode == 2
    error = _json_error(done)
    assert error["type"] == "OutputPathError"
    assert error["message"] == f"{exists} exists"
    assert "nothing is overwritten" in error["hint"]

    usage = run("ls", uri(store), "--limit", "0", "--json")
    assert usage.returncode == 2
    assert usage.stderr.count("\n") == 1
    assert "--limit" in _json_error(usage)["message"]

    (store / "lock.mdb").unlink()
    os.symlink(tmp_path / "out", store / "lock.mdb")
    error = _json_error(run("compact", uri(store), "--json"))
    assert "symbolic link" in error["message"]
    assert error["hint"] == "a store's files must be plain files: remove the link"


def test_store_commands_help_lists_every_scheme_they_take() -> None:
    for command in ("ls", "show", "tail", "stats", "verify", "export", "import"):
        text = " ".join(run(command, "--help").stdout.split())
        for scheme in ("lmdb://", "redis://", "rediss://", "redis+cluster://", "memory://"):
            assert scheme in text, (command, scheme)
    for command in ("backup", "compact", "upgrade"):
        text = run(command, "--help").stdout
        assert "lmdb://" in text
        assert "redis" not in text and "memory://" not in text


def test_an_unsafe_directory_hint_names_the_uri_option(store: Path) -> None:
    store.chmod(0o770)
    try:
        done = run("ls", uri(store))
    finally:
        store.chmod(0o700)
    assert done.returncode == 1
    assert "?trust_directory=yes" in done.stderr
    assert "?file_mode=660" in done.stderr
    assert run("ls", uri(store) + "?file_mode=660").returncode == 0


@pytest.mark.parametrize("name", ["mix.jsonl", "mix.jsonl.gz"])
def test_generate_ended_by_sigterm_leaves_no_partial(tmp_path: Path, name: str) -> None:
    # A run stopped by SIGTERM (a supervisor, a timeout) ends as on Ctrl-C:
    # its .partial removed, so the next run is not refused over it.
    out = tmp_path / name
    partial = tmp_path / f"{name}.partial"
    child = subprocess.Popen(
        [sys.executable, "-m", "sessionscope", "generate", str(out), "--sessions", "100000"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    try:
        for _ in range(600):  # up to a minute for the file to appear
            if partial.exists() or child.poll() is not None:
                break
            time.sleep(0.1)
        assert partial.exists(), "the run wrote nothing to stop"
        child.send_signal(signal.SIGTERM)
        _, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 128 + signal.SIGTERM, err
    assert err.strip() == "terminated"  # one line, as every way a command ends
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    done = run("generate", str(out), "--sessions", "3")
    assert done.returncode == 0, done.stderr
    assert out.exists() and not partial.exists()


def test_a_gzip_trace_is_the_same_bytes_at_another_time_and_name(tmp_path: Path) -> None:
    first, second = tmp_path / "a.jsonl.gz", tmp_path / "b.jsonl.gz"
    assert run("generate", str(first), "--sessions", "5", "--seed", "3").returncode == 0
    # Another second, another name: neither may reach the gzip header.
    time.sleep(1.1)
    assert run("generate", str(second), "--sessions", "5", "--seed", "3").returncode == 0
    assert first.read_bytes() == second.read_bytes()


def _file_size_limit(limit: int) -> Any:
    """Return a preexec that makes writes past ``limit`` bytes fail, as a full disk does."""

    def apply() -> None:
        import resource

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a failed write, not a signal
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def test_an_export_that_runs_out_of_space_leaves_no_partial(tmp_path: Path) -> None:
    """The .partial goes on any failure, a write that fails included; the rerun is not refused."""
    store = tmp_path / "store"
    build(store, sessions=20, events=200)
    out = tmp_path / "out" / "all.dump"
    out.parent.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "sessionscope", "export", f"lmdb://{store}", str(out)],
        capture_output=True,
        text=True,
        env=child_env(),
        preexec_fn=_file_size_limit(64 * 1024),
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert sorted(p.name for p in out.parent.iterdir()) == []
    again = run("export", f"lmdb://{store}", str(out))
    assert again.returncode == 0, again.stderr
    assert out.stat().st_size > 64 * 1024
