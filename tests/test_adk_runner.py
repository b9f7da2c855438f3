"""End to end: a real ADK Runner on our store, a new process reading it, and adk api_server."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("google.adk")

from google.adk.runners import Runner
from google.genai import types

from _adk_helpers import APP, free_port, make_agent
from _redis import stopping_with_this_run
from sessionscope.adk import LmdbSessionService

pytestmark = [pytest.mark.adk, pytest.mark.slow]

AGENTS = Path(__file__).parent / "adk_agents"
ITEMS = ["apple", "pear", "plum"]

READER = """
import asyncio, json, sys
from sessionscope.adk import LmdbSessionService

async def main(path):
    async with LmdbSessionService(path) as service:
        session = await service.get_session(app_name="shop", user_id="u1", session_id="s1")
        other = await service.create_session(app_name="shop", user_id="u2")
        print(json.dumps({
            "state": session.state,
            "events": [[e.author, e.content.parts[0].model_dump(exclude_none=True)]
                       for e in session.events],
            "deltas": [e.actions.state_delta for e in session.events],
            "other_state": other.state,
            "user_state": await service.get_user_state(app_name="shop", user_id="u1"),
        }))

asyncio.run(main(sys.argv[1]))
"""


def test_runner_turns_survive_a_new_process(tmp_path: Path) -> None:
    """State and history written by a Runner are intact in a fresh process; temp: is gone."""
    store = tmp_path / "store"

    async def converse() -> dict[str, Any]:
        async with LmdbSessionService(store) as service:
            runner = Runner(agent=make_agent(), app_name=APP, session_service=service)
            await service.create_session(app_name=APP, user_id="u1", session_id="s1")
            for item in ITEMS:
                message = types.Content(role="user", parts=[types.Part(text=item)])
                async for _ in runner.run_async(user_id="u1", session_id="s1", new_message=message):
                    pass
            session = await service.get_session(app_name=APP, user_id="u1", session_id="s1")
            return {"state": session.state, "count": len(session.events)}

    seen = asyncio.run(converse())
    assert seen["count"] == 4 * len(ITEMS)
    done = subprocess.run(
        [sys.executable, "-c", READER, str(store)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    read = json.loads(done.stdout)
    state = read["state"]
    assert state == seen["state"]
    assert state["app:visits"] == len(ITEMS)
    assert state["user:last_item"] == "plum"
    assert state["cart"] == ITEMS
    assert state["last_reply"] == "Noted plum."
    assert not any(key.startswith("temp:") for key in state)
    assert not any(key.startswith("temp:") for delta in read["deltas"] for key in delta)
    authors = [author for author, _ in read["events"]]
    assert authors == ["user", "clerk", "clerk", "clerk"] * len(ITEMS)
    first_turn = [part for _, part in read["events"][:4]]
    assert first_turn[0] == {"text": "apple"}
    assert first_turn[1]["function_call"]["name"] == "record_visit"
    assert first_turn[2]["function_response"]["response"] == {"ok": True, "item": "apple"}
    assert first_turn[3] == {"text": "Noted apple."}
    assert read["other_state"] == {"app:visits": len(ITEMS)}
    assert read["user_state"] == {"last_item": "plum"}


def _wait_until_up(base: str, server: subprocess.Popen[bytes], deadline: float) -> None:
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise AssertionError(f"adk api_server exited with {server.returncode}")
        try:
            with urllib.request.urlopen(f"{base}/list-apps", timeout=2) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.3)
    raise AssertionError("adk api_server did not come up in time")


def _post(url: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        return json.loads(reply.read())


@pytest.mark.parametrize("route", ["yaml_route", "py_route"])
def test_api_server_with_lmdb_uri(route: str, tmp_path: Path) -> None:
    """adk api_server --session_service_uri lmdb://... stores sessions we can read back."""
    agents = tmp_path / "agents"
    shutil.copytree(AGENTS / route, agents)
    store = tmp_path / "store"
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    log = (tmp_path / "server.log").open("wb")
    server = subprocess.Popen(
        [
            sys.executable, "-m", "google.adk.cli", "api_server",
            "--host", "127.0.0.1", "--port", str(port),
            "--session_service_uri", f"lmdb://{store}?durability=sync",
            str(agents),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=tmp_path,
        preexec_fn=stopping_with_this_run(),
    )  # fmt: skip
    try:
        _wait_until_up(base, server, time.monotonic() + 90)
        created = _post(
            f"{base}/apps/clerk/users/u1/sessions",
            {"session_id": "web-1", "state": {"user:lang": "fr", "topic": "tea"}},
        )
        assert created["id"] == "web-1"
        listed = urllib.request.urlopen(f"{base}/apps/clerk/users/u1/sessions", timeout=30)
        assert [s["id"] for s in json.loads(listed.read())] == ["web-1"]
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=20)
        log.close()

    async def read_back() -> Any:
        async with LmdbSessionService(store) as service:
            return await service.get_session(app_name="clerk", user_id="u1", session_id="web-1")

    session = asyncio.run(read_back())
    assert session is not None, (tmp_path / "server.log").read_text()[-3000:]
    assert session.state == {"user:lang": "fr", "topic": "tea"}
