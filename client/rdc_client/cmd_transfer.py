"""``rdc push LOCAL URL`` and ``rdc pull URL LOCAL``: one-way sync with a server."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import trio

from rdc.errors import EXIT_PARTIAL, ConnectionFailed, FileAccessError, UsageError
from rdc.local.ignore import Excludes, read_ignore_file
from rdc.local.index import default_location
from rdc.local.replica import Replica
from rdc.transfer import oneway
from rdc.transfer.stats import Options, Stats
from rdc.wire.frames import ConnectionClosed
from rdc_client.options import (
    add_dry_run_option,
    add_exclude_option,
    add_report_options,
    add_server_options,
)
from rdc_client.progress import ProgressLine, TransferBar, human_bytes
from rdc_client.remote import RemoteURL, open_connection, parse_url, read_token, tls_context


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
    add_dry_run_option(p)
    add_exclude_option(p)
    add_report_options(p, "list what is transferred")
    add_server_options(p)


def run(args: argparse.Namespace) -> int:
    remote = parse_url(args.url)
    token = read_token(args.token_file)
    tls = tls_context(args.ca_file) if args.tls or args.ca_file else None
    local = args.local
    made: list[str] = []  # directories this run created for a pull, outermost first
    if args.direction == "push":
        if not os.path.isdir(local):
            raise FileAccessError(path=local, reason="not a directory")
    else:
        try:
            made = _missing_directories(local)
            os.makedirs(local, exist_ok=True)
        except OSError as exc:
            raise FileAccessError(path=local, reason=exc.strerror or str(exc)) from None
        if not os.path.isdir(local):
            raise FileAccessError(path=local, reason="not a directory")
    patterns = [*args.exclude, *read_ignore_file(local)]
    excludes = Excludes(patterns)
    started = time.monotonic()
    completed = False
    try:
        stats = trio.run(_transfer, args, remote, token, tls, excludes, patterns)
        completed = True
    except ConnectionClosed as exc:
        raise ConnectionFailed(message=f"{remote}: {exc}") from None
    finally:
        if args.dry_run or not completed:
            _remove_empty(made)  # a dry run, or a pull that failed, leaves nothing behind
    stats.seconds = time.monotonic() - started
    report(args, stats)
    return EXIT_PARTIAL if stats.failed else 0


def _missing_directories(path: str) -> list[str]:
    """``path`` and its ancestors that do not exist, outermost first."""
    missing = []
    path = os.path.abspath(path)
    while not os.path.lexists(path):
        missing.append(path)
        path = os.path.dirname(path)
    return missing[::-1]


def _remove_empty(directories: list[str]) -> None:
    for path in reversed(directories):
        try:
            os.rmdir(path)
        except OSError:  # not empty (something was fetched into it), or gone: keep the rest
            return


async def _transfer(
    args: argparse.Namespace,
    remote: RemoteURL,
    token: str,
    tls: Any,
    excludes: Excludes,
    patterns: list[str],
) -> Stats:
    try:
        replica = Replica(args.local, default_location(args.local), excludes)
    except OSError as exc:
        raise FileAccessError(path=args.local, reason=exc.strerror or str(exc)) from None
    try:
        line = ProgressLine(enabled=args.progress)
        bar = TransferBar(enabled=args.progress, after=line)
        options = Options(delete=args.delete, dry_run=args.dry_run, progress=bar)
        async with open_connection(remote, token, tls, compress=not args.no_compress) as (
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


def report(args: argparse.Namespace, stats: Stats) -> None:
    changes = stats.changes
    if (args.dry_run or args.verbose) and changes is not None:
        verb = "would " if args.dry_run else ""
        for path, _ in changes.replace:
            print(f"{verb}replace {path}")
        for path, _ in changes.mkdirs:
            print(f"{verb}create {path}/")
        for path, _ in changes.files:
            print(f"{verb}send {path}" if args.direction == "push" else f"{verb}fetch {path}")
        for path, target, _ in changes.links:
            print(f"{verb}link {path} -> {os.fsdecode(target)}")
        for path, what in changes.meta:
            if "mode" in what:
                print(f"{verb}chmod {path or '.'}")
            if "time" in what:
                print(f"{verb}touch {path or '.'}")
        for path, _ in changes.removals:
            if args.delete:
                print(f"{verb}delete {path}")
            elif args.verbose or args.dry_run:
                print(f"extra {path} (kept; --delete removes it)")
    for path, error in stats.failed:
        print(f"rdc: {path}: {error}", file=sys.stderr)
    for warning in stats.warnings:
        print(f"rdc: warning: {warning}", file=sys.stderr)
    summary = stats.as_json()
    if args.stats:
        print(
            f"files: {stats.files_total:,} total, {stats.files_transferred:,} transferred "
            f"({stats.copied_files:,} copied locally), {len(stats.failed):,} failed\n"
            f"data: {human_bytes(stats.literal_bytes)} literal, "
            f"{human_bytes(stats.matched_bytes)} matched\n"
            f"wire: {human_bytes(stats.bytes_sent)} sent, "
            f"{human_bytes(stats.bytes_received)} received in {stats.seconds:.2f} s"
            + ("" if stats.in_step or args.dry_run else "\nwarning: the trees differ at the end")
        )
    if args.stats_json:
        try:
            with open(args.stats_json, "w", encoding="utf-8") as f:
                json.dump(summary, f, indent=2)
                f.write("\n")
        except OSError as exc:
            raise UsageError(message=f"cannot write {args.stats_json}: {exc.strerror}") from None
