"""The bulk and listing rows of the speed targets alone, round by round.

As a script (about 15 seconds at 3 rounds)::

    python benchmarks/bench_bulk_listing.py [--rounds 3]

Runs the same functions as those rows of ``bench_speed.py`` and
``sessionscope bench`` (``append_many`` in batches of 1,000 and
``replay --batch 1000``, deferred; a page of 100 at 1,000 and 100,000
sessions and the whole listing of 10,000), and prints every round's figure
as well as the median, so that a noisy round shows as one.

pytest collects this file when the folder is run and finds no tests in it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from sessionscope.bench.speed import SpeedConfig, _bulk_rate, _listing_figures, _replay_rate


def main(argv: list[str] | None = None) -> int:
    """Measure the bulk and listing rows and print each round."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds per figure")
    args = parser.parse_args(argv)
    config = SpeedConfig()
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch)
        bulk = [_bulk_rate(config, directory, n) for n in range(args.rounds)]
        replayed = [_replay_rate(config, directory, n) for n in range(args.rounds)]
        listings = []
        for n in range(args.rounds):
            (directory / f"listing-{n}").mkdir()
            listings.append(_listing_figures(config, directory / f"listing-{n}", adk=False))
    print("append_many, batches of 1,000 (events/s):", _figures(bulk, "{:,.0f}"))
    print("replay --batch 1000 (events/s):          ", _figures(replayed, "{:,.0f}"))
    small, large = config.list_sizes
    for key, name in (
        (f"page-{large}", f"list page of 100 at {large:,} sessions (ms):"),
        (f"page-{small}", f"list page of 100 at {small:,} sessions (ms):  "),
        (f"full-{config.full_listing}", f"full listing of {config.full_listing:,} sessions (ms):"),
    ):
        print(f"{name:42s}", _figures([figures[key] / 1e3 for figures in listings], "{:.2f}"))
    return 0


def _figures(values: list[float], form: str) -> str:
    rounds = ", ".join(form.format(v) for v in values)
    return f"median {form.format(statistics.median(values))} (rounds: {rounds})"


if __name__ == "__main__":
    sys.exit(main())
