"""A full disk: a StoreError with a hint, never a crash.

Opening a new store on a full disk needs a file system that is really full:
LMDB maps the lock file it creates, and a write into a page the disk has no
block for kills the process with SIGBUS, which a file size limit never
causes (the limit refuses the file's growth before anything is mapped). So
that test fills a small tmpfs of its own, mounted in a private mount
namespace of a child process: nothing outside that process sees it, and it
goes when the process ends.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from _stores import child_env

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
