"""The store commands of ``sessionscope``: ls, show, tail, stats, verify, backup, compact,
export, import and migrate.

Each takes the parsed arguments and returns an exit code; each prints a
table for a person, or one JSON document on stdout with ``--json``. Bad
input raises ``UsageError`` (exit 2); a failure raises the error that says
it (exit 1). ``cli.main`` turns both into one line on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..admin.ops import (
    VERIFY_HINT,
    MissingStoreError,
    backup,
    check_store,
    compact,
    describe_event,
    file_options,
    jsonable,
    list_apps,
    list_users,
    lmdb_path,
    open_existing,
    reason,
    session_page,
    session_records,
    store_stats,
)
from ..admin.outfile import check_output
from ..errors import (
    CorruptStoreError,
    IncompatibleStoreError,
    SessionscopeError,
    StoreNotFoundError,
    UnsafeStoreError,
)
from ..stores import LmdbStore, Store, open_store, redact
from ..stores.lmdb.store import FORMAT_VERSION
from ..stores.records import LoadedSession
from ..stores.uri import query_pairs
from . import UsageError
from .console import Column, RichProgressBar, interactive, render_table

__all__ = ["HANDLERS"]


# -- shared pieces -----------------------------------------------------------------


def open_uri(uri: str, *, existing: bool = True) -> Store:
    """Open a store; bad URIs, missing paths, incompatible files and links are usage errors.

    A store's ``data.mdb`` or ``lock.mdb`` that is a link, FIFO or device is
    bad input, as compact and upgrade say. A damaged store stays the error
    it is (``CorruptStoreError``, exit 1): the input named a store, and the
    store is what failed.
    """
    # No command expires sessions: an application's URI given as it is, with
    # its session_ttl, would have every command delete what is idle.
    try:
        if existing:
            return open_existing(uri, session_ttl=None)
        return open_store(uri, session_ttl=None)
    except MissingStoreError as error:
        raise UsageError(f"no store: {error}") from None
    except IncompatibleStoreError as error:
        # Chained: verify tells an encrypted store (a usage error) from damage.
        raise UsageError(str(error)) from error
    except UnsafeStoreError as error:
        if _links_in(lmdb_path(uri)):
            raise UsageError(str(error)) from error
        raise
    except SessionscopeError:
        raise
    except ValueError as error:  # an unknown scheme or option
        raise UsageError(str(error)) from None


def _links_in(path: Path | None) -> bool:
    """Tell whether a store was refused as unsafe for a file of it that is a link.

    That is bad input (exit 2), as a FIFO or a device there is (an
    IncompatibleStoreError); a directory others may write to, or a Redis
    server that may evict, stays a refusal of the store (exit 1), whichever
    command met it.
    """
    return path is not None and any((path / n).is_symlink() for n in ("data.mdb", "lock.mdb"))


def _check_filters(args: argparse.Namespace) -> None:
    """Refuse an --app or --user no service call would take (empty, over 4 KiB): exit 2."""
    from ..service.core import check_id

    for option, name in (("app", "app_name"), ("user", "user_id")):
        value = getattr(args, option, None)
        if value is not None:
            try:
                check_id(value, name)
            except ValueError as error:
                raise UsageError(f"--{option}: {error}") from None


@contextmanager
def opened(uri: str, *, existing: bool = True) -> Iterator[Store]:
    """Open a store for the length of a command, and close it."""
    store = open_uri(uri, existing=existing)
    try:
        yield store
    finally:
        store.close()


def _progress(args: argparse.Namespace, total: int | None, label: str) -> RichProgressBar:
    """Return a progress bar, drawn only on a terminal and without ``--no-progress``."""
    return RichProgressBar(total, label, enabled=not args.no_progress and interactive())


def _report(progress: RichProgressBar) -> Callable[[int, int], None]:
    return lambda done, total: progress.update(done, total)


def _advance(progress: RichProgressBar) -> Callable[[int], None]:
    """Return a callback that moves the bar on by the number of records just handled."""
    return lambda count: progress.update(progress.done + count)


def _emit(args: argparse.Namespace, document: dict[str, Any], text: Callable[[], str]) -> None:
    if args.json:
        print(json.dumps(jsonable(document), indent=2, ensure_ascii=False))
    else:
        print(text())


def _when(stamp: float | None) -> str:
    if stamp is None:
        return "-"
    moment = datetime.fromtimestamp(stamp, timezone.utc)
    return moment.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def _size(count: int) -> str:
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:,.0f} {unit}" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _value(value: Any) -> str:
    return json.dumps(jsonable(value), ensure_ascii=False, default=str)


def _page(names: list[str], limit: int, cursor: str | None) -> tuple[list[str], str | None]:
    """Return the names after ``cursor`` (the last name of the page before), and the next one."""
    rest = [name for name in names if cursor is None or name > cursor]
    page = rest[:limit]
    return page, page[-1] if len(rest) > limit else None


# -- ls --------------------------------------------------------------------------


def ls(args: argparse.Namespace) -> int:
    """List apps, an app's users, or a user's sessions."""
    _check_filters(args)
    if args.user is not None and args.app is None:
        raise UsageError("--user needs --app")
    with opened(args.uri) as store:
        if args.app is None:
            names, cursor = _page(list_apps(store), args.limit, args.cursor)
            rows = [_app_row(store, name) for name in names]
            document: dict[str, Any] = {"apps": rows, "next_cursor": cursor}
            columns: list[Column | str] = [
                "app",
                Column("users", True),
                Column("sessions", True),
                Column("events", True),
                "last update",
            ]
            cells = [
                [r["app"], r["users"], r["sessions"], r["events"], _when(r["last_update"])]
                for r in rows
            ]
        elif args.user is None:
            names, cursor = _page(list_users(store, args.app), args.limit, args.cursor)
            rows = [_user_row(store, args.app, name) for name in names]
            document = {"app": args.app, "users": rows, "next_cursor": cursor}
            columns = ["user", Column("sessions", True), Column("events", True), "last update"]
            cells = [[r["user"], r["sessions"], r["events"], _when(r["last_update"])] for r in rows]
        else:
            try:
                rows, cursor = session_page(store, args.app, args.user, args.limit, args.cursor)
            except ValueError as error:  # a cursor no listing returned
                raise UsageError(str(error)) from None
            document = {"app": args.app, "user": args.user, "sessions": rows}
            document["next_cursor"] = cursor
            columns = [
                "session",
                Column("events", True),
                Column("size", True),
                "created",
                "last update",
            ]
            cells = [
                [
                    r["session"],
                    r["events"],
                    _size(r["bytes"]),
                    _when(r["created"]),
                    _when(r["last_update"]),
                ]
                for r in rows
            ]

    def text() -> str:
        out = render_table(columns, cells) if cells else "(none)"
        if cursor is not None:
            out += f"\nmore: --cursor {cursor}"
        return out

    _emit(args, document, text)
    return 0


def _app_row(store: Store, app: str) -> dict[str, Any]:
    return {"app": app, "users": len(list_users(store, app)), **_totals(store, app, None)}


def _user_row(store: Store, app: str, user: str) -> dict[str, Any]:
    return {"user": user, **_totals(store, app, user)}


def _totals(store: Store, app: str, user: str | None) -> dict[str, Any]:
    """Return the sessions, events and last update of an app or user, from records alone."""
    sessions = events = 0
    last: float | None = None
    for record in session_records(store, app, user):
        sessions += 1
        events += record.stored_count
        last = record.last_update_time if last is None else max(last, record.last_update_time)
    return {"sessions": sessions, "events": events, "last_update": last}


# -- show and tail -----------------------------------------------------------------


def _session_key(args: argparse.Namespace) -> tuple[str, str, str]:
    """Return the session's (app, user, session) ids checked and stripped as a service does."""
    from ..service.core import check_id, check_session_id

    try:
        return (
            check_id(args.app, "app_name"),
            check_id(args.user, "user_id"),
            check_session_id(args.session),
        )
    except ValueError as error:
        raise UsageError(str(error)) from None


def _missing_session(args: argparse.Namespace) -> SessionscopeError:
    from ..errors import SessionNotFoundError

    return SessionNotFoundError(
        f"no session {args.session!r} of user {args.user!r} in app {args.app!r}"
    )


def _event_rows(events: list[dict[str, Any]]) -> list[list[Any]]:
    return [
        [
            e["position"],
            _when(e["timestamp"]),
            e["author"],
            e["summary"],
            ", ".join(e["state_delta"]),
        ]
        for e in events
    ]


_EVENT_COLUMNS: list[Column | str] = [Column("#", True), "time", "author", "content", "delta"]


def show(args: argparse.Namespace) -> int:
    """Print a session's state by scope and its last events."""
    key = _session_key(args)
    with opened(args.uri) as store:
        loaded = store.load_session(*key, args.last, None)
    if loaded is None:
        raise _missing_session(args)
    record = loaded.record
    first = record.stored_count - len(loaded.events)
    events = [
        {"position": first + i, **describe_event(data)} for i, data in enumerate(loaded.events)
    ]
    document = {
        "app": record.app_name,
        "user": record.user_id,
        "session": record.session_id,
        "created": record.create_time,
        "last_update": record.last_update_time,
        "events_stored": record.stored_count,
        "revision": record.marker,
        "state": {
            "app": loaded.app_state,
            "user": loaded.user_state,
            "session": loaded.session_state,
        },
        "events": events,
    }

    def text() -> str:
        out = [
            f"session  {record.app_name} / {record.user_id} / {record.session_id}",
            f"created  {_when(record.create_time)}   last update "
            f"{_when(record.last_update_time)}   events {record.stored_count}",
            "",
        ]
        scopes = (
            ("app state (app:)", loaded.app_state),
            ("user state (user:)", loaded.user_state),
            ("session state", loaded.session_state),
        )
        for title, values in scopes:
            rows = [[key, _value(value)] for key, value in sorted(values.items())]
            out.append(render_table(["key", "value"], rows, title=title) if rows else title)
            if not rows:
                out.append("  (empty)")
            out.append("")
        title = f"last {len(events)} of {record.stored_count} events"
        out.append(render_table(_EVENT_COLUMNS, _event_rows(events), title=title))
        return "\n".join(out)

    _emit(args, document, text)
    return 0


def _tail_line(event: dict[str, Any]) -> str:
    delta = f"  [delta: {', '.join(event['state_delta'])}]" if event["state_delta"] else ""
    return (
        f"{_when(event['timestamp'])}  #{event['position']}  {event['author'] or '-'}  "
        f"{event['summary']}{delta}"
    )


def tail(args: argparse.Namespace) -> int:
    """Print a session's last events; with --follow, then each new one until interrupted.

    Each poll reads the session with no events (its record only). Its
    ``event_count`` counts every event ever appended, truncated or not, so
    the events new since the last poll are the last ``event_count - seen``
    still stored; a new record ``number`` is the session deleted and created
    again, whose events are all new.
    """
    key = _session_key(args)

    def emit(loaded: LoadedSession) -> None:
        first = loaded.record.stored_count - len(loaded.events)
        for i, data in enumerate(loaded.events):
            event = {"position": first + i, **describe_event(data)}
            line = (
                json.dumps(jsonable(event), ensure_ascii=False) if args.json else _tail_line(event)
            )
            print(line, flush=True)

    # A follow ends with status 0 at an interrupt anywhere, from before the
    # first line printed to the last.
    try:
        if args.follow:
            # SIGINT and SIGTERM end a follow quietly. SIGINT is set too
            # because a process started in the background (``cmd &`` from a
            # script, some CI runners) inherits it ignored, and then Ctrl-C or
            # ``kill -INT`` would never end the follow.
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.signal(signal.SIGTERM, signal.default_int_handler)
        with opened(args.uri) as store:
            loaded = store.load_session(*key, args.last, None)
            if loaded is None:
                raise _missing_session(args)
            emit(loaded)
            if not args.follow:
                return 0
            number, seen = loaded.record.number, loaded.record.event_count
            while True:
                time.sleep(args.interval)
                head = store.load_session(*key, 0, None)
                while head is not None:
                    record = head.record
                    fresh = record.event_count - seen if record.number == number else None
                    wanted = (
                        record.stored_count if fresh is None else min(fresh, record.stored_count)
                    )
                    if wanted <= 0:
                        break
                    batch = store.load_session(*key, wanted, None)
                    if batch is not None and (batch.record.number, batch.record.event_count) == (
                        record.number,
                        record.event_count,
                    ):
                        emit(batch)
                        break
                    head = batch  # moved on between the two reads: count again
                if head is None:
                    print("sessionscope tail: the session was deleted", file=sys.stderr)
                    return 1
                number, seen = head.record.number, head.record.event_count
    except KeyboardInterrupt:
        if not args.follow:
            raise
        return 0


# -- stats and verify --------------------------------------------------------------


def stats(args: argparse.Namespace) -> int:
    """Print sessions, events and bytes per app and scope, and the file's figures."""
    with opened(args.uri) as store, _progress(args, None, "stats") as bar:
        figures = store_stats(store, progress=_report(bar))
    figures = {"uri": redact(args.uri), **figures}

    def text() -> str:
        columns: list[Column | str] = [
            "app",
            Column("sessions", True),
            Column("events", True),
            Column("app state", True),
            Column("user state", True),
            Column("session state", True),
            Column("events size", True),
        ]

        def row(name: str, f: dict[str, int]) -> list[Any]:
            return [
                name,
                f"{f['sessions']:,}",
                f"{f['events']:,}",
                _size(f["app_state_bytes"]),
                _size(f["user_state_bytes"]),
                _size(f["session_state_bytes"]),
                _size(f["event_bytes"]),
            ]

        rows = [row(name, f) for name, f in figures["apps"].items()]
        rows.append(row("total", figures["totals"]))
        out = [render_table(columns, rows, title="by app and scope (keys and packed values)")]
        space = figures.get("file")
        if space is not None:
            pages = [
                ["file size", _size(space["file_size"])],
                ["map size", _size(space["map_size"])],
                ["page size", _size(space["page_size"])],
                ["pages up to the last in use", f"{space['pages']:,}"],
                ["pages in use by databases", f"{space['pages_used']:,}"],
                ["free pages (reusable; compact removes them)", f"{space['free_pages']:,}"],
            ]
            out.append("")
            out.append(render_table(["file", Column("", True)], pages))
        return "\n".join(out)

    _emit(args, figures, text)
    return 0


def verify(args: argparse.Namespace) -> int:
    """Check a store's structure and logic; exit 1 listing the problems found."""
    try:
        store = open_uri(args.uri)
    except UsageError as error:
        # A store file refused at open as unsafe (a planted link) is a
        # finding, not bad usage (open_uri chains the store's error). A store
        # of a newer format or of another kind, an encrypted store opened
        # without its key, a bad option or key source (nothing chained): bad
        # usage, as for every command; none of them is damage.
        path = lmdb_path(args.uri)
        if (
            path is None
            or not (path / "data.mdb").is_file()
            or not isinstance(error.__cause__, UnsafeStoreError)
        ):
            raise
        return _verify_report(args, _refused(error))
    except CorruptStoreError as error:
        return _verify_report(args, _refused(error))
    try:
        with _progress(args, None, "verify") as bar:
            report = check_store(store, progress=_report(bar))
    finally:
        store.close()
    return _verify_report(args, report.to_dict())


def _refused(error: BaseException) -> dict[str, Any]:
    return {
        "clean": False,
        "structural": "failed",
        "problems": [f"open: {reason(error)}"],
        "hint": VERIFY_HINT,
    }


def _verify_report(args: argparse.Namespace, report: dict[str, Any]) -> int:
    document = {"uri": redact(args.uri), **report}

    def text() -> str:
        lines = [f"structure  {report['structural']}"]
        if "sessions" in report:
            lines.append(f"checked    {report['sessions']:,} sessions, {report['events']:,} events")
        if report["problems"]:
            lines.append(f"FAILED     {len(report['problems'])} problem(s):")
            lines.extend(f"  - {problem}" for problem in report["problems"])
            lines.append(f"hint       {report['hint']}")
        else:
            lines.append("clean      counts, index entries and records agree")
        return "\n".join(lines)

    _emit(args, document, text)
    return 0 if report["clean"] else 1


# -- backup and compact ------------------------------------------------------------


def _lmdb_only(uri: str, command: str) -> Path:
    path = lmdb_path(uri)
    if path is None:
        scheme = uri.partition(":")[0]
        raise UsageError(f"{command} works on lmdb:// stores, not {scheme}://")
    return path


def backup_command(args: argparse.Namespace) -> int:
    """Copy a live LMDB store into a new directory and verify the copy."""
    _lmdb_only(args.uri, "backup")
    dest = Path(args.dest)
    with opened(args.uri) as store, _progress(args, None, "backup") as bar:
        # An encrypted store is backed up as the ciphertext its LMDB file holds.
        result = backup(store, dest)
        bar.update(1, 1)

    def text() -> str:
        return render_table(
            ["backup", Column("", True)],
            [
                ["written to", result["uri"]],
                ["store size", _size(result["source_bytes"])],
                ["backup size", _size(result["backup_bytes"])],
                ["sessions", f"{result['sessions']:,}"],
                ["events", f"{result['events']:,}"],
                ["copy time", f"{result['copy_s']:.3f} s"],
                ["total time (with verify)", f"{result['total_s']:.3f} s"],
                ["verified", "yes: structure and logic"],
            ],
        )

    _emit(args, result, text)
    return 0


def _file_options(uri: str) -> dict[str, Any]:
    try:
        return file_options(uri)
    except ValueError as error:
        raise UsageError(str(error)) from None


def upgrade_command(args: argparse.Namespace) -> int:
    """Bring a closed LMDB store to the current store format, in place."""
    path = _lmdb_only(args.uri, "upgrade")
    if not (path / "data.mdb").is_file():
        raise UsageError(f"no store: {path} holds none")
    try:
        before = LmdbStore.upgrade(path, **_file_options(args.uri))
    except IncompatibleStoreError as error:
        # A path that is no store, or files that must not be opened: bad input.
        raise UsageError(str(error)) from None
    except UnsafeStoreError as error:
        if _links_in(path):
            raise UsageError(str(error)) from None
        raise
    document = {"path": str(path), "format_before": before, "format": FORMAT_VERSION}

    def text() -> str:
        if before == FORMAT_VERSION:
            return f"{path} is already format {FORMAT_VERSION}: nothing to do"
        return f"{path} upgraded from format {before} to format {FORMAT_VERSION}"

    _emit(args, document, text)
    return 0


def compact_command(args: argparse.Namespace) -> int:
    """Rewrite a closed LMDB store without free pages, via a verified copy."""
    path = _lmdb_only(args.uri, "compact")
    if not (path / "data.mdb").is_file():
        raise UsageError(f"no store: {path} holds none")
    try:
        with _progress(args, None, "compact") as bar:
            result = compact(path, **_file_options(args.uri))
            bar.update(1, 1)
    except IncompatibleStoreError as error:
        raise UsageError(str(error)) from None
    except UnsafeStoreError as error:
        if _links_in(path):
            raise UsageError(str(error)) from None
        raise

    def text() -> str:
        saved = result["bytes_before"] - result["bytes_after"]
        return render_table(
            ["compact", Column("", True)],
            [
                ["store", str(path)],
                ["size before", _size(result["bytes_before"])],
                ["size after", _size(result["bytes_after"])],
                ["freed", _size(saved)],
                ["sessions", f"{result['sessions']:,}"],
                ["events", f"{result['events']:,}"],
                ["time", f"{result['total_s']:.3f} s"],
            ],
        )

    _emit(args, result, text)
    return 0


# -- export, import, migrate -------------------------------------------------------


def _counts(value: Any) -> dict[str, Any]:
    """Return the fields of a result object (a dataclass or a plain one) as a map."""
    import dataclasses

    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, dict):
        return value
    return {k: v for k, v in vars(value).items() if not k.startswith("_")}


def _number(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    return f"{value:,}" if isinstance(value, int) else f"{value:,.3f}"


def _counts_text(title: str, fields: dict[str, Any]) -> str:
    rows = [[name.replace("_", " "), _number(v)] for name, v in fields.items()]
    return render_table([title, Column("", True)], rows)


def export_command(args: argparse.Namespace) -> int:
    """Write a store (or one app or user) as a dump, or an app as a trace."""
    _check_filters(args)
    if args.user is not None and args.app is None:
        raise UsageError("--user needs --app")
    out = Path(args.out)
    # Refused before the store is opened: an existing file, a directory, a
    # FIFO or device, a missing parent, a path inside the store's directory.
    home = lmdb_path(args.uri)
    check_output(out, [home] if home is not None else [])
    if args.format == "trace":
        if args.app is None:
            raise UsageError("--format trace needs --app: a trace holds one app")
        from ..bench.trace import export_trace

        with opened(args.uri) as store:
            if getattr(store, "raw", store) is not store and not args.plaintext:
                # A trace is the store's values opened: a copy no erasure reaches.
                raise UsageError(
                    "a trace of an encrypted store holds its values in clear, out of reach "
                    "of erasure: pass --plaintext to write it anyway, or export a dump, "
                    "which keeps them sealed"
                )
            count = export_trace(store, args.app, out, user_id=args.user)
        document = {"format": "trace", "out": str(out), "calls": count}
        _emit(args, document, lambda: f"wrote {count:,} calls to {out}")
        return 0
    from ..admin.dump import export_dump

    with opened(args.uri) as store, _progress(args, None, "export") as bar:
        counts = export_dump(
            store, out, app_name=args.app, user_id=args.user, progress=_advance(bar)
        )
    document = {"format": "dump", "out": str(out), **_counts(counts)}
    _emit(args, document, lambda: _counts_text(f"exported to {out}", _counts(counts)))
    return 0


def import_command(args: argparse.Namespace) -> int:
    """Load a dump into a store (created if missing); a bad dump changes nothing.

    The whole dump is checked before a new store is created for it. Should
    the import fail after that, only the files this command created go (the
    store's, and those of an LMDB key store it made for an encrypted one),
    and only while no other process has them open nor wrote to them.
    """
    from ..admin.dump import check_dump, holds_only_dump, import_dump

    source = Path(args.source)
    if not source.is_file():
        raise UsageError(f"{source} {'is not a file' if source.exists() else 'does not exist'}")
    path = lmdb_path(args.uri)
    # What this command creates, so that a failure removes that and no more.
    created: list[Path] = []
    keys = _key_store_path(args.uri)
    keys_created: list[Path] = []
    if path is not None and not (path / "data.mdb").exists():
        check_dump(source)
        created = _new_files(path)
        keys_created = _new_files(keys) if keys is not None else []
    # When the import fails: LMDB's last transaction id of the store, and the
    # key store's records, given only if the store held nothing but the dump's.
    last_write: int | None = None
    key_records: list[tuple[bytes, bytes]] | None = None
    try:
        with opened(args.uri, existing=False) as store, _progress(args, None, "import") as bar:
            try:
                counts = import_dump(store, source, progress=_advance(bar))
            except BaseException:
                # An encrypted store writes through to the LMDB store below it.
                raw = getattr(store, "raw", store)
                if created and isinstance(raw, LmdbStore):
                    # The last commit first, then what the store holds: a
                    # commit by another process is in one or the other.
                    last = raw.stat()["last_txnid"]
                    records = _key_records(store, keys) if keys_created else None
                    if holds_only_dump(store, source):
                        last_write, key_records = last, records
                raise
    except BaseException:
        if created and path is not None:
            removed = _remove_created(path, created, _last_write_is(last_write))
            if removed and keys is not None and keys_created:
                _remove_created(keys, keys_created, _records_are(key_records))
        raise
    fields = _counts(counts)
    skipped = {"sessions": fields.pop("skipped_sessions"), "events": fields.pop("skipped_events")}
    imported = {"sessions": counts.sessions - skipped["sessions"]}
    imported["events"] = counts.events - skipped["events"]
    document = {
        "uri": redact(args.uri),
        "source": str(source),
        **fields,
        "imported": imported,
        "skipped": skipped,
    }

    def text() -> str:
        rows = {
            "apps": counts.apps,
            "users": counts.users,
            "sessions in the dump": counts.sessions,
            "events in the dump": counts.events,
            "sessions imported": imported["sessions"],
            "events imported": imported["events"],
            "sessions skipped (stored already, equal)": skipped["sessions"],
            "events skipped (stored already, equal)": skipped["events"],
        }
        if counts.erased_values:
            rows["state values left out (erased, the user came back)"] = counts.erased_values
        return _counts_text(f"imported from {source}", rows)

    _emit(args, document, text)
    return 0


def _key_store_path(uri: str) -> Path | None:
    """Return the directory of an encrypted ``lmdb://`` store's LMDB key store; None if none.

    As ``open_store`` places it: ``keys=``, or beside the store (its path
    plus ``.keys``). Only a guess until the store is open: ``_key_records``
    checks it against the key store the store opened.
    """
    path = lmdb_path(uri)
    options = dict(query_pairs(uri))
    if path is None or not ({"key_file", "key_env"} & set(options)):
        return None
    return lmdb_path(options.get("keys") or f"lmdb://{path.absolute()}.keys")


def _new_files(path: Path) -> list[Path]:
    """Return which of an LMDB directory and its two files do not exist yet."""
    return [p for p in (path, path / "data.mdb", path / "lock.mdb") if not os.path.lexists(p)]


def _key_records(store: Store, keys: Path | None) -> list[tuple[bytes, bytes]] | None:
    """Return every record of the key store an encrypted store opened at ``keys``; else None."""
    keyring = getattr(store, "keyring", None)
    if keyring is None or keys is None or keyring.keys.where != f"lmdb://{keys}":
        return None
    records: list[tuple[bytes, bytes]] = keyring.keys.items(b"")
    return records


def _last_write_is(last_write: int | None) -> Callable[[Any], bool] | None:
    """Return the check that an LMDB store's last transaction is still ``last_write``."""
    if last_write is None:
        return None
    return lambda env: bool(env.info()["last_txnid"] == last_write)


def _records_are(records: list[tuple[bytes, bytes]] | None) -> Callable[[Any], bool] | None:
    """Return the check that an LMDB key store still holds exactly ``records``."""
    if records is None:
        return None

    def check(env: Any) -> bool:
        with env.begin() as txn:
            return [(bytes(k), bytes(v)) for k, v in txn.cursor()] == records

    return check


def _remove_created(
    path: Path, created: list[Path], untouched: Callable[[Any], bool] | None
) -> bool:
    """Remove the files a failed import created of an LMDB environment, unless another
    process used it; return whether they went.

    ``untouched`` tells, given the environment opened read-only, that nobody
    wrote to it since the import failed (the store's last transaction id,
    the key store's records); None when the store then held more than the
    dump's sessions and state: it is kept. Another process that has the
    environment open holds LMDB's lock: taking that lock exclusively proves
    there is none, and keeps any from opening it while the files go.
    """
    import lmdb

    from ..stores.lmdb.maintenance import sole_user

    if untouched is None or not (path / "data.mdb").is_file():
        # Nothing of a store was made (or it cannot be told whose it is).
        if path in created and path.is_dir() and not any(path.iterdir()):
            path.rmdir()
        return False
    try:
        with sole_user(path, "import"):
            env = lmdb.open(str(path), readonly=True, lock=False)
            try:
                if not untouched(env):
                    return False
            finally:
                env.close()
            for file in created[::-1]:
                if file.is_file():
                    file.unlink()
                elif file.is_dir() and not any(file.iterdir()):
                    file.rmdir()
    except (OSError, lmdb.Error, SessionscopeError):
        # In use by another process, or unreadable: kept as it is.
        return False
    return True


def migrate_command(args: argparse.Namespace) -> int:
    """Copy sessions from google-adk's own services; exit 1 when the copies differ."""
    # Bad usage is said as such before the extra it needs is looked for.
    _check_filters(args)
    from ..adk.migrate import check_adk_source, migrate_from_adk

    try:
        # Refuse a source that cannot be read (not ADK's, no such file, no ADK
        # tables) before the target store is created.
        check_adk_source(args.source)
    except ValueError as error:
        raise UsageError(str(error)) from None
    started = time.perf_counter()
    with opened(args.to, existing=False) as store, _progress(args, None, "migrate") as bar:
        try:
            report = migrate_from_adk(args.source, store, app_name=args.app, progress=_advance(bar))
        except SessionscopeError:
            raise
        except ValueError as error:  # a source URL ADK cannot open, or no such file
            raise UsageError(str(error)) from None
    fields = _counts(report)
    fields.setdefault("elapsed_s", time.perf_counter() - started)
    differences = list(report.differences)
    # Either URL may hold a password: shown as *** only.
    source, to = redact(args.source), redact(args.to)
    document = {"from": source, "to": to, **fields, "differences": differences}

    def text() -> str:
        shown = {k: v for k, v in fields.items() if k != "differences"}
        out = [_counts_text(f"migrated {source} to {to}", shown)]
        if differences:
            out.append(f"DIFFERENCES ({len(differences)}):")
            out.extend(f"  - {difference}" for difference in differences)
        else:
            out.append("no differences: both sides read back equal through ADK's API")
        return "\n".join(out)

    _emit(args, document, text)
    return 1 if differences else 0


def rotate_key_command(args: argparse.Namespace) -> int:
    """Re-wrap every data key of a key store under a new key-encryption key."""
    try:
        from ..crypto import kek_from, rotate_key
    except ImportError as error:
        raise UsageError(
            f"rotate-key needs cryptography: pip install 'sessionscope[encryption]' ({error})"
        ) from None
    try:
        old = kek_from(key_file=args.old_key_file, key_env=args.old_key_env)
        new = kek_from(key_file=args.new_key_file, key_env=args.new_key_env)
        rewrapped = rotate_key(args.keys, old, new)
    except StoreNotFoundError as error:
        raise UsageError(str(error)) from None
    except ValueError as error:
        raise UsageError(str(error)) from None
    document = {
        "keys": redact(args.keys),
        "rewrapped": rewrapped,
        "old_key_id": old.key_id,
        "new_key_id": new.key_id,
    }

    def text() -> str:
        return (
            f"{rewrapped:,} data-key records re-wrapped from key id {old.key_id} "
            f"to key id {new.key_id}"
        )

    _emit(args, document, text)
    return 0


HANDLERS: dict[str, Callable[[argparse.Namespace], int]] = {
    "ls": ls,
    "show": show,
    "tail": tail,
    "stats": stats,
    "verify": verify,
    "backup": backup_command,
    "compact": compact_command,
    "upgrade": upgrade_command,
    "export": export_command,
    "import": import_command,
    "migrate": migrate_command,
    "rotate-key": rotate_key_command,
}
