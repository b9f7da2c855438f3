"""The same calls on the SDK's own SQLiteSession and on AgentsSession give equal results.

Sequences of add_items, get_items (with and without limits, and with a
settings limit), pop_item and clear_session on two sessions, drawn from
fixed seeds, run on both and compared call by call, on every store kind.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents")

from agents import SQLiteSession
from agents.memory import SessionSettings

from _stores import StoreFactory, run, store_factory
from sessionscope.openai_agents import AgentsSession

__all__ = ["store_factory"]

pytestmark = pytest.mark.openai_agents


def _item(rng: random.Random, n: int) -> dict[str, Any]:
    """Return an input item of one of the SDK's shapes (JSON values: SQLite stores JSON)."""
    shape = rng.randrange(4)
    if shape == 0:
        return {"role": rng.choice(["user", "system", "developer"]), "content": f"text {n} ✓"}
    if shape == 1:
        return {"type": "function_call", "name": "tool", "arguments": f'{{"n": {n}}}',
                "call_id": f"c{n}", "id": f"fc{n}", "status": "completed"}  # fmt: skip
    if shape == 2:
        return {"type": "function_call_output", "call_id": f"c{n}", "output": str(n * 7)}
    return {
        "type": "message", "role": "assistant", "id": f"m{n}", "status": "completed",
        "content": [{"type": "output_text", "text": f"answer {n}", "annotations": [],
                     "logprobs": [{"p": -0.5, "top": [1, 2.25, None, True]}]}],
    }  # fmt: skip


def _calls(seed: int, length: int) -> list[tuple[str, str, Any]]:
    """Return a sequence of (method, session id, argument)."""
    rng = random.Random(seed)
    calls: list[tuple[str, str, Any]] = []
    made = 0
    for _ in range(length):
        sid = rng.choice(["a", "a", "a", "b"])
        kind = rng.choices(["add", "get", "pop", "clear"], weights=[5, 4, 3, 1])[0]
        if kind == "add":
            count = rng.choice([0, 1, 1, 2, 3, 7])
            calls.append(("add", sid, [_item(rng, made + i) for i in range(count)]))
            made += count
        elif kind == "get":
            calls.append(("get", sid, rng.choice([None, None, 0, 1, 2, 3, 5, 100])))
        else:
            calls.append((kind, sid, None))
    return calls


async def _play(sessions: dict[str, Any], calls: list[tuple[str, str, Any]]) -> list[Any]:
    answers: list[Any] = []
    for method, sid, argument in calls:
        session = sessions[sid]
        if method == "add":
            answers.append(await session.add_items(argument))
        elif method == "get":
            answers.append(await session.get_items(argument))
        elif method == "pop":
            answers.append(await session.pop_item())
        else:
            answers.append(await session.clear_session())
    for session in sessions.values():
        answers.append(await session.get_items())
    return answers


@pytest.mark.parametrize("seed", range(6))
def test_the_same_calls_give_the_same_answers_as_sqlite_session(
    store_factory: StoreFactory, tmp_path: Path, seed: int
) -> None:
    calls = _calls(seed, 120)
    settings = SessionSettings(limit=4) if seed % 3 == 2 else None
    sqlite = {sid: SQLiteSession(sid, tmp_path / "sdk.db", session_settings=settings)
              for sid in ("a", "b")}  # fmt: skip
    store = store_factory()
    ours = {sid: AgentsSession(sid, store, session_settings=settings) for sid in ("a", "b")}
    try:
        expected = run(_play(sqlite, calls))
    finally:
        for session in sqlite.values():
            session.close()
    assert run(_play(ours, calls)) == expected
    # The sequences did something: items were added, read back and popped.
    assert any(isinstance(answer, dict) for answer in expected)
    assert any(isinstance(answer, list) and answer for answer in expected)


def test_none_stores_nothing_as_on_sqlite_session(
    store_factory: StoreFactory, tmp_path: Path
) -> None:
    """Every session of the SDK returns at once for no items: None is taken as []."""

    async def scenario(session: Any) -> list[Any]:
        await session.add_items([{"role": "user", "content": "kept"}])
        await session.add_items(None)
        return await session.get_items()

    sqlite = SQLiteSession("s", tmp_path / "sdk.db")
    try:
        expected = run(scenario(sqlite))
    finally:
        sqlite.close()
    assert run(scenario(AgentsSession("s", store_factory()))) == expected
    assert expected == [{"role": "user", "content": "kept"}]
