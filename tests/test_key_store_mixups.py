"""A key store and a data store named in each other's place: a clear error, nothing changed.

An operator who gives ``keys=`` the data store's directory, or opens the key
store's directory as a store, gets an ``IncompatibleStoreError`` that says
what the path holds, not a hint to restore a "damaged" store from a backup;
and neither directory changes.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest

from _stores import TEST_KEK, child_env, run_cli, snapshot_dir
from sessionscope import SyncSessionService
from sessionscope.crypto import Encryption
from sessionscope.errors import IncompatibleStoreError, StoreError, UnsafeStoreError
from sessionscope.stores import open_store


def _encryption(keys: Path) -> Encryption:
    return Encryption(keys=f"lmdb://{keys}", key=TEST_KEK)


def test_keys_naming_a_data_store_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with SyncSessionService(f"lmdb://{data}") as svc:
        svc.create_session(app_name="a", user_id="u", session_id="s")
        # Open in this process: refused without a second open of its files.
        with pytest.raises(IncompatibleStoreError, match="holds a store's data, not a key store"):
            open_store(f"lmdb://{tmp_path / 'new'}", encryption=_encryption(data))
        # The store open here goes on working.
        svc.create_session(app_name="a", user_id="u", session_id="t")
    before = snapshot_dir(data)
    with pytest.raises(IncompatibleStoreError, match="holds a store's data, not a key store") as e:
        open_store(f"lmdb://{tmp_path / 'new'}", encryption=_encryption(data))
    assert e.value.hint is not None and "restore" not in e.value.hint
    assert snapshot_dir(data) == before
    assert not (tmp_path / "new").exists()
    with SyncSessionService(f"lmdb://{data}") as svc:
        assert [s.id for s in svc.list_sessions(app_name="a").sessions] == ["s", "t"]


def _open_key_store(tmp_path: Path) -> Path:
    keys = tmp_path / "keys"
    with SyncSessionService(
        open_store(f"lmdb://{tmp_path / 'enc'}", encryption=_encryption(keys))
    ) as svc:
        svc.create_session(app_name="a", user_id="u", state={"user:name": "Ada"})
    return keys


def test_a_key_store_opened_as_a_store_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    keys = _open_key_store(tmp_path)
    before = snapshot_dir(keys)
    with pytest.raises(IncompatibleStoreError, match="holds another LMDB database"):
        open_store(f"lmdb://{keys}")
    assert snapshot_dir(keys) == before


def test_a_key_store_in_use_opened_as_a_store_is_refused(tmp_path: Path) -> None:
    """With another process holding the key store open, the opening transaction refuses it."""
    keys = _open_key_store(tmp_path)
    holder = textwrap.dedent(
        f"""
        import sys
        from sessionscope.crypto import Encryption
        from sessionscope.stores import open_store
        store = open_store({f"lmdb://{tmp_path / 'enc'}"!r},
                           encryption=Encryption(keys={f"lmdb://{keys}"!r}, key=bytes(range(32))))
        print("open", flush=True)
        sys.stdin.readline()
        store.close()
        """
    )
    child = subprocess.Popen(
        [sys.executable, "-c", holder],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "open"
        with pytest.raises(IncompatibleStoreError, match="holds another LMDB database"):
            open_store(f"lmdb://{keys}")
    finally:
        assert child.stdin is not None and child.stdout is not None
        child.stdin.close()
        assert child.wait(timeout=60) == 0
        child.stdout.close()
    # The key store still opens its store.
    with SyncSessionService(
        open_store(f"lmdb://{tmp_path / 'enc'}", encryption=_encryption(keys))
    ) as svc:
        assert svc.get_user_state(app_name="a", user_id="u") == {"name": "Ada"}


@pytest.mark.parametrize("name", ["data.mdb", "lock.mdb"])
def test_a_key_store_file_that_is_a_link_is_refused_and_its_target_kept(
    tmp_path: Path, name: str
) -> None:
    """LMDB would write through the link: the key store is refused before any file is opened."""
    keys = _open_key_store(tmp_path)
    victim = tmp_path / "victim"
    victim.write_bytes(b"not yours")
    (keys / name).unlink()
    (keys / name).symlink_to(victim)
    with pytest.raises(UnsafeStoreError, match="is a symbolic link"):
        open_store(f"lmdb://{tmp_path / 'enc'}", encryption=_encryption(keys))
    done = run_cli("rotate-key", f"lmdb://{keys}", "--old-key-env", "OLD", "--new-key-env", "NEW",
                   extra_env={"OLD": TEST_KEK.hex(), "NEW": bytes(32).hex()})  # fmt: skip
    assert done.returncode != 0 and "symbolic link" in done.stderr, done.stderr
    assert victim.read_bytes() == b"not yours"


def test_a_key_store_others_may_write_to_is_refused(tmp_path: Path) -> None:
    keys = _open_key_store(tmp_path)
    keys.chmod(0o707)
    try:
        with pytest.raises(UnsafeStoreError, match=r"the key store .* is writable by others") as e:
            open_store(f"lmdb://{tmp_path / 'enc'}", encryption=_encryption(keys))
        # The key store takes no file_mode= or trust_directory=: the hint names none.
        assert e.value.hint is not None and "file_mode" not in e.value.hint
    finally:
        keys.chmod(0o700)


def test_a_key_store_that_cannot_be_made_is_refused_before_the_data_store_is_made(
    tmp_path: Path,
) -> None:
    """A mistyped keys= is refused before the new data store's path is created."""
    data = tmp_path / "data"
    with pytest.raises(StoreError, match=r"cannot be made: .* is not a directory") as caught:
        open_store(f"lmdb://{data}", encryption=_encryption(tmp_path / "no" / "such" / "keys"))
    assert caught.value.hint is not None and "nothing was written" in caught.value.hint
    # A directory others may write to is refused as opening it would refuse it.
    shared = tmp_path / "shared-keys"
    shared.mkdir(mode=0o700)
    shared.chmod(0o770)
    with pytest.raises(UnsafeStoreError, match=r"the key store .* is writable by group"):
        open_store(f"lmdb://{data}", encryption=_encryption(shared))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shared-keys"]
    assert list(shared.iterdir()) == []
    # Given a key store that can be made, the same path opens encrypted.
    with SyncSessionService(
        open_store(f"lmdb://{data}", encryption=_encryption(tmp_path / "keys"))
    ) as svc:
        svc.create_session(app_name="a", user_id="u", session_id="s", state={"user:n": 1})
    with SyncSessionService(
        open_store(f"lmdb://{data}", encryption=_encryption(tmp_path / "keys"))
    ) as svc:
        assert svc.get_user_state(app_name="a", user_id="u") == {"n": 1}


def test_a_new_redis_store_is_not_made_when_its_key_store_cannot_be(
    tmp_path: Path, redis_server: Any
) -> None:
    """A new Redis store made by an open that failed would be refused encryption from then on."""
    import redis

    prefix = f"unmade{uuid.uuid4().hex[:8]}:"
    url = f"{redis_server.url}?prefix={prefix}"
    client = redis.Redis.from_url(redis_server.url)
    try:
        with pytest.raises(StoreError, match="cannot be made"):
            open_store(url, encryption=_encryption(tmp_path / "no" / "keys"))
        assert client.keys(f"{prefix}*") == []
        store = open_store(url, encryption=_encryption(tmp_path / "keys"))
        with SyncSessionService(store) as svc:
            svc.create_session(app_name="a", user_id="u", session_id="s", state={"user:n": 1})
            assert svc.get_user_state(app_name="a", user_id="u") == {"n": 1}
    finally:
        names = client.keys(f"{prefix}*")
        if names:
            client.delete(*names)
        client.close()
