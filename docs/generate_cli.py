"""Write docs/cli.md from the command line's own --help texts.

Run ``python docs/generate_cli.py`` after changing a command or an option;
tests/test_docs.py fails while docs/cli.md differs from what this writes.
Each help text comes from ``python -m sessionscope [COMMAND] --help`` in a
child process with an 80-column terminal, so the page is what a user sees.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

PAGE = Path(__file__).resolve().parent / "cli.md"

INTRO = """\
# The command line

`sessionscope` looks into a store, checks it, copies it and moves sessions in
and out, and benchmarks and replays stores. Every command takes `--help`;
the store commands print a table for a person, or one JSON document on stdout
with `--json` (an error then is also one object on stdout,
`{"error": {"type": ..., "message": ..., "hint": ...}}`); they draw progress
bars only on a terminal (`--no-progress` turns them off) and fail with one
line on stderr. Exit status: 0 success, 1 a problem found or a failure (a
store that does not verify, a damaged or busy store, a refused dump, a
migration whose copies differ), 2 bad usage or input (an unknown URI scheme,
a path that holds no store, a store of a newer format, a non-empty backup
directory, an output path refused), 130 interrupted (Ctrl-C: "interrupted"
on stderr), 143 terminated (SIGTERM: "terminated"); a file being written is
removed either way. A command that reads never creates a
store; `ls`, `stats`, `verify` and `export` read a page at a time, in memory
that does not grow with the store. How to use them to run a store:
[operations.md](operations.md).

This page is generated from the commands' `--help` by
`python docs/generate_cli.py`; do not edit it by hand.
"""

# A command's line in the top-level help: four spaces, then its name.
_COMMAND = re.compile(r"^    ([a-z][a-z0-9-]*)(?:\s|$)")


def help_text(*command: str) -> str:
    """Return ``sessionscope [COMMAND] --help`` as printed on an 80-column terminal."""
    env = dict(os.environ, COLUMNS="80", LINES="24", NO_COLOR="1")
    env.pop("FORCE_COLOR", None)
    done = subprocess.run(
        [sys.executable, "-m", "sessionscope", *command, "--help"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"sessionscope {' '.join(command)} --help failed: {done.stderr}")
    return done.stdout.rstrip() + "\n"


def commands(top: str) -> list[str]:
    """Return the command names the top-level help lists, in its order."""
    section = top.split("positional arguments:", 1)[1].split("\noptions:", 1)[0]
    return [m.group(1) for line in section.splitlines() if (m := _COMMAND.match(line))]


def render() -> str:
    """Return the whole page."""
    top = help_text()
    parts = [INTRO, "## sessionscope\n", "```text\n" + top + "```\n"]
    for name in commands(top):
        parts += [f"## sessionscope {name}\n", "```text\n" + help_text(name) + "```\n"]
    return "\n".join(parts)


def main() -> None:
    PAGE.write_text(render(), encoding="utf-8")
    print(f"wrote {PAGE}")


if __name__ == "__main__":
    main()
