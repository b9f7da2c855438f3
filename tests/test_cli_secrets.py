"""No password of a URI in what the command line prints: reports, --json documents, usage errors.

The commands run as real processes against a redis-server of this module's
own that requires a password; every byte of stdout and stderr is searched
for it.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from _redis import RedisServer, free_port
from _stores import run_cli
from sessionscope import LmdbStore, SyncSessionService
from sessionscope.admin.dump import export_dump

# Distinctive, so that a leak cannot hide in other text.
SECRET = "pw-Zq8-Kx3-secret"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, extra_env={"PYTHONWARNINGS": "error"})


def no_secret(done: subprocess.CompletedProcess[str]) -> None:
    assert SECRET not in done.stdout and SECRET not in done.stderr, (done.stdout, done.stderr)


@pytest.fixture(scope="module")
def locked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A server of this module's own that requires a password (started open: its
    readiness check runs unauthenticated)."""
    server = RedisServer(tmp_path_factory.mktemp("locked")).start()
    try:
        server.cli("CONFIG", "SET", "requirepass", SECRET)
        yield server
    finally:
        server.stop()


def _uri(server: RedisServer, prefix: str) -> str:
    return f"redis://:{SECRET}@127.0.0.1:{server.port}/0?prefix={prefix}"


@pytest.fixture(scope="module")
def dump(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("dump")
    with SyncSessionService(LmdbStore(root / "store")) as svc:
        session = svc.create_session(app_name="a", user_id="u", session_id="s", state={"k": 1})
        assert session.id == "s"
        export_dump(svc.store, root / "in.dump")
    return root / "in.dump"


def test_import_stats_and_verify_name_the_store_without_its_password(
    locked: RedisServer, dump: Path
) -> None:
    uri = _uri(locked, "reports")
    shown = f"redis://:***@127.0.0.1:{locked.port}/0?prefix=reports"
    for args in (["import", uri, str(dump)], ["stats", uri], ["verify", uri]):
        for json_flag in ([], ["--json"]):
            done = run(*args, "--no-progress", *json_flag)
            assert done.returncode == 0, done.stderr
            no_secret(done)
            if json_flag:
                assert json.loads(done.stdout)["uri"] == shown


def test_migrate_names_its_target_without_its_password(locked: RedisServer, tmp_path: Path) -> None:
    pytest.importorskip("google.adk")
    from _adk_helpers import sqlite_service

    database = tmp_path / "adk.db"

    async def fill() -> None:
        adk = sqlite_service(str(database))
        await adk.create_session(app_name="app", user_id="ada", state={"user:name": "Ada"})

    asyncio.run(fill())
    uri = _uri(locked, "migrated")
    shown = f"redis://:***@127.0.0.1:{locked.port}/0?prefix=migrated"
    text = run("migrate", "--from", f"sqlite:///{database}", "--to", uri, "--no-progress")
    assert text.returncode == 0, text.stderr
    no_secret(text)
    assert shown in text.stdout
    document = run("migrate", "--from", f"sqlite:///{database}", "--to", uri, "--json")
    assert document.returncode == 0, document.stderr
    no_secret(document)
    assert json.loads(document.stdout)["to"] == shown


@pytest.mark.parametrize(
    "args",
    [
        ["stats", "redis://127.0.0.1:1/0", f"redis://:{SECRET}@127.0.0.1:1/0"],
        ["ls", "memory://", f"--bogus=redis://:{SECRET}@h:1/0"],
        ["ls", "memory://", "--limit", f"redis://:{SECRET}@h:1/0"],
        ["replay", "sample", "--store", "memory://", "--batch", f"rediss://u:{SECRET}@h:1"],
        [f"redis://:{SECRET}@h:1/0"],
    ],
    ids=["extra-argument", "unknown-option", "bad-value", "replay-bad-value", "unknown-command"],
)
def test_a_usage_error_quotes_the_command_line_without_a_password(args: list[str]) -> None:
    for json_flag in ([], ["--json"]):
        done = run(*args, *json_flag)
        assert done.returncode == 2, done.stderr
        assert "***@h" in done.stderr or "***@127.0.0.1" in done.stderr, done.stderr
        no_secret(done)
        if json_flag and args[0] in ("stats", "ls"):
            error = json.loads(done.stdout)["error"]
            assert error["type"] == "UsageError" and "***@" in error["message"]


def test_a_refused_password_is_not_shown(locked: RedisServer) -> None:
    wrong = f"redis://:{SECRET}x@127.0.0.1:{locked.port}/0"
    gone = f"redis://:{SECRET}@127.0.0.1:{free_port()}/0"
    for uri in (wrong, gone):
        for args in (["stats", uri, "--json"], ["verify", uri, "--json"]):
            done = run(*args)
            assert done.returncode != 0
            no_secret(done)
