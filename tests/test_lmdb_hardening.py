"""The LMDB store refuses bad options, unsafe and damaged files, and names each failure."""

from __future__ import annotations

import asyncio
import math
import os
import threading
from pathlib import Path
from typing import Any

import lmdb
import pytest

from _stores import APP, USER, ev, snapshot_dir
from sessionscope import GetSessionConfig, LmdbStore, SyncSessionService, open_store
from sessionscope.codec import pack
from sessionscope.errors import CorruptStoreError, StoreError, UnsafeStoreError
from sessionscope.stores.lmdb import opening as lmdb_opening


def _filled_store(path: Path, events: int = 50, durability: str = "sync") -> str:
    """Create a store with one session of ``events`` events; return the session id."""
    with SyncSessionService(LmdbStore(path, durability=durability)) as svc:  # type: ignore[arg-type]
        session = svc.create_session(app_name=APP, user_id=USER, state={"k": 1})
        for i in range(events):
            svc.append_event(session, ev(delta={f"k{i}": "x" * 200}, content={"i": i}))
        return session.id


# Options (item 9)


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("flush_interval", math.inf),
        ("flush_interval", math.nan),
        ("flush_interval", 0),
        ("flush_interval", -1.0),
        ("flush_interval", threading.TIMEOUT_MAX * 2),
        ("flush_interval", True),
        ("flush_interval", "1"),
        pytest.param("flush_interval", 10**400, id="flush_interval-beyond-float"),
        ("map_size", 0),
        ("map_size", -5),
        ("map_size", 1 << 80),
        ("map_size", 1.5),
        ("max_readers", 0),
        ("max_readers", 1 << 40),
        ("max_readers", True),
        ("file_mode", 0o400),
        ("file_mode", 0o10600),
        ("durability", "fast"),
    ],
)
def test_bad_options_are_a_value_error_naming_them(tmp_path: Path, option: str, value: Any) -> None:
    path = tmp_path / "store"
    with pytest.raises(ValueError, match=option):
        LmdbStore(path, **{option: value})
    assert not path.exists()


def test_a_tiny_map_size_is_rounded_up(tmp_path: Path) -> None:
    store = LmdbStore(tmp_path / "store", map_size=1)
    try:
        with SyncSessionService(store) as svc:
            session = svc.create_session(app_name=APP, user_id=USER)
            svc.append_event(session, ev(delta={"a": "x" * 100_000}))
            again = svc.get_session(app_name=APP, user_id=USER, session_id=session.id)
            assert again is not None and len(again.events) == 1
    finally:
        store.close()


def test_a_deferred_store_with_the_largest_interval_flushes(tmp_path: Path) -> None:
    store = LmdbStore(
        tmp_path / "store", durability="deferred", flush_interval=threading.TIMEOUT_MAX
    )
    with SyncSessionService(store) as svc:
        session = svc.create_session(app_name=APP, user_id=USER)
        svc.append_event(session, ev())
        svc.flush()


# Files and directories (item 9)


@pytest.mark.parametrize("name", ["lock.mdb", "data.mdb"])
def test_a_planted_link_is_refused_and_its_target_untouched(tmp_path: Path, name: str) -> None:
    path = tmp_path / "store"
    _filled_store(path, events=1)
    target = tmp_path / "victim"
    target.write_bytes(b"precious" * 1000)
    os.replace(path / name, tmp_path / "moved")
    (path / name).symlink_to(target)
    before = snapshot_dir(tmp_path / "victim")
    with pytest.raises(UnsafeStoreError, match="symbolic link"):
        LmdbStore(path)
    assert snapshot_dir(tmp_path / "victim") == before


def test_a_directory_others_may_write_is_refused_unless_allowed(tmp_path: Path) -> None:
    path = tmp_path / "store"
    _filled_store(path, events=1)
    path.chmod(0o777)
    with pytest.raises(UnsafeStoreError, match="writable by group"):
        LmdbStore(path)
    LmdbStore(path, file_mode=0o666).close()
    LmdbStore(path, trust_directory=True).close()
    path.chmod(0o700)
    LmdbStore(path).close()


def test_verify_and_trust_directory_are_uri_options(tmp_path: Path) -> None:
    """What the keywords allow, an lmdb:// URI (adk web's --session_service_uri) allows too."""
    path = tmp_path / "store"
    _filled_store(path, events=20)
    path.chmod(0o770)
    uri = f"lmdb://{path.resolve()}"
    with pytest.raises(UnsafeStoreError, match="writable by group"):
        open_store(uri)
    with pytest.raises(ValueError, match="trust_directory"):
        open_store(f"{uri}?trust_directory=perhaps")
    open_store(f"{uri}?trust_directory=yes&verify=true").close()
    path.chmod(0o700)
    # Damage that LMDB's own reads refuse too (scrambled node pointers could
    # make them fault instead), so that both answers below can be compared.
    _unmark_the_root_page(path)
    before = snapshot_dir(path)
    # The full check runs before LMDB opens the file, so it is what refuses it.
    with pytest.raises(CorruptStoreError, match="failed verification"):
        open_store(f"{uri}?verify=1")
    with pytest.raises(CorruptStoreError, match="MDB_CORRUPTED"):
        open_store(f"{uri}?verify=no")
    assert snapshot_dir(path) == before


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory away needs root")
def test_a_directory_of_another_user_is_refused_unless_trusted(tmp_path: Path) -> None:
    path = tmp_path / "store"
    _filled_store(path, events=1)
    os.chown(path, 54321, -1)
    with pytest.raises(UnsafeStoreError, match="owned by user 54321"):
        LmdbStore(path)
    LmdbStore(path, trust_directory=True).close()


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_a_lock_file_removed_while_open_stops_writes(tmp_path: Path, how: str) -> None:
    path = tmp_path / "store"
    store = LmdbStore(path)
    try:
        svc = SyncSessionService(store)
        session = svc.create_session(app_name=APP, user_id=USER)
        svc.append_event(session, ev(delta={"a": 1}))
        (path / "lock.mdb").unlink()
        if how == "replaced":
            (path / "lock.mdb").write_bytes(b"\0" * 8192)
        with pytest.raises(UnsafeStoreError, match=r"lock\.mdb"):
            svc.append_event(session, ev(delta={"a": 2}))
        with pytest.raises(UnsafeStoreError):
            svc.create_session(app_name=APP, user_id=USER)
        # Reads still work, and nothing was written.
        again = svc.get_session(app_name=APP, user_id=USER, session_id=session.id)
        assert again is not None and again.state == {"a": 1} and len(again.events) == 1
    finally:
        store.close()


# Damaged files (item 5)


def test_a_truncated_data_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "store"
    _filled_store(path, events=200)
    data = path / "data.mdb"
    size = data.stat().st_size
    with open(data, "r+b") as file:
        file.truncate(size // 2)
    with pytest.raises(CorruptStoreError, match="truncated") as info:
        LmdbStore(path)
    assert info.value.hint and "backup" in info.value.hint


def test_a_meta_page_pointing_outside_the_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "store"
    _filled_store(path, events=20)
    data = path / "data.mdb"
    raw = bytearray(data.read_bytes())
    page_size = int.from_bytes(raw[16 + 24 : 16 + 28], "little")
    # The main database's root page number, in both meta pages.
    for meta in (0, page_size):
        offset = meta + 16 + 24 + 48 + 40
        raw[offset : offset + 8] = (10**9).to_bytes(8, "little")
    data.write_bytes(bytes(raw))
    # LMDB itself refuses a page past the last one the meta page names.
    with pytest.raises(CorruptStoreError, match="page not found") as info:
        LmdbStore(path)
    assert info.value.hint and "backup" in info.value.hint
    assert data.read_bytes() == bytes(raw)


def _committed_root(raw: bytes) -> tuple[int, int]:
    """Return the page size and the main tree's root page named by the committed meta page."""
    page_size = int.from_bytes(raw[16 + 24 : 16 + 28], "little")
    # The committed meta page is the one of the later transaction.
    metas = []
    for meta in (0, page_size):
        txn_id = int.from_bytes(raw[meta + 16 + 128 : meta + 16 + 136], "little")
        root = int.from_bytes(raw[meta + 16 + 24 + 48 + 40 : meta + 16 + 24 + 48 + 48], "little")
        metas.append((txn_id, root))
    return page_size, max(metas)[1]


def _flip_a_data_page(path: Path) -> None:
    """Scramble the node pointers of the main tree's root page.

    The offline verifier finds it; LMDB itself may follow a pointer off the
    page, and past the end of the file (SIGBUS): open such a store with
    ``verify=True`` only.
    """
    data = path / "data.mdb"
    raw = bytearray(data.read_bytes())
    page_size, root = _committed_root(raw)
    start = root * page_size + 16
    raw[start : start + 64] = bytes(b ^ 0x5A for b in raw[start : start + 64])
    data.write_bytes(bytes(raw))


def _unmark_the_root_page(path: Path) -> None:
    """Clear the root page's kind (branch or leaf): LMDB itself answers MDB_CORRUPTED.

    The page header is its number (8 bytes), 2 bytes of padding, then the
    16-bit flags; a root that is neither branch nor leaf is refused by LMDB
    before it reads any node of the page.
    """
    data = path / "data.mdb"
    raw = bytearray(data.read_bytes())
    page_size, root = _committed_root(raw)
    flags = root * page_size + 10
    raw[flags : flags + 2] = bytes(2)
    data.write_bytes(bytes(raw))


def test_verify_passes_a_sound_store_and_refuses_flipped_bytes(tmp_path: Path) -> None:
    path = tmp_path / "store"
    _filled_store(path, events=100)
    store = LmdbStore(path, verify=True)
    try:
        assert store.verify() is None
    finally:
        store.close()
    _flip_a_data_page(path)
    before = snapshot_dir(path)
    with pytest.raises(CorruptStoreError, match="failed verification"):
        LmdbStore(path, verify=True)
    assert snapshot_dir(path) == before


def test_verify_on_an_open_store_finds_damage(tmp_path: Path) -> None:
    path = tmp_path / "store"
    _filled_store(path, events=100)
    store = LmdbStore(path)
    try:
        assert store.verify() is None
        # Bytes flip on disk under the open store.
        _flip_a_data_page(path)
        with pytest.raises(CorruptStoreError, match="failed verification"):
            store.verify()
    finally:
        store.close()


def test_an_unreadable_format_record_is_called_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "store"
    _filled_store(path, events=1)
    env = lmdb.open(str(path), max_dbs=8)
    with env.begin(write=True) as txn:
        meta = env.open_db(b"meta", txn=txn, create=False)
        txn.put(b"format", b"\x07" + pack({"magic": "sessionscope", "format": "seven"}), db=meta)
    env.close()
    with pytest.raises(CorruptStoreError, match="unreadable") as info:
        LmdbStore(path)
    assert "upgrade" not in str(info.value)
    env = lmdb.open(str(path), max_dbs=8)
    with env.begin(write=True) as txn:
        meta = env.open_db(b"meta", txn=txn, create=False)
        txn.put(b"format", b"\x01\xc1\xc1garbage", db=meta)
    env.close()
    with pytest.raises(CorruptStoreError, match="unreadable"):
        LmdbStore(path)


# Errors that name their cause (item 10)


@pytest.mark.parametrize(
    ("error", "kind", "words"),
    [
        (lmdb.CorruptedError("mdb_get", -30796), CorruptStoreError, "damaged"),
        (lmdb.PageNotFoundError("mdb_get", -30797), CorruptStoreError, "damaged"),
        (lmdb.ReadersFullError("mdb_txn_begin", -30790), StoreError, "max_readers"),
        (lmdb.MemoryError("mdb_env_set_mapsize", 12), StoreError, "address space"),
        (lmdb.DiskError("mdb_txn_commit", 28), StoreError, "disk space"),
    ],
)
def test_each_lmdb_failure_gets_the_hint_of_its_cause(
    error: lmdb.Error, kind: type[StoreError], words: str
) -> None:
    failure = lmdb_opening.lmdb_failure("writing to the store", error)
    assert type(failure) is kind
    assert failure.hint is not None and words in failure.hint
    assert failure.__cause__ is error


# Map growth (item 6)


def test_writers_that_run_out_of_map_together_grow_it_once(tmp_path: Path) -> None:
    path = tmp_path / "store"
    store = LmdbStore(path, durability="deferred", map_size=1 << 20)
    try:
        svc = SyncSessionService(store)
        sessions = [svc.create_session(app_name=APP, user_id=f"u{n}") for n in range(16)]
        start = threading.Barrier(16, timeout=30)
        failures: list[BaseException] = []
        payload = "x" * (3 << 20)

        def write(n: int) -> None:
            try:
                start.wait()
                svc.append_event(sessions[n], ev(delta={"big": payload}))
            except BaseException as error:  # reported by the test thread
                failures.append(error)

        threads = [threading.Thread(target=write, args=(n,)) for n in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert not failures
        # 16 x 3 MiB fit in 64 MiB; growing once per writer would reach 2**16 MiB.
        assert store.stat()["map_size"] <= 256 << 20
        for n in range(16):
            again = svc.get_session(app_name=APP, user_id=f"u{n}", session_id=sessions[n].id)
            assert again is not None and again.state["big"] == payload
    finally:
        store.close()


def test_an_unreadable_session_record_is_called_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "store"
    sid = _filled_store(path, events=1)
    env = lmdb.open(str(path), max_dbs=8)
    with env.begin(write=True) as txn:
        sessions = env.open_db(b"sessions", txn=txn, create=False)
        (key,) = [key for key, _ in txn.cursor(db=sessions)]
        txn.put(key, b"\xc1\xc1 not a record", db=sessions)
    env.close()
    with SyncSessionService(LmdbStore(path)) as svc:
        with pytest.raises(CorruptStoreError, match="unreadable"):
            svc.get_session(app_name=APP, user_id=USER, session_id=sid)
        # Other calls go on.
        assert svc.get_app_state(app_name=APP) == {}


def _garble_values(path: Path, marker: bytes) -> int:
    """Overwrite ``marker`` with bytes that are not UTF-8 wherever a stored value holds it.

    Goes through every named database, so it does not depend on the key
    layout: a string inside a packed value stops decoding, as when bytes rot
    on disk under a value that LMDB's own structure check cannot see.
    """
    env = lmdb.open(str(path), max_dbs=16)
    changed = 0
    with env.begin(write=True) as txn:
        for name in [key for key, _ in txn.cursor()]:
            db = env.open_db(name, txn=txn, create=False)
            for key, value in list(txn.cursor(db=db)):
                if marker in value:
                    txn.put(key, value.replace(marker, b"\xff" * len(marker)), db=db)
                    changed += 1
    env.close()
    return changed


@pytest.mark.parametrize("where", ["event", "session state", "user state", "app state"])
def test_a_stored_value_that_does_not_decode_is_called_corrupt(tmp_path: Path, where: str) -> None:
    path = tmp_path / "store"
    marker = "rotten-" + where.replace(" ", "-")
    state = {"session state": {"k": marker}, "user state": {"user:k": marker},
             "app state": {"app:k": marker}}.get(where, {})  # fmt: skip
    with SyncSessionService(LmdbStore(path)) as svc:
        hit = svc.create_session(app_name=APP, user_id=USER, session_id="hit", state=state)
        content = {"parts": [{"text": marker}]} if where == "event" else None
        svc.append_event(hit, ev(content=content))
        sound = svc.create_session(app_name="other", user_id=USER, session_id="sound")
        svc.append_event(sound, ev())
    assert _garble_values(path, marker.encode()) == 1
    # LMDB's structure is intact: only a value is damaged.
    with SyncSessionService(LmdbStore(path, verify=True)) as svc:
        with pytest.raises(CorruptStoreError, match="unreadable") as info:
            svc.get_session(app_name=APP, user_id=USER, session_id="hit")
        assert info.value.hint and "backup" in info.value.hint
        if where == "user state":
            with pytest.raises(CorruptStoreError):
                svc.get_user_state(app_name=APP, user_id=USER)
        if where == "app state":
            with pytest.raises(CorruptStoreError):
                svc.get_app_state(app_name=APP)
        # The rest of the store reads as before.
        again = svc.get_session(app_name="other", user_id=USER, session_id="sound")
        assert again is not None and len(again.events) == 1


@pytest.mark.adk
def test_an_adk_event_that_does_not_decode_is_called_corrupt(tmp_path: Path) -> None:
    from google.adk.events import Event as AdkEvent
    from google.genai import types

    from sessionscope.adk import LmdbSessionService

    async def scenario() -> None:
        service = LmdbSessionService(tmp_path / "store")
        session = await service.create_session(app_name=APP, user_id=USER, session_id="s")
        content = types.Content(role="model", parts=[types.Part(text="rotten-adk-event")])
        await service.append_event(
            session, AdkEvent(author="model", invocation_id="i", content=content)
        )
        await service.close()
        assert _garble_values(tmp_path / "store", b"rotten-adk-event") == 1
        service = LmdbSessionService(tmp_path / "store")
        try:
            with pytest.raises(CorruptStoreError, match="unreadable"):
                await service.get_session(app_name=APP, user_id=USER, session_id="s")
        finally:
            await service.close()

    asyncio.run(scenario())


def _replace_in_values(path: Path, old: bytes, new: bytes) -> int:
    """Replace bytes inside stored values, in every named database (see _garble_values)."""
    env = lmdb.open(str(path), max_dbs=16)
    changed = 0
    with env.begin(write=True) as txn:
        for name in [key for key, _ in txn.cursor()]:
            db = env.open_db(name, txn=txn, create=False)
            for key, value in list(txn.cursor(db=db)):
                if old in value:
                    txn.put(key, value.replace(old, new), db=db)
                    changed += 1
    env.close()
    return changed


def test_an_event_record_that_decodes_to_no_event_is_called_corrupt(tmp_path: Path) -> None:
    # One byte changed: the record still decodes, but its "author" field is now
    # an unknown one, which no event has.
    path = tmp_path / "store"
    with SyncSessionService(LmdbStore(path)) as svc:
        session = svc.create_session(app_name=APP, user_id=USER, session_id="s")
        svc.append_event(session, ev())
    assert _replace_in_values(path, b"author", b"xuthor") == 1
    with SyncSessionService(LmdbStore(path)) as svc:
        with pytest.raises(CorruptStoreError, match="event record"):
            svc.get_session(app_name=APP, user_id=USER, session_id="s")
        # Without its events the session still reads.
        head = svc.get_session(
            app_name=APP, user_id=USER, session_id="s", config=GetSessionConfig(num_recent_events=0)
        )
        assert head is not None and head.events == []


@pytest.mark.adk
def test_an_adk_event_record_that_decodes_to_no_event_is_called_corrupt(tmp_path: Path) -> None:
    from google.adk.events import Event as AdkEvent

    from sessionscope.adk import LmdbSessionService

    async def scenario() -> None:
        service = LmdbSessionService(tmp_path / "store")
        session = await service.create_session(app_name=APP, user_id=USER, session_id="s")
        await service.append_event(session, AdkEvent(author="model", invocation_id="inv-7"))
        await service.close()
        # The invocation id "inv-7" becomes a list of five small ints (a msgpack
        # fixarray header in place of the fixstr's): the record decodes, the event does not.
        stored = tmp_path / "store"
        assert _replace_in_values(stored, b"\xa5inv-7", b"\x95inv-7") == 1
        service = LmdbSessionService(stored)
        try:
            with pytest.raises(CorruptStoreError, match="event record"):
                await service.get_session(app_name=APP, user_id=USER, session_id="s")
        finally:
            await service.close()

    asyncio.run(scenario())
