"""Who may write an LMDB store now, asked without waiting from an event loop.

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

# lock.mdb opens with LMDB's magic number; on Linux (POSIX mutexes, 64-bit)
# the writer mutex sits on the second 64-byte cache line, and its first
# 32-bit word is zero exactly when nobody holds it.
_LMDB_MAGIC = 0xBEEFC0DE
_MAGIC = struct.Struct("=I")
_WRITE_MUTEX_OFFSET = 64
_WORD = struct.Struct("=I")


class WriterLock:
    """The write lock every writer of one store takes; the loop only tries it."""

    __slots__ = ("_fd", "_map", "_threads", "trusted")

    def __init__(self, lock_file: str) -> None:
        self._threads = threading.Lock()
        # None until a writer has checked the mutex word (see ``learn``).
        self.trusted: bool | None = None
        self._map: mmap.mmap | None = None
        # Kept open for the store's life: closing any descriptor of lock.mdb
        # would drop this process's fcntl locks on it, which LMDB relies on.
        # None once closed; read and changed only under the thread lock, so
        # that no flock ever reaches a number the OS has given to another file.
        fd = os.open(lock_file, os.O_RDONLY | os.O_CLOEXEC)
        self._fd: int | None = fd
        if sys.platform != "linux" or sys.maxsize <= 2**32:
            self.trusted = False
            return
        try:
            self._map = mmap.mmap(fd, mmap.PAGESIZE, mmap.MAP_SHARED, mmap.PROT_READ)
        except (OSError, ValueError):  # a lock file shorter than a page: not laid out as known
            self.trusted = False
            return
        if _MAGIC.unpack_from(self._map, 0)[0] != _LMDB_MAGIC:
            self.trusted = False

    def acquire(self) -> None:
        """Take the lock, waiting for other threads and processes (never on a loop).

        Once closed, only the thread lock is taken: the store refuses the
        transaction the caller goes on to begin.
        """
        self._threads.acquire()
        if self._fd is None:
            return
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        except BaseException:
            self._threads.release()
            raise

    def try_acquire(self) -> bool:
        """Take the lock only if nobody holds it, nor LMDB's own; never wait."""
        if not self.trusted or not self._threads.acquire(blocking=False):
            return False
        if self._fd is None:
            self._threads.release()
            return False
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held by another process's writer
            self._threads.release()
            return False
        if self._lmdb_word():
            self.release()
            return False
        return True

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        self._threads.release()

    def learn(self) -> None:
        """Decide whether the mutex word can be trusted; call it holding LMDB's write lock."""
        if self.trusted is None:
            # Zero while this thread holds the lock: the word is not the mutex.
            # (A word that reads as taken when nobody holds it only makes the
            # loop hand every write off.)
            self.trusted = self._lmdb_word() != 0

    def _lmdb_word(self) -> int:
        assert self._map is not None  # trusted implies mapped
        return int(_WORD.unpack_from(self._map, _WRITE_MUTEX_OFFSET)[0])

    def close(self) -> None:
        """Release the file; call it once LMDB has closed the environment."""
        with self._threads:
            self.trusted = False
            if self._map is not None:
                self._map.close()
                self._map = None
            if self._fd is not None:
                with contextlib.suppress(OSError):
                    os.close(self._fd)
                self._fd = None
