"""Collect the ``bench_*.py`` modules when the whole folder is run.

``pytest benchmarks --benchmark-only`` runs every comparison; the default test
run never sees this folder (``testpaths = ["tests"]``). A file named on the
command line is collected by pytest itself, so it is skipped here.
"""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Module | None:
    """Collect bench_*.py as test modules."""
    if (
        file_path.suffix == ".py"
        and file_path.name.startswith("bench_")
        and not parent.session.isinitpath(file_path)
    ):
        return pytest.Module.from_parent(parent, path=file_path)
    return None
