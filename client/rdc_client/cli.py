"""The ``rdc`` command: argument parsing, dispatch, and turning errors into exit codes."""

from __future__ import annotations

import argparse
import io
import os
import sys
from collections.abc import Callable, Sequence
from importlib import metadata

from rdc.errors import RdcError
from rdc.wire.frames import ConnectionClosed
from rdc_client import cmd_chunk, cmd_delta, cmd_sig, cmd_similar, cmd_sync, cmd_transfer
from rdc_server import cli as server_cli

Command = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rdc",
        description="Keep directories in step, sending only what the other side lacks.",
    )
    parser.add_argument("--version", action="version", version=f"rdc {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    cmd_transfer.add_parsers(sub)
    cmd_sync.add_parsers(sub)
    server_cli.add_parser(sub)
    for module in (cmd_chunk, cmd_sig, cmd_similar, cmd_delta):
        module.add_parser(sub)
    return parser


def _version() -> str:
    try:
        return metadata.version("rdc")
    except metadata.PackageNotFoundError:  # running from a source tree
        return "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    # File names are bytes; those that are not UTF-8 reach us with surrogate escapes. Write
    # them out as the bytes they are (as ls does), not fail with UnicodeEncodeError under a
    # locale whose stdout is strict (en_US.UTF-8 and the like).
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(errors="surrogateescape")
    parser = build_parser()
    args = parser.parse_args(argv)
    run: Command = args.run
    try:
        return run(args)
    except RdcError as exc:
        print(f"rdc: {exc}", file=sys.stderr)
        return exc.exit_code
    except ConnectionClosed as exc:
        print(f"rdc: {exc}", file=sys.stderr)
        return 5
    except KeyboardInterrupt:
        print("rdc: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (rdc chunk --list | head): stop quietly, and keep Python from
        # failing again when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
