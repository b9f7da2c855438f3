"""Copy sessions from google-adk's own session services into a sessionscope store.

The source URL is read the way ``adk web --session_service_uri`` reads it,
through ADK's own service factory: ``sqlite:///path`` opens a
``SqliteSessionService`` (ADK reads ``sqlite:///x.db`` as the relative
path ``x.db`` and ``sqlite:////abs/x.db`` as an absolute one), SQLAlchemy URLs
(``sqlite+aiosqlite:///...``, ``postgresql+asyncpg://...``) a
``DatabaseSessionService``.

ADK's API cannot list apps, so the app and user ids come from the source's
own tables (``sessions`` and ``user_states``, which every ADK schema version
has); everything else is read through ADK's API (``list_sessions``,
``get_session``, ``get_user_state``), so every schema version ADK reads works.
Each session is written whole with ``Store.restore_session``: every event
keeps its id, timestamp and content (encoded as the ADK drop-in encodes it),
the session its ``last_update_time``. ADK does not expose a session's
creation time: the copy takes its first event's time, or its last update
when it has none. Sessions already in the store and equal are skipped, so
running again is a no-op and an interrupted run resumes. Afterwards both
sides are read back through ADK's API (the target through the drop-in
service) and every difference is reported.

Nothing is written to the source, and nothing is created at it: a URL that
is neither ``sqlite://`` nor a SQLAlchemy database URL, a database file that
does not exist and a database without ADK's tables are refused before ADK
builds a service for it (ADK would create its tables in it). The source is
read twice: a check pass first reads every session and refuses the whole
migration, naming each session and key path, when any id, state value or
event is one the store would refuse or change (the service's own checks);
only then does the copy pass write. That costs one more read of the source
(the verification is a third), in memory bounded by one session.

Limits: an app's ``app:`` state is copied through its sessions (ADK has no
call that reads it alone), so an app with state and no session brings none.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import inspect
import math
import os
import sqlite3
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote, urlsplit

from ..codec import pack
from ..errors import AlreadyExistsError, SessionscopeError
from ..service.core import check_app_name, check_id, check_session_id
from ..stores import redact
from ..stores.protocol import Store
from ..stores.records import SessionCopy
from ..stores.rules import check_copy

if TYPE_CHECKING:
    from google.adk.sessions import BaseSessionService, Session

__all__ = ["MigrationReport", "migrate_from_adk"]

_APP_PREFIX, _USER_PREFIX, _TEMP_PREFIX = "app:", "user:", "temp:"
# Every (app, user) pair a source holds sessions or user state of: ADK's API
# lists no apps, and every schema version ADK reads has these two tables.
_OWNERS_QUERY = (
    "SELECT app_name, user_id FROM sessions UNION SELECT app_name, user_id FROM user_states"
)
# The tables both services and every schema version have. A database without
# them is not refused by ADK: it creates them, in the user's file.
_ADK_TABLES = ("app_states", "user_states", "sessions", "events")
# How many refused sessions a refusal lists one by one.
_SHOWN_PROBLEMS = 20
# How much of a long id a message shows.
_SHOWN_ID = 60


@dataclass(slots=True)
class MigrationReport:
    """What a migration read, wrote and found different.

    ``sessions`` and ``events`` count what the source holds (of the apps
    migrated); ``copied`` the sessions written by this run, ``skipped`` those
    already in the store and equal. ``differences`` lists, one line each,
    every field the read-back found unequal, and every session the store
    holds with other content (which is left as it is).
    """

    apps: int = 0
    users: int = 0
    sessions: int = 0
    events: int = 0
    copied: int = 0
    skipped: int = 0
    differences: list[str] = field(default_factory=list)


def migrate_from_adk(
    source_url: str,
    store: Store,
    *,
    app_name: str | None = None,
    progress: Callable[[int], None] | None = None,
) -> MigrationReport:
    """Copy every session, event and ``app:``/``user:`` state of an ADK session store.

    ``app_name`` limits the copy to one app. ``progress(n)`` is called with
    the number of records (a session and its events) just handled. A source
    that cannot be read, or that holds anything the store would refuse, is a
    ValueError that names it (and, when it came while writing, says what was
    stored); no message holds the source URL's password.
    """
    _check_url(source_url)
    if app_name is not None:
        check_app_name(app_name)
    return asyncio.run(_migrate(source_url, store, app_name, progress))


def check_adk_source(source_url: str) -> None:
    """Refuse, as ``migrate_from_adk`` would, a source it cannot read; change nothing.

    Opens the source as the migration does and checks it holds ADK's tables,
    so that a command can refuse a bad source before it creates its target.
    """
    _check_url(source_url)

    async def check() -> None:
        await _close(await _opened(source_url))

    asyncio.run(check())


def _check_url(source_url: object) -> None:
    if not isinstance(source_url, str) or "://" not in source_url:
        raise ValueError(
            redact(f"source_url must be a URL such as sqlite:///sessions.db, not {source_url!r}")
        )


def open_adk_service(source_url: str) -> BaseSessionService:
    """Open the ADK session service ``--session_service_uri source_url`` would open.

    Only ``sqlite://`` and SQLAlchemy database URLs are read, and that is
    decided before ADK's factory builds anything (its registry would build
    any registered service, this package's own LMDB store included). A
    source that names a database file that does not exist is refused before
    ADK would create it, a ``sqlite://`` file without ADK's tables before ADK
    would create them. No message holds the URL's password.
    """
    from google.adk.cli.utils.service_factory import create_session_service_from_options
    from google.adk.sessions.database_session_service import DatabaseSessionService
    from google.adk.sessions.sqlite_session_service import SqliteSessionService

    scheme = source_url.partition("://")[0]
    if scheme != "sqlite" and not _is_database_url(source_url):
        raise ValueError(
            redact(
                f"{source_url!r} is not a source migrate reads: it reads sqlite:///path "
                "(SqliteSessionService) and SQLAlchemy database URLs such as "
                f"postgresql+asyncpg://... (DatabaseSessionService); {scheme}:// is neither"
            )
        )
    path = _sqlite_file(source_url)
    if path is not None:
        if not path or path == ":memory:" or not os.path.isfile(path):
            raise ValueError(
                redact(f"{source_url!r} names no existing database file ({path or 'none'})")
            )
        if scheme == "sqlite":
            _check_sqlite_file(source_url, path)
    try:
        with warnings.catch_warnings():
            # SqliteSessionService's schema check opens a sqlite3 connection and
            # leaves it to the garbage collector, which Python 3.13 reports as a
            # ResourceWarning: ADK's leak, not one a caller can mend. Collect it
            # here, where the warning is known and silenced.
            warnings.simplefilter("ignore", ResourceWarning)
            service = create_session_service_from_options(
                base_dir=os.getcwd(), session_service_uri=source_url, use_local_storage=False
            )
            gc.collect()
    except Exception as error:
        raise ValueError(
            redact(f"cannot open the ADK session store {source_url!r}: {error}")
        ) from None
    if not isinstance(service, (SqliteSessionService, DatabaseSessionService)):
        raise ValueError(
            redact(
                f"{source_url!r} opens a {type(service).__name__}: migrate reads sqlite:// and "
                "SQLAlchemy database URLs"
            )
        )
    # Neither service connects before its first call: nothing is open to close.
    return service


def _is_database_url(source_url: str) -> bool:
    """Return whether SQLAlchemy has a dialect for the URL (ADK's factory falls back to it)."""
    from sqlalchemy.engine import make_url

    try:
        make_url(source_url).get_dialect()
    except Exception:
        return False
    return True


def _schema_problem(tables: set[str], event_columns: set[str], database: bool) -> str | None:
    """Return why a database with these tables is no ADK session store; None when it is one.

    A DatabaseSessionService database records its schema version in
    ``adk_internal_metadata`` (the legacy one has an ``events.actions``
    column instead): without either, ADK takes it for a new database and
    writes its metadata into it.
    """
    missing = [table for table in _ADK_TABLES if table not in tables]
    if missing:
        return f"is not an ADK session database: it has no {', '.join(missing)} table"
    legacy = "actions" in event_columns and "event_data" not in event_columns
    if database and "adk_internal_metadata" not in tables and not legacy:
        if "event_data" in event_columns:
            return "holds a SqliteSessionService database: read it with sqlite:///path"
        return "is not a DatabaseSessionService database (it records no schema version)"
    return None


def _check_sqlite_file(source_url: str, path: str) -> None:
    """Refuse a SQLite file without ADK's tables, reading it through a read-only connection."""
    uri = f"file:{quote(os.path.abspath(path))}?mode=ro"
    try:
        with contextlib.closing(sqlite3.connect(uri, uri=True)) as connection:
            tables = {
                str(row[0])
                for row in connection.execute("SELECT name FROM sqlite_master WHERE type='table'")
            }
            columns = (
                {str(row[1]) for row in connection.execute("PRAGMA table_info(events)")}
                if "events" in tables
                else set()
            )
    except sqlite3.Error as error:
        raise ValueError(
            redact(f"cannot read {source_url!r} as an ADK session database: {error}")
        ) from None
    problem = _schema_problem(tables, columns, database=False)
    if problem is not None:
        raise ValueError(redact(f"{source_url!r} {problem}"))


async def _check_database(source: Any, source_url: str) -> None:
    """Refuse a database without ADK's tables before ADK's first call would create them."""
    from sqlalchemy import inspect

    def look(connection: Any) -> tuple[set[str], set[str]]:
        inspector = inspect(connection)
        tables = set(inspector.get_table_names())
        columns = (
            {str(c["name"]) for c in inspector.get_columns("events")}
            if "events" in tables
            else set()
        )
        return tables, columns

    try:
        async with source.db_engine.connect() as connection:
            tables, columns = await connection.run_sync(look)
    except Exception as error:
        raise ValueError(
            redact(f"cannot read {source_url!r} as an ADK session database: {error}")
        ) from None
    problem = _schema_problem(tables, columns, database=True)
    if problem is not None:
        raise ValueError(redact(f"{source_url!r} {problem}"))


async def _opened(source_url: str) -> Any:
    """Return the source's ADK service, refused (and closed) unless it holds ADK's tables."""
    from google.adk.sessions.database_session_service import DatabaseSessionService

    source = open_adk_service(source_url)
    if isinstance(source, DatabaseSessionService):
        try:
            await _check_database(source, source_url)
        except BaseException:
            await _close(source)
            raise
    return source


class _Refused(ValueError):
    """The source holds something the store would refuse; the message says what."""


async def _migrate(
    source_url: str,
    store: Store,
    only_app: str | None,
    progress: Callable[[int], None] | None,
) -> MigrationReport:
    source = await _opened(source_url)
    report = MigrationReport()
    # What the write pass is at, for a failure's account of what was stored.
    at: list[str] = []
    try:
        owners = await _owners(source, source_url)
        apps = [only_app] if only_app is not None else sorted({app for app, _ in owners})
        await _check_all(source, owners, apps)
        await _write_all(source, store, owners, apps, report, progress, at)
    except SessionscopeError:
        raise
    except Exception as error:
        if isinstance(error, _Refused):
            message = str(error)
        else:
            message = f"reading the ADK session store {source_url!r} failed: {error!r}"
        if at and not at[-1]:
            message += (
                f"; every session was stored ({report.copied} copied, {report.skipped} found "
                "equal): only reading them back to compare failed"
            )
        elif at:
            message += (
                f"; stored before it: {report.copied} sessions copied and {report.skipped} "
                f"found equal, with their app: and user: state; nothing of {at[-1]} or after "
                "it was written (running again resumes)"
            )
        raise ValueError(redact(message)) from None
    finally:
        await _close(source)
    return report


def _users(app: str, owners: set[tuple[str, str]], listed: list[Any]) -> list[str]:
    return sorted({user for a, user in owners if a == app} | {s.user_id for s in listed})


async def _check_all(source: Any, owners: set[tuple[str, str]], apps: list[str]) -> None:
    """Read every session of the apps and refuse them all, naming each problem, if any is bad."""
    from . import AdkModel

    model = AdkModel()
    problems: list[str] = []
    count = 0

    def refuse(where: str, error: Exception) -> None:
        nonlocal count
        count += 1
        if len(problems) < _SHOWN_PROBLEMS:
            problems.append(f"{where}: {error}")

    for app in apps:
        try:
            check_app_name(app)
        except ValueError as error:
            refuse(f"app {_shown(app)}", error)
            continue
        listed = (await source.list_sessions(app_name=app)).sessions
        bad_users = set()
        for user in _users(app, owners, listed):
            try:
                check_id(user, "user_id")
                state = await _user_state(source, app, user)
                if state is not None:
                    _packed(state, _USER_PREFIX)
            except (TypeError, ValueError, OverflowError) as error:
                refuse(f"app {_shown(app)}, user {_shown(user)}", error)
                bad_users.add(user)
        for meta in listed:
            if meta.user_id in bad_users:
                continue
            session = await source.get_session(
                app_name=app, user_id=meta.user_id, session_id=meta.id
            )
            if session is None:  # deleted meanwhile
                continue
            try:
                _copy_of(session, model)
            except (TypeError, ValueError, OverflowError) as error:
                refuse(_where(session), error)
    if count:
        more = f"\n  - and {count - len(problems)} more" if count > len(problems) else ""
        raise _Refused(
            f"the ADK source holds {count} "
            f"{'thing' if count == 1 else 'things'} the store would refuse or change; "
            "nothing was written:\n" + "\n".join(f"  - {line}" for line in problems) + more
        )


async def _write_all(
    source: Any,
    store: Store,
    owners: set[tuple[str, str]],
    apps: list[str],
    report: MigrationReport,
    progress: Callable[[int], None] | None,
    at: list[str],
) -> None:
    """Write every session of the apps, then read each back on both sides and compare."""
    from . import AdkModel, _AdkService

    model = AdkModel()
    target = _AdkService(store)
    migrated: list[tuple[str, str, str]] = []
    for app in apps:
        report.apps += 1
        listed = (await source.list_sessions(app_name=app)).sessions
        for user in _users(app, owners, listed):
            report.users += 1
            at.append(f"app {_shown(app)}, user {_shown(user)}")
            state = await _user_state(source, app, user)
            if state is not None:
                items = _checked(f"app {_shown(app)}, user {_shown(user)}", _packed, state)
                await store.aio.write_user_state(app, user, items)
        app_written = False
        for meta in sorted(listed, key=lambda s: (s.user_id, s.id)):
            session = await source.get_session(
                app_name=app, user_id=meta.user_id, session_id=meta.id
            )
            if session is None:  # deleted meanwhile
                continue
            at.append(_where(session))
            report.sessions += 1
            report.events += len(session.events)
            app_items, user_items, copy = _checked(_where(session), _copy_of, session, model)
            if not app_written:
                await store.aio.write_app_state(app, app_items)
                app_written = True
            await store.aio.write_user_state(app, session.user_id, user_items)
            try:
                written = await store.aio.restore_session(copy)
            except AlreadyExistsError:
                report.differences.append(
                    f"{_name(session)}: the store already holds it with other content; "
                    "left as it is"
                )
            else:
                if written:
                    report.copied += 1
                else:
                    report.skipped += 1
            migrated.append((app, session.user_id, session.id))
            if progress is not None:
                progress(1 + len(session.events))
    await store.aio.flush()
    at.append("")  # everything is stored: a failure from here on is in the verification
    for app, user, sid in migrated:
        report.differences.extend(await _compare(source, target, app, user, sid))


def _checked(where: str, make: Callable[..., Any], *args: Any) -> Any:
    """Return ``make(*args)``; a refusal, found though the check pass passed, names ``where``."""
    try:
        return make(*args)
    except (TypeError, ValueError, OverflowError) as error:
        raise _Refused(f"{where}: {error} (the source changed after it was checked)") from None


async def _owners(source: Any, source_url: str) -> set[tuple[str, str]]:
    """Return every (app, user) pair the source's tables hold sessions or user state of."""
    from google.adk.sessions.database_session_service import DatabaseSessionService
    from google.adk.sessions.sqlite_session_service import SqliteSessionService

    rows: Any
    if isinstance(source, SqliteSessionService):
        rows = await asyncio.to_thread(_sqlite_rows, source_url, _OWNERS_QUERY)
    elif isinstance(source, DatabaseSessionService):
        from sqlalchemy import text

        await source.prepare_tables()
        async with source.db_engine.connect() as connection:
            rows = (await connection.execute(text(_OWNERS_QUERY))).all()
    else:  # pragma: no cover - open_adk_service refuses other services
        raise ValueError(f"cannot list the apps of a {type(source).__name__}")
    return {(str(row[0]), str(row[1])) for row in rows}


def _sqlite_file(source_url: str) -> str | None:
    """Return the database file a ``sqlite://`` or SQLAlchemy SQLite URL names; None for others.

    Read by the URL forms ADK documents for ``--session_service_uri``, not by
    the service's private fields: ``sqlite:///x.db`` is the relative path
    ``x.db``, ``sqlite:////srv/x.db`` the absolute ``/srv/x.db``; the query
    is not part of the path.
    """
    scheme, _, rest = source_url.partition("://")
    if scheme.split("+", 1)[0] != "sqlite":
        return None
    path = unquote(urlsplit(f"sqlite://{rest}").path)
    return path[1:] if path.startswith("/") else path


def _sqlite_rows(source_url: str, query: str) -> list[tuple[Any, ...]]:
    """Run a read-only query on the SQLite file the URL names, and close it."""
    path = _sqlite_file(source_url)
    assert path is not None
    uri = f"file:{quote(os.path.abspath(path))}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True)) as connection:
        return connection.execute(query).fetchall()


async def _user_state(source: Any, app: str, user: str) -> dict[str, Any] | None:
    """Return a user's state map through ADK's API; None when the service cannot say."""
    try:
        state: dict[str, Any] = await source.get_user_state(app_name=app, user_id=user)
    except NotImplementedError:
        return None
    return state


def _copy_of(
    session: Session, model: Any
) -> tuple[list[tuple[str, bytes]], list[tuple[str, bytes]], SessionCopy]:
    """Split an ADK session into its app items, user items and a session copy.

    Everything the service would refuse or change is refused here, as the
    service would refuse it: the ids (a session id with surrounding
    whitespace too, which the service strips, so the copy could never be read
    or deleted by its id), every state value (naming its key path), every
    event and its id.
    """
    from ..stores.records import EventCopy

    check_app_name(session.app_name)
    check_id(session.user_id, "user_id")
    if check_session_id(session.id) != session.id:
        raise ValueError(
            "session_id has surrounding whitespace, which the service strips: "
            "the copy could not be read or deleted by its id"
        )
    app: dict[str, Any] = {}
    user: dict[str, Any] = {}
    own: dict[str, Any] = {}
    for key, value in session.state.items():
        if key.startswith(_APP_PREFIX):
            app[key[len(_APP_PREFIX) :]] = value
        elif key.startswith(_USER_PREFIX):
            user[key[len(_USER_PREFIX) :]] = value
        elif not key.startswith(_TEMP_PREFIX):
            own[key] = value
    events = []
    for index, event in enumerate(session.events):
        try:
            events.append(
                EventCopy(model.event_id(event), float(event.timestamp), model.encode_event(event))
            )
        except (TypeError, ValueError, OverflowError) as error:
            raise ValueError(f"event {index}: {error}") from None
    first = min([e.timestamp for e in events] + [session.last_update_time])
    copy = SessionCopy(
        session.app_name,
        session.user_id,
        session.id,
        first,
        float(session.last_update_time),
        _packed(own),
        events,
    )
    check_copy(copy)
    return _packed(app, _APP_PREFIX), _packed(user, _USER_PREFIX), copy


def _packed(values: dict[str, Any], prefix: str = "") -> list[tuple[str, bytes]]:
    """Pack a state map; a value the store refuses names its key path (with its prefix)."""
    from ..core import check_delta

    check_delta({prefix + key: value for key, value in values.items()}, "state")
    return [(key, pack(value)) for key, value in values.items()]


async def _compare(source: Any, target: Any, app: str, user: str, sid: str) -> list[str]:
    """Return the differences between a session read from both sides through ADK's API."""
    theirs = await source.get_session(app_name=app, user_id=user, session_id=sid)
    try:
        ours = await target.get_session(app_name=app, user_id=user, session_id=sid)
    except SessionscopeError as error:
        return [f"{app}/{user}/{sid}: reading the copy failed: {error}"]
    if theirs is None:
        return []  # deleted from the source meanwhile
    name = _name(theirs)
    if ours is None:
        return [f"{name}: missing from the store"]
    found = []
    for field_name in ("id", "app_name", "user_id", "state", "last_update_time"):
        if not _same(getattr(theirs, field_name), getattr(ours, field_name)):
            found.append(f"{name}: {field_name} differs")
    if len(theirs.events) != len(ours.events):
        found.append(f"{name}: {len(theirs.events)} events, the copy has {len(ours.events)}")
    else:
        for index, (a, b) in enumerate(zip(theirs.events, ours.events, strict=True)):
            if not _same(a.model_dump(), b.model_dump()):
                found.append(f"{name}: event {index} ({a.id}) differs")
    return found


def _same(a: Any, b: Any) -> bool:
    """Return ``a == b``, but with a NaN equal to a NaN: an exact copy of a NaN compares equal."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[key], b[key]) for key in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    return bool(a == b)


def _shown(text: str) -> str:
    """Return an id for a message: quoted, and cut when long."""
    if len(text) <= _SHOWN_ID:
        return repr(text)
    return f"{text[:_SHOWN_ID]!r}... ({len(text)} characters)"


def _where(session: Any) -> str:
    return (
        f"app {_shown(session.app_name)}, user {_shown(session.user_id)}, "
        f"session {_shown(session.id)}"
    )


def _name(session: Any) -> str:
    return f"{session.app_name}/{session.user_id}/{session.id}"


async def _close(service: Any) -> None:
    close = getattr(service, "close", None)
    if close is None:
        return
    outcome = close()
    if inspect.isawaitable(outcome):
        await outcome
