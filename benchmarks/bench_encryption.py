"""What encryption at rest costs: each figure beside the same store unencrypted, in one run.

    python benchmarks/bench_encryption.py [--rounds N] [--quick]

The workload is the agent mix of ``sessionscope bench`` (``bench.speed.turn_records``:
a user message, a model reply calling a tool, the tool's answer, each with a
session, ``user:``, ``app:`` and ``temp:`` delta). For each store (LMDB
deferred, LMDB durable, memory) the plain and the encrypted store are
measured round by round, alternating, and each figure is the median over
rounds of each round's median:

- one append (``append_event``), per call;
- ``get_session(num_recent_events=10)`` on a session of 1,000 events;
- ``append_many`` in batches of 1,000 over 100 sessions (LMDB deferred), events/s.

The targets (docs/encryption.md): at most 1.2x on append and on the read,
and ``append_many`` at least 100,000 events/s encrypted.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from sessionscope import SyncSessionService
from sessionscope.bench.replay import collector_paused
from sessionscope.bench.speed import turn_records
from sessionscope.crypto import Encryption
from sessionscope.model import GetSessionConfig
from sessionscope.service.core import event_from_record
from sessionscope.stores import open_store

KEK = bytes(range(32))
STORES = {
    "lmdb deferred": "lmdb://{dir}/{name}?durability=deferred",
    "lmdb durable": "lmdb://{dir}/{name}?durability=sync",
    "memory": "memory://",
}


def _events(count: int, prefix: str) -> list[Any]:
    records = turn_records(count, prefix=prefix)
    for record in records:
        record["actions"] = {"state_delta": dict(record["actions"]["state_delta"])}
    return [event_from_record(record) for record in records]


def _open(kind: str, directory: Path, name: str, encrypted: bool) -> SyncSessionService:
    uri = STORES[kind].format(dir=directory, name=name)
    encryption = Encryption(keys=f"lmdb://{directory}/{name}.keys", key=KEK) if encrypted else None
    return SyncSessionService(open_store(uri, encryption=encryption))


def _append_us(service: SyncSessionService, count: int, tag: str) -> float:
    session = service.create_session(app_name="bench", user_id="u", session_id=tag)
    samples = []
    clock = time.perf_counter_ns
    for event in _events(count, tag):
        began = clock()
        service.append_event(session, event)
        samples.append(clock() - began)
    return statistics.median(samples) / 1e3


def _get10_us(service: SyncSessionService, reads: int, tag: str) -> float:
    session = service.create_session(app_name="bench", user_id="u", session_id=tag)
    service.append_many([(session, event) for event in _events(1000, tag)])
    config = GetSessionConfig(num_recent_events=10)
    samples = []
    clock = time.perf_counter_ns
    for _ in range(reads):
        began = clock()
        got = service.get_session(app_name="bench", user_id="u", session_id=tag, config=config)
        samples.append(clock() - began)
        assert got is not None and len(got.events) == 10
    return statistics.median(samples) / 1e3


def _bulk_rate(service: SyncSessionService, count: int, tag: str) -> float:
    sessions = [
        service.create_session(app_name="bench", user_id=f"u{i % 10}", session_id=f"{tag}-{i}")
        for i in range(100)
    ]
    pairs = [(sessions[i % 100], event) for i, event in enumerate(_events(count, tag))]
    with collector_paused():
        began = time.perf_counter()
        for start in range(0, len(pairs), 1000):
            service.append_many(pairs[start : start + 1000])
        return len(pairs) / (time.perf_counter() - began)


def measure(rounds: int, appends: int, durable_appends: int, bulk: int) -> list[list[str]]:
    """Return the table's rows: figure, plain, encrypted, ratio."""
    results: dict[str, dict[bool, list[float]]] = {}

    def add(name: str, encrypted: bool, value: float) -> None:
        results.setdefault(name, {False: [], True: []})[encrypted].append(value)

    with tempfile.TemporaryDirectory(prefix="sessionscope-bench-enc-") as root:
        directory = Path(root)
        for number in range(rounds):
            for encrypted in (False, True) if number % 2 == 0 else (True, False):
                side = "enc" if encrypted else "plain"
                for kind in STORES:
                    name = f"{kind.replace(' ', '-')}-{side}-{number}"
                    with _open(kind, directory, name, encrypted) as service:
                        count = durable_appends if kind == "lmdb durable" else appends
                        add(f"append, {kind} (us)", encrypted, _append_us(service, count, "a"))
                        add(
                            f"get_session(num_recent_events=10), {kind} (us)",
                            encrypted,
                            _get10_us(service, appends, "g"),
                        )
                        if kind == "lmdb deferred":
                            add(
                                "append_many, batches of 1,000, lmdb deferred (events/s)",
                                encrypted,
                                _bulk_rate(service, bulk, "b"),
                            )
    rows = []
    for name, sides in results.items():
        plain, enc = statistics.median(sides[False]), statistics.median(sides[True])
        ratio = plain / enc if "events/s" in name else enc / plain
        rows.append([name, f"{plain:,.1f}", f"{enc:,.1f}", f"{ratio:.2f}x"])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="fewer rounds and events")
    args = parser.parse_args()
    rounds, appends, durable, bulk = (
        (2, 150, 40, 5_000) if args.quick else (args.rounds, 400, 120, 20_000)
    )
    rows = measure(rounds, appends, durable, bulk)
    header = ["figure", "plain", "encrypted", "cost"]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(4)]
    for row in [header, *rows]:
        print(
            "  ".join(
                cell.ljust(w) if i == 0 else cell.rjust(w)
                for i, (cell, w) in enumerate(zip(row, widths, strict=True))
            )
        )


if __name__ == "__main__":
    main()
