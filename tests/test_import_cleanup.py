"""A failed ``import`` into a new path removes only what it created, and only if nobody used it.

The import runs as a real process. It is stopped (SIGSTOP) once it has
created the store, a second real process opens that store and appends
durably, then the import is made to fail: interrupted (SIGINT), or meeting
the second process's session where the dump has another. Whatever the
second process acknowledged is still there afterwards.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from _stores import child_env
from sessionscope import Event, LmdbStore, SyncSessionService
from sessionscope.admin.dump import export_dump
from sessionscope.stores.lmdb import path_uri

# The second process: open the store, write a session durably, say so, then
# either keep the store open until told (stdin closes) or close it and exit.
_OTHER = textwrap.dedent(
    """
    import sys
    from sessionscope import Event, LmdbStore, SyncSessionService
    path, sid, keep = sys.argv[1], sys.argv[2], sys.argv[3] == "keep"
    svc = SyncSessionService(LmdbStore(path, durability="sync"))
    session = svc.create_session(app_name="app", user_id="u0", session_id=sid)
    svc.append_event(session, Event(author="other", content={"text": "acknowledged"}))
    print("written", flush=True)
    if keep:
        sys.stdin.read()
    svc.close()
    """
)


@pytest.fixture(scope="module")
def big_dump(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A dump long enough to import that the import is still running when stopped."""
    root = tmp_path_factory.mktemp("dump")
    with SyncSessionService(LmdbStore(root / "source", durability="deferred")) as svc:
        for n in range(4000):
            session = svc.create_session(app_name="app", user_id=f"u{n % 7}", session_id=f"s{n}")
            svc.append_event(session, Event(author="a", content={"text": f"{n}"}))
        # The last session of the dump: the second process writes another one under its id.
        svc.create_session(app_name="app", user_id="u0", session_id="zz-clash", state={"k": 1})
        export_dump(svc.store, root / "big.dump")
    return root / "big.dump"


def _reading(pid: int, dump: Path) -> bool:
    """Tell whether a process has the dump open (Linux: its /proc fd links)."""
    fds = Path(f"/proc/{pid}/fd")
    try:
        return any(os.readlink(fd) == str(dump) for fd in fds.iterdir())
    except OSError:  # an fd closed while listed
        return False


def _writing(target: Path) -> bool:
    """Tell whether a process is inside a write transaction of the store.

    Every writer holds an flock on lock.mdb around its transaction; this
    process never opens the store, so its descriptor holds no LMDB lock.
    """
    fd = os.open(target / "lock.mdb", os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # releases the flock, if taken
    return False


def _interruptible() -> None:
    """Give the child the default SIGINT, whatever this process inherited.

    A shell starts a background job (``pytest &`` from a script) with SIGINT
    ignored, and a child inherits that: the import would never see the
    interrupt these tests send it.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _import_stopped_after_creating(target: Path, dump: Path) -> subprocess.Popen[str]:
    """Start an import; stop it once it has created the store, outside any write of it.

    The import checks the dump before it creates the store, then reads it
    again to import it: the dump open while the store exists is the import
    under way. Stopped inside a write transaction, it would keep the second
    process from writing: then it runs on a moment and is stopped again.
    """
    importing = subprocess.Popen(
        [sys.executable, "-m", "sessionscope", "import", path_uri(target), str(dump)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
        preexec_fn=_interruptible,
    )
    deadline = time.monotonic() + 60
    while True:
        assert importing.poll() is None, importing.communicate()
        assert time.monotonic() < deadline
        if (target / "data.mdb").exists() and _reading(importing.pid, dump):
            os.kill(importing.pid, signal.SIGSTOP)
            if not _writing(target):
                break
            os.kill(importing.pid, signal.SIGCONT)
        time.sleep(0.001)
    # Still importing when stopped: the dump is long enough.
    assert importing.poll() is None
    return importing


def _other_writes(target: Path, sid: str, keep: bool) -> subprocess.Popen[str]:
    other = subprocess.Popen(
        [sys.executable, "-c", _OTHER, str(target), sid, "keep" if keep else "exit"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    assert other.stdout is not None
    assert other.stdout.readline() == "written\n"
    return other


def _other_session_survives(target: Path, sid: str) -> None:
    with SyncSessionService(LmdbStore(target)) as svc:
        got = svc.get_session(app_name="app", user_id="u0", session_id=sid)
        assert got is not None
        assert [e.content for e in got.events] == [{"text": "acknowledged"}]


@pytest.mark.parametrize("keep", [True, False], ids=["still-open", "closed"])
def test_an_interrupted_import_keeps_a_store_another_process_wrote(
    big_dump: Path, tmp_path: Path, keep: bool
) -> None:
    target = tmp_path / "new"
    importing = _import_stopped_after_creating(target, big_dump)
    other = _other_writes(target, "mine", keep)
    if not keep:
        other.communicate("", timeout=60)
        assert other.returncode == 0
    os.kill(importing.pid, signal.SIGINT)
    os.kill(importing.pid, signal.SIGCONT)
    _, err = importing.communicate(timeout=120)
    assert importing.returncode == 130, err
    if keep:
        other.communicate("", timeout=60)
        assert other.returncode == 0
    assert "Traceback" not in err
    _other_session_survives(target, "mine")


@pytest.mark.parametrize("keep", [True, False], ids=["still-open", "closed"])
def test_an_import_refused_by_another_process_session_keeps_it(
    big_dump: Path, tmp_path: Path, keep: bool
) -> None:
    target = tmp_path / "new"
    importing = _import_stopped_after_creating(target, big_dump)
    other = _other_writes(target, "zz-clash", keep)
    if not keep:
        other.communicate("", timeout=60)
        assert other.returncode == 0
    os.kill(importing.pid, signal.SIGCONT)
    _, err = importing.communicate(timeout=120)
    assert importing.returncode == 1, err
    assert "other content" in err and err.count("\n") == 1, err
    if keep:
        other.communicate("", timeout=60)
        assert other.returncode == 0
    _other_session_survives(target, "zz-clash")


def test_an_interrupted_import_nobody_else_used_leaves_no_store(
    big_dump: Path, tmp_path: Path
) -> None:
    target = tmp_path / "new"
    importing = _import_stopped_after_creating(target, big_dump)
    os.kill(importing.pid, signal.SIGINT)
    os.kill(importing.pid, signal.SIGCONT)
    _, err = importing.communicate(timeout=120)
    assert importing.returncode == 130, err
    assert not target.exists()


def test_an_interrupted_import_into_an_empty_directory_keeps_the_directory(
    big_dump: Path, tmp_path: Path
) -> None:
    target = tmp_path / "empty"
    target.mkdir()
    (target / "lock.mdb").touch()  # left by an earlier store: not this command's
    importing = _import_stopped_after_creating(target, big_dump)
    os.kill(importing.pid, signal.SIGINT)
    os.kill(importing.pid, signal.SIGCONT)
    _, err = importing.communicate(timeout=120)
    assert importing.returncode == 130, err
    assert sorted(p.name for p in target.iterdir()) == ["lock.mdb"]
