"""The ``sessionscope`` command: bench, replay, generate and export traces.

Exit codes: 0 success, 1 a replay whose verification failed (or that failed
midway), 2 bad usage or input (unknown URI, missing or malformed trace).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from . import __version__
from .errors import SessionscopeError
from .replay import TargetError, open_target, replay
from .trace import TraceError, TraceSpec, generate_trace, load_trace, sample_trace_path

__all__ = ["main"]

_STORES = (
    "memory://, lmdb:///path[?durability=sync|deferred], adk-lmdb:///path, "
    "adk-memory://, adk-sqlite:///path, adk-database://SQLALCHEMY-URL"
)


_DEFAULT_SPEC = TraceSpec()


class UsageError(Exception):
    """Bad input: reported on stderr with exit code 2."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sessionscope",
        description="Benchmark and replay AI-agent session stores.",
        epilog="Run 'sessionscope bench' to compare every session store on this machine.",
    )
    parser.add_argument("--version", action="version", version=f"sessionscope {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    bench = commands.add_parser(
        "bench",
        help="compare sessionscope with google-adk's session services on one trace",
        description="Generate a trace, replay it on sessionscope's LMDB store (durable, deferred, "
        "bulk) and on every peer installed (google-adk in-memory, SQLite, Database), measure "
        "raw LMDB as the floor, and print medians and ratios.",
    )
    bench.add_argument("--quick", action="store_true", help="a smaller run (under 20 s)")
    bench.add_argument("--sessions", type=_positive, help="sessions in the generated trace")
    bench.add_argument("--seed", type=int, default=0, help="seed of the generated trace")
    bench.add_argument("--budget", type=float, help="seconds each target may replay for")
    bench.add_argument("--out", type=Path, help="also write results.json and PNG charts here")
    bench.add_argument("--no-peers", action="store_true", help="measure sessionscope only")
    bench.add_argument("--no-progress", action="store_true", help="never draw progress bars")
    bench.add_argument("--store", action="append", default=[], metavar="URI",
                       help="also replay on this store (e.g. redis://host:6379/0), "
                       "under a prefix of the run's own; may be repeated")  # fmt: skip

    rep = commands.add_parser(
        "replay",
        help="replay a trace on a store, verify it, report latency percentiles",
        description="Replay a trace on a store, verify the final states and event counts, "
        "and report throughput and latency percentiles per operation.",
    )
    rep.add_argument("trace", help="a trace file (.jsonl or .jsonl.gz), or 'sample'")
    rep.add_argument("--store", required=True, metavar="URI", help=f"one of: {_STORES}")
    rep.add_argument("--batch", type=_positive, default=0, metavar="N",
                     help="send runs of N appends through the bulk path")  # fmt: skip
    rep.add_argument("--no-verify", action="store_true", help="skip the verification")
    rep.add_argument("--keep-gc", action="store_true",
                     help="leave Python's cyclic garbage collector on while timing")  # fmt: skip
    rep.add_argument("--no-progress", action="store_true", help="never draw a progress bar")
    rep.add_argument("--json", type=Path, metavar="FILE", help="also write the results as JSON")

    gen = commands.add_parser(
        "generate",
        help="write a deterministic, realistic agent trace",
        description="Write a generated trace: the same options give the same bytes.",
    )
    gen.add_argument("out", type=Path, help="the trace file to write (.gz compresses)")
    gen.add_argument("--sessions", type=_positive, default=200)
    gen.add_argument("--apps", type=_positive, default=2)
    gen.add_argument("--users", type=_positive, default=50, help="users per app")
    gen.add_argument("--turns", type=_positive, nargs=2, default=(2, 10), metavar=("MIN", "MAX"))
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--no-reads", action="store_true", help="only creates and appends")

    export = commands.add_parser(
        "export",
        help="write the sessions of a store as a trace",
        description="Write every session of an app (or of one user) in a store as a trace.",
    )
    export.add_argument("out", type=Path, help="the trace file to write")
    export.add_argument("--store", required=True, metavar="URI", help="memory:// or lmdb:///path")
    export.add_argument("--app", required=True, help="the app whose sessions to export")
    export.add_argument("--user", help="only this user's sessions")
    return parser


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} is not positive")
    return value


def _bench(args: argparse.Namespace) -> int:
    from .bench import BenchConfig, run

    config = BenchConfig.quick(args.sessions) if args.quick else BenchConfig()
    if args.sessions and not args.quick:
        config.sessions = args.sessions
    if args.budget is not None:
        config.budget_s = args.budget
    config.seed = args.seed
    config.peers = not args.no_peers
    config.stores = tuple(args.store)
    report = run(config, out=args.out, progress=not args.no_progress)
    print(report.format())
    if args.out is not None:
        print(f"results written to {args.out}")
    failed = [r.target for r in report.results if r.problems]
    if failed:
        print(f"verification FAILED on: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def _replay(args: argparse.Namespace) -> int:
    path = Path(args.trace)
    if args.trace == "sample" and not path.exists():
        path = sample_trace_path()
    try:
        _, records = load_trace(path)
    except TraceError as error:
        raise UsageError(str(error)) from None
    try:
        target = open_target(args.store)
    except (TargetError, SessionscopeError) as error:
        raise UsageError(str(error)) from None
    try:
        result = replay(
            target,
            records,
            batch=args.batch,
            verify_result=not args.no_verify,
            progress=not args.no_progress,
            keep_gc=args.keep_gc,
        )
    except (SessionscopeError, ValueError, TypeError) as error:
        print(
            f"sessionscope: replay failed: {type(error).__name__}: {error}\n"
            "(replay into a new, empty store: a trace creates its sessions)",
            file=sys.stderr,
        )
        return 1
    finally:
        target.close()
    print(result.format())
    if args.json is not None:
        args.json.write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    return 1 if result.problems else 0


def _generate(args: argparse.Namespace) -> int:
    low, high = args.turns
    if low > high:
        raise UsageError(f"--turns {low} {high}: the minimum is above the maximum")
    spec = TraceSpec(
        sessions=args.sessions,
        apps=args.apps,
        users_per_app=args.users,
        turns=(low, high),
        seed=args.seed,
        get_every_turn=not args.no_reads,
        list_every=0 if args.no_reads else _DEFAULT_SPEC.list_every,
        delete_fraction=0.0 if args.no_reads else _DEFAULT_SPEC.delete_fraction,
    )
    count = generate_trace(args.out, spec)
    print(f"wrote {count:,} calls to {args.out}")
    return 0


def _export(args: argparse.Namespace) -> int:
    from .stores import open_store
    from .trace import export_trace

    if args.store.startswith("lmdb:") and not _lmdb_path_exists(args.store):
        raise UsageError(f"{args.store}: no store at that path")
    try:
        store = open_store(args.store)
    except (ValueError, SessionscopeError) as error:
        raise UsageError(str(error)) from None
    try:
        count = export_trace(store, args.app, args.out, user_id=args.user)
    finally:
        store.close()
    print(f"wrote {count:,} calls to {args.out}")
    return 0


def _lmdb_path_exists(uri: str) -> bool:
    from urllib.parse import unquote, urlsplit

    parts = urlsplit(uri)
    return Path(unquote(parts.netloc + parts.path)).exists()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit code."""
    parser = _parser()
    args = parser.parse_args(argv)
    handlers = {"bench": _bench, "replay": _replay, "generate": _generate, "export": _export}
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return handlers[args.command](args)
    except UsageError as error:
        print(f"sessionscope {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader (e.g. head) went away: not an error of ours.
        sys.stderr.close()
        return 0
