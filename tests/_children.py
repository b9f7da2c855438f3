"""Worker processes for the multi-process tests: start, talk to, and always reap them.

Children are fresh interpreters (``subprocess`` with ``sys.executable``) running
a worker script: no process ever forks with an open store. Every child is
killed (if still running) and reaped when its ``children`` block ends.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import _stores


class Child:
    """A worker process whose stdout is read line by line, with a timeout."""

    def __init__(
        self, tmp_path: Path, *args: str, stdin: bool = False, script: Path = _stores.WORKERS
    ) -> None:
        self.err_path = tmp_path / f"child-{time.monotonic_ns()}.err"
        self._err: IO[bytes] = open(self.err_path, "wb")  # noqa: SIM115 - closed in reap()
        self.proc = subprocess.Popen(
            [sys.executable, str(script), *args],
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._err,
            env=_stores.child_env(),
        )
        self._buf = b""

    def readline(self, timeout: float = 60.0) -> str | None:
        """Return the next line, or None at end of output; fail after timeout."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"child said nothing for {timeout}s: {self.stderr()}")
            ready, _, _ = select.select([fd], [], [], min(left, 1.0))
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                if self._buf:
                    line, self._buf = self._buf, b""
                    return line.decode()
                return None
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line.decode()

    def expect(self, word: str) -> str:
        """Return the next line, which must start with ``word``."""
        line = self.readline()
        assert line is not None and line.startswith(word), f"{line!r}: {self.stderr()}"
        return line

    def send(self, text: str) -> None:
        """Write a line to the child's stdin (started with ``stdin=True``)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(text.encode() + b"\n")
        self.proc.stdin.flush()

    def stderr(self) -> str:
        """Return the end of what the child wrote to stderr."""
        self._err.flush()
        return self.err_path.read_text(errors="replace")[-4000:]

    def wait_ok(self, timeout: float = 90.0) -> None:
        """Wait for a clean exit."""
        code = self.proc.wait(timeout=timeout)
        assert code == 0, f"child exited with {code}: {self.stderr()}"

    def reap(self) -> None:
        """Kill (if still running) and wait for the child."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()
        self._err.close()


@contextmanager
def children(
    tmp_path: Path,
    *arg_lists: tuple[str, ...],
    stdin: bool = False,
    script: Path = _stores.WORKERS,
) -> Iterator[list[Child]]:
    """Start children of ``script``, and always kill and reap them."""
    started: list[Child] = []
    try:
        for args in arg_lists:
            started.append(Child(tmp_path, *args, stdin=stdin, script=script))
        yield started
    finally:
        for child in started:
            child.reap()


# The switches that pick compiled modules or their twins (see sessionscope.core).
BUILD_SWITCHES = ("SESSIONSCOPE_NO_EXTENSIONS", "SESSIONSCOPE_REQUIRE_EXTENSIONS")


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter with only ``env``'s build switches set."""
    child_env = {k: v for k, v in os.environ.items() if k not in BUILD_SWITCHES}
    child_env.update(env)
    return subprocess.run(
        [sys.executable, "-c", code],
        env=child_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def python_output(code: str, **env: str) -> str:
    """Return what ``code`` prints in a fresh interpreter (see ``run_python``); it must succeed."""
    result = run_python(code, **env)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()
