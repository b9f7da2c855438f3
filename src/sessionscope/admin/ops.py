"""Operations on a whole store: open one that exists, list, describe, measure, check, copy.

What the command line runs, kept apart from how it prints. Everything here
goes through the Store protocol, and through an LMDB store's own operations
(``verify``, ``check_layout``, ``space``, ``copy_to``, ``compact``) only
where the question is about its file.
"""

from __future__ import annotations

import base64
import contextlib
import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..codec import decode_event, pack
from ..errors import (
    CorruptStoreError,
    EncryptionKeyError,
    RotationUnfinishedError,
    SessionscopeError,
    StoreError,
    StoreNotFoundError,
)
from ..stores import LmdbStore, Store, open_store, redact
from ..stores.lmdb.maintenance import PARTIAL_COPY, publish
from ..stores.lmdb.opening import open_failure
from ..stores.lmdb.store import path_uri
from ..stores.records import ListPosition, SessionRecord
from ..stores.rules import list_position
from ..stores.uri import SCHEMES, lmdb_path, query_pairs
from .outfile import OutputPathError, make_directory, remove_own

__all__ = [
    "CheckReport",
    "MissingStoreError",
    "SessionChangedError",
    "backup",
    "check_store",
    "compact",
    "describe_event",
    "event_pages",
    "file_options",
    "jsonable",
    "list_apps",
    "list_users",
    "lmdb_path",
    "open_existing",
    "reason",
    "session_page",
    "session_records",
    "store_stats",
]

# progress(done, total): how far a long operation is.
ProgressFn = Callable[[int, int], None]


class MissingStoreError(SessionscopeError, ValueError):
    """A command that reads a store was given a path that holds none."""


def file_options(uri: str) -> dict[str, Any]:
    """Return the ``file_mode`` and ``trust_directory`` an ``lmdb://`` URI's query gives.

    What compact and upgrade check a store's directory and files with, as
    opening the store would. A malformed value is a ``ValueError``.
    """
    readers = SCHEMES["lmdb"][1]
    options: dict[str, Any] = {}
    for name, text in query_pairs(uri):
        if name in ("file_mode", "trust_directory"):
            try:
                options[name] = readers[name](text)
            except ValueError:
                raise ValueError(f"lmdb:// option {name}={text!r} is malformed") from None
    return options


def open_existing(uri: str, **options: Any) -> Store:
    """Open the store a URI names, refusing a path that holds no store (nothing is created).

    ``options`` override those of the URI's query, as for ``open_store``.
    """
    path = lmdb_path(uri)
    if path is not None and path.parts:
        try:
            found = (path / "data.mdb").is_file()
            what = "does not exist" if not path.exists() else "holds no store"
        except OSError as error:  # a directory this user may not read
            raise open_failure(path, error) from error
        if not found:
            raise MissingStoreError(f"{uri}: {path} {what}")
    try:
        # A Redis prefix without a store is refused there, before anything is written.
        return open_store(uri, create=False, **options)
    except StoreNotFoundError as error:
        raise MissingStoreError(f"{redact(uri)}: {error}") from None


def list_apps(store: Store) -> list[str]:
    """Return the store's app names, sorted."""
    return store.list_apps()


def list_users(store: Store, app_name: str) -> list[str]:
    """Return an app's user ids, sorted."""
    return store.list_users(app_name)


def session_page(
    store: Store, app_name: str, user_id: str | None, limit: int | None, cursor: str | None
) -> tuple[list[dict[str, Any]], str | None]:
    """Return one page of an app's (or user's) sessions with their sizes, and the next cursor.

    The page is the service's listing page (least recently active first);
    a session's size is its events' and its own state's stored bytes.
    """
    from ..service.paging import check_page, cursor_position, page_of

    check_page(limit, cursor)
    records, more = store.list_page(app_name, user_id, limit, cursor_position(cursor))
    page = page_of(records, more)
    by_ids = {(r.user_id, r.session_id): r for r in records}
    rows = []
    for meta in page.sessions:
        record = by_ids[(meta.user_id, meta.id)]
        rows.append(
            {
                "app": app_name,
                "user": meta.user_id,
                "session": meta.id,
                "events": record.stored_count,
                "bytes": _session_bytes(store, record),
                "created": meta.create_time,
                "last_update": meta.last_update_time,
            }
        )
    return rows, page.next_cursor


def _map_bytes(values: dict[str, Any]) -> int:
    return sum(len(key.encode()) + len(pack(value)) for key, value in values.items())


def _session_bytes(store: Store, record: SessionRecord) -> int:
    """Return a session's events' and own state's stored bytes, read a page at a time."""
    head = store.load_session(record.app_name, record.user_id, record.session_id, 0, None)
    if head is None:  # deleted since the listing
        return 0
    total = _map_bytes(head.session_state)
    try:
        for events in event_pages(store, head.record):
            total += sum(map(len, events))
    except SessionChangedError:
        pass  # a size of what was read: the session moved on meanwhile
    return total


# -- reading a store in bounded memory ----------------------------------------------

# Events read at a time from one session, and sessions listed at a time: what
# the commands hold at once, however large the store.
EVENT_PAGE = 1000
SESSION_PAGE = 1000


class SessionChangedError(StoreError):
    """A session was deleted, created again or truncated while it was read page by page."""


def session_records(
    store: Store, app_name: str, user_id: str | None = None
) -> Iterator[SessionRecord]:
    """Yield an app's (or one user's) session records a page at a time, in listing order.

    A session written to while the listing goes on moves later in the
    order and may be yielded twice: figures summed over a store that
    writers change are those of no single moment.
    """
    after: ListPosition | None = None
    while True:
        records, more = store.list_page(app_name, user_id, SESSION_PAGE, after)
        yield from records
        if not more or not records:
            return
        after = list_position(records[-1])


def event_pages(store: Store, record: SessionRecord) -> Iterator[list[bytes]]:
    """Yield the events ``record`` counts (the session as listed), ``EVENT_PAGE`` at a time.

    Events appended since the record was read are left out (``Store.read_events``
    reads each page). Raise ``SessionChangedError`` if the session was deleted, created
    again or truncated meanwhile.
    """
    ids = (record.app_name, record.user_id, record.session_id)
    # From position 0: a truncation by time may keep early positions (gaps
    # anywhere), and a paged read skips the gaps itself.
    start = 0
    while start < record.event_count:
        read = store.read_events(*ids, start, EVENT_PAGE)
        if read is None or read[0].number != record.number:
            raise SessionChangedError(f"session {'/'.join(ids)} was deleted while it was read")
        now, pairs = read
        if now.removed_count != record.removed_count:
            raise SessionChangedError(f"session {'/'.join(ids)} was truncated while it was read")
        events = [data for position, data in pairs if position < record.event_count]
        if events:
            yield events
        if len(events) < len(pairs) or len(pairs) < EVENT_PAGE:
            return
        start = pairs[-1][0] + 1


def jsonable(value: Any) -> Any:
    """Return a value JSON can carry: bytes as ``{"base64": ...}``, NaN and infinities as text."""
    if isinstance(value, bytes):
        return {"base64": base64.b64encode(value).decode("ascii")}
    if isinstance(value, dict):
        return {str(key): jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def describe_event(record: bytes) -> dict[str, Any]:
    """Return what a person reads of a stored event: who, when, a one-line summary, and all of it.

    Works for events stored by the native service and by the google-adk
    drop-in (whose fields are spelled in camelCase).
    """
    fields = decode_event(record)
    actions = fields.get("actions") or {}
    delta = actions.get("state_delta", actions.get("stateDelta")) or {}
    return {
        "id": fields.get("id"),
        "timestamp": fields.get("timestamp"),
        "author": fields.get("author", ""),
        "summary": _summary(fields.get("content")),
        "state_delta": sorted(delta),
        "record": fields,
    }


def _summary(content: Any, limit: int = 120) -> str:
    """Return a line saying what an event's content holds: text, calls, responses, data."""
    if content is None:
        return ""
    if isinstance(content, str):
        text = content
    elif isinstance(content, dict) and isinstance(content.get("parts"), list):
        pieces = []
        for part in content["parts"]:
            if not isinstance(part, dict):
                pieces.append(str(part))
                continue
            call = part.get("function_call") or part.get("functionCall")
            answer = part.get("function_response") or part.get("functionResponse")
            blob = part.get("inline_data") or part.get("inlineData")
            if part.get("text"):
                pieces.append(str(part["text"]))
            elif isinstance(call, dict):
                pieces.append(f"call {call.get('name')}({_short(call.get('args'))})")
            elif isinstance(answer, dict):
                pieces.append(f"response {answer.get('name')}: {_short(answer.get('response'))}")
            elif isinstance(blob, dict):
                data = blob.get("data")
                size = len(data) if isinstance(data, bytes | str) else 0
                kind = blob.get("mime_type") or blob.get("mimeType")
                pieces.append(f"[{kind} {size} bytes]")
            else:
                pieces.append(_short(part))
        text = " | ".join(pieces)
    else:
        text = _short(content)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _short(value: Any) -> str:
    import json

    return json.dumps(jsonable(value), ensure_ascii=False, separators=(",", ":"), default=str)


# -- stats -------------------------------------------------------------------------


def store_stats(store: Store, progress: ProgressFn | None = None) -> dict[str, Any]:
    """Return sessions, events and bytes per app and per scope, and the file's figures.

    Bytes are the stored sizes of keys and packed values, summed by scope:
    app state, user state, session state, and events.
    """
    apps: dict[str, dict[str, int]] = {}
    names = list_apps(store)
    for done, app in enumerate(names):
        entry = apps[app] = {
            "sessions": 0,
            "events": 0,
            "app_state_bytes": _map_bytes(store.read_app_state(app)),
            "user_state_bytes": 0,
            "session_state_bytes": 0,
            "event_bytes": 0,
        }
        for user in list_users(store, app):
            entry["user_state_bytes"] += _map_bytes(store.read_user_state(app, user))
        for record in session_records(store, app):
            # The record and state only; then the events a page at a time.
            head = store.load_session(app, record.user_id, record.session_id, 0, None)
            if head is None:  # deleted since the listing
                continue
            count = size = 0
            try:
                for events in event_pages(store, head.record):
                    count += len(events)
                    size += sum(map(len, events))
            except SessionChangedError:
                continue  # deleted or cut meanwhile: counted as gone
            entry["sessions"] += 1
            entry["events"] += count
            entry["event_bytes"] += size
            entry["session_state_bytes"] += _map_bytes(head.session_state)
        if progress is not None:
            progress(done + 1, len(names))
    scopes = ("app_state_bytes", "user_state_bytes", "session_state_bytes", "event_bytes")
    totals = {
        "apps": len(apps),
        "sessions": sum(a["sessions"] for a in apps.values()),
        "events": sum(a["events"] for a in apps.values()),
        **{scope: sum(a[scope] for a in apps.values()) for scope in scopes},
    }
    result: dict[str, Any] = {"totals": totals, "apps": apps}
    lmdb = lmdb_below(store)
    if lmdb is not None:
        result["file"] = lmdb.space()
    return result


def lmdb_below(store: Store) -> LmdbStore | None:
    """Return the LMDB store a store is, or holds its data in (an encrypted one's), else None."""
    below = store if isinstance(store, LmdbStore) else getattr(store, "raw", None)
    return below if isinstance(below, LmdbStore) else None


# -- verify ------------------------------------------------------------------------


# What to do about any problem verify finds: said once, after the list.
VERIFY_HINT = (
    "restore the store from a backup (`sessionscope backup` makes one), or delete the "
    "sessions named above; then run `sessionscope verify` again"
)


@dataclass
class CheckReport:
    """What a check of a store found: an empty ``problems`` means clean."""

    structural: str = "skipped"
    sessions: int = 0
    events: int = 0
    problems: list[str] = field(default_factory=list)
    # Sessions that cannot be read until an unfinished key rotation is run
    # again: one finding with its own hint, never one per session.
    unrotated: int = 0
    rotation: EncryptionKeyError | None = None

    @property
    def clean(self) -> bool:
        """Tell whether the check found nothing wrong."""
        return not self.problems and self.rotation is None

    @property
    def findings(self) -> list[str]:
        """Return every problem, an unfinished key rotation first (as one finding)."""
        if self.rotation is None:
            return list(self.problems)
        what = "session cannot" if self.unrotated == 1 else "sessions cannot"
        found = f"{self.unrotated:,} {what} be read until the key rotation is finished"
        return [f"{found}: {reason(self.rotation)}", *self.problems]

    @property
    def hint(self) -> str | None:
        """Return what to do about the findings: finish a rotation first, then the rest."""
        hints = []
        if self.rotation is not None:
            hints.append(self.rotation.hint or ROTATION_HINT)
        if self.problems:
            hints.append(VERIFY_HINT)
        return "; then ".join(hints) or None

    def add(self, problem: str) -> None:
        """Record a problem once: two checks that meet the same damage list it once."""
        if problem not in self.problems:
            self.problems.append(problem)

    def to_dict(self) -> dict[str, Any]:
        """Return the report as a JSON-ready map."""
        return {
            "clean": self.clean,
            "structural": self.structural,
            "sessions": self.sessions,
            "events": self.events,
            "problems": self.findings,
            "hint": self.hint,
        }


# What an unfinished key rotation asks for, where its error gives no hint.
ROTATION_HINT = "a key rotation is unfinished: run `sessionscope rotate-key` again"


def unfinished_rotation(error: BaseException) -> bool:
    """Tell whether an error says a key rotation is unfinished (rerunning it is the cure)."""
    return isinstance(error, RotationUnfinishedError)


def reason(error: BaseException) -> str:
    """Return what an error says without its hint: a report gives one hint for every problem."""
    text = str(error)
    hint = getattr(error, "hint", None)
    suffix = f" (hint: {hint})"
    return text[: -len(suffix)] if hint and text.endswith(suffix) else text


def check_store(store: Store, progress: ProgressFn | None = None) -> CheckReport:
    """Check a store's structure (where it can tell) and its logic; return what was found.

    Logic: every listed session reads back, its events decode, their ids are
    distinct and their number is the one its record counts; on LMDB, the key
    layout's own invariants (``LmdbStore.check_layout``), which cover the
    events, instead. Sessions are listed and events read a page at a time.
    """
    report = CheckReport()
    # An encrypted store's file is checked below it; its sessions through it,
    # so that every record is also authenticated.
    lmdb = lmdb_below(store)
    if lmdb is not None:
        try:
            lmdb.verify()
            report.structural = "ok"
        except CorruptStoreError as error:
            report.structural = "failed"
            report.add(f"structure: {reason(error)}")
            return report
    apps = list_apps(store)
    # On LMDB the layout check reads every event, and reports the progress.
    each = None if isinstance(store, LmdbStore) else progress
    # A first pass over the records alone, for the progress bar's total.
    total = sum(1 for app in apps for _ in session_records(store, app)) if each else 0
    done = 0
    for app in apps:
        for record in session_records(store, app):
            _check_session(store, record, report)
            done += 1
            if each is not None:
                each(done, max(total, done))
    if lmdb is not None:
        for problem in lmdb.check_layout(None if each is not None else progress):
            report.add(problem)
    return report


def _check_session(store: Store, record: SessionRecord, report: CheckReport) -> None:
    label = f"session {record.app_name}/{record.user_id}/{record.session_id}"
    ids = (record.app_name, record.user_id, record.session_id)
    try:
        head = store.load_session(*ids, 0, None)
    except EncryptionKeyError as error:
        if not unfinished_rotation(error):
            report.add(f"{label}: cannot be read: {reason(error)}")
            return
        report.unrotated += 1
        if report.rotation is None:
            report.rotation = error
        return
    except SessionscopeError as error:
        report.add(f"{label}: cannot be read: {reason(error)}")
        return
    if head is None:
        return  # deleted since the listing
    report.sessions += 1
    if isinstance(store, LmdbStore):
        # check_layout reads, decodes and counts every event entry.
        report.events += head.record.stored_count
        return
    read = 0
    seen: set[str] = set()
    try:
        for events in event_pages(store, head.record):
            for data in events:
                position = read
                read += 1
                try:
                    event_id = decode_event(data)["id"]
                except Exception as error:  # any undecodable record is a finding
                    report.add(f"{label}: event {position} does not decode: {reason(error)}")
                    continue
                if event_id in seen:
                    report.add(f"{label}: event id {event_id!r} is stored twice")
                seen.add(event_id)
    except SessionChangedError:
        return  # changed while checked: what was read is no finding
    except SessionscopeError as error:
        report.add(f"{label}: cannot be read: {reason(error)}")
        return
    report.events += read
    if read != head.record.stored_count:
        report.add(f"{label}: counts {head.record.stored_count} events, reads {read}")


def _check_copy(directory: Path) -> CheckReport:
    """Open a copy of a store and check it; raise if it is not clean."""
    # Its structure is checked, never a value: an encrypted store's copy too.
    copy = LmdbStore(directory, encrypted_ok=True)
    try:
        report = check_store(copy)
    finally:
        copy.close()
    if not report.clean:
        shown = "; ".join(report.findings[:5])
        raise StoreError(
            f"the copy in {directory} did not verify: {shown}",
            hint="the original is untouched: run `sessionscope verify` on it",
        )
    return report


# -- backup and compaction ---------------------------------------------------------


# The directory inside a backup's destination where the copy is made and
# checked; the copy's data.mdb gets its name in the destination once verified.
BACKUP_PARTIAL = "backup.partial"


def backup(store: Store, dest: Path) -> dict[str, Any]:
    """Copy a live store into the new or empty directory ``dest``, then check the copy.

    ``store`` is an LMDB store, or an encrypted one over an LMDB store,
    whose copy holds the ciphertext its file holds (anything else is a
    ``StoreError``, before ``dest`` is touched).

    ``dest`` is made owner-only (an empty one given keeps its mode; the
    files are owner-only) in a directory that must exist; a link, a
    file, a directory that holds anything, or a path inside the store's own
    directory is refused (``OutputPathError``). The copy is made and
    verified in ``dest/backup.partial/`` and its ``data.mdb`` gets its name
    in ``dest`` only then: a backup killed at any point leaves no store
    under ``dest`` that was not verified. A copy that fails or does not
    verify is removed again (only the files this call made), with the
    directory if this call made it.
    """
    below = lmdb_below(store)
    if below is None:
        raise StoreError(f"backup copies LMDB stores, not {type(store).__name__}")
    created = make_directory(dest, [below.path])
    started = time.perf_counter()
    work = dest / BACKUP_PARTIAL
    try:
        # Exclusively: a directory another run made there is refused, and left.
        os.mkdir(work, 0o700)
    except FileExistsError:
        raise OutputPathError(
            f"{work} exists (another backup writing there, or one that was interrupted)",
            hint="make sure no other backup writes there, then remove it",
        ) from None
    except OSError as error:
        raise OutputPathError(f"cannot create {work}: {error.strerror}") from None
    final = dest / "data.mdb"
    published: os.stat_result | None = None
    try:
        try:
            below.copy_to(work)
            copied = time.perf_counter() - started
            report = _check_copy(work)
            # The copy's lock file first: what a kill leaves after the move is
            # at most the empty working directory.
            (work / "lock.mdb").unlink(missing_ok=True)
            # Set first: the name is removed on a failure only if it is this file.
            published = os.lstat(work / "data.mdb")
            publish(work / "data.mdb", final)
        finally:
            # What is in work, this call made: the directory is its own.
            _remove_work(work)
    except BaseException:
        if published is not None:
            remove_own(final, published)
        if created:
            with contextlib.suppress(OSError):  # not empty: another run's files stay
                dest.rmdir()
        raise
    return {
        "source": str(below.path),
        "dest": str(dest),
        "uri": path_uri(dest),
        "source_bytes": (below.path / "data.mdb").stat().st_size,
        "backup_bytes": (dest / "data.mdb").stat().st_size,
        "sessions": report.sessions,
        "events": report.events,
        "copy_s": copied,
        "total_s": time.perf_counter() - started,
        "verified": True,
    }


def _remove_work(work: Path) -> None:
    """Remove a backup's own working directory and the files made in it."""
    for name in ("data.mdb", "lock.mdb", PARTIAL_COPY):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(work / name)
    with contextlib.suppress(OSError):
        os.rmdir(work)


def compact(path: Path, **options: Any) -> dict[str, Any]:
    """Rewrite the LMDB store at ``path`` without free pages; refuse while it is open elsewhere.

    ``options`` are ``file_mode`` and ``trust_directory``, as opening takes them.
    """
    if not (path / "data.mdb").is_file():
        raise MissingStoreError(f"{path} holds no store")
    started = time.perf_counter()
    checked: list[CheckReport] = []
    before, after = LmdbStore.compact(
        path, lambda copy: checked.append(_check_copy(copy)), **options
    )
    return {
        "path": str(path),
        "bytes_before": before,
        "bytes_after": after,
        "sessions": checked[0].sessions,
        "events": checked[0].events,
        "total_s": time.perf_counter() - started,
    }
