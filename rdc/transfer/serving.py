"""The server's side of a connection after the handshake: an allowlist of requests, each
answered from the opened directory (docs/protocol.md section 3).

The daemon supplies `Shares`, which knows which shares exist, what a token may do, and
keeps one `Replica` per opened directory; everything here is protocol logic and is
tested over in-memory streams.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sqlite3
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import trio

from rdc.errors import NoSpace, ProtocolError, Refusal, RemoteError, disk_full
from rdc.local.fs import ConflictError
from rdc.local.ignore import Excludes
from rdc.local.paths import PathError, displayable
from rdc.local.replica import Replica
from rdc.local.rescan import Unsure
from rdc.local.snapshot import Entry, Walk, iter_files
from rdc.local.stamproots import racy_from
from rdc.local.verify import CHANGED, recheck, verify_tree
from rdc.transfer.batch import receive_offers, serve_gets
from rdc.transfer.descent import SourceChanged, SourceFile
from rdc.transfer.ops import (
    ASKED_META,
    SPLIT_META,
    apply_metas,
    apply_ops,
    listing,
    mlisting,
)
from rdc.transfer.quickcheck import STAMP_ROOTS, WARM_STAMPS, stamps_tell, tree_sketch
from rdc.transfer.reconcile import (
    ASKED_LISTINGS,
    SHORT,
    answer,
    answer_sketch,
    fingerprint_size,
)
from rdc.transfer.source import make_offer, serve_wants
from rdc.transfer.stats import count_files
from rdc.transfer.target import receive_file
from rdc.wire import messages as m
from rdc.wire.codec import MAX_ITEMS, pack
from rdc.wire.connection import Conversation

log = logging.getLogger("rdc.serve")
# How long an ``open`` with ``stamps`` waits for the client's sample before it scans as
# without (a client sends it once its own walk is done: a walk of millions of files).
SAMPLE_SECONDS = 120.0
LISTING_SPLIT = 8192  # entries of one directory per listing item
HEARTBEAT = 30.0  # seconds between "changed" messages to a watching client when idle
# What one connection has served at once; more requests wait their turn (a client sends
# at most 32 files and 4 batches at a time). A file being received or sent holds about
# three descriptors and a window of its data, a batch up to 1.06 MiB of content
# (`batch.HELD_BYTES`): a peer opening 256 conversations holds no more than these.
FILES_AT_ONCE = 64
BATCHES_AT_ONCE = 8
# Directories from which a list request is answered on a worker thread, one request at a
# time: a comparison's requests in flight are then answered one after another, each sent
# as soon as it is made, and the client works on one answer while this side makes the
# next (`rdc.transfer.compare`); answered in the event loop, they all went in one frame.
LIST_THREAD_FROM = 16


class OpenDirectory(Protocol):
    """One connection's open directory, as the daemon hands it over: its replica, whether
    this connection may write it, the lock that keeps the directory's scans and writes in
    series (shared by every connection that opened it), and the share's change counter."""

    share: str
    writable: bool

    @property
    def replica(self) -> Replica: ...

    @property
    def lock(self) -> trio.Lock: ...

    def changed(self) -> int:
        """Bump the share's change sequence number (waking its watchers); return it."""

    def sequence(self) -> int:
        """The share's current change sequence number."""

    def next_change(self) -> trio.Event:
        """An event set at the share's next change."""

    def scanned(self, seq: int, excludes: Excludes) -> tuple[Entry, list] | None:
        """A scan of the directory made at change number ``seq`` with these excludes by
        any connection, if the share's own watcher makes the number trustworthy (an edit
        on the server's disk moves it); else None."""

    def keep_scan(self, seq: int, excludes: Excludes, tree: Entry, errors: list) -> None:
        """Offer a scan made at ``seq`` to the directory's other connections (several
        replicas answered by one scan per change)."""

    def watching(self) -> None:
        """This connection watches the share (``rdc status`` lists it until it closes)."""

    def reported(self, health: m.PeerHealth) -> None:
        """This connection's ``report`` of how its rounds go."""

    def health(self) -> m.Health:
        """The share's replicas and watchers, for ``status``."""

    def release(self) -> None:
        """The connection is done with the directory (idempotent)."""

    # Optional: ``marker_lost() -> bool``, whether the share lost its folder marker.


class Shares(Protocol):
    async def open(self, share: str, path: str, write: bool, create: bool) -> OpenDirectory:
        """The open directory ``path`` of ``share``; raises Refusal (``share``,
        ``readonly``, ``path``)."""


@dataclass
class ServerSession:
    """One client connection's state: nothing is allowed before ``open``."""

    shares: Shares
    peer: str = "?"
    opened: OpenDirectory | None = None
    excludes: Excludes = field(default_factory=Excludes)
    tree: Entry | None = None
    dirty: bool = False  # written since the last scan
    scanned_seq: int = -1  # the share's sequence number at the last scan
    unannounced: bool = False  # wrote something watchers were not told of yet
    unreadable: int = 0  # entries the last scan could not read (left out of the tree)
    top_fixed: bool = True  # the opened directory is a share's own: its mode and time stay
    _full: bool = False  # a full disk was logged
    _opening: bool = False
    # Synced by stamp roots (`rdc.local.stamproots`): ``tree`` has them, and every scan of
    # this connection makes such a tree.
    stamps: bool = False
    _asked_stamps: bool = False
    _sample: bytes | None = None  # a ``stamps`` request's sketch
    _sample_paths: bytes | None = None  # and its paths sketch, if it sent one
    _keep: Entry | None = None  # a cold index's tree of stamp roots, to keep after opened
    racy_from: int = 0  # (``stamps``) the client's: files modified since keep true roots
    _unread: list[tuple[str, str]] = field(default_factory=list)  # the last scan's errors
    _sampled: trio.Event = field(default_factory=trio.Event)
    _decided: trio.Event = field(default_factory=trio.Event)
    _walked: Walk | None = None  # the open's walk, for the first scan if nothing changed
    _files: trio.CapacityLimiter = field(
        default_factory=lambda: trio.CapacityLimiter(FILES_AT_ONCE))
    _batches: trio.CapacityLimiter = field(
        default_factory=lambda: trio.CapacityLimiter(BATCHES_AT_ONCE))
    _listing: trio.CapacityLimiter = field(default_factory=lambda: trio.CapacityLimiter(1))

    async def handle(self, conversation: Conversation, message: m.Message) -> None:
        """Answer one request (the connection lets through only requests: `m.Message`
        ``REQUEST``)."""
        try:
            if isinstance(message, m.Open):
                if self._opening:
                    raise ProtocolError(message="open twice on one connection")
                self._opening = True
                try:
                    await self._open(conversation, message)
                finally:
                    self._decided.set()  # (a failed open: a ``stamps`` request hears no)
                return
            if isinstance(message, m.Stamps):  # (it may come while open is answered)
                await self._stamps(conversation, message)
                return
            if self.opened is None:
                raise ProtocolError(message=f"{message.TYPE!r} before open")
            await self.handlers()[type(message)](conversation, message)
        except (OSError, sqlite3.Error) as exc:
            if not disk_full(exc) or self.opened is None:
                raise
            raise self._no_space(exc) from None

    def _no_space(self, exc: BaseException) -> NoSpace:
        """A full disk, logged (with the path, for whoever can free it) and said to the
        client (without this machine's paths)."""
        assert self.opened is not None
        first, self._full = not self._full, True  # (concurrent requests hit it at once)
        if isinstance(exc, OSError):
            where = displayable(os.fsdecode(exc.filename or ""))
            if first:
                log.warning("%s: no space left in share %s (%s), writing %s: %s", self.peer,
                            self.opened.share, displayable(self.opened.replica.root), where,
                            exc.strerror)
            return NoSpace(message=f"on the server: share {self.opened.share!r} is full "
                           f"(writing {where})")
        state = self.opened.replica.db.location.parent
        if first:
            log.warning("%s: no space left in the state directory %s: the signature index "
                        "of share %s: %s", self.peer, displayable(str(state)),
                        self.opened.share, exc)
        return NoSpace(message="on the server: its state directory is full (the signature "
                       "index cannot grow; the server's log says where)")

    def handlers(self) -> dict[type[m.Message], Callable[[Conversation, Any], Awaitable[None]]]:
        """What answers each request after ``open``."""
        return {
            m.List: self._list, m.MetaList: self._mlist, m.Offer: self._offer,
            m.Get: self._get, m.Offers: self._offers, m.Gets: self._gets, m.Ops: self._ops,
            m.MetaSet: self._mset, m.Finish: self._finish, m.Watch: self._watch,
            m.Report: self._report, m.Status: self._status,
            m.Verify: self._verify, m.Roots: self._roots,
        }

    # ------------------------------------------------------------ open and scans

    async def _open(self, conversation: Conversation, message: m.Open) -> None:
        try:
            self.excludes = Excludes(message.excludes)
        except Refusal:
            raise
        except Exception as exc:  # a pattern the library cannot parse
            raise Refusal("path", message=f"bad exclude pattern: {exc}") from None
        features = conversation.connection.frames.features
        warm_client = message.warm and WARM_STAMPS in features
        self._asked_stamps = ((message.stamps or warm_client) and not message.checksum
                              and STAMP_ROOTS in features)
        warm_client = warm_client and self._asked_stamps
        if not self._asked_stamps:
            self._decided.set()  # (a ``stamps`` request is answered: no)
        opened = await self.shares.open(message.share, message.path, message.write,
                                        message.create)
        self.opened = opened
        replica = opened.replica
        if warm_client:  # stamps pay only if this side would read its whole tree
            self._asked_stamps = await trio.to_thread.run_sync(replica.is_cold, self.excludes)
            if self._asked_stamps:
                conversation.send(m.Stamped(want=True))  # (the client's sample, please)
            else:
                self._decided.set()
        ready = await self._by_stamps(replica) if self._asked_stamps else None
        async with opened.lock:
            if ready is not None and ready.seq != opened.sequence():
                ready = None  # (the share changed meanwhile: walked again)
            if ready is not None:
                seq, walked, tree = ready.seq, ready.walked, ready.tree
                cached = None if tree is None else (tree.content, tree.meta, tree.smeta)
            else:
                seq, tree = opened.sequence(), None
                cached, walked = await trio.to_thread.run_sync(replica.quick, self.excludes)
            if self.stamps:  # (as the client was told)
                if tree is None:
                    tree, walked = await self._stamp_tree(replica)
                    cached = (tree.content, tree.meta, tree.smeta)
                self._scanned(tree, seq, list(walked.errors))
            elif tree is not None:  # a scan the sample turned down
                self._scanned(tree, seq, list(replica.errors))
            elif cached is None or message.checksum:  # something changed: a full scan
                scanner = (functools.partial(replica.scan, checksum=True) if message.checksum
                           else replica.scan)
                tree = await trio.to_thread.run_sync(scanner, self.excludes, None, walked)
                opened.keep_scan(seq, self.excludes, tree, list(replica.errors))
                self._scanned(tree, seq)
                for path in replica.stats.mismatched if message.checksum else ():
                    log.warning("%s: %s: %s (found by --checksum); re-indexed", self.peer,
                                displayable(path), CHANGED)
                cached = (tree.content, tree.meta, tree.smeta)
            else:  # nothing changed: the tree is scanned only if someone asks for it
                self.tree, self.unreadable = None, 0
                self._walked, self.scanned_seq = walked, seq
        log.info("%s opened %s:/%s (%s)", self.peer, opened.share, message.path,
                 "read-write" if opened.writable else "read-only")
        content, meta, smeta = cached
        # A share's own top directory belongs to whoever set up the share: clients change
        # the mode and time of a directory they opened inside it, not of the share itself.
        self.top_fixed = not message.path
        conversation.send(m.Opened(
            content=content, meta=meta, smeta=smeta, unreadable=self.unreadable,
            writable=opened.writable, seq=seq, top=m.Top(*walked.top),
            fixed=self.top_fixed, files=walked.file_count, marker_lost=_marker_lost(opened),
        ))
        try:
            await self._after_opened(opened, walked)
        finally:
            if self._keep is not None:  # (the next sync by stamps starts from it)
                keep, self._keep = self._keep, None
                # Kept even where the client hung up at once (a sync with nothing to do
                # ends at ``opened``): else a tree in step is stamped again next time.
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(replica.keep_stamps, keep, self.racy_from,
                                                  self.excludes)

    async def _after_opened(self, opened: OpenDirectory, walked: Walk) -> None:
        """What an ``open`` does once ``opened`` is sent, while the client scans."""
        replica = opened.replica
        if walked.temporaries and opened.writable:
            # Temporaries of killed transfers (this daemon's or another's) go now.
            async with opened.lock:
                await trio.to_thread.run_sync(replica.fs.clean_temporaries)
        if walked.pending and not self.stamps:
            # The stamp said nothing changed here, without a tree. A client with changes
            # compares trees next: make it now, while it scans its own side (a sync with
            # nothing to do has its answer already, and ends without waiting for this):
            # the tree kept in the index, else a walk. One that fails here fails again,
            # and is reported, where a tree is needed.
            with contextlib.suppress(OSError, PathError):
                await self._scan(ahead=True)
        if opened.writable:  # (a push's target asks for seeds: the first would load these)
            await trio.to_thread.run_sync(replica.warm)

    async def _by_stamps(self, replica: Replica) -> _Ready:
        """For an ``open`` with ``stamps``: the walk, made while the client walks, and
        the tree of stamp roots if the client's sample (its ``stamps`` request) says
        stamps tell the two trees apart (``stamps`` set); else this side's sealed tree if
        it had to make one, or none (a cold index: the open scans its walk). The share is
        not held while the sample comes. A cold index starts from the stamp tree it kept
        after its last sync by stamps, if it kept one (`Replica.kept_stamps`)."""
        assert self.opened is not None
        kept, early = None, racy_from()  # (this side's clock, until the client's comes)
        async with self.opened.lock:
            seq = self.opened.sequence()
            cold, base, walked = await self._stamp_base(replica, lazy=True)
            if cold and not walked.errors:  # (made while the client walks)
                kept = await trio.to_thread.run_sync(replica.kept_stamps, walked, early,
                                                     self.excludes)
                if kept is None:
                    base = await trio.to_thread.run_sync(_walked_tree, walked)
        with trio.move_on_after(SAMPLE_SECONDS):
            await self._sampled.wait()
        sample, limit = self._sample, self.racy_from
        if kept is not None and await trio.to_thread.run_sync(_racy_between, kept, early,
                                                              limit):
            kept = None  # (rare: a file of the last seconds; its kind of root is the client's)
            base = await trio.to_thread.run_sync(_walked_tree, walked)
        judged = kept if kept is not None else base
        self.stamps = (judged is not None and sample is not None and bool(judged.children)
                       and stamps_tell(await trio.to_thread.run_sync(tree_sketch, judged,
                                                                     limit),
                                       sample, cold, self._sample_paths))
        self._decided.set()
        if not self.stamps:
            return _Ready(seq, walked, None if cold else base)
        if kept is None:
            assert base is not None
            kept = await trio.to_thread.run_sync(replica.stamped, base, limit, cold)
        if cold:
            self._keep = kept  # (once opened is sent)
        return _Ready(seq, walked, kept)

    async def _stamp_base(self, replica: Replica, lazy: bool = False
                          ) -> tuple[bool, Entry | None, Walk]:
        """Whether the index is cold, the tree to give stamp roots, and the walk (the
        caller holds the share): a cold index's walk, as walked (nothing is read; with
        ``lazy``, no tree yet: the walk may be a stamp walk's, whose tree a kept stamp
        tree can stand in for); else this side's sealed tree, as cheap to have as a walk
        where little changed. No tree where the walk could not read everything (a scan
        leaves that out of the tree)."""
        cold = await trio.to_thread.run_sync(replica.is_cold, self.excludes)
        _, walked = await trio.to_thread.run_sync(replica.quick, self.excludes)
        if walked.errors:
            return cold, None, walked
        if cold:
            return cold, None if lazy else await trio.to_thread.run_sync(_walked_tree,
                                                                          walked), walked
        tree = await trio.to_thread.run_sync(replica.scan, self.excludes, None, walked)
        return cold, tree, walked

    async def _stamps(self, conversation: Conversation, message: m.Stamps) -> None:
        """The client's sample for an ``open`` with ``stamps``: answered once the open
        decided (no, if it did not ask for one). Requests run as they come, in no set
        order: one that overtook its ``open`` waits for it."""
        if self._sample is not None:
            raise ProtocolError(message="stamps twice on one connection")
        self._sample, self.racy_from = message.sketch, message.racy_from
        self._sample_paths = message.paths
        self._sampled.set()
        await self._decided.wait()
        conversation.send(m.Stamped(stamps=self.stamps))

    async def _scan(self, incremental: bool = False, ahead: bool = False) -> Entry | None:
        """A new tree: by a rescan of what was written since the last (``incremental``:
        only when nobody else wrote meanwhile), another connection's scan at this change
        number, the open's walk if nothing changed since it, else a full scan. ``ahead``
        (after the open, before anyone asked): only from the open's walk, and nothing if
        a request made the tree first (a later scan could see what changed since the
        listings this connection answered)."""
        assert self.opened is not None
        replica = self.opened.replica
        if self.stamps:
            return await self._restamp(incremental)
        async with self.opened.lock:
            seq = self.opened.sequence()
            if ahead and (self._walked is None or self.dirty or seq != self.scanned_seq):
                return None
            walked, self._walked = self._walked, None
            shared = None if self.dirty else self.opened.scanned(seq, self.excludes)
            if incremental:
                tree = await trio.to_thread.run_sync(replica.rescan, self.excludes)
            elif shared is not None:  # another connection's scan at this change number
                tree, errors = shared
                self._scanned(tree, seq, errors)
                return tree
            elif walked is not None and seq == self.scanned_seq and not self.dirty:
                tree = await trio.to_thread.run_sync(replica.scan, self.excludes, None, walked)
            else:
                tree = await trio.to_thread.run_sync(replica.scan, self.excludes)
            errors = list(replica.errors)
            self.opened.keep_scan(seq, self.excludes, tree, errors)
            self._scanned(tree, seq, errors)
        return tree

    async def _restamp(self, incremental: bool) -> Entry:
        """`_scan` of a connection synced by stamp roots: its tree after its own writes
        (``incremental``), else walked again; nothing is shared with other connections."""
        assert self.opened is not None
        replica = self.opened.replica
        async with self.opened.lock:
            seq = self.opened.sequence()
            tree, errors = None, self._unread  # (a rescan lists only what was written)
            if incremental and self.tree is not None:
                with contextlib.suppress(Unsure, OSError, PathError):
                    tree = await trio.to_thread.run_sync(replica.restamp, self.tree,
                                                         self.racy_from, self.excludes)
            if tree is None:
                tree, walked = await self._stamp_tree(replica)
                errors = list(walked.errors)
            self._scanned(tree, seq, errors)
        return tree

    async def _stamp_tree(self, replica: Replica) -> tuple[Entry, Walk]:
        """A new tree of stamp roots, and its walk (the caller holds the share)."""
        cold, base, walked = await self._stamp_base(replica)
        if base is None:  # (unreadable entries: left out, as a scan leaves them)
            cold, base = False, await trio.to_thread.run_sync(replica.scan, self.excludes,
                                                               None, walked)
        return await trio.to_thread.run_sync(replica.stamped, base, self.racy_from,
                                             cold), walked

    def _scanned(self, tree: Entry, seq: int,
                 errors: list[tuple[str, str]] | None = None) -> None:
        assert self.opened is not None
        errors = self.opened.replica.errors if errors is None else errors
        self._unread = errors
        self.tree = tree
        self.unreadable = len(errors)
        for path, reason in errors[:20]:
            log.warning("%s: cannot read %s: %s", self.peer, path, reason)
        self.dirty = False
        self.scanned_seq = seq

    async def _fresh_tree(self) -> Entry:
        """The last scan, unless the share changed (another client, or an edit on this
        machine: a full scan) or this connection wrote since (a rescan)."""
        assert self.opened is not None
        if self.tree is None or self.scanned_seq != self.opened.sequence():
            tree = await self._scan()
        elif self.dirty:
            tree = await self._scan(incremental=True)
        else:
            return self.tree
        assert tree is not None
        return tree

    def _writable(self) -> OpenDirectory:
        assert self.opened is not None
        if not self.opened.writable:
            raise Refusal("readonly", message=f"share {self.opened.share!r} is read-only")
        return self.opened

    # ------------------------------------------------------------ reading

    async def _list(self, conversation: Conversation, message: m.List) -> None:
        have = message.have
        short = SHORT in conversation.connection.frames.features
        sizes = [None if h is None else fingerprint_size(h, short) for h in have or ()]
        if have is not None and (len(have) != len(message.paths) or any(
                h is not None and size is None for h, size in zip(have, sizes, strict=True))):
            raise ProtocolError(message="list: have does not fit its paths (one item of "
                                "fingerprints per path, of a length its count calls for)")
        sketch = message.sketch
        if sketch is not None and (len(sketch) != len(message.paths) or any(
                s is not None and (len(s) % 4 or (have is not None and have[i] is not None))
                for i, s in enumerate(sketch))):
            raise ProtocolError(message="list: sketch does not fit its paths (one item per "
                                "path, 4 bytes a sum, none where fingerprints go)")
        tree = await self._fresh_tree()

        def listings() -> list[m.Listing]:
            dirs = []
            for i, path in enumerate(message.paths):
                entries = listing(tree, path, message.hb, message.meta, message.sizes)
                sums = None if sketch is None else sketch[i]
                answered = None
                if entries is not None and sums is not None:
                    answered = answer_sketch(entries, sums)
                if answered is not None:
                    dirs.append(m.Listing(path, answered[0], sums=answered[1]))
                elif entries is not None and have is not None and have[i] is not None:
                    size = sizes[i]
                    assert size is not None  # (checked above)
                    unmatched, bitmap = answer(entries, have[i], size)
                    dirs.append(m.Listing(path, unmatched, bitmap))
                else:
                    dirs.append(m.Listing(path, entries))
            return dirs

        if len(message.paths) < LIST_THREAD_FROM:
            dirs = listings()
        else:  # one at a time, each answer sent as it is made (`rdc.transfer.compare`)
            dirs = await trio.to_thread.run_sync(listings, limiter=self._listing)
        asked = ASKED_LISTINGS in conversation.connection.frames.features
        _send_split(conversation, m.Listings, _split_large(dirs, asked))

    async def _mlist(self, conversation: Conversation, message: m.MetaList) -> None:
        tree = await self._fresh_tree()
        split = message.split and SPLIT_META in conversation.connection.frames.features
        items = [mlisting(tree, path, message.hb, message.vectors, message.levels, split)
                 for path in message.paths]
        if ASKED_META in conversation.connection.frames.features:
            _send_split(conversation, m.MetaListing, [
                None if item is None else replace(item, path=None)
                for item in items])
        else:
            _send_split(conversation, m.MetaListing,
                        [item for item in items if item is not None])

    async def _get(self, conversation: Conversation, message: m.Get) -> None:
        async with self._files:
            await self._get_file(conversation, message)

    async def _get_file(self, conversation: Conversation, message: m.Get) -> None:
        assert self.opened is not None
        replica = self.opened.replica
        path = message.path
        try:
            signature, st, f = await trio.to_thread.run_sync(replica.sign, path)
        except FileNotFoundError:
            raise Refusal("vanished", message=f"{path} is gone") from None
        except (PathError, IsADirectoryError, NotADirectoryError) as exc:
            raise Refusal("path", message=str(exc)) from None
        with f:
            fd = f.fileno()

            def read(offset: int, length: int) -> bytes:
                return os.pread(fd, length, offset)

            try:
                offer = make_offer(signature, st, read,
                                   older_version_likely=message.expect not in (None, m.NOTHING))
                conversation.send(offer)
                if offer.data is not None:
                    await conversation.receive(m.Done)
                    return
                await serve_wants(conversation, SourceFile(signature.tree, read))
            except (SourceChanged, Refusal) as exc:
                if isinstance(exc, RemoteError) or getattr(exc, "code", "vanished") != "vanished":
                    raise
                await self._recheck(path)
                raise Refusal("vanished", message=f"{path} changed while it was read ({exc}); "
                              "ask again") from None

    async def _roots(self, conversation: Conversation, message: m.Roots) -> None:
        """The content roots of some files, read where the index does not know them."""
        assert self.opened is not None
        roots = await trio.to_thread.run_sync(self.opened.replica.index_paths, message.paths)
        conversation.send(m.Rooted(roots=[
            roots[path][:m.WIRE_PREFIX] if path in roots else None for path in message.paths]))

    async def _verify(self, conversation: Conversation, message: m.Verify) -> None:
        """Read every file of the opened directory again against the index; the files
        that did not match (now re-indexed), logged too. Allowed read-only: it changes
        nothing in the share, and reading all of it is what a pull may do anyway."""
        assert self.opened is not None
        opened = self.opened
        async with opened.lock:
            report = await trio.to_thread.run_sync(verify_tree, opened.replica, self.excludes)
        for finding in report.findings:
            log.warning("%s: verify: %s: %s (bit rot?); re-indexed", self.peer,
                        displayable(finding.path), CHANGED)
        log.info("%s: verify %s: %d files, %d bytes, %d mismatches", self.peer, opened.share,
                 report.files, report.bytes, len(report.findings))
        if report.findings:
            self.tree = None  # the index changed: the next listing scans again
        paths = [finding.path for finding in report.findings]
        for start in range(0, max(len(paths), 1), MAX_ITEMS):
            conversation.send(m.Verified(
                files=report.files, size=report.bytes, mismatches=paths[start:start + MAX_ITEMS],
                unreadable=len(report.errors), more=start + MAX_ITEMS < len(paths)))

    async def _recheck(self, path: str) -> None:
        """A file served was not what its signature said: read it again (`recheck`), so
        that the index says what is there; log it if its time did not move."""
        assert self.opened is not None
        try:
            finding = await trio.to_thread.run_sync(recheck, self.opened.replica, path)
        except (OSError, PathError):
            return
        if finding is not None:
            log.warning("%s: %s: %s (bit rot?); re-indexed, serving what is there now",
                        self.peer, displayable(path), CHANGED)

    # ------------------------------------------------------------ writing

    async def _offer(self, conversation: Conversation, message: m.Offer) -> None:
        opened = self._writable()
        if not message.path:
            raise ProtocolError(message="an offer to the server names its path")
        self._wrote()
        async with self._files:
            await receive_file(conversation, opened.replica, message.path, message,
                               message.expect)

    async def _offers(self, conversation: Conversation, message: m.Offers) -> None:
        opened = self._writable()
        self._wrote()
        async with self._batches:
            await receive_offers(conversation, opened.replica, message)

    async def _gets(self, conversation: Conversation, message: m.Gets) -> None:
        assert self.opened is not None
        def changed(path: str) -> None:
            log.warning("%s: %s: %s (bit rot?); re-indexed, serving what is there now",
                        self.peer, displayable(path), CHANGED)

        async with self._batches:
            await serve_gets(conversation, self.opened.replica, message, changed)

    async def _ops(self, conversation: Conversation, message: m.Ops) -> None:
        opened = self._writable()
        self._wrote()
        results = await trio.to_thread.run_sync(
            apply_ops, opened.replica, message.ops, self.excludes, not self.top_fixed
        )
        conversation.send(m.OpResults(results=results))

    async def _mset(self, conversation: Conversation, message: m.MetaSet) -> None:
        opened = self._writable()
        tree = await self._fresh_tree()
        try:
            applied, skipped = await trio.to_thread.run_sync(
                apply_metas, opened.replica, tree, message.dirs)
        except (ConflictError, PathError) as exc:
            raise Refusal("path", message=str(exc)) from None
        if applied:
            self._wrote()
        conversation.send(m.Ok(applied=applied, skipped=skipped))

    async def _watch(self, conversation: Conversation, message: m.Watch) -> None:
        """Tell the client the share's sequence number whenever it changes, and every
        HEARTBEAT seconds anyway (which keeps an idle connection alive). Never ends."""
        assert self.opened is not None
        opened = self.opened
        opened.watching()
        last = message.seq
        while True:
            current = opened.sequence()
            if current != last:
                conversation.send(m.Changed(seq=current))
                last = current
            event = opened.next_change()
            with trio.move_on_after(HEARTBEAT) as idle:
                await event.wait()
            if idle.cancelled_caught:
                conversation.send(m.Changed(seq=current))

    async def _report(self, conversation: Conversation, message: m.Report) -> None:
        assert self.opened is not None
        self.opened.reported(message.health)
        conversation.send(m.Ok())

    async def _status(self, conversation: Conversation, message: m.Status) -> None:
        assert self.opened is not None
        conversation.send(self.opened.health())

    def _wrote(self) -> None:
        self.dirty = True
        self.unannounced = True

    def close(self) -> None:
        """The connection ended: make its renames durable, announce what it wrote if
        ``finish`` did not, and let go of the directory (once: later calls do nothing)."""
        opened, self.opened = self.opened, None
        if opened is None:
            return
        try:
            if self.dirty:
                opened.replica.sync_dirs()
            if self.unannounced:
                opened.changed()
                self.unannounced = False
        finally:
            opened.release()

    async def _finish(self, conversation: Conversation, message: m.Finish) -> None:
        """The server's root hashes now; what this connection wrote is announced to the
        share's watchers (once per finish, not per file)."""
        assert self.opened is not None
        if self.dirty:
            await trio.to_thread.run_sync(self.opened.replica.sync_dirs)
        alone = self.tree is not None and self.scanned_seq == self.opened.sequence()
        if self.unannounced:
            self.opened.changed()
            self.unannounced = False
        tree = await self._scan(incremental=alone)
        assert tree is not None
        if self.stamps and not self.unreadable:  # (the next sync by stamps starts here)
            await trio.to_thread.run_sync(self.opened.replica.keep_stamps, tree,
                                          self.racy_from, self.excludes)
        files = count_files(tree) if self.stamps else self.opened.replica.stats.files
        conversation.send(m.Finished(
            content=tree.content, meta=tree.meta, smeta=tree.smeta, unreadable=self.unreadable,
            seq=self.opened.sequence(), top=m.Top(tree.mode, tree.mtime_ns),
            files=files, marker_lost=_marker_lost(self.opened),
        ))


def _racy_between(tree: Entry, made: int, limit: int) -> bool:
    """Whether a file of ``tree`` (stamped with ``made`` as its racy limit) would get
    another kind of root with ``limit``."""
    low, high = sorted((made, limit))
    return any(low <= entry.mtime_ns < high for _, _, entry, _ in iter_files(tree))


def _walked_tree(walked: Walk) -> Entry:
    """A walk's tree (blocking: a stamp walk's is walked now)."""
    return walked.tree


@dataclass
class _Ready:
    """What an ``open`` with ``stamps`` made before it took the share again."""

    seq: int  # the change number walked at
    walked: Walk
    tree: Entry | None  # stamp roots (``stamps``), a scan, or none: the walk is to scan


def _marker_lost(opened: OpenDirectory) -> bool:
    """Whether the share lost its folder marker (`rdc.local.marker`), if the daemon
    keeps markers."""
    lost = getattr(opened, "marker_lost", None)
    return bool(lost()) if callable(lost) else False


def _send_split(conversation: Conversation, kind: type[m.Listings] | type[m.MetaListing],
                dirs: list) -> None:
    """Send directory items in messages of about 1 MiB (``more`` on all but the last)."""
    batch: list = []
    weight = 0
    for item in dirs:
        size = len(pack(None if item is None else item.to_wire()))
        if batch and weight + size > 1 << 20:
            conversation.send(kind(dirs=batch, more=True))
            batch, weight = [], 0
        batch.append(item)
        weight += size
    conversation.send(kind(dirs=batch, more=False))


def _split_large(dirs: list[m.Listing], asked: bool = False) -> list[m.Listing]:
    """A directory of many entries becomes several items with the same path. With
    ``asked`` (``asked-listings``), the first item of each names no path: it is the one
    asked for in its place (the paths were most of a sparse change's listings); the rest
    of a directory split name it."""
    out = []
    for item in dirs:
        entries = item.entries
        first = None if asked else item.path
        if entries is None or len(entries) <= LISTING_SPLIT:
            out.append(m.Listing(first, entries, item.matched, item.sums))
            continue
        for start in range(0, len(entries), LISTING_SPLIT):  # bitmap and sums with the first
            out.append(m.Listing(first if start == 0 else item.path,
                                 entries[start : start + LISTING_SPLIT],
                                 item.matched if start == 0 else None,
                                 item.sums if start == 0 else None))
    return out
