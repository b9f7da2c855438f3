"""Benchmark the compiled scope core against its pure-Python twin.

Under pytest-benchmark::

    pytest benchmarks/bench_core.py --benchmark-only

As a script, printing median times and the py/c ratio per case::

    python benchmarks/bench_core.py
"""

from __future__ import annotations

import argparse
import random
import statistics
import timeit
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest

from sessionscope._speedups import _core_py

try:
    from sessionscope._speedups import _core
except ImportError:  # the pure build: only the twin can be measured
    _core = None  # type: ignore[assignment]

SIZES = [5, 50, 500]

# Most keys of a real agent's delta are session keys; temp keys are rarer.
SCOPE_WEIGHTS = [("", 60), ("app:", 15), ("user:", 15), ("temp:", 10)]


def make_delta(size: int, seed: int = 0) -> dict[str, Any]:
    """Return a deterministic delta of mixed scopes and realistic values."""
    rng = random.Random(seed * 1000 + size)
    prefixes = [p for p, _ in SCOPE_WEIGHTS]
    weights = [w for _, w in SCOPE_WEIGHTS]
    values: list[Callable[[int], Any]] = [
        lambda i: f"value {i}",
        lambda i: i * 7,
        lambda i: i / 3,
        lambda i: i % 2 == 0,
        lambda i: None,
        lambda i: {"id": i, "name": f"item {i}", "tags": ["a", "b"]},
        lambda i: [i, i + 1, f"x{i}"],
        lambda i: {"step": i, "ok": True, "score": 0.5},
    ]
    delta: dict[str, Any] = {}
    for i in range(size):
        prefix = rng.choices(prefixes, weights)[0]
        delta[f"{prefix}key_{i}"] = rng.choice(values)(i)
    return delta


def _cases(impl: ModuleType, delta: dict[str, Any]) -> dict[str, Callable[[], object]]:
    app, user, session, _temp = impl.partition_by_scope(delta)
    partition_checked = impl.partition_checked
    partition_by_scope = impl.partition_by_scope
    merge_scopes = impl.merge_scopes

    def partition_and_merge() -> object:
        app, user, session, _temp = partition_by_scope(delta)
        return merge_scopes(app, user, session)

    return {
        "partition_checked": lambda: partition_checked(delta),
        "partition_by_scope": lambda: partition_by_scope(delta),
        "merge_scopes": lambda: merge_scopes(app, user, session),
        "partition+merge": partition_and_merge,
    }


CASES = ["partition_checked", "partition_by_scope", "merge_scopes", "partition+merge"]


def _implementations() -> dict[str, ModuleType]:
    impls = {"py": _core_py}
    if _core is not None:
        impls = {"c": _core, **impls}
    return impls


# pytest-benchmark entry points; the file is run explicitly, never collected by
# the test suite.
@pytest.fixture(params=list(_implementations()))
def impl(request: pytest.FixtureRequest) -> ModuleType:
    """Yield each available core implementation."""
    return _implementations()[request.param]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("size", SIZES)
def test_core(benchmark: Any, impl: ModuleType, size: int, case: str) -> None:
    """Measure one case of one implementation on one delta size."""
    name = "c" if impl is _core else "py"
    benchmark.group = f"{case} {size} keys"
    benchmark.name = f"core_{case}_{size}_{name}"
    benchmark.extra_info.update(implementation=name, keys=size)
    benchmark(_cases(impl, make_delta(size))[case])


def _median_seconds(func: Callable[[], object], repeat: int) -> float:
    timer = timeit.Timer(func)
    number, _ = timer.autorange()
    return statistics.median(t / number for t in timer.repeat(repeat=repeat, number=number))


def _format(seconds: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.2f} {unit}"
    return f"{seconds / 1e-9:.0f} ns"


def main(argv: list[str] | None = None) -> None:
    """Print the median time of every case for each implementation, and py/c."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="timing runs per case")
    args = parser.parse_args(argv)
    impls = _implementations()
    print(f"{'case':<20} {'keys':>5} {'c':>10} {'py':>10} {'py/c':>6}")
    for case in CASES:
        for size in SIZES:
            delta = make_delta(size)
            times = {
                name: _median_seconds(_cases(impl, delta)[case], args.repeat)
                for name, impl in impls.items()
            }
            c_time = times.get("c")
            ratio = f"{times['py'] / c_time:.1f}x" if c_time else "-"
            c_text = _format(c_time) if c_time else "-"
            print(f"{case:<20} {size:>5} {c_text:>10} {_format(times['py']):>10} {ratio:>6}")


if __name__ == "__main__":
    main()
