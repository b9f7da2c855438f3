"""Stores written by earlier versions (formats 1 and 2) read back exactly.

``tests/golden/format-N`` was written once by ``tests/golden/make_golden.py``
in format N and is never rewritten: a change to the layout or the codec that
cannot read one breaks this test, and needs a new format version.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import lmdb
import pytest

from golden.make_golden import APP, LATE_APP, LATE_TIMES, ODD_ID, VALUES
from sessionscope import (
    Event,
    EventActions,
    GetSessionConfig,
    LmdbStore,
    SyncSessionService,
    codec,
)

GOLDEN = Path(__file__).parent / "golden"
FORMATS = (1, 2)


@pytest.fixture(params=FORMATS)
def service(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SyncSessionService]:
    """Open a copy of a golden store: the committed files are never touched."""
    copy = tmp_path / "store"
    copy.mkdir()
    shutil.copy(GOLDEN / f"format-{request.param}" / "data.mdb", copy / "data.mdb")
    opened = SyncSessionService(LmdbStore(copy))
    assert opened.store.format == request.param  # type: ignore[attr-defined]
    assert opened.store.check_layout() == []  # type: ignore[attr-defined]
    yield opened
    opened.close()


@pytest.mark.parametrize("version", FORMATS)
def test_each_golden_store_records_its_format(version: int) -> None:
    env = lmdb.open(str(GOLDEN / f"format-{version}"), readonly=True, lock=False, max_dbs=8)
    try:
        with env.begin() as txn:
            meta = env.open_db(b"meta", txn=txn, create=False)
            header = txn.get(b"format", db=meta)
    finally:
        env.close()
    assert header is not None and header[0] == version
    assert codec.unpack(header[1:]) == {"magic": "sessionscope", "format": version}


def test_sessions_state_and_events_read_back(service: SyncSessionService) -> None:
    session = service.get_session(app_name=APP, user_id="ada", session_id="s1")
    assert session is not None
    assert session.state == {
        **VALUES,
        "turn": 4,
        "app:plan": "pro",
        "user:name": "Ada",
        "user:seen": 4,
    }
    assert [e.id for e in session.events] == [f"e{n}" for n in range(5)]
    for n, event in enumerate(session.events):
        assert event.author == ("model" if n % 2 else "user")
        assert event.timestamp == 1_700_000_000.0 + n
        assert event.content == {"parts": [{"text": f"turn {n}"}], "blob": bytes([n])}
        assert event.actions.state_delta == {"turn": n, "user:seen": n}
        assert event.custom_metadata == {"n": n}
    assert service.get_app_state(app_name=APP) == {"plan": "pro"}
    assert service.get_user_state(app_name=APP, user_id="ada") == {"name": "Ada", "seen": 4}


def test_filters_listing_and_long_ids_read_back(service: SyncSessionService) -> None:
    last = service.get_session(
        app_name=APP,
        user_id="ada",
        session_id="s1",
        config=GetSessionConfig(num_recent_events=2, after_timestamp=1_700_000_004.0),
    )
    assert last is not None and [e.id for e in last.events] == ["e4"]
    odd = service.get_session(app_name=APP, user_id="bob", session_id=ODD_ID)
    assert odd is not None and [e.content for e in odd.events] == ["hi"]
    listed = service.list_sessions(app_name=APP).sessions
    assert [(m.user_id, m.id, m.event_count) for m in listed] == [
        ("ada", "s1", 5),
        ("bob", ODD_ID, 1),
    ]


def test_the_golden_store_takes_new_appends(service: SyncSessionService) -> None:
    session = service.get_session(app_name=APP, user_id="ada", session_id="s1")
    assert session is not None
    service.append_event(
        session, Event(author="user", actions=EventActions(state_delta={"turn": 5}))
    )
    again = service.get_session(app_name=APP, user_id="ada", session_id="s1")
    assert again is not None and len(again.events) == 6 and again.state["turn"] == 5
    page = service.list_sessions(app_name=APP, limit=1)
    assert [(m.user_id, m.id) for m in page.sessions] == [("bob", ODD_ID)]
    assert page.next_cursor is not None
    rest = service.list_sessions(app_name=APP, limit=1, cursor=page.next_cursor)
    assert [(m.user_id, m.id) for m in rest.sessions] == [("ada", "s1")]
    assert service.store.check_layout() == []  # type: ignore[attr-defined]


def test_format_2_keeps_a_time_index_only_where_times_went_back(tmp_path: Path) -> None:
    copy = tmp_path / "store"
    copy.mkdir()
    shutil.copy(GOLDEN / "format-2" / "data.mdb", copy / "data.mdb")
    with SyncSessionService(LmdbStore(copy)) as service:
        late = service.get_session(
            app_name=LATE_APP,
            user_id="cy",
            session_id="late",
            config=GetSessionConfig(after_timestamp=1_700_000_025.0),
        )
        assert late is not None and [e.id for e in late.events] == ["l1", "l3"]
        assert [e.timestamp for e in late.events] == [LATE_TIMES[1], LATE_TIMES[3]]
        (record,) = service.store.list_sessions(LATE_APP, None)
        assert record.time_indexed
        (ada, odd) = sorted(service.store.list_sessions(APP, None), key=lambda r: r.user_id)
        assert not ada.time_indexed and not odd.time_indexed
