"""Read the pages a writable map will write next into the page cache, ahead of the writes.

A deferred store writes through a writable map over a data file whose
blocks ``posix_fallocate`` reserved (see ``Writer._open_env``). The first
write to each such page faults: the kernel has no page for it in its cache,
so it makes one and counts a major fault, 1.4 to 4 us a page on an ext4
disk here, in the writing thread and under the write lock. A fresh store
takes about 0.4 new pages an append or a bulk event of the agent mix, so
these faults cost an event of ``append_many`` 0.5 to 1.5 us of its 8 to 10.
A page already in the page cache faults only to be mapped, in well under a
microsecond.

LMDB takes new pages after the last one it used (``Environment.info()``'s
``last_pgno``) once its free list has none to give, so a thread reads a
window of the file past that page with ``pread``, in the background, with
the GIL released. It starts when the store first grows (a store opened to be
read is never warmed). While the store grows it looks every 5 ms (a look
takes the GIL from the writing thread for a few microseconds) and widens
its window when the writes outrun it; once the store stops growing it
sleeps until a commit wakes it (``Writer.warmer_idle``, one attribute read a
commit). Should LMDB allocate elsewhere, nothing breaks: the writes fault
as before (``tests/test_lmdb_warming.py`` counts the major faults and fails
loudly).

It only reads: it never writes the file, and the pages it read that the
store never writes are clean page cache the kernel may reclaim at will.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from typing import TYPE_CHECKING

import lmdb

if TYPE_CHECKING:
    from .writer import Writer

__all__ = ["MapWarmer"]

_log = logging.getLogger(__name__)

# The first window past the last used page, and the widest it grows to.
FIRST_WINDOW = 2 << 20
MAX_WINDOW = 64 << 20
# The buffer a read goes through, repeated for as many as the stretch needs.
_CHUNK = 1 << 20
# Seconds between looks while the store grows; looks that find it still
# before the thread sleeps until a commit wakes it.
_BUSY = 0.005
_STILL_LOOKS = 8


class MapWarmer:
    """A background thread that keeps the pages past a store's last used page in the page cache."""

    def __init__(self, writer: Writer) -> None:
        self._writer = writer
        self._stopping = False
        # Set to wake the thread: by a commit while it sleeps, and to stop it.
        self._wake = threading.Event()
        # The file offset up to which pages were read, and the window read past the last page.
        self.warmed = 0
        self.window = FIRST_WINDOW
        self._thread = threading.Thread(
            target=self._run, name="sessionscope-lmdb-warmer", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and wait for it; it ends its read first."""
        self._stopping = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join()

    def wake(self) -> None:
        """Wake the thread sleeping while the store did not grow (a commit calls it)."""
        self._writer.warmer_idle = False
        self._wake.set()

    def _used_end(self) -> int | None:
        """Return the file offset just past the last page LMDB used; None once closed."""
        writer = self._writer
        try:
            with writer.gate:
                if writer.released or not writer.writemap:
                    return None
                info = writer.env.info()
                page = writer.page_size
        except lmdb.Error:
            return None
        return (int(info["last_pgno"]) + 1) * page

    def _run(self) -> None:
        try:
            fd = os.open(self._writer.path / "data.mdb", os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError as error:
            _log.debug("not warming %s: %s", self._writer.path, error)
            return
        try:
            self._warm(fd)
        except Exception as error:
            # Reading ahead is only for speed: the store goes on as it would without it.
            _log.warning("reading %s ahead of its writes stopped: %r", self._writer.path, error)
        finally:
            os.close(fd)

    def _warm(self, fd: int) -> None:
        buffer = memoryview(bytearray(_CHUNK))
        writer = self._writer
        last_end = self._used_end()
        still = _STILL_LOOKS
        while last_end is not None:
            if still >= _STILL_LOOKS:
                # Asleep until a commit: looked at once more after saying so,
                # so that a commit just before it is not missed.
                writer.warmer_idle = True
                if self._used_end() == last_end:
                    self._wake.wait()
                writer.warmer_idle = False
            else:
                self._wake.wait(_BUSY)
            self._wake.clear()
            if self._stopping:
                return
            end = self._used_end()
            if end is None:
                return
            if end == last_end:
                still += 1
                continue
            still = 0
            if self.warmed and end >= self.warmed:
                # The writes outran the window since the last look: widen it.
                self.window = min(self.window * 4, MAX_WINDOW)
            last_end = end
            offset = max(self.warmed, end)
            until = min(end + self.window, writer.map_size)
            if offset < until:
                # One call for the whole stretch, so the GIL is taken back once:
                # the buffer repeats, since what is read is not kept.
                count = -(-(until - offset) // _CHUNK)
                read = os.preadv(fd, [buffer] * count, offset)
                offset += max(read, 0)
            self.warmed = max(self.warmed, offset)


def warmer_for(writer: Writer) -> MapWarmer | None:
    """Return a started warmer for a store that writes through a writable map, else None."""
    if not writer.writemap or not hasattr(os, "preadv"):
        return None
    warmer = MapWarmer(writer)
    with contextlib.suppress(RuntimeError):  # no thread can start (interpreter exiting)
        warmer.start()
        return warmer
    return None
