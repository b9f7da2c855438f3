"""Every store against a small reference model, driven by random operation sequences.

A hypothesis state machine creates, appends to (plainly, from a stale copy,
and locked), reads, lists and deletes sessions, and reopens the store mid-run
(a new store object on the same path, from the same factory). After every step
the whole store is compared with the model: each session's events, state and
existence, the listings, the app and user maps.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from _stores import STORE_KINDS, StoreFactory, ev
from sessionscope import SyncSessionService
from sessionscope.errors import AlreadyExistsError, SessionNotFoundError, StaleSessionError

APP = "app"
USERS = ("u1", "u2")
SESSION_IDS = ("s1", "s2", "s3")
KEYS = ("a", "b", "app:x", "user:y", "temp:t")

deltas = st.dictionaries(st.sampled_from(KEYS), st.integers(-3, 3), max_size=3)
owners = st.tuples(st.sampled_from(USERS), st.sampled_from(SESSION_IDS))


@dataclass
class ModelSession:
    """What the store should hold for one session."""

    state: dict[str, Any] = field(default_factory=dict)
    events: list[str] = field(default_factory=list)
    # The copies the test holds: kept up to date by its own appends, or read once.
    live: Any = None
    old: Any = None


@dataclass
class Model:
    """The reference: sessions by (user, id), the app map and the user maps."""

    sessions: dict[tuple[str, str], ModelSession] = field(default_factory=dict)
    app: dict[str, Any] = field(default_factory=dict)
    users: dict[str, dict[str, Any]] = field(default_factory=dict)

    def apply(self, user: str, session: ModelSession, delta: dict[str, Any]) -> None:
        for key, value in delta.items():
            if key.startswith("app:"):
                self.app[key[4:]] = value
            elif key.startswith("user:"):
                self.users.setdefault(user, {})[key[5:]] = value
            elif not key.startswith("temp:"):
                session.state[key] = value

    def merged(self, user: str, session: ModelSession) -> dict[str, Any]:
        state = dict(session.state)
        state.update({f"app:{k}": v for k, v in self.app.items()})
        state.update({f"user:{k}": v for k, v in self.users.get(user, {}).items()})
        return state


_runs = itertools.count()


class StoreMachine(RuleBasedStateMachine):
    """Drive one store of one kind; compare with the model after every step."""

    kind = "memory"
    base = Path()

    def __init__(self) -> None:
        super().__init__()
        self.factory = StoreFactory(self.kind, self.base / f"run{next(_runs)}")
        self.factory.path.parent.mkdir(parents=True)
        self.svc = SyncSessionService(self.factory())
        self.model = Model()

    def teardown(self) -> None:
        self.factory.close_all()

    @rule(owner=owners, delta=deltas)
    def create(self, owner: tuple[str, str], delta: dict[str, Any]) -> None:
        user, sid = owner
        if owner in self.model.sessions:
            with pytest.raises(AlreadyExistsError):
                self.svc.create_session(app_name=APP, user_id=user, session_id=sid, state=delta)
            return
        created = self.svc.create_session(app_name=APP, user_id=user, session_id=sid, state=delta)
        session = ModelSession()
        self.model.apply(user, session, delta)
        assert created.id == sid and created.events == []
        assert created.state == self.model.merged(user, session)
        session.live = created
        self.model.sessions[owner] = session

    @rule(owner=owners)
    def get(self, owner: tuple[str, str]) -> None:
        user, sid = owner
        found = self.svc.get_session(app_name=APP, user_id=user, session_id=sid)
        session = self.model.sessions.get(owner)
        if session is None:
            assert found is None
            return
        assert found is not None
        session.old = found

    @rule(owner=owners, delta=deltas, copy=st.sampled_from(["live", "old"]))
    def append(self, owner: tuple[str, str], delta: dict[str, Any], copy: str) -> None:
        session = self.model.sessions.get(owner)
        if session is None or getattr(session, copy) is None:
            return
        held = getattr(session, copy)
        event = ev(delta=delta)
        if [e.id for e in held.events] != session.events:
            with pytest.raises(StaleSessionError):
                self.svc.append_event(held, event)
            return
        self.svc.append_event(held, event)
        self.model.apply(owner[0], session, delta)
        session.events.append(event.id)
        # A plain append brings its own delta into the copy (not what other
        # sessions wrote to the shared maps meanwhile).
        assert [e.id for e in held.events] == session.events
        assert {k: held.state[k] for k in delta} == delta

    @rule(owner=owners, delta=deltas, copy=st.sampled_from(["live", "old"]))
    def append_locked(self, owner: tuple[str, str], delta: dict[str, Any], copy: str) -> None:
        session = self.model.sessions.get(owner)
        if session is None or getattr(session, copy) is None:
            return
        held = getattr(session, copy)
        event = ev(delta=delta)
        self.svc.append_event_locked(held, event)
        self.model.apply(owner[0], session, delta)
        session.events.append(event.id)
        # A locked append brings the copy up to date, whatever it missed.
        assert [e.id for e in held.events] == session.events
        temp = {k: v for k, v in held.state.items() if k.startswith("temp:")}
        state = {k: v for k, v in held.state.items() if not k.startswith("temp:")}
        assert state == self.model.merged(owner[0], session)
        if "temp:t" in delta:
            assert temp["temp:t"] == delta["temp:t"]

    @rule(owner=owners)
    def delete(self, owner: tuple[str, str]) -> None:
        user, sid = owner
        self.svc.delete_session(app_name=APP, user_id=user, session_id=sid)
        gone = self.model.sessions.pop(owner, None)
        if gone is not None and gone.live is not None:
            with pytest.raises(SessionNotFoundError):
                self.svc.append_event(gone.live, ev())

    @rule()
    def reopen(self) -> None:
        if not self.factory.persistent:
            return  # a memory store lives only in its object
        self.svc.close()
        self.svc = SyncSessionService(self.factory.reopen())

    @invariant()
    def store_matches_model(self) -> None:
        model = self.model
        for user, sid in itertools.product(USERS, SESSION_IDS):
            found = self.svc.get_session(app_name=APP, user_id=user, session_id=sid)
            session = model.sessions.get((user, sid))
            if session is None:
                assert found is None, (user, sid)
                continue
            assert found is not None, (user, sid)
            assert [e.id for e in found.events] == session.events
            assert found.state == model.merged(user, session)
        for user in USERS:
            listed = self.svc.list_sessions(app_name=APP, user_id=user).sessions
            expected = {sid for (owner, sid) in model.sessions if owner == user}
            assert {s.id for s in listed} == expected
            assert self.svc.get_user_state(app_name=APP, user_id=user) == model.users.get(user, {})
        everyone = self.svc.list_sessions(app_name=APP).sessions
        assert {(s.user_id, s.id) for s in everyone} == set(model.sessions)
        assert self.svc.get_app_state(app_name=APP) == model.app


@pytest.mark.parametrize("kind", STORE_KINDS)
def test_every_store_behaves_as_the_model(kind: str, tmp_path: Path) -> None:
    machine = type(f"StoreMachine_{kind}", (StoreMachine,), {"kind": kind, "base": tmp_path})
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=50,
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
