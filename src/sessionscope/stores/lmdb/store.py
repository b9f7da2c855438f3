"""The durable default: sessions in an LMDB memory-mapped store.

Layout (named sub-databases; ``part(x)`` is a length-prefixed UTF-8 id, or a
marker and a BLAKE2b digest for ids over 150 bytes, which keeps every key
under LMDB's 511-byte limit while ids may be 4 KiB):

    meta      b"format" -> version byte + packed {"magic", "format"}
              b"next_number" -> 8-byte counter of session numbers
    sessions  part(app) part(user) part(session) -> packed SessionRecord
    shared    b"a" part(app) part(key) -> packed value            (app state)
              b"u" part(app) part(user) part(key) -> packed value (user state)
    data      number b"e" seq -> 8-byte timestamp + event record
              number b"i" part(event id) -> seq
              number b"t" sortable(timestamp) seq -> b""
              number b"s" part(key) -> packed value                (session state)
    listing   part(app) sortable(last_update_time) number -> the session's key
              (format 2 only: the list index, one entry per session)

``number`` is an 8-byte session number that is never reused, ``seq`` the
8-byte position of an event in its session. Everything a session owns sits
under its number in one database, so an append dirties few pages and a
delete is one range. State is one record per key, so an append writes only
the keys its delta touches. A state key stored under a digest keeps its full
text in the value (``[key, packed value]``).

Durability: with ``durability="sync"`` the environment commits with LMDB's
own two-fsync protocol, and the writes of all threads and tasks that queue
while the disk syncs are committed in one transaction (group commit) by a
calling thread or, for event loops, by the store's writer thread. With
``"deferred"`` writes commit in the caller's thread without fsync and a
background thread syncs every ``flush_interval`` seconds and on ``flush()``;
``close()`` syncs, and so does the interpreter's exit for a store left open.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import errno
import fcntl
import logging
import math
import mmap
import os
import shutil
import stat
import struct
import sys
import tempfile
import threading
import time
import weakref
from array import array
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterator
from functools import partial, wraps
from itertools import islice, pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast
from urllib.parse import quote

import lmdb

from ...admin.outfile import create_exclusive, remove_own
from ...codec import decode_event, decode_stored, pack, unpack
from ...core import compiled_or_twin
from ...errors import (
    AlreadyExistsError,
    CorruptStoreError,
    IncompatibleStoreError,
    SessionNotFoundError,
    SessionscopeError,
    StoreClosedError,
    StoreError,
    UnsafeStoreError,
)
from ..completion import Completion, Pending, finish_all
from ..expiry import Expirer
from ..protocol import InlineAsyncStore
from ..records import (
    AppendBatch,
    AppendRequest,
    AppendResult,
    BatchResult,
    EventCopy,
    EventPage,
    Items,
    ListPosition,
    LoadedSession,
    PartialBatch,
    SessionCopy,
    SessionRecord,
    copies_equal,
    event_copy,
    result_of_batch,
)
from ..rules import (
    BATCH_EVENTS,
    BATCH_SECONDS,
    BATCH_SESSIONS,
    check_copy,
    check_ttl,
    finite_float,
    list_position,
    page_records,
)

__all__ = ["FORMAT_VERSION", "LmdbStore", "path_uri"]

T = TypeVar("T")
Durability = Literal["sync", "deferred"]

FORMAT_VERSION = 2
MAGIC = "sessionscope"
DEFAULT_MAP_SIZE = 64 << 20
_DB_NAMES = (b"meta", b"sessions", b"shared", b"data")
# Format 2 adds the list index; a store of format 1 is read and written as it is.
_LISTING = b"listing"
_APP, _USER = b"a", b"u"
_EVENT, _EVENT_ID, _EVENT_TIME, _STATE = b"e", b"i", b"t", b"s"
_FORMAT_KEY = b"format"
_NUMBER_KEY = b"next_number"
# Numbers of removed sessions whose state and events are still to delete.
_PURGE = b"purge"
_DIGEST_MARK = b"\xff\xff"
# The magic number at the start of every LMDB meta page (after the page header).
_LMDB_MAGIC = 0xBEEFC0DE
_MAX_BATCH = 1024
# A map smaller than this cannot hold the named databases of a new store.
_MIN_MAP_SIZE = 1 << 20
# Each reader slot is a line of lock.mdb; more than this is a typo.
_MAX_READERS = 1 << 20
_U64 = struct.Struct(">Q")
_F64 = struct.Struct(">d")
# A write waiting for the group commit, and who waits for it.
_Queued = tuple[Callable[[Any], Any], Pending[Any]]


class _MapMustGrow(Exception):
    """Writes that ran out of map where the map may not grow; nothing was written."""


# The process the stores of this process were opened in. A forked child gets
# its own id here, and a store opened in the parent refuses to work there.
_process_pid = os.getpid()


def _note_fork() -> None:
    global _process_pid
    _process_pid = os.getpid()
    # The parent's stores are not open here; LMDB still counts them as open
    # until the inherited objects are dropped.
    _inherited.update(_open_here)
    _open_here.clear()


os.register_at_fork(after_in_child=_note_fork)

_log = logging.getLogger(__name__)

# The deferred stores open in this process. A script that appends and ends
# without close() would leave what it wrote since the last sync to the
# kernel's write-back: ``_flush_at_exit`` syncs them when the interpreter
# exits. Weak, and close() takes a store out: the set never keeps one alive.
_deferred_open: weakref.WeakSet[LmdbStore] = weakref.WeakSet()


def _flush_at_exit() -> None:
    """Sync every deferred store still open; a failure is logged, the others still sync."""
    for store in list(_deferred_open):
        store._sync_at_exit()


# Registered after logging's own exit handler, so it runs before logging shuts down.
atexit.register(_flush_at_exit)


if TYPE_CHECKING:
    # The source is the type source; its compiled build has the same signatures.
    from . import _append as _hot
    from . import _locks
else:
    _hot = compiled_or_twin("sessionscope.stores.lmdb._append")
    _locks = compiled_or_twin("sessionscope.stores.lmdb._locks")

# The key helpers live with the append bodies, which run them on every append.
_unique_part = _hot.unique_part
# App, user, session ids and state keys recur: their parts are remembered.
_part = _hot.part
_sortable_time = _hot.sortable_time
_item_entries = _hot.item_entries
_event_entries = _hot.event_entries
_in_time_order = _hot.in_time_order
_list_key = _hot.list_key

_Init = TypeVar("_Init", bound=Callable[..., None])


def _logs_refusal(init: _Init) -> _Init:
    """Log why a store refused to open (at INFO: the caller gets the error too)."""

    @wraps(init)
    def opening(self: LmdbStore, *args: Any, **kwargs: Any) -> None:
        try:
            init(self, *args, **kwargs)
        except SessionscopeError as error:
            _log.info("refused to open the store at %s: %s", self.path, error)
            raise

    return cast(_Init, opening)


class LmdbStore:
    """A durable store in one directory, shared safely by several processes."""

    @_logs_refusal
    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durability: Durability = "sync",
        map_size: int = DEFAULT_MAP_SIZE,
        flush_interval: float = 1.0,
        file_mode: int = 0o600,
        max_readers: int = 256,
        session_ttl: float | None = None,
        verify: bool = False,
        trust_directory: bool = False,
    ) -> None:
        ttl = check_ttl(session_ttl)
        map_size = _check_options(durability, map_size, flush_interval, file_mode, max_readers)
        self.path = Path(path)
        self.aio = InlineAsyncStore(self)
        self.durability: Durability = durability
        self.flush_interval = flush_interval
        self._file_mode = file_mode
        self._max_readers = max_readers
        # A store belongs to the process that opened it: one that crossed a
        # fork() refuses to be used in the child (see _check_open).
        self._pid = _process_pid
        self._closed = False
        # Set once the environment is closed; checked under the gate.
        self._released = False
        self._gate = _locks.Gate()
        # Whether this store writes through a writable map (see _open_env).
        self.writemap = False
        self._writemap_allowed = True
        # The format the store was written in (read at open); see FORMAT_VERSION.
        self.format = FORMAT_VERSION
        try:
            self._check_files(trust_directory)
            self._probe(self.path, verify)
        except OSError as error:  # a directory that cannot be listed or read
            raise _open_failure(self.path, error) from error
        if not self.path.exists():
            # A directory needs the search bit wherever its files are readable.
            try:
                self.path.mkdir(mode=file_mode | (file_mode & 0o444) >> 2, parents=True)
            except OSError as error:
                raise _open_failure(self.path, error) from error
        self._env = self._open_env(map_size)
        try:
            # Taken by every write transaction; tried without waiting from a loop.
            self._writer_lock = _locks.WriterLock(str(self.path / "lock.mdb"))
        except OSError as error:
            self._env.close()
            raise _open_failure(self.path, error) from error
        try:
            # Slots of readers whose process died without closing the store
            # would otherwise stay taken until every process closed it.
            self._env.reader_check()
            self._map_size: int = self._env.info()["map_size"]
            self._dbs = self._open_databases()
            self._lock_path = self.path / "lock.mdb"
            # A str: os.stat takes it without converting a Path on every write.
            self._lock_name = str(self._lock_path)
            self._lock_id = _file_id(self._lock_name)
            self._data_id = _file_id(self.path / "data.mdb")
            _open_here.add(self._data_id)
        except BaseException:
            self._env.close()
            self._writer_lock.close()
            raise
        self._sessions = self._dbs[b"sessions"]
        self._shared = self._dbs[b"shared"]
        self._data = self._dbs[b"data"]
        self._listing = self._dbs.get(_LISTING)
        # Writes waiting for the group commit, in arrival order.
        self._writes: deque[_Queued] = deque()
        # Wakes the writer thread, only when a write waits that no calling
        # thread will commit (a woken thread that finds nothing costs two
        # context switches per write).
        self._wake = threading.Condition(threading.Lock())
        self._stopping = False
        # Held by whichever thread commits queued writes: the writer or a caller.
        self._leader = threading.Lock()
        # Makes "is the store open?" and queueing a write one step.
        self._admit = threading.Lock()
        self._writer: threading.Thread | None = None
        self._syncer: threading.Thread | None = None
        self._sync_cond = threading.Condition()
        self._sync_waiters: list[Pending[None]] = []
        self._dirty = False
        if durability == "sync":
            self._start_writer()
        else:
            self._syncer = threading.Thread(
                target=self._sync_loop, name="sessionscope-lmdb-syncer", daemon=True
            )
            self._syncer.start()
            _deferred_open.add(self)
        # Expires idle sessions at open and then periodically, with session_ttl.
        self.session_ttl = ttl
        self._expirer = Expirer(self, ttl) if ttl is not None else None
        if self._expirer is not None:
            self._expirer.start()

    def _start_writer(self) -> None:
        self._writer = threading.Thread(
            target=self._write_loop, name="sessionscope-lmdb-writer", daemon=True
        )
        self._writer.start()

    def _open_env(self, map_size: int) -> Any:
        """Open the environment: deferred stores through a writable map where it is safe.

        A writable map makes a commit cheaper (LMDB writes pages in place
        instead of a pwrite per dirty page), but a write through the map to a
        block the filesystem cannot allocate kills the process with SIGBUS.
        So a deferred store maps writably only once the data file's blocks
        are reserved up to the map size (``posix_fallocate``, again on every
        growth and adoption); where that fails or is unsupported it opens as
        before. Durable stores never do: LMDB then syncs by msync over the
        whole map, so a durable commit would grow slower as the store grows.
        """
        if self.durability == "deferred" and self._writemap_allowed:
            try:
                # LMDB sizes the file to the map at once (sparsely): a file
                # size limit can refuse that; the plain open below says why.
                env = self._open_plain(map_size, writemap=True)
            except StoreError as error:
                _log.debug("mapping %s writably failed: %s", self.path, error)
                env = None
            try:
                if env is not None:
                    self._preallocate(env.info()["map_size"])
                    self.writemap = True
                    return env
            except (StoreError, lmdb.Error) as error:
                # Unsupported here or no room: the mode without, which never faults.
                _log.info("writing %s without a writable map: %s", self.path, error)
                env.close()
            self._writemap_allowed = False
        self.writemap = False
        return self._open_plain(map_size, writemap=False)

    def _preallocate(self, size: int) -> None:
        """Reserve the data file's blocks up to ``size`` bytes; StoreError when the OS refuses."""
        allocate = getattr(os, "posix_fallocate", None)
        if allocate is None:
            raise StoreError("posix_fallocate is not available on this platform")
        try:
            fd = os.open(self.path / "data.mdb", os.O_RDWR | os.O_CLOEXEC)
            try:
                allocate(fd, 0, size)
            finally:
                os.close(fd)
        except OSError as error:
            raise StoreError(
                f"reserving {size} bytes of disk for the map of {self.path} failed: {error}",
                hint="check free disk space and file size limits; "
                "what was stored before this call is intact",
            ) from error

    def _open_plain(self, map_size: int, writemap: bool) -> Any:
        try:
            return _open_adopting(
                str(self.path),
                map_size=map_size,
                max_dbs=len(_DB_NAMES) + 2,
                max_readers=self._max_readers,
                max_spare_txns=16,
                subdir=True,
                sync=self.durability == "sync",
                metasync=True,
                readahead=False,
                writemap=writemap,
                mode=self._file_mode,
            )
        except lmdb.InvalidError as error:
            raise IncompatibleStoreError(
                f"{self.path} does not hold an LMDB store", hint="pick an empty directory"
            ) from error
        except (lmdb.Error, OSError) as error:
            raise _open_failure(self.path, error) from error

    def __repr__(self) -> str:
        return f"LmdbStore({str(self.path)!r}, durability={self.durability!r})"

    @property
    def uri(self) -> str:
        """Return the URI ``open_store`` takes to open this store again."""
        return f"{path_uri(self.path)}?durability={self.durability}"

    # -- opening ---------------------------------------------------------

    def _check_files(self, trust_directory: bool) -> None:
        """Refuse a directory others could write to, and planted links."""
        _check_store_files(self.path, self._file_mode, trust_directory)

    @staticmethod
    def _probe(path: Path, verify: bool = False) -> None:
        """Refuse a path that is not ours before LMDB creates or writes a file there."""
        if not path.exists():
            return
        data = path / "data.mdb"
        if not data.exists():
            if any(entry != "lock.mdb" for entry in os.listdir(path)):
                raise IncompatibleStoreError(
                    f"{path} is not empty and holds no store",
                    hint="pick an empty or new directory",
                )
            return
        try:
            with open(data, "rb") as file:
                header = file.read(20)
        except OSError as error:
            raise _open_failure(path, error) from error
        if len(header) < 20 or int.from_bytes(header[16:20], "little") != _LMDB_MAGIC:
            raise IncompatibleStoreError(
                f"{data} is not an LMDB file", hint="pick an empty or new directory"
            )
        if _file_id(data) in _open_here:
            raise StoreError(
                f"cannot open {path}: it is already open in this process",
                hint="a process opens a store once: share the store object between services",
            )
        # What LMDB would map without checking: pages past the end of the
        # file are a SIGBUS, not an error.
        _check_meta(data)
        if verify:
            _verify_file(data)
        if _in_use(path / "lock.mdb"):
            # Another process has the store open, so it is an LMDB store in
            # use: an unregistered read here could meet pages a writer is
            # recycling (and trip LMDB's own assertions). The format is
            # checked by the opening transaction instead, which writes
            # nothing when it refuses.
            return
        # No process has the store open. Read what the file holds read-only
        # and without the lock file, so that opening a path that is not ours
        # changes no file at all. A process may open it meanwhile: a refusal
        # is only trusted when a second and third read agree.
        for attempt in range(3):
            try:
                LmdbStore._read_format(path)
                return
            except (IncompatibleStoreError, lmdb.Error):
                if attempt == 2:
                    raise

    @staticmethod
    def _read_format(path: Path) -> None:
        try:
            env = _open_adopting(str(path), readonly=True, lock=False, max_dbs=len(_DB_NAMES) + 2)
        except lmdb.InvalidError as error:
            raise IncompatibleStoreError(
                f"{path} does not hold an LMDB store", hint="pick an empty directory"
            ) from error
        except (lmdb.Error, OSError) as error:
            raise _open_failure(path, error) from error
        try:
            txn = _begin_adopting(env)
            try:
                names = [key for key, _ in txn.cursor()]
                if names and b"meta" not in names:
                    raise IncompatibleStoreError(
                        f"{path} holds another LMDB database",
                        hint="pick an empty or new directory",
                    )
                if names:
                    meta = env.open_db(b"meta", txn=txn, create=False)
                    _check_format(path, txn.get(_FORMAT_KEY, db=meta))
            finally:
                txn.abort()
        except lmdb.Error as error:
            raise _lmdb_failure(f"reading {path}", error) from error
        finally:
            env.close()

    def _open_databases(self) -> dict[bytes, Any]:
        env = self._env
        try:
            with self._writer_lock, self._gate:
                # Through _begin: another process may be growing the map.
                txn = self._begin(write=True)
                self._writer_lock.learn()
                try:
                    if txn.cursor().first():
                        # Opening existing handles changes nothing on disk.
                        meta = env.open_db(b"meta", txn=txn, create=False)
                        self.format = _check_format(self.path, txn.get(_FORMAT_KEY, db=meta))
                        dbs = {
                            name: env.open_db(name, txn=txn, create=False)
                            for name in _db_names(self.format)
                        }
                    else:
                        self.format = FORMAT_VERSION
                        dbs = {name: env.open_db(name, txn=txn) for name in _db_names(self.format)}
                        header = {"magic": MAGIC, "format": FORMAT_VERSION}
                        meta = dbs[b"meta"]
                        txn.put(_FORMAT_KEY, bytes([FORMAT_VERSION]) + pack(header), db=meta)
                        txn.put(_NUMBER_KEY, _U64.pack(1), db=meta)
                except BaseException:
                    txn.abort()
                    raise
                txn.commit()
        except lmdb.NotFoundError as error:
            raise IncompatibleStoreError(
                f"{self.path} holds another LMDB database", hint="pick another path"
            ) from error
        except lmdb.Error as error:
            raise _lmdb_failure(f"opening {self.path}", error) from error
        return dbs

    # -- transactions ----------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"the store at {self.path} is closed", hint="open it again")
        if self._pid != _process_pid:
            raise _forked_error(self.path)

    def _begin(self, write: bool = False, parent: Any = None) -> Any:
        """Begin a transaction, adopting a map another process has grown.

        A full reader table is checked for slots of dead processes once.
        """
        if self._released:
            # A call that passed the open check as the store closed.
            raise StoreClosedError(f"the store at {self.path} is closed", hint="open it again")
        checked_readers = False
        while True:
            try:
                return self._env.begin(write=write, parent=parent)
            except lmdb.MapResizedError:
                self._adopt_map_size()
                if self._released:
                    raise StoreClosedError(
                        f"the store at {self.path} is closed", hint="open it again"
                    ) from None
            except lmdb.ReadersFullError:
                cleared = 0 if checked_readers else self._env.reader_check()
                if not cleared:
                    raise
                _log.info("cleared %d reader slots of dead processes in %s", cleared, self.path)
                checked_readers = True

    def _adopt_map_size(self) -> None:
        # The gate is held by the caller: leave it while the map is swapped.
        self._gate.__exit__()
        try:
            self._gate.exclusive(self._adopt_if_open)
        finally:
            self._gate.__enter__()

    def _adopt_if_open(self) -> None:
        if self._released:
            return
        seen = self._map_size
        try:
            self._env.set_mapsize(0)
        except (lmdb.Error, OverflowError) as error:
            _log.error("adopting the map another process grew for %s failed: %s", self.path, error)
            # LMDB dropped the map: map the file again, if the OS allows it.
            self._reopen(self._map_size)
            raise StoreError(
                f"adopting the map another process grew for {self.path} failed: {error}",
                hint="the OS refused the address space (ulimit -v, overcommit settings)",
            ) from error
        self._map_size = self._env.info()["map_size"]
        _log.info("adopted the map grown for %s: %d -> %d bytes", self.path, seen, self._map_size)
        if self.writemap:
            try:
                # A process without a writable map grows the map, not the file.
                self._preallocate(self._map_size)
            except StoreError as error:
                # No room for it: map again without writing through the map.
                _log.info("writing %s without a writable map: %s", self.path, error)
                self._writemap_allowed = False
                self._reopen(self._map_size)

    def _grow(self, seen: int) -> None:
        """Double the map after a transaction that saw ``seen`` bytes of it ran out.

        Writers that ran out at once grow it once: the others find it grown.
        """

        def double() -> None:
            if self._released or self._map_size != seen:
                return  # closed (_begin says so), or grown by another writer
            if self.writemap:
                # Blocks first: the map never reaches past what is reserved.
                self._preallocate(seen * 2)
            try:
                self._env.set_mapsize(seen * 2)
            except (lmdb.Error, OverflowError) as error:
                # LMDB drops the map when the OS refuses a new one: map the
                # store again at the size it had.
                self._reopen(seen)
                raise StoreError(
                    f"growing the map of {self.path} to {seen * 2} bytes failed: {error}",
                    hint="the OS refused the address space (ulimit -v, overcommit settings); "
                    "the store stays usable at its current size",
                ) from error
            self._map_size = self._env.info()["map_size"]
            _log.info("grew the map of %s: %d -> %d bytes", self.path, seen, self._map_size)

        self._gate.exclusive(double)

    def _reopen(self, map_size: int) -> None:
        """Open the environment again after LMDB closed it; called with no transaction open."""
        with contextlib.suppress(lmdb.Error):
            self._env.close()
        try:
            self._env = self._open_env(map_size)
            self._map_size = self._env.info()["map_size"]
            # A write transaction: handles opened in a read one do not outlive it.
            with self._env.begin(write=True) as txn:
                self._dbs = {
                    name: self._env.open_db(name, txn=txn, create=False)
                    for name in _db_names(self.format)
                }
        except BaseException as error:
            # The store cannot be used again; say so to every later call.
            _log.error("mapping %s again failed: the store is closed", self.path, exc_info=error)
            self._released = self._closed = True
            if isinstance(error, lmdb.Error):
                raise _lmdb_failure(f"mapping {self.path} again", error) from error
            raise
        self._sessions = self._dbs[b"sessions"]
        self._shared = self._dbs[b"shared"]
        self._data = self._dbs[b"data"]
        self._listing = self._dbs.get(_LISTING)

    def _read(self, action: Callable[[Any], T]) -> T:
        self._check_open()
        try:
            with self._gate:
                txn = self._begin()
                try:
                    return action(txn)
                finally:
                    txn.abort()
        except lmdb.Error as error:
            raise _lmdb_failure("reading the store", error) from error

    def _write(self, action: Callable[[Any], T]) -> Completion[T]:
        """Run a write: queued for group commit, or inline without fsync.

        A deferred write from an event loop's thread runs inline only when
        nobody holds the write lock and nothing waits in the queue before
        it; otherwise it is queued: LMDB's write lock may be held by another
        thread or process for as long as it likes, and the loop must not
        wait for it (see ``WriterLock``).
        """
        self._check_open()
        try:
            in_loop = asyncio.get_running_loop() is not None
        except RuntimeError:  # no event loop runs in this thread
            in_loop = False
        if self._syncer is not None:
            outcome: tuple[bool, Any] | None = None
            if not in_loop:
                with self._writer_lock:
                    outcome = self._run_alone(action)
            elif not self._writes:
                with _locks.Attempt(self._writer_lock) as held:
                    if held:
                        try:
                            outcome = self._run_alone(action, may_grow=False)
                        except _MapMustGrow:
                            # Queued below: the writer thread grows the map,
                            # and preallocating the file may take a while.
                            outcome = None
            if outcome is not None:
                ok, value = outcome
                return Completion(value) if ok else Completion(error=value)
        pending: Pending[T] = Pending()
        with self._admit:
            # Checked with the append, so that nothing is queued after the
            # writer thread's last pass.
            self._check_open()
            if self._writer is None:
                self._start_writer()
            self._writes.append((action, pending))
        # A thread with no event loop may commit the queue itself (it would
        # only wait otherwise), saving two thread wake-ups; a thread running
        # an event loop leaves the disk wait to the writer thread. A leader
        # stops once its own write is done: what others queue meanwhile is
        # the writer thread's.
        if not in_loop:
            with _locks.Attempt(self._leader) as leading:
                if leading:
                    while not pending.done and self._commit_queued():
                        pass
            if leading and not self._writes:
                # Nothing is left for the writer thread. A write queued after
                # this check comes from a thread that could not lead, and that
                # thread wakes the writer itself.
                return Completion.waiting(pending)
        # What is left (an event loop's write, one queued while another thread
        # led, or what this leader left behind) is the writer thread's.
        with self._wake:
            self._wake.notify()
        return Completion.waiting(pending)

    def _run_alone(self, action: Callable[[Any], Any], may_grow: bool = True) -> tuple[bool, Any]:
        """Run one write as ``_run_writes`` does, on its compiled common path where it can.

        Called holding the writer lock.
        """
        return _hot.write_alone(self, action) or self._run_writes([action], may_grow)[0]

    def _run_writes(
        self, actions: list[Callable[[Any], Any]], may_grow: bool = True
    ) -> list[tuple[bool, Any]]:
        """Run writes in one transaction; if one fails, run each in its own.

        Called holding the writer lock. Without ``may_grow``, writes that
        need a larger map raise ``_MapMustGrow``: nothing was written, and
        the caller runs them again where the map may grow.

        One failing write would otherwise undo the others. Running each again
        alone costs a commit per write, but only in the rare batch where one
        fails, and it is cheaper on the common path than a nested transaction
        per write. Every write checks before it writes, so running it again
        after an abort is safe.
        """
        if _file_id(self._lock_name) != self._lock_id:
            # Another process could not see this one's readers and writer.
            _log.error("%s was removed or replaced: writes refused", self._lock_path)
            replaced = UnsafeStoreError(
                f"{self._lock_path} was removed or replaced while the store was open",
                hint="writing now could corrupt the store: close it in every process and "
                "open it again",
            )
            return [(False, replaced)] * len(actions)
        while True:
            try:
                with self._gate:
                    seen = self._map_size
                    txn = self._begin(write=True)
                    try:
                        # One write is the common case: no comprehension's frame for it.
                        if len(actions) == 1:
                            outcomes = [(True, actions[0](txn))]
                        else:
                            outcomes = [(True, action(txn)) for action in actions]
                    except BaseException:
                        txn.abort()
                        raise
                    # LMDB frees the transaction whether the commit succeeds or not.
                    txn.commit()
                self._dirty = True
                return outcomes
            except lmdb.MapFullError:
                if not may_grow:
                    raise _MapMustGrow from None
                try:
                    self._grow(seen)
                except StoreError as error:
                    _log.error("growing the map of %s failed: %s", self.path, error)
                    return [(False, error)] * len(actions)
            except Exception as error:  # the failing write's own outcome
                failure: Exception = error
                if isinstance(error, lmdb.Error):
                    failure = _lmdb_failure("writing to the store", error)
                if len(actions) == 1:
                    if failure is not error:  # the store failed, not the write's own checks
                        _log.error("writing to %s failed: %s", self.path, failure)
                    return [(False, failure)]
                _log.debug("a write of %d failed (%s): each runs alone", len(actions), error)
                return [self._run_writes([action])[0] for action in actions]

    def _write_loop(self) -> None:
        """Commit queued writes that no calling thread commits, until closed.

        On close, every write queued before it is still committed: the last
        pass waits for a calling thread that leads, then takes what it left.
        """
        while True:
            with self._wake:
                while not self._writes and not self._stopping:
                    self._wake.wait()
                stopping = self._stopping
            with self._leader:
                while self._commit_queued():
                    pass
            if stopping:
                return

    def _commit_queued(self) -> bool:
        """Commit the writes waiting in the queue (up to a batch) in one transaction.

        Return whether anything was committed. Called with ``_leader`` held, so
        one thread at a time commits.
        """
        batch: list[_Queued] = []
        writes = self._writes
        # Taken before the queue is emptied: a loop that finds the queue
        # empty and the lock free writes after everything queued before it.
        with self._writer_lock:
            while writes and len(batch) < _MAX_BATCH:
                batch.append(writes.popleft())
            if not batch:
                return False
            try:
                outcomes = self._run_writes([action for action, _ in batch])
            except BaseException as error:  # every waiter must hear of it
                _log.exception("committing %d writes to %s failed", len(batch), self.path)
                outcomes = [(False, error)] * len(batch)
        finish_all(
            (pending, ok, value) for (_, pending), (ok, value) in zip(batch, outcomes, strict=True)
        )
        return True

    def _sync_loop(self) -> None:
        """Sync deferred writes every interval, and at once when asked."""
        while True:
            with self._sync_cond:
                if not self._sync_waiters and not self._closed:
                    self._sync_cond.wait(self.flush_interval)
                waiters, self._sync_waiters = self._sync_waiters, []
                closing = self._closed
            error: BaseException | None = None
            if self._dirty or waiters:
                self._dirty = False
                try:
                    with self._gate:
                        self._env.sync(True)
                except lmdb.Error as failure:  # reported to flushers
                    error = _lmdb_failure("syncing the store", failure)
                except BaseException as failure:  # reported to flushers
                    error = failure
                if error is not None:
                    # A periodic sync has no flusher to tell.
                    _log.error("syncing %s failed", self.path, exc_info=error)
            finish_all((waiter, error is None, error) for waiter in waiters)
            if closing:
                return

    # -- records ---------------------------------------------------------

    def _record(
        self, txn: Any, app_name: str, user_id: str, session_id: str
    ) -> SessionRecord | None:
        return _hot.read_record(txn, self, app_name, user_id, session_id)

    def _put_record(self, txn: Any, record: SessionRecord) -> None:
        key = _part(record.app_name) + _part(record.user_id) + _part(record.session_id)
        txn.put(key, pack(record.to_list()), db=self._sessions)

    def _timed(self, record: SessionRecord) -> bool:
        """Return whether the store keeps a time index for the session.

        Format 1 keeps one for every session; format 2 only for sessions that
        received an event out of time order (the others' events are in time
        order, so their positions are the index).
        """
        return self.format == 1 or record.time_indexed

    def _start_time_index(self, txn: Any, record: SessionRecord) -> None:
        """Give a session going out of time order a time index of the events it stores."""
        number = _U64.pack(record.number)
        prefix = number + _EVENT
        cursor = txn.cursor(db=self._data)
        entries: list[tuple[bytes, bytes]] = []
        if cursor.set_range(prefix):
            for key, value in cursor.iternext():
                if not key.startswith(prefix):
                    break
                stamp = _sortable_time(_F64.unpack_from(value)[0])
                entries.append((number + _EVENT_TIME + stamp + key[9:17], b""))
        if entries:
            txn.cursor(db=self._data).putmulti(entries)
        record.time_indexed = True

    def _relist(self, txn: Any, record: SessionRecord, old_time: float | None) -> None:
        """Move a session's list index entry to its last update time (None: a new session)."""
        if self._listing is None:
            return
        key = _list_key(record)
        if old_time is not None:
            app = _part(record.app_name)
            old = app + _sortable_time(old_time) + key[-8:]
            if old == key:
                return
            txn.delete(old, db=self._listing)
        ids = (record.app_name, record.user_id, record.session_id)
        txn.put(key, b"".join(_part(text) for text in ids), db=self._listing)

    def _unlist(self, txn: Any, record: SessionRecord) -> None:
        """Remove a session's list index entry."""
        if self._listing is not None:
            txn.delete(_list_key(record), db=self._listing)

    def _put_items(self, txn: Any, handle: Any, owner: bytes, items: Items) -> None:
        for key, value in _item_entries(owner, items):
            txn.put(key, value, db=handle)

    def _read_map(self, txn: Any, handle: Any, owner: bytes) -> dict[str, Any]:
        result: dict[str, Any] = {}
        cursor = txn.cursor(db=handle)
        if not cursor.set_range(owner):
            return result
        start = len(owner)
        for key, value in cursor.iternext():
            if not key.startswith(owner):
                break
            if key[start : start + 2] == _DIGEST_MARK:
                name, value = decode_stored(value, "a state entry")
                result[name] = decode_stored(value, f"state value {name!r}")
            else:
                try:
                    name = key[start + 2 :].decode()
                except UnicodeDecodeError as error:
                    raise CorruptStoreError(f"a state key is unreadable ({error})") from error
                result[name] = decode_stored(value, f"state value {name!r}")
        return result

    def _events(self, txn: Any, number: bytes, start: int, stop: int) -> list[bytes]:
        """Return the records of events ``start`` to ``stop`` (exclusive)."""
        if start >= stop:
            return []
        cursor = txn.cursor(db=self._data)
        # Bounded by key, not by count: a truncation leaves gaps in positions.
        if not cursor.set_range(number + _EVENT + _U64.pack(start)):
            return []
        end = number + _EVENT + _U64.pack(stop)
        events: list[bytes] = []
        for key, value in cursor.iternext():
            if key >= end:
                break
            events.append(value[8:])
        return events

    def _last_events(self, txn: Any, number: bytes, n: int) -> list[bytes]:
        """Return the last ``n`` stored values (timestamp + record) of a session, in order."""
        cursor = txn.cursor(db=self._data)
        prefix = number + _EVENT
        # The first key after the session's events, then back.
        after = _after(prefix) or prefix
        positioned = cursor.prev() if cursor.set_range(after) else cursor.last()
        values: list[bytes] = []
        while positioned and len(values) < n and cursor.key().startswith(prefix):
            values.append(cursor.value())
            positioned = cursor.prev()
        values.reverse()
        return values

    def _events_after(
        self,
        txn: Any,
        number: bytes,
        count: int,
        num_recent: int | None,
        after: float,
        timed: bool,
    ) -> list[bytes]:
        cursor = txn.cursor(db=self._data)
        if num_recent is not None:
            # The last n first, then the filter: a timestamp leads each value.
            start = max(0, count - num_recent)
            if start >= count or not cursor.set_key(number + _EVENT + _U64.pack(start)):
                return []
            values = islice(cursor.iternext(keys=False), count - start)
            return [v[8:] for v in values if _F64.unpack_from(v)[0] >= after]
        if not timed:
            return self._events_from_time(cursor, number, count, after)
        # Only the index entries at or after the time are read.
        prefix = number + _EVENT_TIME
        seqs: list[bytes] = []
        if cursor.set_range(prefix + _sortable_time(after)):
            for key in cursor.iternext(values=False):
                if not key.startswith(prefix):
                    break
                seqs.append(key[17:25])
        seqs.sort()
        event = number + _EVENT
        return [cursor.get(event + seq)[8:] for seq in seqs]

    @staticmethod
    def _events_from_time(cursor: Any, number: bytes, count: int, after: float) -> list[bytes]:
        """Return the events at or after ``after`` of a session whose events are in time order.

        A binary search over positions (with gaps after a truncation) finds
        the first such event in about log2(count) seeks; the rest follow it.
        """
        prefix = number + _EVENT
        low, high = 0, count
        # Invariant: stored events before ``low`` are earlier than ``after``,
        # stored events from ``high`` on are not.
        while low < high:
            middle = (low + high) // 2
            if not cursor.set_range(prefix + _U64.pack(middle)) or not cursor.key().startswith(
                prefix
            ):
                high = middle
                continue
            if _F64.unpack_from(cursor.value())[0] < after:
                low = _U64.unpack(cursor.key()[9:17])[0] + 1
            else:
                high = middle
        if not cursor.set_range(prefix + _U64.pack(low)):
            return []
        values: list[bytes] = []
        for key, value in cursor.iternext():
            if not key.startswith(prefix):
                break
            values.append(value[8:])
        return values

    # -- the Store protocol ----------------------------------------------

    def create_session(
        self,
        app_name: str,
        user_id: str,
        session_id: str,
        create_time: float,
        app_items: Items,
        user_items: Items,
        session_items: Items,
    ) -> Completion[LoadedSession]:
        """Store a new session and return it with the shared maps merged in.

        AlreadyExistsError if the id is taken.
        """

        def create(txn: Any) -> LoadedSession:
            if self._record(txn, app_name, user_id, session_id) is not None:
                raise AlreadyExistsError(f"session {session_id!r} already exists")
            meta = self._dbs[b"meta"]
            (number,) = _U64.unpack(txn.get(_NUMBER_KEY, db=meta))
            txn.put(_NUMBER_KEY, _U64.pack(number + 1), db=meta)
            record = SessionRecord(app_name, user_id, session_id, number, create_time, create_time)
            self._put_record(txn, record)
            self._relist(txn, record, None)
            self._put_items(txn, self._data, _U64.pack(number) + _STATE, session_items)
            self._put_items(txn, self._shared, _APP + _part(app_name), app_items)
            self._put_items(txn, self._shared, _USER + _part(app_name) + _part(user_id), user_items)
            return self._loaded(txn, record, [])

        return self._write(create)

    def load_session(
        self,
        app_name: str,
        user_id: str,
        session_id: str,
        num_recent_events: int | None,
        after_timestamp: float | None,
    ) -> LoadedSession | None:
        """Read a session with the events the filters select, in append order."""

        def load(txn: Any) -> LoadedSession | None:
            record = self._record(txn, app_name, user_id, session_id)
            if record is None:
                return None
            number = _U64.pack(record.number)
            count = record.event_count
            if record.removed_count and num_recent_events is not None:
                # Positions have gaps after a truncation: count back from the end.
                recent = self._last_events(txn, number, num_recent_events)
                low = -math.inf if after_timestamp is None else after_timestamp
                events = [v[8:] for v in recent if _F64.unpack_from(v)[0] >= low]
            elif after_timestamp is not None:
                events = self._events_after(
                    txn, number, count, num_recent_events, after_timestamp, self._timed(record)
                )
            elif num_recent_events is not None:
                events = self._events(txn, number, max(0, count - num_recent_events), count)
            else:
                events = self._events(txn, number, 0, count)
            return self._loaded(txn, record, events)

        return self._read(load)

    def read_events(
        self, app_name: str, user_id: str, session_id: str, start: int, limit: int
    ) -> EventPage | None:
        """Return a session's record and up to ``limit`` stored events from position ``start``.

        Each event comes with its position (positions count every event ever
        appended; a truncation leaves gaps). Reading a long session page by
        page, from the last position read plus one, keeps memory bounded:
        what the command line's export, stats and verify do. None if the
        session does not exist.
        """

        def read(txn: Any) -> EventPage | None:
            record = self._record(txn, app_name, user_id, session_id)
            if record is None:
                return None
            prefix = _U64.pack(record.number) + _EVENT
            events: list[tuple[int, bytes]] = []
            cursor = txn.cursor(db=self._data)
            if limit <= 0 or not cursor.set_range(prefix + _U64.pack(max(0, start))):
                return record, events
            for key, value in cursor.iternext():
                if not key.startswith(prefix) or len(events) >= limit:
                    break
                events.append((_U64.unpack(key[9:17])[0], value[8:]))
            return record, events

        return self._read(read)

    def _loaded(self, txn: Any, record: SessionRecord, events: list[bytes]) -> LoadedSession:
        app = _part(record.app_name)
        return LoadedSession(
            record,
            self._read_map(txn, self._data, _U64.pack(record.number) + _STATE),
            self._read_map(txn, self._shared, _APP + app),
            self._read_map(txn, self._shared, _USER + app + _part(record.user_id)),
            events,
        )

    def list_sessions(self, app_name: str, user_id: str | None) -> list[SessionRecord]:
        """Return the records of an app's (or one user's) sessions, in key order."""
        prefix = _part(app_name) + (_part(user_id) if user_id is not None else b"")

        def scan(txn: Any) -> list[SessionRecord]:
            cursor = txn.cursor(db=self._sessions)
            records: list[SessionRecord] = []
            if not cursor.set_range(prefix):
                return records
            add, record_of = records.append, SessionRecord
            # One record per session of the app: the loop is the whole listing's cost.
            for key, value in cursor.iternext():
                if not key.startswith(prefix):
                    break
                add(record_of(*unpack(value)))
            return records

        return self._read(scan)

    def list_page(
        self,
        app_name: str,
        user_id: str | None,
        limit: int | None,
        after: ListPosition | None,
    ) -> tuple[list[SessionRecord], bool]:
        """Return one page of sessions in listing order; see ``Store.list_page``.

        With the list index (format 2) a page of an app reads its own
        entries only, from ``after``'s time on: one index entry and one
        record per session, plus every session that shares a time with the
        page's last (a run of equal times is sorted by ids). One user's
        sessions, a whole listing, and stores of format 1 are read whole
        and sorted.
        """
        listing = self._listing
        if listing is None or user_id is not None or limit is None:
            return page_records(self.list_sessions(app_name, user_id), limit, after)
        app = _part(app_name)
        width = len(app) + 16

        def runs(cursor: Any) -> Iterator[list[bytes]]:
            """Yield the session keys of the app's entries, one list per run of equal times."""
            run: list[bytes] = []
            stamp = b""
            for key, value in cursor.iternext():
                if len(key) != width or not key.startswith(app):
                    break
                this = key[len(app) : len(app) + 8]
                if this != stamp and run:
                    yield run
                    run = []
                stamp = this
                run.append(value)
            if run:
                yield run

        def read(txn: Any) -> tuple[list[SessionRecord], bool]:
            cursor = txn.cursor(db=listing)
            start = app if after is None else app + _sortable_time(after[0])
            page: list[SessionRecord] = []
            if not cursor.set_range(start):
                return page, False
            for run in runs(cursor):
                records = []
                for key in run:
                    value = txn.get(key, db=self._sessions)
                    if value is None:
                        raise CorruptStoreError(
                            f"the list index of app {app_name!r} names a session that is gone",
                            hint="run 'sessionscope verify' on the store",
                        )
                    records.append(_record_from(value))
                records.sort(key=list_position)
                if after is not None:
                    records = [r for r in records if list_position(r) > after]
                page.extend(records)
                if len(page) > limit:
                    break
            return page[:limit], len(page) > limit

        return self._read(read)

    def delete_session(self, app_name: str, user_id: str, session_id: str) -> Completion[None]:
        """Remove a session with its state and events; a missing one is a no-op."""

        def delete(txn: Any) -> None:
            record = self._record(txn, app_name, user_id, session_id)
            if record is None:
                return
            key = _part(app_name) + _part(user_id) + _part(session_id)
            txn.delete(key, db=self._sessions)
            self._unlist(txn, record)
            prefix = _U64.pack(record.number)
            cursor = txn.cursor(db=self._data)
            if cursor.set_range(prefix):
                # delete() moves the cursor to the next entry, or past the end.
                while cursor.key().startswith(prefix) and cursor.delete():
                    pass

        return self._write(delete)

    def _append(self, txn: Any, request: AppendRequest) -> AppendResult:
        """Append one event: check, write its entries, update the session record."""
        return _hot.append_one(self, txn, request)

    def append(self, request: AppendRequest) -> Completion[AppendResult]:
        """Append one event and apply its packed delta, all or nothing."""
        return self._write(lambda txn: self._append(txn, request))

    def append_many(self, batch: AppendBatch) -> Completion[BatchResult]:
        """Append a batch in one transaction; on an error, commit those before it.

        Each session record is read once and written once per batch, and the
        batch's entries go to each database in one ``putmulti`` call rather
        than a Python call per entry.
        """

        def append_all(txn: Any) -> BatchResult:
            return _hot.append_batch(self, txn, batch)

        try:
            return Completion.done(self._write(append_all).result())
        except PartialBatch as partial:
            # The transaction was aborted: append again what came before the error.
            if partial.applied:
                done = self.append_many(batch.head(partial.applied)).result()
            else:
                done = result_of_batch(batch, [], None)
            done.error = partial.error
            return Completion.done(done)

    def read_app_state(self, app_name: str) -> dict[str, Any]:
        """Return the app map, keys without prefix."""
        return self._read(lambda txn: self._read_map(txn, self._shared, _APP + _part(app_name)))

    def read_user_state(self, app_name: str, user_id: str) -> dict[str, Any]:
        """Return the user map, keys without prefix."""
        owner = _USER + _part(app_name) + _part(user_id)
        return self._read(lambda txn: self._read_map(txn, self._shared, owner))

    # -- retention and copies --------------------------------------------
    #
    # Removing a session deletes its record and queues its number in meta
    # (b"purge" number); its state and events, all under that number, are
    # then deleted in later bounded batches. A session whose record is gone
    # is gone for every reader at once, and a purge cut short by a crash is
    # finished by the next retention call of any process.

    def truncate_events(
        self,
        app_name: str,
        user_id: str,
        session_id: str,
        before: float | None,
        keep_last: int | None,
    ) -> Completion[int]:
        """Remove events with ``timestamp < before``, or all but the last ``keep_last``.

        Oldest positions (or earliest times) go first, in bounded batches;
        each batch moves the session's marker.
        """

        # The session the first batch found: one deleted and created again
        # under the same id meanwhile is another session, left alone.
        first: list[int] = []

        def batch(txn: Any) -> tuple[int, bool]:
            record = self._record(txn, app_name, user_id, session_id)
            if record is None or (first and record.number != first[0]):
                raise SessionNotFoundError(
                    f"session {session_id!r} of user {user_id!r} in app {app_name!r} does not exist"
                )
            if not first:
                first.append(record.number)
            number = _U64.pack(record.number)
            timed = self._timed(record)
            started = time.monotonic()
            cursor = txn.cursor(db=self._data)
            doomed: list[tuple[bytes, float]] = []  # (seq, timestamp)
            if keep_last is not None:
                wanted = min(record.stored_count - keep_last, BATCH_EVENTS)
                prefix = number + _EVENT
                if wanted > 0 and cursor.set_range(prefix):
                    for key, value in cursor.iternext():
                        if not key.startswith(prefix) or len(doomed) >= wanted:
                            break
                        doomed.append((key[9:], _F64.unpack_from(value)[0]))
                        if time.monotonic() - started > BATCH_SECONDS:
                            break
            elif not timed:
                # Events in time order: the earliest are the first positions.
                prefix = number + _EVENT
                if cursor.set_range(prefix):
                    for key, value in cursor.iternext():
                        if not key.startswith(prefix) or len(doomed) >= BATCH_EVENTS:
                            break
                        if _F64.unpack_from(value)[0] >= before:
                            break
                        doomed.append((key[9:], 0.0))
                        if time.monotonic() - started > BATCH_SECONDS:
                            break
            else:
                prefix = number + _EVENT_TIME
                end = prefix + _sortable_time(before)  # type: ignore[arg-type]
                if cursor.set_range(prefix):
                    for key in cursor.iternext(values=False):
                        if key >= end or len(doomed) >= BATCH_EVENTS:
                            break
                        doomed.append((key[17:25], 0.0))
                        if time.monotonic() - started > BATCH_SECONDS:
                            break
            if not doomed:
                return 0, True
            data = self._data
            removed = 0
            # Deleting costs more than finding: the time bound applies here too.
            for seq, _ in doomed:
                value = txn.get(number + _EVENT + seq, db=data)
                timestamp = _F64.unpack_from(value)[0]
                event_id = event_copy(value[8:], timestamp).event_id
                txn.delete(number + _EVENT + seq, db=data)
                if timed:
                    txn.delete(number + _EVENT_TIME + _sortable_time(timestamp) + seq, db=data)
                txn.delete(number + _EVENT_ID + _unique_part(event_id), db=data)
                removed += 1
                if time.monotonic() - started > BATCH_SECONDS:
                    break
            record.removed_count += removed
            self._put_record(txn, record)
            return removed, False

        total = 0
        try:
            while True:
                removed, finished = self._write(batch).result()
                total += removed
                if finished:
                    return Completion.done(total)
        except SessionNotFoundError as error:
            # Deleted between two batches: what was removed stays removed.
            return Completion.done(total) if total else Completion.failed(error)

    def expire_sessions(self, app_name: str | None, idle_before: float) -> Completion[int]:
        """Delete the sessions whose last update is before ``idle_before``, in batches."""
        prefix = b"" if app_name is None else _part(app_name)
        return Completion.done(self._remove_sessions(prefix, idle_before))

    def delete_user(self, app_name: str, user_id: str) -> Completion[int]:
        """Delete every session of a user, then the user's state map."""
        app = _part(app_name)
        removed = self._remove_sessions(app + _part(user_id), None)
        self._remove_range(self._shared, _USER + app + _part(user_id))
        return Completion.done(removed)

    def delete_app(self, app_name: str) -> Completion[int]:
        """Delete every session of an app, then its user maps and its app map."""
        app = _part(app_name)
        removed = self._remove_sessions(app, None)
        self._remove_range(self._shared, _USER + app)
        self._remove_range(self._shared, _APP + app)
        return Completion.done(removed)

    def _remove_sessions(self, prefix: bytes, idle_before: float | None) -> int:
        """Remove the sessions under a key prefix (idle ones only, with a cutoff).

        Each batch re-reads every record it removes inside its own
        transaction: a session appended to after the scan began is judged on
        its new time. Return how many went.
        """

        def batch(txn: Any, *, resume: bytes) -> tuple[int, bytes | None]:
            started = time.monotonic()
            cursor = txn.cursor(db=self._sessions)
            meta = self._dbs[b"meta"]
            removed = 0
            positioned = cursor.set_range(resume)
            while positioned:
                key = cursor.key()
                if not key.startswith(prefix):
                    break
                if removed >= BATCH_SESSIONS or time.monotonic() - started > BATCH_SECONDS:
                    return removed, key
                record = _record_from(cursor.value())
                if idle_before is None or record.last_update_time < idle_before:
                    txn.put(_PURGE + _U64.pack(record.number), b"", db=meta)
                    self._unlist(txn, record)
                    # delete() moves to the next entry; past the last, key() is empty.
                    positioned = cursor.delete() and bool(cursor.key())
                    removed += 1
                else:
                    positioned = cursor.next()
            return removed, None

        total = 0
        resume: bytes | None = prefix
        while resume is not None and not self._stopping_expiry():
            removed, resume = self._write(partial(batch, resume=resume)).result()
            total += removed
            self._purge()
        self._purge()
        return total

    def _purge(self) -> None:
        """Delete the state and events of removed sessions, in bounded batches."""
        meta = self._dbs[b"meta"]

        def batch(txn: Any) -> bool:
            started = time.monotonic()
            queue = txn.cursor(db=meta)
            cursor = txn.cursor(db=self._data)
            deleted = 0
            while queue.set_range(_PURGE) and queue.key().startswith(_PURGE):
                number = queue.key()[len(_PURGE) :]
                if cursor.set_range(number):
                    while cursor.key().startswith(number):
                        if deleted >= BATCH_EVENTS or time.monotonic() - started > BATCH_SECONDS:
                            return False
                        cursor.delete()
                        deleted += 1
                txn.delete(_PURGE + number, db=meta)
            return True

        # A close stops the expirer between batches; the next call finishes the purge.
        while not self._write(batch).result() and not self._stopping_expiry():
            pass

    def _remove_range(self, handle: Any, prefix: bytes) -> None:
        """Delete every entry under a key prefix, in bounded batches."""

        def batch(txn: Any) -> bool:
            started = time.monotonic()
            cursor = txn.cursor(db=handle)
            deleted = 0
            if cursor.set_range(prefix):
                while cursor.key().startswith(prefix):
                    if deleted >= BATCH_EVENTS or time.monotonic() - started > BATCH_SECONDS:
                        return False
                    cursor.delete()
                    deleted += 1
            return True

        while not self._write(batch).result():
            pass

    def _stopping_expiry(self) -> bool:
        return self._expirer is not None and self._expirer.stopping

    def list_apps(self) -> list[str]:
        """Return the apps that have a session, app state or user state, sorted.

        An app whose id is over 150 bytes is keyed by a digest: it is listed
        through its sessions, not through its state alone.
        """

        def scan(txn: Any) -> list[str]:
            names = {record.app_name for record in self._first_records(txn, b"", 1)}
            for tag in (_APP, _USER):
                names.update(_raw_names(txn.cursor(db=self._shared), tag, 1))
            return sorted(names)

        return self._read(scan)

    def list_users(self, app_name: str) -> list[str]:
        """Return the users of an app that have a session or user state, sorted.

        A user whose id is over 150 bytes is listed through its sessions only.
        """
        app = _part(app_name)

        def scan(txn: Any) -> list[str]:
            names = {record.user_id for record in self._first_records(txn, app, 2)}
            names.update(_raw_names(txn.cursor(db=self._shared), _USER + app, 1))
            return sorted(names)

        return self._read(scan)

    def _first_records(self, txn: Any, prefix: bytes, depth: int) -> Iterator[SessionRecord]:
        """Yield one session record per distinct id ``depth`` parts deep under ``prefix``."""
        cursor = txn.cursor(db=self._sessions)
        positioned = cursor.set_range(prefix)
        while positioned and cursor.key().startswith(prefix):
            key = cursor.key()
            yield _record_from(cursor.value())
            positioned = cursor.set_range(_after(key[: _parts_length(key, depth)]))

    def restore_session(self, copy: SessionCopy) -> Completion[bool]:
        """Write a whole session as given, in one transaction; False when already equal."""
        check_copy(copy)
        entries = [
            (
                _U64.pack(seq),
                _F64.pack(event.timestamp) + event.record,
                _unique_part(event.event_id),
                _sortable_time(event.timestamp),
            )
            for seq, event in enumerate(copy.events)
        ]

        def restore(txn: Any) -> bool:
            found = self._record(txn, copy.app_name, copy.user_id, copy.session_id)
            if found is not None:
                if copies_equal(self._session_copy(txn, found), copy):
                    return False
                raise AlreadyExistsError(
                    f"session {copy.session_id!r} already exists with other content"
                )
            meta = self._dbs[b"meta"]
            (number,) = _U64.unpack(txn.get(_NUMBER_KEY, db=meta))
            txn.put(_NUMBER_KEY, _U64.pack(number + 1), db=meta)
            last = copy.events[-1].event_id if copy.events else None
            stamps = [event.timestamp for event in copy.events]
            # In time order, and no later than the record's time: no time index (format 2).
            ordered = all(a <= b for a, b in pairwise(stamps)) and (
                not stamps or stamps[-1] <= copy.last_update_time
            )
            record = SessionRecord(
                copy.app_name,
                copy.user_id,
                copy.session_id,
                number,
                copy.create_time,
                copy.last_update_time,
                len(copy.events),
                last,
                time_indexed=self.format > 1 and not ordered,
            )
            timed = self._timed(record)
            self._put_record(txn, record)
            self._relist(txn, record, None)
            owner = _U64.pack(number)
            self._put_items(txn, self._data, owner + _STATE, copy.session_items)
            puts: list[tuple[bytes, bytes]] = []
            for seq, value, id_part, stamp in entries:
                puts.append((owner + _EVENT + seq, value))
                puts.append((owner + _EVENT_ID + id_part, seq))
                if timed:
                    puts.append((owner + _EVENT_TIME + stamp + seq, b""))
            if puts:
                txn.cursor(db=self._data).putmulti(puts)
            return True

        return self._write(restore)

    def _session_copy(self, txn: Any, record: SessionRecord) -> SessionCopy:
        """Return what the store holds of a session, as a copy."""
        number = _U64.pack(record.number)
        cursor = txn.cursor(db=self._data)
        events: list[EventCopy] = []
        prefix = number + _EVENT
        if cursor.set_range(prefix):
            for key, value in cursor.iternext():
                if not key.startswith(prefix):
                    break
                events.append(event_copy(value[8:], _F64.unpack_from(value)[0]))
        state = _item_entries_of(self._read_map(txn, self._data, number + _STATE))
        return SessionCopy.of_record(record, state, events)

    def write_app_state(self, app_name: str, items: Items) -> Completion[None]:
        """Set keys of the app map, leaving other keys as they are."""
        owner = _APP + _part(app_name)
        return self._write(lambda txn: self._put_items(txn, self._shared, owner, items))

    def write_user_state(self, app_name: str, user_id: str, items: Items) -> Completion[None]:
        """Set keys of a user map, leaving other keys as they are."""
        owner = _USER + _part(app_name) + _part(user_id)
        return self._write(lambda txn: self._put_items(txn, self._shared, owner, items))

    def flush(self) -> Completion[None]:
        """Make every acknowledged write durable."""
        self._check_open()
        if self._syncer is None:
            return Completion.done(None)
        pending: Pending[None] = Pending()
        with self._sync_cond:
            # Checked under the lock the syncer's last pass takes, so that
            # no flush waits behind it.
            self._check_open()
            self._sync_waiters.append(pending)
            self._sync_cond.notify()
        return Completion.waiting(pending)

    def close(self) -> None:
        """Flush, stop the background threads and release the environment.

        In a child process that inherited the store through fork(), only
        mark it closed: the environment and the threads belong to the parent.
        """
        if self._closed:
            return
        _deferred_open.discard(self)
        if self._pid != _process_pid:
            self._closed = True
            return
        if self._expirer is not None:
            self._expirer.stop()
        # Closed first, so that nothing is queued after the writer's last pass...
        with self._admit:
            self._closed = True
            writer = self._writer
        if writer is not None:
            with self._wake:
                self._stopping = True
                self._wake.notify()
            writer.join()
            # ...and should one be left all the same, it is told so, not left waiting.
            with self._leader:
                left = list(self._writes)
                self._writes.clear()
            closed = StoreClosedError(f"the store at {self.path} was closed", hint="open it again")
            finish_all((pending, False, closed) for _, pending in left)
        if self._syncer is not None:
            with self._sync_cond:
                self._sync_cond.notify()
            self._syncer.join()
        # Wait for running transactions, and turn away the ones still to begin.
        self._gate.exclusive(self._release)
        # After LMDB: closing the lock file drops this process's locks on it.
        self._writer_lock.close()

    def _sync_at_exit(self) -> None:
        """Sync a deferred store left open when the interpreter exits; log a failure.

        Runs in the exiting thread rather than through the syncer, which is
        a daemon thread: nothing at exit should wait on another thread.
        """
        if self._closed or self._pid != _process_pid:
            return
        try:
            with self._gate:
                if self._released:
                    return
                self._env.sync(True)
        except Exception:  # an exit handler must not raise: the others still run
            _log.exception("syncing the deferred store at %s at exit failed", self.path)
            return
        _log.debug("synced the deferred store at %s at exit", self.path)

    def _release(self) -> None:
        self._released = True
        _open_here.discard(self._data_id)
        if self._syncer is not None:
            self._env.sync(True)
        self._env.close()

    def verify(self) -> None:
        """Check every page of the store's data file; raise CorruptStoreError if one is wrong.

        The check reads the file, never through LMDB, while holding the
        store's write lock, so that no process commits while it reads: other
        writers wait for it (2.5 s for a 1 GB store, measured).
        """
        self._check_open()
        try:
            with self._writer_lock, self._gate:
                txn = self._begin(write=True)
                try:
                    _verify_file(self.path / "data.mdb")
                finally:
                    txn.abort()
        except lmdb.Error as error:
            raise _lmdb_failure(f"verifying {self.path}", error) from error

    def stat(self) -> dict[str, Any]:
        """Return LMDB's figures: map size, pages used, last transaction, entries per database."""

        def gather(txn: Any) -> dict[str, Any]:
            info = self._env.info()
            return {
                "map_size": info["map_size"],
                "last_pgno": info["last_pgno"],
                "last_txnid": info["last_txnid"],
                "entries": {
                    name.decode(): txn.stat(handle)["entries"] for name, handle in self._dbs.items()
                },
            }

        return self._read(gather)

    # -- operations: listing, checking, measuring and copying -------------
    #
    # What the command line needs beyond the Store protocol. None of it is on
    # the path of a session call; each reads in one transaction.

    def check_layout(self, progress: Callable[[int, int], None] | None = None) -> list[str]:
        """Return the problems of the key layout; an empty list when it is sound.

        Every session record sits under the key of its own ids and has a
        number of its own below the counter; every event entry belongs to a
        record and lies below its count, and the number of them is the
        record's; every event has an id index entry and (where the session
        keeps a time index) a time index entry pointing back at it, and every
        index entry points at an event that has that id or time; a session
        without a time index has its events in time order; no data lies
        under a number without a record; in format 2, every session has one
        list index entry, at its app, last update time and number, naming
        its key, and no other entry is there. ``progress(done, total)`` is
        called as records are checked.
        """

        def check(txn: Any) -> list[str]:
            # Memory stays bounded however large the store: one record and
            # one data entry at a time, point lookups for the index entries,
            # and the sorted numbers of the records (8 bytes a session).
            problems: list[str] = []
            meta = self._dbs[b"meta"]
            (next_number,) = _U64.unpack(txn.get(_NUMBER_KEY, db=meta))
            # Numbers queued for purging lost their record on purpose.
            purging: set[bytes] = set()
            queue = txn.cursor(db=meta)
            if queue.set_range(_PURGE):
                for key in queue.iternext(values=False):
                    if not key.startswith(_PURGE):
                        break
                    purging.add(key[len(_PURGE) :])
            total = txn.stat(self._sessions)["entries"]
            numbers = array("Q")
            data = txn.cursor(db=self._data)
            lookup = txn.cursor(db=self._data)
            for done, (key, value) in enumerate(txn.cursor(db=self._sessions), start=1):
                record = SessionRecord.from_list(unpack(value))
                label = _label(record)
                ids = (record.app_name, record.user_id, record.session_id)
                if key != b"".join(_part(text) for text in ids):
                    problems.append(f"{label}: its record is stored under another session's key")
                if record.number >= next_number:
                    problems.append(f"{label}: number {record.number} is not below the counter")
                numbers.append(record.number)
                if (
                    self._listing is not None
                    and txn.get(_list_key(record), db=self._listing) != key
                ):
                    problems.append(f"{label}: missing from the list index")
                number = _U64.pack(record.number)
                if number not in purging:
                    self._check_group(data, lookup, number, record, problems, self.format)
                if progress is not None:
                    progress(done, total)
            numbers = array("Q", sorted(numbers))
            for previous, following in pairwise(numbers):
                if previous == following:
                    problems.append(f"number {following} is shared by two session records")
            if self._listing is not None:
                self._check_listing(txn, problems)
            self._check_orphans(data, numbers, purging, problems)
            if progress is not None:
                progress(total, total)
            return problems

        return self._read(check)

    def _check_listing(self, txn: Any, problems: list[str]) -> None:
        """Check that every list index entry names a record listed at that entry."""
        for key, value in txn.cursor(db=self._listing):
            stored = txn.get(value, db=self._sessions)
            if stored is None or _list_key(SessionRecord.from_list(unpack(stored))) != key:
                problems.append(
                    f"a list index entry (time and number {key[-16:].hex()}) names no session "
                    "of that time"
                )

    @staticmethod
    def _check_orphans(
        data: Any, numbers: array[int], purging: set[bytes], problems: list[str]
    ) -> None:
        """Report data under a number no record has (and no purge is queued for)."""
        positioned = data.first()
        while positioned:
            number = data.key()[:8]
            (value,) = _U64.unpack(number)
            index = bisect_left(numbers, value)
            if (index == len(numbers) or numbers[index] != value) and number not in purging:
                count = 0
                while positioned and data.key()[:8] == number:
                    count += 1
                    positioned = data.next()
                problems.append(
                    f"session number {value}: {count} entries without a session record (orphaned)"
                )
                continue
            after = _after(number)
            positioned = after is not None and data.set_range(after)

    @staticmethod
    def _check_group(
        data: Any,
        lookup: Any,
        number: bytes,
        record: SessionRecord,
        problems: list[str],
        version: int,
    ) -> None:
        """Check the data entries of one session against its record, one entry at a time.

        A session keeps a time index in format 1, and in format 2 when its
        record says so; without one, its events must be in time order. An
        event that does not decode is one finding: it is counted, and the
        index entries that point at it are not checked.
        """
        label = _label(record)
        timed = version == 1 or record.time_indexed
        stored = times = 0
        found_any = False
        previous = b""
        last_id: bytes | None = None
        event_prefix = number + _EVENT
        positioned = data.set_range(number)
        while positioned and data.key().startswith(number):
            key, value = data.item()
            found_any = True
            kind = key[8:9]
            if kind == _EVENT:
                stored += 1
                seq = key[9:17]
                position = _U64.unpack(seq)[0]
                if position >= record.event_count:
                    problems.append(f"{label}: event {position} lies past the record's count")
                stamp = _sortable_time(_F64.unpack_from(value)[0])
                if not timed and stamp < previous:
                    problems.append(f"{label}: event {position} is earlier than the one before it")
                previous = stamp
                try:
                    id_part = _unique_part(decode_event(value[8:])["id"])
                except Exception as error:  # any undecodable record is a finding
                    problems.append(
                        f"{label}: event {position} does not decode: {_without_hint(error)}"
                    )
                    positioned = data.next()
                    continue
                if position == record.event_count - 1:
                    last_id = id_part
                if lookup.get(number + _EVENT_ID + id_part) != seq:
                    problems.append(f"{label}: event {position} is missing from the id index")
                if timed and not lookup.set_key(number + _EVENT_TIME + stamp + seq):
                    problems.append(f"{label}: event {position} is missing from the time index")
            elif kind == _EVENT_ID:
                event = lookup.get(event_prefix + value)
                if event is None:
                    problems.append(f"{label}: an id index entry points at no event with that id")
                else:
                    try:
                        event_id = decode_event(event[8:])["id"]
                    except Exception:  # reported where the event itself is checked
                        event_id = None
                    if event_id is not None and _unique_part(event_id) != key[9:]:
                        problems.append(
                            f"{label}: an id index entry points at no event with that id"
                        )
            elif kind == _EVENT_TIME:
                times += 1
                event = lookup.get(event_prefix + key[17:25])
                if event is None or _sortable_time(_F64.unpack_from(event)[0]) != key[9:17]:
                    problems.append(f"{label}: a time index entry points at no event of that time")
            elif kind != _STATE:
                problems.append(f"{label}: an entry of unknown kind {kind!r}")
            positioned = data.next()
        if not timed and times:
            problems.append(f"{label}: {times} time index entries, but it keeps no time index")
        counted = record.stored_count
        if not found_any and counted:
            problems.append(f"{label}: counts {counted} events, stores none")
        elif stored != counted:
            problems.append(f"{label}: counts {counted} events, stores {stored}")
        if last_id is not None and last_id != _unique_part(record.last_event_id or ""):
            problems.append(f"{label}: the record's last event id is not its last event's")

    def space(self) -> dict[str, int]:
        """Return the file's size and how its pages are used.

        ``free_pages`` counts the pages up to the last one in use that no
        database holds: LMDB's free list (pages released by deletes and by
        copy-on-write, which later writes reuse before the file grows) and
        the pages of the list itself. A compaction leaves none.
        """

        def gather(txn: Any) -> dict[str, int]:
            info = self._env.info()
            main = self._env.stat()
            used = _pages(main) + sum(_pages(txn.stat(handle)) for handle in self._dbs.values())
            pages = info["last_pgno"] + 1
            return {
                "file_size": (self.path / "data.mdb").stat().st_size,
                "map_size": info["map_size"],
                "page_size": main["psize"],
                "pages": pages,
                "pages_used": used,
                # Pages 0 and 1 are LMDB's two meta pages.
                "free_pages": max(0, pages - 2 - used),
                "readers": info["num_readers"],
            }

        return self._read(gather)

    def copy_to(self, dest: str | os.PathLike[str]) -> None:
        """Write a consistent, compacted copy of the store into the empty directory ``dest``.

        The copy is of one read snapshot, so writers in this or other
        processes go on meanwhile; it holds no free pages. Its ``data.mdb``
        is created exclusively (an existing file or a planted link there is
        an ``OutputPathError``) and removed again if the copy fails.
        """
        copy = Path(dest) / "data.mdb"
        # Created here, owner-only, exclusively and never through a link,
        # then filled by LMDB through the descriptor.
        fd = create_exclusive(copy)
        made = os.fstat(fd)
        try:
            try:
                with self._gate:
                    txn = self._begin()
                    try:
                        self._env.copyfd(fd, compact=True, txn=txn)
                    finally:
                        txn.abort()
            except lmdb.Error as error:
                raise _lmdb_failure("copying the store", error) from error
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            remove_own(copy, made)
            raise
        os.close(fd)

    @classmethod
    def compact(
        cls,
        path: str | os.PathLike[str],
        check: Callable[[Path], None],
        *,
        file_mode: int = 0o600,
        trust_directory: bool = False,
    ) -> tuple[int, int]:
        """Rewrite a store no process has open without free pages; return sizes before, after.

        The store is copied with compaction into a sibling directory, the
        copy is checked with ``check(directory)`` (which raises to refuse it),
        and its file then replaces ``data.mdb`` by one rename: at every moment
        the path holds the old file or the new one, whole. Meanwhile LMDB's
        lock on ``lock.mdb`` is held exclusively, so no process opens the
        store; one that waited for it meets an emptied lock file and fails to
        open rather than read the new file with the old file's reader table.
        """
        root = Path(path)
        data = root / "data.mdb"
        # What opening checks, first: no file is opened through a link, a FIFO or a device.
        _check_store_files(root, file_mode, trust_directory)
        if not data.is_file():
            raise IncompatibleStoreError(f"{root} holds no store", hint="give a store's directory")
        cls._probe(root)
        with _sole_user(root, "compact"):
            before = data.stat().st_size
            temp = Path(tempfile.mkdtemp(prefix=f".{root.name}.compact-", dir=root.parent))
            try:
                env = lmdb.open(str(root), readonly=True, lock=False, max_dbs=len(_DB_NAMES) + 2)
                try:
                    env.copy(str(temp), compact=True)
                finally:
                    env.close()
                copy = temp / "data.mdb"
                os.chmod(copy, data.stat().st_mode & 0o777)
                _fsync(copy)
                check(temp)
                os.replace(copy, data)
                _fsync(root)
            except lmdb.Error as error:
                raise _lmdb_failure("compacting the store", error) from error
            finally:
                shutil.rmtree(temp, ignore_errors=True)
            return before, data.stat().st_size

    @classmethod
    def upgrade(
        cls, path: str | os.PathLike[str], *, file_mode: int = 0o600, trust_directory: bool = False
    ) -> int:
        """Bring a store no process has open to the current format, in place; return its old one.

        Format 1 to 2 is one write transaction: each session gets its list
        index entry and its record says ``time_indexed`` (format 1 indexed
        every session by time, and that index stays), and the format record
        says 2, all in the same commit. A crash leaves format 1 whole or
        format 2 whole; running it again on an upgraded store changes
        nothing. Refused (``StoreError``) while any process has the store
        open: such a process would go on writing without the list index.
        """
        root = Path(path)
        _check_store_files(root, file_mode, trust_directory)
        if not (root / "data.mdb").is_file():
            raise IncompatibleStoreError(f"{root} holds no store", hint="give a store's directory")
        cls._probe(root)
        with _sole_user(root, "upgrade"):
            try:
                env = lmdb.open(str(root), lock=False, max_dbs=len(_DB_NAMES) + 2)
                try:
                    with env.begin() as txn:
                        meta = env.open_db(b"meta", txn=txn, create=False)
                        version = _check_format(root, txn.get(_FORMAT_KEY, db=meta))
                    while version < FORMAT_VERSION:
                        try:
                            _upgrade_to_2(env)
                            break
                        except lmdb.MapFullError:
                            # Nothing was written: try again on a map twice as large.
                            env.set_mapsize(env.info()["map_size"] * 2)
                finally:
                    env.close()
            except lmdb.Error as error:
                raise _lmdb_failure(f"upgrading {root}", error) from error
        return version


def _check_store_files(path: Path, file_mode: int = 0o600, trust_directory: bool = False) -> None:
    """Refuse a directory others could write to, and planted links.

    LMDB writes its lock table into lock.mdb and pages into data.mdb
    wherever the names lead; a link would have it overwrite the file it
    points to. A directory another user owns or may write to lets them
    swap those files. What opening a store checks, and compacting and
    upgrading one, before any file is opened: a FIFO or a device there
    is refused too, never opened.
    """
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return
    except OSError as error:
        raise _open_failure(path, error) from error
    if not stat.S_ISDIR(info.st_mode):
        raise IncompatibleStoreError(
            f"{path} is not a directory", hint="give the path of a store directory"
        )
    if not trust_directory:
        if info.st_uid != os.geteuid():
            raise UnsafeStoreError(
                f"{path} is owned by user {info.st_uid}, not by this process's user",
                hint="open stores you own, or trust the directory: trust_directory=True in "
                "Python, ?trust_directory=yes in the URI",
            )
        # Group or others may write only where file_mode lets them.
        extra = info.st_mode & 0o022 & ~file_mode
        if extra:
            raise UnsafeStoreError(
                f"{path} is writable by {'group' if extra & 0o020 else 'others'} "
                f"(mode {stat.S_IMODE(info.st_mode):o})",
                hint="chmod go-w the directory, give a file_mode that shares it "
                "(file_mode=0o660 in Python, ?file_mode=660 in the URI), or trust the "
                "directory (trust_directory=True, ?trust_directory=yes)",
            )
    for name in ("data.mdb", "lock.mdb"):
        try:
            entry = os.lstat(path / name)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(entry.st_mode):
            raise UnsafeStoreError(
                f"{path / name} is a symbolic link",
                hint="a store's files must be plain files: remove the link",
            )
        if not stat.S_ISREG(entry.st_mode):
            raise IncompatibleStoreError(
                f"{path / name} is not a file",
                hint="a store's data.mdb and lock.mdb must be plain files: remove it, "
                "or pick an empty or new directory",
            )


def _upgrade_to_2(env: Any) -> None:
    """Add the list index to a format-1 store and mark it format 2, in one transaction."""
    with env.begin(write=True) as txn:
        meta = env.open_db(b"meta", txn=txn, create=False)
        sessions = env.open_db(b"sessions", txn=txn, create=False)
        listing = env.open_db(_LISTING, txn=txn)
        for key, value in list(txn.cursor(db=sessions)):
            record = _record_from(value)
            record.time_indexed = True
            txn.put(key, pack(record.to_list()), db=sessions)
            txn.put(_list_key(record), key, db=listing)
        header = {"magic": MAGIC, "format": 2}
        txn.put(_FORMAT_KEY, bytes([2]) + pack(header), db=meta)


def path_uri(path: str | os.PathLike[str]) -> str:
    """Return the ``lmdb://`` URI of a store directory, which ``open_store`` reads back.

    The absolute path, percent-quoted: a space, ``#``, ``?`` or ``%`` in a
    directory name would otherwise end the path or be read as an escape.
    """
    return "lmdb://" + quote(str(Path(path).resolve()))


def _lmdb_failure(doing: str, error: lmdb.Error) -> StoreError:
    """Return the error a caller sees when LMDB itself fails, with a hint for its cause."""
    failure: StoreError
    message = f"{doing} failed: {error}"
    if isinstance(error, lmdb.ReadersFullError):
        failure = StoreError(
            message,
            hint="every reader slot is held by a live transaction (slots of exited "
            "processes were reclaimed): raise max_readers",
        )
    elif isinstance(
        error, (lmdb.CorruptedError, lmdb.PageNotFoundError, lmdb.VersionMismatchError)
    ):
        failure = CorruptStoreError(message)
    elif isinstance(error, lmdb.PanicError):
        failure = StoreError(
            message,
            hint="LMDB stopped this environment after a fatal error: open the store again; "
            "if it recurs, check the disk and run `sessionscope verify`",
        )
    elif isinstance(error, lmdb.ReadonlyError) or _errno_of(error) == errno.EROFS:
        failure = StoreError(
            message,
            hint="the store's files or filesystem are read-only: open it where it can write",
        )
    elif isinstance(error, lmdb.MemoryError):
        failure = StoreError(
            message, hint="the OS refused memory or address space for the map (ulimit -v)"
        )
    else:
        failure = StoreError(
            message,
            hint="check free disk space, file size limits and the disk; "
            "what was stored before this call is intact",
        )
    failure.__cause__ = error
    return failure


def _errno_of(error: BaseException) -> int | None:
    """Return the errno an OSError or an LMDB error carries, when it says one."""
    if isinstance(error, OSError):
        return error.errno
    if isinstance(error, lmdb.DiskError):
        return errno.ENOSPC
    # py-lmdb raises a plain lmdb.Error, the OS's message its only content,
    # for EROFS and EPERM; its EACCES type (ReadonlyError) also stands for a
    # write in a read-only transaction. These are recognised by their text.
    text = str(error)
    for code in (errno.EROFS, errno.EACCES, errno.EPERM):
        if os.strerror(code) in text:
            return code
    return None


def _open_failure(path: Path, error: BaseException) -> StoreError:
    """Return the error for a store that cannot be opened, with a hint for its cause."""
    code = _errno_of(error)
    read_only = False
    with contextlib.suppress(OSError):
        probe = path if path.exists() else path.parent
        read_only = bool(os.statvfs(probe).f_flag & os.ST_RDONLY)
    if read_only or code == errno.EROFS:
        hint = "the filesystem is mounted read-only: open the store on a writable one"
    elif code in (errno.EACCES, errno.EPERM) or isinstance(error, lmdb.ReadonlyError):
        hint = "this user may not write the store's directory or files: check their owner and mode"
    elif code == errno.ENOSPC:
        hint = "the disk is full: free space and open the store again"
    # py-lmdb refuses a second open of an environment with a plain lmdb.Error
    # and no code: its message is all there is to recognise it by.
    elif isinstance(error, lmdb.Error) and "already open" in str(error):
        if _file_id(path / "data.mdb") in _inherited:
            hint = (
                "this process inherited the store through fork(): open stores only after "
                "forking, or drop every inherited store object before opening it again"
            )
        else:
            hint = "a process opens a store once: share the store object between services"
    elif isinstance(error, lmdb.Error):
        return _lmdb_failure(f"opening {path}", error)
    else:
        hint = "check the path, its permissions and the disk"
    failure = StoreError(f"cannot open {path}: {error}", hint=hint)
    failure.__cause__ = error
    return failure


def _forked_error(path: Path) -> StoreError:
    return StoreError(
        f"the store at {path} was opened in another process and crossed a fork()",
        hint="open stores after forking: in each worker process, open its own store "
        "(multiprocessing: open it in the worker function, or use the spawn context)",
    )


def _check_options(
    durability: object,
    map_size: object,
    flush_interval: object,
    file_mode: object,
    max_readers: object,
) -> int:
    """Refuse options LMDB or the syncer could not work with; return the map size to use."""
    if durability not in ("sync", "deferred"):
        raise ValueError(f"durability must be 'sync' or 'deferred', not {durability!r}")
    if isinstance(map_size, bool) or not isinstance(map_size, int) or map_size <= 0:
        raise ValueError(f"map_size must be a positive int, not {map_size!r}")
    if map_size > sys.maxsize:
        raise ValueError(f"map_size must be at most {sys.maxsize}, not {map_size}")
    interval = finite_float(flush_interval)
    if interval is None or not 0 < interval <= threading.TIMEOUT_MAX:
        raise ValueError(
            "flush_interval must be a finite number of seconds above 0 and at most "
            f"{threading.TIMEOUT_MAX}, not {flush_interval!r}"
        )
    if isinstance(file_mode, bool) or not isinstance(file_mode, int) or file_mode & ~0o777:
        raise ValueError(f"file_mode must be permission bits such as 0o600, not {file_mode!r}")
    if file_mode & 0o600 != 0o600:
        raise ValueError(f"file_mode must let the owner read and write (0o600), not {file_mode:o}")
    if (
        isinstance(max_readers, bool)
        or not isinstance(max_readers, int)
        or not 1 <= max_readers <= _MAX_READERS
    ):
        raise ValueError(
            f"max_readers must be an int from 1 to {_MAX_READERS}, not {max_readers!r}"
        )
    # Tiny maps are rounded up, and every size to whole OS pages.
    page = mmap.PAGESIZE
    return max(_MIN_MAP_SIZE, -(-map_size // page) * page)


# The data files (device, inode) of the stores open in this process. LMDB's
# locks belong to the process: opening and closing a second descriptor of an
# open store's lock file would drop them, so the probe never does.
_open_here: set[tuple[int, int] | None] = set()
# Those of a parent process, inherited through fork().
_inherited: set[tuple[int, int] | None] = set()
# struct flock on Linux: type, whence, start, length, pid (with padding).
_FLOCK = struct.Struct("@hhqqi4x")


def _in_use(lock_file: Path) -> bool:
    """Tell whether another process has the store open (holds a lock on lock.mdb).

    Asked with F_GETLK, which changes no lock and no byte. Where the layout
    of the query is not known, assume the store is in use.
    """
    if not lock_file.exists():
        return False
    if not sys.platform.startswith("linux"):
        return True
    try:
        fd = os.open(lock_file, os.O_RDWR | os.O_NOFOLLOW)
    except OSError:
        return True
    try:
        query = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
        answer = fcntl.fcntl(fd, fcntl.F_GETLK, query)
        return bool(_FLOCK.unpack(answer)[0] != fcntl.F_UNLCK)
    except OSError:
        return True
    finally:
        os.close(fd)


def _file_id(path: str | Path) -> tuple[int, int] | None:
    """Return which file a path names now (device, inode); None when there is none."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def _open_adopting(path: str, **options: Any) -> Any:
    """Open an LMDB environment, again while another process grows the map under it.

    Opening begins a transaction of its own, which fails when the store grew
    past the map meanwhile; a new attempt maps what the file holds now.
    """
    for _ in range(1000):
        try:
            return lmdb.open(path, **options)
        except lmdb.MapResizedError:
            continue
    return lmdb.open(path, **options)


def _begin_adopting(env: Any) -> Any:
    """Begin a read transaction on an environment used while opening, adopting a grown map."""
    for _ in range(1000):
        try:
            return env.begin()
        except lmdb.MapResizedError:
            env.set_mapsize(0)
    return env.begin()


def _check_meta(data: Path) -> None:
    """Refuse a data file shorter than its meta pages say, or whose meta pages are damaged.

    Cheap (a read-only open of two pages), so it runs at every open: LMDB maps the file
    and trusts these numbers, and a page past the end of the file is a
    SIGBUS, not an error. Another process may commit while the pages are
    read: a refusal stands only when three reads agree.
    """
    for attempt in range(3):
        try:
            _read_meta(data)
            return
        except CorruptStoreError:
            if attempt == 2:
                raise


def _read_meta(data: Path) -> None:
    # py-lmdb reads the meta pages: opened read-only and without the lock
    # file, it changes no file, and info() and stat() read nothing else. A
    # root page past the last one is LMDB's own PageNotFoundError later.
    try:
        size = os.stat(data).st_size
        env = _open_adopting(str(data), subdir=False, readonly=True, lock=False)
    except OSError as error:
        raise _open_failure(data.parent, error) from error
    except (lmdb.InvalidError, lmdb.VersionMismatchError, lmdb.CorruptedError) as error:
        raise CorruptStoreError(f"{data} has a damaged meta page: {error}") from error
    except lmdb.Error as error:
        raise _open_failure(data.parent, error) from error
    try:
        last_page = env.info()["last_pgno"]
        page_size = env.stat()["psize"]
    finally:
        env.close()
    needed = (last_page + 1) * page_size
    if size < needed:
        raise CorruptStoreError(
            f"{data} is {size} bytes but its meta page says it holds {last_page + 1} pages "
            f"of {page_size} bytes ({needed} bytes): the file was truncated"
        )


def _verify_file(data: Path) -> None:
    """Check every page of a data file without handing it to LMDB; raise CorruptStoreError."""
    # Imported here: only a check needs it.
    import lmdb.verify as lmdb_verify

    try:
        problems: list[str] = lmdb_verify.verify(str(data), subdir=False)  # type: ignore[no-untyped-call]
    except lmdb_verify.VerifyError as error:
        raise CorruptStoreError(f"{data} cannot be verified: {error}") from error
    except OSError as error:
        raise _open_failure(data.parent, error) from error
    if problems:
        shown = "; ".join(problems[:5])
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise CorruptStoreError(f"{data} failed verification: {shown}{more}")


def _check_format(path: Path, header: bytes | None) -> int:
    """Return the store's format version; refuse one this version cannot read, saying which."""
    if header is None:
        raise IncompatibleStoreError(
            f"{path} holds an LMDB database without a format record",
            hint="pick an empty or new directory",
        )
    try:
        fields = unpack(header[1:]) if header[:1] else {}
    except Exception as error:
        raise CorruptStoreError(
            f"the format record of {path} is unreadable (format byte {header[:1].hex() or 'none'})"
        ) from error
    if not isinstance(fields, dict) or fields.get("magic") != MAGIC:
        raise IncompatibleStoreError(
            f"{path} holds another LMDB database", hint="pick another path"
        )
    version = fields.get("format")
    if not isinstance(version, int) or isinstance(version, bool) or header[0] != version:
        raise CorruptStoreError(
            f"the format record of {path} is unreadable (format byte {header[0]}, "
            f"format field {version!r})"
        )
    if version > FORMAT_VERSION:
        raise IncompatibleStoreError(
            f"{path} holds a store of format {version}; this version reads up to {FORMAT_VERSION}",
            hint="upgrade sessionscope",
        )
    return version


def _db_names(version: int) -> tuple[bytes, ...]:
    """Return the named databases a store of ``version`` holds."""
    return _DB_NAMES if version == 1 else (*_DB_NAMES, _LISTING)


def _after(prefix: bytes) -> bytes | None:
    """Return the first key past every key that starts with ``prefix`` (None: no such key)."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


def _part_length(key: bytes, start: int) -> int:
    """Return the length of the id part at ``start`` of a key."""
    if key[start : start + 2] == _DIGEST_MARK:
        return 2 + 32
    return 2 + int.from_bytes(key[start : start + 2], "big")


def _parts_length(key: bytes, depth: int) -> int:
    """Return how many bytes the first ``depth`` id parts of a key take."""
    end = 0
    for _ in range(depth):
        end += _part_length(key, end)
    return end


def _raw_names(cursor: Any, prefix: bytes, depth: int) -> Iterator[str]:
    """Yield each distinct id found ``depth`` parts after ``prefix`` (ids kept raw only)."""
    start = len(prefix)
    positioned = cursor.set_range(prefix)
    while positioned and cursor.key().startswith(prefix):
        key = cursor.key()
        offset = start + _parts_length(key[start:], depth - 1)
        length = _part_length(key, offset)
        if key[offset : offset + 2] != _DIGEST_MARK:
            yield key[offset + 2 : offset + length].decode()
        following = _after(key[: offset + length])
        positioned = following is not None and cursor.set_range(following)


def _item_entries_of(values: dict[str, Any]) -> Items:
    """Return state items (key, packed value) of a decoded map."""
    return [(key, pack(value)) for key, value in values.items()]


# -- helpers of the operations section ------------------------------------------


def _label(record: SessionRecord) -> str:
    return f"session {record.app_name}/{record.user_id}/{record.session_id}"


def _without_hint(error: BaseException) -> str:
    """Return an error's message without its hint: a report of problems gives one hint."""
    text, hint = str(error), getattr(error, "hint", None)
    suffix = f" (hint: {hint})"
    return text[: -len(suffix)] if hint and text.endswith(suffix) else text


def _pages(stat: Any) -> int:
    return int(stat["branch_pages"] + stat["leaf_pages"] + stat["overflow_pages"])


def _fsync(path: Path) -> None:
    """Make a file, or a directory's entries, durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _sole_user(path: Path, command: str) -> Iterator[None]:
    """Hold LMDB's lock on a store exclusively, or refuse: another process has it open.

    Every process with the store open holds a shared fcntl lock on the first
    byte of ``lock.mdb`` for as long as it keeps it open, and a process
    opening it first tries the exclusive lock and then waits for the shared
    one. So taking the exclusive lock both proves that no process has the
    store open and keeps any from opening it until this one is done.
    ``command`` (compact, upgrade) is what the refusal's hint says to run
    again. The lock file is opened without following a link and without
    waiting on a FIFO, and must be a plain file.
    """
    mode = (path / "data.mdb").stat().st_mode & 0o666
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    lock_file = path / "lock.mdb"
    try:
        fd = os.open(lock_file, flags, mode)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise UnsafeStoreError(
                f"{lock_file} is a symbolic link",
                hint="a store's files must be plain files: remove the link",
            ) from None
        raise _open_failure(path, error) from error
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise IncompatibleStoreError(
                f"{lock_file} is not a file", hint="a store's lock.mdb must be a plain file"
            )
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0, os.SEEK_SET)
        except OSError:
            holder = _lock_holder(fd)
            who = f" (pid {holder})" if holder else ""
            raise StoreError(
                f"{path} is open in another process{who}",
                hint=f"close every process that has the store open, then run "
                f"`sessionscope {command} {path_uri(path)}` again",
            ) from None
        yield
        # The lock table describes the old file: empty it, so that a process
        # that waited to open the store fails instead of trusting it. The
        # next process to open the store alone builds a fresh one.
        os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # releases the lock


def _lock_holder(fd: int) -> int | None:
    """Return the pid of a process holding LMDB's lock, where the platform tells it."""
    if sys.platform != "linux":
        return None
    # struct flock on Linux: short type, short whence, off_t start, off_t len, pid_t pid.
    layout = struct.Struct("hhqqi4x")
    try:
        answer = fcntl.fcntl(fd, fcntl.F_GETLK, layout.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 1, 0))
    except OSError:
        return None
    kind, _, _, _, pid = layout.unpack(answer)
    return int(pid) if kind != fcntl.F_UNLCK else None


def _record_from(value: bytes) -> SessionRecord:
    """Return a stored session record; an unreadable one is a CorruptStoreError."""
    try:
        return SessionRecord.from_list(unpack(value))
    except Exception as error:
        raise CorruptStoreError("a session record is unreadable") from error
