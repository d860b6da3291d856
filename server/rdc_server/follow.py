"""A share that follows a share of another server (``[shares.NAME.follow]``): two-way sync
(`rdc.transfer.twoway`) run continuously between servers, woken by the upstream's change
notices and by changes here (clients' writes, edits on this machine's disk), retrying with
backoff while the upstream is away.

- ``receive-only``: the share is a mirror. Clients may not write to it; a change made on
  this machine's disk is undone at the next round and kept as a version.
- ``two-way``: a multi-master pair, with ``rdc sync``'s conflict rules (conflict copies
  named after the host whose version lost).
- ``send-only``: this share's changes go up; the upstream's are not applied here.

The base of the two-way comparison is kept in ``STATE_DIR/follow/``. A follower that was
stopped catches up with a normal round: both scans read only what changed since they last
ran, and only the differences travel. Each round is reported upstream (``report``), so
``rdc status`` on the upstream shows its replicas, and here (the share's ``follows``
entry).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import socket
import ssl
from pathlib import Path
from typing import Any

import blake3
import trio

from rdc.errors import ConnectionFailed, ProtocolError, RdcError, RemoteError
from rdc.local.paths import parent
from rdc.local.rescan import to_list
from rdc.local.snapshot import Entry
from rdc.transfer import twoway
from rdc.transfer.health import Tracker
from rdc.transfer.oneway import receive_opened, request_open
from rdc.transfer.sides import Remote
from rdc.transfer.stats import Options, Stats
from rdc.wire import messages as m
from rdc.wire.connection import Connection, unwrap_group
from rdc.wire.frames import ConnectionClosed, CountingStream
from rdc_server.config import Upstream
from rdc_server.dial import dial
from rdc_server.shares import Registry, Share, _Directory

log = logging.getLogger("rdc.serve")
RECONNECT_FIRST = 1.0  # seconds; doubles up to RECONNECT_MAX while the upstream is away
RECONNECT_MAX = 60.0
IDLE_TIMEOUT = 120.0  # the upstream says something every 30 s to a watcher
RETRY_SECONDS = 10.0  # a round that did not end in step is tried again after this
TRANSIENT = (ConnectionFailed, ConnectionClosed, ProtocolError, RemoteError, RdcError, OSError,
             trio.BrokenResourceError, trio.ClosedResourceError)


class Follower:
    """Keeps ``share`` in step with ``upstream``, for as long as `run` runs."""

    def __init__(self, registry: Registry, share: Share, upstream: Upstream,
                 state_dir: Path) -> None:
        self.registry = registry
        self.share = share
        self.upstream = upstream
        self.tracker = Tracker("follows", str(upstream.url), upstream.mode)
        registry.board.follower(share.name, self.tracker)
        key = blake3.blake3(f"{share.path}\0{upstream.url}".encode()).hexdigest()[:16]
        self.base_path = state_dir / "follow" / f"{share.name}-{key}.base"
        self.hosts = (socket.gethostname(), upstream.url.host)
        self.options = Options(delete=True, mode=upstream.mode)
        self.undone: set[str] = set()  # receive-only: what the round under way undoes here
        self.label = f"replica {share.name} <- {upstream.url}"
        self.name = f"{socket.gethostname()}/{share.name}"
        self._last_error = ""
        self._quiet = contextlib.ExitStack()  # the share's watcher paused while we write
        self._own_seq = -1  # the share's change number our last round announced
        self._scanned: tuple[int, Entry] | None = None  # the last scan, at change number

    def tls(self) -> ssl.SSLContext | None:
        if not self.upstream.tls:
            return None
        return ssl.create_default_context(cafile=self.upstream.ca_file)

    async def run(self) -> None:
        """Follow until cancelled (which leaves at most temporaries, removed next time)."""
        directory = await trio.to_thread.run_sync(self.registry.acquire, self.share, "", False)
        replica = directory.replica
        if self.upstream.mode == twoway.RECEIVE_ONLY and self.share.versions is None:
            # Only what a round undoes of the changes made here is kept.
            store = self.registry.versions(self.share.name)
            replica.fs.keeper = store.keeper(only=lambda p: twoway.undoes(p, self.undone))
        try:
            await trio.to_thread.run_sync(replica.fs.clean_temporaries)
            delay = RECONNECT_FIRST
            while True:
                rounds = self.tracker.rounds
                try:
                    await self._connected(directory)
                    why = "the connection ended"
                except TRANSIENT as exc:
                    why = str(exc) or "the connection was closed"
                except Exception as exc:  # a bug: logged, and the daemon serves on
                    log.exception("%s failed", self.label)
                    why, delay = f"internal error: {exc}", RECONNECT_MAX
                self.tracker.disconnected(why)
                if self.tracker.rounds > rounds and delay < RECONNECT_MAX:
                    delay = RECONNECT_FIRST  # it worked for a while: a new outage
                level = logging.WARNING if why != self._last_error else logging.DEBUG
                self._last_error = why
                log.log(level, "%s: %s; trying again in %g s", self.label, why, delay)
                await trio.sleep(delay)
                delay = min(delay * 2, RECONNECT_MAX)
        finally:
            self.registry.release(directory)

    async def _scan(self, directory: _Directory) -> Entry:
        """The share's tree, scanned under its lock (as connections scan it). A round's
        writes are done by then: what the share's watcher sees from here on is news."""
        self._quiet.close()
        replica = directory.replica
        async with directory.lock:
            seq = self.registry.sequence(self.share.name)
            seen = self.registry.seen_while_writing(self.share.name)
            if self._covered(seq, seen, replica):  # list just the dirs written or seen
                _list_again(replica, seen)
                tree = await trio.to_thread.run_sync(replica.rescan)
            else:
                tree = await trio.to_thread.run_sync(replica.scan)
        self._scanned = (seq, tree)
        return tree

    def _covered(self, seq: int, seen: set[str] | None, replica: Any) -> bool:
        """Whether a rescan finds everything changed since the last scan, given the
        directories of the paths the paused watcher saw meanwhile (``seen``) to list again
        (`_list_again`): a mirror (no client writes), no change announced since (``seq``),
        and a watcher that saw every change (not None)."""
        return not (self.upstream.mode != twoway.RECEIVE_ONLY or seen is None
                    or self._scanned is None or self._scanned[0] != seq
                    or replica.tree is None)

    def _unchanged(self) -> Entry | None:
        """The last scan, if nothing can have changed since: a mirror is written only by
        this follower (whose writes it rescans) and by edits on this disk (which the
        share's watcher announces). A stale tree would only cost a failed ``expect``."""
        if self.upstream.mode != twoway.RECEIVE_ONLY or self._scanned is None:
            return None
        seq, tree = self._scanned
        return tree if seq == self.registry.sequence(self.share.name) else None

    async def _connected(self, directory: _Directory) -> None:
        """One connection's life: a round at once, then one per change on either side."""
        up = self.upstream
        async with dial(up.url, up.token, self.tls(), up.rate, IDLE_TIMEOUT) as (
            connection, counted
        ):
            write = up.mode != twoway.RECEIVE_ONLY
            opening = request_open(connection, up.url.share, up.url.path, write, [])
            fresh: Entry | None = None  # this share's tree, scanned while the upstream opens

            async def scan_here() -> None:
                nonlocal fresh
                fresh = await self._scan(directory)

            with unwrap_group():
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(scan_here)
                    opened = await receive_opened(opening)
            remote = Remote(connection, opened)
            self.tracker.connected()
            self.tracker.change_seen()  # behind until the first round says otherwise
            log.info("%s: connected (%s)", self.label, up.mode)
            self._last_error = ""
            health = "health" in connection.frames.features
            state: dict[str, Any] = {"seq": opened.seq, "remote": True, "wake": trio.Event()}
            state["wake"].set()
            watcher = connection.start(m.Watch(seq=opened.seq))

            async def remote_notices() -> None:
                while True:
                    message = await watcher.receive(m.Changed)
                    if message.seq > state["seq"]:
                        state["remote"] = True
                        self.tracker.change_seen()
                        state["wake"].set()

            async def local_notices() -> None:
                while True:  # clients' writes and edits on this disk
                    await self.registry.watch(self.share.name).wait()
                    if self.registry.sequence(self.share.name) != self._own_seq:
                        state["wake"].set()

            synced: tuple[bytes, bytes] | None = None
            with unwrap_group():
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(remote_notices)
                    nursery.start_soon(local_notices)
                    while True:
                        with trio.move_on_after(RETRY_SECONDS if synced is None else math.inf):
                            await state["wake"].wait()
                        state["wake"] = trio.Event()
                        tree = None
                        if not state["remote"] and synced is not None:
                            tree = await self._scan(directory)
                            if (tree.content, tree.smeta) == synced:
                                continue  # our own writes, or a change undone
                            self.tracker.change_seen()
                        state["remote"] = False
                        if fresh is not None:  # the first round: both sides just scanned
                            tree, fresh = fresh, None
                        else:
                            tree = await self._refresh(directory, remote, tree)
                        stats = await self._round(counted, directory, remote, tree)
                        state["seq"] = max(state["seq"], stats.seq, remote.hashes.seq)
                        synced = None
                        if stats.in_step and directory.replica.tree is not None:
                            synced = (directory.replica.tree.content,
                                      directory.replica.tree.smeta)
                        elif not stats.failed:
                            state["remote"] = True  # changed during the round: again
                            state["wake"].set()
                        if health:
                            self._report(connection)

    async def _refresh(self, directory: _Directory, remote: Remote,
                       tree: Entry | None) -> Entry:
        """The upstream's hashes now (``finish``) and this share's tree, scanned
        meanwhile (unless ``tree`` is): the two scans run side by side."""

        async def refresh() -> None:
            remote.hashes = await remote.refreshed()

        with unwrap_group():
            async with trio.open_nursery() as nursery:
                nursery.start_soon(refresh)
                tree = tree or self._unchanged() or await self._scan(directory)
        assert tree is not None
        return tree

    async def _round(self, counted: CountingStream, directory: _Directory, remote: Remote,
                     tree: Entry | None) -> Stats:
        sent, received = counted.bytes_sent, counted.bytes_received
        started = trio.current_time()

        def planned(round_: twoway.TwoWay) -> None:
            self.undone = round_.undone
            self.tracker.round_started(round_)
            if self.upstream.mode == twoway.RECEIVE_ONLY:  # only this follower writes
                self._quiet.enter_context(self.registry.writing(self.share.name))

        try:
            stats, actions, _ = await twoway.sync_round(
                remote, directory.replica, self.base_path, self.hosts, self.options, tree,
                planned, scan=lambda: self._scan(directory),
                confirm=self.upstream.mode != twoway.RECEIVE_ONLY)
        finally:
            self._quiet.close()
        wire = counted.bytes_sent - sent + counted.bytes_received - received
        self.tracker.round_ended(stats.in_step, len(stats.failed), wire)
        if directory.replica.temporaries:  # left by a killed run (a live one's stay)
            await trio.to_thread.run_sync(directory.replica.fs.clean_temporaries)
        here = (actions.gets, actions.local_rms, actions.local_replace, actions.local_mkdirs,
                actions.local_links, actions.local_moves, actions.local_meta,
                actions.local_rmdirs)
        if any(here):  # tells this share's own watchers (and not this follower)
            self._own_seq = self.registry.bump(self.share.name)
            if self._scanned is not None and self._scanned[0] == self._own_seq - 1:
                self._scanned = (self._own_seq, self._scanned[1])  # what it announced
        if actions:
            log.info("%s: %d fetched, %d sent, %d deleted, %d bytes on the wire in %.2f s; %s",
                     self.label, len(actions.gets), len(actions.pushes), stats.deleted, wire,
                     trio.current_time() - started, self.tracker.summary())
        for path, error in stats.failed[:10]:
            log.warning("%s: %s: %s", self.label, path, error)
        for path, copy in stats.conflicts:
            log.warning("%s: conflict: %s changed on both sides; the older version is now %s",
                        self.label, path, copy)
        return stats

    def _report(self, connection: Connection) -> None:
        """Tell the upstream how this replica is doing (its answer is not waited for)."""
        health = dataclasses.replace(self.tracker.health(), role="replica", name=self.name)
        connection.start(m.Report(health=health)).close()


async def follow_all(registry: Registry, upstreams: dict[str, Upstream], state_dir: Path,
                     *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                     ) -> None:
    """Run a follower per share that follows an upstream, until cancelled."""
    async with trio.open_nursery() as nursery:
        for name, upstream in sorted(upstreams.items()):
            follower = Follower(registry, registry.shares[name], upstream, state_dir)
            log.info("share %s follows %s (%s)", name, upstream.url, upstream.mode)
            nursery.start_soon(follower.run)
        task_status.started()


def _list_again(replica: Any, seen: set[str]) -> None:
    """Have the next rescan list again the directory of each path in ``seen`` (the paused
    watcher's) that it would not list already: the notes of this follower's own writes say
    what it did there (a file installed, moved or removed is patched in without a
    listing), not what an edit on this disk beside them did."""
    relist = to_list(replica.tree, set(replica.fs.changed))
    replica.fs.changed.update(parent(path) for path in seen
                              if path not in relist and parent(path) not in relist)
