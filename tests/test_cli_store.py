"""The store commands of ``sessionscope``, each run as a real process against real stores."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

import lmdb
import pytest

from _stores import child_env, snapshot_dir
from sessionscope import Event, EventActions, LmdbStore, SyncSessionService, open_store
from sessionscope.codec import pack, unpack

CHILDREN = Path(__file__).with_name("_cli_children.py")
APPS = ("shop", "support")
USERS = ("user-0", "user-1", "user-2")


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run the command with pipes for stdout and stderr (so no progress is drawn)."""
    return subprocess.run(
        [sys.executable, "-m", "sessionscope", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env={**child_env(), "PYTHONWARNINGS": "error"},
        check=False,
    )


def run_json(*args: str) -> Any:
    done = run(*args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def build(path: Path) -> None:
    """Write two apps of three users with two sessions each: 12 sessions, 42 events."""
    with SyncSessionService(LmdbStore(path)) as svc:
        for app in APPS:
            for user in USERS:
                for k in range(2):
                    state = {"app:plan": "gold", "user:name": user.upper(), "topic": f"t{k}"}
                    session = svc.create_session(
                        app_name=app, user_id=user, session_id=f"s{k}", state=state
                    )
                    for i in range(3 + k):
                        event = Event(
                            author="agent",
                            content={"parts": [{"text": f"hello {i}"}]},
                            actions=EventActions(state_delta={"step": i, "blob": b"\x00\x01"}),
                        )
                        svc.append_event(session, event)


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    path = tmp_path / "store"
    build(path)
    return path


def uri_of(path: Path) -> str:
    return f"lmdb://{path}"


def event_ids(path: Path) -> dict[tuple[str, str, str], list[str]]:
    """Return every session's event ids, read through the service."""
    out = {}
    with SyncSessionService(LmdbStore(path)) as svc:
        for app in svc.store.list_apps():
            for meta in svc.list_sessions(app_name=app).sessions:
                session = svc.get_session(app_name=app, user_id=meta.user_id, session_id=meta.id)
                assert session is not None
                out[(app, meta.user_id, meta.id)] = [e.id for e in session.events]
    return out


class Lines:
    """The lines a process writes, read by a thread, taken with a timeout."""

    def __init__(self, stream: IO[str]) -> None:
        self._queue: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream: IO[str]) -> None:
        for line in stream:
            self._queue.put(line.rstrip("\n"))

    def take(self, timeout: float = 30.0) -> str:
        return self._queue.get(timeout=timeout)


def spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(CHILDREN), *args],
        stdout=subprocess.PIPE,
        text=True,
        env=child_env(),
    )


def stop(process: subprocess.Popen[str]) -> None:
    """Kill a process of this test by its pid if it still runs; close its pipes."""
    if process.poll() is None:
        os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    for stream in (process.stdout, process.stderr):
        if stream is not None:
            stream.close()


# -- help and usage ----------------------------------------------------------------


COMMANDS = (
    "ls", "show", "tail", "stats", "verify", "backup", "compact", "upgrade", "export", "import",
)  # fmt: skip


@pytest.mark.parametrize("command", [*COMMANDS, "migrate"])
def test_every_command_has_help(command: str) -> None:
    done = run(command, "--help")
    assert done.returncode == 0
    assert done.stdout.startswith(f"usage: sessionscope {command}")
    assert "--json" in done.stdout


def test_missing_arguments_are_usage_errors() -> None:
    done = run("show", "lmdb:///x")
    assert done.returncode == 2
    assert "required" in done.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["show", "lmdb:///x", "shop", "user-0"],
        ["show", "lmdb:///x", "shop", "user-0", "s0", "--last", "x"],
        ["ls"],
        ["ls", "memory://", "--bogus"],
        ["migrate", "--to", "memory://"],
        ["backup", "lmdb:///x"],
    ],
)
def test_bad_usage_is_one_line_on_stderr(args: list[str]) -> None:
    done = run(*args)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"sessionscope {args[0]}: error: ")
    assert f"sessionscope {args[0]} --help" in done.stderr


def test_an_app_or_user_filter_no_service_takes_is_a_usage_error(
    store_path: Path, tmp_path: Path
) -> None:
    uri = uri_of(store_path)
    long = "x" * 5000
    for args, name in (
        (["ls", uri, "--app", ""], "app_name"),
        (["ls", uri, "--app", long], "app_name"),
        (["ls", uri, "--app", "shop", "--user", ""], "user_id"),
        (["export", uri, str(tmp_path / "out.dump"), "--app", ""], "app_name"),
        (["export", uri, str(tmp_path / "out.dump"), "--app", long], "app_name"),
        (["export", uri, str(tmp_path / "out.dump"), "--app", "shop", "--user", ""], "user_id"),
        (["migrate", "--from", "sqlite:///x.db", "--to", uri, "--app", ""], "app_name"),
    ):
        done = run(*args)
        assert done.returncode == 2, args
        assert done.stderr.count("\n") == 1 and name in done.stderr
    assert not (tmp_path / "out.dump").exists()


def test_import_of_a_directory_says_it_is_not_a_file(tmp_path: Path) -> None:
    done = run("import", uri_of(tmp_path / "new"), str(tmp_path))
    assert done.returncode == 2
    assert "is not a file" in done.stderr
    assert not (tmp_path / "new").exists()


# -- ls ----------------------------------------------------------------------------


def test_ls_lists_apps_users_and_sessions(store_path: Path) -> None:
    uri = uri_of(store_path)
    apps = run_json("ls", uri)
    assert [(a["app"], a["users"], a["sessions"], a["events"]) for a in apps["apps"]] == [
        ("shop", 3, 6, 21),
        ("support", 3, 6, 21),
    ]
    assert apps["next_cursor"] is None
    users = run_json("ls", uri, "--app", "shop")
    assert [(u["user"], u["sessions"], u["events"]) for u in users["users"]] == [
        (user, 2, 7) for user in USERS
    ]
    sessions = run_json("ls", uri, "--app", "shop", "--user", "user-1")
    rows = {r["session"]: r for r in sessions["sessions"]}
    assert {name: r["events"] for name, r in rows.items()} == {"s0": 3, "s1": 4}
    assert all(r["bytes"] > 0 for r in rows.values())
    assert rows["s1"]["bytes"] > rows["s0"]["bytes"]
    # Least recently active first, as the service lists them.
    assert [r["session"] for r in sessions["sessions"]] == ["s0", "s1"]

    text = run("ls", uri, "--app", "shop", "--user", "user-1")
    assert text.returncode == 0
    header, rule, *lines = text.stdout.splitlines()
    assert header.split() == ["session", "events", "size", "created", "last", "update"]
    assert set(rule.strip()) == {"─"}
    assert [line.split()[:2] for line in lines] == [["s0", "3"], ["s1", "4"]]


def test_ls_pages_with_limit_and_cursor(store_path: Path) -> None:
    uri = uri_of(store_path)
    seen: list[str] = []
    cursor = None
    for _ in range(10):
        extra = ["--cursor", cursor] if cursor else []
        page = run_json("ls", uri, "--app", "support", "--user", "user-2", "--limit", "1", *extra)
        assert len(page["sessions"]) == 1
        seen += [r["session"] for r in page["sessions"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == ["s0", "s1"]
    apps = run("ls", uri, "--limit", "1")
    assert apps.returncode == 0
    assert "more: --cursor shop" in apps.stdout
    rest = run_json("ls", uri, "--limit", "1", "--cursor", "shop")
    assert [a["app"] for a in rest["apps"]] == ["support"]


def test_ls_bad_options_exit_2(store_path: Path) -> None:
    uri = uri_of(store_path)
    for args, message in (
        (["--user", "user-0"], "--user needs --app"),
        (["--app", "shop", "--user", "user-0", "--cursor", "junk"], "cursor"),
        (["--limit", "0"], "not positive"),
    ):
        done = run("ls", uri, *args)
        assert done.returncode == 2, args
        assert message in done.stderr
        assert "Traceback" not in done.stderr


# -- show and tail -----------------------------------------------------------------


def test_show_groups_state_by_scope_and_lists_the_last_events(store_path: Path) -> None:
    uri = uri_of(store_path)
    doc = run_json("show", uri, "shop", "user-2", "s1", "--last", "2")
    assert doc["state"] == {
        "app": {"plan": "gold"},
        "user": {"name": "USER-2"},
        "session": {"topic": "t1", "step": 3, "blob": {"base64": "AAE="}},
    }
    assert doc["events_stored"] == 4
    assert [(e["position"], e["summary"]) for e in doc["events"]] == [
        (2, "hello 2"),
        (3, "hello 3"),
    ]
    assert doc["events"][0]["state_delta"] == ["blob", "step"]

    text = run("show", uri, "shop", "user-2", "s1", "--last", "2").stdout
    app_at, user_at, session_at = (
        text.index("app state (app:)"),
        text.index("user state (user:)"),
        text.index("session state"),
    )
    assert app_at < text.index("plan") < user_at < text.index("USER-2") < session_at
    assert "last 2 of 4 events" in text
    assert text.index("hello 2") < text.index("hello 3")
    assert "hello 1" not in text


def test_show_of_a_missing_session_fails_with_one_line(store_path: Path) -> None:
    done = run("show", uri_of(store_path), "shop", "user-0", "nope")
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1
    assert "no session 'nope'" in done.stderr


def test_show_and_tail_read_ids_as_the_service_does(store_path: Path) -> None:
    uri = uri_of(store_path)
    # Surrounding whitespace of a session id is stripped, as on every service call.
    doc = run_json("show", uri, "shop", "user-2", "  s1 ")
    assert doc["session"] == "s1"
    tail = run("tail", uri, "shop", "user-2", " s1", "--last", "1", "--json")
    assert tail.returncode == 0 and json.loads(tail.stdout)["summary"] == "hello 3"
    # An id no service call takes is bad input, named, not a missing session.
    for args, name in (
        (["", "user-2", "s1"], "app_name"),
        (["shop", "", "s1"], "user_id"),
        (["shop", "user-2", "   "], "session_id"),
        (["shop", "user-2", "x" * 5000], "session_id"),
    ):
        for command in ("show", "tail"):
            done = run(command, uri, *args)
            assert done.returncode == 2, (command, args)
            assert done.stderr.count("\n") == 1 and name in done.stderr
            assert done.stdout == ""


@pytest.mark.parametrize("interval", ["0", "-1", "nan", "inf", "x"])
def test_tail_refuses_a_bad_interval_before_printing(store_path: Path, interval: str) -> None:
    args = ["tail", uri_of(store_path), "shop", "user-0", "s0", "--follow"]
    done = run(*args, "--interval", interval)
    assert done.returncode == 2
    assert "--interval" in done.stderr and "Traceback" not in done.stderr
    assert done.stdout == ""


def test_tail_without_follow_prints_the_last_events(store_path: Path) -> None:
    uri = uri_of(store_path)
    done = run("tail", uri, "support", "user-0", "s1", "--last", "3")
    assert done.returncode == 0
    lines = done.stdout.splitlines()
    assert [line.split("  ")[1:3] for line in lines] == [["#1", "agent"], ["#2", "agent"],
                                                         ["#3", "agent"]]  # fmt: skip
    assert lines[-1].endswith("hello 3  [delta: blob, step]")
    as_json = run("tail", uri, "support", "user-0", "s1", "--last", "2", "--json")
    assert [json.loads(line)["summary"] for line in as_json.stdout.splitlines()] == [
        "hello 2",
        "hello 3",
    ]


# Starts the command line with SIGINT ignored, as a shell does for ``cmd &``
# in a script: the ignored disposition survives exec into the new program.
_WITH_SIGINT_IGNORED = (
    "import os, signal, sys\n"
    "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
    "os.execv(sys.executable, [sys.executable, '-m', 'sessionscope', *sys.argv[1:]])\n"
)


def follow(
    path: Path, user: str, sid: str, interval: str, *, sigint_ignored: bool = False
) -> subprocess.Popen[str]:
    """Start ``tail --follow --json --last 1`` on a session of the shop app."""
    args = ["tail", uri_of(path), "shop", user, sid, "--follow", "--json", "--last", "1"]
    start = ["-c", _WITH_SIGINT_IGNORED] if sigint_ignored else ["-m", "sessionscope"]
    return subprocess.Popen(
        [sys.executable, *start, *args, "--interval", interval],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    )


@pytest.mark.slow
def test_tail_follow_prints_what_another_process_appends(store_path: Path) -> None:
    tail = follow(store_path, "user-0", "s0", "0.05")
    child = None
    try:
        printed = Lines(tail.stdout)  # type: ignore[arg-type]
        assert json.loads(printed.take())["summary"] == "hello 2"
        child = spawn("append", str(store_path), "shop", "user-0", "s0", "5", "0.05")
        said = Lines(child.stdout)  # type: ignore[arg-type]
        assert said.take() == "ready"
        appended = [said.take() for _ in range(5)]
        followed = [json.loads(printed.take()) for _ in range(5)]
        assert [e["id"] for e in followed] == appended
        assert [e["position"] for e in followed] == [3, 4, 5, 6, 7]
        assert [e["summary"] for e in followed] == [f"line {i}" for i in range(5)]
        tail.send_signal(signal.SIGINT)
        assert tail.wait(timeout=30) == 0
        assert "Traceback" not in tail.stderr.read()  # type: ignore[union-attr]
    finally:
        stop(tail)  # type: ignore[arg-type]
        if child is not None:
            stop(child)


@pytest.mark.slow
def test_tail_follow_started_with_sigint_ignored_still_ends_on_sigint(store_path: Path) -> None:
    tail = follow(store_path, "user-0", "s0", "0.05", sigint_ignored=True)
    try:
        printed = Lines(tail.stdout)  # type: ignore[arg-type]
        # The first line comes after the handlers are set: the signal cannot
        # arrive before the command had its chance to take SIGINT back.
        assert json.loads(printed.take())["summary"] == "hello 2"
        tail.send_signal(signal.SIGINT)
        assert tail.wait(timeout=30) == 0
        assert tail.stderr.read() == ""  # type: ignore[union-attr]
    finally:
        stop(tail)  # type: ignore[arg-type]


@pytest.mark.slow
def test_tail_follow_prints_an_event_appended_right_after_a_truncation(store_path: Path) -> None:
    # One poll sees the session truncated and appended to since the last: the
    # new event must still be printed (the count of stored events alone went down).
    tail = follow(store_path, "user-2", "s1", "1")
    try:
        printed = Lines(tail.stdout)  # type: ignore[arg-type]
        assert json.loads(printed.take())["summary"] == "hello 3"
        with SyncSessionService(LmdbStore(store_path)) as svc:
            key = {"app_name": "shop", "user_id": "user-2", "session_id": "s1"}
            assert svc.truncate_events(**key, keep_last=1) == 3
            session = svc.get_session(**key)
            assert session is not None
            appended = svc.append_event(session, Event(author="agent", content="after"))
        followed = json.loads(printed.take(timeout=20))
        assert (followed["id"], followed["summary"], followed["position"]) == (
            appended.id,
            "after",
            1,
        )
        tail.send_signal(signal.SIGTERM)
        assert tail.wait(timeout=30) == 0
    finally:
        stop(tail)  # type: ignore[arg-type]


@pytest.mark.slow
def test_tail_follow_ends_when_the_session_is_deleted(store_path: Path) -> None:
    args = ["tail", uri_of(store_path), "shop", "user-1", "s0", "--follow", "--last", "1"]
    tail = subprocess.Popen(
        [sys.executable, "-m", "sessionscope", *args, "--interval", "0.05"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    try:
        # The last event printed: the command has read the session and polls.
        assert "hello 2" in Lines(tail.stdout).take()  # type: ignore[arg-type]
        with SyncSessionService(LmdbStore(store_path)) as svc:
            svc.delete_session(app_name="shop", user_id="user-1", session_id="s0")
        assert tail.wait(timeout=30) == 1
        assert tail.stderr is not None
        assert tail.stderr.read() == "sessionscope tail: the session was deleted\n"
    finally:
        stop(tail)


# -- stats -------------------------------------------------------------------------


def test_stats_counts_sessions_events_and_bytes(store_path: Path) -> None:
    doc = run_json("stats", uri_of(store_path))
    assert doc["totals"]["sessions"] == 12
    assert doc["totals"]["events"] == 42
    assert doc["totals"]["apps"] == 2
    shop = doc["apps"]["shop"]
    assert (shop["sessions"], shop["events"]) == (6, 21)
    # app:plan = "gold": 4 bytes of key, 5 of packed value.
    assert shop["app_state_bytes"] == len("plan") + len(pack("gold"))
    assert shop["user_state_bytes"] == 3 * (len("name") + len(pack("USER-0")))
    assert shop["event_bytes"] > 21 * len("hello 0")
    space = doc["file"]
    assert space["file_size"] == (store_path / "data.mdb").stat().st_size
    assert space["pages_used"] + space["free_pages"] + 2 == space["pages"]
    text = run("stats", uri_of(store_path)).stdout
    assert "free pages" in text
    total = next(line for line in text.splitlines() if line.startswith(" total"))
    assert total.split()[1:3] == ["12", "42"]


# -- verify ------------------------------------------------------------------------


def test_verify_a_clean_store(store_path: Path) -> None:
    done = run("verify", uri_of(store_path))
    assert done.returncode == 0, done.stdout
    assert "structure  ok" in done.stdout
    assert "12 sessions, 42 events" in done.stdout
    doc = run_json("verify", uri_of(store_path))
    assert doc["clean"] is True
    assert doc["structural"] == "ok"
    assert doc["problems"] == []


def _raw(path: Path) -> lmdb.Environment:
    return lmdb.open(str(path), max_dbs=8)


def _number_of(env: lmdb.Environment, app: str, user: str, sid: str) -> bytes:
    sessions = env.open_db(b"sessions")
    with env.begin() as txn:
        for _, value in txn.cursor(db=sessions):
            fields = unpack(value)
            if fields[:3] == [app, user, sid]:
                return int(fields[3]).to_bytes(8, "big")
    raise AssertionError("no such session")


def test_verify_lists_what_is_wrong(store_path: Path) -> None:
    env = _raw(store_path)
    data = env.open_db(b"data")
    number = _number_of(env, "shop", "user-0", "s0")
    with env.begin(write=True) as txn:
        assert txn.delete(number + b"e" + (1).to_bytes(8, "big"), db=data)
        txn.put((999_999).to_bytes(8, "big") + b"s" + b"\x00\x01k", pack(1), db=data)
    env.close()
    done = run("verify", uri_of(store_path))
    assert done.returncode == 1
    assert "structure  ok" in done.stdout
    out = done.stdout
    assert "session shop/user-0/s0: counts 3 events, stores 2" in out
    assert "session shop/user-0/s0: an id index entry points at no event with that id" in out
    assert "session number 999999: 1 entries without a session record (orphaned)" in out
    doc = json.loads(run("verify", uri_of(store_path), "--json").stdout)
    assert doc["clean"] is False
    assert len(doc["problems"]) >= 3


def test_verify_of_a_damaged_file_reports_it(store_path: Path) -> None:
    data = store_path / "data.mdb"
    size = data.stat().st_size
    with open(data, "r+b") as file:
        # Overwrite every page after the two meta pages.
        file.seek(2 * 4096)
        file.write(b"\xa5" * (size - 2 * 4096))
    done = run("verify", uri_of(store_path))
    assert done.returncode == 1
    assert "FAILED" in done.stdout
    assert "Traceback" not in done.stderr
    listed = run("ls", uri_of(store_path))
    assert listed.returncode != 0
    assert listed.stderr.count("\n") == 1
    assert "Traceback" not in listed.stderr


# -- bad input: nothing created, nothing changed -------------------------------------


def _commands_on(uri: str, tmp_path: Path) -> list[list[str]]:
    return [
        ["ls", uri],
        ["show", uri, "a", "u", "s"],
        ["tail", uri, "a", "u", "s"],
        ["stats", uri],
        ["verify", uri],
        ["backup", uri, str(tmp_path / "copy")],
        ["compact", uri],
        ["export", uri, str(tmp_path / "out.dump")],
    ]


def test_reading_a_missing_store_creates_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    empty = tmp_path / "empty"
    empty.mkdir()
    for path in (missing, empty):
        for args in _commands_on(uri_of(path), tmp_path):
            done = run(*args)
            assert done.returncode == 2, (args, done.stderr)
            assert "no store" in done.stderr
            assert done.stderr.count("\n") == 1
            assert not missing.exists()
            assert list(empty.iterdir()) == []
            assert not (tmp_path / "copy").exists()
            assert not (tmp_path / "out.dump").exists()


def test_an_unknown_scheme_is_a_usage_error(tmp_path: Path) -> None:
    for args in _commands_on("ftp://host/x", tmp_path):
        done = run(*args)
        assert done.returncode == 2, args
        assert "ftp" in done.stderr
        assert "Traceback" not in done.stderr
    done = run("import", "ftp://host/x", str(tmp_path / "in.dump"))
    assert done.returncode == 2


def test_a_store_of_a_newer_format_is_refused_unchanged(store_path: Path, tmp_path: Path) -> None:
    env = _raw(store_path)
    meta = env.open_db(b"meta")
    with env.begin(write=True) as txn:
        txn.put(b"format", bytes([99]) + pack({"magic": "sessionscope", "format": 99}), db=meta)
    env.close()
    before = (store_path / "data.mdb").read_bytes()
    dump = tmp_path / "in.dump"
    other = tmp_path / "other"
    build(other)
    assert run("export", uri_of(other), str(dump)).returncode == 0
    for args in [*_commands_on(uri_of(store_path), tmp_path), ["import", uri_of(store_path),
                                                               str(dump)]]:  # fmt: skip
        done = run(*args)
        # Not damage: every command, verify included, refuses the input.
        assert done.returncode == 2, (args, done.stderr)
        assert "restore" not in done.stdout + done.stderr
        assert "format 99" in done.stdout + done.stderr
        assert "Traceback" not in done.stderr
    assert (store_path / "data.mdb").read_bytes() == before
    assert not (tmp_path / "copy").exists()


# -- backup ------------------------------------------------------------------------


def test_backup_copies_and_verifies(store_path: Path, tmp_path: Path) -> None:
    dest = tmp_path / "backups" / "today"
    dest.parent.mkdir()  # a missing parent is refused (test_cli_files)
    doc = run_json("backup", uri_of(store_path), str(dest))
    assert doc["verified"] is True
    assert (doc["sessions"], doc["events"]) == (12, 42)
    assert doc["uri"] == f"lmdb://{dest.resolve()}"
    assert doc["backup_bytes"] <= doc["source_bytes"]
    assert event_ids(dest) == event_ids(store_path)
    assert (dest / "data.mdb").stat().st_mode & 0o077 == 0
    assert run("verify", uri_of(dest)).returncode == 0
    text = run("backup", uri_of(store_path), str(tmp_path / "again"))
    assert text.returncode == 0
    assert "verified" in text.stdout
    assert "backup size" in text.stdout


def test_the_backup_uri_opens_the_backup_whatever_its_directory_is_called(
    store_path: Path, tmp_path: Path
) -> None:
    # Characters a URI gives a meaning to: space, '#', '?', '%'.
    dest = tmp_path / "backup 1#a?durability=deferred%41"
    doc = run_json("backup", uri_of(store_path), str(dest))
    store = open_store(doc["uri"])
    try:
        assert isinstance(store, LmdbStore) and store.path.resolve() == dest.resolve()
    finally:
        store.close()
    assert run("verify", doc["uri"]).returncode == 0
    assert event_ids(dest) == event_ids(store_path)


def test_backup_refuses_a_non_empty_destination(store_path: Path, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "notes.txt").write_text("keep me")
    before = snapshot_dir(dest)
    done = run("backup", uri_of(store_path), str(dest))
    assert done.returncode == 2
    assert "not empty" in done.stderr
    assert snapshot_dir(dest) == before
    memory = run("backup", "memory://", str(tmp_path / "m"))
    assert memory.returncode == 2
    assert "lmdb://" in memory.stderr


@pytest.mark.slow
def test_backup_while_four_processes_append(tmp_path: Path) -> None:
    source = tmp_path / "live"
    LmdbStore(source).close()
    stop_file = tmp_path / "stop"
    writers = [spawn("writer", str(source), "load", f"w{n}", str(stop_file)) for n in range(4)]
    dest = tmp_path / "backup"
    try:
        for writer in writers:
            assert Lines(writer.stdout).take() == "ready"  # type: ignore[arg-type]
        time.sleep(0.5)
        done = run("backup", uri_of(source), str(dest), "--json")
        stop_file.touch()
        for writer in writers:
            assert writer.wait(timeout=60) == 0
    finally:
        stop_file.touch()
        for writer in writers:
            stop(writer)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["verified"] is True
    assert doc["sessions"] == 12
    assert run("verify", uri_of(dest)).returncode == 0
    copied, live = event_ids(dest), event_ids(source)
    assert set(copied) == set(live)
    assert sum(map(len, copied.values())) == doc["events"] > 0
    for key, ids in copied.items():
        # A snapshot: each session's events in the copy are a prefix of the source's.
        assert live[key][: len(ids)] == ids, key
    assert sum(map(len, live.values())) > doc["events"]


# -- compact -----------------------------------------------------------------------


def test_compact_shrinks_a_store_after_most_sessions_went(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with SyncSessionService(LmdbStore(path)) as svc:
        for n in range(60):
            session = svc.create_session(app_name="app", user_id=f"u{n % 6}", session_id=f"s{n}")
            for i in range(10):
                svc.append_event(session, Event(author="a", content={"text": f"{i}" * 1000}))
        for n in range(54):
            svc.delete_session(app_name="app", user_id=f"u{n % 6}", session_id=f"s{n}")
    kept = event_ids(path)
    assert len(kept) == 6
    assert run_json("stats", uri_of(path))["file"]["free_pages"] > 0
    doc = run_json("compact", uri_of(path))
    assert doc["bytes_after"] < doc["bytes_before"] / 3
    assert doc["bytes_after"] == (path / "data.mdb").stat().st_size
    assert (doc["sessions"], doc["events"]) == (6, 60)
    assert run_json("stats", uri_of(path))["file"]["free_pages"] == 0
    assert event_ids(path) == kept
    assert run("verify", uri_of(path)).returncode == 0
    # Nothing is left beside the store.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store"]
    text = run("compact", uri_of(path))
    assert text.returncode == 0
    assert "size before" in text.stdout
    assert "size after" in text.stdout


@pytest.mark.slow
def test_sole_user_refuses_while_another_process_has_the_store_open(store_path: Path) -> None:
    """The exclusive lock the import, compact and upgrade commands take is maintenance's."""
    from sessionscope.errors import StoreError
    from sessionscope.stores.lmdb.maintenance import sole_user

    holder = spawn("hold", str(store_path))
    try:
        assert Lines(holder.stdout).take() == "ready"  # type: ignore[arg-type]
        before = (store_path / "data.mdb").read_bytes()
        refused = pytest.raises(StoreError, match=rf"open in another process \(pid {holder.pid}\)")
        with refused, sole_user(store_path, "compact"):
            raise AssertionError("the lock was taken while another process holds the store")
        assert (store_path / "data.mdb").read_bytes() == before
    finally:
        stop(holder)
    with sole_user(store_path, "compact"):
        pass
    # Taken alone, the lock leaves the lock table emptied for the next process to build.
    assert (store_path / "lock.mdb").stat().st_size == 0
    store = LmdbStore(store_path)
    store.close()


def _waits_for_a_lock(pid: int) -> bool:
    """Tell whether ``pid`` waits for a file lock (a "->" line of /proc/locks)."""
    lines = Path("/proc/locks").read_text().splitlines()
    return any("->" in line and line.split()[5] == str(pid) for line in lines)


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/locks").exists(), reason="needs Linux's /proc/locks")
def test_a_process_that_waited_for_compact_opens_the_new_store(store_path: Path) -> None:
    """An open that waited while compact held the store alone opens it once it is let go.

    Compact and upgrade empty the lock table before they let go, so that no
    waiting process trusts it; the waiting open then met EINVAL, which the
    store took for a disk failure.
    """
    from sessionscope.stores.lmdb.maintenance import sole_user

    with sole_user(store_path, "compact"):
        child = spawn("open_and_append", str(store_path))
        lines = Lines(child.stdout)  # type: ignore[arg-type]
        assert lines.take() == "opening"
        deadline = time.monotonic() + 30
        while not _waits_for_a_lock(child.pid):
            assert time.monotonic() < deadline and child.poll() is None
            time.sleep(0.01)
    try:
        assert lines.take() == "appended"
        assert child.wait(timeout=60) == 0
    finally:
        stop(child)
    assert event_ids(store_path)[("late", "late", "late")] != []


@pytest.mark.slow
def test_compact_refuses_while_another_process_has_the_store_open(store_path: Path) -> None:
    holder = spawn("hold", str(store_path))
    try:
        assert Lines(holder.stdout).take() == "ready"  # type: ignore[arg-type]
        before = (store_path / "data.mdb").read_bytes()
        done = run("compact", uri_of(store_path))
        assert done.returncode == 1
        assert f"is open in another process (pid {holder.pid})" in done.stderr
        assert done.stderr.count("\n") == 1
        assert (store_path / "data.mdb").read_bytes() == before
        assert sorted(p.name for p in store_path.parent.iterdir()) == ["store"]
    finally:
        stop(holder)
    assert run("compact", uri_of(store_path)).returncode == 0
    assert run("verify", uri_of(store_path)).returncode == 0


# -- export and import -------------------------------------------------------------


@pytest.mark.parametrize("name", ["all.dump", "all.dump.gz"])
def test_export_then_import_round_trips(store_path: Path, tmp_path: Path, name: str) -> None:
    dump = tmp_path / name
    exported = run_json("export", uri_of(store_path), str(dump))
    assert (exported["apps"], exported["users"], exported["sessions"], exported["events"]) == (
        2,
        6,
        12,
        42,
    )
    if name.endswith(".gz"):
        assert dump.read_bytes()[:2] == b"\x1f\x8b"
    copy = tmp_path / "copy"
    imported = run_json("import", uri_of(copy), str(dump))
    assert imported["events"] == 42
    assert event_ids(copy) == event_ids(store_path)
    shown = run_json("show", uri_of(copy), "shop", "user-1", "s1")
    assert shown == {**run_json("show", uri_of(store_path), "shop", "user-1", "s1")}
    again = run("import", uri_of(copy), str(dump))
    assert again.returncode == 0
    assert event_ids(copy) == event_ids(store_path)


def test_export_of_one_user(store_path: Path, tmp_path: Path) -> None:
    dump = tmp_path / "one.dump"
    doc = run_json("export", uri_of(store_path), str(dump), "--app", "shop", "--user", "user-0")
    assert (doc["sessions"], doc["events"]) == (2, 7)
    copy = tmp_path / "copy"
    assert run("import", uri_of(copy), str(dump)).returncode == 0
    assert set(event_ids(copy)) == {("shop", "user-0", "s0"), ("shop", "user-0", "s1")}


def test_an_altered_or_truncated_dump_changes_nothing(store_path: Path, tmp_path: Path) -> None:
    dump = tmp_path / "all.dump"
    assert run("export", uri_of(store_path), str(dump)).returncode == 0
    whole = dump.read_bytes()
    target = tmp_path / "target"
    LmdbStore(target).close()
    before = (target / "data.mdb").read_bytes()
    altered = bytearray(whole)
    altered[len(whole) // 2] ^= 0xFF
    for bad in (whole[: len(whole) // 2], bytes(altered)):
        dump.write_bytes(bad)
        for where in (target, tmp_path / "new"):
            done = run("import", uri_of(where), str(dump))
            assert done.returncode == 1
            assert "DumpError" in done.stderr
            assert "nothing was imported" in done.stderr
            assert done.stderr.count("\n") == 1
        assert (target / "data.mdb").read_bytes() == before
        assert not (tmp_path / "new").exists()
    done = run("import", uri_of(target), str(tmp_path / "absent.dump"))
    assert done.returncode == 2
    assert "does not exist" in done.stderr


@pytest.mark.slow
def test_an_import_killed_midway_completes_when_run_again(tmp_path: Path) -> None:
    source = tmp_path / "source"
    with SyncSessionService(LmdbStore(source, durability="deferred")) as svc:
        for n in range(300):
            session = svc.create_session(app_name="app", user_id=f"u{n % 7}", session_id=f"s{n}")
            for i in range(5):
                svc.append_event(session, Event(author="a", content={"text": f"{n}-{i}"}))
    dump = tmp_path / "all.dump"
    assert run("export", uri_of(source), str(dump)).returncode == 0
    target = tmp_path / "target"
    importing = subprocess.Popen(
        [sys.executable, "-m", "sessionscope", "import", uri_of(target), str(dump)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=child_env(),
    )
    deadline = time.monotonic() + 30
    while not (target / "data.mdb").exists() and importing.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    os.kill(importing.pid, signal.SIGKILL)
    importing.wait(timeout=30)
    # Whatever the kill cut short, each session went in whole or not at all.
    if (target / "data.mdb").exists():
        assert run("verify", uri_of(target)).returncode == 0
    done = run("import", uri_of(target), str(dump))
    assert done.returncode == 0, done.stderr
    assert event_ids(target) == event_ids(source)


# -- progress ----------------------------------------------------------------------


def _on_a_terminal(*args: str) -> str:
    """Run the command with stdout and stderr on a pseudo-terminal; return what it drew."""
    import pty

    master, slave = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "sessionscope", *args],
        stdout=slave,
        stderr=slave,
        env=child_env(),
    )
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the terminal closed: the process is done
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    assert process.wait(timeout=60) == 0
    return b"".join(chunks).decode(errors="replace")


def test_progress_is_drawn_only_on_a_terminal(store_path: Path) -> None:
    bar = "━"
    assert bar in _on_a_terminal("verify", uri_of(store_path))
    assert bar not in _on_a_terminal("verify", uri_of(store_path), "--no-progress")
    piped = run("verify", uri_of(store_path))
    assert bar not in piped.stdout + piped.stderr


# -- migrate -----------------------------------------------------------------------


def _adk_sqlite_store(path: Path) -> None:
    """Write two users' sessions through google-adk's own SqliteSessionService."""
    import asyncio

    from google.adk.events import Event as AdkEvent
    from google.adk.events import EventActions as AdkActions
    from google.genai import types

    from _adk_helpers import sqlite_service

    async def fill() -> None:
        service = sqlite_service(str(path))
        for user in ("ada", "bob"):
            state = {"app:plan": "gold", "user:name": user, "topic": "shoes"}
            session = await service.create_session(app_name="shop", user_id=user, state=state)
            for i in range(3):
                event = AdkEvent(
                    author="user",
                    invocation_id="inv",
                    timestamp=time.time(),
                    content=types.Content(role="user", parts=[types.Part(text=f"hi {i}")]),
                    actions=AdkActions(state_delta={"n": i, "user:seen": i}),
                )
                await service.append_event(session, event)

    asyncio.run(fill())


@pytest.mark.adk
def test_migrate_from_an_adk_sqlite_store(tmp_path: Path) -> None:
    source = tmp_path / "adk.db"
    _adk_sqlite_store(source)
    target = tmp_path / "store"
    # An absolute path: ADK reads sqlite:///x.db as relative, sqlite:////abs/x.db as absolute.
    url = f"sqlite:///{source}"
    doc = run_json("migrate", "--from", url, "--to", uri_of(target))
    assert (doc["sessions"], doc["events"], doc["copied"]) == (2, 6, 2)
    assert doc["differences"] == []
    users = run_json("ls", uri_of(target), "--app", "shop")
    assert [(u["user"], u["sessions"], u["events"]) for u in users["users"]] == [
        ("ada", 1, 3),
        ("bob", 1, 3),
    ]
    again = run("migrate", "--from", url, "--to", uri_of(target))
    assert again.returncode == 0, again.stderr
    assert "no differences" in again.stdout
    assert run_json("migrate", "--from", url, "--to", uri_of(target))["skipped"] == 2
    assert run("verify", uri_of(target)).returncode == 0


@pytest.mark.adk
def test_migrate_from_a_missing_source_creates_nothing(tmp_path: Path) -> None:
    target = tmp_path / "store"
    done = run("migrate", "--from", f"sqlite:///{tmp_path / 'none.db'}", "--to", uri_of(target))
    assert done.returncode == 2
    assert "no existing database file" in done.stderr
    assert done.stderr.count("\n") == 1
    assert not target.exists()
    assert not (tmp_path / "none.db").exists()


def test_no_command_expires_sessions_given_a_uri_with_session_ttl(
    store_path: Path, tmp_path: Path
) -> None:
    """An application's URI, given as it is, expires nothing: commands remove only their own."""
    with SyncSessionService(LmdbStore(store_path)) as svc:
        old = svc.create_session(app_name="shop", user_id="idle", session_id="old")
        svc.append_event(old, Event(author="user", content="long ago", timestamp=1.0))
    before = _listed(store_path)
    assert ("shop", "idle", "old") in before
    ttl = uri_of(store_path) + "?session_ttl=1"
    for args in (
        ["ls", ttl, "--app", "shop", "--user", "idle"],
        ["stats", ttl],
        ["verify", ttl],
        ["show", ttl, "shop", "idle", "old"],
        ["export", ttl, str(tmp_path / "all.dump")],
    ):
        done = run(*args)
        assert done.returncode == 0, (args, done.stderr)
        assert _listed(store_path) == before, args


def _listed(path: Path) -> set[tuple[str, str, str]]:
    with SyncSessionService(LmdbStore(path)) as svc:
        return {
            (app, user, meta.id)
            for app in ("shop",)
            for user in ("idle", "user-0", "user-1", "user-2")
            for meta in svc.list_sessions(app_name=app, user_id=user).sessions
        }
