"""What the command line draws: tables and progress bars, both by rich.

rich is imported only when something is drawn, so that commands which draw
nothing (and ``--help``) start fast. Progress goes to stderr, and only when
it is a terminal: a script reading stdout never sees it.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import IO, Any

__all__ = ["Column", "RichProgressBar", "interactive", "render_table"]

# Width of a table rendered for a pipe or a file: wide enough never to wrap.
_PLAIN_WIDTH = 200


def interactive() -> bool:
    """Tell whether a person watches: stdout and stderr are both terminals."""
    return sys.stdout.isatty() and sys.stderr.isatty()


class Column:
    """A table column: its heading, and whether it holds numbers (right-aligned)."""

    __slots__ = ("name", "numeric")

    def __init__(self, name: str, numeric: bool = False) -> None:
        self.name = name
        self.numeric = numeric


def render_table(
    columns: Sequence[Column | str],
    rows: Iterable[Sequence[Any]],
    title: str | None = None,
) -> str:
    """Return a table as text, laid out by rich, under its title; cells are printed with ``str``."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for column in columns:
        spec = column if isinstance(column, Column) else Column(column)
        table.add_column(spec.name, justify="right" if spec.numeric else "left")
    for row in rows:
        table.add_row(*(_cell(value) for value in row))
    out = io.StringIO()
    width = _terminal_width() if sys.stdout.isatty() else _PLAIN_WIDTH
    console = Console(
        file=out, width=width, color_system=None, highlight=False, emoji=False, markup=False
    )
    console.print(table)
    text = "\n".join(line.rstrip() for line in out.getvalue().splitlines()).strip("\n")
    # The title on a line of its own: rich would wrap it to the table's width.
    return f"{title}\n{text}" if title else text


def _cell(value: Any) -> Any:
    from rich.text import Text

    # Text, not a str: a cell never goes through rich's markup parser.
    return value if isinstance(value, Text) else Text(str(value))


def _terminal_width() -> int:
    import shutil

    return shutil.get_terminal_size().columns


class RichProgressBar:
    """A progress bar on a terminal, drawn by rich; silent anywhere else.

    ``total`` None draws a bar that only shows the work goes on.
    """

    def __init__(
        self,
        total: int | None,
        label: str,
        stream: IO[str] | None = None,
        enabled: bool = True,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled and self.stream.isatty() and (total is None or total > 0)
        self.total = total
        self.label = label
        self.done = 0
        self._bar: Any = None
        self._task: Any = None
        if self.enabled:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TaskProgressColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                TextColumn("{task.description}"),
                BarColumn(),
                TaskProgressColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=Console(file=self.stream, force_terminal=True),
                refresh_per_second=10,
            )
            self._task = self._bar.add_task(label, total=total)
            self._bar.start()

    def update(self, done: int, total: int | None = None) -> None:
        """Move the bar to ``done`` (of ``total``, when the total became known)."""
        self.done = done
        if self._bar is not None:
            if total is not None:
                self.total = total
                self._bar.update(self._task, total=total)
            self._bar.update(self._task, completed=done)

    def close(self) -> None:
        """Draw the bar a last time and end its line."""
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done)
            self._bar.stop()
            self._bar = None

    def __enter__(self) -> RichProgressBar:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()
