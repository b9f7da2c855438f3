"""An append handed an object of another kind: a TypeError naming it, nothing stored.

The native services take this package's ``Session`` and ``Event``, the ADK
drop-in google-adk's. Both are read by the same field names, so a google-adk
``Event`` given to the native service (or a dict, or None) used to fail deep
in the encoder with an AttributeError about a field it lacks.
"""

from __future__ import annotations

from typing import Any

import pytest

import _stores
from _stores import APP, USER, run
from sessionscope import Event, EventActions, SessionService, SyncSessionService

svc = _stores.svc
asvc = _stores.asvc
store_factory = _stores.store_factory

adk_events = pytest.importorskip("google.adk.events")


def _others() -> list[Any]:
    return [adk_events.Event(author="agent"), {"author": "agent"}, None, "event"]


def _stored(svc: SyncSessionService) -> tuple[int, dict[str, Any]]:
    stored = svc.get_session(app_name=APP, user_id=USER, session_id="s")
    assert stored is not None
    return len(stored.events), stored.state


@pytest.mark.parametrize("locked", [False, True])
def test_an_event_of_another_kind_is_a_type_error(svc: SyncSessionService, locked: bool) -> None:
    session = svc.create_session(app_name=APP, user_id=USER, session_id="s", state={"n": 1})
    append = svc.append_event_locked if locked else svc.append_event
    for other in _others():
        with pytest.raises(TypeError, match=r"^event must be a sessionscope\.model\.Event, not a "):
            append(session, other)
    with pytest.raises(TypeError, match=r"^session must be a sessionscope\.model\.Session"):
        append({"id": "s"}, Event(author="agent"))  # type: ignore[arg-type]
    assert _stored(svc) == (0, {"n": 1})
    # The session object is as it was: an append from it goes through.
    append(session, Event(author="agent"))
    assert _stored(svc)[0] == 1


def test_the_async_service_names_them_too(asvc: SessionService) -> None:
    async def go() -> None:
        session = await asvc.create_session(app_name=APP, user_id=USER, session_id="s")
        with pytest.raises(TypeError, match=r"^event must be a sessionscope\.model\.Event"):
            await asvc.append_event(session, adk_events.Event(author="agent"))
        stored = await asvc.get_session(app_name=APP, user_id=USER, session_id="s")
        assert stored is not None and stored.events == []

    run(go())


def test_a_batch_names_its_first_pair_of_another_kind(svc: SyncSessionService) -> None:
    session = svc.create_session(app_name=APP, user_id=USER, session_id="s")
    good = Event(author="agent", actions=EventActions(state_delta={"n": 1, "temp:t": 2}))
    batches: list[tuple[list[Any], str]] = [
        ([(session, good), (session, adk_events.Event(author="agent"))], r"^appends\[1\]: event "),
        (
            [(session, good), (session,)],
            r"^appends\[1\] must be a \(session, event\) pair, not a tuple of 1",
        ),
        (
            [(session, good), session],
            r"^appends\[1\] must be a \(session, event\) pair, not a Session",
        ),
        ([(session, good), (None, good)], r"^appends\[1\]: session must be a sessionscope"),
    ]
    for batch, message in batches:
        with pytest.raises(TypeError, match=message):
            svc.append_many(batch)
        # Nothing stored, and the good event keeps its whole delta for a retry.
        assert _stored(svc) == (0, {})
        assert good.actions.state_delta == {"n": 1, "temp:t": 2}
    # A generator is taken as a list is.
    assert len(svc.append_many((session, Event(author="agent")) for _ in range(3))) == 3


def test_the_adk_drop_in_names_a_native_event(tmp_path: Any) -> None:
    from sessionscope.adk import LmdbSessionService

    async def go() -> None:
        service = LmdbSessionService(str(tmp_path / "store"))
        try:
            session = await service.create_session(app_name=APP, user_id=USER, session_id="s")
            with pytest.raises(
                TypeError, match=r"^event must be a google\.adk\.events\.event\.Event"
            ):
                await service.append_event(session, Event(author="agent"))  # type: ignore[arg-type]
            stored = await service.get_session(app_name=APP, user_id=USER, session_id="s")
            assert stored is not None and stored.events == []
        finally:
            await service.close()

    run(go())
