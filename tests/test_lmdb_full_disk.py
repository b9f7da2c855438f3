"""A full disk or a file size limit: a StoreError with a hint, said once, never a crash.

Opening a new store on a full disk needs a file system that is really full:
LMDB maps the lock file it creates, and a write into a page the disk has no
block for kills the process with SIGBUS, which a file size limit never
causes (the limit refuses the file's growth before anything is mapped). So
that test fills a small tmpfs of its own, mounted in a private mount
namespace of a child process: nothing outside that process sees it, and it
goes when the process ends. A failed write is made with a file size limit
(RLIMIT_FSIZE), which refuses it as a full disk does.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from _stores import APP, USER, child_env, ev, event_ids, run_cli
from sessionscope import LmdbStore, SyncSessionService
from sessionscope.errors import StoreError

# What the child runs on its full tmpfs (given as argv[1]): it prints one JSON
# line per case, and ends with status 0 unless a crash kills it.
_ON_FULL_DISK = textwrap.dedent(
    """
    import json, os, sys
    from sessionscope import LmdbStore, SyncSessionService
    from sessionscope.errors import StoreError

    disk = sys.argv[1]
    filler = os.path.join(disk, "filler")
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"x" * 4096)
    except OSError:
        pass
    os.close(fd)
    # What an open killed while creating the store leaves: a lock file of
    # the size LMDB gives it (256 reader slots), without a block.
    os.mkdir(os.path.join(disk, "left"), 0o700)
    os.close(os.open(os.path.join(disk, "left", "lock.mdb"), os.O_WRONLY | os.O_CREAT, 0o600))
    os.truncate(os.path.join(disk, "left", "lock.mdb"), 192 + 255 * 64)

    def attempt(case, name, durability):
        try:
            store = LmdbStore(os.path.join(disk, name), durability=durability)
        except StoreError as error:
            print(json.dumps({"case": case, "error": type(error).__name__,
                              "hint": error.hint}), flush=True)
            return
        with SyncSessionService(store) as service:
            service.create_session(app_name="a", user_id="u", session_id="s")
        print(json.dumps({"case": case, "opened": True}), flush=True)

    for durability in ("sync", "deferred"):
        attempt(f"new {durability}", durability, durability)
    attempt("left behind", "left", "sync")
    os.remove(filler)
    for durability in ("sync", "deferred"):
        attempt(f"again {durability}", durability, durability)
    attempt("left behind again", "left", "deferred")
    """
)


def _private_mount_command() -> list[str]:
    """Return the command prefix that runs a child in a mount namespace of its own."""
    if os.geteuid() == 0:
        return ["unshare", "--mount", "--propagation", "private"]
    # Without root: a user namespace of its own, where this user maps to root.
    return ["unshare", "--user", "--map-root-user", "--mount", "--propagation", "private"]


def _run_on_full_tmpfs(disk: Path, script: Path) -> subprocess.CompletedProcess[str]:
    """Mount a 1 MiB tmpfs on ``disk`` in a private namespace, run ``script`` there."""
    mount = f"mount -t tmpfs -o size=1m,mode=0700 sessionscope-test {disk}"
    return subprocess.run(
        [
            *_private_mount_command(),
            "sh",
            "-c",
            f'{mount} && exec "$0" "$1" "$2"',
            sys.executable,
            str(script),
            str(disk),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=child_env(),
        check=False,
    )


@pytest.fixture
def private_tmpfs(tmp_path: Path) -> Path:
    """Return a directory where a child can mount a tmpfs of its own; skip where none can."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        pytest.skip("needs unshare(1) and mount(8) to mount a private tmpfs")
    check = subprocess.run(
        [*_private_mount_command(), "mount", "-t", "tmpfs", "-o", "size=1m", "none", str(disk)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if check.returncode != 0:
        pytest.skip(f"this system refuses a private tmpfs mount: {check.stderr.strip()}")
    return disk


def test_opening_a_store_on_a_full_disk_is_an_error_not_a_crash(
    private_tmpfs: Path, tmp_path: Path
) -> None:
    """A new store, and one an earlier crash left half-created: StoreError, then opens later."""
    script = tmp_path / "full_disk.py"
    script.write_text(_ON_FULL_DISK)
    done = _run_on_full_tmpfs(private_tmpfs, script)
    # SIGBUS before the fix: a negative status (or 128 + 7 from a shell).
    assert done.returncode == 0, (done.returncode, done.stderr)
    outcomes = {line["case"]: line for line in map(json.loads, done.stdout.splitlines())}
    for case in ("new sync", "new deferred", "left behind"):
        assert outcomes[case]["error"] == "StoreError", outcomes[case]
        assert "disk is full" in outcomes[case]["hint"], outcomes[case]
    # Once there is room, what the failed opens left behind opens as a store.
    for case in ("again sync", "again deferred", "left behind again"):
        assert outcomes[case] == {"case": case, "opened": True}, done.stdout


@pytest.fixture
def file_size_limit() -> Iterator[Any]:
    """Return a function that limits the size of files this process writes; lifted after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    # Past the limit a write fails with EFBIG; the signal would end the process.
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

    def limit(size: int) -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))

    try:
        yield limit
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


@pytest.mark.parametrize("durability", ["sync", "deferred"])
def test_a_refused_write_is_raised_once_and_logged_below_warning(
    tmp_path: Path,
    durability: str,
    file_size_limit: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The caller hears of a write the disk refused; the library's log only adds detail.

    A sync store's write fails writing its pages; a deferred store's, which
    writes through a map it reserved, fails reserving the larger map.
    """
    path = tmp_path / "store"
    store = LmdbStore(path, durability=durability, map_size=1 << 20)  # type: ignore[arg-type]
    with SyncSessionService(store) as svc:
        session = svc.create_session(app_name=APP, user_id=USER, session_id="s")
        kept = svc.append_event(session, ev(content="small")).id
        caplog.set_level("DEBUG", logger="sessionscope")
        file_size_limit((path / "data.mdb").stat().st_size + (64 << 10))
        with pytest.raises(StoreError) as raised:
            svc.append_event(session, ev(content="x" * (2 << 20)))
        file_size_limit(resource.RLIM_INFINITY)
        assert "file size limits" in (raised.value.hint or "")
        ours = [r for r in caplog.records if r.name.startswith("sessionscope")]
        assert [r for r in ours if r.levelname not in ("DEBUG", "INFO")] == []
        # Said once at DEBUG, for whoever looks into it.
        assert any("failed" in r.getMessage() and r.levelname == "DEBUG" for r in ours), ours
        # The store is as it was, and takes writes again.
        stored = svc.get_session(app_name=APP, user_id=USER, session_id="s")
        assert stored is not None and event_ids(stored) == [kept]
        svc.append_event(stored, ev(content="after"))


def _limit_file_size() -> None:
    """Limit the files a child writes to 1 MiB (run in the child, before it starts)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, hard))


def test_import_refused_by_the_disk_says_so_in_one_line(tmp_path: Path) -> None:
    """``sessionscope import`` into a store the disk refuses: exit non-zero, one line on stderr."""
    source = tmp_path / "source"
    with SyncSessionService(LmdbStore(source)) as svc:
        for n in range(4):
            session = svc.create_session(app_name=APP, user_id=USER, session_id=f"s{n}")
            for _ in range(4):
                svc.append_event(session, ev(content="y" * (200 << 10)))
    dump = tmp_path / "sessions.dump"
    exported = run_cli("export", f"lmdb://{source}", str(dump))
    assert exported.returncode == 0, exported.stderr
    target = tmp_path / "target"
    LmdbStore(target).close()
    done = subprocess.run(
        [sys.executable, "-m", "sessionscope", "import", f"lmdb://{target}", str(dump)],
        capture_output=True,
        text=True,
        timeout=120,
        env=child_env(),
        preexec_fn=_limit_file_size,
        check=False,
    )
    assert done.returncode != 0, done.stdout
    assert done.stderr.count("\n") == 1, done.stderr
    assert "file size limits" in done.stderr, done.stderr
