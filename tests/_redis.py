"""Real Redis servers for the tests: one standalone server and a three-primary cluster.

Each is started once per test session (on first use), on 127.0.0.1 and free
ports, in a temporary directory, and stopped by its pid when the tests end. Tests that need a
server of their own (kill -9, restart, persistence) start one with
``RedisServer`` directly.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

STARTUP_SECONDS = 20.0


def have_redis() -> bool:
    """Tell whether redis-server and redis-cli are installed."""
    return shutil.which("redis-server") is not None and shutil.which("redis-cli") is not None


# Linux's prctl option that sends a child a signal when the thread that
# started it ends.
_PR_SET_PDEATHSIG = 1


def stopping_with_this_run() -> Any:
    """Return a ``preexec_fn`` that has a server killed (SIGKILL) when this run dies.

    A test run killed with SIGKILL skips every teardown, so the servers it
    started would outlive it. On Linux the kernel signals such a child when
    the thread that started it ends: the servers are started from the main
    thread only (a fixture's or a test's), which ends with the run. Elsewhere
    (another system, another thread) it returns None and teardown alone stops
    them.
    """
    if sys.platform != "linux" or threading.current_thread() is not threading.main_thread():
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here, not in the child
    parent = os.getpid()

    def ask_for_the_signal() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the run died before the request was made
            os._exit(1)

    return ask_for_the_signal


class _PortTaken(Exception):
    """A server could not bind its port: something took it after ``free_port``."""


def free_port(bus: bool = False) -> int:
    """Return a loopback port free now (with ``bus``: its cluster bus port too)."""
    for _ in range(100):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
        if not bus:
            return port
        if port + 10000 > 65535:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port pair found")


class RedisServer:
    """One redis-server process in its own directory."""

    def __init__(self, directory: Path, *options: str, cluster: bool = False) -> None:
        self.directory = directory
        self.directory.mkdir(parents=True, exist_ok=True)
        self.options = options
        self.cluster = cluster
        self.port = free_port(bus=cluster)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        """Start the server (again, on the same port and files) and wait until it answers.

        A first start whose port was taken between ``free_port`` and the
        server's bind (another test run on the machine) tries another port;
        a restart keeps its port, which its clients know.
        """
        first = self.proc is None
        for _ in range(5):
            try:
                return self._start_once()
            except _PortTaken:
                if not first:
                    raise
                self.port = free_port(bus=self.cluster)
        raise RuntimeError("redis-server found no free port in five tries")

    def _start_once(self) -> RedisServer:
        args = [
            "redis-server",
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.directory),
            "--save", "",
            "--protected-mode", "no",
            *self.options,
        ]  # fmt: skip
        if self.cluster:
            args += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
        log_path = self.directory / "server.log"
        logged = log_path.stat().st_size if log_path.exists() else 0
        log = open(log_path, "ab")  # noqa: SIM115 - handed to the child
        try:
            self.proc = subprocess.Popen(
                args,
                stdout=log,
                stderr=log,
                cwd=self.directory,
                preexec_fn=stopping_with_this_run(),
            )
        finally:
            log.close()
        deadline = time.monotonic() + STARTUP_SECONDS
        while self.cli("PING", check=False) != "PONG":
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                with open(log_path, "rb") as read:
                    read.seek(logged)
                    log_text = read.read().decode(errors="replace")
                if "Address already in use" in log_text:
                    raise _PortTaken(self.port)
                raise RuntimeError(f"redis-server did not start: {log_text[-2000:]}")
            time.sleep(0.05)
        return self

    def cli(self, *args: str, check: bool = True) -> str:
        """Run redis-cli against this server; return its output, stripped."""
        done = subprocess.run(
            ["redis-cli", "-h", "127.0.0.1", "-p", str(self.port), *args],
            capture_output=True,
            timeout=30,
            check=False,
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"redis-cli {args} failed: {done.stderr.decode()}")
        return done.stdout.decode().strip()

    def kill(self) -> None:
        """Kill the server with SIGKILL (by its pid) and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(timeout=30)

    def pause(self) -> None:
        """Stop the server with SIGSTOP: it keeps its connections but answers nothing."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL) by its pid."""
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGCONT)
        os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)


class RedisCluster:
    """Three primaries joined with ``redis-cli --cluster create``."""

    def __init__(self, directory: Path) -> None:
        self.servers = [RedisServer(directory / f"node{i}", cluster=True) for i in range(3)]

    @property
    def url(self) -> str:
        nodes = ",".join(f"127.0.0.1:{s.port}" for s in self.servers)
        return f"redis+cluster://{nodes}"

    def start(self) -> RedisCluster:
        for server in self.servers:
            server.start()
        done = subprocess.run(
            ["redis-cli", "--cluster", "create",
             *(f"127.0.0.1:{s.port}" for s in self.servers),
             "--cluster-replicas", "0", "--cluster-yes"],
            capture_output=True,
            timeout=60,
            check=False,
        )  # fmt: skip
        if done.returncode != 0:
            self.stop()
            raise RuntimeError(f"cluster create failed: {done.stdout.decode()[-2000:]}")
        deadline = time.monotonic() + STARTUP_SECONDS
        while not all("cluster_state:ok" in s.cli("CLUSTER", "INFO") for s in self.servers):
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the cluster did not reach state ok")
            time.sleep(0.1)
        return self

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


def _require_redis() -> None:
    if not have_redis():
        pytest.fail("redis-server and redis-cli are needed: apt-get install redis-server")


# The session's servers, started on first use and stopped (by pid) when the
# test process exits, so that code outside a fixture (a factory built inside a
# test) reaches the same servers as the fixtures.
_shared: dict[str, Any] = {}


def shared(kind: str) -> Any:
    """Return the session's standalone server ("redis") or cluster ("redis-cluster")."""
    if kind not in _shared:
        _require_redis()
        directory = Path(tempfile.mkdtemp(prefix="sessionscope-redis-"))
        started: Any = (
            RedisServer(directory).start() if kind == "redis" else RedisCluster(directory).start()
        )
        _shared[kind] = started
        atexit.register(_stop, started, directory)
    return _shared[kind]


def _stop(started: Any, directory: Path) -> None:
    started.stop()
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session")
def redis_server() -> RedisServer:
    """Return the session's standalone redis-server."""
    server: RedisServer = shared("redis")
    return server


@pytest.fixture(scope="session")
def redis_cluster() -> RedisCluster:
    """Return the session's three-primary Redis Cluster."""
    cluster: RedisCluster = shared("redis-cluster")
    return cluster
