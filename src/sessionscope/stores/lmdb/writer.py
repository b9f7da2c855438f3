"""The LMDB store's environment and write path: group commit, its threads, map growth.

``Writer`` holds what a store opened: the LMDB environment, its database
handles (``layout.Databases``), the gate that keeps transactions out while the
map is swapped, and LMDB's write lock. Every transaction of the store begins
here (``read``, ``write``); a write commits through the compiled
``_append.commit`` on its common path, and here when something fails.

Durability: with ``durability="sync"`` the environment commits with LMDB's
own two-fsync protocol, and the writes of all threads and tasks that queue
while the disk syncs are committed in one transaction (group commit) by a
calling thread or, for event loops, by the writer thread. With
``"deferred"`` writes commit in the caller's thread without fsync and a
syncer thread syncs every ``flush_interval`` seconds and on ``flush()``;
``close()`` syncs, and so does the interpreter's exit for a store left open.
A deferred store that writes through a writable map also runs a thread that
reads the map's next pages ahead of the writes (``warming.MapWarmer``).

The map starts at ``map_size`` and doubles when a write runs out of it; a
process adopts a map another process grew when its next transaction begins.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import fcntl
import logging
import os
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import lmdb

from ...core import compiled_or_twin
from ...errors import IncompatibleStoreError, StoreClosedError, StoreError, UnsafeStoreError
from ..completion import Completion, Pending, finish_all
from .layout import (
    FORMAT_KEY,
    FORMAT_VERSION,
    MAX_DBS,
    NUMBER_KEY,
    U64,
    Databases,
    db_names,
    format_record,
)
from .opening import (
    INHERITED,
    OPEN_HERE,
    check_format,
    file_id,
    forked_error,
    lmdb_failure,
    open_adopting,
    open_failure,
    reserve_lock_file,
)
from .warming import MapWarmer, warmer_for

if TYPE_CHECKING:
    # The source is the type source; its compiled build has the same signatures.
    from . import _append as _hot
    from . import _locks
else:
    _hot = compiled_or_twin("sessionscope.stores.lmdb._append")
    _locks = compiled_or_twin("sessionscope.stores.lmdb._locks")

__all__ = ["Durability", "Writer"]

T = TypeVar("T")
Durability = Literal["sync", "deferred"]

_MAX_BATCH = 1024
# A write waiting for the group commit, and who waits for it.
_Queued = tuple[Callable[[Any], Any], Pending[Any]]

_log = logging.getLogger(__name__)


class _MapMustGrow(Exception):
    """Writes that ran out of map where the map may not grow; nothing was written."""


def _in_loop() -> bool:
    """Tell whether an event loop runs in this thread."""
    try:
        return asyncio.get_running_loop() is not None
    except RuntimeError:  # no event loop runs in this thread
        return False


# The process the stores of this process were opened in. A forked child gets
# its own id here, and a store opened in the parent refuses to work there.
_process_pid = os.getpid()


def _note_fork() -> None:
    global _process_pid
    _process_pid = os.getpid()
    # The parent's stores are not open here; LMDB still counts them as open
    # until the inherited objects are dropped.
    INHERITED.update(OPEN_HERE)
    OPEN_HERE.clear()


os.register_at_fork(after_in_child=_note_fork)

# The deferred stores open in this process. A script that appends and ends
# without close() would leave what it wrote since the last sync to the
# kernel's write-back: ``_flush_at_exit`` syncs them when the interpreter
# exits. Weak, and close() takes a store out: the set never keeps one alive.
_deferred_open: weakref.WeakSet[Writer] = weakref.WeakSet()


def _flush_at_exit() -> None:
    """Sync every deferred store still open; a failure is logged, the others still sync."""
    for writer in list(_deferred_open):
        writer.sync_at_exit()


# Registered after logging's own exit handler, so it runs before logging shuts down.
atexit.register(_flush_at_exit)


@contextlib.contextmanager
def _writers_flock(fd: int) -> Iterator[None]:
    """Hold the flock every writer of this library takes on lock.mdb (see ``WriterLock``).

    Before the environment is open there is no ``WriterLock`` yet; its
    descriptor is taken here first.
    """
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


class Writer:
    """A store's open environment, its transactions and its write path."""

    def __init__(
        self,
        path: Path,
        *,
        durability: Durability,
        map_size: int,
        flush_interval: float,
        file_mode: int,
        max_readers: int,
        check: Callable[[Any, Databases], None] | None = None,
        read_ahead: bool = True,
    ) -> None:
        self.path = path
        self.durability: Durability = durability
        self.flush_interval = flush_interval
        self._file_mode = file_mode
        self._max_readers = max_readers
        # A store belongs to the process that opened it: one that crossed a
        # fork() refuses to be used in the child (see check_open).
        self.pid = _process_pid
        self.closed = False
        # Set once the environment is closed; checked under the gate.
        self.released = False
        self.gate = _locks.Gate()
        # Whether this store writes through a writable map (see _open_env).
        self.writemap = False
        self._writemap_allowed = True
        # Whether a commit since the last sync left something to sync.
        self.dirty = False
        # Whether the warmer sleeps until a commit wakes it (see warming.py);
        # set before any transaction, since every commit reads it.
        self.warmer_idle = False
        self.lock_path = path / "lock.mdb"
        # A str: os.stat takes it without converting a Path on every write.
        self.lock_name = str(self.lock_path)
        self.lock_bytes = os.fsencode(self.lock_name)  # what the compiled commit stats
        # The environment is opened holding the writers' flock (see
        # _open_env): the descriptor it is taken on becomes the writer lock's.
        try:
            lock_fd = os.open(
                self.lock_name,
                os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                file_mode,
            )
        except OSError as error:
            raise open_failure(path, error) from error
        try:
            with _writers_flock(lock_fd):
                # Blocks first: LMDB writes its lock table through a map.
                reserve_lock_file(self.lock_path, max_readers)
                self.env = self._open_env(map_size)
        except BaseException:
            os.close(lock_fd)
            raise
        try:
            # Taken by every write transaction; tried without waiting from a loop.
            self.writer_lock = _locks.WriterLock(self.lock_name, lock_fd)
        except OSError as error:
            self.env.close()
            os.close(lock_fd)
            raise open_failure(path, error) from error
        try:
            # Slots of readers whose process died without closing the store
            # would otherwise stay taken until every process closed it.
            self.env.reader_check()
            self.map_size: int = self.env.info()["map_size"]
            self.page_size: int = self.env.stat()["psize"]
            self.dbs = self._open_databases(check)
            self.lock_id = file_id(self.lock_name)
            self.data_id = file_id(path / "data.mdb")
            OPEN_HERE.add(self.data_id)
        except BaseException:
            self.env.close()
            self.writer_lock.close()
            raise
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
        self._committer: threading.Thread | None = None
        self._syncer: threading.Thread | None = None
        self._warmer: MapWarmer | None = None
        self._sync_cond = threading.Condition()
        self._sync_waiters: list[Pending[None]] = []
        if durability == "sync":
            self._start_writer()
        else:
            self._syncer = threading.Thread(
                target=self._sync_loop, name="sessionscope-lmdb-syncer", daemon=True
            )
            self._syncer.start()
            _deferred_open.add(self)
            # The first write to each new page of a writable map faults: read them ahead.
            self._warmer = warmer_for(self) if read_ahead else None

    def wake_warmer(self) -> None:
        """Wake the warmer that sleeps while the store does not grow (after a commit)."""
        if self._warmer is not None:
            self._warmer.wake()

    @property
    def forked(self) -> bool:
        """Whether this is a child process that inherited the store through fork()."""
        return self.pid != _process_pid

    def _start_writer(self) -> None:
        self._committer = threading.Thread(
            target=self._write_loop, name="sessionscope-lmdb-writer", daemon=True
        )
        self._committer.start()

    def _data_size(self) -> int:
        """Return the data file's size: no writable map of this store may be smaller.

        LMDB sizes the data file to a writable map whenever it maps it (at
        open, on every resize), shrinking it too. Another process's map may
        be larger, its blocks reserved and its writes already reaching past
        this one's: a file cut under them is a SIGBUS in that process, and
        the pages it wrote there are lost. So every writable map this store
        makes is at least the file, and is made holding the writers' flock
        (at open, and growing or adopting a map), under which every other
        process of this library grows and reserves.
        """
        try:
            return os.stat(self.path / "data.mdb").st_size
        except FileNotFoundError:
            return 0

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
                # Never below the file (see _data_size).
                env = self._open_plain(max(map_size, self._data_size()), writemap=True)
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
            try:
                return self._open_lmdb(map_size, writemap)
            except lmdb.InvalidParameterError:
                # An open that waited while compact or upgrade held the store
                # alone finds the lock table it had mapped emptied
                # (maintenance.sole_user): the files are new, and a second
                # open reads them as they are now.
                _log.info("opening %s again: its lock table was reset meanwhile", self.path)
                return self._open_lmdb(map_size, writemap)
        except lmdb.InvalidError as error:
            raise IncompatibleStoreError(
                f"{self.path} does not hold an LMDB store", hint="pick an empty directory"
            ) from error
        except (lmdb.Error, OSError) as error:
            raise open_failure(self.path, error) from error

    def _open_lmdb(self, map_size: int, writemap: bool) -> Any:
        return open_adopting(
            str(self.path),
            map_size=map_size,
            max_dbs=MAX_DBS,
            max_readers=self._max_readers,
            max_spare_txns=16,
            subdir=True,
            sync=self.durability == "sync",
            metasync=True,
            readahead=False,
            writemap=writemap,
            mode=self._file_mode,
        )

    def _open_databases(self, check: Callable[[Any, Databases], None] | None) -> Databases:
        """Open the named databases (creating them in a new store) in the opening transaction.

        ``check`` reads an existing store in that transaction and may refuse
        it by raising. A read there holds no reader slot afterwards, where a
        read transaction would keep one for the process's lifetime (py-lmdb
        keeps a spare read transaction, and its slot, for reuse).
        """
        env = self.env
        try:
            with self.writer_lock, self.gate:
                # Through begin: another process may be growing the map.
                txn = self.begin(write=True)
                self.writer_lock.learn()
                try:
                    if txn.cursor().first():
                        # Opening existing handles changes nothing on disk.
                        meta = env.open_db(b"meta", txn=txn, create=False)
                        version = check_format(self.path, txn.get(FORMAT_KEY, db=meta))
                        handles = {
                            name: env.open_db(name, txn=txn, create=False)
                            for name in db_names(version)
                        }
                        if check is not None:
                            check(txn, Databases(handles, version))
                    else:
                        version = FORMAT_VERSION
                        handles = {name: env.open_db(name, txn=txn) for name in db_names(version)}
                        meta = handles[b"meta"]
                        txn.put(FORMAT_KEY, format_record(FORMAT_VERSION), db=meta)
                        txn.put(NUMBER_KEY, U64.pack(1), db=meta)
                except BaseException:
                    txn.abort()
                    raise
                txn.commit()
        except (lmdb.NotFoundError, lmdb.IncompatibleError) as error:
            # No database named meta, or a plain record of that name (as a
            # key store of an encrypted store has).
            raise IncompatibleStoreError(
                f"{self.path} holds another LMDB database", hint="pick another path"
            ) from error
        except lmdb.Error as error:
            raise lmdb_failure(f"opening {self.path}", error) from error
        return Databases(handles, version)

    # -- transactions ----------------------------------------------------

    def check_open(self) -> None:
        if self.closed:
            raise StoreClosedError(f"the store at {self.path} is closed", hint="open it again")
        if self.pid != _process_pid:
            raise forked_error(self.path)

    def begin(self, write: bool = False, parent: Any = None) -> Any:
        """Begin a transaction, adopting a map another process has grown.

        A full reader table is checked for slots of dead processes once.
        """
        if self.released:
            # A call that passed the open check as the store closed.
            raise StoreClosedError(f"the store at {self.path} is closed", hint="open it again")
        checked_readers = False
        while True:
            try:
                return self.env.begin(write=write, parent=parent)
            except lmdb.MapResizedError:
                self._adopt_map_size(writing=write)
                if self.released:
                    raise StoreClosedError(
                        f"the store at {self.path} is closed", hint="open it again"
                    ) from None
            except lmdb.ReadersFullError:
                cleared = 0 if checked_readers else self.env.reader_check()
                if not cleared:
                    raise
                _log.info("cleared %d reader slots of dead processes in %s", cleared, self.path)
                checked_readers = True

    def _adopt_map_size(self, writing: bool) -> None:
        # The gate is held by the caller: leave it while the map is swapped.
        # A writable map is swapped holding the writer lock (see _data_size),
        # which a writing caller holds already (taken before the gate).
        self.gate.__exit__()
        try:
            if self.writemap and not writing:
                with self.writer_lock:
                    self.gate.exclusive(self._adopt_if_open)
            else:
                self.gate.exclusive(self._adopt_if_open)
        finally:
            self.gate.__enter__()

    def _adopt_if_open(self) -> None:
        if self.released:
            return
        seen = self.map_size
        floor = self._data_size() if self.writemap else 0
        try:
            # 0 adopts the size the last commit recorded; a writable map is
            # first brought up to the file (the next begin adopts the rest).
            self.env.set_mapsize(floor if floor > seen else 0)
        except (lmdb.Error, OverflowError) as error:
            _log.error("adopting the map another process grew for %s failed: %s", self.path, error)
            # LMDB dropped the map: map the file again, if the OS allows it.
            self._reopen(self.map_size)
            raise StoreError(
                f"adopting the map another process grew for {self.path} failed: {error}",
                hint="the OS refused the address space (ulimit -v, overcommit settings)",
            ) from error
        self.map_size = self.env.info()["map_size"]
        _log.info("adopted the map grown for %s: %d -> %d bytes", self.path, seen, self.map_size)
        if self.writemap:
            try:
                # A process without a writable map grows the map, not the file.
                self._preallocate(self.map_size)
            except StoreError as error:
                # No room for it: map again without writing through the map.
                _log.info("writing %s without a writable map: %s", self.path, error)
                self._writemap_allowed = False
                self._reopen(self.map_size)

    def _grow(self, seen: int) -> None:
        """Double the map after a transaction that saw ``seen`` bytes of it ran out.

        Writers that ran out at once grow it once: the others find it grown.
        """

        def double() -> None:
            if self.released or self.map_size != seen:
                return  # closed (_begin says so), or grown by another writer
            size = seen * 2
            if self.writemap:
                # Called holding the writer lock: never below the file.
                size = max(size, self._data_size())
                # Blocks first: the map never reaches past what is reserved.
                self._preallocate(size)
            try:
                self.env.set_mapsize(size)
            except (lmdb.Error, OverflowError) as error:
                # LMDB drops the map when the OS refuses a new one: map the
                # store again at the size it had.
                self._reopen(seen)
                raise StoreError(
                    f"growing the map of {self.path} to {size} bytes failed: {error}",
                    hint="the OS refused the address space (ulimit -v, overcommit settings); "
                    "the store stays usable at its current size",
                ) from error
            self.map_size = self.env.info()["map_size"]
            _log.info("grew the map of %s: %d -> %d bytes", self.path, seen, self.map_size)

        self.gate.exclusive(double)

    def _reopen(self, map_size: int) -> None:
        """Open the environment again after LMDB closed it; called with no transaction open."""
        with contextlib.suppress(lmdb.Error):
            self.env.close()
        try:
            self.env = self._open_env(map_size)
            self.map_size = self.env.info()["map_size"]
            # A write transaction: handles opened in a read one do not outlive it.
            with self.env.begin(write=True) as txn:
                handles = {
                    name: self.env.open_db(name, txn=txn, create=False)
                    for name in db_names(self.dbs.format)
                }
            self.dbs = Databases(handles, self.dbs.format)
        except BaseException as error:
            # The store cannot be used again; say so to every later call.
            _log.error("mapping %s again failed: the store is closed", self.path, exc_info=error)
            self.released = self.closed = True
            if isinstance(error, lmdb.Error):
                raise lmdb_failure(f"mapping {self.path} again", error) from error
            raise

    def read(self, action: Callable[[Any], T]) -> T:
        self.check_open()
        try:
            with self.gate:
                txn = self.begin()
                try:
                    return action(txn)
                finally:
                    txn.abort()
        except lmdb.Error as error:
            raise lmdb_failure("reading the store", error) from error

    def write(self, action: Callable[[Any], T]) -> Completion[T]:
        """Run a write: queued for group commit, or inline without fsync.

        A deferred write runs inline when nobody holds the write lock and
        nothing waits in the queue before it. Otherwise a thread without an
        event loop waits for the lock and runs it inline, and an event
        loop's write is queued: LMDB's write lock may be held by another
        thread or process for as long as it likes, and the loop must not
        wait for it (see ``WriterLock``).
        """
        self.check_open()
        if self._syncer is not None:
            outcome: tuple[bool, Any] | None = None
            if not self._writes:
                # Nobody writes and nothing waits, the common case: inline,
                # whoever calls. An attempt never waits, so a thread running
                # an event loop may make it too, and nobody needs to ask
                # whether one runs here: asking costs asyncio's check of the
                # process id (a getpid system call) in a thread with one, and
                # an exception (about 2,800 instructions) in a thread without.
                with _locks.Attempt(self.writer_lock) as held:
                    if held:
                        try:
                            outcome = self.run_writes([action], may_grow=False)[0]
                        except _MapMustGrow:
                            # Grown below, where the map may grow: a loop's
                            # write is queued for the writer thread, since
                            # preallocating the file may take a while.
                            outcome = None
            if outcome is None and not _in_loop():
                # A thread without a loop waits for the lock. ``with``, not
                # acquire/try: an interrupt between taking the lock and a
                # ``try`` would leave it held.
                locked = False
                try:
                    with self.writer_lock:
                        locked = True
                        outcome = self.run_writes([action])[0]
                except Exception as error:  # an interrupt goes to the caller as before
                    if locked:
                        raise
                    return Completion(error=self._lock_refused(error))
            if outcome is not None:
                ok, value = outcome
                return Completion(value) if ok else Completion(error=value)
        # Asked again for a loop's write that could not run inline: that
        # write goes to the writer thread, which costs far more than asking.
        in_loop = _in_loop()
        pending: Pending[T] = Pending()
        with self._admit:
            # Checked with the append, so that nothing is queued after the
            # writer thread's last pass.
            self.check_open()
            if self._committer is None:
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

    def run_writes(
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
        while True:
            # Read before the transaction: a map grown meanwhile only costs a retry.
            seen = self.map_size
            try:
                return _hot.commit(self, actions)
            except _hot.LockFileReplaced:
                # Another process could not see this one's readers and writer.
                _log.error("%s was removed or replaced: writes refused", self.lock_path)
                replaced = UnsafeStoreError(
                    f"{self.lock_path} was removed or replaced while the store was open",
                    hint="writing now could corrupt the store: close it in every process and "
                    "open it again",
                )
                return [(False, replaced)] * len(actions)
            except lmdb.MapFullError:
                if not may_grow:
                    raise _MapMustGrow from None
                try:
                    self._grow(seen)
                except StoreError as error:
                    # Every caller of these writes is handed the error.
                    _log.debug("growing the map of %s failed: %s", self.path, error)
                    return [(False, error)] * len(actions)
            except Exception as error:  # the failing write's own outcome
                failure: Exception = error
                if isinstance(error, lmdb.Error):
                    failure = lmdb_failure("writing to the store", error)
                if len(actions) == 1:
                    if failure is not error:  # the store failed, not the write's own checks
                        # Its caller is handed the error and says it: once is enough.
                        _log.debug("writing to %s failed: %s", self.path, failure)
                    return [(False, failure)]
                _log.debug("a write of %d failed (%s): each runs alone", len(actions), error)
                return [self.run_writes([action])[0] for action in actions]

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
        if not writes:
            # Nothing to take: the lock (an flock, two system calls) is spared
            # on the pass that follows every commit. A write queued after this
            # look wakes the writer thread, which looks again.
            return False
        # Taken before the queue is emptied: a loop that finds the queue
        # empty and the lock free writes after everything queued before it.
        locked = False
        try:
            with self.writer_lock:
                locked = True
                while writes and len(batch) < _MAX_BATCH:
                    batch.append(writes.popleft())
                if not batch:
                    return False
                try:
                    outcomes = self.run_writes([action for action, _ in batch])
                except BaseException as error:  # every waiter must hear of it
                    _log.exception("committing %d writes to %s failed", len(batch), self.path)
                    outcomes = [(False, error)] * len(batch)
        except Exception as error:  # an interrupt goes to the interrupted caller as before
            if locked:
                raise
            # The writes waiting now fail rather than wait for ever (the
            # writer thread would die and its waiters hang) or commit later,
            # after their callers were told of an error.
            failure = self._lock_refused(error)
            while writes and len(batch) < _MAX_BATCH:
                batch.append(writes.popleft())
            finish_all((pending, False, failure) for _, pending in batch)
            return bool(batch)
        finish_all(
            (pending, ok, value) for (_, pending), (ok, value) in zip(batch, outcomes, strict=True)
        )
        return True

    def _lock_refused(self, error: Exception) -> StoreError:
        """Log and return the error of writes that could not take the write lock."""
        _log.exception("taking the write lock of %s failed", self.path, exc_info=error)
        failure = StoreError(
            f"could not take the write lock of {self.path}: {error}",
            hint="nothing of these writes was stored; check the store's lock.mdb "
            "and the system's file-lock limits, then retry",
        )
        failure.__cause__ = error
        return failure

    def _sync_loop(self) -> None:
        """Sync deferred writes every interval, and at once when asked."""
        while True:
            with self._sync_cond:
                if not self._sync_waiters and not self.closed:
                    self._sync_cond.wait(self.flush_interval)
                waiters, self._sync_waiters = self._sync_waiters, []
                closing = self.closed
            error: BaseException | None = None
            if self.dirty or waiters:
                self.dirty = False
                try:
                    with self.gate:
                        self.env.sync(True)
                except lmdb.Error as failure:  # reported to flushers
                    error = lmdb_failure("syncing the store", failure)
                except BaseException as failure:  # reported to flushers
                    error = failure
                if error is not None:
                    # A periodic sync has no flusher to tell.
                    _log.error("syncing %s failed", self.path, exc_info=error)
            finish_all((waiter, error is None, error) for waiter in waiters)
            if closing:
                return

    def flush(self) -> Completion[None]:
        """Make every acknowledged write durable."""
        self.check_open()
        if self._syncer is None:
            return Completion.done(None)
        pending: Pending[None] = Pending()
        with self._sync_cond:
            # Checked under the lock the syncer's last pass takes, so that
            # no flush waits behind it.
            self.check_open()
            self._sync_waiters.append(pending)
            self._sync_cond.notify()
        return Completion.waiting(pending)

    def close(self) -> None:
        """Flush, stop the background threads and release the environment.

        In a child process that inherited the store through fork(), only
        mark it closed: the environment and the threads belong to the parent.
        """
        if self.closed:
            return
        _deferred_open.discard(self)
        if self.pid != _process_pid:
            self.closed = True
            return
        # Closed first, so that nothing is queued after the writer's last pass...
        with self._admit:
            self.closed = True
            writer = self._committer
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
        if self._warmer is not None:
            self._warmer.stop()
            self.warmer_idle = False
        # Wait for running transactions, and turn away the ones still to begin.
        self.gate.exclusive(self._release)
        # After LMDB: closing the lock file drops this process's locks on it.
        self.writer_lock.close()

    def sync_at_exit(self) -> None:
        """Sync a deferred store left open when the interpreter exits; log a failure.

        Runs in the exiting thread rather than through the syncer, which is
        a daemon thread: nothing at exit should wait on another thread.
        """
        if self.closed or self.pid != _process_pid:
            return
        try:
            with self.gate:
                if self.released:
                    return
                self.env.sync(True)
        except Exception:  # an exit handler must not raise: the others still run
            _log.exception("syncing the deferred store at %s at exit failed", self.path)
            return
        _log.debug("synced the deferred store at %s at exit", self.path)

    def _release(self) -> None:
        self.released = True
        OPEN_HERE.discard(self.data_id)
        if self._syncer is not None:
            self.env.sync(True)
        self.env.close()
