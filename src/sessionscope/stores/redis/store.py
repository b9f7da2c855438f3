"""A shared store on Redis 7 or a Redis Cluster, for agents that run on several machines.

Every append is one ``FCALL`` of a server-side function (``functions.lua``)
that checks and writes atomically; reads of the last n events read n. Each
operation is described once, as a *plan*: a generator that yields the
commands of one round trip (several are pipelined) and receives their
replies. The sync face runs plans on ``redis.Redis`` / ``redis.cluster.RedisCluster``,
the async face on their ``redis.asyncio`` twins, so both share key building,
argument packing and reply decoding, as redis-py's own clients share their
command definitions.

The parts: ``keys`` (the key layout below), ``sessions``, ``append`` and
``retention`` (the plans, by concern), ``cluster`` (what differs on a
cluster, chosen once at open), ``runners`` (the sync and async runners, the
failure mapping, the retry), ``client`` (redis-py clients), and this module:
``RedisStore``, whose two faces are derived from one table of operations.

Keys (``P`` the prefix, ``{u}`` a digest of (app, user), ``{a}`` of the app;
the braces are Redis Cluster hash tags, so a session, its events and its
user's state share one slot, and an app's own keys another):

    P:{u}r:<sid>   hash     the session record (app, user, sid, n, c, u, k, l, r, ts, sm)
    P:{u}e:<sid>   hash     seq -> event record
    P:{u}i:<sid>   hash     event id -> seq
    P:{u}t:<sid>   string   event times as 8-byte doubles by position, while in order
                   or zset  seq scored by event timestamp (after a time went back)
    P:{u}s:<sid>   hash     session state: key -> packed value
    P:{u}u         hash     user state
    P:{u}x         zset     the user's session ids scored by last update time
    P:{u}p         hash     app deltas recorded but not yet applied (cluster)
    P:{u}g:<token> hash     chains a batch's calls: how many landed, their replies (60 s)
    P:{a}a         hash     app state
    P:{a}k         zset     app deltas applied, by token (cluster; kept a day)
    P:{a}d         zset     the app's users (a directory for listing)
    P:format       string   the store's format record

On a single server the append function also writes the app map in the same
atomic step. On a cluster the app map lives in another slot: the function
records the app delta in ``P:{u}p`` under a token (session number and event
id), then a second call applies it to the app map once (``P:{a}k`` remembers
applied tokens) and a third clears it. Any later read or append of the same
user finishes a pending delta left behind by a process that died in between
(see ``cluster``).
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Awaitable, Callable, Generator
from typing import Any, TypeVar
from urllib.parse import quote

from ...errors import IncompatibleStoreError, StoreClosedError, StoreNotFoundError
from .. import redact
from ..completion import Completion
from ..expiry import Expirer
from ..protocol import append_joined
from ..records import (
    ENCRYPTION_MARKER_APP,
    AppendBatch,
    BatchResult,
    BatchSlices,
    ListPosition,
    LoadedSession,
    SessionRecord,
    result_of_batch,
)
from ..rules import check_ttl, page_records, refuse_encrypted
from ..uri import check_server_uri
from .append import AppendPlans, BatchRead, batch_plan
from .client import any_key, check_policy, delete_keys, new_client
from .cluster import topology
from .common import FORMAT_VERSION, LIBRARY, Plan, _Settings
from .keys import _Keys
from .retention import RetentionPlans
from .runners import _REDIS_ERRORS, _AsyncRunner, _failure, _SyncRunner

__all__ = ["FORMAT_VERSION", "LIBRARY", "RedisStore"]

T = TypeVar("T")


class _Operations(AppendPlans, RetentionPlans):
    """Each store operation as a plan; shared by the sync and the async face."""


# The store's operations, by the name of their method on both faces: the
# plan that does it (a method of ``_Operations`` taking the same arguments)
# and its kind. A "read" returns its answer; a "write" returns a
# ``Completion`` on the sync face, and on the async face runs as its own task
# at once (an awaitable a cancellation cannot cut short); a "task" is a
# write whose async face starts that task when awaited.
_OPERATIONS: dict[str, tuple[str, str]] = {
    "create_session": ("create", "write"),
    "load_session": ("load", "read"),
    "read_events": ("read_events", "read"),
    "list_sessions": ("list_records", "read"),
    "delete_session": ("delete", "write"),
    "append": ("append", "write"),
    "read_app_state": ("read_app", "read"),
    "read_user_state": ("read_user", "read"),
    "noop": ("noop", "read"),
    "truncate_events": ("truncate", "task"),
    "pop_events": ("pop", "write"),
    "expire_sessions": ("expire", "task"),
    "delete_user": ("delete_user", "task"),
    "delete_app": ("delete_app", "task"),
    "list_apps": ("list_apps", "read"),
    "list_users": ("list_users", "read"),
    "restore_session": ("restore", "task"),
    "write_app_state": ("write_app_state", "task"),
    "write_user_state": ("write_user_state", "task"),
}

# What each operation does, as both faces' docstrings say it.
_DOCS = {
    "create_session": "Store a new session and return it with the shared maps merged in.",
    "load_session": "Read a session with the events the filters select, in append order.",
    "read_events": "Return a session's record and up to ``limit`` events from position ``start``.",
    "list_sessions": "Return the records of an app's (or one user's) sessions.",
    "delete_session": "Remove a session with its state and events; a missing one is a no-op.",
    "append": "Append one event and apply its packed delta, all or nothing, in one FCALL.",
    "read_app_state": "Return the app map, keys without prefix.",
    "read_user_state": "Return the user map, keys without prefix.",
    "noop": "Make one FCALL of a function that does nothing and return.\n\n"
    "Not part of the Store protocol: the floor of a round trip to the server, "
    "which benchmarks set beside an append's cost.",
    "truncate_events": "Remove events with ``timestamp < before``, or all but the last "
    "``keep_last``.",
    "pop_events": "Remove a session's newest ``count`` events in one FCALL; return their records."
    "\n\nWith ``if_last_event_id``, only if the newest stored event has that id (else "
    "StaleSessionError, nothing removed).",
    "expire_sessions": "Delete the sessions whose last update is before ``idle_before``.",
    "delete_user": "Delete every session of a user and the user's state map.",
    "delete_app": "Delete every session, user map and the app map of an app.",
    "list_apps": "Return the apps that have a session, app state or user state, sorted.",
    "list_users": "Return the users of an app that have a session or user state, sorted.",
    "restore_session": "Write a whole session as given; False when an equal one is stored.",
    "write_app_state": "Set keys of the app map, leaving other keys as they are.",
    "write_user_state": "Set keys of a user map, leaving other keys as they are.",
}


def _named(op: Callable[..., Any], name: str, owner: str, plan: str) -> Callable[..., Any]:
    """Give a derived method its name, its docstring and its plan's signature (for help())."""
    op.__name__ = name
    op.__qualname__ = f"{owner}.{name}"
    op.__doc__ = _DOCS[name]
    signature = inspect.signature(getattr(_Operations, plan))
    op.__signature__ = signature.replace(  # type: ignore[attr-defined]
        return_annotation=inspect.Signature.empty
    )
    return op


def _sync_op(name: str) -> Callable[..., Any]:
    """Return the sync face's method ``name``: it runs the operation's plan (see _OPERATIONS)."""
    plan, kind = _OPERATIONS[name]

    if kind == "read":

        def op(self: RedisStore, *args: Any, **kwargs: Any) -> Any:
            return self._run(getattr(self._ops, plan)(*args, **kwargs))

    else:

        def op(self: RedisStore, *args: Any, **kwargs: Any) -> Any:
            return self._write(getattr(self._ops, plan)(*args, **kwargs))

    return _named(op, name, "RedisStore", plan)


def _async_op(name: str) -> Callable[..., Any]:
    """Return the async face's method ``name``, the twin of ``_sync_op``'s."""
    plan, kind = _OPERATIONS[name]

    if kind == "read":

        async def op(self: _AsyncRedisStore, *args: Any, **kwargs: Any) -> Any:
            return await self._run(lambda: getattr(self._store._ops, plan)(*args, **kwargs))

    elif kind == "write":

        def op(self: _AsyncRedisStore, *args: Any, **kwargs: Any) -> Any:  # type: ignore[misc]
            return self._write(lambda: getattr(self._store._ops, plan)(*args, **kwargs))

    else:

        async def op(self: _AsyncRedisStore, *args: Any, **kwargs: Any) -> Any:
            return await self._write(lambda: getattr(self._store._ops, plan)(*args, **kwargs))

    return _named(op, name, "_AsyncRedisStore", plan)


class _Shielded(Awaitable[T]):
    """A write running as its own task: awaiting it again after a cancellation is safe."""

    __slots__ = ("_task",)

    def __init__(self, task: asyncio.Task[T]) -> None:
        self._task = task

    def __await__(self) -> Generator[Any, None, T]:
        return asyncio.shield(self._task).__await__()


async def _close_with_loop(client: Any) -> Any:
    """An async generator the loop finalizes at shutdown: it closes the loop's client."""
    try:
        yield None
    finally:
        await client.aclose()


class _AsyncRedisStore:
    """The async face of a RedisStore: one asyncio client per running event loop."""

    def __init__(self, store: RedisStore) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._runners: dict[asyncio.AbstractEventLoop, tuple[_AsyncRunner, Any]] = {}
        # Per loop whose client is being made: what its other tasks wait for.
        self._making: dict[asyncio.AbstractEventLoop, asyncio.Future[_AsyncRunner | None]] = {}

    async def _runner(self) -> _AsyncRunner:
        self._store._check_open()
        loop = asyncio.get_running_loop()
        # The usual case, without the lock: a dict read is atomic.
        known = self._runners.get(loop)
        if known is not None:
            return known[0]
        while True:
            with self._lock:
                found = self._runners.get(loop)
                # Clients of loops that have closed were closed with them.
                for other in [lp for lp in self._runners if lp.is_closed()]:
                    del self._runners[other]
                for other in [lp for lp in self._making if lp.is_closed()]:
                    del self._making[other]
                making = self._making.get(loop) if found is None else None
                if found is None and making is None:
                    made: asyncio.Future[_AsyncRunner | None] = loop.create_future()
                    self._making[loop] = made
            if found is not None:
                return found[0]
            if making is None:
                return await self._make_runner(loop, made)
            # One task of a loop makes its client (connecting to a cluster's
            # nodes takes round trips); the others of that loop wait for it,
            # rather than each making one to close again.
            runner = await asyncio.shield(making)
            if runner is not None:
                return runner
            # Its maker was cancelled: the next to come makes it.

    async def _make_runner(
        self, loop: asyncio.AbstractEventLoop, made: asyncio.Future[_AsyncRunner | None]
    ) -> _AsyncRunner:
        """Make this loop's client and runner, and hand them to the tasks waiting for them."""
        try:
            client = self._store._new_client(asynchronous=True)
            if self._store.cluster:
                # Its first command would find the nodes: find them here, so that
                # a cluster that is not there is a StoreError like any other.
                try:
                    await client.initialize()
                except (*_REDIS_ERRORS, OSError) as error:
                    await client.aclose()
                    raise _failure(error, self._store.where) from error
            runner = _AsyncRunner(client, self._store.where, self._store.cluster)
            # asyncio.run finalizes live async generators before closing its
            # loop: this one closes the client there, inside the loop.
            guard = _close_with_loop(client)
            await guard.__anext__()
        except Exception as error:
            with self._lock:
                self._making.pop(loop, None)
            made.set_exception(error)
            made.exception()  # retrieved: waiting tasks, if any, raise it
            raise
        except BaseException:
            # Cancelled: a task still waiting makes the client instead.
            with self._lock:
                self._making.pop(loop, None)
            made.set_result(None)
            raise
        with self._lock:
            self._runners[loop] = (runner, guard)
            self._making.pop(loop, None)
        made.set_result(runner)
        return runner

    async def _run(self, make: Callable[[], Plan[T]]) -> T:
        runner = await self._runner()
        return await runner.run(make())

    def _write(self, make: Callable[[], Plan[T]]) -> _Shielded[T]:
        return _Shielded(asyncio.get_running_loop().create_task(self._run(make)))

    # The operations, each derived from its plan (see _OPERATIONS).
    create_session = _async_op("create_session")
    load_session = _async_op("load_session")
    read_events = _async_op("read_events")
    list_sessions = _async_op("list_sessions")
    delete_session = _async_op("delete_session")
    append = _async_op("append")
    read_app_state = _async_op("read_app_state")
    read_user_state = _async_op("read_user_state")
    noop = _async_op("noop")
    truncate_events = _async_op("truncate_events")
    pop_events = _async_op("pop_events")
    expire_sessions = _async_op("expire_sessions")
    delete_user = _async_op("delete_user")
    delete_app = _async_op("delete_app")
    list_apps = _async_op("list_apps")
    list_users = _async_op("list_users")
    restore_session = _async_op("restore_session")
    write_app_state = _async_op("write_app_state")
    write_user_state = _async_op("write_user_state")

    async def list_page(
        self,
        app_name: str,
        user_id: str | None,
        limit: int | None,
        after: ListPosition | None,
    ) -> tuple[list[SessionRecord], bool]:
        """Return one page of sessions; see ``Store.list_page`` (from the listing indexes)."""
        if limit is None:
            return page_records(await self.list_sessions(app_name, user_id), None, after)
        return await self._run(lambda: self._store._ops.page(app_name, user_id, limit, after))

    def append_many(self, batch: AppendBatch) -> Awaitable[BatchResult]:
        """Append a batch; see ``Store.append_many``."""
        return self._write(lambda: batch_plan(batch, self._store._ops))

    async def flush(self) -> None:
        """Return: every acknowledged write is as durable as the server's settings make it."""
        self._store._check_open()

    async def close(self) -> None:
        """Close this loop's client, then the store."""
        loop = asyncio.get_running_loop()
        with self._lock:
            found = self._runners.pop(loop, None)
        if found is not None:
            await found[1].aclose()
        self._store.close()

    def _forget(self) -> None:
        with self._lock:
            self._runners.clear()


class RedisStore:
    """Sessions on a Redis 7 server or cluster, shared by every process that opens it.

    ``url`` is a ``redis://`` or ``rediss://`` URL for one server; ``cluster``
    lists ``(host, port)`` startup nodes of a Redis Cluster instead, and
    ``username`` / ``password`` its credentials (a URL carries its own). Options:
    ``prefix`` keeps stores apart on one server, ``ttl`` (seconds) expires a
    session idle that long, ``wait`` makes every write wait for that many
    replicas, ``timeout`` bounds every network wait. ``create=False`` refuses
    a prefix that holds no store (``StoreNotFoundError``) and writes nothing.

    A server (on a cluster, any primary) whose ``maxmemory-policy`` is not
    ``noeviction`` may drop a session's keys on its own: it is refused with
    ``UnsafeStoreError`` unless ``allow_eviction=True``, which logs a warning.
    A prefix written encrypted is refused (``IncompatibleStoreError``) unless
    ``encrypted_ok=True``, as ``LmdbStore`` says.

    Beside the Store protocol it offers ``append_many_reading`` (a batch
    with reads placed between its events, as replays send it), ``noop`` (a
    round trip's floor) and ``destroy`` (empty the prefix); ``aio`` is the
    async face, with the same operations.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        cluster: list[tuple[str, int]] | None = None,
        prefix: str = "sessionscope",
        ttl: int | None = None,
        wait: int = 0,
        timeout: float = 5.0,
        ssl: bool = False,
        session_ttl: float | None = None,
        username: str | None = None,
        password: str | None = None,
        create: bool = True,
        allow_eviction: bool = False,
        encrypted_ok: bool = False,
    ) -> None:
        session_ttl = check_ttl(session_ttl)
        if (url is None) == (cluster is None):
            raise ValueError("give either url (one server) or cluster (startup nodes)")
        if not isinstance(prefix, str) or not prefix or "{" in prefix or "}" in prefix:
            raise ValueError(f"prefix must be a non-empty str without braces, not {prefix!r}")
        if ttl is not None and (not isinstance(ttl, int) or ttl <= 0):
            raise ValueError(f"ttl must be a positive number of seconds, not {ttl!r}")
        if not isinstance(wait, int) or wait < 0:
            raise ValueError(f"wait must be a number of replicas (>= 0), not {wait!r}")
        if cluster is not None and wait:
            raise ValueError("wait= needs one server: a cluster write goes to several")
        if url is not None:
            check_server_uri(url)
        if url is not None and (username is not None or password is not None):
            raise ValueError("give a server's credentials in its URL: redis://user:password@host")
        if not timeout > 0:
            raise ValueError(f"timeout must be positive, not {timeout!r}")
        self.url = url
        self.nodes = cluster
        self.cluster = cluster is not None
        self.ssl = ssl
        self._allow_eviction = allow_eviction
        # A cluster's credentials, handed to every node (a URL carries a server's).
        self._credentials: dict[str, Any] = (
            {"username": username, "password": password} if cluster else {}
        )
        # Where the store is, as messages and logs show it: without a password.
        self.where = (
            redact(url) if url is not None else ",".join(f"{h}:{p}" for h, p in cluster or [])
        )
        self._settings = _Settings(prefix, ttl or 0, wait, timeout, self.cluster)
        keys = _Keys(prefix)
        self._ops = _Operations(self._settings, keys, topology(self._settings, keys))
        self._closed = False
        self._client = self._new_client(asynchronous=False)
        self._sync = _SyncRunner(self._client, self.where, self.cluster)
        self.aio = _AsyncRedisStore(self)
        try:
            check_policy(self._client, self.cluster, self.where, allow_eviction)
            self.created = False
            try:
                self._sync.run(self._ops.check_format(create=False))
            except StoreNotFoundError:
                if not create:
                    raise
                # A new store: its prefix must hold nothing before it writes there.
                self._refuse_foreign_keys()
                self.created = self._sync.run(self._ops.check_format(create=True))
            if not encrypted_ok:
                refuse_encrypted(self.read_app_state(ENCRYPTION_MARKER_APP), self.where)
        except BaseException:
            self._client.close()
            raise
        # session_ttl expires by last update time (the event timestamps), like
        # the other stores; ttl= is Redis's own expiry, by idle wall-clock time.
        self.session_ttl = session_ttl
        self._expirer = Expirer(self, session_ttl) if session_ttl is not None else None
        if self._expirer is not None:
            self._expirer.start()

    def __repr__(self) -> str:
        return f"RedisStore({self.uri!r})"

    def opened_elsewhere(self) -> bool:
        """Tell whether another client may have this store open: unless this open created it."""
        return not self.created

    @property
    def prefix(self) -> str:
        return self._settings.prefix

    @property
    def uri(self) -> str:
        """Return the URI ``open_store`` takes to open this store again, its password as ``***``.

        (A URI is shown in messages and logs: give the password again to reopen.)
        """
        options = f"prefix={self.prefix}"
        if self._settings.ttl:
            options += f"&ttl={self._settings.ttl}"
        if self._settings.wait:
            options += f"&wait={self._settings.wait}"
        if self._allow_eviction:
            options += "&allow_eviction=true"
        if self.url is not None:
            # The URL keeps redis-py's own settings (TLS) in its query.
            return f"{self.where}{'&' if '?' in self.where else '?'}{options}"
        user = quote(self._credentials.get("username") or "", safe="")
        login = f"{user}:***@" if self._credentials.get("password") else ""
        login = login or (f"{user}@" if user else "")
        return f"redis+cluster://{login}{self.where}?{options}"

    def _new_client(self, asynchronous: bool) -> Any:
        return new_client(
            self.url,
            self.nodes,
            ssl=self.ssl,
            credentials=self._credentials,
            timeout=self._settings.timeout,
            where=self.where,
            asynchronous=asynchronous,
        )

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError("the Redis store is closed", hint="open it again")

    def _run(self, plan: Plan[T]) -> T:
        self._check_open()
        return self._sync.run(plan)

    def _write(self, plan: Plan[T]) -> Completion[T]:
        self._check_open()
        try:
            return Completion.done(self._sync.run(plan))
        except Exception as error:  # handed to the caller
            return Completion.failed(error)

    # -- the Store protocol: each operation derived from its plan (see _OPERATIONS)

    create_session = _sync_op("create_session")
    load_session = _sync_op("load_session")
    read_events = _sync_op("read_events")
    list_sessions = _sync_op("list_sessions")
    delete_session = _sync_op("delete_session")
    append = _sync_op("append")
    read_app_state = _sync_op("read_app_state")
    read_user_state = _sync_op("read_user_state")
    noop = _sync_op("noop")
    truncate_events = _sync_op("truncate_events")
    pop_events = _sync_op("pop_events")
    expire_sessions = _sync_op("expire_sessions")
    delete_user = _sync_op("delete_user")
    delete_app = _sync_op("delete_app")
    list_apps = _sync_op("list_apps")
    list_users = _sync_op("list_users")
    restore_session = _sync_op("restore_session")
    write_app_state = _sync_op("write_app_state")
    write_user_state = _sync_op("write_user_state")

    def list_page(
        self,
        app_name: str,
        user_id: str | None,
        limit: int | None,
        after: ListPosition | None,
    ) -> tuple[list[SessionRecord], bool]:
        """Return one page of sessions; see ``Store.list_page``.

        A page reads the users' listing indexes and the records it returns
        (``_Operations.page``); no limit reads the whole listing.
        """
        if limit is None:
            return page_records(self.list_sessions(app_name, user_id), None, after)
        return self._run(self._ops.page(app_name, user_id, limit, after))

    def append_many(self, batch: AppendBatch) -> Completion[BatchResult]:
        """Append a batch, pipelined; stop at the first refused request."""
        self._check_open()
        try:
            return Completion.done(self._sync.run(batch_plan(batch, self._ops)))
        except Exception as error:  # a network failure stops the batch too
            return Completion.done(result_of_batch(batch, [], error))

    def append_slices(self, slices: BatchSlices) -> Completion[BatchResult]:
        """Append a batch as one batch, in its pipelined round trips (``Store.append_slices``)."""
        return append_joined(self, slices)

    def append_many_reading(
        self, batch: AppendBatch, reads: list[BatchRead]
    ) -> tuple[BatchResult, list[LoadedSession | None]]:
        """Append a batch, as ``append_many``, and answer reads placed between its events.

        Each read ``(position, app, user, session id, num_recent_events,
        after_timestamp)`` is answered as ``load_session`` would answer it
        once the batch's first ``position`` events are stored, and before
        the others are: a replay that reads between appends keeps its
        batches whole. On one server the reads travel inside the batch's
        calls (a cluster takes a step per read). A refused event stops the
        batch as in ``append_many``; the reads placed after it are not
        answered.

        Not part of the Store protocol: a replay (``sessionscope.bench``)
        uses it where the store has it.
        """
        self._check_open()
        try:
            tally, loaded = self._sync.run(self._ops.append_many_reading(batch, reads))
        except Exception as error:  # a network failure stops the batch too
            return result_of_batch(batch, [], error), []
        return tally.result(), loaded

    def _refuse_foreign_keys(self) -> None:
        """Refuse a prefix that holds keys but no store's format record (none was found).

        A new store writes its format record first, so keys under a prefix
        without one are someone else's: writing among them would mix the two,
        and a key of another type under one of the store's names would fail a
        write halfway. One SCAN of the database, only when the store is new.
        """
        keys = self._ops.keys
        if any_key(self._client, self.cluster, keys.base, self.where) is None:
            return
        try:
            # Another process may have made the store meanwhile: its keys are ours.
            if self._client.get(keys.format) is not None:
                return
        except _REDIS_ERRORS as error:
            raise _failure(error, self.where) from error
        raise IncompatibleStoreError(
            f"the prefix {self._settings.prefix!r} at {self.where} holds keys that are not "
            "a sessionscope store",
            hint="pick another prefix= for this store; nothing was written",
        )

    def destroy(self) -> int:
        """Delete every key under this store's prefix (on every node), close it; return how many.

        Not part of the Store protocol: for benchmarks and tests that share a
        server and leave it as they found it. Other stores on the server, under
        other prefixes, are left alone.
        """
        self._check_open()
        try:
            return delete_keys(self._client, self.cluster, self._ops.keys.base, self.where)
        finally:
            self.close()

    def flush(self) -> Completion[None]:
        """Return at once: a write is as durable as the server's appendfsync makes it."""
        self._check_open()
        return Completion.done(None)

    def close(self) -> None:
        """Release the connections; later calls raise StoreClosedError."""
        if self._closed:
            return
        if self._expirer is not None:
            self._expirer.stop()
        self._closed = True
        self.aio._forget()
        self._client.close()
