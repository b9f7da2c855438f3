"""What only the LMDB store promises: format, refusal of foreign paths, files, growth."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import lmdb
import msgpack
import pytest

import _stores
import sessionscope
from _stores import (
    APP,
    USER,
    WORKERS,
    StoreFactory,
    ev,
    event_ids,
    read_store_bytes,
    reopen_lmdb,
    snapshot_dir,
)
from sessionscope import (
    GetSessionConfig,
    LmdbStore,
    MemoryStore,
    Session,
    SyncSessionService,
    open_store,
)
from sessionscope.errors import (
    IncompatibleStoreError,
    StaleSessionError,
    StateValueError,
    StoreError,
)

# Fixtures shared with the other modules (bound here so pytest finds them).
lmdb_factory = _stores.lmdb_factory


def _run_worker(*args: str, timeout: float = 60.0) -> Any:
    """Run a worker command in a fresh interpreter and return its JSON answer."""
    proc = subprocess.run(
        [sys.executable, str(WORKERS), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_stores.child_env(),
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _make_store(path: Path, **kwargs: Any) -> None:
    """Create a store with one session and close it."""
    with SyncSessionService(LmdbStore(path, **kwargs)) as svc:
        s = svc.create_session(app_name=APP, user_id=USER, session_id="s", state={"k": 1})
        svc.append_event(s, ev(delta={"app:a": 1}))


def _raw_named_dbs(path: Path) -> dict[bytes, dict[bytes, bytes]]:
    """Return every named database of an LMDB directory with its entries."""
    env = lmdb.open(str(path), readonly=True, lock=False, max_dbs=64)
    try:
        with env.begin() as txn:
            names = [key for key, _ in txn.cursor()]
        out = {}
        for name in names:
            db = env.open_db(name, create=False)
            with env.begin(db=db) as txn:
                out[name] = dict(txn.cursor())
        return out
    finally:
        env.close()


def _find_format_record(path: Path) -> tuple[bytes, bytes, bytes]:
    """Return (db name, key, value) of the record holding the format version."""
    for name, entries in _raw_named_dbs(path).items():
        for key, value in entries.items():
            if b"format" in key or b"version" in key:
                return name, key, value
    raise AssertionError("no format record in any named database")


def _decode_format(value: bytes) -> tuple[int, dict[str, Any]]:
    """Return (version byte, header map) of the format record."""
    header = msgpack.unpackb(value[1:], raw=False)
    return value[0], header


# Format version


def test_the_store_records_its_format_version(tmp_path: Path) -> None:
    """The store records its format version."""
    path = tmp_path / "store"
    _make_store(path)
    _db, _key, value = _find_format_record(path)
    version, header = _decode_format(value)
    assert isinstance(header.get("format"), int)
    assert header["format"] >= 1
    assert version == header["format"]


def _assert_refused_unchanged(path: Path, before: dict[str, Any], **kwargs: Any) -> None:
    """Opening path is an IncompatibleStoreError and leaves every file as it was."""
    with pytest.raises(IncompatibleStoreError) as info:
        LmdbStore(path, **kwargs)
    assert str(path) in str(info.value) or path.name in str(info.value)
    assert isinstance(info.value, StoreError)
    # Compare contents and mtimes of every file that was there.
    assert snapshot_dir(path) == before
    with pytest.raises(IncompatibleStoreError):
        open_store(f"lmdb://{path.resolve()}")
    assert snapshot_dir(path) == before


def test_a_newer_format_is_refused_and_untouched(tmp_path: Path) -> None:
    """A store of a newer format is a clear error and overwrites nothing."""
    path = tmp_path / "store"
    _make_store(path)
    newer = tmp_path / "newer"
    shutil.copytree(path, newer)
    db_name, key, value = _find_format_record(newer)
    version, header = _decode_format(value)
    header["format"] = version + 1
    env = lmdb.open(str(newer), max_dbs=64)
    try:
        db = env.open_db(db_name, create=False)
        with env.begin(write=True, db=db) as txn:
            txn.put(key, bytes([version + 1]) + msgpack.packb(header, use_bin_type=True))
    finally:
        env.close()
    time.sleep(0.01)  # so that a rewrite would show in the mtimes
    before = snapshot_dir(newer)
    _assert_refused_unchanged(newer, before)
    with pytest.raises(IncompatibleStoreError, match="format"):
        LmdbStore(newer)
    # The original still opens.
    with SyncSessionService(LmdbStore(path)) as svc:
        assert svc.get_app_state(app_name=APP) == {"a": 1}


def test_another_lmdb_database_is_refused_and_untouched(tmp_path: Path) -> None:
    """A directory holding someone else's LMDB database is refused, unchanged."""
    path = tmp_path / "other"
    env = lmdb.open(str(path), max_dbs=4)
    try:
        db = env.open_db(b"customers")
        with env.begin(write=True, db=db) as txn:
            txn.put(b"alice", b"precious")
    finally:
        env.close()
    before = snapshot_dir(path)
    _assert_refused_unchanged(path, before)
    _assert_refused_unchanged(path, before, durability="deferred")


def test_an_lmdb_database_with_plain_keys_is_refused(tmp_path: Path) -> None:
    """An LMDB database with only main-database keys is refused, unchanged."""
    path = tmp_path / "other"
    env = lmdb.open(str(path))
    try:
        with env.begin(write=True) as txn:
            txn.put(b"meta", b"not a sub-database")
            txn.put(b"format", b"\x01")
    finally:
        env.close()
    before = snapshot_dir(path)
    with pytest.raises((IncompatibleStoreError, StoreError)):
        LmdbStore(path)
    assert snapshot_dir(path) == before


@pytest.mark.parametrize("durability", ["sync", "deferred"])
def test_an_empty_data_file_left_by_a_cut_short_open_becomes_a_store(
    tmp_path: Path, durability: str
) -> None:
    """An empty data.mdb, what a process killed as LMDB made the file leaves, opens as a new store.

    It holds nothing to lose: refused, it would stop every later open (an
    import run again, ``verify``) until someone removed it by hand. A data
    file holding anything else is still refused (the tests around this one).
    """
    path = tmp_path / "cut"
    path.mkdir(mode=0o700)
    (path / "data.mdb").touch(mode=0o600)
    (path / "lock.mdb").touch(mode=0o600)
    done = _stores.run_cli("verify", f"lmdb://{path}")
    assert done.returncode == 0, done.stderr
    with SyncSessionService(LmdbStore(path, durability=durability)) as svc:  # type: ignore[arg-type]
        session = svc.create_session(app_name=APP, user_id="u", session_id="s")
        svc.append_event(session, _stores.ev(delta={"k": 1}))
    with SyncSessionService(LmdbStore(path, durability=durability)) as svc:  # type: ignore[arg-type]
        stored = svc.get_session(app_name=APP, user_id="u", session_id="s")
        assert stored is not None and stored.state == {"k": 1} and len(stored.events) == 1
    # Beside files that are not LMDB's, it is no store in the making: refused, untouched.
    other = tmp_path / "other"
    other.mkdir(mode=0o700)
    (other / "data.mdb").touch(mode=0o600)
    (other / "notes.txt").write_text("mine")
    _assert_refused_unchanged(other, snapshot_dir(other))


def test_garbage_data_file_is_refused_and_untouched(tmp_path: Path) -> None:
    """data.mdb holding garbage: IncompatibleStoreError, the file unchanged."""
    path = tmp_path / "garbage"
    path.mkdir()
    (path / "data.mdb").write_bytes(os.urandom(64 * 1024))
    before = snapshot_dir(path)
    _assert_refused_unchanged(path, before)
    # A short file too.
    (path / "data.mdb").write_bytes(b"x")
    _assert_refused_unchanged(path, snapshot_dir(path))


def test_a_non_empty_directory_is_refused_and_untouched(tmp_path: Path) -> None:
    """A non-empty directory that is not a store: refused, no file created."""
    path = tmp_path / "docs"
    path.mkdir()
    (path / "notes.txt").write_text("keep me")
    (path / "sub").mkdir()
    (path / "sub" / "data.bin").write_bytes(b"\x00\x01")
    before = snapshot_dir(path)
    _assert_refused_unchanged(path, before)
    assert sorted(os.listdir(path)) == ["notes.txt", "sub"]


def test_a_regular_file_is_refused_and_untouched(tmp_path: Path) -> None:
    """A path that is a regular file: refused, the file unchanged."""
    path = tmp_path / "file.txt"
    path.write_bytes(b"not a store")
    before = snapshot_dir(path)
    _assert_refused_unchanged(path, before)


def test_a_missing_path_is_created(tmp_path: Path) -> None:
    """The store directory is created if missing, with data.mdb and lock.mdb."""
    path = tmp_path / "a" / "b" / "store"
    _make_store(path)
    assert sorted(os.listdir(path)) == ["data.mdb", "lock.mdb"]


def test_an_empty_directory_becomes_a_store(tmp_path: Path) -> None:
    """An existing empty directory is a fine place for a new store."""
    path = tmp_path / "empty"
    path.mkdir()
    _make_store(path)
    with SyncSessionService(LmdbStore(path)) as svc:
        assert svc.get_session(app_name=APP, user_id=USER, session_id="s") is not None


# File modes


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_files_are_owner_only_by_default(tmp_path: Path) -> None:
    """Files are created 0o600 and the directory 0o700 by default."""
    path = tmp_path / "store"
    _make_store(path)
    assert _mode(path) == 0o700
    for name in ("data.mdb", "lock.mdb"):
        assert _mode(path / name) == 0o600, name


def test_file_mode_is_honoured(tmp_path: Path) -> None:
    """file_mode sets the mode of the files created."""
    old = os.umask(0o022)
    try:
        path = tmp_path / "store"
        _make_store(path, file_mode=0o640)
        for name in ("data.mdb", "lock.mdb"):
            assert _mode(path / name) == 0o640, name
        via_uri = tmp_path / "uri"
        store = open_store(f"lmdb://{via_uri.resolve()}")
        try:
            assert isinstance(store, LmdbStore)
        finally:
            store.close()
        assert _mode(via_uri) == 0o700
        assert _mode(via_uri / "data.mdb") == 0o600
    finally:
        os.umask(old)


# open_store


def test_open_store_uris(tmp_path: Path) -> None:
    """open_store takes lmdb:// URIs with options, and memory://."""
    mem = open_store("memory://")
    try:
        assert isinstance(mem, MemoryStore)
    finally:
        mem.close()
    path = tmp_path / "uri-store"
    store = open_store(f"lmdb://{path.resolve()}?durability=deferred&map_size=1048576")
    try:
        assert isinstance(store, LmdbStore)
        with SyncSessionService(store) as svc:
            svc.create_session(app_name=APP, user_id=USER, session_id="s")
    finally:
        store.close()
    with SyncSessionService(open_store(f"lmdb://{path.resolve()}")) as svc:
        assert svc.get_session(app_name=APP, user_id=USER, session_id="s") is not None


# temp: keys never reach the disk


@pytest.mark.parametrize("durability", ["sync", "deferred"])
def test_temp_values_never_reach_the_files(tmp_path: Path, durability: str) -> None:
    """A temp: marker never occurs in the store's bytes; a session-key control does."""
    path = tmp_path / "store"
    markers = [f"TEMPMARK-{uuid.uuid4().hex}" for _ in range(4)]
    controls = [f"CONTROL-{uuid.uuid4().hex}" for _ in range(2)]
    with SyncSessionService(LmdbStore(path, durability=durability)) as svc:
        s = svc.create_session(
            app_name=APP,
            user_id=USER,
            session_id="s",
            state={"temp:a": markers[0], f"temp:{markers[1]}": 1, "k": controls[0]},
        )
        svc.append_event(
            s, ev(delta={"temp:b": markers[2], f"temp:{markers[3]}": True, "k2": controls[1]})
        )
        svc.append_event_locked(s, ev(delta={"temp:c": markers[0]}))
        assert s.state["temp:b"] == markers[2]
        svc.flush()
    data = read_store_bytes(path)
    for control in controls:
        assert control.encode() in data, "the check cannot see stored values"
    for marker in markers:
        assert marker.encode() not in data


# Bad input leaves the files as they were


def test_bad_input_leaves_the_files_unchanged(lmdb_factory: StoreFactory) -> None:
    """Rejected calls write nothing: data.mdb is byte-for-byte the same."""
    svc = SyncSessionService(lmdb_factory())
    s = svc.create_session(app_name=APP, user_id=USER, session_id="s", state={"k": 0})
    svc.append_event(s, ev(delta={"k": 1}))
    stale = svc.get_session(app_name=APP, user_id=USER, session_id="s")
    assert stale is not None
    svc.append_event(s, ev(delta={"k": 2}))
    stored_event = s.events[-1]
    svc.flush()
    data = lmdb_factory.path / "data.mdb"
    before = data.read_bytes()

    bad_calls = [
        lambda: svc.create_session(app_name=1, user_id=USER),
        lambda: svc.create_session(app_name=APP, user_id="", state={"app:x": 1}),
        lambda: svc.create_session(app_name=APP, user_id=USER, session_id="x" * 4097),
        lambda: svc.create_session(app_name=APP, user_id=USER, state={"app:x": 1, "b": {1}}),
        lambda: svc.create_session(app_name=APP, user_id=USER, session_id="s", state={"a": 1}),
        lambda: svc.append_event(s, ev(delta={"app:y": 1, "z": object()})),
        lambda: svc.append_event(s, ev(content={1, 2}, delta={"app:y": 1})),
        lambda: svc.append_event(stale, ev(delta={"app:y": 1})),
        lambda: svc.append_event(
            Session(id="ghost", app_name=APP, user_id=USER), ev(delta={"app:y": 1})
        ),
        lambda: svc.append_event(
            s, ev(id=stored_event.id, content="different", delta={"app:y": 1})
        ),
        lambda: svc.get_session(app_name=APP, user_id=USER, session_id=""),
        lambda: svc.get_session(
            app_name=APP, user_id=USER, session_id="s", config=GetSessionConfig(-1)
        ),
        lambda: svc.delete_session(app_name=APP, user_id=USER, session_id="x" * 4097),
        lambda: svc.list_sessions(app_name=b"app"),
    ]
    for call in bad_calls:
        with pytest.raises((ValueError, TypeError)):
            call()
    # Reads and no-op writes change nothing either.
    svc.get_session(app_name=APP, user_id=USER, session_id="s")
    svc.list_sessions(app_name=APP)
    svc.delete_session(app_name=APP, user_id=USER, session_id="missing")
    svc.append_event(s, ev(delta={"k": 9}, partial=True))
    svc.append_event(s, stored_event)
    svc.flush()
    assert data.read_bytes() == before
    assert isinstance(StateValueError("x"), TypeError)
    assert issubclass(StaleSessionError, ValueError)


# Map growth


def _blob(n: int, size: int) -> bytes:
    """Return `size` pseudo-random bytes derived from n (incompressible, reproducible)."""
    seed = hashlib.sha256(n.to_bytes(8, "big")).digest()
    return (seed * (size // len(seed) + 1))[:size]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("durability", "total_mb"), [("sync", 300), ("deferred", 48)], ids=["sync", "deferred"]
)
def test_a_small_map_grows_by_itself(tmp_path: Path, durability: str, total_mb: int) -> None:
    """A store opened with a 1 MiB map grows to hundreds of MB without an error."""
    path = tmp_path / "store"
    size = 64 * 1024
    n_sessions = 6
    per_session = total_mb * 1024 * 1024 // size // n_sessions
    deadline = time.monotonic() + 120
    with SyncSessionService(LmdbStore(path, map_size=1 << 20, durability=durability)) as svc:
        for n in range(n_sessions):
            s = svc.create_session(app_name=APP, user_id=USER, session_id=f"s{n}")
            for i in range(per_session):
                assert time.monotonic() < deadline, "growth test ran out of time"
                svc.append_event(
                    s, ev(content=_blob(n * 100_000 + i, size), delta={"i": i}, id=f"{n}-{i}")
                )
    assert (path / "data.mdb").stat().st_size > total_mb * 1024 * 1024
    with SyncSessionService(LmdbStore(path, map_size=1 << 20)) as svc:
        metas = svc.list_sessions(app_name=APP).sessions
        assert sorted(m.id for m in metas) == [f"s{n}" for n in range(n_sessions)]
        for n in range(n_sessions):
            got = svc.get_session(app_name=APP, user_id=USER, session_id=f"s{n}")
            assert got is not None
            assert event_ids(got) == [f"{n}-{i}" for i in range(per_session)]
            for i in (0, per_session // 2, per_session - 1):
                assert got.events[i].content == _blob(n * 100_000 + i, size)
            assert got.state == {"i": per_session - 1}
            del got
        # It keeps growing after a reopen with a small map too.
        s = svc.get_session(app_name=APP, user_id=USER, session_id="s0", config=GetSessionConfig(0))
        assert s is not None
        for i in range(40):
            svc.append_event(s, ev(content=_blob(i, size)))


def test_a_small_map_grows_under_the_bulk_path(tmp_path: Path) -> None:
    """Batches that overflow a 1 MiB map grow it and land whole, in order."""
    path = tmp_path / "store"
    size = 16 * 1024
    with SyncSessionService(LmdbStore(path, map_size=1 << 20, durability="deferred")) as svc:
        s = svc.create_session(app_name=APP, user_id=USER, session_id="s")
        for batch in range(4):
            svc.append_many(
                [
                    (
                        s,
                        ev(
                            content=_blob(batch * 1000 + i, size),
                            delta={"b": batch},
                            id=f"{batch}-{i}",
                        ),
                    )
                    for i in range(200)
                ]
            )
        assert (path / "data.mdb").stat().st_size > 12 * 1024 * 1024
        got = svc.get_session(app_name=APP, user_id=USER, session_id="s")
        assert got is not None
        assert event_ids(got) == [f"{b}-{i}" for b in range(4) for i in range(200)]
        assert got.events[-1].content == _blob(3 * 1000 + 199, size)
        assert got.state == {"b": 3}


@pytest.mark.parametrize("durability", ["sync", "deferred"])
def test_a_write_the_disk_refuses_is_a_store_error_and_loses_nothing(
    tmp_path: Path, durability: str
) -> None:
    """A commit the OS refuses (here a file size limit) is a StoreError with a hint.

    The events acknowledged before it are stored, the live session matches the
    store, and the store opens and takes appends again once there is room.
    """
    path = tmp_path / "store"
    report = _run_worker("fill_to_limit", str(path), durability, str(2 << 20), timeout=120)
    assert report["error"]["type"] == "StoreError" and "disk space" in report["error"]["hint"]
    acknowledged = report["acknowledged"]
    assert 10 < len(acknowledged) < 5000
    assert report["stored"] == acknowledged and report["live"] == acknowledged
    with SyncSessionService(LmdbStore(path, durability=durability)) as svc:  # type: ignore[arg-type]
        s = svc.get_session(app_name="app", user_id="user", session_id="s")
        assert s is not None and event_ids(s) == acknowledged
        svc.append_event(s, ev(content="after"))
    with SyncSessionService(LmdbStore(path)) as svc:
        s = svc.get_session(app_name="app", user_id="user", session_id="s")
        assert s is not None and event_ids(s)[:-1] == acknowledged


# Deferred durability across processes


def test_deferred_appends_are_visible_to_another_process(tmp_path: Path) -> None:
    """Deferred: commits are visible to a new process at once, and durable after flush()."""
    path = tmp_path / "store"
    store = LmdbStore(path, durability="deferred", flush_interval=3600.0)
    svc = SyncSessionService(store)
    try:
        s = svc.create_session(app_name=APP, user_id=USER, session_id="s", state={"k": 0})
        first = svc.append_event(s, ev(delta={"k": 1, "app:a": 1}))
        seen = _run_worker("dump", str(path), APP, USER, "s")
        assert seen["ids"] == [first.id]
        assert seen["state"] == {"k": 1, "app:a": 1}
        more = [svc.append_event(s, ev(delta={"k": n})).id for n in range(2, 6)]
        svc.flush()
        seen = _run_worker("dump", str(path), APP, USER, "s")
        assert seen["ids"] == [first.id, *more]
        assert seen["state"] == {"k": 5, "app:a": 1}
    finally:
        svc.close()


def test_a_second_store_in_one_process_sees_the_first(tmp_path: Path) -> None:
    """Writes through one store object are read through a reopened one after close."""
    path = tmp_path / "store"
    _make_store(path, durability="deferred")
    store = reopen_lmdb(path, durability="deferred")
    try:
        svc = SyncSessionService(store)
        got = svc.get_session(app_name=APP, user_id=USER, session_id="s")
        assert got is not None
        assert got.state == {"k": 1, "app:a": 1}
    finally:
        store.close()


# No pickle: values are msgpack


def test_no_pickle_anywhere(tmp_path: Path) -> None:
    """Every operation on every store runs without pickle ever being imported."""
    assert _run_worker("no_pickle", str(tmp_path / "store")) == []
    package = Path(sessionscope.__file__).resolve().parent
    sources = [*package.rglob("*.py"), *package.rglob("*.pyx")]
    assert sources
    for source in sources:
        assert "pickle" not in source.read_text(encoding="utf-8"), source.name


def test_values_are_stored_as_msgpack(tmp_path: Path) -> None:
    """Stored state values and event content are msgpack-encoded."""
    path = tmp_path / "store"
    value = {"marker": f"MSGPACK-{uuid.uuid4().hex}", "n": [1, 2.5, None, b"\x01"]}
    content = {"content": f"CONTENT-{uuid.uuid4().hex}", "t": True}
    with SyncSessionService(LmdbStore(path)) as svc:
        s = svc.create_session(
            app_name=APP, user_id=USER, session_id="s", state={"k": value, "app:a": value}
        )
        svc.append_event(s, ev(content=content, delta={"user:u": value}))
    packed_value = msgpack.packb(value, use_bin_type=True)
    packed_marker = msgpack.packb(content["content"], use_bin_type=True)
    values = [v for entries in _raw_named_dbs(path).values() for v in entries.values()]
    # Each state value is stored as its msgpack encoding (alone, or inside a record).
    assert sum(packed_value in v for v in values) >= 3
    assert any(packed_marker in v for v in values)


def test_a_store_uri_opens_the_same_store_whatever_its_directory_is_called(
    tmp_path: Path,
) -> None:
    path = tmp_path / "my sessions #2?map_size=1%20"
    store = LmdbStore(path, durability="deferred")
    try:
        uri = store.uri
    finally:
        store.close()
    again = open_store(uri)
    try:
        assert isinstance(again, LmdbStore)
        assert again.path.resolve() == path.resolve() and again.durability == "deferred"
    finally:
        again.close()
