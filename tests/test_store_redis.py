"""What is particular to the Redis store: URIs, key layout, reads, TTL, faults.

The contract itself runs on Redis through the parametrized suites
(``_stores.STORE_KINDS``); these tests look at the server underneath.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

import _stores
from _redis import RedisCluster, RedisServer
from _stores import APP, USER, ev, event_ids
from sessionscope import Event, GetSessionConfig, Session, SessionService, SyncSessionService
from sessionscope.bench.mix import MixSpec, generate
from sessionscope.bench.replay import NativeTarget, replay
from sessionscope.errors import (
    CorruptStoreError,
    DuplicateEventError,
    IncompatibleStoreError,
    SessionNotFoundError,
    StoreError,
)
from sessionscope.stores import open_store
from sessionscope.stores.records import AppendBatch, AppendRequest
from sessionscope.stores.redis import LIBRARY, RedisStore


@pytest.fixture(params=_stores.REDIS_KINDS)
def server(request: pytest.FixtureRequest) -> Any:
    """The session's standalone server, or its cluster."""
    return request.getfixturevalue("redis_server" if request.param == "redis" else "redis_cluster")


@pytest.fixture
def uri(server: Any) -> str:
    """A fresh store (its own prefix) on the server."""
    return f"{server.url}?prefix=r{uuid.uuid4().hex}"


@pytest.fixture
def svc(uri: str) -> Iterator[SyncSessionService]:
    with SyncSessionService(uri) as service:
        yield service


def raw_client(server: Any) -> Any:
    """A plain redis-py client on the server (or cluster), for looking underneath."""
    if isinstance(server, RedisCluster):
        nodes = [redis.cluster.ClusterNode("127.0.0.1", s.port) for s in server.servers]
        return redis.cluster.RedisCluster(startup_nodes=nodes)
    return redis.Redis(port=server.port)


def keys_of(server: Any, prefix: str) -> set[bytes]:
    """Return every key under a store prefix, scanning the whole keyspace (every node)."""
    client = raw_client(server)
    try:
        if isinstance(server, RedisCluster):
            found: set[bytes] = set()
            for node in client.get_primaries():
                found.update(client.scan_iter(match=prefix + ":*", count=1000, target_nodes=node))
            return found
        return set(client.scan_iter(match=prefix + ":*", count=1000))
    finally:
        client.close()


def prefix_of(uri: str) -> str:
    return uri.rpartition("prefix=")[2]


# -- opening ---------------------------------------------------------------


def test_open_store_reads_the_query(redis_server: RedisServer) -> None:
    """redis:// takes prefix, ttl, wait and timeout; keyword options win over the query."""
    store = open_store(f"{redis_server.url}?prefix=q1&ttl=60&timeout=2.5", ttl=30)
    try:
        assert isinstance(store, RedisStore)
        assert store.prefix == "q1"
        assert store.uri == f"{redis_server.url}?prefix=q1&ttl=30"
        again = open_store(store.uri)
        again.close()
    finally:
        store.close()


# The database test_bad_options_are_value_errors_and_write_nothing opens.
UNUSED_DB = 15


@pytest.mark.parametrize(
    ("query", "match"),
    [
        ("colour=red", "unknown redis:// option 'colour'"),
        ("ttl=soon", "ttl='soon' is not valid"),
        ("ttl=0", "ttl must be a positive"),
        ("prefix=a{b}", "prefix must be"),
        ("wait=-1", "wait must be"),
        ("timeout=0", "timeout must be positive"),
    ],
)
def test_bad_options_are_value_errors_and_write_nothing(
    redis_server: RedisServer, query: str, match: str
) -> None:
    # A database no other test writes: keys other tests leave in database 0
    # expire meanwhile, so counting them there would see changes not made here.
    url = f"redis://127.0.0.1:{redis_server.port}/{UNUSED_DB}"
    assert redis_server.cli("-n", str(UNUSED_DB), "DBSIZE") == "0"
    with pytest.raises(ValueError, match=match):
        open_store(f"{url}?{query}")
    assert redis_server.cli("-n", str(UNUSED_DB), "DBSIZE") == "0"


def test_cluster_uri_names_each_node_and_refuses_wait(redis_cluster: RedisCluster) -> None:
    with pytest.raises(ValueError, match="host:port"):
        open_store("redis+cluster://127.0.0.1:1,nohost?prefix=x")
    with pytest.raises(ValueError, match="wait= needs one server"):
        open_store(f"{redis_cluster.url}?wait=1")


def test_unreachable_server_is_a_store_error_with_a_hint() -> None:
    port = _stores_free_port()
    with pytest.raises(StoreError, match="redis-server runs") as caught:
        open_store(f"redis://127.0.0.1:{port}/0?timeout=0.5")
    assert caught.value.hint is not None


def _stores_free_port() -> int:
    from _redis import free_port

    return free_port()


def test_a_prefix_holding_something_else_is_refused(redis_server: RedisServer) -> None:
    """The format record guards a prefix: other data or a newer format is refused, unchanged."""
    client = redis.Redis(port=redis_server.port)
    try:
        client.set("alien:format", b"not ours")
        with pytest.raises(IncompatibleStoreError, match="holds something else"):
            open_store(f"{redis_server.url}?prefix=alien")
        assert client.get("alien:format") == b"not ours"
        store = open_store(f"{redis_server.url}?prefix=future")
        store.close()
        from sessionscope.codec import pack

        newer = pack({"magic": "sessionscope", "format": 99})
        client.set("future:format", newer)
        with pytest.raises(IncompatibleStoreError, match="format 99"):
            open_store(f"{redis_server.url}?prefix=future")
        assert client.get("future:format") == newer
    finally:
        client.close()


def test_two_prefixes_on_one_server_never_meet(server: Any) -> None:
    first = SyncSessionService(f"{server.url}?prefix=a{uuid.uuid4().hex}")
    second = SyncSessionService(f"{server.url}?prefix=b{uuid.uuid4().hex}")
    with first, second:
        s = first.create_session(app_name=APP, user_id=USER, session_id="s", state={"app:k": 1})
        first.append_event(s, ev(delta={"user:u": 1}))
        assert second.get_session(app_name=APP, user_id=USER, session_id="s") is None
        assert second.list_sessions(app_name=APP).sessions == []
        assert second.get_app_state(app_name=APP) == {}
        assert second.get_user_state(app_name=APP, user_id=USER) == {}


# -- key layout ------------------------------------------------------------


def test_delete_removes_every_key_of_the_session(server: Any, uri: str) -> None:
    """After delete, a scan of the whole keyspace finds no key the session owned."""
    prefix = prefix_of(uri)
    with SyncSessionService(uri) as svc:
        before = keys_of(server, prefix)
        s = svc.create_session(
            app_name=APP, user_id=USER, session_id="gone", state={"k": 1, "user:u": 1, "app:a": 1}
        )
        for i in range(5):
            svc.append_event(s, ev(delta={f"k{i}": i, "app:a": i, "user:u": i}, ts=100.0 + i))
        during = keys_of(server, prefix)
        assert len(during - before) >= 5
        svc.delete_session(app_name=APP, user_id=USER, session_id="gone")
        after = keys_of(server, prefix)
        left = {key for key in after - before if b"gone" in key}
        assert left == set()
        # What stays is shared: the app and user maps (the contract keeps them), the
        # app's user directory, the store's apps, the user's session number
        # counter, and the bookkeeping of app deltas (cluster).
        shared = (b"}a", b"}u", b"}d", b"}p", b"}k", b"}c", b":apps")
        assert all(key.endswith(shared) for key in after - before), after - before
        assert svc.get_app_state(app_name=APP) == {"a": 4}
        assert svc.get_user_state(app_name=APP, user_id=USER) == {"u": 4}
        assert svc.list_sessions(app_name=APP).sessions == []


def test_a_session_and_its_user_share_a_slot_and_apps_spread(server: Any, uri: str) -> None:
    """Keys are hash-tagged per (app, user): one slot per user, users spread over slots."""
    prefix = prefix_of(uri)
    client = raw_client(server)
    with SyncSessionService(uri) as svc:
        for user in ("u1", "u2", "u3", "u4", "u5", "u6"):
            s = svc.create_session(app_name=APP, user_id=user, session_id="s", state={"user:x": 1})
            svc.append_event(s, ev(delta={"k": 1}))
        slots: dict[bytes, set[int]] = {}
        for key in keys_of(server, prefix):
            if b"{u" in key:
                tag = key[key.index(b"{") : key.index(b"}") + 1]
                slots.setdefault(tag, set()).add(
                    int(client.execute_command("CLUSTER KEYSLOT", key))
                    if isinstance(server, RedisCluster)
                    else redis.crc.key_slot(key)
                )
    client.close()
    assert len(slots) == 6
    assert all(len(found) == 1 for found in slots.values())
    assert len({next(iter(found)) for found in slots.values()}) > 1


def test_ids_with_braces_colons_and_nul_stay_apart(svc: SyncSessionService) -> None:
    """Ids that look like key syntax (hash tags, separators) never collide."""
    ids = ["{x}", "x}", "{", "a:b", "a", "r:a", "\x00", "}{"]
    for i, sid in enumerate(ids):
        s = svc.create_session(app_name="{app}", user_id="{u}:x", session_id=sid, state={"n": i})
        svc.append_event(s, ev(delta={"user:last": sid}))
    for i, sid in enumerate(ids):
        got = svc.get_session(app_name="{app}", user_id="{u}:x", session_id=sid)
        assert got is not None and got.state["n"] == i and len(got.events) == 1
    assert sorted(m.id for m in svc.list_sessions(app_name="{app}").sessions) == sorted(ids)


# -- a damaged session record ------------------------------------------------


def _hashes_of(server: Any, prefix: str, sid: str) -> dict[bytes, Any]:
    """Return every hash of a session's keys, to tell that nothing was written."""
    client = raw_client(server)
    try:
        mine = [k for k in keys_of(server, prefix) if k.endswith(b":" + sid.encode())]
        return {k: client.hgetall(k) for k in mine if client.type(k) == b"hash"}
    finally:
        client.close()


@pytest.mark.parametrize(
    ("field", "value"),
    [("k", "not a number"), ("k", "-1"), ("k", "1.5"), ("k", ""), ("r", "x"), ("r", "99")],
)
def test_a_damaged_count_is_a_corrupt_session_naming_it(
    server: Any, uri: str, svc: SyncSessionService, field: str, value: str
) -> None:
    """The server functions check the record's counts before they write anything."""
    s = svc.create_session(app_name=APP, user_id=USER, session_id="s")
    for i in range(3):
        svc.append_event(s, ev(content={"i": i}))
    prefix = prefix_of(uri)
    (record_key,) = [k for k in keys_of(server, prefix) if k.endswith(b"}r:s")]
    client = raw_client(server)
    try:
        client.hset(record_key, field, value)
    finally:
        client.close()
    before = _hashes_of(server, prefix, "s")
    store = svc.store
    named = rf"the record of session '{APP}'/'{USER}'/'s' is unreadable"
    attempts = {
        "read": lambda: svc.get_session(app_name=APP, user_id=USER, session_id="s"),
        "read the last n": lambda: svc.get_session(
            app_name=APP, user_id=USER, session_id="s", config=GetSessionConfig(num_recent_events=1)
        ),
        "append": lambda: svc.append_event(s, ev(content="one more")),
        "locked append": lambda: svc.append_event_locked(s, ev(content="one more")),
        "bulk append": lambda: svc.append_many([(s, ev(content=1)), (s, ev(content=2))]),
        "pop": lambda: store.pop_events(APP, USER, "s", 1).result(),
        "truncate": lambda: svc.truncate_events(
            app_name=APP, user_id=USER, session_id="s", keep_last=1
        ),
    }
    for what, attempt in attempts.items():
        with pytest.raises(CorruptStoreError, match=named) as info:
            attempt()
        assert "altered outside sessionscope" in str(info.value), what
        assert _hashes_of(server, prefix, "s") == before, what
    # The async face says the same.
    with pytest.raises(CorruptStoreError, match=named):
        asyncio.run(_load_async(store))


async def _load_async(store: Any) -> Any:
    return await store.aio.load_session(APP, USER, "s", None, None)


# -- reads -----------------------------------------------------------------


def _spoil_events(server: Any, uri: str, sid: str, seqs: range) -> None:
    """Overwrite stored event records with bytes that cannot be decoded."""
    prefix = prefix_of(uri)
    client = raw_client(server)
    try:
        (events_key,) = [k for k in keys_of(server, prefix) if k.endswith(b"}e:" + sid.encode())]
        for seq in seqs:
            client.hset(events_key, str(seq), b"\xff not an event")
    finally:
        client.close()


def test_last_n_reads_only_n_events(server: Any, uri: str, svc: SyncSessionService) -> None:
    """Events before the last n are never read: spoiling them does not disturb the read."""
    s = svc.create_session(app_name=APP, user_id=USER, session_id="long")
    for i in range(30):
        svc.append_event(s, ev(content={"i": i}, ts=float(i)))
    _spoil_events(server, uri, "long", range(25))
    tail = svc.get_session(
        app_name=APP, user_id=USER, session_id="long", config=GetSessionConfig(num_recent_events=5)
    )
    assert tail is not None and [e.content["i"] for e in tail.events] == list(range(25, 30))
    with pytest.raises(StoreError):
        svc.get_session(app_name=APP, user_id=USER, session_id="long")


def test_after_timestamp_reads_only_what_it_returns(
    server: Any, uri: str, svc: SyncSessionService
) -> None:
    """Events before the time are never read, also when timestamps arrive out of order."""
    s = svc.create_session(app_name=APP, user_id=USER, session_id="t")
    stamps = [5.0, 1.0, 2.0, 3.0, 9.0, 4.0, 7.0, 8.0]
    for i, stamp in enumerate(stamps):
        svc.append_event(s, ev(content={"i": i}, ts=stamp))
    _spoil_events(server, uri, "t", range(1, 4))  # the events at 1.0, 2.0 and 3.0
    got = svc.get_session(
        app_name=APP, user_id=USER, session_id="t", config=GetSessionConfig(after_timestamp=4.0)
    )
    assert got is not None and [e.timestamp for e in got.events] == [5.0, 9.0, 4.0, 7.0, 8.0]
    both = svc.get_session(
        app_name=APP,
        user_id=USER,
        session_id="t",
        config=GetSessionConfig(after_timestamp=7.5, num_recent_events=3),
    )
    assert both is not None and [e.timestamp for e in both.events] == [8.0]


def _times_key_type(server: Any, uri: str, sid: str) -> str:
    """Return the Redis type of a session's times key ("none" when absent)."""
    client = raw_client(server)
    try:
        (times,) = [k for k in keys_of(server, prefix_of(uri)) if k.endswith(b"}t:" + sid.encode())]
        kind = client.type(times)
    finally:
        client.close()
    return kind.decode() if isinstance(kind, bytes) else str(kind)


def _read_after(
    svc: SyncSessionService, sid: str, after: float, last: int | None = None
) -> list[float]:
    got = svc.get_session(
        app_name=APP, user_id=USER, session_id=sid,
        config=GetSessionConfig(after_timestamp=after, num_recent_events=last),
    )  # fmt: skip
    assert got is not None
    return [e.timestamp for e in got.events]


def test_times_in_order_are_searched_by_position_and_read_only_what_is_returned(
    server: Any, uri: str, svc: SyncSessionService
) -> None:
    """Times that never go back keep no sorted set: a filter finds them by binary search."""
    s = svc.create_session(app_name=APP, user_id=USER, session_id="o")
    stamps = [1.0, 2.0, 2.0, 2.0, 3.5, 4.0, 4.0, 9.0]
    for i, stamp in enumerate(stamps[:3]):
        svc.append_event(s, ev(content={"i": i}, ts=stamp))
    svc.append_many([(s, ev(content={"i": 3 + i}, ts=stamp)) for i, stamp in enumerate(stamps[3:])])
    assert _times_key_type(server, uri, "o") == "string"
    _spoil_events(server, uri, "o", range(0, 1))  # the event at 1.0
    assert _read_after(svc, "o", 2.0) == [2.0, 2.0, 2.0, 3.5, 4.0, 4.0, 9.0]
    assert _read_after(svc, "o", 4.0) == [4.0, 4.0, 9.0]
    assert _read_after(svc, "o", 9.5) == []
    assert _read_after(svc, "o", 2.0, last=3) == [4.0, 4.0, 9.0]
    assert _read_after(svc, "o", 4.0, last=5) == [4.0, 4.0, 9.0]
    with pytest.raises(StoreError):
        _read_after(svc, "o", 0.5)


@pytest.mark.parametrize("path", ["one", "bulk", "interleaved"])
def test_a_time_that_goes_back_turns_the_times_into_a_sorted_set(
    server: Any, uri: str, svc: SyncSessionService, path: str
) -> None:
    """The first event older than the one before: every later read and truncation stays right."""
    s = svc.create_session(app_name=APP, user_id=USER, session_id="b")
    other = svc.create_session(app_name=APP, user_id=USER, session_id="other")
    stamps = [1.0, 3.0, 5.0, 2.0, 6.0, 4.0]
    if path == "one":
        for i, stamp in enumerate(stamps):
            svc.append_event(s, ev(content={"i": i}, delta={"n": i}, ts=stamp))
    elif path == "bulk":
        svc.append_many([(s, ev(content={"i": i}, delta={"n": i}, ts=t))
                         for i, t in enumerate(stamps)])  # fmt: skip
    else:
        svc.append_many([pair for i, t in enumerate(stamps)
                         for pair in ((s, ev(content={"i": i}, delta={"n": i}, ts=t)),
                                      (other, ev(ts=10.0 + i)))])  # fmt: skip
        assert _times_key_type(server, uri, "other") == "string"
        assert _read_after(svc, "other", 13.0) == [13.0, 14.0, 15.0]
    assert _times_key_type(server, uri, "b") == "zset"
    assert _read_after(svc, "b", 3.0) == [3.0, 5.0, 6.0, 4.0]
    assert _read_after(svc, "b", 4.5, last=3) == [6.0]
    got = svc.get_session(app_name=APP, user_id=USER, session_id="b")
    assert got is not None and got.state == {"n": 5} and [e.content["i"] for e in got.events] == [
        0, 1, 2, 3, 4, 5,
    ]  # fmt: skip
    svc.append_event(got, ev(ts=0.5))
    assert _read_after(svc, "b", 0.0, last=2) == [4.0, 0.5]
    assert svc.truncate_events(app_name=APP, user_id=USER, session_id="b", before=3.0) == 3
    assert _read_after(svc, "b", 0.0) == [3.0, 5.0, 6.0, 4.0]


def test_truncation_of_times_in_order_keeps_every_read_right(
    server: Any, uri: str, svc: SyncSessionService
) -> None:
    """Truncating by time or count removes the oldest positions; the string stays searchable."""
    s = svc.create_session(app_name=APP, user_id=USER, session_id="tr")
    svc.append_many([(s, ev(content={"i": i}, ts=float(i // 2))) for i in range(20)])
    assert svc.truncate_events(app_name=APP, user_id=USER, session_id="tr", before=3.0) == 6
    assert _read_after(svc, "tr", 0.0) == [float(i // 2) for i in range(6, 20)]
    assert _read_after(svc, "tr", 5.0, last=20) == [5.0, 5.0, 6.0, 6.0, 7.0, 7.0, 8.0, 8.0, 9.0,
                                                     9.0]  # fmt: skip
    assert svc.truncate_events(app_name=APP, user_id=USER, session_id="tr", keep_last=5) == 9
    live = svc.get_session(app_name=APP, user_id=USER, session_id="tr")
    assert live is not None and [e.content["i"] for e in live.events] == [15, 16, 17, 18, 19]
    svc.append_many([(live, ev(content={"i": 20}, ts=9.0)), (live, ev(content={"i": 21}, ts=12.0))])
    assert _times_key_type(server, uri, "tr") == "string"
    assert _read_after(svc, "tr", 9.0) == [9.0, 9.0, 9.0, 12.0]
    assert _read_after(svc, "tr", 0.0, last=2) == [9.0, 12.0]
    assert svc.truncate_events(app_name=APP, user_id=USER, session_id="tr", before=100.0) == 7
    assert _read_after(svc, "tr", 0.0) == []


def test_a_store_of_format_1_is_read_and_written_with_sorted_sets(
    redis_server: RedisServer,
) -> None:
    """Clients of format 1 may still share it: its sessions keep the sorted set, old and new."""
    from sessionscope.codec import pack

    prefix = f"f1{uuid.uuid4().hex}"
    client = redis.Redis(port=redis_server.port)
    try:
        header = pack({"magic": "sessionscope", "format": 1})
        client.set(f"{prefix}:format", header)
        uri = f"{redis_server.url}?prefix={prefix}"
        with SyncSessionService(uri) as svc:
            s = svc.create_session(app_name=APP, user_id=USER, session_id="old")
            svc.append_many([(s, ev(ts=float(i))) for i in range(5)])
            svc.append_event(s, ev(ts=9.0))
            assert _times_key_type(redis_server, uri, "old") == "zset"
            assert _read_after(svc, "old", 3.0) == [3.0, 4.0, 9.0]
            assert _read_after(svc, "old", 3.5, last=4) == [4.0, 9.0]
            removed = svc.truncate_events(app_name=APP, user_id=USER, session_id="old", before=2.0)
            assert removed == 2
            assert _read_after(svc, "old", 0.0) == [2.0, 3.0, 4.0, 9.0]
        assert client.get(f"{prefix}:format") == header
    finally:
        client.close()


# -- TTL -------------------------------------------------------------------


def test_ttl_expires_an_idle_session_whole_and_keeps_shared_maps_longer(server: Any) -> None:
    prefix = f"ttl{uuid.uuid4().hex}"
    with SyncSessionService(f"{server.url}?prefix={prefix}&ttl=4") as svc:
        s = svc.create_session(
            app_name=APP, user_id=USER, session_id="s", state={"app:a": 1, "user:u": 1}
        )
        svc.append_event(s, ev(delta={"k": 1}))
        client = raw_client(server)
        try:
            keys = keys_of(server, prefix)
            # The shared maps are read first: set no earlier than the session's
            # keys, they must not expire before them.
            shared = [client.pttl(k) for k in keys if k.endswith((b"}a", b"}u", b"}d"))]
            session = [client.pttl(k) for k in keys if k.endswith((b"r:s", b"e:s", b"s:s"))]
            format_ttl = client.ttl(prefix + ":format")
        finally:
            client.close()
        assert len(session) == 3 and all(0 < t <= 4000 for t in session)
        assert len(shared) == 3 and min(shared) >= max(session)
        assert format_ttl == -1
        deadline = time.monotonic() + 20
        while svc.get_session(app_name=APP, user_id=USER, session_id="s") is not None:
            assert time.monotonic() < deadline, "the session did not expire"
            time.sleep(0.2)
        assert svc.list_sessions(app_name=APP).sessions == []
        left = {key for key in keys_of(server, prefix) if key.endswith(b":s") or b"}e:" in key}
        assert left == set()


def test_an_append_refreshes_the_ttl(server: Any) -> None:
    """Appends 2 s apart keep a session of a 6 s TTL for 8 s.

    The margin (4 s between an append and the expiry it pushes back) is
    wide, so that a loaded machine does not expire the session between two.
    """
    prefix = f"ttl{uuid.uuid4().hex}"
    with SyncSessionService(f"{server.url}?prefix={prefix}&ttl=6") as svc:
        s = svc.create_session(app_name=APP, user_id=USER, session_id="s")
        for _ in range(4):
            time.sleep(2.0)
            svc.append_event(s, ev())
        got = svc.get_session(app_name=APP, user_id=USER, session_id="s")
        assert got is not None and len(got.events) == 4


def test_a_bulk_run_of_one_session_keeps_ttl_and_positions_after_a_truncation(
    server: Any,
) -> None:
    """A batch of one session refreshes every key's expiry, and its positions after a truncation."""
    prefix = f"ttlb{uuid.uuid4().hex}"
    with SyncSessionService(f"{server.url}?prefix={prefix}&ttl=300") as svc:
        s = svc.create_session(app_name=APP, user_id=USER, session_id="s")
        first = [ev(delta={"n": i, "user:seen": i}) for i in range(5)]
        svc.append_many([(s, e) for e in first])
        assert svc.truncate_events(app_name=APP, user_id=USER, session_id="s", keep_last=2) == 3
        more = [ev(delta={"n": 10 + i}) for i in range(4)]
        svc.append_many([(s, e) for e in more])
        got = svc.get_session(app_name=APP, user_id=USER, session_id="s")
        assert got is not None
        assert event_ids(got) == [e.id for e in first[3:] + more]
        assert got.state == {"n": 13, "user:seen": 4}
        recent = svc.get_session(app_name=APP, user_id=USER, session_id="s",
                                 config=GetSessionConfig(num_recent_events=3))  # fmt: skip
        assert recent is not None and event_ids(recent) == [e.id for e in more[1:]]
        client = redis.Redis(port=server.port) if not isinstance(server, RedisCluster) else None
        if client is not None:
            try:
                # Every key of the user's slot (the session's and the user's) expires;
                # the batches' guard keys (}g:) go a minute after their batch.
                ttls = [client.ttl(key) for key in keys_of(server, prefix)
                        if b":{u" in key and b"}g:" not in key]  # fmt: skip
                assert len(ttls) == 10 and all(0 < t <= 300 for t in ttls)
            finally:
                client.close()


# -- retries, library, async -----------------------------------------------


def _one_event_stored(store: Any) -> tuple[SyncSessionService, Session, Event, Session]:
    """Append one event (delta k=1) to a new session "s".

    Return the service, the live session, the event and the session read back.
    """
    svc = SyncSessionService(store)
    s = svc.create_session(app_name=APP, user_id=USER, session_id="s")
    event = ev(delta={"k": 1})
    svc.append_event(s, event)
    stored = svc.get_session(app_name=APP, user_id=USER, session_id="s")
    assert stored is not None
    return svc, s, event, stored


def test_a_retried_append_is_a_no_op(uri: str) -> None:
    """The same request sent twice (as after a lost reply) is stored once."""
    store = open_store(uri)
    try:
        svc, _, event, stored = _one_event_stored(store)
        request = AppendRequest(
            APP, USER, "s", event.id, event.timestamp, svc._core.model.encode_event(event),
            session_items=[("k", b"\x01")], marker=None, caller_update_time=0.0,
        )  # fmt: skip
        result = store.append(request).result()
        assert result.duplicate
        again = svc.get_session(app_name=APP, user_id=USER, session_id="s")
        assert again is not None and event_ids(again) == [event.id]
        assert again.revision == stored.revision
    finally:
        store.close()


def test_a_stored_id_sent_with_the_current_marker_writes_nothing(uri: str) -> None:
    """A repeat that passes the marker check is still a repeat, or refused, and changes nothing.

    (The append function's straight path for a single append takes the id
    index entry first: a taken id sends the request the general way.)
    """
    store = open_store(uri)
    try:
        svc, s, event, stored = _one_event_stored(store)

        def again(record: bytes, delta: int) -> AppendRequest:
            return AppendRequest(
                APP, USER, "s", event.id, event.timestamp + 1, record,
                session_items=[("k", bytes([delta]))], marker=s.revision,
            )  # fmt: skip

        same = svc._core.model.encode_event(event)
        assert store.append(again(same, 9)).result().duplicate
        other = svc._core.model.encode_event(ev(delta={"k": 2}))
        with pytest.raises(DuplicateEventError):
            store.append(again(other, 8)).result()
        after = svc.get_session(app_name=APP, user_id=USER, session_id="s")
        assert after is not None and event_ids(after) == [event.id]
        assert after.state == {"k": 1} and after.revision == stored.revision
        assert after.last_update_time == stored.last_update_time
    finally:
        store.close()


def command_calls(server: Any, command: str) -> int:
    """Return how many times the server (every node) has run a command since its start.

    Commands a function issues count too (``redis.call``).
    """
    nodes = server.servers if isinstance(server, RedisCluster) else [server]
    total = 0
    for node in nodes:
        client = redis.Redis(port=node.port)
        try:
            stats = client.info("commandstats").get(f"cmdstat_{command}", {})
            total += int(stats.get("calls", 0))
        finally:
            client.close()
    return total


def append_calls(server: Any) -> int:
    """Return how many append FCALLs the server (every node) has run since its start."""
    return command_calls(server, "fcall")


def test_a_batch_interleaving_sessions_takes_few_calls_and_stops_at_a_refusal(
    server: Any, uri: str
) -> None:
    """Runs of several sessions share a call; a refusal inside one stops the rest."""
    with SyncSessionService(uri) as svc:
        sessions = [svc.create_session(app_name=APP, user_id=USER, session_id=f"s{i}")
                    for i in range(3)]  # fmt: skip
        batch = [(sessions[i % 3], ev(delta={"n": i})) for i in range(300)]
        before = append_calls(server)
        svc.append_many(batch)
        calls = append_calls(server) - before
        for i, live in enumerate(sessions):
            stored = svc.get_session(app_name=APP, user_id=USER, session_id=f"s{i}")
            assert stored is not None and len(stored.events) == 100
            assert event_ids(stored) == [e.id for s, e in batch if s is live]
            assert stored.state == {"n": 297 + i} and stored.revision == live.revision
        # 300 runs of one event each, up to 1,000 requests per call.
        assert calls == 1
        ghost = svc.create_session(app_name=APP, user_id=USER, session_id="ghost")
        svc.delete_session(app_name=APP, user_id=USER, session_id="ghost")
        first, second, after = ev(delta={"n": -1}), ev(delta={"n": -2}), ev(delta={"n": -3})
        # Long enough for two pipelined calls: the refusal in the first stops the second.
        tail = [(sessions[i % 3], ev(delta={"n": 1000 + i})) for i in range(1100)]
        calls = append_calls(server)
        with pytest.raises(SessionNotFoundError):
            svc.append_many([(sessions[0], first), (sessions[1], second), (ghost, ev()),
                             (sessions[2], after), *tail])  # fmt: skip
        assert append_calls(server) - calls == 2
        got = [svc.get_session(app_name=APP, user_id=USER, session_id=f"s{i}") for i in range(3)]
        assert all(g is not None for g in got)
        assert [len(g.events) for g in got if g is not None] == [101, 101, 100]
        assert [g.state["n"] for g in got if g is not None] == [-1, -2, 299]


def test_a_batch_interleaving_sessions_reads_each_session_once_per_call(
    server: Any, uri: str
) -> None:
    """A call reads each session's record and ids once, and its user map ends at the last write."""
    with SyncSessionService(uri) as svc:
        sessions = [svc.create_session(app_name=APP, user_id=USER, session_id=f"s{i}")
                    for i in range(4)]  # fmt: skip
        batch = [(sessions[i % 4], ev(delta={"n": i, "user:last": i})) for i in range(200)]
        reads = command_calls(server, "hmget")
        calls = append_calls(server)
        svc.append_many(batch)
        calls = append_calls(server) - calls
        # 200 runs of one event, in one call: a record read and an id read
        # per session, not per run.
        assert calls == 1
        assert command_calls(server, "hmget") - reads == 2 * 4
        assert svc.get_user_state(app_name=APP, user_id=USER) == {"last": 199}
        for i, live in enumerate(sessions):
            stored = svc.get_session(app_name=APP, user_id=USER, session_id=f"s{i}")
            assert stored is not None and stored.revision == live.revision
            assert event_ids(stored) == [e.id for s, e in batch if s is live]
            assert stored.state["n"] == 196 + i and stored.state["user:last"] == 199
        # Repeated in one call, every request is a repeat and nothing moves.
        before = [s.revision for s in sessions]
        svc.append_many(batch[:8])
        again = [svc.get_session(app_name=APP, user_id=USER, session_id=f"s{i}") for i in range(4)]
        assert [g.revision for g in again if g is not None] == before
        assert [len(g.events) for g in again if g is not None] == [50] * 4


def _seen(session: Any) -> Any:
    """Return what a read shows: None, or the state, event ids and time of the session.

    (The time of a session without events is its create time: the clock's, not the trace's.)
    """
    if session is None:
        return None
    return session.state, event_ids(session), session.events and session.last_update_time


def _append_record(user: str, sid: str, n: int, delta: dict[str, Any] | None = None,
                   partial: bool = False) -> dict[str, Any]:  # fmt: skip
    event: dict[str, Any] = {"id": f"{sid}-{n}", "timestamp": 1000.0 + n, "author": "agent"}
    if delta:
        event["actions"] = {"state_delta": delta}
    if partial:
        event["partial"] = True
    return {"op": "append", "app": APP, "user": user, "session": sid, "event": event}


def _get_record(user: str, sid: str, config: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"op": "get", "app": APP, "user": user, "session": sid, "config": config}


def _create_record(user: str, sid: str, state: dict[str, Any]) -> dict[str, Any]:
    return {"op": "create", "app": APP, "user": user, "session": sid, "state": state}


def _reads_trace() -> list[dict[str, Any]]:
    """A trace whose reads each see something the appends and creates before them changed."""
    return [
        _create_record("u1", "a", {"user:tier": "free", "app:model": "m0", "k": 0}),
        _create_record("u2", "b", {}),
        _get_record("u1", "a"),
        _append_record("u1", "a", 1, {"k": 1, "user:last": 1, "temp:t": 1}),
        _append_record("u2", "b", 2, {"app:model": "m2"}),
        _get_record("u1", "a"),
        _append_record("u1", "a", 3, partial=True),
        _get_record("u1", "a", {"num_recent_events": 1}),
        _get_record("u1", "never"),
        # Creates that would change what the reads above saw, were they sent first.
        _create_record("u1", "c", {"user:tier": "pro"}),
        _create_record("u2", "never", {"app:model": "m9"}),
        _append_record("u1", "a", 4, {"user:last": 4}),
        _append_record("u2", "b", 5),
        _get_record("u2", "b", {"after_timestamp": 1005.0}),
        _get_record("u1", "c"),
        _append_record("u1", "c", 6, {"user:tier": "team"}),
        _get_record("u1", "a", {"num_recent_events": 2}),
        # Created again under the same id: the events read before are not its events.
        {"op": "delete", "app": APP, "user": "u1", "session": "a"},
        _create_record("u1", "a", {}),
        _append_record("u1", "a", 7),
        _get_record("u1", "a"),
        _append_record("u1", "a", 8),
        _get_record("u1", "a", {"num_recent_events": 5}),
    ]


class _Recording(NativeTarget):
    """A native target that keeps what every read of the replay showed, in order."""

    def __init__(self, uri: str) -> None:
        super().__init__(uri)
        self.seen: list[Any] = []

    def get(self, app: str, user: str, sid: str, config: Any) -> Any:
        found = super().get(app, user, sid, config)
        self.seen.append(_seen(found))
        return found

    def read_answer(self, answer: Any) -> Any:
        found = super().read_answer(answer)
        self.seen.append(_seen(found))
        return found


@pytest.mark.parametrize("trace", ["hand", "generated"])
def test_reads_carried_in_a_batch_answer_what_reads_in_turn_do(uri: str, trace: str) -> None:
    """A bulk replay's reads ride in its batches and see exactly what a plain replay's see."""
    records = (
        _reads_trace()
        if trace == "hand"
        else list(
            generate(MixSpec(sessions=24, lengths=(5, 60), seed=5, concurrent=8, list_every=30))
        )
    )
    plain = _Recording("memory://")
    bulk = _Recording(uri)
    try:
        replay(plain, records, progress=False)
        result = replay(bulk, records, batch=50, progress=False)
    finally:
        plain.close()
        bulk.close()
    reads = sum(r["op"] == "get" for r in records)
    assert result.problems == []
    assert len(plain.seen) == reads and bulk.seen == plain.seen
    # The reads travelled in the batches, not between them.
    assert result.latency["get_in_batch"].count == reads
    assert "get" not in result.latency and "get_recent" not in result.latency
    assert result.latency["append_batch"].count < reads


def test_a_refused_append_stops_the_reads_after_it_too(server: Any, uri: str) -> None:
    """The reads placed after a refused request are not answered; nothing after it is stored."""
    with SyncSessionService(uri) as svc:
        store = svc.store
        assert isinstance(store, RedisStore)
        live = svc.create_session(app_name=APP, user_id=USER, session_id="s")
        ghost = svc.create_session(app_name=APP, user_id=USER, session_id="ghost")
        svc.delete_session(app_name=APP, user_id=USER, session_id="ghost")

        def request(session: Any, n: int) -> AppendRequest:
            prepared = svc._core.prepare_append(session, ev(delta={"n": n}), locked=True)
            assert prepared is not None
            prepared.catch_up = False
            return prepared

        batch = AppendBatch.of([request(live, 0), request(ghost, 1), request(live, 2)])
        reads = [(pos, APP, USER, "s", None, None) for pos in range(4)]
        result, loaded = store.append_many_reading(batch, reads)
        assert isinstance(result.error, SessionNotFoundError)
        assert result.applied == 1
        # Before the batch, and after its first request: the reads placed after it go unanswered.
        assert [len(s.events) for s in loaded if s is not None] == [0, 1]
        assert len(loaded) == 2
        stored = svc.get_session(app_name=APP, user_id=USER, session_id="s")
        assert stored is not None and len(stored.events) == 1 and stored.state == {"n": 0}
        # A batch that goes through answers every read, in place: on one
        # server the reads travel inside the batch's append call.
        calls, loads = append_calls(server), command_calls(server, "fcall_ro")
        result, loaded = store.append_many_reading(
            AppendBatch.of([request(live, 3), request(live, 4)]),
            [(0, APP, USER, "s", 1, None), (2, APP, USER, "s", None, None)],
        )
        assert result.error is None and result.applied == 2
        assert [s.session_state if s else None for s in loaded] == [{"n": 0}, {"n": 4}]
        assert [len(s.events) for s in loaded if s is not None] == [1, 3]
        if not store.cluster:
            assert append_calls(server) - calls == 1
            assert command_calls(server, "fcall_ro") == loads


def test_a_repeat_stored_in_other_bytes_in_a_batch_goes_on_after_it(server: Any, uri: str) -> None:
    """A repeat whose stored bytes differ (equal content) stops the server; the client goes on.

    The events after it are appended, each session's marker and time are its
    last append's, the repeat is counted as one, and the reads placed after
    it are answered as they stand.
    """
    from sessionscope.codec import EVENT_FORMAT, decode_event, pack

    with SyncSessionService(uri) as svc:
        store = svc.store
        assert isinstance(store, RedisStore)
        a = svc.create_session(app_name=APP, user_id=USER, session_id="a")
        b = svc.create_session(app_name=APP, user_id=USER, session_id="b")
        first = ev(delta={"n": 0}, content={"x": 1, "y": 2}, ts=10.0)
        svc.append_event(a, first)
        client = raw_client(server)
        try:
            (events_key,) = [k for k in keys_of(server, prefix_of(uri)) if k.endswith(b"}e:a")]
            stored = client.hget(events_key, "0")
            reordered = bytes([EVENT_FORMAT]) + pack(dict(reversed(decode_event(stored).items())))
            assert reordered != stored
            client.hset(events_key, "0", reordered)
        finally:
            client.close()

        def request(session: Any, event: Event) -> AppendRequest:
            prepared = svc._core.prepare_append(session, event, locked=True)
            assert prepared is not None
            prepared.catch_up = False
            return prepared

        requests = [
            request(b, ev(delta={"m": 1}, ts=11.0)),
            request(a, clone_event(first)),
            request(a, ev(delta={"n": 2}, ts=12.0)),
            request(b, ev(delta={"m": 3}, ts=13.0)),
        ]
        reads = [(2, APP, USER, "a", None, None), (4, APP, USER, "b", None, 12.5)]
        result, loaded = store.append_many_reading(AppendBatch.of(requests), reads)
        assert result.error is None and result.applied == 4 and result.repeats == [1]
        assert result.times == [13.0, 12.0]
        got_a = svc.get_session(app_name=APP, user_id=USER, session_id="a")
        got_b = svc.get_session(app_name=APP, user_id=USER, session_id="b")
        assert got_a is not None and got_b is not None
        assert result.markers == [got_b.revision, got_a.revision]
        assert [e.timestamp for e in got_a.events] == [10.0, 12.0] and got_a.state == {"n": 2}
        assert [e.timestamp for e in got_b.events] == [11.0, 13.0] and got_b.state == {"m": 3}
        assert [len(s.events) for s in loaded if s is not None] == [1, 1]
        assert loaded[1] is not None and loaded[1].session_state == {"m": 3}


def test_deltas_of_any_size_travel_whole(uri: str) -> None:
    """Item counts past what the flags carry (65,535 a scope) go as explicit arguments."""
    with SyncSessionService(uri) as svc:
        s = svc.create_session(app_name=APP, user_id=USER, session_id="big")
        wide = {f"k{i}": i for i in range(70_000)}
        users = {f"user:u{i}": i for i in range(3)}
        svc.append_event(s, ev(delta={**wide, **users, "app:a": 1}))
        negated = {key: -value for key, value in wide.items()}
        svc.append_many([(s, ev(delta={"k1": -1, "user:u70000": 7})),
                         (s, ev(delta={**negated, "app:b": 2}))])  # fmt: skip
        svc.append_event_locked(s, ev(delta={"k2": 5, "user:u0": 9}))
        got = svc.get_session(app_name=APP, user_id=USER, session_id="big")
        assert got is not None and len(got.events) == 4
        assert got.state["k2"] == 5 and got.state["k69999"] == -69999
        assert got.state["user:u0"] == 9 and got.state["user:u70000"] == 7
        assert svc.get_app_state(app_name=APP) == {"a": 1, "b": 2}
        assert len(got.state) == 70_000 + 4 + 2


def clone_event(event: Event) -> Event:
    """Return an equal, unshared copy of an event."""
    return _stores.clone(event)


def test_the_function_library_is_loaded_again_when_missing(server: Any, uri: str) -> None:
    """A server that lost its functions (restart without persistence) gets them back."""
    with SyncSessionService(uri) as svc:
        s = svc.create_session(app_name=APP, user_id=USER, session_id="s")
        nodes = server.servers if isinstance(server, RedisCluster) else [server]
        for node in nodes:
            node.cli("FUNCTION", "DELETE", LIBRARY)
        svc.append_event(s, ev(delta={"k": 1}))
        got = svc.get_session(app_name=APP, user_id=USER, session_id="s")
        assert got is not None and got.state == {"k": 1}
        assert all(LIBRARY in node.cli("FUNCTION", "LIST") for node in nodes)


def test_one_store_serves_several_event_loops(uri: str) -> None:
    """Each running loop gets its own async client; the sync face works between them."""
    store = open_store(uri)
    try:
        asvc = SessionService(store)

        async def add(sid: str) -> None:
            s = await asvc.create_session(app_name=APP, user_id=USER, session_id=sid)
            await asvc.append_event(s, ev(delta={"k": sid}))

        for sid in ("a", "b", "c"):
            asyncio.run(add(sid))
        sync = SyncSessionService(store)
        assert sorted(m.id for m in sync.list_sessions(app_name=APP).sessions) == ["a", "b", "c"]
    finally:
        store.close()


def test_a_cancelled_async_append_still_lands_and_matches(uri: str) -> None:
    """A write is not torn by cancelling the task that awaits it."""

    async def scenario() -> tuple[list[str], list[str]]:
        async with SessionService(uri) as asvc:
            s = await asvc.create_session(app_name=APP, user_id=USER, session_id="s")
            event = ev(delta={"k": 1})
            task = asyncio.ensure_future(asvc.append_event(s, event))
            await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            got = await asvc.get_session(app_name=APP, user_id=USER, session_id="s")
            assert got is not None
            return event_ids(got), event_ids(s)

    stored, live = asyncio.run(scenario())
    assert stored == live


@pytest.mark.parametrize("steps", [0, 1, 2, 3, 5, 8])
def test_an_append_cancelled_at_any_step_is_whole_or_absent_and_matches(
    uri: str, steps: int
) -> None:
    """Cancelled after any number of loop steps, an append lands whole or not at all.

    The live session matches the store either way, and the store still serves
    the loop (the connection is not left mid-reply).
    """

    async def scenario() -> None:
        async with SessionService(uri) as asvc:
            sid = f"s{steps}"
            s = await asvc.create_session(app_name=APP, user_id=USER, session_id=sid)
            for round_ in range(3):
                event = ev(delta={"k": round_, "user:seen": round_})
                task = asyncio.ensure_future(asvc.append_event(s, event))
                for _ in range(steps):
                    await asyncio.sleep(0)
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                got = await asvc.get_session(app_name=APP, user_id=USER, session_id=sid)
                assert got is not None
                assert event_ids(got) == event_ids(s)
                assert got.state == s.state and got.revision == s.revision
            after = ev(delta={"k": "after"})
            await asvc.append_event(s, after)
            got = await asvc.get_session(app_name=APP, user_id=USER, session_id=sid)
            assert got is not None and event_ids(got)[-1] == after.id

    asyncio.run(scenario())


# -- faults ----------------------------------------------------------------


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A server of this test's own, with an append-only file, stopped at the end."""
    server = RedisServer(tmp_path / "own", "--appendonly", "yes", "--appendfsync", "always")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.slow
def test_a_killed_server_gives_store_errors_then_a_restart_serves_again(
    own_server: RedisServer,
) -> None:
    """Connection loss is a StoreError, sync and async; the same files serve after a restart."""
    with SyncSessionService(f"{own_server.url}?prefix=f&timeout=1") as svc:
        s = svc.create_session(app_name=APP, user_id=USER, session_id="s")
        svc.append_event(s, ev(delta={"k": 1}))
        own_server.kill()
        with pytest.raises(StoreError, match="redis-server runs"):
            svc.append_event(s, ev(delta={"k": 2}))
        with pytest.raises(StoreError):
            svc.get_session(app_name=APP, user_id=USER, session_id="s")

        async def read() -> Any:
            return await SessionService(svc.store).get_session(
                app_name=APP, user_id=USER, session_id="s"
            )

        with pytest.raises(StoreError):
            asyncio.run(read())
        own_server.start()
        got = svc.get_session(app_name=APP, user_id=USER, session_id="s")
        assert got is not None and got.state == {"k": 1} and len(got.events) == 1
        svc.append_event(got, ev(delta={"k": 3}))
        assert asyncio.run(read()).state == {"k": 3}


@pytest.mark.slow
def test_a_server_that_stops_answering_times_out(own_server: RedisServer) -> None:
    """A server that accepts but never answers (SIGSTOP) gives a StoreError, not a hang."""
    with SyncSessionService(f"{own_server.url}?prefix=f&timeout=0.5") as svc:
        s = svc.create_session(app_name=APP, user_id=USER, session_id="s")
        own_server.pause()
        try:
            with pytest.raises(StoreError, match="did not answer in time"):
                svc.append_event(s, ev(delta={"k": 1}))

            async def append() -> None:
                await SessionService(svc.store).append_event(s, ev(delta={"k": 2}))

            with pytest.raises(StoreError):
                asyncio.run(append())
        finally:
            own_server.resume()
        # The append may have landed before the timeout: a retry of the same event is safe.
        got = svc.get_session(app_name=APP, user_id=USER, session_id="s")
        assert got is not None and len(got.events) <= 2


def test_a_page_reads_only_the_records_it_returns(redis_server: RedisServer) -> None:
    """A listing page reads the users' indexes and its own records, not every session's."""
    uri = f"{redis_server.url}?prefix=r{uuid.uuid4().hex}"
    client = redis.Redis(port=redis_server.port)
    try:
        with SyncSessionService(uri) as svc:
            for n in range(30):
                svc.create_session(app_name=APP, user_id=f"u{n % 3}", session_id=f"s{n:02d}")
            for user in (None, "u1"):
                cursor = None
                for _ in range(2):
                    client.config_resetstat()
                    page = svc.list_sessions(app_name=APP, user_id=user, limit=4, cursor=cursor)
                    stats = client.info("commandstats")
                    assert len(page.sessions) == 4 and page.next_cursor is not None
                    assert stats["cmdstat_hmget"]["calls"] == 4
                    cursor = page.next_cursor
    finally:
        client.close()


@pytest.mark.slow
def test_wait_for_a_replica(tmp_path: Path) -> None:
    """wait=1 returns once a replica has the write; with no replica it is a StoreError."""
    primary = RedisServer(tmp_path / "primary").start()
    replica = None
    try:
        with SyncSessionService(f"{primary.url}?prefix=w&wait=1&timeout=0.5") as svc:
            with pytest.raises(StoreError, match="0 of 1 replicas"):
                svc.create_session(app_name=APP, user_id=USER, session_id="alone")
            replica = RedisServer(
                tmp_path / "replica", "--replicaof", "127.0.0.1", str(primary.port)
            ).start()
            deadline = time.monotonic() + 20
            while "master_link_status:up" not in replica.cli("INFO", "replication"):
                assert time.monotonic() < deadline, "the replica did not connect"
                time.sleep(0.1)
        # A roomier timeout here: WAIT waits half of it, and a loaded machine
        # may take longer than the 250 ms above to pass a write on.
        with SyncSessionService(f"{primary.url}?prefix=w&wait=1&timeout=10") as svc:
            s = svc.create_session(app_name=APP, user_id=USER, session_id="s")
            svc.append_event(s, ev(delta={"k": 1}))
        with SyncSessionService(f"redis://127.0.0.1:{replica.port}/0?prefix=w") as on_replica:
            got = on_replica.get_session(app_name=APP, user_id=USER, session_id="s")
            assert got is not None and got.state == {"k": 1}
    finally:
        if replica is not None:
            replica.stop()
        primary.stop()


# -- replay and bench ------------------------------------------------------


def test_replay_of_the_sample_trace_verifies_on_redis(uri: str) -> None:
    """The replay command runs a trace on a Redis store and verifies every state."""
    from sessionscope.cli import main

    assert main(["replay", "sample", "--store", uri, "--no-progress"]) == 0


def test_bench_replays_on_given_stores_under_its_own_prefixes(server: Any, tmp_path: Path) -> None:
    """bench --store adds the store (plain and bulk), each under a fresh prefix, dropped after."""
    from sessionscope.bench import job as bench

    targets = bench._targets(tmp_path, False, {}, (server.url,))
    scoped = [uri for uri, _ in targets if uri.startswith(server.url)]
    assert len(scoped) == 2 and len(set(scoped)) == 2
    assert all("prefix=sessionscope-bench-" in uri for uri in scoped)
    for uri in scoped:
        with SyncSessionService(uri) as svc:
            svc.create_session(app_name=APP, user_id=USER, session_id="s")
    bench._drop_scoped_stores(targets)
    for uri in scoped:
        assert keys_of(server, prefix_of(uri)) == set()


def test_delete_user_and_app_leave_no_key_behind(server: Any, uri: str) -> None:
    """After delete_app, a scan of the keyspace finds nothing of the app's users or sessions."""
    prefix = prefix_of(uri)
    with SyncSessionService(uri) as svc:
        before = keys_of(server, prefix)
        made = {}
        for user in ("u1", "u2"):
            s = svc.create_session(app_name=APP, user_id=user, state={"app:a": 1, "user:u": 1})
            svc.append_event(s, ev(delta={"k": 1, "app:a": 2, "user:u": 2}))
            made[user] = s.id
        # A truncated session has a positions set too: it must go as well.
        assert svc.store.truncate_events(APP, "u1", made["u1"], None, 0).result() == 1
        assert svc.store.delete_app(APP).result() == 2
        left = keys_of(server, prefix) - before
        assert left == {(prefix + ":apps").encode()} or left == set()
        assert svc.store.list_apps() == []


@pytest.mark.slow
def test_rediss_speaks_tls_to_a_tls_only_server(tmp_path: Path) -> None:
    """rediss:// with a CA file reaches a server that only speaks TLS; plain redis:// cannot."""
    import shutil
    import subprocess

    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to make the test certificate")
    directory = tmp_path / "tls"
    directory.mkdir()
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(directory / "key.pem"), "-out", str(directory / "cert.pem"),
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    server = RedisServer(directory / "data")
    port = server.port
    server.options = (
        "--port", "0", "--tls-port", str(port),
        "--tls-cert-file", str(directory / "cert.pem"),
        "--tls-key-file", str(directory / "key.pem"),
        "--tls-ca-cert-file", str(directory / "cert.pem"),
        "--tls-auth-clients", "no",
    )  # fmt: skip
    # The server answers only over TLS: redis-cli's plain PING cannot see it start.
    server.cli = lambda *args, check=True: subprocess.run(  # type: ignore[method-assign]
        ["redis-cli", "--tls", "--cacert", str(directory / "cert.pem"), "-p", str(port), *args],
        capture_output=True, timeout=30, check=False,
    ).stdout.decode().strip()  # fmt: skip
    server.start()
    try:
        uri = f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={directory / 'cert.pem'}&prefix=tls"
        with SyncSessionService(uri) as svc:
            s = svc.create_session(app_name=APP, user_id=USER, session_id="s")
            svc.append_event(s, ev(delta={"k": 1}))
            assert svc.store.uri.startswith("rediss://")
            with SyncSessionService(svc.store.uri) as again:
                got = again.get_session(app_name=APP, user_id=USER, session_id="s")
                assert got is not None and got.state == {"k": 1}
        with pytest.raises(StoreError):
            open_store(f"redis://127.0.0.1:{port}/0?prefix=tls&timeout=1")
        with pytest.raises(ValueError, match="needs a rediss://"):
            open_store(f"redis://127.0.0.1:{port}/0?ssl_ca_certs=x")
    finally:
        server.stop()


def test_connections_pack_in_c_through_redis_py_public_arguments(redis_server: Any) -> None:
    """Sync and asyncio clients pack with hiredis, given so at creation; they work end to end."""
    import redis.asyncio

    from sessionscope.stores.redis import client as redis_client

    uri = f"{redis_server.url}?prefix=r{uuid.uuid4().hex}"
    store = open_store(uri)
    try:
        sync_pool = store._new_client(asynchronous=False).connection_pool
        assert isinstance(sync_pool.connection_kwargs["command_packer"], redis_client._CPacker)
        svc = SyncSessionService(store)
        session = svc.create_session(app_name=APP, user_id=USER)
        svc.append_event(session, ev(delta={"a": 1}))

        async def scenario() -> None:
            client = store._new_client(asynchronous=True)
            try:
                cls = client.connection_pool.connection_class
                assert issubclass(cls, redis_client._HiredisPacking)
                assert issubclass(cls, redis.asyncio.Connection)
                assert await client.ping()
            finally:
                await client.aclose()
            service = SessionService(store)
            got = await service.get_session(app_name=APP, user_id=USER, session_id=session.id)
            assert got is not None and got.state == {"a": 1}

        asyncio.run(scenario())
    finally:
        store.close()
    # The URL's own connection class (Unix socket, TLS) is the one made to pack in C.
    for url, base in (
        ("unix:///nowhere/redis.sock", redis.asyncio.UnixDomainSocketConnection),
        ("rediss://localhost:1", redis.asyncio.SSLConnection),
    ):
        cls = redis_client._async_pool(url, {"protocol": 2}).connection_class
        assert issubclass(cls, base) and issubclass(cls, redis_client._HiredisPacking)


def _protocol_methods(protocol: type) -> dict[str, Any]:
    return {
        name: member
        for name, member in vars(protocol).items()
        if callable(member) and not name.startswith("_")
    }


def test_both_faces_offer_every_store_operation_as_the_protocol_words_it() -> None:
    """The derived faces: each protocol method, its parameters, its kind and a docstring."""
    import inspect

    from sessionscope.stores.protocol import AsyncStore, Store
    from sessionscope.stores.redis.store import _AsyncRedisStore

    for protocol, face in ((Store, RedisStore), (AsyncStore, _AsyncRedisStore)):
        for name, wanted in _protocol_methods(protocol).items():
            ours = getattr(face, name)
            assert ours.__doc__, (face, name)
            assert list(inspect.signature(ours).parameters) == list(
                inspect.signature(wanted).parameters
            ), (face, name)
            if inspect.iscoroutinefunction(wanted):
                assert inspect.iscoroutinefunction(ours), (face, name)
    # The methods beside the protocol say what they are for.
    for name in ("append_many_reading", "noop", "destroy"):
        assert "Not part of the Store protocol" in (getattr(RedisStore, name).__doc__ or "")


def test_plans_leave_what_differs_on_a_cluster_to_the_topology() -> None:
    """No plan tests for a cluster itself: ``cluster.py`` holds every difference."""
    from sessionscope.stores.redis import append, retention, sessions

    for module in (sessions, append, retention):
        source = Path(module.__file__ or "").read_text()
        assert "self.cluster" not in source and "settings.cluster" not in source, module


def test_importing_the_redis_package_imports_no_redis_py() -> None:
    """redis-py is an extra: the package loads it only when a name of it is used."""
    import subprocess
    import sys

    code = (
        "import sys, sessionscope.stores.redis as r\n"
        "assert 'redis' not in sys.modules, 'imported early'\n"
        "assert r.LIBRARY == 'sessionscope_8' and r.FORMAT_VERSION >= 1\n"
        "assert 'redis' in sys.modules and r.RedisStore.__name__ == 'RedisStore'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_restoring_over_a_session_being_appended_to_is_a_clear_answer(
    svc: SyncSessionService, uri: str
) -> None:
    """restore_session reads the stored session in several round trips; writes between them.

    Each answer is one of restore_session's own: skipped as equal, or
    AlreadyExistsError for other content. A copy read across an append
    used to pair events with the wrong number of times (a ValueError).
    """
    from sessionscope.admin.dump import read_copy
    from sessionscope.errors import AlreadyExistsError

    session = svc.create_session(app_name="a", user_id="u", session_id="s")
    for n in range(20):
        svc.append_event(session, _stores.ev(delta={"n": n}))
    copy = read_copy(svc.store, "a", "u", "s")
    assert copy is not None
    assert svc.store.restore_session(copy).result() is False
    done = threading.Event()

    def append() -> None:
        with SyncSessionService(uri) as other:
            live = other.get_session(app_name="a", user_id="u", session_id="s")
            assert live is not None
            for n in range(400):
                if done.is_set():
                    break
                other.append_event_locked(live, _stores.ev(delta={"n": n}))

    writer = threading.Thread(target=append)
    writer.start()
    answers: set[str] = set()
    try:
        for _ in range(200):
            try:
                answers.add(str(svc.store.restore_session(copy).result()))
            except AlreadyExistsError:
                answers.add("conflict")
            if not writer.is_alive():
                break
    finally:
        done.set()
        writer.join(60)
    assert answers <= {"False", "conflict"} and "conflict" in answers


@pytest.mark.parametrize("scope", ["user", "app"])
def test_sessions_created_during_a_delete_stay_listed_and_deletable(
    svc: SyncSessionService, uri: str, scope: str
) -> None:
    """delete_user and delete_app remove whole sessions; one created meanwhile stays whole.

    They used to delete the user's index (and the app's directory) at the
    end, whatever it held by then: sessions created during the call were
    stored but listed nowhere, and no later delete or expiry found them.
    """
    for n in range(600):
        svc.create_session(app_name="app", user_id="bob", session_id=f"old{n}")
    started, done = threading.Event(), threading.Event()
    created: list[str] = []

    def create() -> None:
        with SyncSessionService(uri) as other:
            for n in range(3000):
                if done.is_set():
                    break
                user = "bob" if scope == "user" or n % 2 else f"new{n}"
                other.create_session(app_name="app", user_id=user, session_id=f"c{n}")
                created.append(f"{user}/c{n}")
                started.set()

    creator = threading.Thread(target=create)
    creator.start()
    try:
        assert started.wait(60)
        if scope == "user":
            svc.delete_user(app_name="app", user_id="bob")
        else:
            svc.delete_app(app_name="app")
    finally:
        done.set()
        creator.join(120)
    stored = set()
    for name in [f"bob/old{n}" for n in range(600)] + created:
        user, sid = name.split("/")
        if svc.get_session(app_name="app", user_id=user, session_id=sid) is not None:
            stored.add(name)
    assert created and stored  # the creator went on after the delete
    listed = {f"{m.user_id}/{m.id}" for m in svc.list_sessions(app_name="app").sessions}
    assert listed == stored
    assert "app" in svc.store.list_apps()
    # What stayed is removed as any session is.
    if scope == "user":
        assert svc.delete_user(app_name="app", user_id="bob") == len(stored)
    else:
        assert svc.delete_app(app_name="app") == len(stored)
    assert svc.list_sessions(app_name="app").sessions == []
    assert "app" not in svc.store.list_apps()
