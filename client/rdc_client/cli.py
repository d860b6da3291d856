"""The ``rdc`` command: argument parsing, dispatch, and turning errors into exit codes."""

from __future__ import annotations

import argparse
import atexit
import importlib
import io
import os
import sqlite3
import sys
import threading
from collections.abc import Callable, Sequence
from typing import NoReturn

from rdc.allocator import tune_allocator, tune_collector
from rdc.errors import RdcError

Command = Callable[[argparse.Namespace], int]

# Command -> the module whose add_parser(s) registers it. Only the command being run is
# imported: a push should not pay for watchdog or the delta simulator at start-up.
COMMANDS = {
    "push": "rdc_client.cmd_transfer",
    "pull": "rdc_client.cmd_transfer",
    "sync": "rdc_client.cmd_sync",
    "watch": "rdc_client.cmd_sync",
    "status": "rdc_client.cmd_status",
    "versions": "rdc_client.cmd_versions",
    "serve": "rdc_server.cli",
    "chunk": "rdc_client.cmd_chunk",
    "sig": "rdc_client.cmd_sig",
    "similar": "rdc_client.cmd_similar",
    "delta": "rdc_client.cmd_delta",
    "init": "rdc_client.cmd_repo",
    "backup": "rdc_client.cmd_backup",
    "snapshots": "rdc_client.cmd_repo",
    "ls": "rdc_client.cmd_restore",
    "restore": "rdc_client.cmd_restore",
    "diff": "rdc_client.cmd_restore",
    "forget": "rdc_client.cmd_repo",
    "prune": "rdc_client.cmd_repo",
    "check": "rdc_client.cmd_repo",
    "verify": "rdc_client.cmd_verify",
}

# The commands whose --json is an event stream (rdc_client.events); an error that ends
# them is an event too.
EVENT_COMMANDS = ("push", "pull", "sync", "watch")


class _Version(argparse.Action):
    """``--version``."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, help="show the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> None:
        from rdc import __version__

        print(f"rdc {__version__}")
        parser.exit()


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; with ``command``, only that command's module is loaded."""
    parser = argparse.ArgumentParser(
        prog="rdc",
        description="Keep directories in step, sending only what the other side lacks.",
    )
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    if command in COMMANDS:
        modules = [COMMANDS[command]]
    elif command == "--version":
        modules = []
    else:
        modules = list(dict.fromkeys(COMMANDS.values()))
    for name in modules:
        module = importlib.import_module(name)
        register = getattr(module, "add_parsers", None) or module.add_parser
        register(sub)
    return parser


def command_parser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    """The parser of command ``name`` (for errors in its own usage)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and name in action.choices:
            return action.choices[name]
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # File names are bytes; those that are not UTF-8 reach us with surrogate escapes. Write
    # them out as the bytes they are (as ls does), not fail with UnicodeEncodeError under a
    # locale whose stdout is strict (en_US.UTF-8 and the like).
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(errors="surrogateescape")
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv[0] if argv else None)
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # said by the command's parser, with its usage, not the top level's
        command_parser(parser, args.command).error(
            f"unrecognized arguments: {' '.join(unknown)}")
    run: Command = args.run
    tune_allocator()  # a large tree's transfer otherwise keeps freed blocks in the process
    tune_collector()
    try:
        return run(args)
    except RdcError as exc:
        return _fatal(args, str(exc), exc.exit_code)
    except KeyboardInterrupt:
        return _fatal(args, "interrupted", 130)
    except sqlite3.OperationalError as exc:
        # The signature index is a cache, rebuilt when it is bad; these errors are not its
        # fault (another rdc held it for long, the disk is full), and would be again.
        full = _no_space(exc, args)
        if full is not None:
            return _fatal(args, str(full), full.exit_code)
        return _fatal(args, f"the signature index: {exc}", 1)
    except BrokenPipeError:
        # The reader went away (rdc chunk --list | head): stop quietly, and keep Python from
        # failing again when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:
        from rdc.wire.frames import ConnectionClosed

        full = _no_space(exc, args)
        if full is not None:
            return _fatal(args, str(full), full.exit_code)
        if isinstance(exc, ConnectionClosed):
            return _fatal(args, f"{exc or 'the connection was closed'}", 5)
        raise


def entry() -> NoReturn:
    """The ``rdc`` program: `main`, then an exit without Python's teardown, which frees
    every module and object one by one (50-75 ms of a 0.4 s push that found nothing to
    do). Whatever must reach the disk or the peer is done when `main` returns, and rdc is
    built to lose nothing when killed at any point; what Python's exit would still do
    (join the threads, run the atexit handlers, such as logging's flush, flush the
    streams) is done here first."""
    code = main()
    shutdown = getattr(threading, "_shutdown", None)  # (joins threads as Python's exit)
    if shutdown is not None:
        shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BrokenPipeError:
            pass  # the reader went away: quietly, as main treats it
        except (OSError, ValueError):
            code = code or 120  # what Python's exit gives when it cannot flush stdout
    os._exit(code)


def _fatal(args: argparse.Namespace, message: str, exit_code: int) -> int:
    """The error that ends the command: a line on stderr, and with ``--json`` an event."""
    print(f"rdc: {message}", file=sys.stderr)
    if args.command in EVENT_COMMANDS and getattr(args, "json", False):
        from rdc_client.events import EventStream

        EventStream().emit("error", path=None, message=message, exit_code=exit_code)
    return exit_code


def _no_space(exc: BaseException, args: argparse.Namespace) -> RdcError | None:
    from rdc_client.safety import no_space

    return no_space(exc, getattr(args, "local", None))
