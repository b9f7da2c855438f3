"""The documentation does what it says.

Every ```python block of the README and of docs/*.md (but the engineers'
ARCHITECTURE.md and the dated performance-history.md) runs as written, each
in a fresh directory in a child process; a block that names
``localhost:6379`` gets a real redis-server of its own in its place, and a
block that imports google-adk runs where google-adk does (Python 3.11+). A
bash block preceded by ``<!-- docs-test: run -->`` (the restore drill of
operations.md) runs the same way. A block opts out only with a visible
``# not run: <reason>`` line. docs/cli.md must be what docs/generate_cli.py
writes, and the API reference builds with pdoc.
"""

from __future__ import annotations

import importlib.util
import os
import re
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from _redis import RedisServer, have_redis

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
# Pages of record, not of use: their code blocks are quoted output and notes.
NOT_RUN_PAGES = {"ARCHITECTURE.md", "performance-history.md"}
OPT_OUT = "# not run:"
RUN_BASH = "<!-- docs-test: run -->"
REDIS_ADDRESS = "localhost:6379"
# A guard against a hung example, not a timing assertion.
CHILD_TIMEOUT = 600

_FENCE = re.compile(r"^```(\w*)\s*$")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    language: str
    code: str
    marked: bool  # preceded by RUN_BASH

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def needs_adk(self) -> bool:
        return "google.adk" in self.code or "sessionscope.adk" in self.code

    @property
    def needs_agents(self) -> bool:
        return "sessionscope.openai_agents" in self.code or "from agents" in self.code

    @property
    def needs_redis(self) -> bool:
        return REDIS_ADDRESS in self.code


def pages() -> list[Path]:
    """Return the README and every docs page whose examples must run."""
    found = [ROOT / "README.md"]
    found += sorted(p for p in DOCS.glob("*.md") if p.name not in NOT_RUN_PAGES)
    return found


def blocks(page: Path) -> list[Block]:
    """Return the fenced code blocks of a Markdown page, in order."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        start = index
        index += 1
        body: list[str] = []
        while index < len(lines) and lines[index].rstrip() != "```":
            body.append(lines[index])
            index += 1
        if index == len(lines):
            raise AssertionError(f"{page.name}:{start + 1}: a code block is never closed")
        marked = start > 0 and lines[start - 1].strip() == RUN_BASH
        found.append(Block(page, start + 1, opening.group(1), "\n".join(body) + "\n", marked))
        index += 1
    return found


def runnable() -> list[Block]:
    chosen = []
    for page in pages():
        for block in blocks(page):
            if OPT_OUT in block.code:
                continue
            if block.language == "python" or (block.language == "bash" and block.marked):
                chosen.append(block)
    return chosen


def _param(block: Block) -> object:
    marks = [pytest.mark.adk] if block.needs_adk else []
    if block.needs_agents:
        marks.append(pytest.mark.openai_agents)
    return pytest.param(block, id=block.name, marks=marks)


def _tools(directory: Path) -> Path:
    """Put ``python`` and ``sessionscope`` of this interpreter first on a child's PATH."""
    bin_dir = directory / ".bin"
    bin_dir.mkdir()
    for name, command in (
        ("python", f'exec "{sys.executable}" "$@"'),
        ("sessionscope", f'exec "{sys.executable}" -m sessionscope "$@"'),
    ):
        tool = bin_dir / name
        tool.write_text(f"#!/bin/sh\n{command}\n")
        tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    return bin_dir


def run_block(block: Block, directory: Path, redis_url: str | None) -> None:
    code = block.code
    if redis_url is not None:
        code = code.replace(REDIS_ADDRESS, redis_url)
    work = directory / "work"
    work.mkdir()
    env = dict(os.environ)
    env["PATH"] = f"{_tools(directory)}{os.pathsep}{env.get('PATH', '')}"
    if block.language == "python":
        script = work / "example.py"
        script.write_text(code, encoding="utf-8")
        args = [sys.executable, script.name]
    else:
        args = ["bash", "-c", code]
    done = subprocess.run(
        args, cwd=work, env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT
    )
    assert done.returncode == 0, (
        f"the example at {block.name} failed (exit {done.returncode}):\n"
        f"--- stdout\n{done.stdout[-4000:]}\n--- stderr\n{done.stderr[-4000:]}"
    )


@pytest.mark.parametrize("block", [_param(b) for b in runnable()])
def test_example_runs_as_written(block: Block, tmp_path: Path) -> None:
    if block.needs_adk:
        pytest.importorskip("google.adk", reason="the example needs google-adk")
    if block.needs_agents:
        pytest.importorskip("agents", reason="the example needs openai-agents")
    if not block.needs_redis:
        run_block(block, tmp_path, None)
        return
    if not have_redis():
        pytest.fail("redis-server and redis-cli are needed: apt-get install redis-server")
    server = RedisServer(tmp_path / "redis").start()
    try:
        run_block(block, tmp_path, f"127.0.0.1:{server.port}")
    finally:
        server.stop()


def test_every_page_has_examples_that_run() -> None:
    """The pages that teach usage carry examples the test above runs."""
    names = {block.page.name for block in runnable()}
    for page in ("README.md", "operations.md", "redis.md"):
        assert page in names, f"{page} has no example that runs"
    restore = [b for b in runnable() if b.page.name == "operations.md" and b.language == "bash"]
    assert any("sessionscope backup" in b.code and "sessionscope verify" in b.code for b in restore)


def test_blocks_are_found_as_written(tmp_path: Path) -> None:
    """The extractor takes fenced blocks whole, with their language and run marker."""
    page = tmp_path / "page.md"
    page.write_text(
        "text\n```python\nprint(1)\n\nprint(2)\n```\n"
        f"{RUN_BASH}\n```bash\necho hi\n```\n```bash\necho no\n```\n"
    )
    found = blocks(page)
    assert [(b.language, b.code, b.marked) for b in found] == [
        ("python", "print(1)\n\nprint(2)\n", False),
        ("bash", "echo hi\n", True),
        ("bash", "echo no\n", False),
    ]
    page.write_text("```python\nprint(1)\n")
    with pytest.raises(AssertionError, match="never closed"):
        blocks(page)


def test_a_failing_example_fails(tmp_path: Path) -> None:
    """An example that raises, as the README's did with NameError, fails the test."""
    block = Block(ROOT / "README.md", 1, "python", "runner = Runner(agent=agent)\n", False)
    with pytest.raises(AssertionError, match="NameError"):
        run_block(block, tmp_path, None)


def test_readme_stays_short_and_links_the_pages() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    for target in (
        "docs/operations.md",
        "docs/redis.md",
        "docs/openai-agents.md",
        "docs/cli.md",
        "docs/performance.md",
        "docs/performance-history.md",
        "docs/ARCHITECTURE.md",
        "CHANGELOG.md",
        "pdoc -o site sessionscope",
    ):
        assert target in text, f"the README does not point to {target}"


# -- the command line page -------------------------------------------------


@dataclass(frozen=True)
class CliHelp:
    """What the command line prints today: its top-level help and the page made of it."""

    commands: list[str]
    page: str


@pytest.fixture(scope="module")
def cli_help() -> CliHelp:
    # One rendering for the module: it runs the command line once per command.
    spec = importlib.util.spec_from_file_location("generate_cli", DOCS / "generate_cli.py")
    assert spec is not None and spec.loader is not None
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    return CliHelp(generator.commands(generator.help_text()), generator.render())


def cli_page_problems(now: CliHelp, page: str) -> list[str]:
    """Return what is wrong with a docs/cli.md text, each saying how to fix it."""
    problems = [
        f"docs/cli.md lacks the command {name!r}: run python docs/generate_cli.py"
        for name in now.commands
        if f"\n## sessionscope {name}\n" not in page
    ]
    # Compared word by word: argparse wraps usage lines differently from one
    # Python to the next (3.13 keeps an option with its metavar), not the words.
    if now.page.split() != page.split():
        problems.append("docs/cli.md is stale: run python docs/generate_cli.py")
    return problems


def test_cli_page_is_current(cli_help: CliHelp) -> None:
    assert {"ls", "verify", "backup", "export", "import", "migrate"} <= set(cli_help.commands)
    problems = cli_page_problems(cli_help, (DOCS / "cli.md").read_text(encoding="utf-8"))
    assert problems == [], "\n".join(problems)


def test_a_stale_cli_page_is_found(cli_help: CliHelp) -> None:
    page = (DOCS / "cli.md").read_text(encoding="utf-8")
    without = (
        page[: page.index("## sessionscope verify")] + page[page.index("## sessionscope backup") :]
    )
    assert cli_page_problems(cli_help, without) == [
        "docs/cli.md lacks the command 'verify': run python docs/generate_cli.py",
        "docs/cli.md is stale: run python docs/generate_cli.py",
    ]
    edited = page.replace("--no-progress", "--quiet", 1)
    assert cli_page_problems(cli_help, edited) == [
        "docs/cli.md is stale: run python docs/generate_cli.py"
    ]


# -- the API reference ------------------------------------------------------


def test_api_reference_builds(tmp_path: Path) -> None:
    try:
        adk = importlib.util.find_spec("google.adk") is not None
    except ModuleNotFoundError:  # not even the google namespace is installed
        adk = False
    # Without google-adk (Python 3.10) the drop-in cannot be imported, so its
    # page is left out; pdoc's "!" excludes a module.
    agents = importlib.util.find_spec("agents") is not None
    modules = [
        "sessionscope",
        "sessionscope.adk" if adk else "!sessionscope.adk",
        "sessionscope.openai_agents" if agents else "!sessionscope.openai_agents",
    ]
    out = tmp_path / "site"
    # The README's command: the package's __all__ keeps internal modules out.
    done = subprocess.run(
        [sys.executable, "-m", "pdoc", "-o", str(out), *modules],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    top = (out / "sessionscope.html").read_text(encoding="utf-8")
    for name in (
        "SessionService",
        "SyncSessionService",
        "LmdbStore",
        "MemoryStore",
        "open_store",
        "export_dump",
        "import_dump",
        "DumpCounts",
    ):
        assert f'id="{name}"' in top, f"the reference does not document {name}"
    if agents:
        page = (out / "sessionscope" / "openai_agents.html").read_text(encoding="utf-8")
        assert 'id="AgentsSession"' in page, "the reference does not document AgentsSession"
    if adk:
        page = (out / "sessionscope" / "adk.html").read_text(encoding="utf-8")
        for name in ("LmdbSessionService", "RedisSessionService", "migrate_from_adk"):
            assert f'id="{name}"' in page, f"the reference does not document {name}"
