"""What ``backup``, ``compact`` and ``verify`` leave and say when cut short, raced or refused.

Each command runs as a real process against a real LMDB store; the kill
cases SIGKILL it at a point the test sees on disk (a copy under way, a copy
being checked), with bounded waits.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from _stores import FailingAfter, child_env, run_cli, snapshot_dir
from sessionscope import Event, SyncSessionService, open_store
from sessionscope.admin.ops import VERIFY_HINT, backup, check_store, compact
from sessionscope.crypto import Encryption, Kek, open_key_store
from sessionscope.crypto.keyring import rotate_kek
from sessionscope.errors import StoreError

# Large enough that copying it and checking the copy each take a while
# the test can see on disk (about 60 MB).
SESSIONS = 60
EVENTS = 250
TEXT = "y" * 4000
WAIT_S = 120.0


@pytest.fixture(scope="module")
def big_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("big") / "st"
    with SyncSessionService(f"lmdb://{path}?durability=deferred") as service:
        for number in range(SESSIONS):
            session = service.create_session(app_name="a", user_id="u", session_id=f"s{number}")
            for _ in range(EVENTS):
                service.append_event(
                    session, Event(author="user", content={"parts": [{"text": TEXT}]})
                )
    return path


def _start(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "sessionscope", *args, "--no-progress"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=child_env(),
    )


def _wait_for(child: subprocess.Popen[bytes], seen: Callable[[], bool]) -> None:
    """Wait until ``seen()`` while the child runs; fail if it ends first or takes too long."""
    deadline = time.monotonic() + WAIT_S
    while not seen():
        assert child.poll() is None, "the command ended before the point the test waits for"
        assert time.monotonic() < deadline, "the point the test waits for never came"
        time.sleep(0.0005)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _killed(child: subprocess.Popen[bytes]) -> None:
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=WAIT_S)
    assert child.stderr is not None
    child.stderr.close()


# -- backup --------------------------------------------------------------------------


def _copy_under_way(dest: Path) -> Callable[[], bool]:
    """Seen once a backup's copy has data: in its working file, or under dest itself."""
    names = (dest / "backup.partial" / "data.mdb.partial", dest / "data.mdb")
    return lambda: any(_size(name) > 1 << 20 for name in names)


def _copy_being_checked(dest: Path) -> Callable[[], bool]:
    """Seen once the copy is opened to be verified (its lock file appears beside it)."""
    names = (dest / "backup.partial" / "lock.mdb", dest / "lock.mdb")
    return lambda: any(name.exists() for name in names)


@pytest.mark.parametrize("point", [_copy_under_way, _copy_being_checked], ids=["copy", "check"])
def test_a_backup_killed_before_its_copy_verified_leaves_no_store_under_its_name(
    big_store: Path, tmp_path: Path, point: Callable[[Path], Callable[[], bool]]
) -> None:
    dest = tmp_path / "bk"
    child = _start("backup", f"lmdb://{big_store}", str(dest))
    try:
        _wait_for(child, point(dest))
    finally:
        _killed(child)
    # Nothing there has a store's name: no half copy, no unchecked one.
    assert not (dest / "data.mdb").exists()
    assert sorted(os.listdir(dest)) == ["backup.partial"]
    # A run into it again is refused, naming what is there, and changes nothing.
    before = snapshot_dir(dest)
    again = run_cli("backup", f"lmdb://{big_store}", str(dest))
    assert again.returncode == 2, again.stderr
    assert "not empty" in again.stderr or "backup.partial" in again.stderr
    assert snapshot_dir(dest) == before


def test_a_backup_leaves_the_files_another_run_put_in_its_destination(
    big_store: Path, tmp_path: Path
) -> None:
    dest = tmp_path / "bk"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_bytes(b"not the backup's")
    child = _start("backup", f"lmdb://{big_store}", str(dest))
    try:
        _wait_for(child, _copy_under_way(dest))
        # Another run's files appear in dest while this one copies.
        os.symlink(elsewhere, dest / "lock.mdb")
        planted = True
        try:
            fd = os.open(dest / "data.mdb", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            planted = False  # the copy itself is there under that name
        else:
            os.write(fd, b"the other run's data")
            os.close(fd)
        assert child.wait(timeout=WAIT_S) != 0
        assert child.stderr is not None
        said = child.stderr.read().decode()
        child.stderr.close()
    finally:
        if child.poll() is None:
            _killed(child)
    assert (dest / "lock.mdb").is_symlink(), said
    assert elsewhere.read_bytes() == b"not the backup's"
    assert planted, "the copy was written under the name of a store"
    assert (dest / "data.mdb").read_bytes() == b"the other run's data"
    assert "appeared" in said, said
    # Only the other run's files are left: this run's own are gone.
    assert sorted(os.listdir(dest)) == ["data.mdb", "lock.mdb"]


def test_a_finished_backup_holds_only_the_store(tmp_path: Path) -> None:
    source = tmp_path / "src"
    with SyncSessionService(f"lmdb://{source}") as service:
        service.create_session(app_name="a", user_id="u", session_id="s")
    dest = tmp_path / "bk"
    done = run_cli("backup", f"lmdb://{source}", str(dest))
    assert done.returncode == 0, done.stderr
    assert sorted(os.listdir(dest)) == ["data.mdb"]
    assert run_cli("verify", f"lmdb://{dest}").returncode == 0


def test_backup_copies_the_ciphertext_of_an_encrypted_store_and_refuses_other_kinds(
    tmp_path: Path,
) -> None:
    encryption = Encryption(keys=f"lmdb://{tmp_path / 'keys'}", key=bytes(range(32)))
    source = tmp_path / "src"
    with SyncSessionService(open_store(f"lmdb://{source}", encryption=encryption)) as service:
        session = service.create_session(app_name="a", user_id="u", state={"secret": "s3cr3t"})
        store = service.store
        result = backup(store, tmp_path / "bk")
    assert result["verified"] and result["source"] == str(source)
    copied = (tmp_path / "bk" / "data.mdb").read_bytes()
    assert session.id.encode() in copied and b"s3cr3t" not in copied
    with SyncSessionService(open_store(f"lmdb://{tmp_path / 'bk'}", encryption=encryption)) as back:
        again = back.get_session(app_name="a", user_id="u", session_id=session.id)
    assert again is not None and again.state["secret"] == "s3cr3t"
    # A store that is not LMDB (nor encrypted over LMDB) is refused before dest is touched.
    with SyncSessionService("memory://") as memory, pytest.raises(StoreError, match="LMDB"):
        backup(memory.store, tmp_path / "other")
    assert not (tmp_path / "other").exists()


# -- compact -------------------------------------------------------------------------


def _leftovers(parent: Path) -> list[str]:
    return sorted(name for name in os.listdir(parent) if ".compact" in name)


def test_a_later_compact_removes_what_a_killed_one_left(big_store: Path, tmp_path: Path) -> None:
    store = tmp_path / "st"
    store.mkdir(mode=0o700)
    shutil.copyfile(big_store / "data.mdb", store / "data.mdb")
    os.chmod(store / "data.mdb", 0o600)
    child = _start("compact", f"lmdb://{store}")
    try:
        _wait_for(
            child,
            lambda: any(
                _size(tmp_path / name / "data.mdb") > 1 << 20 for name in _leftovers(tmp_path)
            ),
        )
    finally:
        _killed(child)
    assert _leftovers(tmp_path) == [".st.compact"]
    done = run_cli("compact", f"lmdb://{store}")
    assert done.returncode == 0, done.stderr
    assert _leftovers(tmp_path) == []
    checked = run_cli("verify", f"lmdb://{store}")
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.fixture
def small_store(tmp_path: Path) -> Path:
    path = tmp_path / "st"
    with SyncSessionService(f"lmdb://{path}") as service:
        service.create_session(app_name="a", user_id="u", session_id="s")
    return path


def test_compact_refuses_a_link_at_its_directory_and_follows_none(
    small_store: Path, tmp_path: Path
) -> None:
    target = tmp_path / "kept"
    target.mkdir()
    (target / "data.mdb").write_bytes(b"someone's file")
    os.symlink(target, tmp_path / ".st.compact")
    before = snapshot_dir(small_store)
    with pytest.raises(StoreError, match="not what compact leaves behind"):
        compact(small_store)
    assert (tmp_path / ".st.compact").is_symlink()
    assert (target / "data.mdb").read_bytes() == b"someone's file"
    assert snapshot_dir(small_store) == before


def test_compact_refuses_a_directory_holding_what_it_does_not_write(
    small_store: Path, tmp_path: Path
) -> None:
    found = tmp_path / ".st.compact"
    found.mkdir()
    (found / "data.mdb").write_bytes(b"a copy")
    (found / "notes.txt").write_bytes(b"not compact's")
    before = snapshot_dir(small_store)
    with pytest.raises(StoreError, match="not what compact leaves behind"):
        compact(small_store)
    assert sorted(os.listdir(found)) == ["data.mdb", "notes.txt"]
    assert snapshot_dir(small_store) == before
    # Once it is moved away, compact runs and leaves nothing beside the store.
    shutil.rmtree(found)
    compact(small_store)
    assert _leftovers(tmp_path) == []


# -- verify after an interrupted key rotation ----------------------------------------

OLD = bytes.fromhex("41" * 32)
NEW = bytes.fromhex("b2" * 32)


def test_verify_reports_an_unfinished_rotation_once_with_its_own_hint(tmp_path: Path) -> None:
    keys = f"lmdb://{tmp_path / 'keys'}"
    store_uri = f"lmdb://{tmp_path / 'store'}"
    users = [f"user{number}" for number in range(20)]
    with SyncSessionService(
        open_store(store_uri, encryption=Encryption(keys=keys, key=OLD))
    ) as service:
        for user in users:
            service.create_session(app_name="shop", user_id=user, session_id="s", state={"v": 1})
    opened = open_key_store(keys, create=False)
    try:
        with pytest.raises(OSError, match="interrupted"):
            rotate_kek(FailingAfter(opened, 5), Kek(OLD), Kek(NEW))  # type: ignore[arg-type]
    finally:
        opened.close()

    store = open_store(store_uri, encryption=Encryption(keys=keys, key=NEW), create=False)
    try:
        report = check_store(store)
    finally:
        store.close()
    assert not report.clean
    document = report.to_dict()
    assert len(document["problems"]) == 1, document["problems"]
    assert "until the key rotation is finished" in document["problems"][0]
    assert "rotate-key" in document["hint"]
    assert VERIFY_HINT not in document["hint"]

    key_file = tmp_path / "new.key"
    key_file.write_text(NEW.hex())
    key_file.chmod(0o600)
    done = run_cli("verify", f"{store_uri}?key_file={key_file}&keys={keys}", "--json")
    assert done.returncode == 1, done.stderr
    shown = json.loads(done.stdout)
    assert len(shown["problems"]) == 1 and "rotate-key" in shown["hint"], shown
    assert "restore the store" not in shown["hint"]


# -- a store directory this user may not read ----------------------------------------

# Root reads every directory; without these capabilities it is refused as anyone.
NO_OVERRIDE = [
    "setpriv",
    "--bounding-set=-dac_override,-dac_read_search",
    "--inh-caps=-dac_override,-dac_read_search",
    "--",
]


def _unprivileged() -> list[str]:
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: no way to be refused a directory")
    return NO_OVERRIDE


@pytest.fixture
def unreadable(small_store: Path) -> Iterator[Path]:
    small_store.chmod(0)
    yield small_store
    small_store.chmod(0o700)


def test_an_unreadable_store_directory_is_a_store_error_with_a_hint(unreadable: Path) -> None:
    prefix = _unprivileged()
    script = (
        "import sys\n"
        "from sessionscope import open_store\n"
        "from sessionscope.errors import StoreError\n"
        "for create in (False, True):\n"
        "    try:\n"
        "        open_store(sys.argv[1], create=create)\n"
        "    except StoreError as error:\n"
        "        print(create, type(error).__name__, bool(error.hint))\n"
    )
    uri = f"lmdb://{unreadable}"
    done = subprocess.run(
        [*prefix, sys.executable, "-c", script, uri],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        env=child_env(),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["False StoreError True", "True StoreError True"]
    for command in ("ls", "verify", "stats"):
        shown = subprocess.run(
            [*prefix, sys.executable, "-m", "sessionscope", command, uri],
            capture_output=True,
            text=True,
            timeout=WAIT_S,
            env=child_env(),
            check=False,
        )
        assert shown.returncode != 0
        assert "PermissionError" not in shown.stderr, shown.stderr
        assert "StoreError" in shown.stderr and "hint" in shown.stderr, shown.stderr
