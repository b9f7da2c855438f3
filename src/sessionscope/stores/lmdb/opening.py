"""Opening an LMDB store safely: what is checked before LMDB touches a file, and LMDB's errors.

Before a store opens, its directory and files are checked (owner, mode,
links, FIFOs: ``check_store_files``), a path that is not a store of ours is
refused without writing to it (``probe``), and a data file whose meta pages
would have LMDB map past its end is refused (``check_meta``). The options a
store takes are checked here too (``check_options``). The failures of py-lmdb
and the OS become typed errors with a hint for their cause (``lmdb_failure``,
``open_failure``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os
import stat
import struct
import sys
import threading
from pathlib import Path
from typing import Any
from urllib.parse import quote

import lmdb

from ...codec import unpack
from ...errors import (
    CorruptStoreError,
    IncompatibleStoreError,
    StoreError,
    UnsafeStoreError,
)
from ..rules import finite_float
from ._locks import LMDB_MAGIC
from .layout import FORMAT_KEY, FORMAT_VERSION, MAGIC, MAX_DBS

__all__ = [
    "INHERITED",
    "OPEN_HERE",
    "begin_adopting",
    "check_format",
    "check_meta",
    "check_options",
    "check_store_files",
    "file_id",
    "forked_error",
    "in_use",
    "lmdb_failure",
    "lock_holder",
    "open_adopting",
    "open_failure",
    "path_uri",
    "probe",
    "reserve_lock_file",
    "verify_file",
]

DEFAULT_MAP_SIZE = 64 << 20
# A map smaller than this cannot hold the named databases of a new store.
_MIN_MAP_SIZE = 1 << 20
# Each reader slot is a line of lock.mdb; more than this is a typo.
_MAX_READERS = 1 << 20
# LMDB's lock file: a header of at least three 64-byte cache lines (it holds
# the first reader slot), then a 64-byte line per further reader slot. The
# header is larger on some platforms: this gives a lower bound of the size.
_LOCK_HEADER = 192
_READER_LINE = 64

# The data files (device, inode) of the stores open in this process. LMDB's
# locks belong to the process: opening and closing a second descriptor of an
# open store's lock file would drop them, so the probe never does.
OPEN_HERE: set[tuple[int, int] | None] = set()
# Those of a parent process, inherited through fork().
INHERITED: set[tuple[int, int] | None] = set()


def probe(path: Path, verify: bool = False) -> bool:
    """Refuse a path that is not ours before LMDB creates or writes a file there.

    Return whether another process has the store open (holds a lock on its
    lock.mdb), asked here, before this process's LMDB opens the file.
    """
    if not path.exists():
        return False
    data = path / "data.mdb"
    # No store yet: no data file, or an empty one (a process killed between
    # LMDB's creating it and its first write holds nothing). LMDB makes a
    # store of either, so nothing but LMDB's own files may be there.
    if not data.exists() or data.stat().st_size == 0:
        if any(entry not in ("lock.mdb", "data.mdb") for entry in os.listdir(path)):
            raise IncompatibleStoreError(
                f"{path} is not empty and holds no store",
                hint="pick an empty or new directory",
            )
        return in_use(path / "lock.mdb")
    try:
        with open(data, "rb") as file:
            header = file.read(20)
    except OSError as error:
        raise open_failure(path, error) from error
    if len(header) < 20 or int.from_bytes(header[16:20], "little") != LMDB_MAGIC:
        raise IncompatibleStoreError(
            f"{data} is not an LMDB file", hint="pick an empty or new directory"
        )
    if file_id(data) in OPEN_HERE:
        raise StoreError(
            f"cannot open {path}: it is already open in this process",
            hint="a process opens a store once: share the store object between services",
        )
    # What LMDB would map without checking: pages past the end of the
    # file are a SIGBUS, not an error.
    check_meta(data)
    if verify:
        verify_file(data)
    if in_use(path / "lock.mdb"):
        # Another process has the store open, so it is an LMDB store in
        # use: an unregistered read here could meet pages a writer is
        # recycling (and trip LMDB's own assertions). The format is
        # checked by the opening transaction instead, which writes
        # nothing when it refuses.
        return True
    # No process has the store open. Read what the file holds read-only
    # and without the lock file, so that opening a path that is not ours
    # changes no file at all. A process may open it meanwhile: a refusal
    # is only trusted when a second and third read agree.
    for _ in range(2):
        try:
            read_format(path)
            return False
        except (IncompatibleStoreError, lmdb.Error):
            pass
    read_format(path)  # the third read's refusal stands
    return False


def read_format(path: Path) -> None:
    try:
        env = open_adopting(str(path), readonly=True, lock=False, max_dbs=MAX_DBS)
    except lmdb.InvalidError as error:
        raise IncompatibleStoreError(
            f"{path} does not hold an LMDB store", hint="pick an empty directory"
        ) from error
    except (lmdb.Error, OSError) as error:
        raise open_failure(path, error) from error
    try:
        txn = begin_adopting(env)
        try:
            names = [key for key, _ in txn.cursor()]
            if names and b"meta" not in names:
                raise IncompatibleStoreError(
                    f"{path} holds another LMDB database",
                    hint="pick an empty or new directory",
                )
            if names:
                try:
                    meta = env.open_db(b"meta", txn=txn, create=False)
                except lmdb.IncompatibleError:
                    # A plain record named meta, not a database: a key
                    # store of an encrypted store has one.
                    raise IncompatibleStoreError(
                        f"{path} holds another LMDB database",
                        hint="pick an empty or new directory",
                    ) from None
                check_format(path, txn.get(FORMAT_KEY, db=meta))
        finally:
            txn.abort()
    except lmdb.Error as error:
        raise lmdb_failure(f"reading {path}", error) from error
    finally:
        env.close()


def check_store_files(path: Path, file_mode: int = 0o600, trust_directory: bool = False) -> None:
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
        raise open_failure(path, error) from error
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


def path_uri(path: str | os.PathLike[str]) -> str:
    """Return the ``lmdb://`` URI of a store directory, which ``open_store`` reads back.

    The absolute path, percent-quoted: a space, ``#``, ``?`` or ``%`` in a
    directory name would otherwise end the path or be read as an escape.
    """
    return "lmdb://" + quote(str(Path(path).resolve()))


def lmdb_failure(doing: str, error: lmdb.Error) -> StoreError:
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
    elif isinstance(error, lmdb.ReadonlyError) or errno_of(error) == errno.EROFS:
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


def errno_of(error: BaseException) -> int | None:
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


def open_failure(path: Path, error: BaseException) -> StoreError:
    """Return the error for a store that cannot be opened, with a hint for its cause."""
    code = errno_of(error)
    read_only = False
    with contextlib.suppress(OSError):
        probe = path if path.exists() else path.parent
        read_only = bool(os.statvfs(probe).f_flag & os.ST_RDONLY)
    if read_only or code == errno.EROFS:
        hint = "the filesystem is mounted read-only: open the store on a writable one"
    elif code in (errno.EACCES, errno.EPERM) or isinstance(error, lmdb.ReadonlyError):
        hint = "this user may not write the store's directory or files: check their owner and mode"
    elif code in (errno.ENOSPC, errno.EDQUOT):
        hint = "the disk is full: free space and open the store again"
    elif code == errno.EFBIG:
        hint = "a file size limit was reached (ulimit -f): raise it and open the store again"
    # py-lmdb refuses a second open of an environment with a plain lmdb.Error
    # and no code: its message is all there is to recognise it by.
    elif isinstance(error, lmdb.Error) and "already open" in str(error):
        if file_id(path / "data.mdb") in INHERITED:
            hint = (
                "this process inherited the store through fork(): open stores only after "
                "forking, or drop every inherited store object before opening it again"
            )
        else:
            hint = "a process opens a store once: share the store object between services"
    elif isinstance(error, lmdb.Error):
        return lmdb_failure(f"opening {path}", error)
    else:
        hint = "check the path, its permissions and the disk"
    failure = StoreError(f"cannot open {path}: {error}", hint=hint)
    failure.__cause__ = error
    return failure


def forked_error(path: Path) -> StoreError:
    return StoreError(
        f"the store at {path} was opened in another process and crossed a fork()",
        hint="open stores after forking: in each worker process, open its own store "
        "(multiprocessing: open it in the worker function, or use the spawn context)",
    )


def check_options(
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


# struct flock on Linux: type, whence, start, length, pid (with padding).
_FLOCK = struct.Struct("@hhqqi4x")


def lock_holder(fd: int, length: int = 0) -> int | None:
    """Return the pid of a process holding a lock on ``length`` bytes (0: all) of ``fd``.

    None when no process holds one. Asked with F_GETLK, which changes no lock
    and no byte; Linux only (the layout of the query), OSError where it fails.
    """
    answer = fcntl.fcntl(fd, fcntl.F_GETLK, _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, length, 0))
    kind, _, _, _, pid = _FLOCK.unpack(answer)
    return int(pid) if kind != fcntl.F_UNLCK else None


def in_use(lock_file: Path) -> bool:
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
        return lock_holder(fd) is not None
    except OSError:
        return True
    finally:
        os.close(fd)


def file_id(path: str | Path) -> tuple[int, int] | None:
    """Return which file a path names now (device, inode); None when there is none."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def reserve_lock_file(lock_file: Path, max_readers: int) -> None:
    """Reserve the disk blocks of a lock file LMDB is about to map; StoreError when none are left.

    LMDB sizes a new lock.mdb with ftruncate, which allocates nothing, and
    writes its lock table through a shared map: on a full disk the first
    write into a page without a block kills the process with SIGBUS. So the
    blocks are reserved first (``posix_fallocate``), and a full disk is an
    error. Called holding the writers' flock, before this process maps the
    file, and only while no other process has it open: the file is never
    touched under another process's map. It grows at most to a lower bound
    of the size LMDB gives it for ``max_readers`` (a larger file would hold
    more reader slots than asked), and a larger file keeps its size. Where
    the file system cannot reserve blocks, LMDB opens as before.
    """
    allocate = getattr(os, "posix_fallocate", None)
    if allocate is None or not sys.platform.startswith("linux"):
        return
    data = file_id(lock_file.parent / "data.mdb")
    if data is not None and data in OPEN_HERE:
        return  # open in this process, whose locks F_GETLK does not show
    try:
        fd = os.open(lock_file, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return  # LMDB opens it itself, and says why it cannot
    try:
        if lock_holder(fd) is not None:
            return
        size = max(os.fstat(fd).st_size, _LOCK_HEADER + (max_readers - 1) * _READER_LINE)
        allocate(fd, 0, size)
    except OSError as error:
        if error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            raise open_failure(lock_file.parent, error) from error
        # Unsupported here (EOPNOTSUPP, EINVAL): LMDB opens as before.
    finally:
        os.close(fd)


def open_adopting(path: str, **options: Any) -> Any:
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


def begin_adopting(env: Any) -> Any:
    """Begin a read transaction on an environment used while opening, adopting a grown map."""
    for _ in range(1000):
        try:
            return env.begin()
        except lmdb.MapResizedError:
            env.set_mapsize(0)
    return env.begin()


def check_meta(data: Path) -> None:
    """Refuse a data file shorter than its meta pages say, or whose meta pages are damaged.

    Cheap (a read-only open of two pages), so it runs at every open: LMDB maps the file
    and trusts these numbers, and a page past the end of the file is a
    SIGBUS, not an error. Another process may commit while the pages are
    read: a refusal stands only when three reads agree.
    """
    for attempt in range(3):
        try:
            read_meta(data)
            return
        except CorruptStoreError:
            if attempt == 2:
                raise


def read_meta(data: Path) -> None:
    # py-lmdb reads the meta pages: opened read-only and without the lock
    # file, it changes no file, and info() and stat() read nothing else. A
    # root page past the last one is LMDB's own PageNotFoundError later.
    try:
        size = os.stat(data).st_size
        env = open_adopting(str(data), subdir=False, readonly=True, lock=False)
    except OSError as error:
        raise open_failure(data.parent, error) from error
    except (lmdb.InvalidError, lmdb.VersionMismatchError, lmdb.CorruptedError) as error:
        raise CorruptStoreError(f"{data} has a damaged meta page: {error}") from error
    except lmdb.Error as error:
        raise open_failure(data.parent, error) from error
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


def verify_file(data: Path) -> None:
    """Check every page of a data file without handing it to LMDB; raise CorruptStoreError."""
    # Imported here: only a check needs it.
    import lmdb.verify as lmdb_verify

    try:
        problems: list[str] = lmdb_verify.verify(str(data), subdir=False)  # type: ignore[no-untyped-call]
    except lmdb_verify.VerifyError as error:
        raise CorruptStoreError(f"{data} cannot be verified: {error}") from error
    except OSError as error:
        raise open_failure(data.parent, error) from error
    if problems:
        shown = "; ".join(problems[:5])
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise CorruptStoreError(f"{data} failed verification: {shown}{more}")


def check_format(path: Path, header: bytes | None) -> int:
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
