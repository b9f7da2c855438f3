"""The two locks around an LMDB store's transactions in this process.

``Gate`` lets this process's transactions run together, or its map be
resized with none of them running. ``WriterLock`` is who may write the store
now, asked without waiting from an event loop.

Compiled (Cython's pure-Python mode, built a second time as
``_locks_c``) so that an interrupt cannot leave either lock held. Python
runs a signal handler between two bytecodes, and a ``KeyboardInterrupt``
raised just after a lock or count was taken, before the ``with`` or ``try``
that undoes it has begun, left the gate counted as held for good: the next
resize or ``close()`` then waited forever. A compiled ``__enter__`` or
``__exit__`` runs no bytecode, so the interpreter's ``with`` statement
(which calls ``__enter__`` and protects what follows in one step) leaves no
such gap. The pure-Python twin behaves the same but keeps the gap.

The writer lock
---------------
LMDB's write lock is a mutex shared by every process in the store's
``lock.mdb``, and LMDB offers no way to try it without waiting. An event
loop must never wait for it: another process may hold it for as long as it
likes. So a deferred store's loop writes inline only when it can tell,
without waiting, that nobody holds it, and hands the write to its writer
thread otherwise. Three holders are asked in turn:

1. this process's other writers: every writing thread of the store holds
   ``WriterLock``'s thread lock around its transaction;
2. other processes that have the store open: every writer also holds an
   ``flock`` on ``lock.mdb`` around its transaction (a lock of its own kind,
   apart from the ``fcntl`` locks LMDB keeps on that file);
3. anything else that writes with LMDB itself: LMDB's mutex word in
   ``lock.mdb``'s shared memory, read without taking it.

Only the third can race: a foreign writer that takes LMDB's lock between the
read and the loop's own ``begin`` makes the loop wait for that one
transaction. Between stores of this library the answer is exact.

The mutex word is trusted only once the store, opening, has read it as taken
while holding LMDB's lock (``learn``): on a platform whose LMDB keeps its
lock elsewhere (semaphores), or a lock file laid out otherwise, the loop
simply always hands its writes off.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import struct
import sys
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..._speedups import _no_cython as cython
else:
    try:
        import cython
    except ImportError:  # a pure install runs without Cython
        from ..._speedups import _no_cython as cython

if TYPE_CHECKING:
    _c_flock: Any = fcntl.flock
    _c_errno: int = 0
    _C_LOCK_EX = _C_LOCK_NB = _C_LOCK_UN = 0
elif cython.compiled:
    # flock(2) itself for the calls that cannot wait (a try, an unlock):
    # fcntl.flock parses its arguments and lets go of the interpreter's lock
    # around every call, about 1,300 instructions a call beyond the system
    # call. A wait for the lock still goes through fcntl.flock, which lets
    # other threads run meanwhile and lets a signal interrupt it.
    from cython.cimports.libc.errno import errno as _c_errno
    from cython.cimports.sessionscope.stores.lmdb._flock import LOCK_EX as _C_LOCK_EX
    from cython.cimports.sessionscope.stores.lmdb._flock import LOCK_NB as _C_LOCK_NB
    from cython.cimports.sessionscope.stores.lmdb._flock import LOCK_UN as _C_LOCK_UN
    from cython.cimports.sessionscope.stores.lmdb._flock import flock as _c_flock

__all__ = ["LMDB_MAGIC", "Attempt", "Gate", "WriterLock"]

# LMDB's magic number: lock.mdb opens with it, and every meta page of data.mdb
# holds it after the page header (opening checks that). On Linux (POSIX
# mutexes, 64-bit) the writer mutex sits on the second 64-byte cache line of
# lock.mdb, and its first 32-bit word is zero exactly when nobody holds it.
LMDB_MAGIC = 0xBEEFC0DE
_MAGIC = struct.Struct("=I")
_WRITE_MUTEX_OFFSET = 64
# The word's bytes, sliced from the map and compared with a free word's:
# ``struct.unpack_from`` made a tuple and an int on every try, about 1,100
# instructions where the slice and the comparison take about 500.
_WORD = slice(_WRITE_MUTEX_OFFSET, _WRITE_MUTEX_OFFSET + 4)
_FREE_WORD = bytes(4)


# How long a wait for the gate sleeps before it looks again (seconds). A
# wake-up is normally sent; this only bounds the wait should an interrupt
# have cut a notify short.
_RECHECK = 0.05


@cython.cclass
class Gate:
    """Let transactions run together, or the map be resized with none running.

    LMDB may only change its map size while the process has no transaction
    open; a resize (``exclusive``) waits for running ones and holds back new
    ones. The thread lock is taken and released by hand, not by ``with``:
    the compiled build must not call Python code (``Condition.__enter__``)
    between a change of the count and the lock's release.
    """

    _lock: Any
    _cond: Any
    _active: cython.Py_ssize_t
    _resizing: cython.bint

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._active = 0
        self._resizing = False

    def __enter__(self) -> None:
        # Interrupted while the lock is awaited, nothing has been taken.
        self._lock.acquire()
        if self._resizing:
            try:
                while self._resizing:
                    self._cond.wait(_RECHECK)
            except BaseException:
                self._lock.release()
                raise
        self._active += 1
        self._lock.release()

    def __exit__(self, *exc: object) -> None:
        interrupted: BaseException | None = None
        if cython.compiled:
            # A handler that raises while the lock is awaited must not cost
            # the count its decrement: wait again, then raise what it raised.
            # (Not in the twin: there the handler may also run just after the
            # lock was taken, and waiting again would wait for ourselves.)
            while True:
                try:
                    self._lock.acquire()
                    break
                except BaseException as error:
                    interrupted = error
        else:
            self._lock.acquire()
        self._active -= 1
        if self._resizing and not self._active:
            try:
                self._cond.notify_all()
            except BaseException as error:  # the resize looks again by itself
                interrupted = error
        self._lock.release()
        if interrupted is not None:
            raise interrupted

    def exclusive(self, action: Any) -> None:
        """Run ``action`` while no transaction of this process is open."""
        self._lock.acquire()
        try:
            while self._resizing:
                self._cond.wait(_RECHECK)
            self._resizing = True
            try:
                while self._active:
                    self._cond.wait(_RECHECK)
                action()
            finally:
                self._resizing = False
                self._cond.notify_all()
        finally:
            self._lock.release()


@cython.cfunc
def _try_flock(fd: cython.int) -> cython.bint:
    """Take the ``flock`` on ``fd`` if nobody holds it; never wait."""
    if cython.compiled:
        taken: cython.bint = _c_flock(fd, _C_LOCK_EX | _C_LOCK_NB) == 0
        return taken
    else:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        return True


@cython.cfunc
def _unlock(fd: cython.int) -> None:
    """Let go of the ``flock`` on ``fd``; an OSError if the system refuses."""
    if cython.compiled:
        if _c_flock(fd, _C_LOCK_UN) != 0:
            number = _c_errno
            raise OSError(number, os.strerror(number))
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)


@cython.cclass
class WriterLock:
    """The write lock every writer of one store takes; the loop only tries it.

    Taken with ``with``, or tried with ``with Attempt(lock) as held``.
    """

    _threads: Any
    # None until a writer has checked the mutex word (see ``learn``).
    _trusted: Any
    _map: Any
    # Kept open for the store's life: closing any descriptor of lock.mdb
    # would drop this process's fcntl locks on it, which LMDB relies on.
    # None once closed; read and changed only under the thread lock, so
    # that no flock ever reaches a number the OS has given to another file.
    _fd: Any

    def __init__(self, lock_file: str, fd: int | None = None) -> None:
        """Take ``lock_file``; ``fd``, when given, is a descriptor of it this lock now owns."""
        self._threads = threading.Lock()
        self._trusted = None
        self._map = None
        self._fd = os.open(lock_file, os.O_RDONLY | os.O_CLOEXEC) if fd is None else fd
        if sys.platform != "linux" or sys.maxsize <= 2**32:
            self._trusted = False
            return
        try:
            self._map = mmap.mmap(self._fd, mmap.PAGESIZE, mmap.MAP_SHARED, mmap.PROT_READ)
        except (OSError, ValueError):  # a lock file shorter than a page: not laid out as known
            self._trusted = False
            return
        if _MAGIC.unpack_from(self._map, 0)[0] != LMDB_MAGIC:
            self._trusted = False

    def __enter__(self) -> None:
        self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def acquire(self, blocking: bool = True) -> bool:
        """Take the lock, waiting for other threads and processes (never on a loop).

        Once closed, only the thread lock is taken: the store refuses the
        transaction the caller goes on to begin. With ``blocking`` false,
        take it only if nobody holds it, nor LMDB's own lock, and never
        wait; return whether it was taken.
        """
        if not blocking:
            return self._try()
        self._threads.acquire()
        if self._fd is None:
            return True
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        except BaseException:
            self._threads.release()
            raise
        return True

    @cython.cfunc
    def _try(self) -> cython.bint:
        if not self._trusted or not self._threads.acquire(False):
            return False
        if self._fd is None:
            self._threads.release()
            return False
        if not _try_flock(self._fd):  # held by another process's writer
            self._threads.release()
            return False
        if self._lmdb_held():
            self.release()
            return False
        return True

    def release(self) -> None:
        try:
            if self._fd is not None:
                _unlock(self._fd)
        finally:
            self._threads.release()

    def learn(self) -> None:
        """Decide whether the mutex word can be trusted; call it holding LMDB's write lock."""
        if self._trusted is None:
            # Zero while this thread holds the lock: the word is not the mutex.
            # (A word that reads as taken when nobody holds it only makes the
            # loop hand every write off.)
            self._trusted = self._lmdb_held()

    @cython.cfunc
    def _lmdb_held(self) -> cython.bint:
        """Tell whether LMDB's mutex word reads as taken (not zero)."""
        assert self._map is not None  # trusted implies mapped
        word: bytes = self._map[_WORD]
        return word != _FREE_WORD

    def close(self) -> None:
        """Release the file; call it once LMDB has closed the environment."""
        with self._threads:
            self._trusted = False
            if self._map is not None:
                self._map.close()
                self._map = None
            if self._fd is not None:
                with contextlib.suppress(OSError):
                    os.close(self._fd)
                self._fd = None


@cython.cclass
class Attempt:
    """``with Attempt(lock) as held``: a lock tried without waiting, released if taken.

    For a ``WriterLock`` or a thread lock: the interpreter's ``try`` cannot
    begin between an ``acquire(False)`` that took the lock and the release
    meant to follow, should a signal handler raise there; a compiled
    ``__enter__`` runs no bytecode in which one could.
    """

    _lock: Any
    _held: cython.bint

    def __init__(self, lock: Any) -> None:
        self._lock = lock
        self._held = False

    def __enter__(self) -> bool:
        lock = self._lock
        if type(lock) is WriterLock:
            # The store's writer lock, tried by a C call (every deferred
            # write tries it first): no Python call of ``acquire``.
            self._held = cython.cast(WriterLock, lock)._try()
        else:
            self._held = lock.acquire(False)
        return self._held

    def __exit__(self, *exc: object) -> None:
        if self._held:
            self._held = False
            self._lock.release()
