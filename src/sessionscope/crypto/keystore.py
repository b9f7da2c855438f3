"""Where wrapped data keys live, apart from the data: an LMDB file, Redis keys, or memory.

A key store is a small map of byte keys to byte values with the few
operations the keyring needs: read, add if absent, compare-and-swap, delete,
delete by prefix, list by prefix. Every write is atomic on its own, so a
process that dies between two of them leaves each record whole. Its
location is a URI of its own: ``lmdb:///path`` (a directory holding one
LMDB file, owner-only), ``redis://host:port/db?prefix=name`` (keys under
their own prefix, by default ``sessionscope-keys:``) or ``memory://`` (this
process only, for tests and the memory store).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qsl, urlencode, urlsplit

from ..errors import (
    IncompatibleStoreError,
    StoreClosedError,
    StoreError,
    StoreNotFoundError,
    UnsafeStoreError,
)
from ..stores.lmdb.layout import DB_NAMES
from ..stores.lmdb.opening import OPEN_HERE, check_store_files, file_id
from ..stores.uri import check_server_uri, redact, uri_path

__all__ = ["KeyBackend", "check_makeable", "open_key_store"]

# Enough for about ten million users' keys; LMDB reserves it, the file grows as used.
_MAP_SIZE = 1 << 31


class KeyBackend(Protocol):
    """The map of wrapped data keys a keyring reads and writes."""

    where: str

    def get(self, key: bytes) -> bytes | None:
        """Return the value of ``key``, None if absent."""
        ...

    def add(self, key: bytes, value: bytes) -> bytes:
        """Store ``value`` unless ``key`` holds one; return what ``key`` holds after."""
        ...

    def swap(self, key: bytes, old: bytes, new: bytes) -> bool:
        """Replace ``old`` by ``new`` if ``key`` still holds ``old``; tell whether it did."""
        ...

    def delete(self, key: bytes) -> None:
        """Remove ``key`` (absent: nothing)."""
        ...

    def delete_prefix(self, prefix: bytes) -> int:
        """Remove every key starting with ``prefix``; return how many."""
        ...

    def items(self, prefix: bytes) -> list[tuple[bytes, bytes]]:
        """Return every (key, value) whose key starts with ``prefix``."""
        ...

    def close(self) -> None:
        """Release the key store."""
        ...


class MemoryKeys:
    """A key store in this process's memory."""

    def __init__(self) -> None:
        self.where = "memory://"
        self._map: dict[bytes, bytes] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return "MemoryKeys()"

    def get(self, key: bytes) -> bytes | None:
        return self._map.get(key)

    def add(self, key: bytes, value: bytes) -> bytes:
        with self._lock:
            return self._map.setdefault(key, value)

    def swap(self, key: bytes, old: bytes, new: bytes) -> bool:
        with self._lock:
            if self._map.get(key) != old:
                return False
            self._map[key] = new
            return True

    def delete(self, key: bytes) -> None:
        with self._lock:
            self._map.pop(key, None)

    def delete_prefix(self, prefix: bytes) -> int:
        with self._lock:
            gone = [key for key in self._map if key.startswith(prefix)]
            for key in gone:
                del self._map[key]
            return len(gone)

    def items(self, prefix: bytes) -> list[tuple[bytes, bytes]]:
        with self._lock:
            return sorted((k, v) for k, v in self._map.items() if k.startswith(prefix))

    def close(self) -> None:
        pass


# py-lmdb refuses to open one environment twice in a process: every keyring
# of a path shares one, closed when the last lets go.
_lmdb_lock = threading.Lock()
_lmdb_open: dict[str, tuple[Any, int]] = {}
_named_memory: dict[str, MemoryKeys] = {}


def _refuse_a_data_store(path: Path, where: str) -> None:
    """Refuse a key store path that holds a store's data: keys= names the data by mistake.

    Its meta record would otherwise read as a damaged key store's, whose
    hint (restore it from a backup) is wrong. The look is read-only and
    takes no lock, so it disturbs no process that has the data store open.
    """
    import lmdb

    # A data store open in this process is not opened a second time (LMDB
    # forbids it): it is known by its file.
    data_store = file_id(path / "data.mdb") in OPEN_HERE
    if not data_store:
        env = lmdb.open(str(path), readonly=True, lock=False, max_dbs=0)
        try:
            with env.begin() as txn:
                data_store = all(txn.get(name) is not None for name in DB_NAMES)
        finally:
            env.close()
    if data_store:
        raise IncompatibleStoreError(
            f"{where} holds a store's data, not a key store",
            hint="give keys= a place of its own, apart from the data: where the "
            "store's data keys were written",
        )


def _check_directory(path: Path) -> None:
    """Refuse a key store's directory that is not its owner's alone.

    What a store's directory must be (no planted links, FIFOs or devices, no
    other writer), checked before LMDB opens a file. A key store takes no
    file_mode= or trust_directory=: its directory is its owner's alone,
    whatever the data store's is.
    """
    try:
        check_store_files(path)
    except UnsafeStoreError as error:
        what = str(error).rpartition(" (hint: ")[0] or str(error)
        raise UnsafeStoreError(
            f"the key store {what}",
            hint="a key store's directory and files are its owner's alone: chmod go-w "
            "the directory, remove a link in place of its files",
        ) from None


def check_makeable(location: str) -> None:
    """Refuse a key store that does not exist yet and could not be made here.

    Called before a new data store is created (``checked_kek``): otherwise a
    mistyped ``keys=`` (a directory that does not exist, one this process
    may not write to, or one others may write to) would be found only after
    the data store had been made, and a new Redis store made by an open that
    failed is refused encryption from then on. Only an LMDB key store is
    made on disk; a Redis one answers (or not) when it is first read.
    """
    parts = urlsplit(location)
    if parts.scheme != "lmdb":
        return
    path = _lmdb_path(location)
    where = f"lmdb://{path}"
    _check_directory(path)
    directory = path if path.is_dir() else path.parent
    problem = None
    if not directory.is_dir():
        problem = f"{directory} is not a directory"
    elif not os.access(directory, os.W_OK | os.X_OK):
        problem = f"this process may not write to {directory}"
    if problem is not None:
        raise StoreError(
            f"the key store {where} cannot be made: {problem}",
            hint="check the path and its permissions; nothing was written",
        )


class LmdbKeys:
    """A key store in an LMDB file of its own (``data.mdb`` in its directory)."""

    def __init__(self, path: Path, create: bool) -> None:
        import lmdb

        self.where = f"lmdb://{path}"
        if not create and not (path / "data.mdb").is_file():
            raise StoreNotFoundError(
                f"the key store {self.where} does not exist",
                hint="give the key store (keys=) the store's data keys were written to",
            )
        self._real = str(path.resolve()) if path.exists() else str(path.absolute())
        with _lmdb_lock:
            known = _lmdb_open.get(self._real)
            if known is not None:
                self._env = known[0]
                _lmdb_open[self._real] = (known[0], known[1] + 1)
                self._closed = False
                return
            _check_directory(path)
            try:
                if (path / "data.mdb").is_file():
                    _refuse_a_data_store(path, self.where)
                path.mkdir(mode=0o700, exist_ok=True)
                env = lmdb.open(str(path), map_size=_MAP_SIZE, mode=0o600, max_dbs=0)
            except (OSError, lmdb.Error) as error:
                raise StoreError(
                    f"the key store {self.where} cannot be opened ({error})",
                    hint="check the path and its permissions",
                ) from None
            self._real = str(path.resolve())
            self._env = env
            _lmdb_open[self._real] = (env, 1)
        self._closed = False

    def __repr__(self) -> str:
        return f"LmdbKeys({self.where!r})"

    def _begin(self, write: bool = False) -> Any:
        if self._closed:
            raise StoreClosedError(f"the key store {self.where} is closed")
        return self._env.begin(write=write)

    def get(self, key: bytes) -> bytes | None:
        with self._begin() as txn:
            value = txn.get(key)
        return None if value is None else bytes(value)

    def add(self, key: bytes, value: bytes) -> bytes:
        with self._begin(True) as txn:
            stored = txn.get(key)
            if stored is not None:
                return bytes(stored)
            txn.put(key, value)
        return value

    def swap(self, key: bytes, old: bytes, new: bytes) -> bool:
        with self._begin(True) as txn:
            if txn.get(key) != old:
                return False
            txn.put(key, new)
        return True

    def delete(self, key: bytes) -> None:
        with self._begin(True) as txn:
            txn.delete(key)

    def delete_prefix(self, prefix: bytes) -> int:
        with self._begin(True) as txn:
            cursor = txn.cursor()
            gone = 0
            if cursor.set_range(prefix):
                while cursor.key().startswith(prefix):
                    gone += 1
                    if not cursor.delete():
                        break
            return gone

    def items(self, prefix: bytes) -> list[tuple[bytes, bytes]]:
        found: list[tuple[bytes, bytes]] = []
        with self._begin() as txn:
            cursor = txn.cursor()
            if cursor.set_range(prefix):
                for key, value in cursor:
                    if not key.startswith(prefix):
                        break
                    found.append((bytes(key), bytes(value)))
        return found

    def close(self) -> None:
        with _lmdb_lock:
            if getattr(self, "_closed", True):
                return
            self._closed = True
            env, count = _lmdb_open[self._real]
            if count > 1:
                _lmdb_open[self._real] = (env, count - 1)
                return
            del _lmdb_open[self._real]
            env.close()


class RedisKeys:
    """A key store in Redis: one string per record, under a prefix of its own."""

    def __init__(self, url: str, prefix: str) -> None:
        import redis

        self.where = redact(url)
        self._prefix = prefix.encode()
        self._redis = redis
        self._client = redis.Redis.from_url(url)

    def __repr__(self) -> str:
        return f"RedisKeys({self.where!r})"

    def _name(self, key: bytes) -> bytes:
        # Hex keeps the key's part of SCAN's MATCH pattern free of glob characters.
        return self._prefix + key.hex().encode()

    def _names(self, prefix: bytes) -> list[tuple[bytes, bytes]]:
        """Return (name, key) of every record whose key starts with ``prefix``, sorted."""
        from ..stores.redis.client import scan_prefix  # redis is an optional extra

        start = self._name(prefix)
        # The store's scan: its pattern takes the user's prefix literally (never
        # "ab:" for "a*:"), and it asks for a thousand slots a round trip.
        scanned = self._call("list keys", lambda: list(scan_prefix(self._client, False, start)))
        found = []
        for name in sorted(set(scanned)):
            try:
                key = bytes.fromhex(name[len(self._prefix) :].decode("ascii"))
            except ValueError:
                continue
            if self._name(key) == name:  # else not a name this key store writes
                found.append((bytes(name), key))
        return found

    def _call(self, what: str, function: Any, *args: Any) -> Any:
        try:
            return function(*args)
        except self._redis.RedisError as error:
            raise StoreError(
                f"the key store {self.where} failed to {what} ({type(error).__name__}: {error})",
                hint="check that the key store's Redis server is up and reachable",
            ) from None

    def get(self, key: bytes) -> bytes | None:
        value = self._call("read a key", self._client.get, self._name(key))
        return None if value is None else bytes(value)

    def add(self, key: bytes, value: bytes) -> bytes:
        name = self._name(key)
        if self._call("write a key", self._client.set, name, value, None, None, True):
            return value
        stored = self._call("read a key", self._client.get, name)
        return value if stored is None else bytes(stored)

    def swap(self, key: bytes, old: bytes, new: bytes) -> bool:
        name = self._name(key)

        def attempt() -> bool:
            with self._client.pipeline() as pipe:
                try:
                    pipe.watch(name)  # type: ignore[no-untyped-call]
                    if pipe.get(name) != old:
                        pipe.unwatch()
                        return False
                    pipe.multi()
                    pipe.set(name, new)
                    pipe.execute()
                except self._redis.WatchError:
                    return False
            return True

        return bool(self._call("replace a key", attempt))

    def delete(self, key: bytes) -> None:
        self._call("delete a key", self._client.delete, self._name(key))

    def delete_prefix(self, prefix: bytes) -> int:
        names = [name for name, _ in self._names(prefix)]
        if not names:
            return 0
        return int(self._call("delete keys", self._client.delete, *names))

    def items(self, prefix: bytes) -> list[tuple[bytes, bytes]]:
        found = []
        for _, key in self._names(prefix):
            value = self.get(key)
            if value is not None:
                found.append((key, value))
        return found

    def close(self) -> None:
        self._client.close()


def _lmdb_path(location: str) -> Path:
    """Return the directory an ``lmdb://`` key store URI names."""
    path = uri_path(location).split("?", 1)[0]
    if not path:
        raise ValueError(f"the key store {location!r} names no path")
    return Path(os.path.expanduser(path))


def open_key_store(location: str, *, create: bool = True) -> KeyBackend:
    """Open the key store a URI names (``lmdb:///path``, ``redis://...?prefix=``, ``memory://``)."""
    parts = urlsplit(location)
    if parts.scheme == "memory":
        # memory:// is new each time; memory://name is shared by name in this process.
        if not parts.netloc:
            return MemoryKeys()
        with _lmdb_lock:
            return _named_memory.setdefault(parts.netloc, MemoryKeys())
    if parts.scheme == "lmdb":
        return LmdbKeys(_lmdb_path(location), create)
    if parts.scheme in ("redis", "rediss"):
        check_server_uri(location)
        pairs = parse_qsl(parts.query, keep_blank_values=True)
        prefix = "sessionscope-keys:"
        rest = []
        for name, text in pairs:
            if name == "prefix":
                prefix = text
            else:
                rest.append((name, text))
        return RedisKeys(parts._replace(query=urlencode(rest)).geturl(), prefix)
    raise ValueError(
        f"unknown key store scheme in {redact(location)!r}: use lmdb://, redis://, "
        "rediss:// or memory://"
    )
