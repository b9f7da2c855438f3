"""What the command line leaves on disk: the replay report, stores refused or left behind.

``replay --json FILE`` makes its report as every other output file is made
(new, owner-only, never through a link, refused before the replay runs);
store files that are links are bad input for every command (exit 2).
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from _stores import child_env, refused, run_cli
from _stores import run_cli_strict as run
from sessionscope import Event, LmdbStore, SyncSessionService
from sessionscope.admin.dump import export_dump
from sessionscope.bench.replay import check_trace, open_target, replay
from sessionscope.bench.trace import FORMAT, VERSION, TraceError, check_record
from sessionscope.cli import main
from sessionscope.crypto.keystore import open_key_store
from sessionscope.stores.records import ENCRYPTION_MARKER_APP


def replay_into(store: Path, report: Path, *more: str) -> subprocess.CompletedProcess[str]:
    return run("replay", "sample", "--no-progress", "--store", f"lmdb://{store}",
               "--json", str(report), *more)  # fmt: skip


# -- replay --json FILE ----------------------------------------------------------------


def test_the_replay_report_is_a_new_owner_only_file(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    done = replay_into(tmp_path / "store", report)
    assert done.returncode == 0, done.stderr
    assert json.loads(report.read_text())["problems"] == []
    assert stat.S_IMODE(os.lstat(report).st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json", "store"]


def test_a_replay_report_through_a_link_is_refused_before_the_replay(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (tmp_path / "link.json").symlink_to(victim)
    refused(replay_into(tmp_path / "store", tmp_path / "link.json"), "symbolic link")
    assert victim.read_text() == "precious"
    assert not (tmp_path / "store").exists()


def test_an_existing_replay_report_is_not_overwritten(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    report.write_text("keep me")
    report.chmod(0o644)
    refused(replay_into(tmp_path / "store", report), "exists")
    assert report.read_text() == "keep me"
    assert not (tmp_path / "store").exists()


def test_a_fifo_as_replay_report_is_refused_and_nothing_written_to_it(tmp_path: Path) -> None:
    fifo = tmp_path / "report.json"
    os.mkfifo(fifo)
    # A reader keeps a write from blocking, so that an unchecked write shows as data.
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        refused(replay_into(tmp_path / "store", fifo), "FIFO")
        # No writer ever came: the pipe holds nothing (end of file).
        assert os.read(reader, 65536) == b""
    finally:
        os.close(reader)
    assert not (tmp_path / "store").exists()


def test_a_replay_report_in_a_missing_directory_is_refused_before_the_replay(
    tmp_path: Path,
) -> None:
    refused(replay_into(tmp_path / "store", tmp_path / "nope" / "r.json"), "does not exist")
    assert not (tmp_path / "store").exists()
    assert not (tmp_path / "nope").exists()


def test_a_replay_report_inside_the_target_store_is_refused(tmp_path: Path) -> None:
    store = tmp_path / "store"
    assert replay_into(store, tmp_path / "first.json").returncode == 0
    before = sorted(p.name for p in store.iterdir())
    refused(replay_into(store, store / "r.json"), "inside")
    assert sorted(p.name for p in store.iterdir()) == before


def test_a_failed_replay_leaves_no_report(tmp_path: Path) -> None:
    store = tmp_path / "store"
    assert replay_into(store, tmp_path / "first.json").returncode == 0
    # The sessions are stored already: the second replay fails.
    done = replay_into(store, tmp_path / "second.json")
    assert done.returncode == 1, done.stderr
    assert "AlreadyExistsError" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["first.json", "store"]


def test_an_interrupted_replay_leaves_no_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import sessionscope.bench.replay as replay_module

    def interrupted(*args: object, **kwargs: object) -> None:
        # The report file exists (as its .partial) while the replay runs.
        assert (tmp_path / "r.json.partial").exists()
        raise KeyboardInterrupt

    monkeypatch.setattr(replay_module, "replay", interrupted)
    code = main(["replay", "sample", "--no-progress", "--store", "memory://",
                 "--json", str(tmp_path / "r.json")])  # fmt: skip
    assert code == 130
    assert "interrupted" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


# -- replay checks the whole trace before the store is opened ------------------------------


def _create(session: str, app: str = "a") -> dict[str, Any]:
    return {"op": "create", "app": app, "user": "u", "session": session, "state": None}


def _append(session: str, event_id: str, text: str = "hi") -> dict[str, Any]:
    event = {"id": event_id, "timestamp": 1.0, "author": "x", "content": {"text": text}}
    return {"op": "append", "app": "a", "user": "u", "session": session, "event": event}


# Each trace is refused at its third record, after records that write.
REFUSED_TRACES = {
    "a create twice": (
        [_create("s1"), _append("s1", "e1"), _create("s1")],
        "record 3: create of a session the trace created already",
    ),
    "an append to a session never created": (
        [_create("s1"), _append("s1", "e1"), _append("nope", "e2")],
        "record 3: append to a session the trace has not created",
    ),
    "one event id with two contents": (
        [_create("s1"), _append("s1", "e1"), _append("s1", "e1", "other")],
        "record 3: append of an event id stored with other content",
    ),
    "the encryption marker's app": (
        [_create("s1"), _append("s1", "e1"), _create("s2", app=ENCRYPTION_MARKER_APP)],
        "reserved for the store's encryption marker",
    ),
}


def _write_trace(path: Path, records: list[dict[str, Any]]) -> Path:
    lines = [{"format": FORMAT, "version": VERSION}, *records]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@pytest.mark.parametrize("case", list(REFUSED_TRACES))
def test_a_trace_replay_refuses_is_refused_before_the_store_is_created(
    tmp_path: Path, case: str
) -> None:
    records, message = REFUSED_TRACES[case]
    trace = _write_trace(tmp_path / "t.jsonl", records)
    store = tmp_path / "store"
    done = run("replay", str(trace), "--no-progress", "--store", f"lmdb://{store}")
    refused(done, message)
    assert not store.exists()


@pytest.mark.parametrize("case", list(REFUSED_TRACES))
def test_a_refused_trace_writes_nothing_through_the_library(case: str) -> None:
    records, message = REFUSED_TRACES[case]
    with pytest.raises(TraceError, match=re.escape(message)):
        check_trace(records)
    target = open_target("memory://")
    try:
        with pytest.raises(TraceError, match=re.escape(message)):
            replay(target, records, progress=False)
        assert target.read("a", "u", "s1") is None
    finally:
        target.close()


def test_a_trace_record_in_the_encryption_marker_s_app_is_refused_naming_it() -> None:
    for op in ("create", "get", "delete", "list"):
        record = {**_create("s"), "op": op, "app": ENCRYPTION_MARKER_APP}
        with pytest.raises(TraceError, match=r"^line 7: .*reserved for the store's encryption"):
            check_record(record, "line 7")


# -- store files that are links: bad input for every command -------------------------------


def _store_with_a_link(tmp_path: Path, name: str) -> tuple[Path, Path]:
    """Return a store whose ``name`` is a link, and the file it points at."""
    store = tmp_path / "store"
    with SyncSessionService(LmdbStore(store)) as svc:
        svc.create_session(app_name="a", user_id="u", session_id="s", state={"k": 1})
    victim = tmp_path / "victim"
    if name == "data.mdb":
        (store / "data.mdb").rename(victim)
    else:
        victim.write_bytes(b"precious")
        (store / "lock.mdb").unlink()
    (store / name).symlink_to(victim)
    return store, victim


def _commands(uri: str, tmp_path: Path, dump: Path) -> list[list[str]]:
    return [
        ["ls", uri],
        ["show", uri, "a", "u", "s"],
        ["tail", uri, "a", "u", "s"],
        ["stats", uri],
        ["export", uri, str(tmp_path / "out.dump")],
        ["backup", uri, str(tmp_path / "copy")],
        ["import", uri, str(dump)],
        ["compact", uri],
        ["upgrade", uri],
    ]


@pytest.mark.parametrize("name", ["data.mdb", "lock.mdb"])
def test_store_files_that_are_links_are_bad_input_for_every_command(
    tmp_path: Path, name: str
) -> None:
    dump = tmp_path / "in.dump"
    with SyncSessionService(LmdbStore(tmp_path / "other")) as svc:
        svc.create_session(app_name="a", user_id="u", session_id="t")
        export_dump(svc.store, dump)
    store, victim = _store_with_a_link(tmp_path, name)
    before = victim.read_bytes()
    for args in _commands(f"lmdb://{store}", tmp_path, dump):
        for json_flag in ([], ["--json"]):
            done = run(*args, *json_flag)
            refused(done, f"{name} is a symbolic link")
            if json_flag:
                assert json.loads(done.stdout)["error"]["type"] == "UsageError"
            assert victim.read_bytes() == before
            assert (store / name).is_symlink()
            assert not (tmp_path / "out.dump").exists() and not (tmp_path / "copy").exists()
    # verify says what it found: a store it cannot open is a problem found (exit 1).
    done = run("verify", f"lmdb://{store}", "--json")
    assert done.returncode == 1, done.stderr
    assert any("is a symbolic link" in p for p in json.loads(done.stdout)["problems"])
    assert victim.read_bytes() == before


# -- a refused import into a new encrypted store removes what it created ---------------------

KEK_HEX = "5e" * 32


def _encrypted(store: Path, keys: Path | None = None) -> str:
    """Return the URI of an encrypted LMDB store (its key store beside it unless ``keys``)."""
    uri = f"lmdb://{store}?key_env=TEST_KEK"
    return uri if keys is None else uri + "&keys=" + quote(f"lmdb://{keys}", safe="")


def run_encrypted(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, extra_env={"PYTHONWARNINGS": "error", "TEST_KEK": KEK_HEX})


@pytest.fixture
def foreign_dump(tmp_path: Path, dump_of_one: Path) -> Path:
    """A dump of an encrypted store whose data keys are in the key store ``keys-a``."""
    source = _encrypted(tmp_path / "source", tmp_path / "keys-a")
    assert run_encrypted("import", source, str(dump_of_one)).returncode == 0
    out = tmp_path / "encrypted.dump"
    done = run_encrypted("export", source, str(out))
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture
def dump_of_one(tmp_path: Path) -> Path:
    with SyncSessionService(LmdbStore(tmp_path / "plain")) as svc:
        session = svc.create_session(app_name="a", user_id="u", session_id="s", state={"k": 1})
        svc.append_event(session, Event(author="x", content={"text": "hi"}))
        export_dump(svc.store, tmp_path / "one.dump")
    return tmp_path / "one.dump"


def test_a_refused_import_into_a_new_encrypted_store_leaves_neither_store(
    tmp_path: Path, foreign_dump: Path
) -> None:
    before = sorted(p.name for p in tmp_path.iterdir())
    for keys in (tmp_path / "keys-b", None):  # named by keys=, or the default beside the store
        done = run_encrypted("import", _encrypted(tmp_path / "new", keys), str(foreign_dump))
        assert done.returncode == 1, done.stderr
        assert "another key store" in done.stderr
        assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_a_refused_import_keeps_the_key_store_it_did_not_create(
    tmp_path: Path, dump_of_one: Path, foreign_dump: Path
) -> None:
    # keys-c holds the data keys of another store: it existed before the import.
    other = _encrypted(tmp_path / "other", tmp_path / "keys-c")
    assert run_encrypted("import", other, str(dump_of_one)).returncode == 0
    kept = (tmp_path / "keys-c" / "data.mdb").read_bytes()
    done = run_encrypted("import", _encrypted(tmp_path / "new", tmp_path / "keys-c"),
                         str(foreign_dump))  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert not (tmp_path / "new").exists()
    assert (tmp_path / "keys-c" / "data.mdb").read_bytes() == kept
    shown = run_encrypted("show", other, "a", "u", "s", "--json")
    assert json.loads(shown.stdout)["state"]["session"] == {"k": 1}


def _interrupt_after_import(
    monkeypatch: pytest.MonkeyPatch, then: Callable[[], None] = lambda: None
) -> None:
    """Make the import command's import_dump import whole, run ``then``, and be interrupted."""
    import sessionscope.admin.dump as dump_module

    real = dump_module.import_dump

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        real(*args, **kwargs)
        then()
        raise KeyboardInterrupt

    monkeypatch.setattr(dump_module, "import_dump", interrupted)


def test_an_interrupted_import_into_a_new_encrypted_store_removes_both_stores(
    tmp_path: Path, dump_of_one: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_KEK", KEK_HEX)
    _interrupt_after_import(monkeypatch)
    before = sorted(p.name for p in tmp_path.iterdir())
    uri = _encrypted(tmp_path / "new", tmp_path / "keys")
    assert main(["import", uri, str(dump_of_one), "--no-progress"]) == 130
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_a_key_store_another_process_wrote_to_after_the_failure_is_kept(
    tmp_path: Path, dump_of_one: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sessionscope.admin.dump as dump_module

    monkeypatch.setenv("TEST_KEK", KEK_HEX)
    keys = tmp_path / "keys"
    real_check = dump_module.holds_only_dump

    def written_meanwhile(*args: Any) -> bool:
        # Another process adds a record to the new key store once the import failed.
        code = (
            "import sys; from sessionscope.crypto.keystore import open_key_store; "
            "k = open_key_store(sys.argv[1]); k.add(b'other', b'record'); k.close()"
        )
        child = subprocess.run(
            [sys.executable, "-c", code, f"lmdb://{keys}"],
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert child.returncode == 0, child.stderr
        return real_check(*args)

    _interrupt_after_import(monkeypatch)
    monkeypatch.setattr(dump_module, "holds_only_dump", written_meanwhile)
    assert main(["import", _encrypted(tmp_path / "new", keys), str(dump_of_one)]) == 130
    # The data store held the dump only and went; the key store another process wrote stays.
    assert not (tmp_path / "new").exists()
    kept = open_key_store(f"lmdb://{keys}", create=False)
    try:
        assert kept.get(b"other") == b"record" and kept.get(b"meta") is not None
    finally:
        kept.close()
