"""Child processes of the OpenAI Agents tests: add, pop, append natively, clear, or run a turn.

Run as ``python _agents_workers.py COMMAND ARGS...``; each prints ``ready``
once its store is open, waits for a line on stdin (so that every child
starts its work at once), then prints ``done`` and a JSON line.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

from agents import Agent, Runner, function_tool, set_tracing_disabled
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from sessionscope import Event, SessionService
from sessionscope.openai_agents import AgentsSession
from sessionscope.stores import open_store


def _say(*parts: object) -> None:
    print(*parts, flush=True)


def _start() -> None:
    _say("ready")
    sys.stdin.readline()


async def add(uri: str, sid: str, tag: str, lists: str, size: str) -> None:
    """Add ``lists`` lists of ``size`` items, each item naming its writer, list and place."""
    store = open_store(uri)
    session = AgentsSession(sid, store)
    _start()
    for n in range(int(lists)):
        await session.add_items(
            [{"role": "user", "content": f"{tag}:{n}:{i}"} for i in range(int(size))]
        )
    await store.aio.close()
    _say("done")
    _say(json.dumps([]))


async def pop(uri: str, sid: str) -> None:
    """Pop until the session is empty; print what this process got."""
    store = open_store(uri)
    session = AgentsSession(sid, store)
    _start()
    got = []
    while (item := await session.pop_item()) is not None:
        got.append(item["content"])
    await store.aio.close()
    _say("done")
    _say(json.dumps(got))


async def native(uri: str, sid: str, rounds: str) -> None:
    """Append, ``rounds`` times, an event without item (native API), then an item on top.

    Prints the ids of the events without item and the items' contents.
    """
    store = open_store(uri)
    session = AgentsSession(sid, store)
    service = SessionService(store)
    _start()
    natives, added = [], []
    for n in range(int(rounds)):
        live = await service.get_session(app_name=session.app_name, user_id=session.user_id,
                                         session_id=sid)  # fmt: skip
        assert live is not None
        # Locked: the pops of the other process move the session on meanwhile.
        event = await service.append_event_locked(live, Event(author=f"native{n}"))
        natives.append(event.id)
        await session.add_items([{"role": "user", "content": f"w{n}"}])
        added.append(f"w{n}")
    await store.aio.close()
    _say("done")
    _say(json.dumps({"natives": natives, "added": added}))


async def clear(uri: str, sid: str, most: str, seconds: str) -> None:
    """Clear the session over and over until a line on stdin (or ``most`` times, ``seconds``)."""
    store = open_store(uri)
    session = AgentsSession(sid, store)
    _start()
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
    cleared, deadline = 0, time.monotonic() + float(seconds)
    while not stop.is_set() and cleared < int(most) and time.monotonic() < deadline:
        await session.clear_session()
        cleared += 1
    await store.aio.close()
    _say("done")
    _say(json.dumps(cleared))


# -- a real agent turn with a model that answers from a script ---------------


@function_tool
def forecast(city: str) -> str:
    """Return the weather of a city."""
    return f"sunny in {city}"


class ScriptedModel(Model):
    """A model that calls ``forecast`` once per turn, then answers with what it saw.

    Its answer names the tool's output and counts the user messages of its
    input: the second turn, run in another process, sees both questions only
    if the session gave it the first turn's history.
    """

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[Any],
        model_settings: Any,
        tools: list[Any],
        output_schema: Any,
        handoffs: list[Any],
        tracing: Any,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any,
    ) -> ModelResponse:
        items = [{"role": "user", "content": input}] if isinstance(input, str) else input
        last = items[-1]
        if last.get("type") != "function_call_output":
            asked = sum(1 for item in items if item.get("role") == "user")
            output: Any = ResponseFunctionToolCall(
                type="function_call",
                name="forecast",
                arguments=json.dumps({"city": f"city{asked}"}),
                call_id=f"call-{asked}",
                id=f"fc-{asked}",
                status="completed",
            )
        else:
            questions = [item["content"] for item in items if item.get("role") == "user"]
            text = f"{last['output']} | questions={questions}"
            output = ResponseOutputMessage(
                type="message",
                id=f"msg-{len(items)}",
                role="assistant",
                status="completed",
                content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
            )
        return ModelResponse(output=[output], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("the scripted model does not stream")


async def turn(uri: str, sid: str, question: str) -> None:
    """Run one turn of an agent with a tool on the session; print its final output."""
    set_tracing_disabled(True)
    store = open_store(uri)
    session = AgentsSession(sid, store)
    agent = Agent(name="weather", instructions="Use the tool.", model=ScriptedModel(),
                  tools=[forecast])  # fmt: skip
    _start()
    result = await Runner.run(agent, question, session=session)
    await store.aio.close()
    _say("done")
    _say(json.dumps(result.final_output))


if __name__ == "__main__":
    command, *arguments = sys.argv[1:]
    asyncio.run(
        {"add": add, "pop": pop, "native": native, "clear": clear, "turn": turn}[command](
            *arguments
        )
    )
