"""``rdc push LOCAL URL`` and ``rdc pull URL LOCAL``: one-way sync with a server."""

from __future__ import annotations

import argparse
import time
from typing import Any

import trio

from rdc.errors import FileAccessError
from rdc.local.ignore import Excludes, read_ignore_file
from rdc.local.index import default_location
from rdc.local.replica import Replica
from rdc.transfer import oneway
from rdc.transfer.stats import Stats
from rdc.wire.frames import ConnectionClosed
from rdc_client import preflight, problems, reporting
from rdc_client.options import (
    add_dry_run_option,
    add_exclude_option,
    add_report_options,
    add_server_options,
)
from rdc_client.remote import RemoteURL, open_connection, parse_url, read_token, tls_context
from rdc_client.reporting import Report
from rdc_client.safety import add_safety_options, exit_status, safety_options


def add_parsers(sub: argparse._SubParsersAction) -> None:
    push_parser = sub.add_parser(
        "push",
        help="send a local directory to a server",
        description="Make the remote directory a copy of LOCAL, sending only what the server "
        "does not already have.",
    )
    push_parser.add_argument("local", metavar="LOCAL")
    push_parser.add_argument("url", metavar="rdc://HOST[:PORT]/SHARE[/PATH]")
    push_parser.set_defaults(run=run, direction="push")
    pull_parser = sub.add_parser(
        "pull",
        help="fetch a remote directory into a local one",
        description="Make LOCAL (created if needed) a copy of the remote directory, fetching "
        "only what this machine does not already have.",
    )
    pull_parser.add_argument("url", metavar="rdc://HOST[:PORT]/SHARE[/PATH]")
    pull_parser.add_argument("local", metavar="LOCAL")
    pull_parser.set_defaults(run=run, direction="pull")
    for p in (push_parser, pull_parser):
        add_common(p)


def add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--delete", action="store_true",
                   help="delete files on the receiving side that the sending side does not have")
    add_safety_options(p)
    add_dry_run_option(p)
    add_exclude_option(p)
    add_report_options(p, "list what is transferred")
    add_server_options(p)


def run(args: argparse.Namespace) -> int:
    reporting.check(args)
    report = Report(args, args.direction)
    remote = parse_url(args.url)
    token = read_token(args.token_file)
    tls = tls_context(args.ca_file) if args.tls or args.ca_file else None
    local = args.local
    preflight.writable(default_location(local).parent, "XDG_CACHE_HOME")
    made: list[str] = []  # directories this run created for a pull, outermost first
    if args.direction == "push":
        preflight.existing_directory(local)
    else:
        made = preflight.make_directory(local)
    patterns = [*args.exclude, *read_ignore_file(local)]
    excludes = Excludes(patterns)
    started = time.monotonic()
    completed = False
    try:
        stats = trio.run(_transfer, args, remote, token, tls, excludes, patterns, report)
        completed = True
    except (ConnectionClosed, trio.BrokenResourceError) as exc:
        raise problems.lost(str(remote), exc) from None
    finally:
        if args.dry_run or not completed:
            preflight.remove_made(made)  # a dry run, or a pull that failed, leaves nothing
    stats.seconds = time.monotonic() - started
    code = exit_status(stats)
    report.one_way(stats, args.direction == "push", code)
    return code


async def _transfer(
    args: argparse.Namespace,
    remote: RemoteURL,
    token: str,
    tls: Any,
    excludes: Excludes,
    patterns: list[str],
    report: Report,
) -> Stats:
    try:
        replica = Replica(args.local, default_location(args.local), excludes)
    except OSError as exc:
        raise FileAccessError(path=exc.filename or args.local,
                              reason=exc.strerror or str(exc)) from None
    try:
        line = report.scan_line()
        bar = report.transfer_display(after=line)
        options = report.options(delete=args.delete, dry_run=args.dry_run, progress=bar,
                                 **safety_options(args))
        async with open_connection(remote, token, tls, compress=not args.no_compress,
                                   rate=args.bwlimit) as (
            connection,
            counted,
        ):
            bar.counter = counted
            try:
                stats = await oneway.run(connection, replica, remote.share, remote.path,
                                         args.direction == "push", options, patterns, line)
            finally:
                line.close()
                bar.close()
        stats.bytes_sent = counted.bytes_sent
        stats.bytes_received = counted.bytes_received
        return stats
    finally:
        replica.close()
