"""The session contract, checked on the synchronous service over every store.

Each test names the contract rule it checks; the same rules are checked on the
asynchronous facade in test_service_sync_async.py.
"""

from __future__ import annotations

import math
import threading
import time
import tracemalloc
from typing import Any

import pytest

import _stores
from _stores import (
    APP,
    USER,
    StoreFactory,
    as_plain,
    clone,
    ev,
    event_ids,
    list_all,
)
from sessionscope import (
    Event,
    GetSessionConfig,
    ListSessionsResponse,
    Session,
    SessionMeta,
    SyncSessionService,
)
from sessionscope.errors import (
    AlreadyExistsError,
    DuplicateEventError,
    SessionNotFoundError,
    SessionscopeError,
    StaleSessionError,
    StateValueError,
    StoreClosedError,
)

# Fixtures shared with the other modules (bound here so pytest finds them).
store_factory = _stores.store_factory
lmdb_factory = _stores.lmdb_factory
svc = _stores.svc

ODD_IDS = [
    "a:b",
    "a/b",
    "/",
    ":",
    "nul\x00inside",
    "\x00",
    "with space",
    "日本語のセッション",
    "emoji 🎉🧪",
    "tab\tinside",
    "a" * 600,  # longer than an LMDB key
]

ALL_TYPES: dict[str, Any] = {
    "none": None,
    "true": True,
    "false": False,
    "int": 42,
    "int_max": 2**63 - 1,
    "int_min": -(2**63),
    "float": 1.25,
    "float_neg": -0.5,
    "inf": math.inf,
    "str": "héllo wörld",
    "empty_str": "",
    "bytes": b"\x00\xffbin",
    "empty_bytes": b"",
    "list": [1, "two", None, [3.5, b"x"], {"k": [True]}],
    "empty_list": [],
    "dict": {"a": {"b": {"c": [1, {"d": b"e"}]}}, "n": None},
    "empty_dict": {},
}


def _stored(svc: SyncSessionService, sid: str, app: str = APP, user: str = USER) -> Session:
    got = svc.get_session(app_name=app, user_id=user, session_id=sid)
    assert got is not None, f"session {sid!r} is missing"
    return got


# Identity


@pytest.mark.parametrize("odd", ODD_IDS, ids=lambda s: repr(s[:20]))
def test_odd_characters_in_every_id(svc: SyncSessionService, odd: str) -> None:
    """Ids are arbitrary non-empty str: ':', '/', NUL, spaces, any Unicode."""
    s = svc.create_session(app_name=odd, user_id=odd, session_id=odd, state={"k": odd})
    assert (s.app_name, s.user_id, s.id) == (odd, odd, odd)
    got = _stored(svc, odd, app=odd, user=odd)
    assert (got.app_name, got.user_id, got.id) == (odd, odd, odd)
    assert got.state == {"k": odd}
    svc.append_event(got, ev(delta={"user:u": odd, "app:a": odd}))
    assert svc.get_user_state(app_name=odd, user_id=odd) == {"u": odd}
    assert svc.get_app_state(app_name=odd) == {"a": odd}
    listed = svc.list_sessions(app_name=odd, user_id=odd).sessions
    assert [(m.app_name, m.user_id, m.id) for m in listed] == [(odd, odd, odd)]
    assert [m.id for m in svc.list_sessions(app_name=odd).sessions] == [odd]
    svc.delete_session(app_name=odd, user_id=odd, session_id=odd)
    assert svc.get_session(app_name=odd, user_id=odd, session_id=odd) is None


def test_separator_characters_do_not_make_triples_collide(svc: SyncSessionService) -> None:
    """The owner triple is three separate values, whatever characters they hold."""
    triples = [
        ("a", "b:c", "d"),
        ("a:b", "c", "d"),
        ("a", "b", "c:d"),
        ("a", "b\x00c", "d"),
        ("a\x00b", "c", "d"),
        ("a", "b", "c\x00d"),
        ("a", "b/c", "d"),
        ("a/b", "c", "d"),
    ]
    for n, (app, user, sid) in enumerate(triples):
        svc.create_session(
            app_name=app,
            user_id=user,
            session_id=sid,
            state={"n": n, "user:n": n, "app:n": n},
        )
    last_user = {(app, user): n for n, (app, user, _sid) in enumerate(triples)}
    last_app = {app: n for n, (app, _user, _sid) in enumerate(triples)}
    for n, (app, user, sid) in enumerate(triples):
        got = _stored(svc, sid, app=app, user=user)
        assert got.state["n"] == n
        assert got.state["user:n"] == last_user[app, user]
        assert got.state["app:n"] == last_app[app]
        assert svc.get_user_state(app_name=app, user_id=user) == {"n": last_user[app, user]}
        assert svc.get_app_state(app_name=app) == {"n": last_app[app]}
    listed_a = {(m.user_id, m.id) for m in svc.list_sessions(app_name="a").sessions}
    assert listed_a == {(u, s) for a, u, s in triples if a == "a"}
    in_a_b = {m.id for m in svc.list_sessions(app_name="a", user_id="b").sessions}
    assert in_a_b == {"c:d", "c\x00d"}


def test_same_session_id_is_separate_per_app_and_user(svc: SyncSessionService) -> None:
    """session_id is unique within (app_name, user_id) only."""
    for app, user in [("a1", "u1"), ("a1", "u2"), ("a2", "u1")]:
        svc.create_session(app_name=app, user_id=user, session_id="s", state={"who": app + user})
    for app, user in [("a1", "u1"), ("a1", "u2"), ("a2", "u1")]:
        assert _stored(svc, "s", app=app, user=user).state == {"who": app + user}


def test_ids_of_4_kib_work(svc: SyncSessionService) -> None:
    """Ids up to 4 KiB of UTF-8 work for app, user and session."""
    app, user, sid = "a" * 4096, "u" * 4096, "s" * 4096
    s = svc.create_session(app_name=app, user_id=user, session_id=sid, state={"user:x": 1})
    assert s.id == sid
    svc.append_event(s, ev(delta={"k": 1}))
    got = _stored(svc, sid, app=app, user=user)
    assert (got.app_name, got.user_id, got.id) == (app, user, sid)
    assert got.state == {"k": 1, "user:x": 1}
    assert [m.id for m in svc.list_sessions(app_name=app, user_id=user).sessions] == [sid]
    assert svc.get_user_state(app_name=app, user_id=user) == {"x": 1}
    # Multi-byte characters count in bytes: 2048 two-byte characters are 4 KiB.
    wide = "é" * 2048
    assert len(wide.encode()) == 4096
    svc.create_session(app_name=wide, user_id=wide, session_id=wide)
    assert _stored(svc, wide, app=wide, user=wide).id == wide
    svc.delete_session(app_name=app, user_id=user, session_id=sid)
    assert svc.get_session(app_name=app, user_id=user, session_id=sid) is None


def test_long_ids_sharing_a_4000_byte_prefix_do_not_collide(svc: SyncSessionService) -> None:
    """Long ids are kept whole: a shared long prefix never merges two owners."""
    prefix = "p" * 4000
    one, two = prefix + "1" * 96, prefix + "2" * 96
    assert len(one.encode()) == len(two.encode()) == 4096
    for x in (one, two):
        svc.create_session(
            app_name=x, user_id=x, session_id=x, state={"v": x[-1], "user:v": x[-1], "app:v": x}
        )
        svc.create_session(app_name=APP, user_id=x, session_id=x, state={"v": x[-1]})
        svc.create_session(app_name=APP, user_id=USER, session_id=x, state={"v": x[-1]})
    for x in (one, two):
        assert _stored(svc, x, app=x, user=x).state == {"v": x[-1], "user:v": x[-1], "app:v": x}
        assert _stored(svc, x, user=x).state["v"] == x[-1]
        assert _stored(svc, x).state["v"] == x[-1]
        assert svc.get_app_state(app_name=x) == {"v": x}
        assert svc.get_user_state(app_name=x, user_id=x) == {"v": x[-1]}
    assert sorted(m.id for m in svc.list_sessions(app_name=APP, user_id=USER).sessions) == [
        one,
        two,
    ]
    assert sorted(m.user_id for m in svc.list_sessions(app_name=APP).sessions) == sorted(
        [one, two, USER, USER]
    )
    svc.delete_session(app_name=APP, user_id=USER, session_id=one)
    assert svc.get_session(app_name=APP, user_id=USER, session_id=one) is None
    assert _stored(svc, two).state["v"] == "2"


@pytest.mark.parametrize("arg", ["app_name", "user_id", "session_id"])
@pytest.mark.parametrize(
    "bad",
    [123, b"bytes", 1.5, ["list"], "x" * 4097, "é" * 2049],
    ids=["int", "bytes", "float", "list", "4097-ascii", "4098-utf8"],
)
def test_bad_ids_on_create_are_value_errors_naming_the_argument(
    svc: SyncSessionService, arg: str, bad: Any
) -> None:
    """Wrong type or over 4 KiB: a ValueError that names the argument, nothing stored."""
    kwargs: dict[str, Any] = {"app_name": APP, "user_id": USER, "session_id": "s"}
    kwargs[arg] = bad
    with pytest.raises(ValueError, match=arg):
        svc.create_session(**kwargs, state={"app:a": 1, "user:u": 1})
    assert svc.get_app_state(app_name=APP) == {}
    assert svc.get_user_state(app_name=APP, user_id=USER) == {}
    assert svc.list_sessions(app_name=APP).sessions == []


@pytest.mark.parametrize("arg", ["app_name", "user_id"])
def test_empty_app_or_user_is_a_value_error(svc: SyncSessionService, arg: str) -> None:
    """Empty app_name or user_id: a ValueError that names the argument."""
    kwargs: dict[str, Any] = {"app_name": APP, "user_id": USER}
    kwargs[arg] = ""
    with pytest.raises(ValueError, match=arg):
        svc.create_session(**kwargs)
    with pytest.raises(ValueError, match=arg):
        svc.get_session(**kwargs, session_id="s")
    with pytest.raises(ValueError, match=arg):
        svc.delete_session(**kwargs, session_id="s")
    with pytest.raises(ValueError, match=arg):
        svc.get_user_state(**kwargs)
    if arg == "app_name":
        with pytest.raises(ValueError, match=arg):
            svc.list_sessions(app_name="")
        with pytest.raises(ValueError, match=arg):
            svc.get_app_state(app_name="")
    else:
        with pytest.raises(ValueError, match=arg):
            svc.list_sessions(app_name=APP, user_id="")


@pytest.mark.parametrize(
    "bad", [None, 5, "", "s" * 4097], ids=["none", "int", "empty", "4097-bytes"]
)
def test_bad_session_id_on_get_and_delete(svc: SyncSessionService, bad: Any) -> None:
    """get and delete need a real session_id: a ValueError naming it."""
    svc.create_session(app_name=APP, user_id=USER, session_id="keep")
    with pytest.raises(ValueError, match="session_id"):
        svc.get_session(app_name=APP, user_id=USER, session_id=bad)
    with pytest.raises(ValueError, match="session_id"):
        svc.delete_session(app_name=APP, user_id=USER, session_id=bad)
    assert _stored(svc, "keep").id == "keep"


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.get_session(app_name=1, user_id=USER, session_id="s"),
        lambda s: s.get_session(app_name=APP, user_id=None, session_id="s"),
        lambda s: s.delete_session(app_name=APP, user_id=2, session_id="s"),
        lambda s: s.list_sessions(app_name=None),
        lambda s: s.list_sessions(app_name=APP, user_id=3),
        lambda s: s.list_sessions(app_name="a" * 4097),
        lambda s: s.get_user_state(app_name=APP, user_id=b"u"),
        lambda s: s.get_user_state(app_name=APP, user_id="u" * 4097),
        lambda s: s.get_app_state(app_name=4),
        lambda s: s.get_app_state(app_name="a" * 4097),
    ],
    ids=[
        "get-app",
        "get-user",
        "delete-user",
        "list-app",
        "list-user",
        "list-app-long",
        "user-state-user",
        "user-state-long",
        "app-state-app",
        "app-state-long",
    ],
)
def test_bad_ids_on_every_operation(svc: SyncSessionService, call: Any) -> None:
    """Every operation checks its ids the same way."""
    with pytest.raises(ValueError, match=r"app_name|user_id"):
        call(svc)


def test_bad_ids_in_an_appended_session(svc: SyncSessionService) -> None:
    """append_event checks the ids the session object carries."""
    svc.create_session(app_name=APP, user_id=USER, session_id="s")
    for kwargs in [
        {"id": "s", "app_name": "", "user_id": USER},
        {"id": "s", "app_name": APP, "user_id": ""},
        {"id": "s" * 4097, "app_name": APP, "user_id": USER},
        {"id": 7, "app_name": APP, "user_id": USER},
    ]:
        with pytest.raises(ValueError):
            svc.append_event(Session(**kwargs), ev(delta={"k": 1}))
    assert _stored(svc, "s").events == []


@pytest.mark.parametrize("given", [None, "", "   ", "\t\n "], ids=repr)
def test_missing_session_id_generates_a_fresh_one(svc: SyncSessionService, given: Any) -> None:
    """None, '' or all-whitespace on create: a fresh id is generated."""
    a = svc.create_session(app_name=APP, user_id=USER, session_id=given)
    b = svc.create_session(app_name=APP, user_id=USER, session_id=given)
    for s in (a, b):
        assert isinstance(s.id, str)
        assert s.id.strip() == s.id != ""
        assert _stored(svc, s.id).id == s.id
    assert a.id != b.id
    assert {m.id for m in svc.list_sessions(app_name=APP).sessions} == {a.id, b.id}


def test_surrounding_whitespace_is_stripped_everywhere(svc: SyncSessionService) -> None:
    """create, get, list, delete and append strip session_id the same way."""
    created = svc.create_session(app_name=APP, user_id=USER, session_id=" s1 ")
    assert created.id == "s1"
    for sid in ("s1", " s1", "s1 ", "\ts1\n"):
        assert _stored(svc, sid).id == "s1"
    assert [m.id for m in svc.list_sessions(app_name=APP).sessions] == ["s1"]
    with pytest.raises(AlreadyExistsError):
        svc.create_session(app_name=APP, user_id=USER, session_id="s1")
    with pytest.raises(AlreadyExistsError):
        svc.create_session(app_name=APP, user_id=USER, session_id="  s1\t")
    # A hand-built session whose id carries whitespace appends to the same session.
    by_hand = Session(id="  s1 ", app_name=APP, user_id=USER)
    e = svc.append_event(by_hand, ev(delta={"k": 1}))
    assert event_ids(_stored(svc, "s1")) == [e.id]
    # Inner whitespace is part of the id.
    svc.create_session(app_name=APP, user_id=USER, session_id=" s 1 ")
    assert _stored(svc, "s 1").id == "s 1"
    svc.delete_session(app_name=APP, user_id=USER, session_id=" s1\n")
    assert svc.get_session(app_name=APP, user_id=USER, session_id="s1") is None
    assert [m.id for m in svc.list_sessions(app_name=APP).sessions] == ["s 1"]


# create_session


def test_create_returns_merged_state_no_events_and_now(svc: SyncSessionService) -> None:
    """create returns session, app: and user: keys, no events, last_update_time = now."""
    before = time.time()
    s = svc.create_session(
        app_name=APP,
        user_id=USER,
        session_id="s",
        state={"k": 1, "app:a": 2, "user:u": 3, "temp:t": 4},
    )
    after = time.time()
    assert s.state == {"k": 1, "app:a": 2, "user:u": 3}
    assert s.events == []
    assert (s.id, s.app_name, s.user_id) == ("s", APP, USER)
    assert before - 1.0 <= s.last_update_time <= after + 1.0
    assert isinstance(s.revision, str)
    got = _stored(svc, "s")
    assert got.state == s.state
    assert got.last_update_time == s.last_update_time
    assert got.revision == s.revision


def test_create_routes_scopes_and_drops_temp(svc: SyncSessionService) -> None:
    """app: and user: keys go to the shared maps without prefix; temp: is dropped."""
    svc.create_session(
        app_name=APP,
        user_id=USER,
        session_id="s",
        state={"k": 1, "app:a": 2, "user:u": 3, "temp:t": 4},
    )
    assert svc.get_app_state(app_name=APP) == {"a": 2}
    assert svc.get_user_state(app_name=APP, user_id=USER) == {"u": 3}
    # Another session of the same user sees both shared maps, not the session key.
    other = svc.create_session(app_name=APP, user_id=USER, session_id="s2")
    assert other.state == {"app:a": 2, "user:u": 3}
    assert _stored(svc, "s2").state == {"app:a": 2, "user:u": 3}
    # Another user of the app sees the app map only.
    assert svc.create_session(app_name=APP, user_id="u2", session_id="s").state == {"app:a": 2}
    # Another app sees nothing.
    assert svc.create_session(app_name="app2", user_id=USER, session_id="s").state == {}
    assert "temp:t" not in _stored(svc, "s").state


def test_create_merges_shared_maps_key_by_key(svc: SyncSessionService) -> None:
    """app:/user: keys of a create are merged into the shared maps, key by key."""
    svc.create_session(app_name=APP, user_id=USER, state={"app:a": 1, "app:b": 1, "user:x": 1})
    s = svc.create_session(app_name=APP, user_id=USER, state={"app:b": 2, "app:c": 2, "user:y": 2})
    assert svc.get_app_state(app_name=APP) == {"a": 1, "b": 2, "c": 2}
    assert svc.get_user_state(app_name=APP, user_id=USER) == {"x": 1, "y": 2}
    assert s.state == {"app:a": 1, "app:b": 2, "app:c": 2, "user:x": 1, "user:y": 2}


def test_prefixes_are_case_sensitive_and_need_the_colon(svc: SyncSessionService) -> None:
    """The prefix is matched case-sensitively at the start of the key."""
    state = {
        "APP:a": 1,
        "App:b": 2,
        "USER:c": 3,
        "TEMP:d": 4,
        "Temp:e": 5,
        "app": 6,
        "user": 7,
        "temp": 8,
        "x:app:y": 9,
        " app:z": 10,
    }
    s = svc.create_session(app_name=APP, user_id=USER, session_id="s", state=state)
    assert s.state == state
    assert _stored(svc, "s").state == state
    assert svc.get_app_state(app_name=APP) == {}
    assert svc.get_user_state(app_name=APP, user_id=USER) == {}
    assert svc.create_session(app_name=APP, user_id=USER, session_id="s2").state == {}


def test_duplicate_create_raises_and_writes_nothing(svc: SyncSessionService) -> None:
    """Duplicate id: AlreadyExistsError; the existing session and shared maps are untouched."""
    svc.create_session(app_name=APP, user_id=USER, session_id="s", state={"k": 1, "app:a": 1})
    with pytest.raises(AlreadyExistsError):
        svc.create_session(
            app_name=APP, user_id=USER, session_id="s", state={"k": 2, "app:a": 2, "app:b": 2}
        )
    assert issubclass(AlreadyExistsError, SessionscopeError)
    assert _stored(svc, "s").state == {"k": 1, "app:a": 1}
    assert svc.get_app_state(app_name=APP) == {"a": 1}
    assert len(svc.list_sessions(app_name=APP).sessions) == 1


# State values


def test_every_storable_type_round_trips_nested(store_factory: StoreFactory) -> None:
    """None, bool, 64-bit int, float, str, bytes, list, dict: equal after a round trip."""
    svc = SyncSessionService(store_factory())
    state = {**ALL_TYPES, **{f"app:{k}": v for k, v in ALL_TYPES.items()}}
    state.update({f"user:{k}": v for k, v in ALL_TYPES.items()})
    svc.create_session(app_name=APP, user_id=USER, session_id="s", state=state)
    s = _stored(svc, "s")
    e = ev(delta={"d_" + k: v for k, v in ALL_TYPES.items()}, content=ALL_TYPES)
    e.custom_metadata = {"meta": ALL_TYPES}
    e.extra = {"x": ALL_TYPES}
    e.actions.extra = {"y": ALL_TYPES}
    svc.append_event(s, e)
    sessions = [_stored(svc, "s")]
    if store_factory.persistent:
        svc.close()
        sessions.append(_stored(SyncSessionService(store_factory.reopen()), "s"))
    for got in sessions:
        for k, v in ALL_TYPES.items():
            for key in (k, f"app:{k}", f"user:{k}", f"d_{k}"):
                assert got.state[key] == v, key
                assert type(got.state[key]) is type(v), key
        stored_event = got.events[-1]
        assert stored_event.content == ALL_TYPES
        assert type(stored_event.content["bytes"]) is bytes
        assert type(stored_event.content["true"]) is bool
        assert stored_event.custom_metadata == {"meta": ALL_TYPES}
        assert stored_event.extra == {"x": ALL_TYPES}
        assert stored_event.actions.extra == {"y": ALL_TYPES}
        assert stored_event == e


def test_tuples_come_back_as_lists(svc: SyncSessionService) -> None:
    """Tuples are stored and come back as lists."""
    s = svc.create_session(
        app_name=APP, user_id=USER, session_id="s", state={"t": (1, (2, 3)), "app:t": (4,)}
    )
    svc.append_event(s, ev(delta={"u": ("a", ("b",))}, content={"c": (1, 2)}))
    got = _stored(svc, "s")
    assert got.state["t"] == [1, [2, 3]] and type(got.state["t"]) is list
    assert type(got.state["t"][1]) is list
    assert got.state["app:t"] == [4]
    assert got.state["u"] == ["a", ["b"]]
    assert got.events[0].content == {"c": [1, 2]}
    assert type(got.events[0].content["c"]) is list


def test_none_is_stored_not_a_deletion(svc: SyncSessionService) -> None:
    """A None value is stored; it does not delete the key."""
    s = svc.create_session(
        app_name=APP, user_id=USER, session_id="s", state={"k": 1, "app:a": 1, "user:u": 1}
    )
    svc.append_event(s, ev(delta={"k": None, "app:a": None, "user:u": None}))
    assert s.state == {"k": None, "app:a": None, "user:u": None}
    assert _stored(svc, "s").state == {"k": None, "app:a": None, "user:u": None}
    assert svc.get_app_state(app_name=APP) == {"a": None}
    assert svc.get_user_state(app_name=APP, user_id=USER) == {"u": None}


def test_a_delta_dict_replaces_the_whole_dict(svc: SyncSessionService) -> None:
    """A delta value replaces the stored value: a dict replaces the whole dict."""
    s = svc.create_session(
        app_name=APP,
        user_id=USER,
        session_id="s",
        state={"d": {"a": 1, "b": 2}, "app:d": {"a": 1}, "user:d": {"a": 1}, "keep": 1},
    )
    svc.append_event(s, ev(delta={"d": {"c": 3}, "app:d": {"c": 3}, "user:d": {"c": 3}}))
    expected = {"d": {"c": 3}, "app:d": {"c": 3}, "user:d": {"c": 3}, "keep": 1}
    assert s.state == expected
    assert _stored(svc, "s").state == expected
    assert svc.get_app_state(app_name=APP) == {"d": {"c": 3}}


class _Custom:
    pass


UNSTORABLE = [
    ({"cart": [1, 2, {3}]}, "state['cart'][2]", "set"),
    ({"a": {"b": object()}}, "state['a']['b']", "object"),
    ({"c": 1 + 2j}, "state['c']", "complex"),
    ({"f": frozenset()}, "state['f']", "frozenset"),
    ({"x": _Custom()}, "state['x']", "_Custom"),
    ({"big": 2**64}, "state['big']", "int"),
    ({"d": {1: "int key"}}, "state['d']", ""),
    ({"app:s": {1, 2}}, "'app:s'", "set"),
    ({"user:n": [[object()]]}, "'user:n'][0][0]", "object"),
]


@pytest.mark.parametrize(("state", "path", "type_name"), UNSTORABLE)
def test_unstorable_value_on_create_names_the_path_and_writes_nothing(
    svc: SyncSessionService, state: dict[str, Any], path: str, type_name: str
) -> None:
    """An unstorable value is a TypeError naming the key path, raised before any write."""
    with pytest.raises(StateValueError) as info:
        svc.create_session(
            app_name=APP,
            user_id=USER,
            session_id="s",
            state={"ok": 1, "app:ok": 1, "user:ok": 1, **state},
        )
    assert isinstance(info.value, TypeError)
    assert path in str(info.value)
    assert type_name in str(info.value)
    assert svc.get_session(app_name=APP, user_id=USER, session_id="s") is None
    assert svc.get_app_state(app_name=APP) == {}
    assert svc.get_user_state(app_name=APP, user_id=USER) == {}
    assert svc.list_sessions(app_name=APP).sessions == []


def test_unstorable_value_in_the_cart_example(svc: SyncSessionService) -> None:
    """The message has the documented form: state['cart'][2]: set is not storable."""
    with pytest.raises(StateValueError, match=r"state\['cart'\]\[2\]: set is not storable"):
        svc.create_session(app_name=APP, user_id=USER, state={"cart": [1, 2, {3}]})


@pytest.mark.parametrize(("delta", "path", "type_name"), UNSTORABLE)
def test_unstorable_delta_names_the_path_and_writes_nothing(
    svc: SyncSessionService, delta: dict[str, Any], path: str, type_name: str
) -> None:
    """An unstorable delta value: StateValueError naming state[...]; nothing written."""
    s = svc.create_session(app_name=APP, user_id=USER, session_id="s", state={"k": 0})
    before = _stored(svc, "s")
    with pytest.raises(StateValueError) as info:
        svc.append_event(s, ev(delta={"ok": 1, "app:ok": 1, "user:ok": 1, **delta}))
    assert path in str(info.value)
    assert type_name in str(info.value)
    after = _stored(svc, "s")
    assert after == before
    assert svc.get_app_state(app_name=APP) == {}
    assert svc.get_user_state(app_name=APP, user_id=USER) == {}
    # The session object is not stale: nothing moved on.
    svc.append_event(s, ev(delta={"k": 1}))
    assert _stored(svc, "s").state == {"k": 1}


@pytest.mark.parametrize(
    "make",
    [
        lambda: ev(content={"parts": [{"text": {1, 2}}]}),
        lambda: ev(content=object()),
        lambda: ev(custom_metadata={"m": {1}}),
        lambda: ev(extra={"usage": object()}),
    ],
    ids=["content-nested", "content", "custom_metadata", "extra"],
)
def test_unstorable_event_field_names_the_event_path(svc: SyncSessionService, make: Any) -> None:
    """An unstorable event field: StateValueError whose path starts with 'event.'."""
    s = svc.create_session(app_name=APP, user_id=USER, session_id="s")
    before = _stored(svc, "s")
    e = make()
    e.actions.state_delta = {"k": 1, "app:a": 1}
    with pytest.raises(StateValueError, match=r"event\."):
        svc.append_event(s, e)
    assert _stored(svc, "s") == before
    assert svc.get_app_state(app_name=APP) == {}


def test_different_keys_of_a_shared_scope_both_win(svc: SyncSessionService) -> None:
    """Two sessions that set different keys of a shared scope both win."""
    s1 = svc.create_session(app_name=APP, user_id=USER, session_id="s1")
    s2 = svc.create_session(app_name=APP, user_id=USER, session_id="s2")
    s3 = svc.create_session(app_name=APP, user_id="other", session_id="s3")
    svc.append_event(s1, ev(delta={"user:a": 1, "app:x": 1}))
    svc.append_event(s2, ev(delta={"user:b": 2, "app:y": 2}))
    svc.append_event(s3, ev(delta={"app:z": 3}))
    assert svc.get_user_state(app_name=APP, user_id=USER) == {"a": 1, "b": 2}
    assert svc.get_app_state(app_name=APP) == {"x": 1, "y": 2, "z": 3}
    assert _stored(svc, "s1").state == {
        "user:a": 1,
        "user:b": 2,
        "app:x": 1,
        "app:y": 2,
        "app:z": 3,
    }
    assert _stored(svc, "s3", user="other").state == {"app:x": 1, "app:y": 2, "app:z": 3}


# get_session


def _session_with_events(svc: SyncSessionService, stamps: list[float]) -> list[Event]:
    s = svc.create_session(app_name=APP, user_id=USER, session_id="s")
    return [svc.append_event(s, ev(ts=t, content={"t": t})) for t in stamps]


def _get(svc: SyncSessionService, **config: Any) -> list[float]:
    got = svc.get_session(
        app_name=APP, user_id=USER, session_id="s", config=GetSessionConfig(**config)
    )
    assert got is not None
    return [e.timestamp for e in got.events]


def test_get_missing_session_is_none(svc: SyncSessionService) -> None:
    """A missing session reads as None (unknown app, user or id)."""
    assert svc.get_session(app_name=APP, user_id=USER, session_id="nope") is None
    svc.create_session(app_name=APP, user_id=USER, session_id="s")
    assert svc.get_session(app_name="other", user_id=USER, session_id="s") is None
    assert svc.get_session(app_name=APP, user_id="other", session_id="s") is None
    assert svc.get_session(app_name=APP, user_id=USER, session_id="s2") is None


def test_events_come_back_in_append_order(svc: SyncSessionService) -> None:
    """Events are returned in append order, whatever their timestamps."""
    events = _session_with_events(svc, [5.0, 1.0, 3.0, 2.0])
    got = _stored(svc, "s")
    assert event_ids(got) == [e.id for e in events]
    assert got.events == events


def test_num_recent_events(svc: SyncSessionService) -> None:
    """num_recent_events: None all, 0 none, n the last n."""
    _session_with_events(svc, [10.0, 20.0, 30.0, 40.0, 50.0])
    assert _get(svc) == [10.0, 20.0, 30.0, 40.0, 50.0]
    assert _get(svc, num_recent_events=None) == [10.0, 20.0, 30.0, 40.0, 50.0]
    assert _get(svc, num_recent_events=0) == []
    assert _get(svc, num_recent_events=1) == [50.0]
    assert _get(svc, num_recent_events=2) == [40.0, 50.0]
    assert _get(svc, num_recent_events=5) == [10.0, 20.0, 30.0, 40.0, 50.0]
    assert _get(svc, num_recent_events=99) == [10.0, 20.0, 30.0, 40.0, 50.0]
    full = _stored(svc, "s")
    limited = svc.get_session(
        app_name=APP, user_id=USER, session_id="s", config=GetSessionConfig(num_recent_events=2)
    )
    assert limited is not None
    assert limited.state == full.state
    assert limited.revision == full.revision
    assert limited.last_update_time == full.last_update_time


def test_negative_num_recent_events_is_a_value_error() -> None:
    """A negative num_recent_events is a ValueError."""
    with pytest.raises(ValueError):
        GetSessionConfig(num_recent_events=-1)


@pytest.mark.parametrize("config", [{"num_recent_events": 2}, "last 2", 2, [2]])
def test_a_config_of_another_kind_is_a_type_error(svc: SyncSessionService, config: object) -> None:
    """A dict or a number given as config read as "no filter": every event came back."""
    _session_with_events(svc, [10.0, 20.0, 30.0])
    with pytest.raises(TypeError, match="config must be a GetSessionConfig"):
        svc.get_session(app_name=APP, user_id=USER, session_id="s", config=config)  # type: ignore[arg-type]


def test_after_timestamp_is_inclusive(svc: SyncSessionService) -> None:
    """after_timestamp keeps events with timestamp >= t."""
    _session_with_events(svc, [10.0, 20.0, 30.0, 40.0, 50.0])
    assert _get(svc, after_timestamp=30.0) == [30.0, 40.0, 50.0]
    assert _get(svc, after_timestamp=30.5) == [40.0, 50.0]
    assert _get(svc, after_timestamp=50.0) == [50.0]
    assert _get(svc, after_timestamp=50.1) == []
    assert _get(svc, after_timestamp=1.0) == [10.0, 20.0, 30.0, 40.0, 50.0]


def test_after_timestamp_zero_is_a_real_filter(svc: SyncSessionService) -> None:
    """after_timestamp=0.0 filters (it is not "no filter")."""
    _session_with_events(svc, [-5.0, -0.5, 0.0, 7.0])
    assert _get(svc, after_timestamp=0.0) == [0.0, 7.0]
    assert _get(svc, after_timestamp=0) == [0.0, 7.0]
    assert _get(svc) == [-5.0, -0.5, 0.0, 7.0]


def test_both_filters_take_the_last_n_then_filter(svc: SyncSessionService) -> None:
    """With both: the last n events, then the timestamp filter."""
    _session_with_events(svc, [10.0, 50.0, 20.0, 40.0, 30.0])
    # Last 3 are [20, 40, 30]; filtered to >= 25 they are [40, 30].
    assert _get(svc, num_recent_events=3, after_timestamp=25.0) == [40.0, 30.0]
    assert _get(svc, num_recent_events=0, after_timestamp=0.0) == []
    assert _get(svc, num_recent_events=2, after_timestamp=100.0) == []
    assert _get(svc, num_recent_events=10, after_timestamp=40.0) == [50.0, 40.0]


def test_reading_the_last_n_events_does_not_read_the_history(svc: SyncSessionService) -> None:
    """With num_recent_events set only the last n records are read (memory, not time)."""
    big = 256 * 1024
    s = svc.create_session(app_name=APP, user_id=USER, session_id="s")
    for i in range(100):  # 25 MiB of history
        svc.append_event(s, ev(content=bytes([i]) * big))
    del s
    tracemalloc.start()
    try:
        got = svc.get_session(
            app_name=APP,
            user_id=USER,
            session_id="s",
            config=GetSessionConfig(num_recent_events=2),
        )
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        listing = svc.list_sessions(app_name=APP)
        _, list_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got is not None
    assert [e.content[0] for e in got.events] == [98, 99]
    assert listing.sessions[0].event_count == 100
    # Two events are 0.5 MiB; reading the whole history would allocate 25 MiB.
    assert peak < 8 * big * 2, f"reading 2 events allocated {peak} bytes"
    assert list_peak < 4 * big, f"listing allocated {list_peak} bytes: events were loaded"


def test_returned_sessions_never_alias_storage(svc: SyncSessionService) -> None:
    """Mutating a returned session (state, events, event content) changes nothing stored."""
    state = {"nested": {"list": [1, 2]}, "app:shared": {"a": [1]}, "user:u": [1]}
    s = svc.create_session(app_name=APP, user_id=USER, session_id="s", state=state)
    e = svc.append_event(
        s, ev(delta={"k": {"deep": [1]}}, content={"parts": [{"text": "hi"}]}, extra={"x": [1]})
    )
    reference = clone(_stored(svc, "s"))
    # Mutate the input state, the created session, the live session and the event.
    state["nested"]["list"].append("input")
    s.state["nested"]["list"].append("created")
    s.state["app:shared"]["a"].append("live")
    s.state["new"] = 1
    e.content["parts"].append("returned event")
    e.actions.state_delta["k"]["deep"].append("delta")
    e.extra["x"].append("extra")
    # Mutate one read in every way.
    first = _stored(svc, "s")
    second = _stored(svc, "s")
    first.state["nested"]["list"].append("read")
    first.state["app:shared"]["a"].clear()
    first.state["user:u"].append(2)
    first.state.pop("k")
    first.events[0].content["parts"][0]["text"] = "changed"
    first.events[0].actions.state_delta.clear()
    first.events[0].timestamp = 0.0
    first.events.append(ev())
    assert second == reference
    assert _stored(svc, "s") == reference
    assert svc.get_app_state(app_name=APP) == {"shared": {"a": [1]}}
    assert svc.get_user_state(app_name=APP, user_id=USER) == {"u": [1]}
    # The shared maps returned are not aliases either.
    svc.get_app_state(app_name=APP)["shared"]["a"].append(9)
    svc.get_user_state(app_name=APP, user_id=USER)["u"].append(9)
    assert _stored(svc, "s") == reference


# list_sessions


def _meta_key(m: SessionMeta) -> tuple[float, str, str]:
    return (m.last_update_time, m.user_id, m.id)


def test_list_sessions_order_and_metadata(svc: SyncSessionService) -> None:
    """Ordered by (last_update_time, user_id, id) ascending; metadata only."""
    t = time.time() + 1000.0
    plan = [  # (user, id, event timestamps)
        ("u2", "b", [t + 5]),
        ("u1", "z", [t + 1, t + 5]),
        ("u1", "a", [t + 5]),
        ("u2", "a", [t + 2]),
        ("u3", "m", [t + 9, t + 3]),
        ("u1", "y", []),
    ]
    for user, sid, stamps in plan:
        s = svc.create_session(app_name=APP, user_id=user, session_id=sid)
        for ts in stamps:
            svc.append_event(s, ev(ts=ts))
    svc.create_session(app_name="other-app", user_id="u1", session_id="x")
    listing = svc.list_sessions(app_name=APP)
    assert isinstance(listing, ListSessionsResponse)
    assert listing.next_cursor is None
    metas = listing.sessions
    assert all(isinstance(m, SessionMeta) for m in metas)
    assert [(m.user_id, m.id) for m in metas] == [
        ("u1", "y"),  # created now, before the future events
        ("u2", "a"),
        ("u3", "m"),
        ("u1", "a"),
        ("u1", "z"),
        ("u2", "b"),
    ]
    assert metas == sorted(metas, key=_meta_key)
    for m in metas:
        full = _stored(svc, m.id, user=m.user_id)
        assert m.app_name == APP
        assert m.last_update_time == full.last_update_time
        assert m.event_count == len(full.events)
        assert m.revision == full.revision
        assert m.create_time <= time.time() + 1.0
        assert not hasattr(m, "events")
        assert not hasattr(m, "state")
    assert [(m.user_id, m.id) for m in svc.list_sessions(app_name=APP, user_id="u1").sessions] == [
        ("u1", "y"),
        ("u1", "a"),
        ("u1", "z"),
    ]


def test_list_unknown_app_or_user_is_empty(svc: SyncSessionService) -> None:
    """Unknown app or user: an empty listing with no cursor."""
    assert svc.list_sessions(app_name=APP).sessions == []
    svc.create_session(app_name=APP, user_id=USER, session_id="s")
    for kwargs in [{"app_name": "nope"}, {"app_name": APP, "user_id": "nobody"}]:
        listing = svc.list_sessions(**kwargs)
        assert listing.sessions == []
        assert listing.next_cursor is None


@pytest.mark.parametrize("limit", [1, 2, 5, 7, 23, 50])
def test_paging_covers_every_session_once_in_order(svc: SyncSessionService, limit: int) -> None:
    """limit pages the listing; following next_cursor gives every session once, in order."""
    t = time.time() + 1000.0
    for n in range(23):
        user = f"u{n % 3}"
        s = svc.create_session(app_name=APP, user_id=user, session_id=f"s{n:02d}")
        # Many ties on last_update_time, so the cursor must also use user and id.
        svc.append_event(s, ev(ts=t + n % 4))
    full = svc.list_sessions(app_name=APP).sessions
    assert len(full) == 23
    assert full == sorted(full, key=_meta_key)
    for user in (None, "u1"):
        expected = [m for m in full if user is None or m.user_id == user]
        pages: list[list[SessionMeta]] = []
        cursor = None
        for _ in range(100):
            page = svc.list_sessions(app_name=APP, user_id=user, limit=limit, cursor=cursor)
            assert len(page.sessions) <= limit
            pages.append(page.sessions)
            cursor = page.next_cursor
            if cursor is None:
                break
        else:
            pytest.fail("paging did not end")
        flat = [m for p in pages for m in p]
        assert [_meta_key(m) for m in flat] == [_meta_key(m) for m in expected]
        assert all(p for p in pages[:-1]), "an empty page before the last one"
        assert list_all(svc.list_sessions, app_name=APP, user_id=user, limit=limit) == flat


def test_a_limit_covering_everything_has_no_cursor(svc: SyncSessionService) -> None:
    """A page that holds the rest of the listing has no next_cursor."""
    for n in range(3):
        svc.create_session(app_name=APP, user_id=USER, session_id=f"s{n}")
    page = svc.list_sessions(app_name=APP, limit=10)
    assert len(page.sessions) == 3
    assert page.next_cursor is None


# delete_session


def test_delete_removes_session_state_and_events(svc: SyncSessionService) -> None:
    """delete removes the session, its state and events; app and user state stay."""
    s = svc.create_session(
        app_name=APP, user_id=USER, session_id="s", state={"k": 1, "app:a": 1, "user:u": 1}
    )
    svc.append_event(s, ev(delta={"k2": 2, "app:b": 2, "user:v": 2}))
    other = svc.create_session(app_name=APP, user_id=USER, session_id="keep")
    svc.append_event(other, ev(delta={"o": 1}))
    assert svc.delete_session(app_name=APP, user_id=USER, session_id="s") is None
    assert svc.get_session(app_name=APP, user_id=USER, session_id="s") is None
    assert [m.id for m in svc.list_sessions(app_name=APP).sessions] == ["keep"]
    assert svc.get_app_state(app_name=APP) == {"a": 1, "b": 2}
    assert svc.get_user_state(app_name=APP, user_id=USER) == {"u": 1, "v": 2}
    kept = _stored(svc, "keep")
    assert kept.state == {"o": 1, "app:a": 1, "app:b": 2, "user:u": 1, "user:v": 2}
    assert len(kept.events) == 1


def test_delete_missing_is_a_no_op(svc: SyncSessionService) -> None:
    """Deleting a missing session does nothing and raises nothing."""
    svc.delete_session(app_name=APP, user_id=USER, session_id="never")
    svc.delete_session(app_name="unknown", user_id="nobody", session_id="never")
    svc.create_session(app_name=APP, user_id=USER, session_id="s")
    svc.delete_session(app_name=APP, user_id=USER, session_id="s")
    svc.delete_session(app_name=APP, user_id=USER, session_id="s")
    assert svc.list_sessions(app_name=APP).sessions == []


@pytest.mark.parametrize("appends", [0, 1, 3])
def test_recreate_after_delete_starts_fresh(svc: SyncSessionService, appends: int) -> None:
    """A recreated session has no old events or state; an old copy is never applied."""
    old = svc.create_session(app_name=APP, user_id=USER, session_id="s", state={"old": 1})
    for n in range(appends):
        svc.append_event(old, ev(delta={f"old{n}": n}))
    svc.delete_session(app_name=APP, user_id=USER, session_id="s")
    new = svc.create_session(app_name=APP, user_id=USER, session_id="s", state={"new": 1})
    assert new.state == {"new": 1}
    assert new.events == []
    for n in range(appends):
        svc.append_event(new, ev(delta={f"new{n}": n}))
    before = _stored(svc, "s")
    assert set(before.state) == {"new"} | {f"new{n}" for n in range(appends)}
    assert len(before.events) == appends
    with pytest.raises((StaleSessionError, SessionNotFoundError)):
        svc.append_event(old, ev(delta={"ghost": 1}))
    with pytest.raises((StaleSessionError, SessionNotFoundError)):
        svc.append_event(clone(old), ev(delta={"ghost": 2}))
    assert _stored(svc, "s") == before
    # The old events are gone with the old session: their ids are free again.
    for e in old.events:
        svc.append_event(new, ev(id=e.id, content="reused"))
    assert len(_stored(svc, "s").events) == 2 * appends


# append_event


def test_partial_event_is_returned_untouched(svc: SyncSessionService) -> None:
    """A partial event: returned untouched, nothing stored, nothing applied."""
    s = svc.create_session(app_name=APP, user_id=USER, session_id="s", state={"k": 0})
    before = clone(s)
    stored_before = _stored(svc, "s")
    e = ev(delta={"k": 1, "temp:t": 1, "app:a": 1}, partial=True, content={"text": "chunk"})
    snapshot = clone(e)
    out = svc.append_event(s, e)
    assert out is e
    assert e == snapshot
    assert s == before
    assert _stored(svc, "s") == stored_before
    assert svc.get_app_state(app_name=APP) == {}
    # A partial event does not count as stored for the id check either.
    e.partial = None
    svc.append_event(s, e)
    assert event_ids(_stored(svc, "s")) == [e.id]


def test_temp_keys_are_applied_live_and_never_stored(svc: SyncSessionService) -> None:
    """temp: keys reach the live state, leave the delta, and are stored nowhere."""
    s = svc.create_session(app_name=APP, user_id=USER, session_id="s")
    e = ev(delta={"temp:t": {"scratch": [1]}, "k": 1, "app:a": 2, "user:u": 3})
    out = svc.append_event(s, e)
    assert s.state["temp:t"] == {"scratch": [1]}
    assert s.state["k"] == 1
    assert e.actions.state_delta == {"k": 1, "app:a": 2, "user:u": 3}
    assert out.actions.state_delta == {"k": 1, "app:a": 2, "user:u": 3}
    got = _stored(svc, "s")
    assert got.state == {"k": 1, "app:a": 2, "user:u": 3}
    assert got.events[0].actions.state_delta == {"k": 1, "app:a": 2, "user:u": 3}
    assert "temp:t" not in repr(as_plain(got))
    assert svc.get_app_state(app_name=APP) == {"a": 2}
    assert svc.get_user_state(app_name=APP, user_id=USER) == {"u": 3}


def test_only_temp_keys_in_the_delta(svc: SyncSessionService) -> None:
    """An event whose delta holds only temp: keys is stored with an empty delta."""
    s = svc.create_session(app_name=APP, user_id=USER, session_id="s")
    e = svc.append_event(s, ev(delta={"temp:a": 1}))
    assert s.state == {"temp:a": 1}
    assert e.actions.state_delta == {}
    got = _stored(svc, "s")
    assert got.state == {}
    assert got.events[0].actions.state_delta == {}


def test_append_updates_the_live_session(svc: SyncSessionService) -> None:
    """The live session gets the delta keys, the event, last_update_time and a new revision."""
    s = svc.create_session(app_name=APP, user_id=USER, session_id="s", state={"k": 0})
    revisions = [s.revision]
    for n in range(1, 4):
        e = ev(delta={"k": n, "app:a": n, "user:u": n}, ts=1000.0 + n)
        out = svc.append_event(s, e)
        assert out.id == e.id
        assert s.events[-1] == e
        assert len(s.events) == n
        assert s.state == {"k": n, "app:a": n, "user:u": n}
        assert s.last_update_time == e.timestamp == 1000.0 + n
        assert isinstance(s.revision, str)
        assert s.revision not in revisions
        revisions.append(s.revision)
        got = _stored(svc, "s")
        assert got.revision == s.revision
        assert got.last_update_time == e.timestamp
        assert got.state == s.state
        assert got.events == s.events


def test_append_to_a_missing_session_is_not_found(svc: SyncSessionService) -> None:
    """Never-created or deleted session: SessionNotFoundError, a ValueError."""
    assert issubclass(SessionNotFoundError, ValueError)
    ghost = Session(id="ghost", app_name=APP, user_id=USER)
    with pytest.raises(SessionNotFoundError):
        svc.append_event(ghost, ev(delta={"app:a": 1}))
    with pytest.raises(SessionNotFoundError):
        svc.append_event_locked(ghost, ev(delta={"app:a": 1}))
    s = svc.create_session(app_name=APP, user_id=USER, session_id="s")
    svc.append_event(s, ev())
    svc.delete_session(app_name=APP, user_id=USER, session_id="s")
    with pytest.raises(SessionNotFoundError):
        svc.append_event(s, ev(delta={"app:a": 1}))
    with pytest.raises(SessionNotFoundError):
        svc.append_event_locked(s, ev(delta={"app:a": 1}))
    assert svc.get_session(app_name=APP, user_id=USER, session_id="s") is None
    assert svc.get_session(app_name=APP, user_id=USER, session_id="ghost") is None
    assert svc.get_app_state(app_name=APP) == {}


def test_append_from_a_stale_copy_is_rejected(svc: SyncSessionService) -> None:
    """A copy read before the store moved on: StaleSessionError, nothing written."""
    assert issubclass(StaleSessionError, ValueError)
    svc.create_session(app_name=APP, user_id=USER, session_id="s")
    a = _stored(svc, "s")
    b = _stored(svc, "s")
    first = svc.append_event(a, ev(delta={"a": 1}))
    b_before = clone(b)
    refused = ev(delta={"b": 1, "app:b": 1, "temp:t": 1})
    with pytest.raises(StaleSessionError):
        svc.append_event(b, refused)
    got = _stored(svc, "s")
    assert event_ids(got) == [first.id]
    assert got.state == {"a": 1}
    assert svc.get_app_state(app_name=APP) == {}
    assert b.events == b_before.events
    assert b.revision == b_before.revision
    # A fresh read appends fine; the live copy a also stays usable.
    fresh = _stored(svc, "s")
    svc.append_event(fresh, ev(delta={"c": 1}))
    with pytest.raises(StaleSessionError):
        svc.append_event(a, ev(delta={"d": 1}))
    assert _stored(svc, "s").state == {"a": 1, "c": 1}
    # Nothing of the refused event was kept, its id neither: through a fresh
    # copy it is a new event, stored once, not a repeat of one stored.
    again = _stored(svc, "s")
    svc.append_event(again, refused)
    got = _stored(svc, "s")
    assert event_ids(got).count(refused.id) == 1 and event_ids(got)[-1] == refused.id
    assert got.state == {"a": 1, "c": 1, "b": 1, "app:b": 1}
    assert again.revision == got.revision


def test_the_created_session_object_can_append(svc: SyncSessionService) -> None:
    """The object create_session returns carries a usable revision."""
    s = svc.create_session(app_name=APP, user_id=USER, session_id="s")
    copy_of_create = clone(s)
    svc.append_event(s, ev())
    with pytest.raises(StaleSessionError):
        svc.append_event(copy_of_create, ev())
    assert len(_stored(svc, "s").events) == 1


def test_hand_built_session_without_revision(svc: SyncSessionService) -> None:
    """revision None: accepted when the last event matches, rejected when the store differs."""
    svc.create_session(app_name=APP, user_id=USER, session_id="s", state={"k": 0})
    # No events on either side: accepted.
    empty = Session(id="s", app_name=APP, user_id=USER)
    e1 = svc.append_event(empty, ev(delta={"a": 1}))
    assert event_ids(_stored(svc, "s")) == [e1.id]
    # The hand-built session's last event is the stored last event: accepted.
    matching = Session(id="s", app_name=APP, user_id=USER, events=[clone(e1)])
    e2 = svc.append_event(matching, ev(delta={"b": 1}))
    assert isinstance(matching.revision, str)
    assert event_ids(_stored(svc, "s")) == [e1.id, e2.id]
    before = _stored(svc, "s")
    # The store is newer and its last event differs: rejected, nothing written.
    behind = Session(id="s", app_name=APP, user_id=USER, events=[clone(e1)])
    with pytest.raises(StaleSessionError):
        svc.append_event(behind, ev(delta={"c": 1}))
    no_events = Session(id="s", app_name=APP, user_id=USER)
    with pytest.raises(StaleSessionError):
        svc.append_event(no_events, ev(delta={"c": 1}))
    assert _stored(svc, "s") == before
    # Applied on top of what is stored: earlier keys survive.
    assert before.state == {"k": 0, "a": 1, "b": 1}


def test_equal_event_id_is_a_safe_retry(svc: SyncSessionService) -> None:
    """An event id already stored with equal content: a no-op returning the event."""
    s = svc.create_session(app_name=APP, user_id=USER, session_id="s")
    e = ev(delta={"k": 1, "app:n": 1}, content={"text": "hi"}, ts=100.0)
    svc.append_event(s, e)
    svc.append_event(s, ev(delta={"k": 2, "app:n": 2}, ts=200.0))
    stored = _stored(svc, "s")
    retry = clone(e)
    out = svc.append_event(s, retry)
    assert out == e
    got = _stored(svc, "s")
    assert got == stored
    assert got.state["k"] == 2
    assert svc.get_app_state(app_name=APP) == {"n": 2}
    # Retrying through append_event_locked is a no-op too.
    out = svc.append_event_locked(_stored(svc, "s"), clone(e))
    assert out == e
    assert _stored(svc, "s") == stored


def test_different_event_with_a_stored_id_is_rejected(svc: SyncSessionService) -> None:
    """An event id already stored with other content: DuplicateEventError, nothing written."""
    assert issubclass(DuplicateEventError, ValueError)
    s = svc.create_session(app_name=APP, user_id=USER, session_id="s")
    e = svc.append_event(s, ev(delta={"k": 1}, content={"text": "hi"}))
    stored = _stored(svc, "s")
    for changed in [
        ev(id=e.id, delta={"k": 1}, content={"text": "other"}, ts=e.timestamp),
        ev(id=e.id, delta={"k": 2}, content={"text": "hi"}, ts=e.timestamp),
        ev(id=e.id, delta={"k": 1}, content={"text": "hi"}, ts=e.timestamp + 1),
    ]:
        with pytest.raises(DuplicateEventError):
            svc.append_event(s, changed)
        with pytest.raises(DuplicateEventError):
            svc.append_event_locked(_stored(svc, "s"), clone(changed))
    assert _stored(svc, "s") == stored


def test_event_ids_are_checked_per_session(svc: SyncSessionService) -> None:
    """The same event id may be stored once in each of two sessions."""
    a = svc.create_session(app_name=APP, user_id=USER, session_id="a")
    b = svc.create_session(app_name=APP, user_id=USER, session_id="b")
    e = ev(content={"x": 1})
    svc.append_event(a, clone(e))
    svc.append_event(b, ev(id=e.id, content={"x": 2}))
    assert event_ids(_stored(svc, "a")) == event_ids(_stored(svc, "b")) == [e.id]


# append_event_locked


def test_locked_append_is_never_stale_and_catches_up(svc: SyncSessionService) -> None:
    """append_event_locked applies on top of the store and brings the live session up to date."""
    svc.create_session(app_name=APP, user_id=USER, session_id="s", state={"base": 0})
    a = _stored(svc, "s")
    b = _stored(svc, "s")
    ea = svc.append_event(a, ev(delta={"a": 1, "user:ua": 1}))
    eb = svc.append_event_locked(b, ev(delta={"b": 2, "temp:t": 3}))
    expected_state = {"base": 0, "a": 1, "user:ua": 1, "b": 2}
    assert event_ids(b) == [ea.id, eb.id]
    assert {k: v for k, v in b.state.items() if not k.startswith("temp:")} == expected_state
    assert b.state["temp:t"] == 3
    got = _stored(svc, "s")
    assert got.state == expected_state
    assert event_ids(got) == [ea.id, eb.id]
    assert b.revision == got.revision
    assert b.last_update_time == eb.timestamp
    # b is now current: a plain append works from it; a is stale.
    svc.append_event(b, ev(delta={"c": 3}))
    with pytest.raises(StaleSessionError):
        svc.append_event(a, ev())


def test_locked_append_brings_a_hand_built_session_up_to_date(svc: SyncSessionService) -> None:
    """A hand-built session (no revision) gets the stored events and state it lacked."""
    s = svc.create_session(app_name=APP, user_id=USER, session_id="s", state={"base": 0})
    e1 = svc.append_event(s, ev(delta={"a": 1}))
    hand = Session(id="s", app_name=APP, user_id=USER)
    e2 = svc.append_event_locked(hand, ev(delta={"d": 4}))
    got = _stored(svc, "s")
    assert event_ids(got) == [e1.id, e2.id]
    assert got.state == {"base": 0, "a": 1, "d": 4}
    assert hand.revision == got.revision
    assert event_ids(hand) == [e1.id, e2.id]
    assert hand.state == got.state


def test_locked_appends_from_threads_are_serialized(svc: SyncSessionService) -> None:
    """Locked appends from many threads: every event once, no lost state keys."""
    svc.create_session(app_name=APP, user_id=USER, session_id="s")
    n_threads, per_thread = 4, 25
    errors: list[BaseException] = []
    written: dict[int, list[str]] = {}

    def worker(idx: int) -> None:
        try:
            live = _stored(svc, "s")
            ids = []
            for i in range(per_thread):
                key = f"count_{idx}"
                delta = {key: live.state.get(key, 0) + 1, f"user:{key}": i + 1}
                ids.append(svc.append_event_locked(live, ev(delta=delta, content=[idx, i])).id)
            written[idx] = ids
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    got = _stored(svc, "s")
    ids = event_ids(got)
    assert len(ids) == len(set(ids)) == n_threads * per_thread
    for idx in range(n_threads):
        mine = [e.content[1] for e in got.events if e.content[0] == idx]
        assert mine == list(range(per_thread))
        assert [i for i in ids if i in set(written[idx])] == written[idx]
        assert got.state[f"count_{idx}"] == per_thread
        assert got.state[f"user:count_{idx}"] == per_thread


# get_user_state / get_app_state


def test_shared_maps_are_raw_and_empty_when_unknown(svc: SyncSessionService) -> None:
    """get_user_state/get_app_state: the raw map, keys without prefix; {} when none."""
    assert svc.get_app_state(app_name=APP) == {}
    assert svc.get_user_state(app_name=APP, user_id=USER) == {}
    s = svc.create_session(app_name=APP, user_id=USER, session_id="s", state={"k": 1})
    assert svc.get_app_state(app_name=APP) == {}
    assert svc.get_user_state(app_name=APP, user_id=USER) == {}
    svc.append_event(s, ev(delta={"app:x": [1], "user:y": {"z": b"1"}, "app:app:x": 2}))
    assert svc.get_app_state(app_name=APP) == {"x": [1], "app:x": 2}
    assert svc.get_user_state(app_name=APP, user_id=USER) == {"y": {"z": b"1"}}
    assert svc.get_user_state(app_name=APP, user_id="other") == {}
    assert svc.get_app_state(app_name="other") == {}
    assert isinstance(svc.get_app_state(app_name=APP), dict)


# flush / close


def test_flush_and_close(store_factory: StoreFactory) -> None:
    """flush() works at any time; close() releases the store; later use is StoreClosedError."""
    svc = SyncSessionService(store_factory())
    svc.flush()
    s = svc.create_session(app_name=APP, user_id=USER, session_id="s")
    svc.append_event(s, ev(delta={"k": 1}))
    assert svc.flush() is None
    svc.close()
    assert issubclass(StoreClosedError, SessionscopeError)
    for call in [
        lambda: svc.create_session(app_name=APP, user_id=USER),
        lambda: svc.get_session(app_name=APP, user_id=USER, session_id="s"),
        lambda: svc.list_sessions(app_name=APP),
        lambda: svc.delete_session(app_name=APP, user_id=USER, session_id="s"),
        lambda: svc.append_event(s, ev()),
        lambda: svc.append_event_locked(s, ev()),
        lambda: svc.get_user_state(app_name=APP, user_id=USER),
        lambda: svc.get_app_state(app_name=APP),
    ]:
        with pytest.raises(StoreClosedError):
            call()
    if store_factory.persistent:
        with SyncSessionService(store_factory.reopen()) as again:
            assert _stored(again, "s").state == {"k": 1}


def test_sync_service_is_a_context_manager(store_factory: StoreFactory) -> None:
    """`with SyncSessionService(store)` closes the service and its store on exit."""
    with SyncSessionService(store_factory()) as svc:
        s = svc.create_session(app_name=APP, user_id=USER, session_id="s")
        svc.append_event(s, ev(delta={"k": 1}))
    with pytest.raises(StoreClosedError):
        svc.get_session(app_name=APP, user_id=USER, session_id="s")
    if store_factory.persistent:
        with SyncSessionService(store_factory.reopen()) as again:
            assert _stored(again, "s").state == {"k": 1}


def test_context_manager_closes_on_error(store_factory: StoreFactory) -> None:
    """The context manager closes the store also when the body raises."""
    with pytest.raises(RuntimeError, match="boom"), SyncSessionService(store_factory()) as svc:
        svc.create_session(app_name=APP, user_id=USER, session_id="s")
        raise RuntimeError("boom")
    with pytest.raises(StoreClosedError):
        svc.list_sessions(app_name=APP)


# Persistence


def test_everything_survives_close_and_reopen(lmdb_factory: StoreFactory) -> None:
    """LMDB stores: close, reopen, and every read gives identical results."""
    store_factory = lmdb_factory
    svc = SyncSessionService(store_factory())
    sessions = []
    for n in range(5):
        s = svc.create_session(
            app_name=APP,
            user_id=f"u{n % 2}",
            session_id=f"s{n}",
            state={"n": n, "app:a": n, f"user:u{n}": n, "temp:t": n, "all": ALL_TYPES},
        )
        for i in range(n):
            svc.append_event(s, ev(delta={"i": i, "temp:x": 1}, content={"i": i, "all": ALL_TYPES}))
        sessions.append(s)
    svc.create_session(app_name="other", user_id="u", session_id="s", state={"app:o": 1})
    svc.delete_session(app_name=APP, user_id="u0", session_id="s2")

    def read_all(service: SyncSessionService) -> dict[str, Any]:
        return {
            "sessions": [
                service.get_session(app_name=APP, user_id=f"u{n % 2}", session_id=f"s{n}")
                for n in range(5)
            ],
            "other": service.get_session(app_name="other", user_id="u", session_id="s"),
            "limited": service.get_session(
                app_name=APP,
                user_id="u0",
                session_id="s4",
                config=GetSessionConfig(num_recent_events=2, after_timestamp=0.0),
            ),
            "list": service.list_sessions(app_name=APP),
            "list_u1": service.list_sessions(app_name=APP, user_id="u1"),
            "apps": [service.get_app_state(app_name=a) for a in (APP, "other")],
            "users": [
                service.get_user_state(app_name=APP, user_id=u) for u in ("u0", "u1", "none")
            ],
        }

    before = read_all(svc)
    assert before["sessions"][2] is None
    svc.close()
    again = SyncSessionService(store_factory.reopen())
    after = read_all(again)
    assert after == before
    # A session object read before the close is still current after the reopen.
    live = sessions[3]
    again.append_event(live, ev(delta={"after": 1}))
    assert _stored(again, "s3", user="u1").state["after"] == 1
    again.close()
    with SyncSessionService(store_factory.reopen()) as third:
        assert _stored(third, "s3", user="u1").events == live.events


# -- what a fourth round of probing found -----------------------------------


def test_a_limit_past_any_count_lists_everything(svc: SyncSessionService) -> None:
    """Any positive int is a limit, on every store: Redis takes no count past 2**63 - 1."""
    import sys

    svc.create_session(app_name=APP, user_id=USER, session_id="only")
    for limit in (sys.maxsize, sys.maxsize + 1, 10**30):
        page = svc.list_sessions(app_name=APP, limit=limit)
        assert [s.id for s in page.sessions] == ["only"] and page.next_cursor is None
        mine = svc.list_sessions(app_name=APP, user_id=USER, limit=limit)
        assert [s.id for s in mine.sessions] == ["only"]


@pytest.mark.parametrize(
    ("broken", "named"),
    [
        (lambda e: setattr(e, "actions", None), "event.actions must be"),
        (lambda e: setattr(e, "actions", {"state_delta": {"k": 1}}), "event.actions must be"),
        (
            lambda e: setattr(e.actions, "state_delta", [("k", 1)]),
            "event.actions.state_delta must be",
        ),
        (lambda e: setattr(e.actions, "state_delta", "k=1"), "event.actions.state_delta must be"),
    ],
    ids=["actions-none", "actions-dict", "delta-list", "delta-str"],
)
def test_an_event_with_broken_actions_is_a_type_error_naming_them(
    svc: SyncSessionService, broken: Any, named: str
) -> None:
    s = svc.create_session(app_name=APP, user_id=USER, session_id="broken")
    event = ev(content={"i": 0})
    broken(event)
    with pytest.raises(TypeError, match=named):
        svc.append_event(s, event)
    with pytest.raises(TypeError, match="appends\\[1\\]: " + named):
        svc.append_many([(s, ev(content={"i": 1})), (s, event)])
    stored = svc.get_session(app_name=APP, user_id=USER, session_id="broken")
    assert stored is not None and stored.events == [] and s.events == []


def test_a_read_only_mapping_is_a_delta_as_a_dict_is(svc: SyncSessionService) -> None:
    """create_session takes any mapping as state; an append takes any as a delta."""
    from types import MappingProxyType

    s = svc.create_session(
        app_name=APP, user_id=USER, session_id="proxy", state=MappingProxyType({"a": 1})
    )
    one = ev(delta={"b": 2})
    one.actions.state_delta = MappingProxyType({"b": 2, "user:u": 3})  # type: ignore[assignment]
    svc.append_event(s, one)
    many = ev(delta={"c": 4})
    many.actions.state_delta = MappingProxyType({"c": 4})  # type: ignore[assignment]
    svc.append_many([(s, many)])
    stored = svc.get_session(app_name=APP, user_id=USER, session_id="proxy")
    assert stored is not None
    assert stored.state == {"a": 1, "b": 2, "user:u": 3, "c": 4} == s.state
    assert [dict(e.actions.state_delta) for e in stored.events] == [{"b": 2, "user:u": 3}, {"c": 4}]


def test_append_many_says_stored_in_the_callers_positions_partials_included(
    svc: SyncSessionService,
) -> None:
    s = svc.create_session(app_name=APP, user_id=USER, session_id="partials")
    ghost = Session(id="ghost", app_name=APP, user_id=USER)
    appends = [
        (s, Event(author="a", id="p0", partial=True)),
        (s, Event(author="a", id="p1", partial=True)),
        (s, Event(author="a", id="e2")),
        (s, Event(author="a", id="p3", partial=True)),
        (s, Event(author="a", id="e4")),
        (ghost, Event(author="a", id="e5")),  # stops the batch
        (s, Event(author="a", id="e6")),
    ]
    with pytest.raises(SessionNotFoundError) as caught:
        svc.append_many(appends)
    assert caught.value.stored == 5  # type: ignore[attr-defined]
    assert appends[caught.value.stored][1].id == "e5"  # type: ignore[attr-defined]
    stored = svc.get_session(app_name=APP, user_id=USER, session_id="partials")
    assert stored is not None and event_ids(stored) == ["e2", "e4"]
    # Resuming from there stores nothing twice (the ghost is left out).
    svc.append_many(appends[6:])
    stored = svc.get_session(app_name=APP, user_id=USER, session_id="partials")
    assert stored is not None and event_ids(stored) == ["e2", "e4", "e6"]


def test_an_int_timestamp_is_stored_as_the_float_it_reads_back_as(
    svc: SyncSessionService,
) -> None:
    """So that the same event appended again, read back or built anew, is a repeat."""
    s = svc.create_session(app_name=APP, user_id=USER, session_id="int-time")
    event = ev(content={"i": 0}, ts=5)
    svc.append_event(s, event)
    assert type(event.timestamp) is float
    stored = svc.get_session(app_name=APP, user_id=USER, session_id="int-time")
    assert stored is not None and type(stored.events[0].timestamp) is float
    again = Event(author=event.author, content={"i": 0}, id=event.id, timestamp=5.0)
    fresh = svc.get_session(app_name=APP, user_id=USER, session_id="int-time")
    assert fresh is not None
    svc.append_event(fresh, again)  # a repeat: no error, nothing added
    bulk = ev(content={"i": 1}, ts=6)
    svc.append_many([(fresh, bulk)])
    assert type(bulk.timestamp) is float
    stored = svc.get_session(app_name=APP, user_id=USER, session_id="int-time")
    assert stored is not None and [e.timestamp for e in stored.events] == [5.0, 6.0]
    assert all(type(e.timestamp) is float for e in stored.events)
