"""The google-adk drop-in on Redis: the registry, a Runner, and ADK's own api_server."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("google.adk")

from google.adk.runners import Runner
from google.adk.sessions import BaseSessionService
from google.genai import types

import _stores
from _adk_helpers import APP, free_port, make_agent
from _redis import RedisServer
from sessionscope.adk import RedisSessionService
from sessionscope.stores.redis import RedisStore
from test_adk_runner import _post, _wait_until_up

pytestmark = pytest.mark.adk

AGENTS = Path(__file__).parent / "adk_agents"
ITEMS = ["apple", "pear", "plum"]

READER = """
import asyncio, json, sys
from sessionscope.adk import RedisSessionService

async def main(uri):
    async with RedisSessionService(uri) as service:
        session = await service.get_session(app_name="shop", user_id="u1", session_id="s1")
        other = await service.create_session(app_name="shop", user_id="u2")
        print(json.dumps({
            "state": session.state,
            "authors": [e.author for e in session.events],
            "other_state": other.state,
            "user_state": await service.get_user_state(app_name="shop", user_id="u1"),
        }))

asyncio.run(main(sys.argv[1]))
"""


@pytest.fixture(params=_stores.REDIS_KINDS)
def uri(request: pytest.FixtureRequest) -> str:
    server = request.getfixturevalue(
        "redis_server" if request.param == "redis" else "redis_cluster"
    )
    return f"{server.url}?prefix=adk{uuid.uuid4().hex}"


def test_the_registry_builds_our_service_for_each_redis_scheme(uri: str) -> None:
    """ADK's registry hands redis:// (and redis+cluster://) URIs to RedisSessionService."""
    from google.adk.cli.service_registry import get_service_registry

    service = get_service_registry().create_session_service(uri, agents_dir="agents")
    assert isinstance(service, RedisSessionService)
    assert isinstance(service, BaseSessionService)
    assert isinstance(service.store, RedisStore)
    service.store.close()
    with pytest.raises(ValueError, match="redis://"):
        RedisSessionService("lmdb:///somewhere")


@pytest.mark.slow
def test_runner_turns_on_redis_survive_a_new_process(uri: str) -> None:
    """A Runner's turns on Redis are read whole by another process; temp: is gone."""

    async def converse() -> dict[str, Any]:
        async with RedisSessionService(uri) as service:
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
        [sys.executable, "-c", READER, uri],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env=_stores.child_env(),
    )
    read = json.loads(done.stdout)
    assert read["state"] == seen["state"]
    assert read["state"]["app:visits"] == len(ITEMS)
    assert read["state"]["user:last_item"] == "plum"
    assert read["state"]["cart"] == ITEMS
    assert not any(key.startswith("temp:") for key in read["state"])
    assert read["authors"] == ["user", "clerk", "clerk", "clerk"] * len(ITEMS)
    assert read["other_state"] == {"app:visits": len(ITEMS)}
    assert read["user_state"] == {"last_item": "plum"}


@pytest.mark.slow
def test_api_server_with_a_redis_uri(redis_server: RedisServer, tmp_path: Path) -> None:
    """adk api_server --session_service_uri redis://... stores sessions we read back."""
    agents = tmp_path / "agents"
    shutil.copytree(AGENTS / "py_route", agents)
    uri = f"{redis_server.url}?prefix=web{uuid.uuid4().hex}"
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = (tmp_path / "server.log").open("wb")
    server = subprocess.Popen(
        [
            sys.executable, "-m", "google.adk.cli", "api_server",
            "--host", "127.0.0.1", "--port", str(port),
            "--session_service_uri", uri,
            str(agents),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**_stores.child_env(), "PYTHONUNBUFFERED": "1"},
        cwd=tmp_path,
    )  # fmt: skip
    try:
        _wait_until_up(base, server, time.monotonic() + 90)
        created = _post(
            f"{base}/apps/clerk/users/u1/sessions",
            {"session_id": "web-1", "state": {"user:lang": "fr", "topic": "tea"}},
        )
        assert created["id"] == "web-1"
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.kill(server.pid, 9)
            server.wait(timeout=20)
        log.close()

    async def read_back() -> Any:
        async with RedisSessionService(uri) as service:
            return await service.get_session(app_name="clerk", user_id="u1", session_id="web-1")

    session = asyncio.run(read_back())
    assert session is not None, (tmp_path / "server.log").read_text()[-3000:]
    assert session.state == {"user:lang": "fr", "topic": "tea"}
