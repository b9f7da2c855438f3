"""Create an output file safely: new, owner-only, never through a link, whole or not at all.

Every file the command line writes (a dump, a trace, a backup's data file)
is made here. The data goes into ``OUT.partial``, created exclusively
(``O_CREAT | O_EXCL | O_NOFOLLOW``, mode 0600, like a store's files), and is
linked to ``OUT`` once complete: a link never replaces an existing name, so
an existing ``OUT`` is refused rather than overwritten, and a planted
``OUT.partial`` (a link, a FIFO, another run's file) is refused rather than
followed or removed. The parent directory must exist: it is never created.
A destination inside a store's directory is refused: the directory of the
store being read, compared by device and inode so that neither a link nor
``..`` in the path gets past the check, and any directory holding an LMDB
``data.mdb`` or ``lock.mdb``.
On any failure the ``.partial`` this call created is removed, never another.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import BinaryIO

from ..errors import SessionscopeError

__all__ = [
    "OutputPathError",
    "check_output",
    "create_exclusive",
    "make_directory",
    "output_file",
    "publish",
    "remove_own",
]


class OutputPathError(SessionscopeError, ValueError):
    """An output path this command refuses to write: exists, is not a file, or has no parent."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        self.hint = hint
        super().__init__(f"{message} (hint: {hint})" if hint else message)


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a file"


def check_output(path: str | os.PathLike[str], protect: Iterable[Path] = ()) -> Path:
    """Return ``path`` if a new file may be written there; raise ``OutputPathError`` if not.

    ``protect`` names store directories: nothing is written into one of them.
    """
    target = Path(path)
    _check_parent(target, protect)
    try:
        info = os.lstat(target)
    except FileNotFoundError:
        return target
    except OSError as error:
        raise OutputPathError(f"{target}: {error.strerror}") from None
    if stat.S_ISREG(info.st_mode):
        raise OutputPathError(
            f"{target} exists", hint="remove it first, or pick a new name: nothing is overwritten"
        )
    raise OutputPathError(f"{target} is {_kind(info.st_mode)}", hint="give the path of a new file")


def make_directory(path: str | os.PathLike[str], protect: Iterable[Path] = ()) -> bool:
    """Make ``path`` a new owner-only directory, or accept an empty one; return whether made.

    Its parent must exist (it is never created); a link, a file or a
    directory that holds anything is refused, and so is a path inside one
    of the ``protect`` directories.
    """
    target = Path(path)
    _check_parent(target, protect)
    try:
        os.mkdir(target, 0o700)
        return True
    except FileExistsError:
        pass
    except OSError as error:
        raise OutputPathError(f"cannot create {target}: {error.strerror}") from None
    info = os.lstat(target)
    if not stat.S_ISDIR(info.st_mode):
        raise OutputPathError(
            f"{target} is {_kind(info.st_mode)}", hint="give a new or empty directory"
        )
    with os.scandir(target) as entries:
        if any(True for _ in entries):
            raise OutputPathError(
                f"{target} exists and is not empty", hint="give a new or empty directory"
            )
    return False


def _check_parent(target: Path, protect: Iterable[Path]) -> None:
    """Refuse a path whose directory is missing, not a directory, or a protected one."""
    parent = target.parent
    try:
        parent_info = os.stat(parent)
    except FileNotFoundError:
        raise OutputPathError(
            f"{parent} does not exist", hint="create the directory first, or pick another path"
        ) from None
    except OSError as error:
        raise OutputPathError(f"{parent}: {error.strerror}") from None
    if not stat.S_ISDIR(parent_info.st_mode):
        raise OutputPathError(f"{parent} is not a directory")
    for directory in protect:
        try:
            info = os.stat(directory)
        except OSError:
            continue
        if (info.st_dev, info.st_ino) == (parent_info.st_dev, parent_info.st_ino):
            raise OutputPathError(
                f"{target} is inside the store directory {directory}",
                hint="write the output outside the store's directory",
            )
    # Any LMDB store's directory, open in another process or not.
    for name in ("data.mdb", "lock.mdb"):
        if os.path.lexists(parent / name):
            raise OutputPathError(
                f"{target} is inside a store directory ({parent} holds {name})",
                hint="write the output outside the store's directory",
            )


def create_exclusive(path: Path) -> int:
    """Create a new owner-only file and return its descriptor; never follow a link."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    flags |= getattr(os, "O_CLOEXEC", 0)
    try:
        return os.open(path, flags, 0o600)
    except FileExistsError:
        raise OutputPathError(
            f"{path} exists (another run writing, or one that was interrupted)",
            hint="make sure no other run writes it, then remove it",
        ) from None
    except OSError as error:
        raise OutputPathError(f"cannot create {path}: {error.strerror}") from None


@contextmanager
def output_file(path: str | os.PathLike[str], protect: Iterable[Path] = ()) -> Iterator[BinaryIO]:
    """Yield a binary file that becomes ``path`` once the block ends without an error.

    Written to ``path.partial`` first (created exclusively, mode 0600); on
    success it is synced and linked to ``path`` (which must still not
    exist), on failure removed.
    """
    target = check_output(path, protect)
    partial = target.with_name(target.name + ".partial")
    fd = create_exclusive(partial)
    created = os.fstat(fd)
    file = os.fdopen(fd, "wb")
    try:
        yield file
        file.flush()
        os.fsync(file.fileno())
        file.close()
        publish(partial, target)
    except BaseException:
        # Closing flushes what is buffered: after a failed write (a full
        # disk) it fails again, and the partial file must still go.
        with suppress(OSError):
            file.close()
        remove_own(partial, created)
        raise


def publish(partial: Path, target: Path) -> None:
    """Give the finished ``partial`` the name ``target``, which must not exist.

    A hard link never replaces an existing name: a file that appeared at
    ``target`` meanwhile (another run's) is refused, never overwritten, and
    ``partial`` is left for the caller to remove.
    """
    try:
        # A hard link fails on an existing name: no race replaces a file
        # that appeared meanwhile.
        os.link(partial, target, follow_symlinks=False)
    except FileExistsError:
        raise OutputPathError(
            f"{target} appeared while it was written",
            hint="pick a new name: nothing is overwritten",
        ) from None
    except OSError:
        # A file system without hard links: rename, after a last check.
        if os.path.lexists(target):
            raise OutputPathError(f"{target} appeared while it was written") from None
        os.rename(partial, target)
        return
    os.unlink(partial)


def remove_own(path: Path, created: os.stat_result) -> None:
    """Remove ``path`` only if it is still the file this process created."""
    try:
        info = os.lstat(path)
    except OSError:
        return
    if (info.st_dev, info.st_ino) == (created.st_dev, created.st_ino):
        os.unlink(path)
