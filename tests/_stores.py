"""Store fixtures and helpers shared by the service and store test modules.

Test modules import the fixtures they use from here (``tests/conftest.py``
belongs to the core tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

import _redis
import sessionscope
from sessionscope import (
    Event,
    EventActions,
    LmdbStore,
    MemoryStore,
    SessionService,
    SyncSessionService,
)
from sessionscope.errors import StoreClosedError
from sessionscope.stores import open_store

T = TypeVar("T")

STORE_KINDS = ("memory", "lmdb-sync", "lmdb-deferred", "redis", "redis-cluster")
LMDB_KINDS = ("lmdb-sync", "lmdb-deferred")
REDIS_KINDS = ("redis", "redis-cluster")
# Each kind of store opened encrypted (sessionscope.crypto): "<kind>+encrypted".
ENCRYPTED_KINDS = (
    "memory+encrypted",
    "lmdb-sync+encrypted",
    "redis+encrypted",
    "redis-cluster+encrypted",
)
# The key-encryption key the encrypted kinds are opened with (tests only).
TEST_KEK = bytes(range(32))

APP = "app"
USER = "user"


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run one coroutine to completion on a fresh event loop."""
    return asyncio.run(coro)


def _close_quietly(obj: Any) -> None:
    """Close a store that may already have been closed through its service."""
    with contextlib.suppress(StoreClosedError):
        result = obj.close()
        if asyncio.iscoroutine(result):
            run(result)


class StoreFactory:
    """Open stores of one kind at one path, and close them all at teardown."""

    def __init__(self, kind: str, base: Path, server_url: str | None = None) -> None:
        # An encrypted kind opens its plain kind, then wraps it (see ``_encrypted``).
        self.kind, plus, _ = kind.partition("+")
        self.encrypted = bool(plus)
        self.keys = f"lmdb://{base / 'keys'}"
        self.path = base / "store"
        self._opened: list[Any] = []
        # Redis kinds: the server (or cluster) URI, and a prefix of this
        # factory's own so that tests never see each other's keys.
        self.server_url = server_url
        self.prefix = f"t{uuid.uuid4().hex}"

    @property
    def uri(self) -> str:
        """Return the URI of this factory's Redis store."""
        assert self.kind in REDIS_KINDS, "only the Redis kinds have a URI"
        if self.server_url is None:
            self.server_url = str(_redis.shared(self.kind).url)
        return f"{self.server_url}?prefix={self.prefix}"

    @property
    def persistent(self) -> bool:
        """Return whether reopening the path gives back what was written."""
        return self.kind != "memory"

    @property
    def durability(self) -> str:
        """Return the durability mode of the LMDB kinds."""
        return "deferred" if self.kind == "lmdb-deferred" else "sync"

    def __call__(self, **kwargs: Any) -> Any:
        """Open a new store (a fresh one for memory, the same path for LMDB)."""
        if self.kind == "memory":
            store: Any = MemoryStore()
        elif self.kind in REDIS_KINDS:
            store = open_store(self.uri, **self._redis_encryption(), **kwargs)
        else:
            kwargs.setdefault("durability", self.durability)
            store = LmdbStore(self.path, encrypted_ok=self.encrypted, **kwargs)
        store = self._encrypted(store)
        self._opened.append(store)
        return store

    def _redis_encryption(self) -> dict[str, Any]:
        """Return the options that open a Redis store encrypted (none for a plain kind)."""
        if not self.encrypted:
            return {}
        from sessionscope.crypto import Encryption

        return {"encryption": Encryption(keys=self.keys, key=TEST_KEK)}

    def _encrypted(self, store: Any) -> Any:
        """Return the store wrapped in encryption for an encrypted kind, else as it is."""
        if not self.encrypted or self.kind in REDIS_KINDS:
            return store
        from sessionscope.crypto import Encryption, open_encrypted

        keys = f"memory://{self.prefix}" if self.kind == "memory" else self.keys
        return open_encrypted(store, Encryption(keys=keys, key=TEST_KEK), None)

    def fresh(self, name: str, **kwargs: Any) -> Any:
        """Open a new, empty store of the same kind (LMDB: at a sibling path)."""
        if self.kind == "memory":
            return self(**kwargs)
        if self.kind in REDIS_KINDS:
            store = open_store(f"{self.uri}-{name}", **self._redis_encryption(), **kwargs)
            self._opened.append(store)
            return store
        kwargs.setdefault("durability", self.durability)
        path = self.path.with_name(name)
        store = self._encrypted(LmdbStore(path, encrypted_ok=self.encrypted, **kwargs))
        self._opened.append(store)
        return store

    def reopen(self, **kwargs: Any) -> Any:
        """Open the same LMDB path again; only for the persistent kinds."""
        assert self.persistent, "a memory store cannot be reopened"
        return self(**kwargs)

    def close_all(self) -> None:
        """Close every store this factory opened."""
        while self._opened:
            _close_quietly(self._opened.pop())


def reopen_lmdb(path: Path, **kwargs: Any) -> Any:
    """Open an existing LMDB store path again (the caller closes it)."""
    return LmdbStore(path, **kwargs)


def redis_url(request: pytest.FixtureRequest, kind: str) -> str | None:
    """Return the URI of the session's server for a Redis kind (starting it), else None."""
    kind = kind.partition("+")[0]
    if kind == "redis":
        return str(request.getfixturevalue("redis_server").url)
    if kind == "redis-cluster":
        return str(request.getfixturevalue("redis_cluster").url)
    return None


def factory_of_param(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    """Yield a factory of stores of the kind a fixture is parametrized with; close them after."""
    factory = StoreFactory(request.param, tmp_path, redis_url(request, request.param))
    try:
        yield factory
    finally:
        factory.close_all()


@pytest.fixture(params=STORE_KINDS)
def store_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    """Yield a factory of stores of one kind, all closed afterwards."""
    yield from factory_of_param(request, tmp_path)


@pytest.fixture(params=LMDB_KINDS)
def lmdb_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    """Yield a factory of LMDB stores (both durabilities), all closed afterwards."""
    yield from factory_of_param(request, tmp_path)


@pytest.fixture
def svc(store_factory: StoreFactory) -> SyncSessionService:
    """Return a synchronous service over a fresh store."""
    return SyncSessionService(store_factory())


@pytest.fixture
def asvc(store_factory: StoreFactory) -> SessionService:
    """Return an asynchronous service over a fresh store."""
    return SessionService(store_factory())


# Helpers shared by the test modules.

# The child-process commands (tests/_workers.py), run as `python WORKERS cmd ...`.
WORKERS = Path(__file__).with_name("_workers.py")


async def while_the_loop_beats(
    write: Coroutine[Any, Any, Any], release: Callable[[], None], released: Callable[[], bool]
) -> tuple[bool, int]:
    """Await ``write`` while a heartbeat task calls ``release`` at its fifth beat.

    Return whether the holder was released before the write finished, and
    the beats counted: a write that held the loop up until its lock was
    released could not have let the heartbeat reach its fifth beat.
    """
    ticks = 0
    finished = asyncio.Event()

    async def heartbeat() -> None:
        nonlocal ticks
        while not finished.is_set():
            ticks += 1
            if ticks == 5:
                # Only a running loop gets here while the write waits.
                release()
            await asyncio.sleep(0.001)

    beating = asyncio.create_task(heartbeat())
    await asyncio.sleep(0)
    await write
    released_first = released()
    finished.set()
    await beating
    return released_first, ticks


def child_env() -> dict[str, str]:
    """Return the environment of a worker process: this one, finding this package."""
    env = dict(os.environ)
    src = str(Path(sessionscope.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def child_json(*args: str, timeout: float = 120) -> Any:
    """Run ``python ARGS`` in a worker process (see child_env); return what it printed, as JSON.

    The child must succeed: its standard error is the failure message.
    """
    done = subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=child_env(),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def run_cli(
    *args: str, cwd: Path | None = None, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m sessionscope ARGS`` in a child with pipes (so no progress is drawn)."""
    return subprocess.run(
        [sys.executable, "-m", "sessionscope", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env={**child_env(), **(extra_env or {})},
        check=False,
    )


def run_cli_strict(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run the command line as ``run_cli`` does, with every warning an error."""
    return run_cli(*args, cwd=cwd, extra_env={"PYTHONWARNINGS": "error"})


def refused(done: subprocess.CompletedProcess[str], *words: str) -> None:
    """Assert an exit 2 with one line on stderr that says ``words``, and no traceback."""
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert done.stderr.count("\n") == 1, done.stderr
    for word in words:
        assert word in done.stderr, done.stderr


def ev(
    *,
    delta: dict[str, Any] | None = None,
    content: Any = None,
    ts: float | None = None,
    author: str = "agent",
    **fields: Any,
) -> Event:
    """Build an event with an optional state delta and timestamp."""
    if ts is not None:
        fields["timestamp"] = ts
    return Event(
        author=author,
        content=content,
        actions=EventActions(state_delta=dict(delta or {})),
        **fields,
    )


def clone(obj: T) -> T:
    """Return a deep copy (an equal, unshared object)."""
    return copy.deepcopy(obj)


def event_ids(session: Any) -> list[str]:
    """Return the ids of a session's events, in order."""
    return [e.id for e in session.events]


def as_plain(obj: Any) -> Any:
    """Return a dataclass tree as plain dicts, for comparisons and messages."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: as_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, list):
        return [as_plain(x) for x in obj]
    if isinstance(obj, dict):
        return {k: as_plain(v) for k, v in obj.items()}
    return obj


def list_all(list_page: Callable[..., Any], **kwargs: Any) -> list[Any]:
    """Follow next_cursor through every page of a listing (bounded)."""
    out: list[Any] = []
    cursor = None
    for _ in range(10_000):
        page = list_page(cursor=cursor, **kwargs)
        out.extend(page.sessions)
        cursor = page.next_cursor
        if cursor is None:
            return out
    raise AssertionError("listing did not end within 10000 pages")


def snapshot_dir(path: Path) -> dict[str, tuple[str, int, int]]:
    """Return {relative name: (sha256, size, mtime_ns)} of every file under path."""
    out: dict[str, tuple[str, int, int]] = {}
    if path.is_file():
        st = path.stat()
        return {".": (hashlib.sha256(path.read_bytes()).hexdigest(), st.st_size, st.st_mtime_ns)}
    for root, _dirs, files in os.walk(path):
        for name in files:
            p = Path(root) / name
            st = p.stat()
            digest = hashlib.sha256(p.read_bytes()).hexdigest()
            out[str(p.relative_to(path))] = (digest, st.st_size, st.st_mtime_ns)
    return out


def read_store_bytes(path: Path) -> bytes:
    """Return the concatenated bytes of every file of a store directory."""
    return b"".join(p.read_bytes() for p in sorted(path.iterdir()) if p.is_file())


class FailingAfter:
    """A key store that fails after ``count`` swaps of data-key records: a rotation cut short.

    Swaps of the key store's meta record go through: only the records of
    the data keys count.
    """

    def __init__(self, keys: Any, count: int) -> None:
        self._keys = keys
        self.where = keys.where
        self._left = count

    def swap(self, key: bytes, old: bytes, new: bytes) -> bool:
        if key != b"meta":
            if self._left == 0:
                raise OSError("interrupted")
            self._left -= 1
        return bool(self._keys.swap(key, old, new))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._keys, name)
