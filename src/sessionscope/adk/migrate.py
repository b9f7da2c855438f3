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

Limits: an app's ``app:`` state is copied through its sessions (ADK has no
call that reads it alone), so an app with state and no session brings none.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import inspect
import os
import sqlite3
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote, urlsplit

from ..codec import pack
from ..errors import AlreadyExistsError, SessionscopeError
from ..stores.protocol import Store
from ..stores.records import SessionCopy

if TYPE_CHECKING:
    from google.adk.sessions import BaseSessionService, Session

__all__ = ["MigrationReport", "migrate_from_adk"]

_APP_PREFIX, _USER_PREFIX, _TEMP_PREFIX = "app:", "user:", "temp:"
# Every (app, user) pair a source holds sessions or user state of: ADK's API
# lists no apps, and every schema version ADK reads has these two tables.
_OWNERS_QUERY = (
    "SELECT app_name, user_id FROM sessions UNION SELECT app_name, user_id FROM user_states"
)


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
    the number of records (a session and its events) just handled.
    """
    if not isinstance(source_url, str) or "://" not in source_url:
        raise ValueError(
            f"source_url must be a URL such as sqlite:///sessions.db, not {source_url!r}"
        )
    if app_name is not None and (not isinstance(app_name, str) or not app_name):
        raise ValueError(f"app_name must be a non-empty str or None, not {app_name!r}")
    return asyncio.run(_migrate(source_url, store, app_name, progress))


def open_adk_service(source_url: str) -> BaseSessionService:
    """Open the ADK session service ``--session_service_uri source_url`` would open.

    A source that names a database file that does not exist is refused
    before ADK would create it.
    """
    from google.adk.cli.utils.service_factory import create_session_service_from_options
    from google.adk.sessions.database_session_service import DatabaseSessionService
    from google.adk.sessions.sqlite_session_service import SqliteSessionService

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
        raise ValueError(f"cannot open the ADK session store {source_url!r}: {error}") from None
    if not isinstance(service, (SqliteSessionService, DatabaseSessionService)):
        raise ValueError(
            f"{source_url!r} opens a {type(service).__name__}: migrate reads sqlite:// and "
            "SQLAlchemy database URLs"
        )
    path = _sqlite_file(source_url)
    # Neither service connects before its first call: nothing is open to close.
    if path is not None and (not path or path == ":memory:" or not os.path.isfile(path)):
        raise ValueError(f"{source_url!r} names no existing database file ({path or 'none'})")
    return service


async def _migrate(
    source_url: str,
    store: Store,
    only_app: str | None,
    progress: Callable[[int], None] | None,
) -> MigrationReport:
    from . import AdkModel, _AdkService

    source = open_adk_service(source_url)
    target = _AdkService(store)
    model = AdkModel()
    report = MigrationReport()
    try:
        owners = await _owners(source, source_url)
        apps = [only_app] if only_app is not None else sorted({app for app, _ in owners})
        migrated: list[tuple[str, str, str]] = []
        users_seen: set[tuple[str, str]] = set()
        for app in apps:
            report.apps += 1
            listed = (await source.list_sessions(app_name=app)).sessions
            users = sorted({user for a, user in owners if a == app} | {s.user_id for s in listed})
            for user in users:
                report.users += 1
                users_seen.add((app, user))
                state = await _user_state(source, app, user)
                if state is not None:
                    await store.aio.write_user_state(app, user, _packed(state))
            app_written = False
            for meta in sorted(listed, key=lambda s: (s.user_id, s.id)):
                session = await source.get_session(
                    app_name=app, user_id=meta.user_id, session_id=meta.id
                )
                if session is None:  # deleted meanwhile
                    continue
                report.sessions += 1
                report.events += len(session.events)
                app_items, user_items, copy = _copy_of(session, model)
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
        for app, user, sid in migrated:
            report.differences.extend(await _compare(source, target, app, user, sid))
    finally:
        await _close(source)
    return report


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
    """Split an ADK session into its app items, user items and a session copy."""
    from ..stores.records import EventCopy

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
    events = [
        EventCopy(model.event_id(event), float(event.timestamp), model.encode_event(event))
        for event in session.events
    ]
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
    return _packed(app), _packed(user), copy


def _packed(values: dict[str, Any]) -> list[tuple[str, bytes]]:
    from ..core import check_storable

    items = []
    for key, value in values.items():
        check_storable(value, f"state[{key!r}]")
        items.append((key, pack(value)))
    return items


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
        if getattr(theirs, field_name) != getattr(ours, field_name):
            found.append(f"{name}: {field_name} differs")
    if len(theirs.events) != len(ours.events):
        found.append(f"{name}: {len(theirs.events)} events, the copy has {len(ours.events)}")
    else:
        for index, (a, b) in enumerate(zip(theirs.events, ours.events, strict=True)):
            if a.model_dump() != b.model_dump():
                found.append(f"{name}: event {index} ({a.id}) differs")
    return found


def _name(session: Any) -> str:
    return f"{session.app_name}/{session.user_id}/{session.id}"


async def _close(service: Any) -> None:
    close = getattr(service, "close", None)
    if close is None:
        return
    outcome = close()
    if inspect.isawaitable(outcome):
        await outcome
