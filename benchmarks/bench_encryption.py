"""What encryption at rest costs: each figure beside the same store unencrypted, in one run.

    python benchmarks/bench_encryption.py [--rounds N] [--quick]

The workload is the agent mix (``sessionscope.bench.mix``, as ``sessionscope
bench`` takes it: sessions of the mix appended in the mix's order, the
second writer's appends through ``append_event_locked``). For each store
(LMDB deferred, LMDB durable, memory) the plain and the encrypted store are
measured round by round, alternating, on the same sessions of the mix (a
new seed each round), and each figure is the median over rounds of each
round's median:

- one append, per call (durable: the round's first appends only);
- ``get_session(num_recent_events=10)`` of each session once, after all the
  appends (an encrypted store keeps the events it sealed, and the values
  it opened, opened);
- the same read between turns, as an agent makes it: after each append,
  of the session appended to, on a store of its own (the values unchanged
  since the last turn are read again);
- ``append_many`` in batches of 1,000 over the mix (LMDB deferred), events/s;
- the same read of the sessions ``append_many`` wrote;
- that read again on a store opened with ``keep_opened=0``, which keeps
  nothing, so every value it reads is opened: what reading another
  process's writes costs.

The targets (docs/encryption.md): at most 1.2x on append and on the read,
and ``append_many`` at least 100,000 events/s encrypted.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from sessionscope import SyncSessionService
from sessionscope.bench.replay import collector_paused
from sessionscope.bench.speed import Workload, live_appends, mix_spec, timed_sync_appends
from sessionscope.cli.console import Column, render_table
from sessionscope.crypto import Encryption
from sessionscope.model import GetSessionConfig
from sessionscope.stores import open_store

KEK = bytes(range(32))
STORES = {
    "lmdb deferred": "lmdb://{dir}/{name}?durability=deferred",
    "lmdb durable": "lmdb://{dir}/{name}?durability=sync",
    "memory": "memory://",
}
LAST_10 = GetSessionConfig(num_recent_events=10)


def _open(
    kind: str, directory: Path, name: str, encrypted: bool, keep_opened: int | None = None
) -> SyncSessionService:
    uri = STORES[kind].format(dir=directory, name=name)
    encryption = None
    if encrypted:
        keys = f"lmdb://{directory}/{name}.keys"
        keep = {} if keep_opened is None else {"keep_opened": keep_opened}
        encryption = Encryption(keys=keys, key=KEK, **keep)
    return SyncSessionService(open_store(uri, encryption=encryption))


def _median_us(samples: list[int]) -> float:
    return statistics.median(samples) / 1e3


def _appends_us(service: SyncSessionService, work: Workload, count: int | None) -> float:
    """Append the mix's events (the first ``count``); return the median us per append."""
    return _median_us(timed_sync_appends(service, live_appends(service, work)[:count]))


def _reads_us(service: SyncSessionService, work: Workload) -> float:
    """Read the last 10 events of each session of the mix once; return the median us."""
    clock = time.perf_counter_ns
    samples = []
    with collector_paused():
        for app, user, sid in (key for key, _ in work.creates):
            began = clock()
            got = service.get_session(app_name=app, user_id=user, session_id=sid, config=LAST_10)
            samples.append(clock() - began)
            assert got is not None
    return _median_us(samples)


def _turns_us(service: SyncSessionService, work: Workload) -> float:
    """Append the mix's events, reading each one's session after it; return the median read (us)."""
    clock = time.perf_counter_ns
    samples = []
    with collector_paused():
        for session, event, second in live_appends(service, work):
            (service.append_event_locked if second else service.append_event)(session, event)
            began = clock()
            got = service.get_session(
                app_name=session.app_name,
                user_id=session.user_id,
                session_id=session.id,
                config=LAST_10,
            )
            samples.append(clock() - began)
            assert got is not None
    return _median_us(samples)


def _bulk(service: SyncSessionService, work: Workload) -> float:
    """Append the mix in batches of 1,000; return events/s."""
    pairs = [(session, event) for session, event, _ in live_appends(service, work)]
    with collector_paused():
        began = time.perf_counter()
        for start in range(0, len(pairs), 1000):
            service.append_many(pairs[start : start + 1000])
        return len(pairs) / (time.perf_counter() - began)


def measure(rounds: int, sessions: int, durable_appends: int, bulk: int) -> list[list[str]]:
    """Return the table's rows: figure, plain, encrypted, ratio."""
    results: dict[str, dict[bool, list[float]]] = {}

    def add(name: str, encrypted: bool, value: float) -> None:
        results.setdefault(name, {False: [], True: []})[encrypted].append(value)

    with tempfile.TemporaryDirectory(prefix="sessionscope-bench-enc-") as root:
        directory = Path(root)
        for number in range(rounds):
            work = Workload.of(mix_spec(sessions, seed=number))
            bulk_work = Workload.of(mix_spec(bulk, seed=1000 + number))
            for encrypted in (False, True) if number % 2 == 0 else (True, False):
                side = "enc" if encrypted else "plain"
                for kind in STORES:
                    durable = kind == "lmdb durable"
                    name = f"{kind.replace(' ', '-')}-{side}-{number}"
                    with _open(kind, directory, name, encrypted) as service:
                        count = durable_appends if durable else None
                        add(f"append, {kind} (us)", encrypted, _appends_us(service, work, count))
                        if durable:
                            continue
                        add(
                            f"get_session(num_recent_events=10) after the appends, {kind} (us)",
                            encrypted,
                            _reads_us(service, work),
                        )
                    with _open(kind, directory, f"{name}-turns", encrypted) as service:
                        add(
                            f"get_session(num_recent_events=10) between turns, {kind} (us)",
                            encrypted,
                            _turns_us(service, work),
                        )
                    with _open(kind, directory, f"{name}-bulk", encrypted) as service:
                        rate = _bulk(service, bulk_work)
                        if kind == "lmdb deferred":
                            add(
                                "append_many, batches of 1,000, lmdb deferred (events/s)",
                                encrypted,
                                rate,
                            )
                        add(
                            f"the same read of append_many's sessions, {kind} (us)",
                            encrypted,
                            _reads_us(service, bulk_work),
                        )
                    # Nothing kept: every value read is opened, as a read of
                    # what another process wrote opens it.
                    with _open(kind, directory, f"{name}-cold", encrypted, 0) as service:
                        _bulk(service, bulk_work)
                        add(
                            f"the same read, keep_opened=0, {kind} (us)",
                            encrypted,
                            _reads_us(service, bulk_work),
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
    parser.add_argument("--quick", action="store_true", help="fewer rounds and sessions")
    args = parser.parse_args()
    rounds, sessions, durable, bulk = (2, 10, 40, 30) if args.quick else (args.rounds, 40, 150, 150)
    rows = measure(rounds, sessions, durable, bulk)
    columns = ["figure", Column("plain", True), Column("encrypted", True), Column("cost", True)]
    print(render_table(columns, rows))


if __name__ == "__main__":
    main()
