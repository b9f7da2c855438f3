"""``redact`` on a URI nested, percent-encoded, in another's query: the key store's ``keys=``.

An encrypted store's URI carries its key store's URI percent-encoded
(``lmdb:///srv/store?key_env=KEK&keys=redis%3A%2F%2F%3Apassword%40host``).
Its password is hidden as a plain URI's is, whatever the case of the escapes
and however many times it was encoded; the rest of the text is left as it was.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from urllib.parse import quote, unquote

import pytest
from hypothesis import given
from hypothesis import strategies as st

import _stores
from sessionscope.stores import redact
from sessionscope.stores.uri import parse_store_uri

SECRET = "S3cretPassw0rd"
KEYS = f"redis://:{SECRET}@127.0.0.1:6379/0?prefix=kp"
ENCODED = quote(KEYS, safe="")  # redis%3A%2F%2F%3AS3cretPassw0rd%40127.0.0.1%3A6379...
HIDDEN = "redis%3A%2F%2F%3A***%40127.0.0.1%3A6379%2F0%3Fprefix%3Dkp"


def readings(text: str) -> list[str]:
    """Return ``text`` and what it reads as decoded once, twice and three times."""
    found = [text]
    for _ in range(3):
        found.append(unquote(found[-1]))
    return found


def assert_no_secret(text: str, secret: str = SECRET) -> None:
    for reading in readings(text):
        assert secret not in reading, reading


def test_a_nested_password_is_hidden_and_the_rest_kept() -> None:
    text = f"lmdb:///srv/store?key_env=KEK&keys={ENCODED}"
    assert redact(text) == f"lmdb:///srv/store?key_env=KEK&keys={HIDDEN}"


def test_escapes_in_lower_case() -> None:
    text = f"no store: lmdb:///srv/store?keys={ENCODED.lower()}: /srv/store does not exist"
    hidden = f"no store: lmdb:///srv/store?keys={HIDDEN.lower()}: /srv/store does not exist"
    assert redact(text) == hidden
    assert_no_secret(redact(text), SECRET.lower())


def test_escapes_in_mixed_case() -> None:
    text = "keys=redis%3a%2F%2fada%3A" + SECRET + "%40h%3a1 and more"
    assert redact(text) == "keys=redis%3a%2F%2fada%3A***%40h%3a1 and more"


def test_doubly_encoded() -> None:
    text = f"lmdb:///s?keys={quote(ENCODED, safe='')}"
    assert redact(text) == f"lmdb:///s?keys={quote(HIDDEN, safe='*')}"
    assert_no_secret(redact(text))


@pytest.mark.parametrize("safe", ["/", ":/", "@"])
def test_partly_encoded(safe: str) -> None:
    # quote() leaves "/" as it is unless told; any delimiter may be left bare.
    text = f"lmdb:///s?keys={quote(KEYS, safe=safe)}"
    redacted = redact(text)
    assert_no_secret(redacted)
    assert "***" in redacted and redacted.endswith("127.0.0.1" + text.split("127.0.0.1", 1)[1])


def test_a_user_name_is_kept_and_userinfo_without_colon_hidden_whole() -> None:
    assert redact(quote(f"redis://alice:{SECRET}@h:1/0", safe="")) == (
        "redis%3A%2F%2Falice%3A***%40h%3A1%2F0"
    )
    assert redact(quote(f"redis://{SECRET}@h:1", safe="")) == "redis%3A%2F%2F***%40h%3A1"
    assert redact(quote("redis://alice:@h", safe="")) == "redis%3A%2F%2Falice%3A***%40h"


def test_a_password_that_is_itself_encoded() -> None:
    # The inner URI escapes its password's "@" and "/"; the outer escapes those escapes.
    password = quote(f"p@/ss{SECRET}", safe="")
    text = f"lmdb:///s?keys={quote(f'redis://u:{password}@h:1/0', safe='')}"
    redacted = redact(text)
    assert redacted == "lmdb:///s?keys=redis%3A%2F%2Fu%3A***%40h%3A1%2F0"
    assert_no_secret(redacted)


def test_a_password_with_bytes_outside_ascii() -> None:
    # "à" is C3 A0 in UTF-8, and U+00A0 is a space: a byte is not taken for a character.
    text = quote(f"redis://u:pà\xa0{SECRET}@h", safe="")
    assert redact(text) == "redis%3A%2F%2Fu%3A***%40h"


def test_several_nested_uris_and_a_plain_one_in_one_text() -> None:
    text = (
        f"redis://u:{SECRET}@a:1/0?keys={ENCODED} and "
        f"lmdb:///b?keys={quote(f'rediss://v:{SECRET}2@c:2', safe='')}"
    )
    assert redact(text) == (
        f"redis://u:***@a:1/0?keys={HIDDEN} and lmdb:///b?keys=rediss%3A%2F%2Fv%3A***%40c%3A2"
    )


@pytest.mark.parametrize(
    "text",
    [
        "",
        "100% sure, %ZZ, %",
        "lmdb:///srv/store?key_env=KEK&keys=lmdb%3A%2F%2F%2Fsrv%2Fkeys",
        f"lmdb:///srv/store?keys={quote('redis://127.0.0.1:6379/0?prefix=a@b', safe='')}",
        "lmdb:///a%40b/c",
        "redis://h:1/0 lmdb:///a@b",
        "the key store redis://:***@127.0.0.1:1/2 failed",
    ],
)
def test_text_without_a_password_is_left_as_it_is(text: str) -> None:
    assert redact(text) == text


@pytest.mark.parametrize(
    ("text", "hidden"),
    [
        (f"redis://alice:{SECRET}@h:1/0?prefix=p", "redis://alice:***@h:1/0?prefix=p"),
        (f"x rediss://:{SECRET}@h:1 y", "x rediss://:***@h:1 y"),
        (f"redis+cluster://a:{SECRET}@h:1,h:2?x", "redis+cluster://a:***@h:1,h:2?x"),
        (f"redis://{SECRET}@h:1", "redis://***@h:1"),
        (f"redis://a:p@{SECRET}@h:1", "redis://a:***@h:1"),
        (f"redis://a:p%40{SECRET}@h:1", "redis://a:***@h:1"),
    ],
)
def test_plain_uris_as_before(text: str, hidden: str) -> None:
    assert redact(text) == hidden


_PLAIN_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/\s?#]*)@")


def _plain_redact(text: str) -> str:
    """Redaction as it was before nested URIs were read: the oracle for text without escapes."""

    def hide(match: re.Match[str]) -> str:
        user, colon, _ = match["userinfo"].partition(":")
        return f"{match['scheme']}{user}:***@" if colon else f"{match['scheme']}***@"

    return _PLAIN_USERINFO.sub(hide, text)


@given(st.text(alphabet=st.sampled_from("ab:/@?# \n%3A2F40xyz.+-"), max_size=40))
def test_text_without_escapes_redacts_as_before(text: str) -> None:
    if re.search(r"%[0-9A-Fa-f]{2}", text):
        # Only what is hidden differs: the plain reading's output, with more hidden.
        assert redact(text).count("***") >= _plain_redact(text).count("***")
    else:
        assert redact(text) == _plain_redact(text)


@given(
    password=st.text(min_size=1, max_size=20).map(lambda text: f"Pw{text}"),
    user=st.sampled_from(["", "alice"]),
    times=st.integers(min_value=1, max_value=2),
    lower=st.booleans(),
)
def test_any_nested_password_is_hidden(password: str, user: str, times: int, lower: bool) -> None:
    try:
        escaped = quote(password, safe="")
    except UnicodeEncodeError:  # a lone surrogate is no password
        return
    nested = f"redis://{user}:{escaped}@127.0.0.1:6379/0"
    for _ in range(times):
        nested = quote(nested, safe="")
    if lower:
        nested = re.sub(r"%[0-9A-F]{2}", lambda escape: escape[0].lower(), nested)
    redacted = redact(f"no store: lmdb:///srv/store?key_env=KEK&keys={nested}: missing")
    assert "***" in redacted
    for reading in readings(redacted):
        assert escaped not in reading and (len(password) < 4 or password not in reading)


def test_store_spec_repr_hides_a_nested_password() -> None:
    spec = parse_store_uri(f"lmdb:///srv/store?key_env=KEK&keys={ENCODED}")
    assert HIDDEN in repr(spec)
    assert_no_secret(repr(spec))


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the command line in a child, with the key its encrypted stores are opened with."""
    extra = {"PYTHONWARNINGS": "error", "SESSIONSCOPE_TEST_NESTED_KEK": "00" * 32}
    return _stores.run_cli(*args, extra_env=extra)


@pytest.mark.parametrize("lower", [False, True])
@pytest.mark.parametrize("command", [["ls"], ["stats", "--json"], ["show", "--json"]])
def test_command_line_error_hides_the_key_stores_password(
    tmp_path: Path, command: list[str], lower: bool
) -> None:
    keys = ENCODED.lower() if lower else ENCODED
    uri = f"lmdb://{tmp_path / 'missing'}?key_env=SESSIONSCOPE_TEST_NESTED_KEK&keys={keys}"
    extra = ["app", "user", "session"] if command[0] == "show" else []
    done = run_cli(*command, uri, *extra)
    assert done.returncode != 0
    # The one line on stderr names the store, the key store's URI with its password hidden.
    assert f"sessionscope {command[0]}: error: no store:" in done.stderr
    assert (HIDDEN.lower() if lower else HIDDEN) in done.stderr
    if "--json" in command:
        assert '"error"' in done.stdout
    assert_no_secret(done.stdout + done.stderr, SECRET.lower() if lower else SECRET)
