"""Dumps from outside: whatever the service would refuse is refused before anything is written.

Each bad dump here is well formed (its trailer counts and checksum agree), so
only the check of its content can refuse it; the store it was meant for is
left byte for byte as it was, and a new store is not even created.
"""

from __future__ import annotations

import gzip
import json
import math
import textwrap
from collections.abc import Callable
from hashlib import blake2b
from pathlib import Path
from typing import Any

import pytest

from _stores import child_json, run_cli
from sessionscope import LmdbStore, MemoryStore, SyncSessionService
from sessionscope.admin.dump import (
    DUMP_FORMAT,
    MAGIC,
    MAX_RECORD_BYTES,
    MAX_STATE_KEYS,
    DumpCounts,
    check_dump,
    export_dump,
    import_dump,
)
from sessionscope.codec import pack, pack_event
from sessionscope.errors import DumpError
from sessionscope.stores.lmdb import path_uri
from sessionscope.stores.records import ENCRYPTION_MARKER_APP

Record = list[Any]


def event(event_id: str, stamp: float, **fields: Any) -> Record:
    record = {"id": event_id, "timestamp": stamp, "author": "agent", **fields}
    return ["event", event_id, stamp, pack_event(record)]


def session(
    sid: str = "s1",
    *,
    app: str = "app",
    user: str = "user",
    state: dict[str, Any] | None = None,
    created: float = 1000.0,
    updated: float = 1002.0,
    events: list[Record] | None = None,
) -> list[Record]:
    events = [event("e1", 1001.0), event("e2", 1002.0)] if events is None else events
    packed = {key: pack(value) for key, value in (state or {"topic": "t"}).items()}
    return [["session", app, user, sid, created, updated, packed, len(events)], *events]


def write_dump(path: Path, body: list[Record], *, version: Any = DUMP_FORMAT) -> Path:
    """Write a dump whose trailer and checksum agree with its records, whatever they hold."""
    records: list[Record] = [[MAGIC, version, {"app_name": None, "user_id": None}], *body]
    apps = {r[1] for r in body if r[0] in ("app", "user", "session")}
    counts = {
        "apps": len(apps),
        "users": sum(r[0] == "user" for r in body),
        "sessions": sum(r[0] == "session" for r in body),
        "events": sum(r[0] == "event" for r in body),
        "records": len(records),
    }
    digest = blake2b(digest_size=32)
    for record in records:
        digest.update(pack(record))
    data = b"".join(pack(r) for r in records) + pack(["end", counts, digest.digest()])
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


def good_body() -> list[Record]:
    return [
        ["app", "app", {"plan": pack("gold"), "temp:kept": pack(1), "user:x": pack(2)}],
        ["user", "app", "user", {"name": pack("Ada")}],
        *session(state={"topic": "t", "cart": [1, 2]}),
    ]


@pytest.fixture
def target(tmp_path: Path) -> Path:
    """A closed store holding one session of its own."""
    path = tmp_path / "target"
    with SyncSessionService(LmdbStore(path)) as svc:
        svc.create_session(app_name="mine", user_id="me", session_id="kept", state={"a": 1})
    return path


def refused(target: Path, dump: Path, match: str) -> None:
    """Import ``dump`` into ``target``: refused with ``match``, and the store byte for byte kept."""
    before = (target / "data.mdb").read_bytes()
    store = LmdbStore(target)
    try:
        with pytest.raises(DumpError, match=match) as caught:
            import_dump(store, dump)
    finally:
        store.close()
    assert "nothing was imported" in str(caught.value)
    assert (target / "data.mdb").read_bytes() == before
    with pytest.raises(DumpError, match=match):
        check_dump(dump)


def test_the_well_formed_dump_these_tests_alter_imports(target: Path, tmp_path: Path) -> None:
    dump = write_dump(tmp_path / "good.dump", good_body())
    assert check_dump(dump) == DumpCounts(1, 1, 1, 2)
    with SyncSessionService(LmdbStore(target)) as svc:
        assert import_dump(svc.store, dump) == DumpCounts(1, 1, 1, 2)
        got = svc.get_session(app_name="app", user_id="user", session_id="s1")
        assert got is not None
        assert got.state == {
            "topic": "t",
            "cart": [1, 2],
            "app:plan": "gold",
            "app:temp:kept": 1,
            "app:user:x": 2,
            "user:name": "Ada",
        }
        assert [e.id for e in got.events] == ["e1", "e2"]


BAD_DUMPS: dict[str, tuple[Callable[[], list[Record]], str]] = {
    "empty app id": (lambda: [["app", "", {}]], "bad app_name: app_name must not be empty"),
    "app id over the limit": (
        lambda: [["app", "a" * 4097, {}]],
        "bad app_name: app_name is 4097 bytes",
    ),
    "empty user id": (lambda: [["user", "app", "", {}]], "bad user_id"),
    "empty session id": (lambda: session(""), "bad session_id"),
    "session id the service strips": (lambda: session(" s1 "), "session_id with surrounding"),
    "user id over the limit": (lambda: session(user="u" * 5000), "bad user_id"),
    "empty event id": (lambda: session(events=[event("", 1001.0)]), "bad event.id"),
    "temp key in a session map": (
        lambda: session(state={"temp:scratch": 1}),
        "'temp:scratch' in the state of session 's1'.*temp keys",
    ),
    "app key in a session map": (
        lambda: session(state={"app:plan": 1}),
        "'app:plan' in the state of session 's1'.*app keys",
    ),
    "user key in a session map": (
        lambda: session(state={"user:name": 1}),
        "'user:name' in the state of session 's1'.*user keys",
    ),
    "NaN create time": (lambda: session(created=math.nan), "create time .*nan.*finite"),
    "infinite last update": (lambda: session(updated=math.inf), "last update time .*finite"),
    "NaN event time": (
        lambda: session(events=[["event", "e1", math.nan, event("e1", math.nan)[3]]]),
        "event time .*finite",
    ),
    "event time other than its record's": (
        lambda: session(events=[["event", "e1", 1001.5, event("e1", 1001.0)[3]]]),
        "dumped at 1001.5 but its record says 1001.0",
    ),
    "event id other than its record's": (
        lambda: session(events=[["event", "e9", 1001.0, event("e1", 1001.0)[3]]]),
        "does not match.*another id",
    ),
    "event id twice": (
        lambda: session(events=[event("e1", 1001.0), event("e1", 1002.0)]),
        "event id 'e1' twice",
    ),
    "temp key kept in an event's delta": (
        lambda: session(
            events=[event("e1", 1001.0, actions={"state_delta": {"temp:x": 1, "k": 2}})]
        ),
        "state delta keeps a temp: key",
    ),
    "partial event": (
        lambda: session(events=[event("e1", 1001.0, partial=True)]),
        "has a partial event 'e1' in session 's1', which the service never stores",
    ),
    "state value nested deeper than the service stores": (
        lambda: [["app", "app", {"deep": b"\x91" * 600 + b"\xc0"}]],
        "would refuse: .*nested too deeply",
    ),
    "negative event count": (
        lambda: [["session", "app", "user", "s1", 1.0, 2.0, {}, -1]],
        "negative event count",
    ),
    "the same session twice": (lambda: [*session(), *session()], "holds session 's1' twice"),
    # The name an encrypted store's marker is kept under is a dump's first
    # record or nothing: later, a marker would make the store it is
    # imported into read as encrypted, with no key to open it.
    "an encryption marker after the first record": (
        lambda: [["app", "app", {}], ["app", ENCRYPTION_MARKER_APP, {"keystore": pack("x")}]],
        "bad app_name: .*reserved for the store's encryption marker",
    ),
    "a user under the marker's name": (
        lambda: [["user", ENCRYPTION_MARKER_APP, "user", {"name": pack("Ada")}]],
        "bad app_name: .*reserved",
    ),
    "a session under the marker's name": (
        lambda: session(app=ENCRYPTION_MARKER_APP),
        "bad app_name: .*reserved",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_DUMPS))
def test_what_the_service_would_refuse_is_refused(target: Path, tmp_path: Path, case: str) -> None:
    body, match = BAD_DUMPS[case]
    refused(target, write_dump(tmp_path / "bad.dump", body()), match)


@pytest.mark.parametrize("version", [-1, 0, True, 1.0, "1", None])
def test_a_format_version_the_reader_does_not_know_is_refused(
    target: Path, tmp_path: Path, version: Any
) -> None:
    dump = write_dump(tmp_path / "bad.dump", good_body(), version=version)
    refused(target, dump, "format|no valid format version")


def test_a_bad_dump_into_a_new_path_creates_nothing(tmp_path: Path) -> None:
    """The command checks the whole dump before it creates the store."""
    for case, (body, _) in sorted(BAD_DUMPS.items())[:6]:
        dump = write_dump(tmp_path / "bad.dump", body())
        new = tmp_path / "new"
        done = run_cli("import", path_uri(new), str(dump))
        assert done.returncode == 1, case
        assert done.stderr.count("\n") == 1 and "DumpError" in done.stderr, done.stderr
        assert not new.exists(), case


# -- bounded cost of refusing -------------------------------------------------------


def _huge_record_gz(path: Path, size: int) -> Path:
    """Write a small .gz whose one record after the header inflates to ``size`` bytes."""
    header = pack([MAGIC, DUMP_FORMAT, {"app_name": None, "user_id": None}])
    chunk = bytes(1 << 20)
    with gzip.open(path, "wb", compresslevel=9) as file:
        file.write(header)
        # An app record whose state value is one bin of ``size`` bytes.
        file.write(b"\x93\xa3app\xa3app\x81\xa1k\xc6" + size.to_bytes(4, "big"))
        for _ in range(size // len(chunk)):
            file.write(chunk)
    return path


_MEASURE = textwrap.dedent(
    """
    import json, sys
    from sessionscope import MemoryStore
    from sessionscope.admin.dump import import_dump
    from sessionscope.errors import DumpError
    try:
        import_dump(MemoryStore(), sys.argv[1])
        outcome = "imported"
    except DumpError as error:
        outcome = str(error)
    # VmHWM is this process image's own peak: ru_maxrss would carry over the
    # forking parent's (pytest's) peak across exec.
    peak = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status")
                if line.startswith("VmHWM:"))
    print(json.dumps({"outcome": outcome, "peak": peak}))
    """
)


def _measure(dump: Path) -> dict[str, Any]:
    result: dict[str, Any] = child_json("-c", _MEASURE, str(dump), timeout=300)
    return result


def test_a_small_gz_holding_a_huge_record_is_refused_in_bounded_memory(tmp_path: Path) -> None:
    dump = _huge_record_gz(tmp_path / "bomb.dump.gz", 256 << 20)
    assert dump.stat().st_size < 1 << 20
    result = _measure(dump)
    assert f"over the limits of one ({MAX_RECORD_BYTES:,} bytes" in result["outcome"]
    assert len(result["outcome"]) < 500
    # The interpreter and the package take some 40 MiB, the reader's buffer up
    # to about twice the record limit: the 256 MiB record is never held.
    assert result["peak"] < 160 << 20, result


def test_huge_maps_arrays_and_strings_are_refused_from_their_headers(tmp_path: Path) -> None:
    header = pack([MAGIC, DUMP_FORMAT, {}])
    cases = {
        "map": b"\x93\xa3app\xa3app\xdf" + (MAX_STATE_KEYS + 1).to_bytes(4, "big"),
        "array": b"\xdd" + (1 << 30).to_bytes(4, "big"),
    }
    for name, body in cases.items():
        dump = tmp_path / f"{name}.dump"
        dump.write_bytes(header + body + b"\0" * 1024)
        result = _measure(dump)
        assert "over the limits of one" in result["outcome"], (name, result)
        assert result["peak"] < 200 << 20, (name, result)
    # A string's length is checked once it is in: the buffer's limit stops it first.
    dump = tmp_path / "str.dump.gz"
    with gzip.open(dump, "wb") as file:
        file.write(header + b"\x92\xa3app\xdb" + (MAX_RECORD_BYTES + 1).to_bytes(4, "big"))
        for _ in range(MAX_RECORD_BYTES // (1 << 20) + 1):
            file.write(b"a" * (1 << 20))
    result = _measure(dump)
    assert "over the limits of one" in result["outcome"], result
    assert result["peak"] < 200 << 20, result


def test_an_error_never_quotes_a_whole_record(target: Path, tmp_path: Path) -> None:
    big = "x" * (8 << 20)
    dump = write_dump(tmp_path / "odd.dump", [["unknown", big, big]])
    with pytest.raises(DumpError) as caught:
        check_dump(dump)
    assert "cannot read: an array of 3 starting with 'unknown'" in str(caught.value)
    assert len(str(caught.value)) < 500
    dump = write_dump(tmp_path / "key.dump", session(state={"temp:" + big: 1}))
    with pytest.raises(DumpError) as caught:
        check_dump(dump)
    assert len(str(caught.value)) < 1000


def test_an_export_refuses_a_record_no_import_would_take(tmp_path: Path) -> None:
    store = MemoryStore()
    with SyncSessionService(store) as svc:
        svc.create_session(app_name="app", user_id="u", session_id="big",
                           state={"blob": b"x" * (MAX_RECORD_BYTES + 1)})  # fmt: skip
        out = tmp_path / "big.dump"
        with pytest.raises(DumpError, match="cannot dump 'session' 'app' 'u' 'big'"):
            export_dump(store, out)
    assert list(tmp_path.iterdir()) == []


# -- counts of a second import -------------------------------------------------------


def test_a_second_import_reports_the_same_counts_and_what_it_skipped(tmp_path: Path) -> None:
    dump = write_dump(tmp_path / "good.dump", [*good_body(), *session("s2", events=[])])
    uri = path_uri(tmp_path / "copy")
    first = run_cli("import", uri, str(dump), "--json")
    second = run_cli("import", uri, str(dump), "--json")
    assert first.returncode == second.returncode == 0, (first.stderr, second.stderr)
    one, two = json.loads(first.stdout), json.loads(second.stdout)
    counts = ("apps", "users", "sessions", "events")
    assert [one[k] for k in counts] == [two[k] for k in counts] == [1, 1, 2, 2]
    assert one["imported"] == {"sessions": 2, "events": 2}
    assert one["skipped"] == {"sessions": 0, "events": 0}
    assert two["imported"] == {"sessions": 0, "events": 0}
    assert two["skipped"] == {"sessions": 2, "events": 2}
    text = run_cli("import", uri, str(dump)).stdout
    assert "sessions skipped (stored already, equal)" in text
    assert "sessions imported" in text
