"""A redis-server for the benchmarks: loopback, a free port, no persistence, stopped by pid."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# Linux's prctl option that sends a child a signal when the thread that
# started it ends.
_PR_SET_PDEATHSIG = 1


def _child_setup(cpu: int | None) -> Any:
    """Return the server's ``preexec_fn``: pinned to ``cpu`` if given, killed with this run.

    A benchmark killed with SIGKILL skips its ``finally``; on Linux the kernel
    then kills the server it started from its main thread.
    """
    # The signal comes when the starting thread ends: from the main thread only.
    on_main = threading.current_thread() is threading.main_thread()
    prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" and on_main else None
    parent = os.getpid()

    def setup() -> None:
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != parent:  # the benchmark died before the request was made
                os._exit(1)

    return setup


@contextmanager
def redis_server(directory: Path, cpu: int | None = None) -> Iterator[str]:
    """Run a redis-server on loopback, on a free port, without persistence; yield its URL.

    With ``cpu`` the server runs on that CPU only. It is stopped by its pid
    when the block ends.
    """
    port = free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(directory)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=_child_setup(cpu),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit("redis-server did not start") from None
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
