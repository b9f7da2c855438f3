"""Erasing an app from an encrypted store whose Redis key store shares its server with other keys.

    python benchmarks/keystore_scan.py [--keys 1000000] [--apps 5] [--quick]

A Redis key store names each wrapped data key ``prefix + hex(scope)`` and
finds an app's records (for ``delete_app``, and all of them for
``rotate-key``) with ``SCAN MATCH``, which walks the server's whole keyspace
whatever the pattern. The script starts a redis-server on loopback (a free
port, no persistence, stopped by its pid), fills it with ``--keys`` keys of
someone else's, and opens an encrypted LMDB store whose key store is on
that server. For each of ``--apps`` apps it creates a session and times
``delete_app``, counting the SCAN calls it makes (the server's command
statistics). Its peer, on the same server in the same run: listing the
same records with SCAN's default COUNT of ten, as the key store did
before it scanned as the store does. Figures: medians over the apps.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from _redis_server import redis_server
from sessionscope import SyncSessionService
from sessionscope.cli.console import Column, render_table
from sessionscope.crypto import Encryption
from sessionscope.stores import open_store

KEK = bytes.fromhex("5a" * 32)
KEY_PREFIX = "bench-keys:"


def _fill(client: Any, keys: int) -> None:
    """Write ``keys`` keys that belong to nobody here, ten thousand a round trip."""
    for start in range(0, keys, 10_000):
        client.mset({f"other:{n}": b"x" for n in range(start, min(keys, start + 10_000))})


def _scans(client: Any) -> int:
    calls: int = client.info("commandstats").get("cmdstat_scan", {}).get("calls", 0)
    return calls


def measure(keys: int, apps: int, home: Path) -> list[tuple[str, float, float]]:
    """Return (what, median seconds, median SCAN calls) for the key store and its peer."""
    with redis_server(home) as url:
        client = redis.Redis.from_url(url)
        try:
            _fill(client, keys)
            store = open_store(
                f"lmdb://{home / 'data'}",
                encryption=Encryption(keys=f"{url}?prefix={KEY_PREFIX}", key=KEK),
            )
            erase: list[tuple[float, int]] = []
            default_count: list[tuple[float, int]] = []
            try:
                service = SyncSessionService(store)
                for number in range(apps):
                    app = f"app{number}"
                    service.create_session(app_name=app, user_id="ada", state={"v": 1})
                    before = _scans(client)
                    # The peer first, while the app's records are there to be found.
                    began = time.perf_counter()
                    found = list(client.scan_iter(match=f"{KEY_PREFIX}*"))
                    default_count.append((time.perf_counter() - began, _scans(client) - before))
                    assert found, "the key store wrote no records"
                    before = _scans(client)
                    began = time.perf_counter()
                    service.delete_app(app_name=app)
                    erase.append((time.perf_counter() - began, _scans(client) - before))
            finally:
                store.close()
        finally:
            client.close()
    rows = []
    for what, runs in (
        ("delete_app, the key store's scan (COUNT 1000)", erase),
        ("the same records listed with SCAN's default COUNT", default_count),
    ):
        rows.append(
            (
                what,
                statistics.median(seconds for seconds, _ in runs),
                statistics.median(calls for _, calls in runs),
            )
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000, help="other keys on the server")
    parser.add_argument("--apps", type=int, default=5, help="apps erased, one at a time")
    parser.add_argument("--quick", action="store_true", help="100,000 keys, 3 apps")
    args = parser.parse_args()
    keys, apps = (100_000, 3) if args.quick else (args.keys, args.apps)
    with tempfile.TemporaryDirectory() as home:
        rows = measure(keys, apps, Path(home))
    title = f"a Redis key store on a server holding {keys:,} other keys; medians over {apps} apps"
    columns = [Column("listing"), Column("time (ms)", True), Column("SCAN calls", True)]
    print(
        render_table(
            columns, [(what, f"{s * 1000:,.1f}", f"{c:,.0f}") for what, s, c in rows], title
        )
    )


if __name__ == "__main__":
    main()
