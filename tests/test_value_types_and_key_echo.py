"""A key given in the wrong option is never echoed.

An operator who puts the key itself where its file or variable is named
(``key_file=``, ``key_env=``, or the command line's ``--old-key-env``) is told
which option named nothing, never what it held.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import quote

import pytest

from _stores import run_cli
from sessionscope import SyncSessionService
from sessionscope.errors import EncryptionKeyError

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
