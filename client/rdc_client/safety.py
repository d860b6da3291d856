"""The options that keep a run from losing data (deletion guards, ``--checksum``) and the
exit status that says a guard stopped something."""

from __future__ import annotations

import argparse
from typing import Any

from rdc.errors import EXIT_DELETE_REFUSED, EXIT_PARTIAL
from rdc.local.marker import client_book
from rdc.transfer.stats import Stats


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError("must be 0 or more")
    return value


def add_safety_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-delete", type=_count, metavar="N",
                   help="delete nothing if more than N entries would be deleted")
    p.add_argument("--force", action="store_true",
                   help="delete even what a guard holds back: a source that lost its folder "
                   "marker or is empty, more than --max-delete, more than half of the files")
    p.add_argument("-c", "--checksum", action="store_true",
                   help="read every file again, also those whose size and time match the "
                   "index (finds content changed without a time change, both sides)")


def safety_options(args: argparse.Namespace) -> dict[str, Any]:
    """The `rdc.transfer.stats.Options` fields these options set."""
    return {"force": args.force, "max_delete": args.max_delete, "checksum": args.checksum,
            "markers": client_book()}


def exit_status(stats: Stats) -> int:
    """7 if a guard stopped deletions, else 3 if something failed, else 0."""
    if stats.refused:
        return EXIT_DELETE_REFUSED
    return EXIT_PARTIAL if stats.failed else 0
