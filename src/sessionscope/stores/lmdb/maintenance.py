"""What the command line does to an LMDB store beyond the Store protocol.

Checking (``verify``: every page of the file; ``check_layout``: every key
against its session record), measuring (``stat``, ``space``), copying
(``copy_to``), and the commands that need the store to themselves
(``compact``, ``upgrade``), which hold LMDB's lock exclusively
(``sole_user``). None of it is on the path of a session call; each reads in
one transaction of the store's ``Writer``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import sys
from array import array
from bisect import bisect_left
from collections.abc import Callable, Iterator
from itertools import pairwise
from pathlib import Path
from stat import S_ISDIR, S_ISREG
from typing import TYPE_CHECKING, Any

import lmdb

from ...admin.outfile import create_exclusive, remove_own
from ...admin.outfile import publish as publish_file
from ...codec import decode_event
from ...errors import IncompatibleStoreError, StoreError, UnsafeStoreError
from ..records import SessionRecord
from .layout import (
    EVENT,
    EVENT_ID,
    EVENT_TIME,
    F64,
    FORMAT_KEY,
    FORMAT_VERSION,
    LISTING,
    MAX_DBS,
    NUMBER_KEY,
    PURGE,
    STATE,
    U64,
    Databases,
    after,
    decode_record,
    encode_record,
    format_record,
    list_key,
    part,
    sortable_time,
    unique_part,
)
from .opening import (
    check_format,
    check_store_files,
    lmdb_failure,
    lock_holder,
    open_failure,
    path_uri,
    probe,
    verify_file,
)

if TYPE_CHECKING:
    from .writer import Writer

__all__ = [
    "PARTIAL_COPY",
    "check_layout",
    "compact",
    "compact_directory",
    "copy_to",
    "publish",
    "sole_user",
    "space",
    "stat",
    "upgrade",
    "verify",
]


def verify(writer: Writer) -> None:
    """Check every page of the store's data file; raise CorruptStoreError if one is wrong.

    The check reads the file, never through LMDB, while holding the
    store's write lock, so that no process commits while it reads: other
    writers wait for it (2.5 s for a 1 GB store, measured).
    """
    writer.check_open()
    try:
        with writer.writer_lock, writer.gate:
            txn = writer.begin(write=True)
            try:
                verify_file(writer.path / "data.mdb")
            finally:
                txn.abort()
    except lmdb.Error as error:
        raise lmdb_failure(f"verifying {writer.path}", error) from error


def stat(writer: Writer) -> dict[str, Any]:
    """Return LMDB's figures: map size, pages used, last transaction, entries per database."""

    def gather(txn: Any) -> dict[str, Any]:
        info = writer.env.info()
        return {
            "map_size": info["map_size"],
            "last_pgno": info["last_pgno"],
            "last_txnid": info["last_txnid"],
            "entries": {
                name.decode(): txn.stat(handle)["entries"] for name, handle in writer.dbs.items()
            },
        }

    return writer.read(gather)


def check_layout(writer: Writer, progress: Callable[[int, int], None] | None = None) -> list[str]:
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
        dbs = writer.dbs
        meta = dbs.meta
        (next_number,) = U64.unpack(txn.get(NUMBER_KEY, db=meta))
        # Numbers queued for purging lost their record on purpose.
        purging: set[bytes] = set()
        queue = txn.cursor(db=meta)
        if queue.set_range(PURGE):
            for key in queue.iternext(values=False):
                if not key.startswith(PURGE):
                    break
                purging.add(key[len(PURGE) :])
        total = txn.stat(dbs.sessions)["entries"]
        numbers = array("Q")
        data = txn.cursor(db=dbs.data)
        lookup = txn.cursor(db=dbs.data)
        for done, (key, value) in enumerate(txn.cursor(db=dbs.sessions), start=1):
            record = decode_record(value)
            label = _label(record)
            ids = (record.app_name, record.user_id, record.session_id)
            if key != b"".join(part(text) for text in ids):
                problems.append(f"{label}: its record is stored under another session's key")
            if record.number >= next_number:
                problems.append(f"{label}: number {record.number} is not below the counter")
            numbers.append(record.number)
            if dbs.listing is not None and txn.get(list_key(record), db=dbs.listing) != key:
                problems.append(f"{label}: missing from the list index")
            number = U64.pack(record.number)
            if number not in purging:
                _check_group(data, lookup, number, record, problems, dbs.format)
            if progress is not None:
                progress(done, total)
        numbers = array("Q", sorted(numbers))
        for previous, following in pairwise(numbers):
            if previous == following:
                problems.append(f"number {following} is shared by two session records")
        if dbs.listing is not None:
            _check_listing(dbs, txn, problems)
        _check_orphans(data, numbers, purging, problems)
        if progress is not None:
            progress(total, total)
        return problems

    return writer.read(check)


def _check_listing(dbs: Databases, txn: Any, problems: list[str]) -> None:
    """Check that every list index entry names a record listed at that entry."""
    for key, value in txn.cursor(db=dbs.listing):
        stored = txn.get(value, db=dbs.sessions)
        if stored is None or list_key(decode_record(stored)) != key:
            problems.append(
                f"a list index entry (time and number {key[-16:].hex()}) names no session "
                "of that time"
            )


def _check_orphans(
    data: Any, numbers: array[int], purging: set[bytes], problems: list[str]
) -> None:
    """Report data under a number no record has (and no purge is queued for)."""
    positioned = data.first()
    while positioned:
        number = data.key()[:8]
        (value,) = U64.unpack(number)
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
        following = after(number)
        positioned = following is not None and data.set_range(following)


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
    event_prefix = number + EVENT
    positioned = data.set_range(number)
    while positioned and data.key().startswith(number):
        key, value = data.item()
        found_any = True
        kind = key[8:9]
        if kind == EVENT:
            stored += 1
            seq = key[9:17]
            position = U64.unpack(seq)[0]
            if position >= record.event_count:
                problems.append(f"{label}: event {position} lies past the record's count")
            stamp = sortable_time(F64.unpack_from(value)[0])
            if not timed and stamp < previous:
                problems.append(f"{label}: event {position} is earlier than the one before it")
            previous = stamp
            try:
                id_part = unique_part(decode_event(value[8:])["id"])
            except Exception as error:  # any undecodable record is a finding
                problems.append(
                    f"{label}: event {position} does not decode: {_without_hint(error)}"
                )
                positioned = data.next()
                continue
            if position == record.event_count - 1:
                last_id = id_part
            if lookup.get(number + EVENT_ID + id_part) != seq:
                problems.append(f"{label}: event {position} is missing from the id index")
            if timed and not lookup.set_key(number + EVENT_TIME + stamp + seq):
                problems.append(f"{label}: event {position} is missing from the time index")
        elif kind == EVENT_ID:
            event = lookup.get(event_prefix + value)
            if event is None:
                problems.append(f"{label}: an id index entry points at no event with that id")
            else:
                try:
                    event_id = decode_event(event[8:])["id"]
                except Exception:  # reported where the event itself is checked
                    event_id = None
                if event_id is not None and unique_part(event_id) != key[9:]:
                    problems.append(f"{label}: an id index entry points at no event with that id")
        elif kind == EVENT_TIME:
            times += 1
            event = lookup.get(event_prefix + key[17:25])
            if event is None or sortable_time(F64.unpack_from(event)[0]) != key[9:17]:
                problems.append(f"{label}: a time index entry points at no event of that time")
        elif kind != STATE:
            problems.append(f"{label}: an entry of unknown kind {kind!r}")
        positioned = data.next()
    if not timed and times:
        problems.append(f"{label}: {times} time index entries, but it keeps no time index")
    counted = record.stored_count
    if not found_any and counted:
        problems.append(f"{label}: counts {counted} events, stores none")
    elif stored != counted:
        problems.append(f"{label}: counts {counted} events, stores {stored}")
    if last_id is not None and last_id != unique_part(record.last_event_id or ""):
        problems.append(f"{label}: the record's last event id is not its last event's")


def space(writer: Writer) -> dict[str, int]:
    """Return the file's size and how its pages are used.

    ``free_pages`` counts the pages up to the last one in use that no
    database holds: LMDB's free list (pages released by deletes and by
    copy-on-write, which later writes reuse before the file grows) and
    the pages of the list itself. A compaction leaves none.
    """

    def gather(txn: Any) -> dict[str, int]:
        info = writer.env.info()
        main = writer.env.stat()
        used = _pages(main) + sum(
            _pages(txn.stat(handle)) for handle in (handle for _, handle in writer.dbs.items())
        )
        pages = info["last_pgno"] + 1
        return {
            "file_size": (writer.path / "data.mdb").stat().st_size,
            "map_size": info["map_size"],
            "page_size": main["psize"],
            "pages": pages,
            "pages_used": used,
            # Pages 0 and 1 are LMDB's two meta pages.
            "free_pages": max(0, pages - 2 - used),
            "readers": info["num_readers"],
        }

    return writer.read(gather)


def copy_to(writer: Writer, dest: str | os.PathLike[str]) -> None:
    """Write a consistent, compacted copy of the store into the empty directory ``dest``.

    The copy is of one read snapshot, so writers in this or other
    processes go on meanwhile; it holds no free pages. It is written to
    ``data.mdb.partial``, created exclusively (an existing file or a planted
    link there is an ``OutputPathError``), synced, and only then linked to
    ``data.mdb``, which must not exist: a copy cut short by a crash or a kill
    never has the name of a store. A copy that fails is removed again (only
    the file this call created).
    """
    target = Path(dest) / "data.mdb"
    partial = target.with_name(PARTIAL_COPY)
    # Created here, owner-only, exclusively and never through a link,
    # then filled by LMDB through the descriptor.
    fd = create_exclusive(partial)
    made = os.fstat(fd)
    try:
        try:
            with writer.gate:
                txn = writer.begin()
                try:
                    writer.env.copyfd(fd, compact=True, txn=txn)
                finally:
                    txn.abort()
        except lmdb.Error as error:
            raise lmdb_failure("copying the store", error) from error
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        remove_own(partial, made)
        raise
    os.close(fd)
    try:
        publish(partial, target)
    except BaseException:
        remove_own(partial, made)
        raise


# The name a copy is written under until it is whole.
PARTIAL_COPY = "data.mdb.partial"


def publish(source: Path, target: Path) -> None:
    """Move the file ``source`` to ``target``, which must not exist, durably.

    As ``outfile.publish`` (a file that appeared at ``target`` meanwhile is
    refused, never overwritten, and ``source`` left for the caller to
    remove), then the directory synced, so that the name survives a crash.
    """
    publish_file(source, target)
    _fsync(target.parent)


def compact(
    path: str | os.PathLike[str],
    check: Callable[[Path], None],
    *,
    file_mode: int = 0o600,
    trust_directory: bool = False,
) -> tuple[int, int]:
    """Rewrite a store no process has open without free pages; return sizes before, after.

    The store is copied with compaction into the sibling directory
    ``.NAME.compact`` (``compact_directory``), the copy is checked with
    ``check(directory)`` (which raises to refuse it), and its file then
    replaces ``data.mdb`` by one rename: at every moment the path holds the
    old file or the new one, whole. That directory is made and removed only
    under the lock below, so one found there when it is taken was left by a
    compact that was killed: it is removed first (holding only the files
    compact writes, never through a link; anything else there is refused
    with a ``StoreError``). Meanwhile LMDB's
    lock on ``lock.mdb`` is held exclusively, so no process opens the
    store; one that waited for it meets an emptied lock file and fails to
    open rather than read the new file with the old file's reader table.
    """
    root = Path(path)
    data = root / "data.mdb"
    # What opening checks, first: no file is opened through a link, a FIFO or a device.
    check_store_files(root, file_mode, trust_directory)
    if not data.is_file():
        raise IncompatibleStoreError(f"{root} holds no store", hint="give a store's directory")
    probe(root)
    with sole_user(root, "compact"):
        before = data.stat().st_size
        temp = compact_directory(root)
        # The lock makes the name this call's: one left there was a compact's
        # that was killed, and goes before the copy is made again.
        _remove_stale_copy(temp)
        os.mkdir(temp, 0o700)
        try:
            env = lmdb.open(str(root), readonly=True, lock=False, max_dbs=MAX_DBS)
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
            raise lmdb_failure("compacting the store", error) from error
        finally:
            # Left there on a failure here, it goes at the next compact.
            with contextlib.suppress(OSError, StoreError):
                _remove_stale_copy(temp)
        return before, data.stat().st_size


def compact_directory(root: Path) -> Path:
    """Return where ``compact`` writes its copy of the store at ``root``: ``.NAME.compact``.

    A sibling of the store, made and removed only while compact holds the
    store's lock exclusively.
    """
    return root.parent / f".{root.name}.compact"


# What compact writes into its directory: the copy, and the lock file of checking it.
_COMPACT_FILES = frozenset({"data.mdb", "lock.mdb"})


def _remove_stale_copy(temp: Path) -> None:
    """Remove compact's directory and the files compact writes there; refuse anything else.

    Called with the store's lock held exclusively. Nothing is followed: a
    link at the directory's name, or anything in it but plain files named
    as compact names them, is left alone and refused.
    """
    try:
        info = os.lstat(temp)
    except FileNotFoundError:
        return
    refusal = StoreError(
        f"{temp} is not what compact leaves behind",
        hint="compact writes its copy there: move it away, then run compact again",
    )
    if not S_ISDIR(info.st_mode):
        raise refusal
    with os.scandir(temp) as listing:
        entries = list(listing)
    for entry in entries:
        if entry.name not in _COMPACT_FILES or not entry.is_file(follow_symlinks=False):
            raise refusal
    for entry in entries:
        os.unlink(entry.path)
    os.rmdir(temp)


def upgrade(
    path: str | os.PathLike[str], *, file_mode: int = 0o600, trust_directory: bool = False
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
    check_store_files(root, file_mode, trust_directory)
    if not (root / "data.mdb").is_file():
        raise IncompatibleStoreError(f"{root} holds no store", hint="give a store's directory")
    probe(root)
    with sole_user(root, "upgrade"):
        try:
            env = lmdb.open(str(root), lock=False, max_dbs=MAX_DBS)
            try:
                with env.begin() as txn:
                    meta = env.open_db(b"meta", txn=txn, create=False)
                    version = check_format(root, txn.get(FORMAT_KEY, db=meta))
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
            raise lmdb_failure(f"upgrading {root}", error) from error
    return version


def _upgrade_to_2(env: Any) -> None:
    """Add the list index to a format-1 store and mark it format 2, in one transaction."""
    with env.begin(write=True) as txn:
        meta = env.open_db(b"meta", txn=txn, create=False)
        sessions = env.open_db(b"sessions", txn=txn, create=False)
        listing = env.open_db(LISTING, txn=txn)
        for key, value in list(txn.cursor(db=sessions)):
            record = decode_record(value)
            record.time_indexed = True
            txn.put(key, encode_record(record), db=sessions)
            txn.put(list_key(record), key, db=listing)
        txn.put(FORMAT_KEY, format_record(2), db=meta)


def _label(record: SessionRecord) -> str:
    return f"session {record.app_name}/{record.user_id}/{record.session_id}"


def _without_hint(error: BaseException) -> str:
    """Return an error's message without its hint: a report of problems gives one hint."""
    text, hint = str(error), getattr(error, "hint", None)
    suffix = f" (hint: {hint})"
    return text[: -len(suffix)] if hint and text.endswith(suffix) else text


def _pages(figures: Any) -> int:
    return int(figures["branch_pages"] + figures["leaf_pages"] + figures["overflow_pages"])


def _fsync(path: Path) -> None:
    """Make a file, or a directory's entries, durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def sole_user(path: Path, command: str) -> Iterator[None]:
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
        raise open_failure(path, error) from error
    try:
        if not S_ISREG(os.fstat(fd).st_mode):
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
    try:
        return lock_holder(fd, 1)
    except OSError:
        return None
