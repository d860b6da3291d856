"""The options that keep a run from losing data (deletion guards, ``--checksum``), the
exit status that says a guard stopped something, and a full disk said in one line."""

from __future__ import annotations

import argparse
import os
from typing import Any

from rdc.errors import EXIT_DELETE_REFUSED, EXIT_PARTIAL, NoSpace, disk_full
from rdc.local.index import default_location
from rdc.local.marker import client_book
from rdc.local.paths import displayable
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


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def no_space(exc: BaseException, local: str | None) -> NoSpace | None:
    """A full disk on this machine as one clear error (None if ``exc`` is not one): the
    local directory being written, or the signature index."""
    leaves = _leaves(exc)
    full = [leaf for leaf in leaves if disk_full(leaf)]
    if not full or len(full) != len(leaves):
        return None
    leaf = full[0]
    if isinstance(leaf, OSError):
        written = displayable(os.fsdecode(leaf.filename or ""))
        where = os.path.join(os.path.abspath(local), written) if local else written
        return NoSpace(message=f"on this machine: cannot write {where} ({leaf.strerror})")
    return NoSpace(message=f"on this machine: the signature index in "
                   f"{default_location(local or '.').parent} cannot grow ({leaf})")
