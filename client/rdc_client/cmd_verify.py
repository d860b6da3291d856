"""``rdc verify DIR|URL``: read every file again and compare it with the signature index,
here (DIR) or on the server (URL). Each mismatch is a file whose content changed without
its size or time changing (bit rot); it is listed, and re-indexed so that the next sync
sees it."""

from __future__ import annotations

import argparse
import os
import sys

import trio

from rdc.errors import EXIT_MISMATCH, EXIT_PARTIAL, ConnectionFailed, FileAccessError
from rdc.local.ignore import Excludes, read_ignore_file
from rdc.local.index import default_location
from rdc.local.paths import displayable
from rdc.local.replica import Replica
from rdc.local.verify import CHANGED, verify_tree
from rdc.wire import messages as m
from rdc.wire.frames import ConnectionClosed
from rdc_client.options import add_exclude_option, add_server_options
from rdc_client.progress import human_bytes
from rdc_client.remote import open_connection, parse_url, read_token, tls_context


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "verify",
        help="read every file again and compare it with the signature index",
        description="Read every file of DIR (or of the server's directory at URL) again and "
        "compare it with the signature index. A file whose content changed although its "
        "size and modification time did not (bit rot) is listed, and re-indexed: the next "
        "push from a good copy repairs it. Exit 8 if any was found.",
    )
    p.add_argument("target", metavar="DIR|rdc://HOST[:PORT]/SHARE[/PATH]")
    add_exclude_option(p)
    add_server_options(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.target.startswith("rdc://"):
        files, size, mismatches, unreadable = _remote(args)
    else:
        files, size, mismatches, unreadable = _local(args)
    print(f"verified {files:,} files ({human_bytes(size)}): {len(mismatches):,} mismatched"
          + (f", {unreadable:,} unreadable" if unreadable else ""))
    if mismatches:
        return EXIT_MISMATCH
    return EXIT_PARTIAL if unreadable else 0


def _show(path: str) -> None:
    print(f"mismatch: {displayable(path)}: {CHANGED} (re-indexed)", flush=True)


def _local(args: argparse.Namespace) -> tuple[int, int, list[str], int]:
    root = args.target
    if not os.path.isdir(root):
        raise FileAccessError(path=root, reason="not a directory")
    excludes = Excludes([*args.exclude, *read_ignore_file(root)])
    try:
        replica = Replica(root, default_location(root), excludes)
    except OSError as exc:
        raise FileAccessError(path=root, reason=exc.strerror or str(exc)) from None
    try:
        report = verify_tree(replica, excludes, lambda finding: _show(finding.path))
    finally:
        replica.close()
    for path, reason in report.errors:
        print(f"rdc: cannot read {displayable(path)}: {reason}", file=sys.stderr)
    return report.files, report.bytes, [f.path for f in report.findings], len(report.errors)


def _remote(args: argparse.Namespace) -> tuple[int, int, list[str], int]:
    remote = parse_url(args.target)
    token = read_token(args.token_file)
    tls = tls_context(args.ca_file) if args.tls or args.ca_file else None

    async def ask() -> m.Verified:
        async with open_connection(remote, token, tls, compress=not args.no_compress) as (
            connection, _):
            opening = connection.start(m.Open(share=remote.share, path=remote.path,
                                              excludes=list(args.exclude)))
            await opening.receive(m.Opened)
            opening.close()
            asking = connection.start(m.Verify())
            mismatches: list[str] = []
            while True:
                answer = await asking.receive(m.Verified)
                for path in answer.mismatches:
                    _show(path)
                mismatches += answer.mismatches
                if not answer.more:
                    asking.close()
                    return m.Verified(files=answer.files, size=answer.size,
                                      mismatches=mismatches, unreadable=answer.unreadable)

    try:
        answer = trio.run(ask)
    except ConnectionClosed as exc:
        raise ConnectionFailed(message=f"{remote}: {exc}") from None
    return answer.files, answer.size, answer.mismatches, answer.unreadable

