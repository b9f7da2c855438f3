"""Property tests: the compiled append path and its source write the same bytes.

Both builds run in this one process: the store and the service are pointed
at one build, then the other, and the same appends (single, retried,
batched, out of time order, with deltas on every scope and keys long enough
to be stored under a digest) must leave byte-identical stores and give
the same answers.
"""

from __future__ import annotations

import importlib
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sessionscope.service.core
import sessionscope.stores.lmdb.store
import sessionscope.stores.lmdb.writer
from sessionscope.errors import SessionscopeError
from sessionscope.model import Event, EventActions
from sessionscope.service import SyncSessionService
from sessionscope.stores.lmdb import LmdbStore

PURE_BUILD = os.environ.get("SESSIONSCOPE_NO_EXTENSIONS", "") not in ("", "0")


def _builds(name: str) -> tuple[ModuleType, ModuleType | None]:
    source = importlib.import_module(name)
    try:
        compiled: ModuleType | None = importlib.import_module(name + "_c")
    except ImportError:
        # Missing only where the pure build was asked for.
        if not PURE_BUILD:
            raise
        compiled = None
    return source, compiled


SERVICE = _builds("sessionscope.service._append")
STORE = _builds("sessionscope.stores.lmdb._append")

pytestmark = pytest.mark.skipif(
    SERVICE[1] is None or STORE[1] is None,
    reason="compiled append path not built (SESSIONSCOPE_NO_EXTENSIONS is set)",
)

SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

LONG = "k" * 200  # over the raw part limit: stored under a digest
names = st.sampled_from(["a", "b", LONG, "ü", "x" * 151])
keys = st.one_of(
    names,
    st.builds(lambda p, n: p + n, st.sampled_from(["app:", "user:", "temp:"]), names),
)
# Plain values (a batch routes them straight to packed items), the ends of the
# int range and one past them (refused), and values only the scope core's
# checks route (lists, non-ASCII text).
values = st.one_of(
    st.integers(-5, 5),
    st.sampled_from([2**64 - 1, -(2**63), 2**64, -(2**63) - 1, True, 0.5, b"\x00"]),
    st.text(max_size=4),
    st.none(),
    st.lists(st.booleans()),
)
deltas = st.dictionaries(keys, values, max_size=5)
contents = st.one_of(st.none(), st.dictionaries(st.text(max_size=3), values, max_size=3))
# (session, event number, time step, delta, how, content): time steps may go back.
steps = st.tuples(
    st.integers(0, 1),
    st.integers(0, 7),
    st.sampled_from([1.0, 0.0, -3.0, 0.5]),
    deltas,
    st.sampled_from(["one", "locked", "batch"]),
    contents,
)


@contextmanager
def _running(service_build: ModuleType, store_build: ModuleType) -> Iterator[None]:
    lmdb_modules = (sessionscope.stores.lmdb.store, sessionscope.stores.lmdb.writer)
    saved = sessionscope.service.core._hot, [module._hot for module in lmdb_modules]
    sessionscope.service.core._hot = service_build  # type: ignore[assignment]
    for module in lmdb_modules:
        module._hot = store_build  # type: ignore[assignment]
    try:
        yield
    finally:
        sessionscope.service.core._hot = saved[0]
        for module, build in zip(lmdb_modules, saved[1], strict=True):
            module._hot = build


def _dump(store: LmdbStore) -> dict[bytes, list[tuple[bytes, bytes]]]:
    with store._writer.env.begin() as txn:
        return {
            name: [(bytes(k), bytes(v)) for k, v in txn.cursor(db=handle)]
            for name, handle in sorted(store._writer.dbs.items())
        }


def _run(path: Path, plan: list[Any]) -> tuple[list[Any], dict[bytes, list[Any]]]:
    """Run a plan of appends on a new store; return what each did and the stored bytes."""
    store = LmdbStore(path, durability="deferred", map_size=1 << 20)
    answers: list[Any] = []
    try:
        service = SyncSessionService(store)
        sessions = []
        for n in range(2):
            store.create_session("app", "user", f"s{n}", 1000.0, [], [], []).result()
            session = service.get_session(app_name="app", user_id="user", session_id=f"s{n}")
            assert session is not None
            sessions.append(session)
        clock = 1000.0
        batch: list[Any] = []
        for which, number, step, delta, how, content in plan:
            clock += step
            event = Event(
                author="tester",
                content=content,
                id=f"e{number}",
                timestamp=clock,
                actions=EventActions(state_delta=dict(delta)),
            )
            session = sessions[which]
            try:
                if how == "batch":
                    batch.append((session, event))
                    continue
                if batch:
                    answers.append([e.id for e in service.append_many(batch)])
                    batch = []
                if how == "locked":
                    service.append_event_locked(session, event)
                else:
                    service.append_event(session, event)
                answers.append((session.revision, session.last_update_time, dict(session.state)))
            except SessionscopeError as error:
                batch = []
                answers.append(type(error).__name__)
        if batch:
            try:
                answers.append([e.id for e in service.append_many(batch)])
            except SessionscopeError as error:
                answers.append(type(error).__name__)
        return answers, _dump(store)
    finally:
        store.close()
        shutil.rmtree(path, ignore_errors=True)


@SETTINGS
@given(plan=st.lists(steps, max_size=14))
def test_both_builds_store_the_same_bytes(
    plan: list[Any], tmp_path_factory: pytest.TempPathFactory
) -> None:
    (service_source, service_compiled), (store_source, store_compiled) = SERVICE, STORE
    assert service_compiled is not None and store_compiled is not None
    with _running(service_source, store_source):
        expected = _run(tmp_path_factory.mktemp("twin"), plan)
    with _running(service_compiled, store_compiled):
        got = _run(tmp_path_factory.mktemp("compiled"), plan)
    assert got == expected


# Event fields as a caller may set them: plain maps, and values only the checked path packs.
field_values = st.one_of(
    st.none(),
    st.text(max_size=4),
    values,
    st.dictionaries(st.text(max_size=3), st.one_of(values, st.tuples(values)), max_size=3),
)


@SETTINGS
@given(
    content=field_values,
    metadata=st.one_of(st.none(), st.dictionaries(st.text(max_size=3), values, max_size=2)),
    author=st.text(max_size=4),
    delta=deltas,
)
def test_an_event_packs_to_the_bytes_of_its_checked_record(
    content: Any, metadata: Any, author: str, delta: dict[str, Any]
) -> None:
    """The one-walk packing of a plain record and the checked path give the same bytes."""
    for build in SERVICE:
        if build is None:
            continue
        event = Event(
            author=author,
            content=content,
            custom_metadata=metadata,
            id="e1",
            timestamp=1000.5,
            actions=EventActions(state_delta=dict(delta)),
        )
        assert _outcome(build.encode_event, event) == _outcome(_checked_bytes, build, event)


def _checked_bytes(build: ModuleType, event: Event) -> bytes:
    from sessionscope import codec

    return bytes([codec.EVENT_FORMAT]) + codec.pack(build.event_to_record(event))


def _outcome(function: Any, *args: Any) -> tuple[str, Any]:
    try:
        return "ok", function(*args)
    except Exception as error:  # compared by type and message
        return type(error).__name__, str(error)


# Deltas as callers send them: plain values, nested plain maps and lists,
# non-ASCII text, and values only the checked partition names (tuples, sets,
# ints past the 64-bit range).
route_values = st.one_of(
    values,
    st.dictionaries(st.text(max_size=3), values, max_size=2),
    st.sampled_from([(1, 2), {1, 2}, "lone \ud800", 2**70]),
)


@SETTINGS
@given(delta=st.dictionaries(st.one_of(keys, st.sampled_from([1, "é:k"])), route_values))
def test_a_routed_delta_packs_as_the_checked_partition(delta: dict[Any, Any]) -> None:
    """The plain route gives the checked partition's items and temp map, or leaves it the delta."""
    from sessionscope import codec
    from sessionscope.core import partition_checked
    from sessionscope.service import _append

    routed = _append._route_plain(delta)
    checked = _outcome(partition_checked, delta)
    if routed is None:
        return
    assert checked[0] == "ok"
    app, user, session, temp = checked[1]
    assert routed[:3] == (
        [(key, codec.pack(value)) for key, value in app.items()],
        [(key, codec.pack(value)) for key, value in user.items()],
        [(key, codec.pack(value)) for key, value in session.items()],
    )
    # No temp map is made for a delta without temp keys.
    assert routed[3] == (temp or None)
