"""The Redis store's safety: eviction, partial sessions, credentials, failures, reads.

A server that may evict keys is refused at open (or opened with a warning);
a read that finds part of a session gone is a CorruptStoreError; no password
shows in a message, a repr, a log line or the command line's output; every
Redis failure is a StoreError with a hint; a command that reads never
creates a store; a stopped server costs a caller one timeout, not two.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import redis

from _redis import RedisCluster, RedisServer, free_port
from _stores import APP, USER, ev, run_cli
from sessionscope import SessionService, SyncSessionService
from sessionscope.errors import (
    CorruptStoreError,
    IncompatibleStoreError,
    StoreError,
    StoreNotFoundError,
    UnsafeStoreError,
)
from sessionscope.model import GetSessionConfig
from sessionscope.stores import open_store, redact
from sessionscope.stores.redis import RedisStore

# Passwords that must never show: distinctive, so a leak cannot hide in other text.
SECRET = "s3cr3t-Pw-7Qz"
USER_SECRET = "alice-Pw-9Xk"


def protect(server: RedisServer) -> None:
    """Require the default user's password and add user alice (started open: its
    readiness check runs unauthenticated)."""
    server.cli("ACL", "SETUSER", "alice", "on", f">{USER_SECRET}", "~*", "&*", "+@all")
    server.cli("CONFIG", "SET", "masterauth", SECRET)
    server.cli("CONFIG", "SET", "requirepass", SECRET)


def raw(server: RedisServer) -> redis.Redis:
    return redis.Redis(port=server.port, password=SECRET)


@pytest.fixture
def locked(tmp_path: Path) -> Iterator[RedisServer]:
    """A server of this test's own that requires a password."""
    server = RedisServer(tmp_path / "locked").start()
    try:
        protect(server)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def locked_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    """A three-primary cluster of this module's own whose nodes require a password."""
    cluster = RedisCluster(tmp_path_factory.mktemp("locked-cluster")).start()
    try:
        for server in cluster.servers:
            protect(server)
        yield cluster
    finally:
        cluster.stop()


def cluster_uri(cluster: RedisCluster, login: str = "") -> str:
    nodes = ",".join(f"127.0.0.1:{s.port}" for s in cluster.servers)
    return f"redis+cluster://{login}{nodes}?prefix=r{uuid.uuid4().hex}"


def evicting(tmp_path: Path, *options: str) -> RedisServer:
    return RedisServer(tmp_path / "lru", "--maxmemory-policy", "allkeys-lru", *options).start()


# -- eviction -------------------------------------------------------------------


def test_a_server_that_may_evict_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    server = evicting(tmp_path)
    try:
        with pytest.raises(UnsafeStoreError, match="allkeys-lru") as caught:
            open_store(f"{server.url}?prefix=p")
        assert "allow_eviction=true" in str(caught.value)
        assert server.cli("DBSIZE") == "0"
        with pytest.raises(UnsafeStoreError), SyncSessionService(f"{server.url}?prefix=p"):
            pass
        assert server.cli("DBSIZE") == "0"
        # Every policy but noeviction may drop a session's keys.
        server.cli("CONFIG", "SET", "maxmemory-policy", "volatile-lru")
        with pytest.raises(UnsafeStoreError, match="volatile-lru"):
            open_store(f"{server.url}?prefix=p")
        server.cli("CONFIG", "SET", "maxmemory-policy", "noeviction")
        open_store(f"{server.url}?prefix=p").close()
    finally:
        server.stop()


def test_eviction_allowed_opens_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = evicting(tmp_path)
    try:
        caplog.set_level(logging.WARNING, logger="sessionscope.stores.redis.client")
        for sid, uri, options in (
            ("a", f"{server.url}?prefix=p&allow_eviction=true", {}),
            ("b", f"{server.url}?prefix=p", {"allow_eviction": True}),
        ):
            caplog.clear()
            with SyncSessionService(open_store(uri, **options)) as svc:
                svc.create_session(app_name=APP, user_id=USER, session_id=sid)
                assert "allow_eviction=true" in svc.store.uri
            warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
            assert len(warnings) == 1
            assert "allkeys-lru" in warnings[0].getMessage()
    finally:
        server.stop()


def test_the_policy_is_read_from_info_when_config_is_refused(tmp_path: Path) -> None:
    """An ACL that denies CONFIG (or a renamed CONFIG) does not hide the policy."""
    server = evicting(tmp_path, "--rename-command", "CONFIG", "")
    try:
        with pytest.raises(UnsafeStoreError, match="allkeys-lru"):
            open_store(f"{server.url}?prefix=p")
    finally:
        server.stop()
    protected = RedisServer(tmp_path / "acl").start()
    try:
        protect(protected)
        raw(protected).config_set("maxmemory-policy", "allkeys-random")
        raw(protected).acl_setuser(
            "bob", enabled=True, passwords=[f"+{USER_SECRET}"], keys=["*"],
            channels=["*"], commands=["+@all", "-config"],
        )  # fmt: skip
        uri = f"redis://bob:{USER_SECRET}@127.0.0.1:{protected.port}/0?prefix=p"
        with pytest.raises(UnsafeStoreError, match="allkeys-random"):
            open_store(uri)
        # A user that may read neither is refused: the policy is unknown.
        raw(protected).config_set("maxmemory-policy", "noeviction")
        raw(protected).acl_setuser(
            "carol", enabled=True, passwords=[f"+{USER_SECRET}"], keys=["*"],
            channels=["*"], commands=["+@all", "-config", "-info"],
        )  # fmt: skip
        with pytest.raises(UnsafeStoreError, match="unknown maxmemory-policy"):
            open_store(uri.replace("bob", "carol"))
        assert raw(protected).dbsize() == 0
        open_store(uri).close()
        assert raw(protected).dbsize() == 1  # the format record of the open allowed
    finally:
        protected.stop()


def test_a_cluster_with_one_evicting_primary_is_refused(locked_cluster: RedisCluster) -> None:
    node = locked_cluster.servers[1]
    uri = cluster_uri(locked_cluster, f"alice:{USER_SECRET}@")
    raw(node).config_set("maxmemory-policy", "allkeys-lfu")
    try:
        with pytest.raises(UnsafeStoreError, match=f"127.0.0.1:{node.port} has maxmemory-policy"):
            open_store(uri)
        open_store(uri, allow_eviction=True).close()
    finally:
        raw(node).config_set("maxmemory-policy", "noeviction")
    open_store(uri).close()


# -- partial sessions -----------------------------------------------------------


def _session_with_events(uri: str) -> SyncSessionService:
    svc = SyncSessionService(uri)
    s = svc.create_session(app_name=APP, user_id=USER, session_id="s", state={"k": 1})
    for n in range(3):
        svc.append_event(s, ev(delta={"k": n}))
    return svc


def _keys(client: Any, prefix: str, part: bytes) -> list[bytes]:
    """Return the session "s" keys of one kind (r:, e:, t:, s:) under a prefix."""
    if isinstance(client, redis.cluster.RedisCluster):
        found = []
        for node in client.get_primaries():
            found += list(client.scan_iter(match=f"{prefix}:*", count=1000, target_nodes=node))
    else:
        found = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    return [k for k in found if k.endswith(b"}" + part + b"s")]


def _raw_client(kind: str, server: Any) -> Any:
    if kind == "cluster":
        nodes = [redis.cluster.ClusterNode("127.0.0.1", s.port) for s in server.servers]
        return redis.cluster.RedisCluster(startup_nodes=nodes)
    return redis.Redis(port=server.port)


@pytest.fixture(params=["redis", "cluster"])
def shared_server(request: pytest.FixtureRequest) -> tuple[str, Any]:
    name = "redis_server" if request.param == "redis" else "redis_cluster"
    return request.param, request.getfixturevalue(name)


def _get(svc: SyncSessionService, **config: Any) -> Any:
    return svc.get_session(
        app_name=APP, user_id=USER, session_id="s", config=GetSessionConfig(**config)
    )


def _aget(svc: SyncSessionService, **config: Any) -> Any:
    async def read() -> Any:
        return await SessionService(svc.store).get_session(
            app_name=APP, user_id=USER, session_id="s", config=GetSessionConfig(**config)
        )

    return asyncio.run(read())


def test_a_read_missing_an_event_is_corrupt_not_partial(shared_server: tuple[str, Any]) -> None:
    kind, server = shared_server
    prefix = f"r{uuid.uuid4().hex}"
    svc = _session_with_events(f"{server.url}?prefix={prefix}")
    client = _raw_client(kind, server)
    try:
        assert len(_get(svc).events) == 3
        (events,) = _keys(client, prefix, b"e:")
        client.hdel(events, "1")
        for read in (_get, _aget):
            with pytest.raises(
                CorruptStoreError, match="is missing 1 of the 3 event records read"
            ) as caught:
                read(svc)
            assert "session 's'" in str(caught.value) and "noeviction" in str(caught.value)
            # The last event alone is still whole.
            assert len(read(svc, num_recent_events=1).events) == 1
    finally:
        svc.close()
        client.close()


def test_a_read_missing_the_record_or_the_times_is_corrupt(
    shared_server: tuple[str, Any],
) -> None:
    kind, server = shared_server
    prefix = f"r{uuid.uuid4().hex}"
    svc = _session_with_events(f"{server.url}?prefix={prefix}")
    client = _raw_client(kind, server)
    try:
        (times,) = _keys(client, prefix, b"t:")
        client.delete(times)
        for read in (_get, _aget):
            with pytest.raises(CorruptStoreError, match="is missing its event times"):
                read(svc, after_timestamp=0.0)
        (record,) = _keys(client, prefix, b"r:")
        client.delete(record)
        for read in (_get, _aget):
            with pytest.raises(CorruptStoreError, match="is missing its record"):
                read(svc)
        # A session deleted whole is simply gone.
        svc.delete_session(app_name=APP, user_id=USER, session_id="s")
        assert _get(svc) is None and _aget(svc) is None
    finally:
        svc.close()
        client.close()


@pytest.mark.parametrize(
    ("field", "value"),
    [("c", b"1795830359/6948657"), ("u", b"soon"), ("sid", b"\xff\xfe")],
    ids=["create-time", "update-time", "session-id"],
)
def test_a_damaged_field_of_the_record_is_corrupt_naming_the_session(
    shared_server: tuple[str, Any], field: str, value: bytes
) -> None:
    kind, server = shared_server
    prefix = f"r{uuid.uuid4().hex}"
    svc = _session_with_events(f"{server.url}?prefix={prefix}")
    client = _raw_client(kind, server)
    try:
        (record,) = _keys(client, prefix, b"r:")
        client.hset(record, field, value)
        for read in (_get, _aget):
            with pytest.raises(CorruptStoreError, match=r"the record of session .* is unreadable"):
                read(svc)
        with pytest.raises(CorruptStoreError):
            svc.list_sessions(app_name=APP, user_id=USER)
    finally:
        svc.close()
        client.close()


def test_a_read_missing_the_state_its_record_names_is_corrupt(
    shared_server: tuple[str, Any],
) -> None:
    kind, server = shared_server
    prefix = f"r{uuid.uuid4().hex}"
    svc = _session_with_events(f"{server.url}?prefix={prefix}")
    client = _raw_client(kind, server)
    try:
        svc.create_session(app_name=APP, user_id=USER, session_id="bare")
        (state,) = _keys(client, prefix, b"s:")
        client.delete(state)
        for read in (_get, _aget):
            with pytest.raises(CorruptStoreError, match="is missing its state"):
                read(svc)
        # A session created without state names none.
        got = svc.get_session(app_name=APP, user_id=USER, session_id="bare")
        assert got is not None and got.state == {}
    finally:
        svc.close()
        client.close()


@pytest.mark.parametrize("how", ["append", "append_many"])
def test_a_read_missing_the_state_an_append_gave_is_corrupt(
    shared_server: tuple[str, Any], how: str
) -> None:
    """A session created bare and given its state by appends names that state map too."""
    kind, server = shared_server
    prefix = f"r{uuid.uuid4().hex}"
    svc = SyncSessionService(f"{server.url}?prefix={prefix}")
    client = _raw_client(kind, server)
    try:
        s = svc.create_session(app_name=APP, user_id=USER, session_id="s")
        events = [ev(delta={"k": n}) for n in range(3)]
        if how == "append":
            for event in events:
                svc.append_event(s, event)
        else:
            svc.append_many([(s, event) for event in events])
        assert _get(svc).state == {"k": 2}
        (state,) = _keys(client, prefix, b"s:")
        client.delete(state)
        for read in (_get, _aget):
            with pytest.raises(CorruptStoreError, match="is missing its state"):
                read(svc)
    finally:
        svc.close()
        client.close()


# -- credentials ----------------------------------------------------------------


def _no_secret(*texts: str) -> None:
    for text in texts:
        assert SECRET not in text and USER_SECRET not in text, text


def test_redact_hides_every_password() -> None:
    assert redact(f"redis://alice:{SECRET}@h:1/0?prefix=p") == "redis://alice:***@h:1/0?prefix=p"
    assert redact(f"x rediss://:{SECRET}@h:1 y") == "x rediss://:***@h:1 y"
    assert redact(f"redis+cluster://a:{SECRET}@h:1,h:2?x") == "redis+cluster://a:***@h:1,h:2?x"
    assert redact(f"redis://{SECRET}@h:1") == "redis://***@h:1"
    assert redact("redis://h:1/0 lmdb:///a@b") == "redis://h:1/0 lmdb:///a@b"
    _no_secret(redact(f"redis://a:p@{SECRET}@h:1"))


def test_no_password_in_a_standalone_stores_repr_messages_logs_or_command_line(
    locked: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    port = locked.port
    for sid, login in (("a", f":{SECRET}@"), ("b", f"alice:{USER_SECRET}@")):
        uri = f"redis://{login}127.0.0.1:{port}/0?prefix=p"
        with SyncSessionService(uri) as svc:
            svc.create_session(app_name=APP, user_id=USER, session_id=sid)
            _no_secret(repr(svc.store), svc.store.uri, repr(svc), repr(SessionService(svc.store)))
            assert "***@" in svc.store.uri
    # Refused passwords, an evicting server, a server that is gone.
    with pytest.raises(StoreError) as wrong:
        open_store(f"redis://alice:{SECRET}x@127.0.0.1:{port}/0")
    raw(locked).config_set("maxmemory-policy", "allkeys-lru")
    with pytest.raises(UnsafeStoreError) as unsafe:
        open_store(f"redis://alice:{USER_SECRET}@127.0.0.1:{port}/0?prefix=p")
    open_store(f"redis://alice:{USER_SECRET}@127.0.0.1:{port}/0?allow_eviction=1").close()
    gone = free_port()
    with pytest.raises(StoreError) as down:
        open_store(f"redis://alice:{USER_SECRET}@127.0.0.1:{gone}/0")
    errors = [wrong.value, unsafe.value, down.value]
    _no_secret(*(str(e) for e in errors), *(str(e.hint) for e in errors))
    _no_secret(*(r.getMessage() for r in caplog.records), caplog.text)
    assert any("allkeys-lru" in r.getMessage() for r in caplog.records)
    # The command line: a refused open, a missing store, a server that is gone.
    for uri in (
        f"redis://alice:{USER_SECRET}@127.0.0.1:{port}/0?prefix=p",
        f"redis://alice:{USER_SECRET}@127.0.0.1:{port}/0?prefix=p&allow_eviction=true&x=1",
        f"redis://alice:{USER_SECRET}@127.0.0.1:{port}/0?prefix=nothing&allow_eviction=true",
        f"redis://alice:{USER_SECRET}@127.0.0.1:{gone}/0",
        f"redis+cluster://alice:{USER_SECRET}@127.0.0.1:{gone}",
        f"bogus://alice:{USER_SECRET}@127.0.0.1:{gone}",
    ):
        done = run_cli("ls", uri)
        # (An evicting server allowed logs its warning on a line of its own.)
        *_, last = done.stderr.splitlines()
        assert done.returncode != 0 and last.startswith("sessionscope ls: error:"), done.stderr
        assert "Traceback" not in done.stderr
        _no_secret(done.stdout, done.stderr)


def test_a_cluster_uri_passes_its_credentials_to_every_node(
    locked_cluster: RedisCluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    for login in (f"alice:{USER_SECRET}@", f":{SECRET}@"):
        uri = cluster_uri(locked_cluster, login)
        with SyncSessionService(uri) as svc:
            # Sessions of several users land on several nodes.
            for n in range(6):
                s = svc.create_session(app_name=APP, user_id=f"u{n}", session_id="s")
                svc.append_event(s, ev(delta={"k": n}))

            async def read() -> int:
                async with SessionService(svc.store) as service:
                    got = await service.get_session(app_name=APP, user_id="u5", session_id="s")
                    return len(got.events) if got else -1

            assert asyncio.run(read()) == 1
            _no_secret(repr(svc), repr(svc.store), svc.store.uri)
            assert ":***@" in svc.store.uri
            done = run_cli("ls", uri.replace(login, login), "--app", APP)
            assert done.returncode == 0, done.stderr
    # Without credentials the nodes refuse, as a StoreError with a hint.
    with pytest.raises(StoreError) as caught:
        open_store(cluster_uri(locked_cluster))
    assert caught.value.hint
    _no_secret(caplog.text)


# -- failures -------------------------------------------------------------------


def test_a_cluster_uri_at_a_single_server_or_at_nothing_is_a_store_error(
    redis_server: RedisServer,
) -> None:
    for port in (redis_server.port, free_port()):
        uri = f"redis+cluster://127.0.0.1:{port}?prefix=p&timeout=2"
        with pytest.raises(StoreError) as caught:
            open_store(uri)
        assert caught.value.hint and "cluster" in caught.value.hint
        done = run_cli("ls", uri)
        assert done.returncode == 1, done.stderr
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.startswith("sessionscope ls: error: StoreError: Redis failed")


def test_the_async_cluster_client_fails_as_a_store_error(redis_cluster: RedisCluster) -> None:
    """The async face finds the nodes on its first use: when they are gone, a StoreError."""
    store = open_store(f"{redis_cluster.url}?prefix=r{uuid.uuid4().hex}")
    try:
        # The async client is made from the store's nodes: name one where nothing runs.
        store.nodes = [("127.0.0.1", free_port())]

        async def read() -> None:
            await store.aio.load_session(APP, USER, "s", None, None)

        with pytest.raises(StoreError) as caught:
            asyncio.run(read())
        assert caught.value.hint
    finally:
        store.close()


# -- reading never creates ------------------------------------------------------


def test_commands_that_read_refuse_a_redis_prefix_without_a_store(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    client = redis.Redis(port=redis_server.port)
    try:
        prefix = f"typo{uuid.uuid4().hex}"
        uri = f"{redis_server.url}?prefix={prefix}"
        before = client.dbsize()
        with pytest.raises(StoreNotFoundError, match=prefix):
            open_store(uri, create=False)
        for args in (
            ("ls", uri),
            ("show", uri, APP, USER, "s"),
            ("tail", uri, APP, USER, "s"),
            ("stats", uri),
            ("verify", uri),
            ("export", uri, str(tmp_path / "out.dump")),
        ):
            done = run_cli(*args)
            assert done.returncode == 2, done.stderr
            assert "no store" in done.stderr and prefix in done.stderr, done.stderr
            assert done.stderr.count("\n") == 1
        assert not list(client.scan_iter(match=f"{prefix}*", count=1000))
        # No key anywhere either (keys of earlier tests may expire meanwhile, never appear).
        assert client.dbsize() <= before
        assert not (tmp_path / "out.dump").exists()
        # A store that exists is read as before.
        with SyncSessionService(uri) as svc:
            svc.create_session(app_name=APP, user_id=USER, session_id="s")
        open_store(uri, create=False).close()
        done = run_cli("ls", uri, "--app", APP, "--user", USER)
        assert done.returncode == 0 and "s" in done.stdout, done.stderr
    finally:
        client.close()


def test_a_reader_open_of_an_lmdb_path_without_a_store_creates_nothing(tmp_path: Path) -> None:
    with pytest.raises(StoreNotFoundError):
        open_store(f"lmdb://{tmp_path}/none", create=False)
    assert not (tmp_path / "none").exists()


# -- a stopped server -----------------------------------------------------------


def _connections(server: RedisServer) -> int:
    return int(server.cli("INFO", "stats").split("total_connections_received:")[1].split()[0])


def test_a_read_from_a_stopped_server_waits_one_timeout(tmp_path: Path) -> None:
    """The read is sent once: a timed-out read is not sent again on a new connection."""
    server = RedisServer(tmp_path / "stopped").start()
    store = RedisStore(server.url, prefix="p", timeout=0.3)
    try:
        store.load_session(APP, USER, "s", None, None)
        before = _connections(server)
        server.pause()
        try:
            with pytest.raises(StoreError, match="did not answer in time"):
                store.load_session(APP, USER, "s", None, None)
        finally:
            server.resume()
        # The one new connection is this INFO's own.
        assert _connections(server) == before + 1

        async def stopped_read() -> None:
            await store.aio.load_session(APP, USER, "s", None, None)  # connects
            nonlocal before
            before = _connections(server)
            server.pause()
            try:
                with pytest.raises(StoreError, match="did not answer in time"):
                    await store.aio.load_session(APP, USER, "s", None, None)
            finally:
                server.resume()

        asyncio.run(stopped_read())
        assert _connections(server) == before + 1
    finally:
        store.close()
        server.stop()


def test_no_password_in_what_replay_prints_or_writes(locked: RedisServer, tmp_path: Path) -> None:
    # The report names its target: the store's URI, without its password, on
    # the terminal and in the --json file.
    uri = f"redis://alice:{USER_SECRET}@127.0.0.1:{locked.port}/0?prefix=replayed"
    report = tmp_path / "replay.json"
    done = run_cli("replay", "--no-progress", "--store", uri, "--json", str(report), "sample")
    assert done.returncode == 0, done.stderr
    written = report.read_text()
    assert "redis://alice:***@127.0.0.1" in done.stdout and "alice:***@" in written
    _no_secret(done.stdout, done.stderr, written)


def _keys_under(client: Any, kind: str, prefix: str) -> dict[bytes, bytes]:
    """Return every key starting with ``prefix`` and its DUMP (type and value), any node."""
    nodes = client.get_primaries() if kind == "cluster" else [None]
    found = {}
    for node in nodes:
        options = {} if node is None else {"target_nodes": node}
        for key in client.scan_iter(match=b"*", count=1000, **options):
            if key.startswith(prefix.encode()):
                found[key] = client.dump(key)
    return found


def test_a_prefix_holding_other_keys_is_refused_before_anything_is_written(
    shared_server: tuple[str, Any],
) -> None:
    # Keys under the prefix, but no store's format record: someone else's.
    # One of them has a name the store uses, as another type.
    kind, server = shared_server
    prefix = f"foreign{uuid.uuid4().hex}"
    client = _raw_client(kind, server)
    try:
        client.set(f"{prefix}:apps", "not a set")
        client.set(f"{prefix}:theirs", "kept")
        before = _keys_under(client, kind, prefix)
        uri = f"{server.url}?prefix={prefix}"
        with pytest.raises(IncompatibleStoreError, match="not a sessionscope store"):
            SyncSessionService(uri)
        with pytest.raises(IncompatibleStoreError):
            open_store(uri)
        assert _keys_under(client, kind, prefix) == before
        # A prefix of that one's is another prefix: it opens, and writes its own keys only.
        with SyncSessionService(f"{server.url}?prefix={prefix}x") as svc:
            svc.create_session(app_name=APP, user_id=USER, session_id="s")
        assert _keys_under(client, kind, f"{prefix}:") == before
    finally:
        for key in _keys_under(client, kind, prefix):
            client.delete(key)
        client.close()


def test_destroy_deletes_its_own_prefix_only_whatever_glob_it_spells(
    shared_server: tuple[str, Any],
) -> None:
    kind, server = shared_server
    tag = uuid.uuid4().hex
    client = _raw_client(kind, server)
    try:
        # "t*" as a pattern would take "tb"'s keys too.
        for prefix in (f"{tag}t*", f"{tag}tb", f"{tag}t?", f"{tag}t[b]"):
            with SyncSessionService(f"{server.url}?prefix={quote(prefix, safe='')}") as svc:
                svc.create_session(app_name=APP, user_id=USER, session_id="s")
        others = {p: _keys_under(client, kind, f"{tag}{p}:") for p in ("tb", "t?", "t[b]")}
        assert all(others.values())
        assert open_store(f"{server.url}?prefix={quote(tag + 't*', safe='')}").destroy() > 0
        assert _keys_under(client, kind, f"{tag}t*:") == {}
        assert {p: _keys_under(client, kind, f"{tag}{p}:") for p in others} == others
    finally:
        for key in _keys_under(client, kind, tag):
            client.delete(key)
        client.close()


@pytest.mark.parametrize(
    "login",
    [
        f":my {SECRET}@",  # a space
        f"alice:{SECRET}/x@",  # a slash: the rest would be read as the path
        f":{SECRET}?x@",  # a question mark: ... as the query
        f":{SECRET}#x@",  # a hash: ... as the fragment
    ],
)
def test_a_password_not_percent_encoded_is_refused_without_showing_it(
    login: str, tmp_path: Path
) -> None:
    port = free_port()
    for scheme in ("redis", "rediss", "redis+cluster"):
        uri = f"{scheme}://{login}127.0.0.1:{port}/0"
        with pytest.raises(ValueError, match="must be percent-encoded") as caught:
            open_store(uri)
        _no_secret(str(caught.value))
        with pytest.raises(ValueError, match="must be percent-encoded"):
            RedisStore(uri) if scheme == "redis" else SyncSessionService(uri)
        done = run_cli("ls", "--json", uri)
        assert done.returncode == 2 and "percent-encoded" in done.stderr, done.stderr
        _no_secret(done.stdout, done.stderr)
    # The key store of an encrypted store names its server the same way.
    from sessionscope.crypto import Encryption

    keys = f"redis://{login}127.0.0.1:{port}/0"
    with pytest.raises(ValueError, match="must be percent-encoded") as caught:
        open_store(f"lmdb://{tmp_path / 'store'}", encryption=Encryption(keys=keys, key=bytes(32)))
    _no_secret(str(caught.value))
    assert not (tmp_path / "store").exists()


@pytest.mark.parametrize("path", ["/abc", "/0/1", "/-1", "/1x", "/\u0661"])
def test_a_database_that_is_not_a_number_is_refused(path: str, tmp_path: Path) -> None:
    """redis-py would read these as database 0 or 1: a typo would move the sessions."""
    port = free_port()
    for scheme in ("redis", "rediss", "redis+cluster"):
        uri = f"{scheme}://:{SECRET}@127.0.0.1:{port}{path}"
        with pytest.raises(ValueError, match="number of a database") as caught:
            open_store(uri)
        _no_secret(str(caught.value))
        with pytest.raises(ValueError, match="number of a database"):
            RedisStore(uri) if scheme == "redis" else SyncSessionService(uri)
        done = run_cli("ls", "--json", uri)
        assert done.returncode == 2 and "number of a database" in done.stderr, done.stderr
        _no_secret(done.stdout, done.stderr)
    from sessionscope.crypto import Encryption

    keys = f"redis://127.0.0.1:{port}{path}"
    with pytest.raises(ValueError, match="number of a database"):
        open_store(f"lmdb://{tmp_path / 'store'}", encryption=Encryption(keys=keys, key=bytes(32)))
    assert not (tmp_path / "store").exists()


def test_a_cluster_takes_only_database_0() -> None:
    port = free_port()
    with pytest.raises(ValueError, match="only database 0"):
        open_store(f"redis+cluster://127.0.0.1:{port}/3")
