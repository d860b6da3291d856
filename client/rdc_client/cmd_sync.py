"""``rdc sync LOCAL URL`` (two-way, once) and ``rdc watch LOCAL URL`` (two-way, for as long
as it runs: local events and the server's change notices drive incremental syncs)."""

from __future__ import annotations

import argparse
import math
import os
import socket
import sys
import time
from typing import Any

import trio

from rdc.errors import ConnectionFailed, FileAccessError, ProtocolError, RemoteError
from rdc.local.ignore import Excludes, read_ignore_file
from rdc.local.index import default_location
from rdc.local.replica import Replica
from rdc.local.snapshot import Entry
from rdc.transfer import sync_base as base_store
from rdc.transfer.client import Options, Stats, _finish, request_open, scan_while_opening
from rdc.transfer.twoway import Actions, sync_round
from rdc.wire.connection import unwrap_group
from rdc.wire.frames import ConnectionClosed
from rdc_client.cmd_transfer import report
from rdc_client.progress import TransferBar
from rdc_client.remote import Remote, open_connection, parse_url, read_token, tls_context

EXIT_PARTIAL = 3
RECONNECT_FIRST = 1.0  # seconds; doubles up to RECONNECT_MAX while the server is away
RECONNECT_MAX = 60.0
WATCH_IDLE_TIMEOUT = 120.0  # the server says something every 30 s to a watcher
RETRY_SECONDS = 10.0  # a round that did not end in step is tried again after this


def add_parsers(sub: argparse._SubParsersAction) -> None:
    sync_parser = sub.add_parser(
        "sync",
        help="two-way sync of a local directory with a remote one",
        description="Bring LOCAL and the remote directory in step in both directions: "
        "changes on either side go to the other; a file changed on both sides is kept "
        "twice (the older version as a conflict copy).",
    )
    watch_parser = sub.add_parser(
        "watch",
        help="keep a local directory and a remote one in step continuously",
        description="Sync once, then again whenever LOCAL changes or the server reports a "
        "change, until interrupted (Ctrl-C). Reconnects when the server goes away.",
    )
    for p, run in ((sync_parser, run_sync), (watch_parser, run_watch)):
        p.add_argument("local", metavar="LOCAL")
        p.add_argument("url", metavar="rdc://HOST[:PORT]/SHARE[/PATH]")
        p.add_argument("--exclude", action="append", default=[], metavar="PATTERN",
                       help="leave out paths matching PATTERN (gitignore syntax; "
                       "repeatable); LOCAL/.rdcignore is read too")
        p.add_argument("--stats", action="store_true", help="print a summary of each sync")
        p.add_argument("--stats-json", metavar="FILE",
                       help="write the (last) summary as JSON to FILE")
        p.add_argument("-v", "--verbose", action="store_true", help="list what changes")
        p.add_argument("--progress", action="store_true", help="show live progress")
        p.add_argument("--token-file", metavar="FILE", help="the token (else $RDC_TOKEN)")
        p.add_argument("--tls", action="store_true", help="connect with TLS")
        p.add_argument("--ca-file", metavar="PEM", help="trust this CA for TLS (implies --tls)")
        p.add_argument("--no-compress", action="store_true", help="do not compress (zstd)")
        p.set_defaults(run=run, direction="sync", delete=True)
    sync_parser.add_argument("-n", "--dry-run", action="store_true",
                             help="show what would change, change nothing")
    watch_parser.set_defaults(dry_run=False)


class Session:
    """What one ``rdc sync`` or ``rdc watch`` needs across rounds and reconnections."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.remote: Remote = parse_url(args.url)
        self.token = read_token(args.token_file)
        self.tls = tls_context(args.ca_file) if args.tls or args.ca_file else None
        if not os.path.isdir(args.local):
            raise FileAccessError(path=args.local, reason="not a directory")
        self.patterns = [*args.exclude, *read_ignore_file(args.local)]
        self.excludes = Excludes(self.patterns)
        self.base_path = base_store.location(args.local, str(self.remote))
        self.hosts = (socket.gethostname(), self.remote.host)
        self.opened: dict[str, Any] = {}  # the server's answer to the last open

    def options(self) -> Options:
        return Options(delete=True, dry_run=self.args.dry_run,
                       progress=TransferBar(enabled=self.args.progress))

    async def first_round(self, connection: Any, counted: Any, replica: Replica) -> Stats:
        """Open the remote directory and sync once; the local scan runs while the server
        scans its side."""
        started = time.monotonic()
        opening = request_open(connection, self.remote.share, self.remote.path,
                               write=not self.args.dry_run, create=not self.args.dry_run,
                               excludes=self.patterns)
        self.opened, tree = await scan_while_opening(replica, opening)
        return await self.round(connection, counted, replica, self.opened, tree, started)

    async def round(
        self, connection: Any, counted: Any, replica: Replica, hashes: dict,
        tree: Entry | None = None, started: float | None = None,
    ) -> Stats:
        """One sync round against the server's root ``hashes``; ``tree``: the local tree
        if it was scanned just now."""
        started = time.monotonic() if started is None else started
        sent, received = counted.bytes_sent, counted.bytes_received
        stats, actions, _ = await sync_round(
            connection, replica, hashes, self.base_path, self.hosts, self.options(), tree
        )
        stats.seconds = time.monotonic() - started
        stats.bytes_sent = counted.bytes_sent - sent
        stats.bytes_received = counted.bytes_received - received
        self.show(stats, actions)
        return stats

    def show(self, stats: Stats, actions: Actions) -> None:
        args = self.args
        if args.verbose or args.dry_run:
            verb = "would " if args.dry_run else ""
            for label, items in (("send", actions.pushes), ("fetch", actions.gets)):
                for path, _ in items:
                    print(f"{verb}{label} {path}")
            for path, _ in actions.local_rms:
                print(f"{verb}delete here {path}")
            for path, _ in actions.remote_rms:
                print(f"{verb}delete there {path}")
        for path, copy in stats.conflicts:
            print(f"conflict: {path} changed on both sides; the older version is now {copy}",
                  file=sys.stderr)
        report(args, stats)


def run_sync(args: argparse.Namespace) -> int:
    session = Session(args)
    try:
        stats = trio.run(_sync_once, session)
    except ConnectionClosed as exc:
        raise ConnectionFailed(message=f"{session.remote}: {exc}") from None
    return EXIT_PARTIAL if stats.failed else 0


async def _sync_once(session: Session) -> Stats:
    args = session.args
    replica = Replica(args.local, default_location(args.local), session.excludes)
    try:
        if not args.dry_run:
            await trio.to_thread.run_sync(replica.fs.clean_temporaries)
        async with open_connection(session.remote, session.token, session.tls,
                                   compress=not args.no_compress) as (connection, counted):
            return await session.first_round(connection, counted, replica)
    finally:
        replica.close()


# ---------------------------------------------------------------- watch


def run_watch(args: argparse.Namespace) -> int:
    session = Session(args)
    trio.run(_watch, session)
    return 0  # only an interruption (130) or a usage error ends a watch


async def _watch(session: Session) -> None:
    from rdc_client.watching import LocalChanges  # watchdog: only a watch needs it

    args = session.args
    replica = Replica(args.local, default_location(args.local), session.excludes)
    changes = LocalChanges(args.local, session.excludes)  # before the first sync: miss nothing
    delay = RECONNECT_FIRST
    try:
        await trio.to_thread.run_sync(replica.fs.clean_temporaries)
        while True:
            try:
                await _watch_connected(session, replica, changes)
            except (ConnectionFailed, ConnectionClosed, ProtocolError, RemoteError,
                    OSError, trio.BrokenResourceError) as exc:
                why = str(exc) or "the connection was closed"
                print(f"rdc watch: {why}; trying again in {delay:g} s", file=sys.stderr)
                await trio.sleep(delay)
                delay = min(delay * 2, RECONNECT_MAX)
                continue
    finally:
        changes.stop()
        replica.close()


async def _watch_connected(session: Session, replica: Replica, changes: Any) -> None:
    """One connection's life: sync, then sync again on every settled local change or
    newer remote sequence number, until the connection fails."""
    async with open_connection(session.remote, session.token, session.tls,
                               compress=not session.args.no_compress,
                               idle_timeout=WATCH_IDLE_TIMEOUT) as (connection, counted):
        stats = await session.first_round(connection, counted, replica)
        print(f"rdc watch: connected to {session.remote}", file=sys.stderr)
        state = {"seq": max(stats.seq, session.opened["seq"]), "remote": not stats.in_step}
        synced = _in_step(stats, replica)
        wake = trio.Event()
        watcher = connection.start("watch", seq=state["seq"])

        async def remote_notices() -> None:
            while True:
                message = await watcher.receive("changed")
                if message["seq"] > state["seq"]:
                    state["remote"] = True
                    wake.set()

        async def local_notices() -> None:
            while True:
                await changes.wait()
                wake.set()

        with unwrap_group():
            async with trio.open_nursery() as nursery:
                nursery.start_soon(remote_notices)
                nursery.start_soon(local_notices)
                if state["remote"]:
                    wake.set()  # the first round did not end in step: another one
                while True:
                    # A round with failures is tried again after a while, events or not.
                    with trio.move_on_after(RETRY_SECONDS if synced is None else math.inf):
                        await wake.wait()
                    wake = trio.Event()
                    if not state["remote"]:
                        tree = await trio.to_thread.run_sync(replica.scan)
                        if (tree.content, tree.smeta) == synced:
                            continue  # our own writes, or a change undone: nothing to do
                    state["remote"] = False
                    hashes = await _finish(connection)
                    stats = await session.round(connection, counted, replica, hashes)
                    state["seq"] = max(state["seq"], stats.seq, hashes["seq"])
                    synced = _in_step(stats, replica)
                    if synced is None and not stats.failed:
                        state["remote"] = True  # changed during the round: go again
                        wake.set()


def _in_step(stats: Stats, replica: Replica) -> tuple[bytes, bytes] | None:
    """The local tree's hashes if the round ended with both sides equal: a later event
    whose rescan gives the same hashes is our own write, or undone. Otherwise None: the
    next event (or at once) needs a full round, even if the tree looks unchanged since."""
    if not stats.in_step or replica.tree is None:
        return None
    return replica.tree.content, replica.tree.smeta
