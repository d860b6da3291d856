"""``rdc sync LOCAL URL`` (once) and ``rdc watch LOCAL URL`` (for as long as it runs: local
events and the server's change notices drive incremental syncs), two-way, send-only or
receive-only (``--mode``), keeping what they replace or delete as versions (``--versions``;
in a receive-only mirror, always the local changes it undoes)."""

from __future__ import annotations

import argparse
import math
import os
import socket
import time
from typing import Any

import trio

from rdc.errors import ConnectionFailed, ProtocolError, RdcError, RemoteError
from rdc.local.fs import Keeper
from rdc.local.ignore import Excludes, read_ignore_file
from rdc.local.index import default_location
from rdc.local.replica import Replica
from rdc.local.snapshot import Entry
from rdc.local.versions import Retention, VersionStore
from rdc.local.versions import default_location as versions_location
from rdc.transfer import sync_base as base_store
from rdc.transfer import twoway
from rdc.transfer.health import Tracker
from rdc.transfer.sides import Remote
from rdc.transfer.stats import Options, Stats
from rdc.transfer.twoway import Actions
from rdc.wire import messages as m
from rdc.wire.connection import unwrap_group
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
        p.add_argument("--mode", choices=twoway.MODES, default=twoway.TWO_WAY,
                       help="two-way (default); send-only: local changes go up, the "
                       "server's are not applied here; receive-only: an exact mirror of "
                       "the server (local changes are undone, kept as versions; a "
                       "read-only token is enough)")
        p.add_argument("--versions", metavar="POLICY",
                       help="keep the files a sync replaces or deletes here: N (the newest N "
                       "of each file), staggered[:DAYS] or all")
        p.add_argument("--versions-dir", metavar="DIR",
                       help="where versions are kept (default: under $XDG_STATE_HOME/rdc/"
                       "versions; outside LOCAL)")
        add_exclude_option(p)
        add_safety_options(p)
        add_report_options(p, "list what changes")
        add_server_options(p)
        p.set_defaults(run=run, direction="sync", delete=True)
    add_dry_run_option(sync_parser)
    watch_parser.set_defaults(dry_run=False)


class SyncJob:
    """What one ``rdc sync`` or ``rdc watch`` needs across rounds and reconnections."""

    def __init__(self, args: argparse.Namespace) -> None:
        reporting.check(args)
        self.args = args
        self.report = Report(args, args.command)
        self.remote: RemoteURL = parse_url(args.url)
        self.token = read_token(args.token_file)
        self.tls = tls_context(args.ca_file) if args.tls or args.ca_file else None
        self.base_path = base_store.location(args.local, str(self.remote))
        # Checked before anything changes: a sync that could not record what it did would
        # leave the next one to guess.
        preflight.writable(self.base_path.parent, "XDG_STATE_HOME")
        preflight.writable(default_location(args.local).parent, "XDG_CACHE_HOME")
        self.made = preflight.make_directory(args.local)  # as a pull would
        self.patterns = [*args.exclude, *read_ignore_file(args.local)]
        self.excludes = Excludes(self.patterns)
        # Conflict copies are named after the machine whose version they are: this one,
        # or the server (by the name it gives in its welcome; else as the URL has it).
        self.hosts = (socket.gethostname(), self.remote.host)
        self.bar: Any = None
        self.mode = args.mode
        self.tracker = Tracker("watch", socket.gethostname(), self.mode)
        retention = Retention.parse(args.versions) if args.versions else None
        self.store: VersionStore | None = None
        if retention is not None or self.mode == twoway.RECEIVE_ONLY:
            location = args.versions_dir or versions_location(args.local)
            self.store = VersionStore(location, os.path.realpath(args.local), retention)
        self.undone: set[str] = set()  # what a receive-only round undoes here
        self.watching = False  # rdc watch: the server's notices tell of later changes

    def welcomed(self, welcome: m.Welcome) -> None:
        if welcome.host:
            self.hosts = (self.hosts[0], welcome.host)

    def options(self) -> Options:
        self.bar = self.report.transfer_display()
        return self.report.options(delete=True, dry_run=self.args.dry_run, progress=self.bar,
                                   mode=self.mode, **safety_options(self.args))

    def keeper(self) -> Keeper | None:
        """What the replica calls before it replaces or removes an entry: with
        ``--versions``, keep it; in a receive-only mirror, keep the local changes a round
        undoes."""
        if self.store is None:
            return None
        if self.store.retention is not None:
            return self.store.keeper()
        return self.store.keeper(only=lambda path: twoway.undoes(path, self.undone))

    def open_replica(self) -> Replica:
        replica = Replica(self.args.local, default_location(self.args.local), self.excludes)
        replica.fs.keeper = self.keeper()
        return replica

    def planned(self, round_: twoway.TwoWay) -> None:
        self.undone = round_.undone
        self.tracker.round_started(round_)

    async def first_round(self, connection: Any, counted: Any, replica: Replica
                          ) -> tuple[Stats, Remote]:
        """Open the remote directory and sync once; the local scan runs while the server
        scans its side. The stats and the remote side for later rounds."""
        started = time.monotonic()
        line = self.report.scan_line()
        try:
            remote, tree = await twoway.open_round(connection, replica, self.remote.share,
                                                   self.remote.path, self.options(),
                                                   self.patterns, line)
        finally:
            line.close()
        return await self.round(counted, replica, remote, tree, started), remote

    async def round(
        self, counted: Any, replica: Replica, remote: Remote, tree: Entry | None = None,
        started: float | None = None,
    ) -> Stats:
        """One sync round against the server's root hashes as ``remote`` last heard them;
        ``tree``: the local tree if it was scanned just now. The first round (``started``
        given) counts the connection's bytes from its start, handshake and open included,
        as push and pull do."""
        first = started is not None
        started = time.monotonic() if started is None else started
        sent, received = (0, 0) if first else (counted.bytes_sent, counted.bytes_received)
        options = self.options()
        self.bar.counter = counted
        try:
            stats, actions, _ = await twoway.sync_round(
                remote, replica, self.base_path, self.hosts, options, tree, self.planned,
                confirm=not (self.watching and self.mode == twoway.RECEIVE_ONLY),
            )
        finally:
            self.bar.close()
        stats.seconds = time.monotonic() - started
        stats.bytes_sent = counted.bytes_sent - sent
        stats.bytes_received = counted.bytes_received - received
        self.tracker.round_ended(stats.in_step, len(stats.failed),
                                 stats.bytes_sent + stats.bytes_received)
        self.show(stats, actions)
        return stats

    def report_health(self, connection: Any) -> None:
        """Tell the server how this watch is doing (``rdc status``), if it listens."""
        if "health" in connection.frames.features:
            connection.start(m.Report(health=self.tracker.health())).close()

    def show(self, stats: Stats, actions: Actions) -> None:
        code = exit_status(stats)
        self.report.two_way(stats, actions, code, watch=self.args.command == "watch")


def run_sync(args: argparse.Namespace) -> int:
    job = SyncJob(args)
    completed = False
    try:
        stats = trio.run(_sync_once, job)
        completed = True
    except (ConnectionClosed, trio.BrokenResourceError) as exc:
        raise problems.lost(str(job.remote), exc) from None
    finally:
        if args.dry_run or not completed:
            preflight.remove_made(job.made)
    return exit_status(stats)


async def _sync_once(job: SyncJob) -> Stats:
    args = job.args
    replica = job.open_replica()
    try:
        if not args.dry_run:
            await trio.to_thread.run_sync(replica.fs.clean_temporaries)
        async with open_connection(job.remote, job.token, job.tls,
                                   compress=not args.no_compress,
                                   welcomed=job.welcomed,
                                   rate=args.bwlimit) as (connection, counted):
            stats, _ = await job.first_round(connection, counted, replica)
            return stats
    finally:
        replica.close()


# ---------------------------------------------------------------- watch


def run_watch(args: argparse.Namespace) -> int:
    job = SyncJob(args)
    job.watching = True
    trio.run(_watch, job)
    return 0  # only an interruption (130) or an error that will not clear ends a watch


def permanent(exc: BaseException) -> bool:
    """Whether an error ends a watch rather than being tried again: access denied (a bad
    token, an unknown or read-only share), another protocol or format, a path the server
    refuses. A connection refused, lost or busy (a server restarting, a network away)
    clears by itself."""
    if isinstance(exc, RemoteError) and exc.code == "path":
        return True
    return isinstance(exc, RdcError) and exc.exit_code in (2, 4, 6)


async def _watch(job: SyncJob) -> None:
    from rdc_client.watching import LocalChanges  # watchdog: only a watch needs it

    args = job.args
    replica = job.open_replica()
    changes = LocalChanges(args.local, job.excludes)  # before the first sync: miss nothing
    delay = RECONNECT_FIRST
    try:
        await trio.to_thread.run_sync(replica.fs.clean_temporaries)
        while True:
            try:
                await _watch_connected(job, replica, changes)
            except (ConnectionFailed, ConnectionClosed, ProtocolError, RemoteError,
                    OSError, trio.BrokenResourceError) as exc:
                if permanent(exc):
                    raise
                why = str(exc if isinstance(exc, RdcError) else problems.lost(
                    str(job.remote), exc))
                job.report.status("retrying", f"{why}; trying again in {delay:g} s",
                                  retry_in=delay)
                job.tracker.disconnected(why)
                await trio.sleep(delay)
                delay = min(delay * 2, RECONNECT_MAX)
                continue
    finally:
        changes.stop()
        replica.close()


async def _watch_connected(job: SyncJob, replica: Replica, changes: Any) -> None:
    """One connection's life: sync, then sync again on every settled local change or
    newer remote sequence number, until the connection fails."""
    async with open_connection(job.remote, job.token, job.tls,
                               compress=not job.args.no_compress,
                               idle_timeout=WATCH_IDLE_TIMEOUT,
                               welcomed=job.welcomed,
                               rate=job.args.bwlimit) as (connection, counted):
        job.tracker.connected()
        job.tracker.change_seen()
        stats, remote = await job.first_round(connection, counted, replica)
        job.report.status("connected", f"connected to {job.remote}")
        job.report_health(connection)
        state = {"seq": max(stats.seq, remote.hashes.seq), "remote": not stats.in_step}
        synced = _in_step(stats, replica)
        wake = trio.Event()
        watcher = connection.start(m.Watch(seq=state["seq"]))

        async def remote_notices() -> None:
            while True:
                message = await watcher.receive(m.Changed)
                if message.seq > state["seq"]:
                    state["remote"] = True
                    job.tracker.change_seen()
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
                        job.tracker.change_seen()
                    state["remote"] = False
                    remote.hashes = await remote.refreshed()
                    stats = await job.round(counted, replica, remote)
                    job.report_health(connection)
                    if job.store is not None:
                        await trio.to_thread.run_sync(job.store.prune_due)
                    state["seq"] = max(state["seq"], stats.seq, remote.hashes.seq)
                    synced = _in_step(stats, replica)
                    if synced is None and not stats.failed and not stats.refused:
                        state["remote"] = True  # changed during the round: go again
                        wake.set()


def _in_step(stats: Stats, replica: Replica) -> tuple[bytes, bytes] | None:
    """The local tree's hashes if the round ended with both sides equal: a later event
    whose rescan gives the same hashes is our own write, or undone. Otherwise None: the
    next event (or at once) needs a full round, even if the tree looks unchanged since."""
    if not stats.in_step or replica.tree is None:
        return None
    return replica.tree.content, replica.tree.smeta
