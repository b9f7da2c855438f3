"""A Redis bulk append that meets an error part-way reports exactly what it stored.

A batch's calls (about 1,000 events each) are pipelined. The server may
refuse one of them (out of memory, with ``maxmemory-policy noeviction``) or
not find the function library (another client ran ``FUNCTION FLUSH``).
Whatever it answers, what is stored is a prefix of the batch, in order; the
batch result, and the live sessions, hold exactly that; and a retry
completes the batch once. These tests run on a server (and a cluster) of
their own, whose memory limit they move.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import redis

import _stores
from _redis import RedisCluster, RedisServer, have_redis
from _stores import APP, USER, ev, event_ids
from sessionscope import Event, SyncSessionService
from sessionscope.errors import StoreError
from sessionscope.service._append import encode_event
from sessionscope.stores import open_store
from sessionscope.stores.records import AppendBatch, AppendRequest, BatchResult
from sessionscope.stores.redis import RedisStore

# An event whose record takes about 4 KB: a call of 1,000 of them needs
# about 4 MB of the server's memory just to arrive.
BIG = {"parts": [{"text": "x" * 4000}]}
# The room left on each node before a batch: more than a call of 1,000
# small events takes, less than a call of 1,000 big ones.
ROOM = 2_000_000


@pytest.fixture(scope="module", params=_stores.REDIS_KINDS)
def own(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A server, or a cluster, of this module's own: it refuses writes when full."""
    if not have_redis():
        pytest.fail("redis-server and redis-cli are needed: apt-get install redis-server")
    directory: Path = tmp_path_factory.mktemp(request.param)
    started: Any = (
        RedisServer(directory).start()
        if request.param == "redis"
        else RedisCluster(directory).start()
    )
    try:
        for node in nodes(started):
            node.cli("CONFIG", "SET", "maxmemory-policy", "noeviction")
        yield started
    finally:
        started.stop()


@pytest.fixture
def server(own: Any) -> Iterator[Any]:
    """The module's server (or cluster), its memory limit lifted after the test."""
    yield own
    unlimited(own)


def nodes(server: Any) -> list[RedisServer]:
    return list(server.servers) if isinstance(server, RedisCluster) else [server]


def leave_room(server: Any, room: int) -> None:
    """Let every node take ``room`` more bytes, then refuse writes."""
    for node in nodes(server):
        info = dict(
            line.split(":", 1) for line in node.cli("INFO", "memory").splitlines() if ":" in line
        )
        node.cli("CONFIG", "SET", "maxmemory", str(int(info["used_memory"]) + room))


def unlimited(server: Any) -> None:
    for node in nodes(server):
        node.cli("CONFIG", "SET", "maxmemory", "0")


def new_uri(server: Any) -> str:
    return f"{server.url}?prefix=b{uuid.uuid4().hex}"


def three_calls() -> list[Event]:
    """A batch of one session in three calls: 1,000 small events, 1,000 big ones, 500 small.

    With ROOM left, the first call lands, the second is refused for want
    of memory, and the third, small again, would fit: it must not land.
    """
    return (
        [ev(delta={"n": i}) for i in range(1000)]
        + [ev(delta={"n": i}, content=BIG) for i in range(1000, 2000)]
        + [ev(delta={"n": i}) for i in range(2000, 2500)]
    )


def request(session_id: str, event: Event) -> AppendRequest:
    return AppendRequest(APP, USER, session_id, event.id, event.timestamp, encode_event(event))


def check_out_of_memory(error: BaseException | None) -> None:
    assert isinstance(error, StoreError)
    assert "out of memory" in str(error)
    assert error.hint is not None and "maxmemory" in error.hint


# -- out of memory part-way ---------------------------------------------------


def test_a_batch_refused_for_memory_part_way_stores_and_reports_a_prefix(server: Any) -> None:
    """The live session takes exactly what landed; no call after the refused one lands."""
    events = three_calls()
    with SyncSessionService(new_uri(server)) as svc:
        s = svc.create_session(app_name=APP, user_id=USER, session_id="s")
        leave_room(server, ROOM)
        with pytest.raises(StoreError) as raised:
            svc.append_many([(s, e) for e in events])
        check_out_of_memory(raised.value)
        # The error says how far the batch got: the first call's 1,000 events.
        assert raised.value.stored == 1000  # type: ignore[attr-defined]

        stored = svc.get_session(app_name=APP, user_id=USER, session_id="s")
        assert stored is not None
        # The first call landed; the big one was refused, and the small one
        # after it, though it would have fitted, appended nothing: no hole.
        assert event_ids(stored) == [e.id for e in events[:1000]]
        assert stored.state == {"n": 999}
        assert event_ids(s) == event_ids(stored)
        assert s.state == stored.state and s.revision == stored.revision

        # The retry, once the server has room, stores the rest once.
        unlimited(server)
        svc.append_many([(s, e) for e in events])
        stored = svc.get_session(app_name=APP, user_id=USER, session_id="s")
        assert stored is not None
        assert event_ids(stored) == [e.id for e in events]
        assert stored.state == {"n": 2499}
        assert event_ids(s) == event_ids(stored) and s.revision == stored.revision
        # The live copy is current: a plain append from it is not stale.
        svc.append_event(s, ev(delta={"n": -1}))


def test_batches_until_the_server_is_full_each_store_a_prefix(server: Any) -> None:
    """Batches interleaving sessions, sent until memory runs out: stored and live agree."""
    with SyncSessionService(new_uri(server)) as svc:
        sessions = [
            svc.create_session(app_name=APP, user_id=USER, session_id=f"s{i}") for i in range(3)
        ]
        sent: list[tuple[Any, Event]] = []
        leave_room(server, 4 * ROOM)
        error: StoreError | None = None
        for round_ in range(100):
            batch = [
                (sessions[i % 3], ev(delta={"n": round_ * 3000 + i}, content=BIG))
                for i in range(3000)
            ]
            sent += batch
            try:
                svc.append_many(batch)
            except StoreError as raised:
                error = raised
                break
        check_out_of_memory(error)
        stored = [svc.get_session(app_name=APP, user_id=USER, session_id=f"s{i}") for i in range(3)]
        for live, got in zip(sessions, stored, strict=True):
            assert got is not None
            ours = [e.id for s, e in sent if s is live]
            assert event_ids(got) == ours[: len(got.events)]
            assert event_ids(live) == event_ids(got) and live.revision == got.revision
            assert live.state == got.state
        # The events stored are a prefix of everything sent, across the sessions.
        count = sum(len(got.events) for got in stored if got is not None)
        landed = {e.id for got in stored if got is not None for e in got.events}
        assert landed == {e.id for _, e in sent[:count]}

        unlimited(server)
        failed = sent[-3000:]
        svc.append_many(failed)
        for i, live in enumerate(sessions):
            got = svc.get_session(app_name=APP, user_id=USER, session_id=f"s{i}")
            assert got is not None
            assert event_ids(got) == [e.id for s, e in sent if s is live]
            assert event_ids(live) == event_ids(got) and live.revision == got.revision
            assert got.state == {"n": sent[-3 + i][1].actions.state_delta["n"]}


def test_the_async_face_reports_what_it_stored_when_memory_runs_out(server: Any) -> None:
    """``aio.append_many``: the batch result counts what landed; the retry counts repeats."""
    events = three_calls()
    store = open_store(new_uri(server))
    assert isinstance(store, RedisStore)
    try:
        store.create_session(APP, USER, "s", 1000.0, [], [], []).result()
        batch = AppendBatch.of(request("s", e) for e in events)

        async def send_twice() -> tuple[BatchResult, Any, BatchResult, Any]:
            leave_room(server, ROOM)
            first = await store.aio.append_many(batch)
            between = await store.aio.load_session(APP, USER, "s", None, None)
            unlimited(server)
            again = await store.aio.append_many(batch)
            after = await store.aio.load_session(APP, USER, "s", None, None)
            await store.aio.close()
            return first, between, again, after

        first, between, again, after = _stores.run(send_twice())
    finally:
        store.close()
    check_out_of_memory(first.error)
    assert first.applied == 1000 and first.repeats == []
    assert between is not None and between.events == [encode_event(e) for e in events[:1000]]
    assert first.markers == [between.record.marker]
    assert again.error is None and again.applied == 2500 and again.repeats == list(range(1000))
    assert after is not None and after.events == [encode_event(e) for e in events]
    assert again.markers == [after.record.marker]


# -- the function library flushed while batches are sent -----------------------


class Flusher:
    """Another client that runs FUNCTION FLUSH again and again while batches are sent.

    After half of its flushes it loads the library again itself (as
    another sessionscope process would), so that the calls of a pipeline
    may find it gone and then back. After each it waits until the library
    is back and an append call has run since (the server's count of FCALLs
    that succeeded grew), then a few milliseconds: the batches make
    progress between two flushes, and most flushes land in a pipeline.
    """

    def __init__(self, server: Any) -> None:
        self.clients = [redis.Redis(port=node.port) for node in nodes(server)]
        self.code = (
            resources.files("sessionscope.stores.redis").joinpath("functions.lua").read_text()
        )
        self.flushes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def flush(self) -> None:
        for client in self.clients:
            client.execute_command("FUNCTION", "FLUSH")
        self.flushes += 1

    def _calls_run(self) -> int:
        """Return how many FCALLs the servers ran without an error reply."""
        total = 0
        for client in self.clients:
            stats = client.info("commandstats").get("cmdstat_fcall", {})
            total += stats.get("calls", 0) - stats.get("failed_calls", 0)
        return total

    def _moved_on(self, since: int) -> bool:
        loaded = all(client.execute_command("FUNCTION", "LIST") for client in self.clients)
        return loaded and self._calls_run() > since

    def _run(self) -> None:
        while not self._stop.is_set():
            self.flush()
            since = self._calls_run()
            time.sleep(0.002)
            if self.flushes % 2:
                for client in self.clients:
                    client.execute_command("FUNCTION", "LOAD", "REPLACE", self.code)
            while not self._stop.is_set() and not self._moved_on(since):
                time.sleep(0.001)
            time.sleep(0.005)

    def __enter__(self) -> Flusher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        for client in self.clients:
            client.close()


def test_function_flush_while_batches_are_sent_stores_each_event_once_in_order(
    server: Any,
) -> None:
    """Calls that found no library are sent again, and only they: complete, in order, once."""
    with SyncSessionService(new_uri(server)) as svc:
        sessions = [
            svc.create_session(app_name=APP, user_id=f"user{i}", session_id="s") for i in range(2)
        ]
        sent: list[tuple[Any, Event]] = []

        def send(round_: int) -> None:
            # Three calls of each user's session (one pipeline per user on a cluster).
            batch = [
                (live, ev(delta={"n": round_ * 3000 + i})) for live in sessions for i in range(3000)
            ]
            sent.extend(batch)
            svc.append_many(batch)

        flusher = Flusher(server)
        flusher.flush()  # the first call of the first batch finds no library
        send(0)
        with flusher:
            for round_ in range(1, 6):
                send(round_)
        assert flusher.flushes > 2
        for i, live in enumerate(sessions):
            got = svc.get_session(app_name=APP, user_id=f"user{i}", session_id="s")
            assert got is not None
            assert event_ids(got) == [e.id for s, e in sent if s is live]
            assert event_ids(live) == event_ids(got) and live.revision == got.revision
            assert got.state == live.state == {"n": 5 * 3000 + 2999}


def test_function_flush_while_the_async_face_sends_batches(server: Any) -> None:
    """The async face sends again only what did not run: every batch lands whole, once."""
    store = open_store(new_uri(server))
    assert isinstance(store, RedisStore)
    batches: list[list[Event]] = [[ev(delta={"n": i}) for i in range(2500)] for _ in range(6)]
    try:
        store.create_session(APP, USER, "s", 1000.0, [], [], []).result()

        async def send_all() -> tuple[list[BatchResult], Any]:
            results = []
            for events in batches:
                batch = AppendBatch.of(request("s", e) for e in events)
                results.append(await store.aio.append_many(batch))
            loaded = await store.aio.load_session(APP, USER, "s", None, None)
            await store.aio.close()
            return results, loaded

        flusher = Flusher(server)
        flusher.flush()
        with flusher:
            results, loaded = _stores.run(send_all())
        assert flusher.flushes > 2
    finally:
        store.close()
    assert [r.error for r in results] == [None] * len(batches)
    assert all(r.applied == 2500 and r.repeats == [] for r in results)
    assert loaded is not None
    assert loaded.events == [encode_event(e) for events in batches for e in events]
    number = loaded.record.marker.partition(":")[0]
    assert [r.markers for r in results] == [[f"{number}:{2500 * k}"] for k in range(1, 7)]


# -- a pipeline sent again after its reply was lost ----------------------------


class ReplyDroppingProxy:
    """A loopback TCP proxy in front of a server that can lose one reply on the way back.

    Armed, the next connection to get a reply from the server has its client
    side closed instead (the server's side stays open and is drained, so the
    server runs every command it was sent): a network that drops a reply after
    the server acted on the request. redis-py then sends the pipeline again on
    a new connection, as after any lost connection.
    """

    def __init__(self, port: int) -> None:
        self.upstream = ("127.0.0.1", port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"redis://127.0.0.1:{self.listener.getsockname()[1]}/0"
        self.armed = threading.Event()
        self.dropped = threading.Event()
        self.closing = False
        self.sockets: list[socket.socket] = []
        self.threads: list[threading.Thread] = []
        accepting = threading.Thread(target=self._accept, daemon=True)
        accepting.start()
        self.threads.append(accepting)

    def _accept(self) -> None:
        while not self.closing:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream, timeout=30)
            self.sockets += [client, server]
            for args in ((client, server, False), (server, client, True)):
                thread = threading.Thread(target=self._pipe, args=args, daemon=True)
                thread.start()
                self.threads.append(thread)

    def _pipe(self, source: socket.socket, sink: socket.socket, replies: bool) -> None:
        forwarding = True
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                if replies and forwarding and self.armed.is_set():
                    self.armed.clear()
                    forwarding = False
                    # The reply is lost; the server's side is drained. shutdown,
                    # not close: the other direction's thread still reads the socket.
                    sink.shutdown(socket.SHUT_RDWR)
                    self.dropped.set()
                if forwarding:
                    sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.closing = True
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
        self.listener.close()
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        for thread in self.threads:
            thread.join(timeout=10)
        for sock in self.sockets:
            sock.close()


def test_a_batch_sent_again_after_a_lost_reply_answers_as_it_first_did(tmp_path: Path) -> None:
    """Calls that ran before the connection was lost answer their first reply when sent again.

    The server runs a batch of three calls, and the reply is lost on the way
    back: redis-py sends the pipeline again on a new connection. The second
    time each call answers from the batch's guard, so the batch reports every
    event appended (none a repeat) and the live session takes them all.
    """
    local = RedisServer(tmp_path / "server").start()
    proxy = ReplyDroppingProxy(local.port)
    try:
        events = [ev(delta={"n": i}) for i in range(2500)]
        with SyncSessionService(RedisStore(proxy.url, timeout=10.0)) as svc:
            s = svc.create_session(app_name=APP, user_id=USER, session_id="s")
            proxy.armed.set()
            svc.append_many([(s, e) for e in events])
            assert proxy.dropped.is_set()
            stored = svc.get_session(app_name=APP, user_id=USER, session_id="s")
            assert stored is not None
            assert event_ids(stored) == [e.id for e in events]
            assert event_ids(s) == event_ids(stored) and s.revision == stored.revision
        # The pipeline was sent twice: more calls ran than the create and the three appends.
        stats = local.cli("INFO", "commandstats")
        calls = int(stats.partition("cmdstat_fcall:calls=")[2].partition(",")[0])
        assert calls > 4
    finally:
        proxy.close()
        local.stop()


def test_reads_placed_in_batches_answer_their_place_while_the_library_is_flushed(
    server: Any,
) -> None:
    """``append_many_reading``: a call sent again after a reload answers its reads in place."""
    store = open_store(new_uri(server))
    assert isinstance(store, RedisStore)
    try:
        store.create_session(APP, USER, "s", 1000.0, [], [], []).result()
        sent: list[Event] = []
        with Flusher(server) as flusher:
            for _ in range(6):
                events = [ev(delta={"n": i}) for i in range(2500)]
                batch = AppendBatch.of(request("s", e) for e in events)
                # A read after every 400 events: each answers the events before it.
                places = list(range(0, 2501, 400))
                reads = [(p, APP, USER, "s", None, None) for p in places]
                result, loaded = store.append_many_reading(batch, reads)
                assert result.error is None and result.applied == 2500 and result.repeats == []
                assert len(loaded) == len(places)
                for place, answer in zip(places, loaded, strict=True):
                    assert answer is not None
                    assert answer.events == [encode_event(e) for e in sent + events[:place]]
                sent += events
        assert flusher.flushes > 2
        stored = store.load_session(APP, USER, "s", None, None)
        assert stored is not None and stored.events == [encode_event(e) for e in sent]
    finally:
        store.close()


def test_reads_in_a_batch_sent_again_after_a_lost_reply_are_not_answered_wrong(
    tmp_path: Path,
) -> None:
    """A read in a call that ran before the resend is reported lost, not answered late.

    Its answer is not kept in the batch's guard; answered again it would see
    the events after its place. The batch reports every event stored, and an
    error for the reads it cannot answer.
    """
    local = RedisServer(tmp_path / "server").start()
    proxy = ReplyDroppingProxy(local.port)
    try:
        store = RedisStore(proxy.url, timeout=10.0)
        try:
            store.create_session(APP, USER, "s", 1000.0, [], [], []).result()
            events = [ev(delta={"n": i}) for i in range(2500)]
            batch = AppendBatch.of(request("s", e) for e in events)
            reads = [(p, APP, USER, "s", None, None) for p in (500, 1500, 2500)]
            proxy.armed.set()
            result, loaded = store.append_many_reading(batch, reads)
            assert proxy.dropped.is_set()
            stored = store.load_session(APP, USER, "s", None, None)
        finally:
            store.close()
        assert stored is not None and stored.events == [encode_event(e) for e in events]
        assert result.applied == 2500 and result.repeats == []
        assert isinstance(result.error, StoreError) and "lost" in str(result.error)
        # What was answered answers its place.
        for (place, *_), answer in zip(reads, loaded, strict=False):
            assert answer is not None
            assert answer.events == [encode_event(e) for e in events[:place]]
    finally:
        proxy.close()
        local.stop()
