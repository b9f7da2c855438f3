"""The pages a deferred store's writable map writes next are read ahead, so its writes do not fault.

``stores/lmdb/warming.py`` relies on LMDB taking new pages after the last
one it used (``Environment.info()``'s ``last_pgno``). The fault count below
fails loudly should that change: the writes would fault again, as they do
in the control run without the warmer.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from _stores import APP, USER, child_json, ev
from sessionscope import LmdbStore, SyncSessionService
from sessionscope.stores import open_store
from sessionscope.stores.lmdb import path_uri

# A child that grows a fresh deferred store in rounds of about half a MiB,
# each started once the warmer has read a MiB past the last used page, and
# counts the major faults of the writes alone ("off": read_ahead=False).
_GROW_AND_COUNT = r"""
import json, resource, sys, time
from sessionscope import Event, EventActions, LmdbStore, SyncSessionService

path, mode = sys.argv[1], sys.argv[2]
store = LmdbStore(path, durability="deferred", read_ahead=mode == "on")
writer = store._writer
service = SyncSessionService(store)
session = service.create_session(app_name="app", user_id="user", session_id="s")

def used_end():
    return (writer.env.info()["last_pgno"] + 1) * writer.page_size

first = used_end()
faults = 0
for round_ in range(12):
    end = used_end()
    if mode == "on":
        deadline = time.monotonic() + 20
        while writer._warmer.warmed < end + (1 << 20) and time.monotonic() < deadline:
            time.sleep(0.002)
    events = [
        Event(author="user", content={"parts": [{"text": f"{round_}-{n} " + "w" * 2_000}]},
              actions=EventActions(state_delta={f"k{n}": n}))
        for n in range(200)
    ]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_majflt
    service.append_many([(session, event) for event in events])
    faults += resource.getrusage(resource.RUSAGE_SELF).ru_majflt - before
warmed = writer._warmer.warmed if writer._warmer is not None else 0
print(json.dumps({
    "writemap": store.writemap, "faults": faults, "pages": (used_end() - first) // writer.page_size,
    "warmed": warmed, "map_size": writer.map_size,
}))
store.close()
"""


def _grow(path: Path, mode: str) -> dict[str, int]:
    result: dict[str, int] = child_json("-c", _GROW_AND_COUNT, str(path), mode)
    return result


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting: {what}"
        time.sleep(0.002)


@pytest.mark.slow
def test_a_growing_deferred_store_writes_its_new_pages_without_major_faults(
    tmp_path: Path,
) -> None:
    warmed = _grow(tmp_path / "warmed", "on")
    control = _grow(tmp_path / "control", "off")
    assert warmed["writemap"] and control["writemap"]
    # The rounds grew the store by some MiB: each new page was written once.
    assert warmed["pages"] > 1000, warmed
    # Read ahead, but never past the map.
    assert warmed["warmed"] <= warmed["map_size"]
    # Unwarmed, a first write to each page faults where the file system makes
    # it a major fault (ext4 does, tmpfs does not). Warmed, next to none do
    # on a quiet machine (0 of 2,607 pages here); a machine busy with other
    # work may drop or delay some of what was read ahead, so the bound is a
    # fifth of the control's faults: were LMDB to place new pages elsewhere
    # than after the last used one, the warmed run would fault as the control.
    assert warmed["faults"] * 5 <= control["faults"], (warmed, control)


def test_a_store_opened_only_to_be_read_is_never_warmed(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with SyncSessionService(LmdbStore(path, durability="deferred")) as service:
        session = service.create_session(app_name=APP, user_id=USER, session_id="s")
        service.append_event(session, ev(delta={"a": 1}))
    store = LmdbStore(path, durability="deferred")
    try:
        writer = store._writer
        warmer = writer._warmer
        assert warmer is not None and store.writemap
        SyncSessionService(store).get_session(app_name=APP, user_id=USER, session_id="s")
        # The warmer looked, found nothing grown, and sleeps until a commit.
        _wait_for(lambda: writer.warmer_idle, "the warmer to sleep")
        assert warmer.warmed == 0
        # A commit that grows the store wakes it, and it reads past the new end.
        SyncSessionService(store).append_event(
            SyncSessionService(store).get_session(app_name=APP, user_id=USER, session_id="s"),
            ev(delta={"b": "x" * 50_000}),
        )
        end = (writer.env.info()["last_pgno"] + 1) * writer.page_size
        _wait_for(lambda: warmer.warmed > end, "the warmer to read past the end")
    finally:
        store.close()


def test_closing_the_store_ends_its_warmer_thread(tmp_path: Path) -> None:
    store = LmdbStore(tmp_path / "store", durability="deferred")
    warmer = store._writer._warmer
    assert warmer is not None
    thread = warmer._thread
    assert thread.is_alive() and thread.name == "sessionscope-lmdb-warmer"
    store.close()
    assert not thread.is_alive()
    assert thread not in threading.enumerate()


def test_stores_that_do_not_write_through_a_writable_map_have_no_warmer(tmp_path: Path) -> None:
    durable = LmdbStore(tmp_path / "durable", durability="sync")
    try:
        assert not durable.writemap and durable._writer._warmer is None
    finally:
        durable.close()


@pytest.mark.parametrize("how", ["keyword", "uri"])
def test_read_ahead_off_opens_a_deferred_store_without_a_warmer(tmp_path: Path, how: str) -> None:
    path = tmp_path / "store"
    if how == "keyword":
        store = LmdbStore(path, durability="deferred", read_ahead=False)
    else:
        store = open_store(f"{path_uri(path)}?durability=deferred&read_ahead=no")
    try:
        assert isinstance(store, LmdbStore)
        assert store.writemap and store._writer._warmer is None
        with SyncSessionService(store) as service:
            session = service.create_session(app_name=APP, user_id=USER, session_id="s")
            service.append_event(session, ev(delta={"a": "x" * 50_000}))
            again = service.get_session(app_name=APP, user_id=USER, session_id="s")
            assert again is not None and again.state["a"] == "x" * 50_000
    finally:
        store.close()


def test_a_read_ahead_option_that_is_not_yes_or_no_is_refused_before_anything_is_made(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store"
    with pytest.raises(ValueError, match="read_ahead"):
        open_store(f"{path_uri(path)}?durability=deferred&read_ahead=maybe")
    assert not path.exists()
