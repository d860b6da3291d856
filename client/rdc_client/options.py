"""Options that several commands share: reaching a server, what to leave out, how to
report. Each command adds the groups it takes."""

from __future__ import annotations

import argparse

from rdc.errors import UsageError
from rdc.wire.ratelimit import parse_rate


def add_server_options(p: argparse.ArgumentParser) -> None:
    """How to reach and authenticate to an ``rdc serve``."""
    p.add_argument("--token-file", metavar="FILE", help="the token (else $RDC_TOKEN)")
    p.add_argument("--tls", action="store_true", help="connect with TLS")
    p.add_argument("--ca-file", metavar="PEM",
                   help="trust this CA for TLS (implies --tls; default: the system store)")
    p.add_argument("--no-compress", action="store_true", help="do not compress (zstd)")
    p.add_argument("--bwlimit", metavar="RATE", type=_rate, default=None,
                   help="at most RATE each way: KiB/s, or with a unit (500K, 2M); 0: no limit")


def _rate(text: str) -> int | None:
    try:
        return parse_rate(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_exclude_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--exclude", action="append", default=[], metavar="PATTERN",
                   help="leave out paths matching PATTERN (gitignore syntax; repeatable); "
                   "LOCAL/.rdcignore is read too")


def add_report_options(p: argparse.ArgumentParser, verbose_help: str) -> None:
    """Progress, summaries and the list of what changed (rdc_client.reporting)."""
    p.add_argument("--progress", action="store_true", help="show live progress on stderr")
    p.add_argument("--stats", action="store_true", help="print a summary at the end")
    p.add_argument("--stats-json", metavar="FILE",
                   help="write the summary as JSON to FILE (-: to stdout, the rest to stderr)")
    p.add_argument("--json", action="store_true",
                   help="print events (files, errors, summary) as JSON lines on stdout")
    p.add_argument("-v", "--verbose", action="store_true", help=verbose_help)
    p.add_argument("-q", "--quiet", action="store_true", help="print errors only")


def add_dry_run_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", "--dry-run", action="store_true",
                   help="show what would change, change nothing")
