"""The ``sessionscope`` command: look into, check, copy and move stores; bench and replay.

Exit codes: 0 success; 1 the command ran and found a problem or failed (a
store that does not verify, a damaged or busy store, a refused dump, a
migration whose copies differ, a replay whose verification failed); 2 bad
usage or input (unknown URI scheme, a path that holds no store or a store
of a newer format, store files that are links, FIFOs or devices (which
verify lists as problems found), an output
path that exists, is not a new file, lies in a store's directory or whose
directory is missing, a non-empty backup directory, a missing or malformed
trace). ``tail --follow`` runs until interrupted (Ctrl-C or SIGTERM) and
then exits 0. Every failure is one line on stderr, never a traceback; with
``--json`` it is also one JSON object on stdout,
``{"error": {"type": ..., "message": ..., "hint": ...}}``. The library's
warnings are one line each on stderr (``sessionscope: warning: ...``), and
with ``-v`` its INFO records too.

Only argparse and logging are imported at start: each command imports what it needs, so
``sessionscope --help`` stays fast.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import signal
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from .. import __version__
from ..admin.outfile import OutputPathError
from ..errors import SessionscopeError

__all__ = ["main"]

_STORES = (
    "memory://, lmdb:///path[?durability=sync|deferred], adk-lmdb:///path, "
    "adk-memory://, adk-sqlite:///path, adk-database://SQLALCHEMY-URL"
)

_LMDB_URI = "lmdb:///path (or lmdb://relative/path)"
# Every store a store command opens through open_store; backup, compact and
# upgrade work on an LMDB store's files and take _LMDB_URI only.
_STORE_URIS = (
    f"{_LMDB_URI}, redis://[:password@]host:port/db, rediss://... (TLS), "
    "redis+cluster://host:port,host:port, memory://"
)


_VERBOSE = "also show what the library logs at INFO (map growth, retries), not only warnings"


class UsageError(Exception):
    """Bad input: reported on stderr with exit code 2."""


class _Failed(Exception):
    """A failure already said in full: reported on stderr with exit code 1."""


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line on stderr, like every failure."""

    # The top-level parser's command parsers, by name.
    command_parsers: Mapping[str, argparse.ArgumentParser]
    # Whether the command line asks for --json: a usage error is then also
    # one JSON object on stdout.
    json_errors = False

    def error(self, message: str) -> NoReturn:
        from ..stores import redact

        # The message may quote the command line: a URI's password never shows.
        line = " ".join(redact(message).split())
        if _Parser.json_errors:
            _print_json_error("UsageError", line, f"see '{self.prog} --help'")
        self.exit(2, f"{self.prog}: error: {line} (see '{self.prog} --help')\n")


def _parser() -> _Parser:
    parser = _Parser(
        prog="sessionscope",
        description="Look into, check, back up and move session stores; benchmark and "
        "replay them. Every store command takes a URI: " + _STORE_URIS + " (backup, "
        "compact and upgrade: lmdb:// only).",
        epilog="Run 'sessionscope COMMAND --help' for a command's options. Exit status: 0 "
        "success, 1 a problem found or a failure, 2 bad usage or input, 130 interrupted "
        "(Ctrl-C), 143 terminated (SIGTERM).",
    )
    parser.add_argument("--version", action="version", version=f"sessionscope {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help=_VERBOSE)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    parser.command_parsers = commands.choices

    bench = commands.add_parser(
        "bench",
        help="compare sessionscope with google-adk's session services on the agent mix",
        description="Generate the agent mix, replay it on sessionscope's LMDB store (durable, "
        "deferred, bulk) and on every peer installed (google-adk in-memory, SQLite, Database), "
        "measure raw LMDB as the floor, then time every speed target on the mix and on sessions "
        "of 10 to 1,000 events, each beside its peer, and print medians and ratios.",
    )
    bench.add_argument("--quick", action="store_true", help="a smaller run (about a minute)")
    bench.add_argument("--sessions", type=_positive, help="sessions of the mix to replay")
    bench.add_argument("--seed", type=int, default=0, help="seed of the mix")
    bench.add_argument("--budget", type=float, help="seconds each target may replay for")
    bench.add_argument(
        "--out",
        type=Path,
        help="also write results.json, results.txt and PNG charts into this new or empty directory",
    )
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
    rep.add_argument("--json", type=Path, metavar="FILE",
                     help="also write the results as JSON into this new file")  # fmt: skip

    gen = commands.add_parser(
        "generate",
        help="write the agent mix: a deterministic trace of agent traffic",
        description="Write the agent mix (see docs/performance.md) as a trace: the same "
        "options give the same bytes.",
    )
    gen.add_argument("out", type=Path, help="the trace file to write (.gz compresses)")
    gen.add_argument("--sessions", type=_positive, default=1000)
    gen.add_argument("--apps", type=_positive, default=3)
    gen.add_argument("--users", type=_positive, default=100, help="users over all apps")
    gen.add_argument("--lengths", type=_positive, nargs=2, default=(5, 1000),
                     metavar=("MIN", "MAX"), help="bounds of a session's event count")  # fmt: skip
    gen.add_argument("--median-length", type=_positive, default=40,
                     help="median stored events per session (log-normal)")  # fmt: skip
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--no-reads", action="store_true", help="only creates and appends")

    _store_commands(commands)
    return parser


def _store_commands(commands: Any) -> None:
    """Add the commands that look into, check, copy and move a store."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--json", action="store_true", help="print one JSON document on stdout, for scripts"
    )
    common.add_argument("--no-progress", action="store_true", help="never draw progress bars")
    # Also after the command; SUPPRESS keeps a -v given before it.
    common.add_argument(
        "-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help=_VERBOSE
    )

    def add(name: str, summary: str, description: str) -> argparse.ArgumentParser:
        return commands.add_parser(  # type: ignore[no-any-return]
            name, help=summary, description=description, parents=[common]
        )

    def uri(parser: argparse.ArgumentParser, schemes: str = _STORE_URIS) -> None:
        parser.add_argument("uri", metavar="URI", help=f"the store: {schemes}")

    def session(parser: argparse.ArgumentParser) -> None:
        uri(parser)
        parser.add_argument("app", metavar="APP")
        parser.add_argument("user", metavar="USER")
        parser.add_argument("session", metavar="SESSION")

    ls = add(
        "ls",
        "list apps, an app's users, or a user's sessions",
        "Without --app, list the apps; with --app, its users; with --user too, the "
        "user's sessions with event counts, sizes and last update (least recently "
        "active first). Paged: a page ends with the --cursor of the next.",
    )
    uri(ls)
    ls.add_argument("--app", help="list this app's users")
    ls.add_argument("--user", help="with --app: list this user's sessions")
    ls.add_argument("--limit", type=_positive, default=50, help="entries per page (50)")
    ls.add_argument("--cursor", help="start after this cursor, printed by the page before")

    show = add(
        "show",
        "print a session's state by scope and its last events",
        "Print a session's state grouped by scope (app:, user:, session) and its last events.",
    )
    session(show)
    show.add_argument(
        "--last",
        type=_natural,
        default=10,
        metavar="N",
        help="how many of the last events to print (10)",
    )

    tail = add(
        "tail",
        "print a session's last events; --follow prints new ones as they come",
        "Print a session's last events; with --follow, go on printing each event "
        "another process appends, until interrupted (Ctrl-C or SIGTERM: exit 0). With "
        "--json, one JSON object per event and line.",
    )
    session(tail)
    tail.add_argument(
        "--last",
        type=_natural,
        default=10,
        metavar="N",
        help="how many of the last events to print first (10)",
    )
    tail.add_argument("--follow", "-f", action="store_true", help="wait for new events")
    tail.add_argument(
        "--interval",
        type=_seconds,
        default=0.2,
        metavar="SECONDS",
        help="how often --follow looks for new events (0.2)",
    )

    stats = add(
        "stats",
        "sessions, events and bytes per app and scope; file size, free pages",
        "Count sessions, events and bytes (keys and packed values) per app and per "
        "scope; for LMDB also the file's size, its pages in use and its free pages "
        "(pages no database holds, which later writes reuse and compact removes).",
    )
    uri(stats)

    verify = add(
        "verify",
        "check a store's file and its logic; exit 0 only when clean",
        "Check the store's structure (the LMDB file) and its logic: every session's "
        "count matches its events, every index entry points at a record and back, no "
        "data without a record. Exit 0 when clean, 1 listing the problems found.",
    )
    uri(verify)

    backup = add(
        "backup",
        "copy a live LMDB store into a new directory, then verify the copy",
        "Copy one consistent snapshot of an LMDB store, compacted, while writers go on, "
        "into DEST (new, or an empty directory); the copy opens as lmdb://DEST and is "
        "verified before the command succeeds.",
    )
    uri(backup, _LMDB_URI)
    backup.add_argument("dest", metavar="DEST", help="a new or empty directory")

    compact = add(
        "compact",
        "rewrite an LMDB store without free pages, via a verified copy",
        "Copy the store with compaction next to it, verify the copy and swap its file "
        "in by one rename. Refused while another process has the store open.",
    )
    uri(compact, _LMDB_URI)

    upgrade = add(
        "upgrade",
        "bring an LMDB store to the current store format, in place",
        "Add what the current format has (format 2: the list index) to a store of an "
        "earlier format, in one crash-safe transaction. Refused while another process "
        "has the store open.",
    )
    uri(upgrade, _LMDB_URI)

    export = add(
        "export",
        "write a store (or an app or user) as a dump, or an app as a trace",
        "Write a versioned, checksummed dump of every app, user state, session and "
        "event (gzip when OUT ends in .gz); or, with --format trace, an app's sessions "
        "as a trace that replay takes.",
    )
    uri(export)
    export.add_argument("out", metavar="OUT", type=Path, help="the file to write")
    export.add_argument("--app", help="only this app (needed by --format trace)")
    export.add_argument("--user", help="only this user of --app")
    export.add_argument(
        "--format", choices=("dump", "trace"), default="dump", help="dump (default) or trace"
    )
    export.add_argument(
        "--plaintext",
        action="store_true",
        help="let --format trace write an encrypted store's values in clear (a dump keeps "
        "them sealed)",
    )

    imp = add(
        "import",
        "load a dump into a store; a truncated or altered dump changes nothing",
        "Check a dump whole (its trailer's counts and checksum) and only then load it "
        "into the store, created if missing. Importing twice changes nothing.",
    )
    uri(imp)
    imp.add_argument("source", metavar="IN", type=Path, help="a dump written by export")

    migrate = add(
        "migrate",
        "copy sessions from google-adk's own session services",
        "Copy every session, event and app:/user: state from an ADK session service "
        "(sqlite:///path for SqliteSessionService, a SQLAlchemy URL such as "
        "sqlite+aiosqlite:///path or postgresql+asyncpg://... for "
        "DatabaseSessionService), then read both back through ADK and report any "
        "difference (exit 1). Re-running is a no-op; an interrupted run resumes.",
    )
    migrate.add_argument("--from", dest="source", required=True, metavar="ADK-URI")
    migrate.add_argument(
        "--to",
        dest="to",
        required=True,
        metavar="URI",
        help=f"the store to copy into: {_STORE_URIS}",
    )
    migrate.add_argument("--app", help="only this app")

    rotate = add(
        "rotate-key",
        "re-wrap an encrypted store's data keys under a new key-encryption key",
        "Re-wrap every data key in the key store KEYS (the keys= of an encrypted "
        "store: lmdb:///path or redis://host:port/db?prefix=name) from the old "
        "key-encryption key to the new one; the data is not rewritten. Crash-safe "
        "and resumable: run it again after an interruption, and once more after every "
        "process holds the new key.",
    )
    rotate.add_argument("keys", metavar="KEYS", help="the key store's URI")
    for which in ("old", "new"):
        group = rotate.add_mutually_exclusive_group(required=True)
        group.add_argument(
            f"--{which}-key-file", metavar="PATH", help=f"a file holding the {which} key"
        )
        group.add_argument(
            f"--{which}-key-env",
            metavar="NAME",
            help=f"an environment variable holding the {which} key",
        )


def _natural(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    # 0 would poll without pause; inf or nan cannot be slept.
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is not a positive, finite number of seconds")
    return value


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} is not positive")
    return value


def _bench(args: argparse.Namespace) -> int:
    from ..bench.job import BenchConfig, run

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
    from ..admin.outfile import output_file
    from ..bench.replay import TargetError, check_trace, open_target, replay
    from ..bench.trace import TraceError, load_trace, sample_trace_path
    from ..stores.uri import lmdb_path

    path = Path(args.trace)
    if args.trace == "sample" and not path.exists():
        path = sample_trace_path()
    try:
        _, records = load_trace(path)
        # Whole, before the target store is opened (or created).
        check_trace(records)
    except TraceError as error:
        raise UsageError(str(error)) from None
    # The report file is made (new, owner-only) before the replay runs, so a
    # path it refuses costs nothing, and removed again unless the replay ends.
    home = lmdb_path(args.store)
    report = (
        contextlib.nullcontext()
        if args.json is None
        else output_file(args.json, [home] if home is not None else [])
    )
    with report as out:
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
            from ..errors import AlreadyExistsError

            hint = ""
            if isinstance(error, AlreadyExistsError):
                hint = " (replay into a new, empty store: a trace creates its sessions)"
            raise _Failed(f"replay failed: {type(error).__name__}: {error}{hint}") from None
        finally:
            target.close()
        print(result.format())
        if out is not None:
            out.write((json.dumps(result.to_dict(), indent=2) + "\n").encode())
    return 1 if result.problems else 0


def _generate(args: argparse.Namespace) -> int:
    from ..bench.mix import MixSpec, generate_trace

    default = MixSpec()
    low, high = args.lengths
    if low > high:
        raise UsageError(f"--lengths {low} {high}: the minimum is above the maximum")
    spec = MixSpec(
        sessions=args.sessions,
        apps=args.apps,
        users=args.users,
        lengths=(low, high),
        median_length=args.median_length,
        seed=args.seed,
        get_every_turn=not args.no_reads,
        list_every=0 if args.no_reads else default.list_every,
        delete_fraction=0.0 if args.no_reads else default.delete_fraction,
    )
    count = generate_trace(args.out, spec)
    print(f"wrote {count:,} calls to {args.out}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit code."""
    parser = _parser()
    words = sys.argv[1:] if argv is None else list(argv)
    _Parser.json_errors = "--json" in words and "replay" not in words
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        # Reported by the command's own parser, which names the command.
        owner = parser.command_parsers.get(args.command, parser) if args.command else parser
        owner.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command is None:
        parser.print_help()
        return 2
    stop_logging = _log_to_stderr(args.verbose)
    restore = _terminate_by_exit()
    try:
        return _run(args)
    finally:
        restore()
        stop_logging()


class _Terminated(BaseException):
    """SIGTERM, raised where the command was, so that it ends as on Ctrl-C (exit 143)."""


def _end_on_sigterm(signum: int, frame: Any) -> NoReturn:
    raise _Terminated(128 + signum)


def _terminate_by_exit() -> Callable[[], None]:
    """Make SIGTERM end the command as an exception does; return what undoes it.

    A command killed by the signal's default action would leave the
    ``.partial`` of the file it was writing; as an exception (exit 143) the
    file is removed as on Ctrl-C, and open stores are closed. Only where
    SIGTERM has its default action, from the main thread: an application
    that runs ``main`` keeps its own handler.
    """
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return lambda: None
    signal.signal(signal.SIGTERM, _end_on_sigterm)

    def restore() -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    return restore


def _run(args: argparse.Namespace) -> int:
    """Run the command ``args`` names; report its failure as one line."""
    handlers = {"bench": _bench, "replay": _replay, "generate": _generate}
    try:
        if args.command in handlers:
            return handlers[args.command](args)
        from .commands import HANDLERS

        return HANDLERS[args.command](args)
    except UsageError as error:
        _fail(args.command, str(error))
        _json_error(args, "UsageError", str(error))
        return 2
    except _Failed as error:
        _fail(args.command, str(error))
        return 1
    except OutputPathError as error:
        # An output path refused before anything was written: bad input.
        _fail(args.command, str(error))
        _json_error(args, type(error).__name__, str(error))
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except _Terminated as stop:
        print("terminated", file=sys.stderr)
        code: int = stop.args[0]
        return code
    except BrokenPipeError:
        # The reader (e.g. head) went away: not an error of ours.
        sys.stderr.close()
        return 0
    except ModuleNotFoundError as error:
        extra = {"rich": "cli", "google": "adk"}.get((error.name or "").partition(".")[0])
        if extra is None:
            raise
        _fail(args.command, f"this needs {error.name}: pip install 'sessionscope[{extra}]'")
        _json_error(args, type(error).__name__, f"this needs {error.name}")
        return 1
    except (SessionscopeError, OSError, ValueError) as error:
        # A refused dump is a ValueError; a store that fails is a StoreError.
        _fail(args.command, f"{type(error).__name__}: {error}")
        _json_error(args, type(error).__name__, str(error))
        return 1


class _OneLine(logging.Formatter):
    """Format a record as one line, ``sessionscope: warning: ...``; an error without traceback."""

    def format(self, record: logging.LogRecord) -> str:
        from ..stores import redact

        message = record.getMessage()
        error = record.exc_info[1] if record.exc_info else None
        if error is not None:
            message += f": {type(error).__name__}: {error}"
        line = " ".join(redact(message).split())
        return f"sessionscope: {record.levelname.lower()}: {line}"


def _log_to_stderr(verbose: bool) -> Callable[[], None]:
    """Show the library's warnings (with ``verbose``, INFO too) on stderr; return the undoing.

    (``main`` may run inside another program: its logging is left as it was.)
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_OneLine())
    handler.setLevel(logging.INFO if verbose else logging.WARNING)
    top = logging.getLogger("sessionscope")
    level = top.level
    if verbose and not top.isEnabledFor(logging.INFO):
        top.setLevel(logging.INFO)
    top.addHandler(handler)

    def undo() -> None:
        top.removeHandler(handler)
        top.setLevel(level)

    return undo


def _fail(command: str, message: str) -> None:
    """Print one line on stderr: which command failed and why (no password of a URI in it)."""
    from ..stores import redact

    line = " ".join(redact(message).split())
    print(f"sessionscope {command}: error: {line}", file=sys.stderr)


def _json_error(args: argparse.Namespace, kind: str, message: str) -> None:
    """With --json, also print the error as one JSON object on stdout, for scripts.

    ``{"error": {"type": ..., "message": ..., "hint": ...}}``; the exit code
    and the line on stderr stay as they are.
    """
    if getattr(args, "json", None) is not True:  # replay's --json names a file
        return
    from ..stores import redact

    # A password in a URI never reaches the output.
    text = " ".join(redact(message).split())
    head, found, rest = text.rpartition(" (hint: ")
    hint = None
    if found and rest.endswith(")"):
        text, hint = head, rest[:-1]
    _print_json_error(kind, text, hint)


def _print_json_error(kind: str, message: str, hint: str | None) -> None:
    document = {"error": {"type": kind, "message": message, "hint": hint}}
    print(json.dumps(document, ensure_ascii=False), flush=True)
