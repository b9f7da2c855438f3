"""Dumps: exact round trips between every pair of stores, and refusing bad dumps."""

from __future__ import annotations

import dataclasses
import gzip
import time
from pathlib import Path
from typing import Any

import pytest

import _stores
from _stores import STORE_KINDS, StoreFactory, ev
from sessionscope import LmdbStore, SyncSessionService, codec
from sessionscope.admin.dump import (
    DUMP_FORMAT,
    MAGIC,
    DumpCounts,
    export_dump,
    import_dump,
    read_copy,
)
from sessionscope.errors import DumpError, SessionscopeError

store_factory = _stores.store_factory

NESTED = {
    "bytes": b"\x00\xffraw",
    "list": [1, 1.0, True, None, "1", b"1", [{"deep": [b"x", {"y": -(2**63)}]}]],
    "float": 0.1,
    "big": 2**63 - 1,
    "empty": {},
}
ODD = "日本:/\x00 ok"
LONG = "long-" + "x" * 300


def fill(store: Any) -> None:
    """Store every scope, bytes and nested values, odd and long ids, odd times."""
    svc = SyncSessionService(store)
    svc.create_session(
        app_name="shop",
        user_id="ada",
        session_id="empty",
        state={"app:nested": NESTED, "user:b": b"\x01", "s": NESTED, "temp:gone": 1},
    )
    busy = svc.create_session(app_name="shop", user_id="ada", session_id="busy")
    for index, stamp in enumerate([30.5, 10.25, 20.0, 5.0, 40.0]):
        svc.append_event(
            busy,
            ev(
                ts=stamp,
                content={"i": index, "blob": bytes([index]) * 3},
                delta={f"k{index}": NESTED, "app:count": index, "user:last": b"%d" % index},
            ),
        )
    cut = svc.create_session(app_name="shop", user_id="bob", session_id="cut")
    for stamp in (1.0, 2.0, 3.0, 4.0):
        svc.append_event(cut, ev(ts=stamp, delta={"n": stamp}))
    svc.truncate_events(app_name="shop", user_id="bob", session_id="cut", keep_last=2)
    odd = svc.create_session(app_name=ODD, user_id=ODD, session_id=ODD, state={"user:o": 1})
    svc.append_event(odd, ev(ts=-12.5, id=LONG, delta={"x": [ODD]}))
    long = svc.create_session(app_name="shop", user_id="carol", session_id=LONG)
    svc.append_event(long, ev(ts=1e9, delta={LONG: LONG}))
    # A user with state and no session left.
    svc.create_session(app_name="shop", user_id="dora", session_id="tmp", state={"user:d": 4})
    svc.delete_session(app_name="shop", user_id="dora", session_id="tmp")


def snapshot(store: Any) -> dict[str, Any]:
    """Return everything a store holds, with values packed so types compare strictly."""
    out: dict[str, Any] = {}
    for app in store.list_apps():
        app_state = {k: codec.pack(v) for k, v in store.read_app_state(app).items()}
        users: dict[str, Any] = {}
        for user in store.list_users(app):
            sessions = {}
            for record in store.list_sessions(app, user):
                copy = read_copy(store, app, user, record.session_id)
                assert copy is not None
                sessions[record.session_id] = (
                    copy.create_time,
                    copy.last_update_time,
                    sorted(copy.session_items),
                    [(e.event_id, e.timestamp, e.record) for e in copy.events],
                )
            state = {k: codec.pack(v) for k, v in store.read_user_state(app, user).items()}
            users[user] = (state, sessions)
        out[app] = (app_state, users)
    return out


EXPECTED_COUNTS = DumpCounts(apps=2, users=5, sessions=5, events=9)


@pytest.mark.parametrize("target_kind", STORE_KINDS)
@pytest.mark.parametrize("name", ["dump.ssd", "dump.ssd.gz"])
def test_round_trip_is_exact(
    store_factory: StoreFactory, tmp_path: Path, target_kind: str, name: str
) -> None:
    source = store_factory()
    fill(source)
    out = tmp_path / name
    assert export_dump(source, out) == EXPECTED_COUNTS
    assert not out.with_name(name + ".partial").exists()
    if name.endswith(".gz"):
        with gzip.open(out, "rb") as file:
            assert file.read(1)
    targets = StoreFactory(target_kind, tmp_path / "target")
    (tmp_path / "target").mkdir()
    try:
        target = targets()
        assert import_dump(target, out) == EXPECTED_COUNTS
        expected = snapshot(source)
        assert snapshot(target) == expected
        if isinstance(target, LmdbStore):
            assert target.check_layout() == []
        assert expected["shop"][1]["ada"][1]["empty"][3] == []
        assert [e[1] for e in expected["shop"][1]["ada"][1]["busy"][3]] == [
            30.5,
            10.25,
            20.0,
            5.0,
            40.0,
        ]
        # Reading through the service gives the same sessions on both sides.
        for app, user, sid in [("shop", "ada", "busy"), ("shop", "bob", "cut"), (ODD, ODD, ODD)]:
            a = SyncSessionService(source).get_session(app_name=app, user_id=user, session_id=sid)
            b = SyncSessionService(target).get_session(app_name=app, user_id=user, session_id=sid)
            assert a is not None and b is not None
            assert (a.state, a.events, a.last_update_time) == (
                b.state,
                b.events,
                b.last_update_time,
            )
        # Importing again changes nothing, not even a revision.
        revisions = [
            m.revision for m in SyncSessionService(target).list_sessions(app_name="shop").sessions
        ]
        # The same counts, every session (and its events) skipped as stored already.
        assert import_dump(target, out) == dataclasses.replace(
            EXPECTED_COUNTS, skipped_sessions=5, skipped_events=9
        )
        assert snapshot(target) == expected
        again = SyncSessionService(target).list_sessions(app_name="shop").sessions
        assert [m.revision for m in again] == revisions
        # And the copy dumps to the same records.
        second = tmp_path / ("second-" + name)
        export_dump(target, second)
        assert _records(second)[1:-1] == _records(out)[1:-1]
    finally:
        targets.close_all()


def test_dump_of_one_app_or_one_user(store_factory: StoreFactory, tmp_path: Path) -> None:
    source = store_factory()
    fill(source)
    assert export_dump(source, tmp_path / "app", app_name="shop") == DumpCounts(1, 4, 4, 8)
    assert export_dump(source, tmp_path / "user", user_id="ada") == DumpCounts(1, 1, 2, 5)
    assert export_dump(source, tmp_path / "pair", app_name=ODD, user_id=ODD) == DumpCounts(
        1, 1, 1, 1
    )
    # An app the store does not hold is not made up: the dump is empty.
    assert export_dump(source, tmp_path / "none", app_name="nope") == DumpCounts(0, 0, 0, 0)
    target = store_factory.fresh("target")
    assert import_dump(target, tmp_path / "none") == DumpCounts(0, 0, 0, 0)
    assert target.list_apps() == []
    import_dump(target, tmp_path / "user")
    assert target.list_apps() == ["shop"]
    assert target.list_users("shop") == ["ada"]
    # A dump of one user holds that user's state, not the app's.
    assert target.read_app_state("shop") == {}
    assert target.read_user_state("shop", "ada") == source.read_user_state("shop", "ada")
    import_dump(target, tmp_path / "app")
    assert snapshot(target)["shop"] == snapshot(source)["shop"]


def test_progress_counts_every_record(store_factory: StoreFactory, tmp_path: Path) -> None:
    source = store_factory()
    fill(source)
    exported: list[int] = []
    export_dump(source, tmp_path / "d", progress=exported.append)
    imported: list[int] = []
    import_dump(store_factory.fresh("target"), tmp_path / "d", progress=imported.append)
    records = len(_records(tmp_path / "d")) - 2
    assert sum(exported) == sum(imported) == records
    assert len(imported) > 1


def test_an_interrupted_import_resumes(store_factory: StoreFactory, tmp_path: Path) -> None:
    source = store_factory()
    fill(source)
    export_dump(source, tmp_path / "d")
    target = store_factory.fresh("target")
    handled: list[int] = []

    def stop_after_three(records: int) -> None:
        handled.append(records)
        if len(handled) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        import_dump(target, tmp_path / "d", progress=stop_after_three)
    assert snapshot(target) != snapshot(source)
    import_dump(target, tmp_path / "d")
    assert snapshot(target) == snapshot(source)


def test_export_refuses_bad_filters(store_factory: StoreFactory, tmp_path: Path) -> None:
    source = store_factory()
    for bad in ({"app_name": ""}, {"user_id": 3}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            export_dump(source, tmp_path / "d", **bad)
    assert not (tmp_path / "d").exists()


# -- refusing bad dumps --------------------------------------------------


def _records(path: Path) -> list[Any]:
    import msgpack

    opener: Any = gzip.open if path.read_bytes()[:2] == b"\x1f\x8b" else open
    with opener(path, "rb") as file:
        return list(msgpack.Unpacker(file, raw=False))


def _write_records(path: Path, records: list[Any], *, fix_checksum: bool = True) -> None:
    from hashlib import blake2b

    if fix_checksum:
        digest = blake2b(digest_size=32)
        for record in records[:-1]:
            digest.update(codec.pack(record))
        records[-1][2] = digest.digest()
    path.write_bytes(b"".join(codec.pack(record) for record in records))


def _refused(store: Any, dump: Path, match: str) -> None:
    before = snapshot(store)
    with pytest.raises(DumpError, match=match) as caught:
        import_dump(store, dump)
    assert isinstance(caught.value, SessionscopeError) and isinstance(caught.value, ValueError)
    assert snapshot(store) == before


@pytest.fixture
def good_dump(store_factory: StoreFactory, tmp_path: Path) -> Path:
    source = store_factory.fresh("source")
    fill(source)
    out = tmp_path / "good.ssd"
    export_dump(source, out)
    return out


def test_a_truncated_dump_is_refused(
    store_factory: StoreFactory, good_dump: Path, tmp_path: Path
) -> None:
    target = store_factory()
    SyncSessionService(target).create_session(app_name="mine", user_id="me", session_id="kept")
    data = good_dump.read_bytes()
    for cut in (0, 1, 10, len(data) // 3, len(data) // 2, len(data) - 40, len(data) - 1):
        broken = tmp_path / f"cut-{cut}"
        broken.write_bytes(data[:cut])
        _refused(target, broken, "truncated|damaged|not a sessionscope dump")
    compressed = tmp_path / "cut.gz"
    compressed.write_bytes(gzip.compress(data)[:-30])
    _refused(target, compressed, "truncated|damaged")


def test_an_altered_dump_is_refused(
    store_factory: StoreFactory, good_dump: Path, tmp_path: Path
) -> None:
    target = store_factory()
    records = _records(good_dump)
    # A value changed in place, the checksum left as it was.
    altered = [list(r) for r in records]
    session = next(i for i, r in enumerate(altered) if r[0] == "session")
    altered[session][5] += 1.0
    _write_records(tmp_path / "altered", altered, fix_checksum=False)
    _refused(target, tmp_path / "altered", "checksum")
    # A record dropped, the checksum recomputed: the counts give it away.
    dropped = [list(r) for r in records]
    app = next(i for i, r in enumerate(dropped) if r[0] == "user")
    del dropped[app]
    _write_records(tmp_path / "dropped", dropped)
    _refused(target, tmp_path / "dropped", "trailer says")
    # Data after the trailer.
    (tmp_path / "extra").write_bytes(good_dump.read_bytes() + codec.pack(["app", "x", {}]))
    _refused(target, tmp_path / "extra", "after its trailer")
    # An event whose id does not match its record.
    mismatched = [list(r) for r in records]
    event = next(i for i, r in enumerate(mismatched) if r[0] == "event")
    mismatched[event][1] = "other-id"
    _write_records(tmp_path / "mismatch", mismatched)
    _refused(target, tmp_path / "mismatch", "does not match")
    # A state value that is not packed msgpack.
    bad_value = [list(r) for r in records]
    bad_value[1][2] = {"k": b"\xc1"}
    _write_records(tmp_path / "value", bad_value)
    _refused(target, tmp_path / "value", "does not decode")


def test_a_newer_or_foreign_dump_is_refused(store_factory: StoreFactory, tmp_path: Path) -> None:
    target = store_factory()
    newer = [[MAGIC, DUMP_FORMAT + 1, {}], ["end", {}, b""]]
    _write_records(tmp_path / "newer", newer)
    _refused(target, tmp_path / "newer", f"format {DUMP_FORMAT + 1}")
    (tmp_path / "text").write_text("hello, not a dump\n")
    _refused(target, tmp_path / "text", "not a sessionscope dump|damaged")
    _write_records(tmp_path / "other", [["something-else", 1, {}], ["end", {}, b""]])
    _refused(target, tmp_path / "other", "not a sessionscope dump")
    _refused(target, tmp_path / "missing", "cannot read")


def test_a_dump_that_conflicts_with_the_store_writes_nothing(
    store_factory: StoreFactory, good_dump: Path
) -> None:
    target = store_factory()
    svc = SyncSessionService(target)
    clash = svc.create_session(app_name="shop", user_id="ada", session_id="busy")
    svc.append_event(clash, ev(ts=time.time(), delta={"mine": 1}))
    _refused(target, good_dump, "other content")
    assert target.read_app_state("shop") == {}


# -- the store write path that takes given times ---------------------------


def test_restore_session_writes_exactly_what_it_is_given(store_factory: StoreFactory) -> None:
    from sessionscope.errors import AlreadyExistsError
    from sessionscope.model import Event as NativeEvent
    from sessionscope.service import NativeModel
    from sessionscope.stores.records import EventCopy, SessionCopy

    store = store_factory()
    model = NativeModel()
    events = [
        NativeEvent(id=f"e{i}", author="a", timestamp=stamp, content={"b": bytes([i])})
        for i, stamp in enumerate([3.5, 1.25, 2.0])
    ]
    copy = SessionCopy(
        "app",
        "user",
        "restored",
        100.0,
        200.5,
        [("k", codec.pack({"nested": [b"\x00", 1.0]}))],
        [EventCopy(e.id, e.timestamp, model.encode_event(e)) for e in events],
    )
    assert store.restore_session(copy).result() is True
    loaded = store.load_session("app", "user", "restored", None, None)
    assert loaded is not None
    assert (loaded.record.create_time, loaded.record.last_update_time) == (100.0, 200.5)
    assert loaded.record.stored_count == 3 and loaded.record.last_event_id == "e2"
    assert loaded.session_state == {"k": {"nested": [b"\x00", 1.0]}}
    assert model.decode_events(loaded.events) == events
    recent = store.load_session("app", "user", "restored", 2, 2.0)
    assert recent is not None and model.decode_events(recent.events) == [events[2]]
    # Equal again: nothing written, not even the marker.
    assert store.restore_session(copy).result() is False
    again = store.load_session("app", "user", "restored", None, None)
    assert again is not None and again.record.marker == loaded.record.marker
    # Different: refused, the stored one kept.
    different = SessionCopy(
        copy.app_name,
        copy.user_id,
        copy.session_id,
        copy.create_time,
        201.0,
        copy.session_items,
        copy.events,
    )
    with pytest.raises(AlreadyExistsError):
        store.restore_session(different).result()
    with pytest.raises(ValueError, match="twice"):
        store.restore_session(
            SessionCopy("app", "user", "dup", 1.0, 1.0, [], [copy.events[0], copy.events[0]])
        ).result()
    assert store.load_session("app", "user", "dup", None, None) is None
    # A restored session takes appends like any other.
    svc = SyncSessionService(store)
    live = svc.get_session(app_name="app", user_id="user", session_id="restored")
    assert live is not None
    svc.append_event(live, ev(ts=300.0, delta={"after": 1}))
    assert [e.id for e in live.events][:3] == ["e0", "e1", "e2"]
    # A session without events keeps its two times.
    empty = SessionCopy("app", "other", "empty", 5.0, 6.0)
    assert store.restore_session(empty).result() is True
    record = store.list_sessions("app", "other")[0]
    assert (record.create_time, record.last_update_time, record.stored_count) == (5.0, 6.0, 0)


def test_writing_app_and_user_state_sets_only_the_keys_given(store_factory: StoreFactory) -> None:
    store = store_factory()
    store.write_app_state("app", [("a", codec.pack(1)), ("b", codec.pack(b"x"))]).result()
    store.write_app_state("app", [("b", codec.pack([2]))]).result()
    store.write_user_state("app", "ada", [("u", codec.pack(None))]).result()
    assert store.read_app_state("app") == {"a": 1, "b": [2]}
    assert store.read_user_state("app", "ada") == {"u": None}
    assert store.list_apps() == ["app"]
    assert store.list_users("app") == ["ada"]


def _nested(levels: int) -> Any:
    """Return a value nested ``levels`` lists deep (a str inside the innermost)."""
    value: Any = "leaf"
    for _ in range(levels):
        value = [value]
    return value


def test_an_event_nested_as_deep_as_the_service_stores_exports_and_imports(
    store_factory: StoreFactory, tmp_path: Path
) -> None:
    # The service bounds each field of an event (and each value of its delta)
    # from itself; in the stored record they sit one to three levels deeper.
    from sessionscope.core import MAX_DEPTH

    source = store_factory.fresh("source")
    svc = SyncSessionService(source)
    session = svc.create_session(app_name="app", user_id="user", session_id="deep")
    deepest = _nested(MAX_DEPTH - 1)
    svc.append_event(
        session,
        ev(ts=1.0, content=deepest, custom_metadata={"k": _nested(MAX_DEPTH - 2)}),
    )
    svc.append_event(session, ev(ts=2.0, delta={"deep": deepest, "user:deep": deepest}))
    out = tmp_path / "deep.ssd"
    export_dump(source, out)
    target = store_factory.fresh("target")
    import_dump(target, out)
    assert snapshot(target) == snapshot(source)
    back = SyncSessionService(target).get_session(app_name="app", user_id="user", session_id="deep")
    assert back is not None and back.events[0].content == deepest
    assert back.state["deep"] == deepest


def test_an_event_nested_deeper_than_the_service_stores_is_refused(
    store_factory: StoreFactory, good_dump: Path, tmp_path: Path
) -> None:
    from sessionscope.core import MAX_DEPTH

    records = _records(good_dump)
    at = next(i for i, record in enumerate(records) if record[0] == "event")
    fields = codec.decode_event(records[at][3])
    fields["custom_metadata"] = {"k": _nested(MAX_DEPTH)}
    records[at][3] = bytes([codec.EVENT_FORMAT]) + codec.pack(fields)
    deep = tmp_path / "deeper.ssd"
    _write_records(deep, records)
    _refused(store_factory(), deep, r"event\['custom_metadata'\]\['k'\].*nested too deeply")
