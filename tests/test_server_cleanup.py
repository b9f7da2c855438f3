"""A test run killed with SIGKILL leaves none of the servers it started running."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _redis import have_redis

pytestmark = [
    pytest.mark.skipif(sys.platform != "linux", reason="the kernel's parent-death signal"),
    pytest.mark.skipif(not have_redis(), reason="redis-server is not installed"),
]

# A stand-in for a test run: it starts a server as the suite's fixtures do,
# says the server's pid, and waits to be killed.
RUN = """
import sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from _redis import RedisServer
server = RedisServer(Path(sys.argv[2])).start()
print(server.proc.pid, flush=True)
time.sleep(120)
"""


def _running(pid: int) -> bool:
    """Tell whether ``pid`` runs (a zombie, dead and not yet reaped, does not)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


def test_a_killed_run_takes_its_redis_server_with_it(tmp_path: Path) -> None:
    run = subprocess.Popen(
        [sys.executable, "-c", RUN, str(Path(__file__).parent), str(tmp_path / "server")],
        stdout=subprocess.PIPE,
        text=True,
    )
    server_pid = None
    try:
        assert run.stdout is not None
        server_pid = int(run.stdout.readline())
        assert _running(server_pid)
        os.kill(run.pid, signal.SIGKILL)  # no teardown runs
        run.wait(timeout=30)
        deadline = time.monotonic() + 10
        while _running(server_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(server_pid), "the server outlived the run that started it"
    finally:
        if run.poll() is None:
            os.kill(run.pid, signal.SIGKILL)
            run.wait(timeout=30)
        if run.stdout is not None:
            run.stdout.close()
        if server_pid is not None and _running(server_pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(server_pid, signal.SIGKILL)
