"""The store commands run in memory that does not grow with the store.

Each command runs as a real process on a store built here, and again on a
store ten times larger (ten times the sessions, and one session with ten
times the events); its peak memory may differ by a small fixed bound only.

Memory is the process's anonymous memory (``RssAnon`` in ``/proc``: its
heap), sampled while the command runs, not ``ru_maxrss``: the resident set
also counts the pages of the LMDB map a read touched, which any read of a
whole store touches, although they are the file's cached pages and not
memory the process holds.

Run as a script, this module is that child: ``python test_cli_streaming.py
ARGS...`` runs ``sessionscope ARGS...`` and prints its peak in KiB.
"""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from _redis import RedisServer

# How much more memory a command may take on the larger store.
BOUND_KIB = 8 * 1024
START = 1_700_000_000.0


def _anon_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    raise AssertionError("no RssAnon in /proc/self/status")


def _measure(argv: list[str]) -> None:
    """Run the command line in this process and print the peak of its anonymous memory."""
    peak = _anon_kib()
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.wait(0.002):
            peak = max(peak, _anon_kib())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    from sessionscope.cli import main

    with contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    done.set()
    sampler.join()
    print(code, max(peak, _anon_kib()))


def build(path: Path, sessions: int, events: int) -> None:
    """Write ``sessions`` sessions of two events under 100 users, and one of ``events``."""
    from sessionscope import LmdbStore
    from sessionscope.codec import pack_event
    from sessionscope.stores.records import EventCopy, SessionCopy, event_copy

    def event(sid: str, i: int) -> EventCopy:
        record = {
            "id": f"{sid}-{i}",
            "timestamp": START + i,
            "author": "agent",
            "content": {"parts": [{"text": "x" * 150}]},
            "actions": {"state_delta": {}},
        }
        return event_copy(pack_event(record))

    store = LmdbStore(path, durability="deferred", map_size=256 << 20)
    try:
        for k in range(sessions):
            sid = f"s{k}"
            pair = [event(sid, 0), event(sid, 1)]
            copy = SessionCopy("app", f"u{k % 100}", sid, START + k, START + k + 1, [], pair)
            store.restore_session(copy).result()
        big = [event("big", i) for i in range(events)]
        store.restore_session(
            SessionCopy("app", "big", "big", START, START + events, [], big)
        ).result()
        store.flush().result()
    finally:
        store.close()


def peak_kib(*args: str) -> int:
    from _stores import child_env

    done = subprocess.run(
        [sys.executable, __file__, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=child_env(),
        check=False,
    )
    code, peak = done.stdout.split()
    assert code == "0", done.stderr
    return int(peak)


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("streaming")
    small, large = root / "small", root / "large"
    build(small, 2_000, 10_000)
    build(large, 20_000, 100_000)
    return small, large


@pytest.mark.slow
@pytest.mark.parametrize(
    "command",
    [
        ["ls"],
        ["ls", "--app", "app"],
        ["ls", "--app", "app", "--user", "big"],
        ["stats"],
        ["verify"],
        ["export"],
    ],
    ids=" ".join,
)
def test_memory_does_not_grow_with_the_store(
    stores: tuple[Path, Path], tmp_path: Path, command: list[str]
) -> None:
    peaks = []
    for store in stores:
        args = [command[0], f"lmdb://{store}", *command[1:]]
        if command[0] == "export":
            args.append(str(tmp_path / f"{store.name}.dump"))
        peaks.append(peak_kib(*args))
    small, large = peaks
    assert large - small < BOUND_KIB, f"{command}: {small} KiB, then {large} KiB"


@pytest.mark.parametrize("kind", ["lmdb", "memory", "redis", "redis-cluster"])
def test_event_pages_read_every_stored_event_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest, kind: str
) -> None:
    """Pages of 3 over a session with gaps (a truncation by time) give what one read gives."""
    from sessionscope import Event, SyncSessionService, open_store
    from sessionscope.admin import ops

    monkeypatch.setattr(ops, "EVENT_PAGE", 3)
    if kind.startswith("redis"):
        server = request.getfixturevalue("redis_server" if kind == "redis" else "redis_cluster")
        uri = f"{server.url}?prefix=p{uuid.uuid4().hex}"
    else:
        uri = f"lmdb://{tmp_path / 'store'}" if kind == "lmdb" else "memory://"
    with SyncSessionService(open_store(uri)) as svc:
        session = svc.create_session(app_name="app", user_id="u", session_id="s")
        # Times out of order: a truncation by time leaves gaps in the positions.
        for i, stamp in enumerate([5, 1, 6, 2, 7, 3, 8, 4, 9, 10, 11]):
            svc.append_event(session, Event(author="a", timestamp=START + stamp, id=f"e{i}"))
        svc.truncate_events(app_name="app", user_id="u", session_id="s", before=START + 5)
        store = svc.store
        whole = store.load_session("app", "u", "s", None, None)
        assert whole is not None
        assert 0 < len(whole.events) < 11
        pages = list(ops.event_pages(store, whole.record))
        assert all(len(page) <= 3 for page in pages)
        assert [event for page in pages for event in page] == whole.events
        # Positions come with the events, the gaps skipped; past the end, none.
        page = store.read_events("app", "u", "s", 0, 100)
        assert page is not None
        positions = [position for position, _ in page[1]]
        assert positions == sorted(positions)
        assert len(positions) == len(whole.events) < positions[-1] + 1
        assert store.read_events("app", "u", "s", positions[-1] + 1, 100) == (whole.record, [])
        assert store.read_events("app", "u", "nope", 0, 100) is None
        # A session appended to alone: the positions are all of them.
        other = svc.create_session(app_name="app", user_id="u", session_id="t")
        for i in range(4):
            svc.append_event(other, Event(author="a", timestamp=START + i, id=f"t{i}"))
        read = store.read_events("app", "u", "t", 1, 2)
        assert read is not None
        assert [position for position, _ in read[1]] == [1, 2]


def test_the_paged_commands_agree_on_every_store(tmp_path: Path, redis_server: RedisServer) -> None:
    """ls, stats, verify and export read the same figures a page at a time on each store."""
    from _stores import child_json
    from sessionscope import Event, EventActions, SyncSessionService, open_store

    uris = [f"lmdb://{tmp_path / 'store'}", f"{redis_server.url}?prefix=p{uuid.uuid4().hex}"]
    for uri in uris:
        with SyncSessionService(open_store(uri)) as svc:
            for k in range(3):
                session = svc.create_session(app_name="app", user_id="u", session_id=f"s{k}")
                for i in range(5 * k):
                    event = Event(author="a", content={"parts": [{"text": f"line {i}"}]})
                    event.actions = EventActions(state_delta={"i": i})
                    svc.append_event(session, event)
            svc.truncate_events(app_name="app", user_id="u", session_id="s2", keep_last=7)
    documents = []
    for n, uri in enumerate(uris):
        figures = []
        for args in (
            ["ls", uri, "--app", "app", "--user", "u"],
            ["stats", uri],
            ["verify", uri],
            ["export", uri, str(tmp_path / f"out{n}.dump")],
        ):
            figures.append(child_json("-m", "sessionscope", *args, "--json"))
        ls, stats, verify, export = figures
        documents.append(
            (
                [(r["session"], r["events"], r["bytes"]) for r in ls["sessions"]],
                stats["totals"]["events"],
                stats["totals"]["event_bytes"],
                (verify["clean"], verify["sessions"], verify["events"]),
                (export["sessions"], export["events"]),
            )
        )
    lmdb_figures, redis_figures = documents
    assert lmdb_figures == redis_figures
    assert lmdb_figures[1] == 0 + 5 + 7
    assert lmdb_figures[4] == (3, 12)


if __name__ == "__main__":
    _measure(sys.argv[1:])
