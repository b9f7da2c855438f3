"""A deferred LMDB store left open is synced when the interpreter exits.

A script that appends to a deferred store and ends without ``close()`` used
to exit with no fsync at all, its data waiting for the kernel's write-back.
The child processes here append and end three ways: without close (the exit
handler syncs), with close (close syncs; the handler has nothing left), and
through ``os._exit`` (no exit handler runs: the control, which shows that
nothing else syncs). The system calls are counted with strace; the handler's
own DEBUG record and the events read back are checked without it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from _stores import APP, USER, child_env
from sessionscope import LmdbStore, SyncSessionService
from sessionscope.stores.lmdb import writer as lmdb_writer

EVENTS = 5
SYNCED = "synced the deferred store at"
# The calls that make LMDB's writes durable: fdatasync, or msync through a writable map.
SYNC_CALL = re.compile(r"\b(fsync|fdatasync|msync)\(")

CHILD = f"""
import logging, os, sys
from sessionscope import Event, EventActions, SyncSessionService

logging.basicConfig(level=logging.DEBUG, format="%(name)s %(levelname)s %(message)s")
path, ending = sys.argv[1], sys.argv[2]
# An interval far beyond the run: the syncer thread never syncs by itself.
svc = SyncSessionService(f"lmdb://{{path}}?durability=deferred&flush_interval=3600")
s = svc.get_session(app_name={APP!r}, user_id={USER!r}, session_id="s")
for n in range({EVENTS}):
    svc.append_event(s, Event(author="a", actions=EventActions(state_delta={{"n": n}})))
if ending == "close":
    svc.close()
elif ending == "os._exit":
    sys.stderr.flush()
    os._exit(0)
"""


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    """A store holding one empty session, created durably and closed (on disk)."""
    path = tmp_path / "store"
    with SyncSessionService(LmdbStore(path)) as svc:
        svc.create_session(app_name=APP, user_id=USER, session_id="s")
    return path


def _run_child(path: Path, ending: str, *prefix: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [*prefix, sys.executable, "-c", CHILD, str(path), ending],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done


def _events_stored(path: Path) -> int:
    with SyncSessionService(LmdbStore(path)) as svc:
        got = svc.get_session(app_name=APP, user_id=USER, session_id="s")
        assert got is not None
        assert got.state == {"n": EVENTS - 1}
        return len(got.events)


@pytest.mark.parametrize(
    ("ending", "by_handler", "syncs"),
    [("open", True, True), ("close", False, True), ("os._exit", False, False)],
    ids=["left-open", "closed", "os-exit"],
)
def test_a_deferred_store_left_open_is_synced_at_exit(
    store_path: Path, tmp_path: Path, ending: str, by_handler: bool, syncs: bool
) -> None:
    """Left open, the store is synced at exit; closed, by close; through os._exit, by nobody."""
    if shutil.which("strace") is None:
        pytest.skip("strace is not installed (the next test checks the handler without it)")
    trace = tmp_path / "trace.txt"
    prefix = ("strace", "-f", "-qq", "-e", "trace=fsync,fdatasync,msync", "-e", "signal=none")
    done = _run_child(store_path, ending, *prefix, "-o", str(trace))
    calls = [line for line in trace.read_text().splitlines() if SYNC_CALL.search(line)]
    assert bool(calls) == syncs, calls
    assert (SYNCED in done.stderr) == by_handler, done.stderr
    # Whatever the ending, the page cache holds every event for the next reader.
    assert _events_stored(store_path) == EVENTS


def test_the_exit_handler_syncs_and_says_so(store_path: Path) -> None:
    """Without strace: the handler's DEBUG record names the store, and the events read back."""
    done = _run_child(store_path, "open")
    assert f"{SYNCED} {store_path} at exit" in done.stderr
    assert "failed" not in done.stderr
    assert _events_stored(store_path) == EVENTS


def test_only_open_deferred_stores_are_kept_for_the_exit(tmp_path: Path) -> None:
    """A deferred store is registered while open and dropped at close; a durable one never is."""
    deferred = LmdbStore(tmp_path / "deferred", durability="deferred")
    durable = LmdbStore(tmp_path / "durable")
    try:
        assert deferred._writer in lmdb_writer._deferred_open
        assert durable._writer not in lmdb_writer._deferred_open
    finally:
        deferred.close()
        durable.close()
    assert deferred._writer not in lmdb_writer._deferred_open
    # A closed store left in a handler's way is skipped, not reopened or raised on.
    lmdb_writer._flush_at_exit()
