"""msgpack's own types are not storable values; a key given in the wrong option is never echoed.

msgpack packs its ``ExtType`` (a namedtuple) as an extension, not as an
array, and reads it back as an ``ExtType``: outside the contract's storable
types, so it is refused like any other, naming its key path, before anything
is written. The suite runs a second time with SESSIONSCOPE_NO_EXTENSIONS=1,
which makes the service run the scope core's pure-Python twin; the core
tests here take both implementations in either run.

An operator who puts the key itself where its file or variable is named
(``key_file=``, ``key_env=``, or the command line's ``--old-key-env``) is told
which option named nothing, never what it held.
"""

from __future__ import annotations

import os
import re
from collections import namedtuple
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import quote

import msgpack
import pytest

from _stores import run_cli
from sessionscope import Event, EventActions, Session, SyncSessionService
from sessionscope.errors import EncryptionKeyError, StateValueError


class MyExt(msgpack.ExtType):
    """A subclass of msgpack's ExtType: msgpack packs it as an extension too."""


Pair = namedtuple("Pair", "left right")

EXT = msgpack.ExtType(5, b"\x01\x02")
STAMP = msgpack.Timestamp(1_700_000_000, 0)

# (value, the path's tail after state['k'], the refused type's name)
UNSTORABLE: list[tuple[Any, str, str]] = [
    (EXT, "", "ExtType"),
    (MyExt(1, b""), "", "MyExt"),
    (STAMP, "", "Timestamp"),
    ({"cart": [1, {"x": EXT}]}, "['cart'][1]['x']", "ExtType"),
    ([(1, STAMP)], "[0][1]", "Timestamp"),
    ({"pair": Pair(1, EXT)}, "['pair'][1]", "ExtType"),
]
IDS = ["ext", "ext-subclass", "timestamp", "nested-ext", "nested-timestamp", "ext-in-namedtuple"]


# -- the scope core, both implementations -------------------------------------------


@pytest.mark.parametrize(("value", "tail", "name"), UNSTORABLE, ids=IDS)
def test_the_core_refuses_msgpack_types_naming_the_path(
    core_impl: ModuleType, value: Any, tail: str, name: str
) -> None:
    message = f"state['k']{tail}: {name} is not storable"
    with pytest.raises(StateValueError, match=re.escape(message)):
        core_impl.check_storable(value, "state['k']")
    with pytest.raises(StateValueError, match=re.escape(message)):
        core_impl.check_delta({"k": value})
    for key in ("k", "app:k", "user:k"):
        with pytest.raises(StateValueError, match=re.escape(f"[{key!r}]{tail}: {name}")):
            core_impl.partition_checked({"ok": 1, key: value})
    # The packer of plain values declines it: the checked path decides.
    assert core_impl.pack_plain(value) is None


def test_tuples_and_namedtuples_stay_storable(core_impl: ModuleType) -> None:
    for value in ((1, "a"), Pair(1, [2, (3,)]), {"p": Pair("x", b"y")}, [()]):
        core_impl.check_storable(value, "state['k']")
    assert core_impl.partition_checked({"k": Pair(1, 2)})[2] == {"k": Pair(1, 2)}


# -- the service, on memory and LMDB ------------------------------------------------


@pytest.fixture(params=["memory", "lmdb"])
def svc(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SyncSessionService]:
    uri = "memory://" if request.param == "memory" else f"lmdb://{tmp_path / 'store'}"
    service = SyncSessionService(uri)
    try:
        yield service
    finally:
        service.close()


def _stored(svc: SyncSessionService, session: Session) -> tuple[Any, ...]:
    """Return everything the store holds of a session and its app and user."""
    got = svc.get_session(app_name=session.app_name, user_id=session.user_id, session_id=session.id)
    assert got is not None
    return (
        got.state,
        [(e.id, e.actions.state_delta, e.content) for e in got.events],
        got.last_update_time,
        svc.get_app_state(app_name=session.app_name),
        svc.get_user_state(app_name=session.app_name, user_id=session.user_id),
    )


@pytest.mark.parametrize(("value", "tail", "name"), UNSTORABLE, ids=IDS)
@pytest.mark.parametrize("key", ["k", "app:k", "user:k"])
def test_append_event_refuses_msgpack_types_in_a_delta_and_stores_nothing(
    svc: SyncSessionService, key: str, value: Any, tail: str, name: str
) -> None:
    session = svc.create_session(app_name="shop", user_id="ada", state={"kept": 1})
    svc.append_event(session, Event(author="a", actions=EventActions(state_delta={"n": 1})))
    before = _stored(svc, session)
    live = (dict(session.state), len(session.events), session.last_update_time)
    event = Event(author="a", actions=EventActions(state_delta={"fine": 2, key: value}))
    message = f"state[{key!r}]{tail}: {name} is not storable"
    with pytest.raises(StateValueError, match=re.escape(message)):
        svc.append_event(session, event)
    assert _stored(svc, session) == before
    assert (dict(session.state), len(session.events), session.last_update_time) == live
    # The same append in a batch: refused before anything is stored.
    with pytest.raises(StateValueError, match=re.escape(f"{tail}: {name} is not storable")):
        svc.append_many([(session, Event(author="a")), (session, event)])
    assert _stored(svc, session) == before


@pytest.mark.parametrize(("value", "tail", "name"), UNSTORABLE, ids=IDS)
def test_append_event_refuses_msgpack_types_in_event_content(
    svc: SyncSessionService, value: Any, tail: str, name: str
) -> None:
    session = svc.create_session(app_name="shop", user_id="ada")
    before = _stored(svc, session)
    for event in (
        Event(author="a", content={"k": value}),
        Event(author="a", custom_metadata={"k": value}),
    ):
        with pytest.raises(
            StateValueError, match=re.escape(f"['k']{tail}: {name} is not storable")
        ):
            svc.append_event(session, event)
    assert _stored(svc, session) == before


@pytest.mark.parametrize(("value", "tail", "name"), UNSTORABLE, ids=IDS)
@pytest.mark.parametrize("key", ["k", "app:k", "user:k"])
def test_create_session_refuses_msgpack_types_in_its_state_and_creates_nothing(
    svc: SyncSessionService, key: str, value: Any, tail: str, name: str
) -> None:
    state = {"fine": 1, "app:fine": 2, "user:fine": 3, key: value}
    message = f"state[{key!r}]{tail}: {name} is not storable"
    with pytest.raises(StateValueError, match=re.escape(message)):
        svc.create_session(app_name="shop", user_id="ada", session_id="s1", state=state)
    assert svc.get_session(app_name="shop", user_id="ada", session_id="s1") is None
    assert svc.get_app_state(app_name="shop") == {}
    assert svc.get_user_state(app_name="shop", user_id="ada") == {}


def test_a_namedtuple_is_still_stored_and_comes_back_as_a_list(svc: SyncSessionService) -> None:
    session = svc.create_session(app_name="shop", user_id="ada", state={"p": Pair(1, "x")})
    svc.append_event(
        session, Event(author="a", actions=EventActions(state_delta={"q": [Pair(2, (3,))]}))
    )
    got = svc.get_session(app_name="shop", user_id="ada", session_id=session.id)
    assert got is not None and got.state == {"p": [1, "x"], "q": [[2, [3]]]}


# -- a key given where its file or variable is named ---------------------------------

# A key as an operator would paste it (64 hex digits), fixed so that no other
# hex in an output (key ids, tags) can match a slice of it by chance run to run.
KEY_HEX = "066ab5c3d1e94f7a28b06c5d4e3f2a1908b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3"


def _assert_no_key(*texts: str) -> None:
    """Assert no text holds the key's hex, or any 8 characters of it in a row."""
    slices = {KEY_HEX[start : start + 8] for start in range(len(KEY_HEX) - 7)}
    for text in texts:
        for piece in slices:
            assert piece not in text.lower(), f"{piece!r} of the key in: {text!r}"


def _error_texts(error: BaseException) -> list[str]:
    import traceback

    hint = getattr(error, "hint", None)
    return [str(error), repr(error), str(hint), "".join(traceback.format_exception(error))]


@pytest.fixture
def no_key_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Make sure no variable and no file is named by the key, and work in an empty directory."""
    monkeypatch.delenv(KEY_HEX, raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("option", ["key_env", "key_file"])
def test_a_key_given_as_key_env_or_key_file_is_not_echoed_by_the_library(
    no_key_named: Path, option: str
) -> None:
    pytest.importorskip("cryptography")
    from sessionscope.crypto import Encryption, kek_from
    from sessionscope.stores import open_store

    lmdb = f"lmdb://{no_key_named / 'store'}"
    attempts = [
        lambda: kek_from(**{option: KEY_HEX}),
        lambda: open_store("memory://", encryption=Encryption(**{option: KEY_HEX})),
        lambda: open_store(lmdb, encryption=Encryption(**{option: KEY_HEX})),
        lambda: open_store(f"memory://?{option}={KEY_HEX}"),
        lambda: SyncSessionService(f"{lmdb}?{option}={KEY_HEX}"),
    ]
    for attempt in attempts:
        with pytest.raises(EncryptionKeyError, match=option) as caught:
            attempt()
        _assert_no_key(*_error_texts(caught.value))
        # Which option, and why: the variable is unset, the file unreadable.
        why = "not set" if option == "key_env" else "No such file or directory"
        assert why in str(caught.value)
    assert not (no_key_named / "store").exists()


def test_a_key_given_as_a_name_on_the_command_line_is_not_echoed(no_key_named: Path) -> None:
    pytest.importorskip("cryptography")
    from sessionscope.crypto import Encryption
    from sessionscope.stores import open_store

    real = bytes(range(32))
    keys = f"lmdb://{no_key_named / 'keys'}"
    store = open_store(
        f"lmdb://{no_key_named / 'store'}", encryption=Encryption(keys=keys, key=real)
    )
    svc = SyncSessionService(store)
    try:
        svc.create_session(app_name="shop", user_id="ada", session_id="s1", state={"k": 1})
    finally:
        svc.close()
    env = {"REAL_KEK": real.hex(), "NEW_KEK": bytes(range(1, 33)).hex()}
    runs = []
    for option in ("key_env", "key_file"):
        uri = f"lmdb://{no_key_named / 'store'}?{option}={KEY_HEX}&keys={quote(keys, safe='')}"
        for command in (["ls", uri], ["show", uri, "shop", "ada", "s1"], ["verify", uri]):
            runs.append((command, option))
        runs.append((["ls", f"memory://?{option}={KEY_HEX}"], option))
    for flag, option in (("--old-key-env", "key_env"), ("--old-key-file", "key_file")):
        command = ["rotate-key", keys, flag, KEY_HEX, "--new-key-env", "NEW_KEK"]
        runs.append((command, option))
        runs.append(([*command, "--json"], option))
    for command, option in runs:
        done = run_cli(*command, cwd=no_key_named, extra_env=env)
        assert done.returncode != 0, (command, done.stdout)
        assert "EncryptionKeyError" in done.stderr + done.stdout, (command, done.stderr)
        assert option in done.stderr + done.stdout, (command, done.stderr)
        assert "Traceback" not in done.stderr
        _assert_no_key(done.stdout, done.stderr)
    # The key store was not rotated: the real key still opens the store.
    again = open_store(
        f"lmdb://{no_key_named / 'store'}", encryption=Encryption(keys=keys, key=real)
    )
    try:
        got = SyncSessionService(again).get_session(app_name="shop", user_id="ada", session_id="s1")
        assert got is not None and got.state == {"k": 1}
    finally:
        again.close()


def test_a_name_that_finds_a_variable_or_a_file_is_still_shown(
    no_key_named: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("cryptography")
    from sessionscope.crypto import kek_from

    monkeypatch.setenv("SHORT_KEK", "abcd")
    with pytest.raises(EncryptionKeyError, match="'SHORT_KEK' is not 32 bytes"):
        kek_from(key_env="SHORT_KEK")
    (no_key_named / "short").write_text("abcd")
    with pytest.raises(EncryptionKeyError, match="short' is not 32 bytes"):
        kek_from(key_file=no_key_named / "short")
    assert os.environ.get(KEY_HEX) is None
