"""Shared pieces of the google-adk tests: rich events, a scripted model, a tool, ports."""

from __future__ import annotations

import gc
import socket
import warnings
from collections.abc import AsyncGenerator
from typing import Any

from google.adk.agents import LlmAgent
from google.adk.events import Event, EventActions
from google.adk.events.event import NodeInfo
from google.adk.events.event_actions import EventCompaction
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.sessions.sqlite_session_service import SqliteSessionService
from google.adk.tools.tool_context import ToolContext
from google.genai import types

APP = "shop"


def rich_event(**overrides: Any) -> Event:
    """Return an event that sets every field the issue lists, bytes included."""
    from fastapi.openapi.models import APIKey, APIKeyIn
    from google.adk.auth.auth_credential import AuthCredential, AuthCredentialTypes
    from google.adk.auth.auth_tool import AuthConfig
    from google.adk.tools.tool_confirmation import ToolConfirmation

    content = types.Content(
        role="model",
        parts=[
            types.Part(text="Here is the chart you asked for. " * 8),
            types.Part(
                inline_data=types.Blob(mime_type="image/png", data=b"\x89PNG\r\n\x00\xff" * 9)
            ),
            types.Part(
                function_call=types.FunctionCall(
                    id="fc-1", name="lookup", args={"q": "x", "n": 3, "deep": {"a": [1, 2.5, None]}}
                )
            ),
            types.Part(
                function_response=types.FunctionResponse(
                    id="fc-1", name="lookup", response={"result": "ok", "none": None}
                )
            ),
            types.Part(text="thinking", thought=True, thought_signature=b"sig\x00\x01"),
        ],
    )
    grounding = types.GroundingMetadata(
        web_search_queries=["q1", "q2"],
        grounding_chunks=[
            types.GroundingChunk(web=types.GroundingChunkWeb(uri="https://e.example", title="E"))
        ],
        grounding_supports=[
            types.GroundingSupport(
                segment=types.Segment(start_index=0, end_index=5, text="Here "),
                grounding_chunk_indices=[0],
                confidence_scores=[0.9],
            )
        ],
        search_entry_point=types.SearchEntryPoint(rendered_content="<div/>", sdk_blob=b"\x01\x02"),
    )
    citation = types.CitationMetadata(
        citations=[
            types.Citation(
                start_index=1,
                end_index=9,
                uri="https://c.example",
                title="C",
                license="MIT",
                publication_date=types.GoogleTypeDate(year=2024, month=5, day=1),
            )
        ]
    )
    usage = types.GenerateContentResponseUsageMetadata(
        prompt_token_count=10,
        candidates_token_count=20,
        total_token_count=30,
        prompt_tokens_details=[
            types.ModalityTokenCount(modality=types.MediaModality.TEXT, token_count=10)
        ],
    )
    auth = AuthConfig(
        auth_scheme=APIKey(**{"in": APIKeyIn.header}, name="X-Key"),
        raw_auth_credential=AuthCredential(
            auth_type=AuthCredentialTypes.API_KEY, api_key="not-a-secret"
        ),
        credential_key="lookup-key",
    )
    actions = EventActions(
        skip_summarization=True,
        state_delta={"k": 1, "app:a": "x", "user:u": [1, 2], "none": None, "raw": b"\x00"},
        artifact_delta={"chart.png": 2},
        transfer_to_agent="helper",
        escalate=True,
        requested_auth_configs={"fc-1": auth},
        requested_tool_confirmations={
            "fc-1": types_confirmation(ToolConfirmation),
        },
        compaction=EventCompaction(
            start_timestamp=1.0,
            end_timestamp=2.0,
            compacted_content=types.Content(role="model", parts=[types.Part(text="summary")]),
        ),
    )
    fields: dict[str, Any] = {
        "invocation_id": "inv-1",
        "author": "agent",
        "content": content,
        "grounding_metadata": grounding,
        "citation_metadata": citation,
        "usage_metadata": usage,
        "custom_metadata": {"x": {"y": None}, "t": [1, "2"], "b": b"\x07"},
        "long_running_tool_ids": {"fc-1", "fc-2"},
        "branch": "root.agent",
        "node_info": NodeInfo(path="wf/a@1", output_for=["wf"], message_as_output=True),
        "actions": actions,
        "finish_reason": types.FinishReason.STOP,
        "turn_complete": True,
        "model_version": "scripted-1",
        "output": {"o": b"1", "n": [1, {"m": None}]},
    }
    fields.update(overrides)
    return Event(**fields)


def types_confirmation(cls: Any) -> Any:
    """Return a tool confirmation with a payload."""
    return cls(hint="really?", confirmed=False, payload={"amount": 3})


def dumped_record(event: Event) -> dict[str, Any]:
    """Return an event's record as pydantic dumps it: by alias, no None, auth configs as JSON."""
    record = event.model_dump(by_alias=True, exclude_none=True)
    configs = event.actions.requested_auth_configs
    if configs:
        record["actions"]["requestedAuthConfigs"] = {
            key: value.model_dump(mode="json", by_alias=True, exclude_none=True)
            for key, value in configs.items()
        }
    return record


def realistic_event(i: int, **overrides: Any) -> Event:
    """Return a model event: a few hundred chars of text, a function call, a small delta."""
    fields: dict[str, Any] = {
        "invocation_id": f"inv-{i // 4}",
        "author": "analyst",
        "content": types.Content(
            role="model",
            parts=[
                types.Part(text=f"Step {i}: " + "the numbers look fine. " * 12),
                types.Part(
                    function_call=types.FunctionCall(
                        id=f"call-{i}", name="lookup", args={"id": f"acct-{i}", "limit": 5}
                    )
                ),
            ],
        ),
        "actions": EventActions(state_delta={"last": f"acct-{i}", "user:visits": i}),
    }
    fields.update(overrides)
    return Event(**fields)


# -- an offline agent ------------------------------------------------------


def record_visit(item: str, tool_context: ToolContext) -> dict[str, Any]:
    """Record a visit to an item in every state scope."""
    state = tool_context.state
    state["app:visits"] = int(state.get("app:visits", 0)) + 1
    state["user:last_item"] = item
    state["temp:scratch"] = f"looking at {item}"
    state["cart"] = [*state.get("cart", []), item]
    return {"ok": True, "item": item}


class ScriptedLlm(BaseLlm):
    """A model that answers from a script: a function call first, then text."""

    model: str = "scripted"

    @classmethod
    def supported_models(cls) -> list[str]:
        """Return the model names this class serves."""
        return [r"scripted.*"]

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        """Call the tool for the user's item, then summarize its answer."""
        last = llm_request.contents[-1] if llm_request.contents else None
        parts = last.parts if last is not None and last.parts else []
        response = next((p.function_response for p in parts if p.function_response), None)
        if response is None:
            item = next((p.text for p in parts if p.text), "nothing") or "nothing"
            call = types.FunctionCall(name="record_visit", args={"item": item.strip()})
            content = types.Content(role="model", parts=[types.Part(function_call=call)])
        else:
            item = (response.response or {}).get("item")
            content = types.Content(role="model", parts=[types.Part(text=f"Noted {item}.")])
        yield LlmResponse(
            content=content,
            usage_metadata=types.GenerateContentResponseUsageMetadata(total_token_count=7),
        )


def make_agent() -> LlmAgent:
    """Return the offline agent: scripted model, one tool, an output key."""
    return LlmAgent(
        name="clerk",
        model=ScriptedLlm(),
        instruction="Record what the user looks at.",
        tools=[record_visit],
        output_key="last_reply",
    )


def free_port() -> int:
    """Return a TCP port on loopback that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def sqlite_service(path: str) -> SqliteSessionService:
    """Open ADK's SqliteSessionService without its leaked schema-check connection's warning.

    Its constructor leaves a sqlite3 connection to the garbage collector,
    which Python 3.13 reports as a ResourceWarning (an error in this suite).
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        service = SqliteSessionService(db_path=path)
        gc.collect()
    return service
