"""The two ends of a sync as the one-way and two-way algorithms see them: this machine's
directory (`Local`: a replica and its scanned tree) and the opened remote directory
(`Remote`: requests over a connection). Both answer the same questions (listings, root
hashes) and take the same changes (ops, metadata vectors); only where the work happens
differs. Sending and receiving files is not a side's: it needs both (`rdc.transfer.files`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol

import trio

from rdc import _native
from rdc.errors import ProtocolError
from rdc.local.paths import PathError
from rdc.local.replica import Replica
from rdc.local.rescan import Unsure
from rdc.local.snapshot import Entry
from rdc.records import record
from rdc.transfer.ops import SPLIT_META, apply_metas, apply_ops, listing
from rdc.transfer.reconcile import (
    HAVE_BUDGET,
    HAVE_ENTRIES,
    HAVE_FROM,
    SHORT,
    SKETCH,
    SKETCH_CAPACITY,
    SKETCH_FROM_BYTES,
    distinct,
    elements,
    fingerprints,
    merge,
    merge_sketch,
    sketch_bytes,
)
from rdc.wire import messages as m
from rdc.wire.codec import MAX_ITEMS
from rdc.wire.connection import Connection, Conversation

# Directories asked for in one list request, and metadata vectors sent in one mset.
LIST_BATCH = 512
MSET_BATCH = 256
# Directories from which listing them (and fingerprinting what this side has there) runs
# on a worker thread: the event loop stays free to send the comparison's other requests
# and read their answers meanwhile (`rdc.transfer.compare`).
THREAD_FROM = 16

Listings = dict[str, dict[str, m.Listed] | None]


@record
class Hashes:
    """A side's root hashes (docs/formats.md section 5), its top directory's own mode and
    time (None where they are not synced), and what its scan could not read."""

    content: bytes
    meta: bytes
    smeta: bytes
    top: m.Top | None = None
    unreadable: int = 0
    seq: int = 0  # the share's change sequence number (remote only)
    fixed: bool = False  # the top is a share's own: a push leaves its mode and time alone
    files: int | None = None  # regular files in the tree (remote only; None: not said)
    marker_lost: bool = False  # the share lost its folder marker (remote only)

    @classmethod
    def of_tree(cls, tree: Entry, unreadable: int = 0) -> Hashes:
        return cls(tree.content, tree.meta, tree.smeta, m.Top(tree.mode, tree.mtime_ns),
                   unreadable)

    @classmethod
    def of_message(cls, message: m.Opened | m.Finished) -> Hashes:
        return cls(message.content, message.meta, message.smeta or b"", message.top,
                   message.unreadable, message.seq, getattr(message, "fixed", False),
                   message.files, message.marker_lost)


class Side(Protocol):
    """One end of a sync."""

    async def listings(self, paths: list[str], hb: int, meta: bool = False,
                       sizes: bool = False, have: Listings | None = None,
                       later: list[str] | None = None) -> Listings:
        """Per directory, its entries by name (None if it is not a directory there); with
        ``sizes``, each file's size. ``have``: what the asking side holds in those
        directories, which a remote side need not send back (`rdc.transfer.reconcile`);
        an entry of ``have`` that this side has too may stand for its own. ``later``: a
        directory whose answer takes another request (a sketch that did not decode) is
        left out and named there, for the caller to ask for again when it likes, rather
        than holding up the others."""

    async def apply(self, ops: list[m.Op]) -> list[m.Failure | None]:
        """Apply ``ops`` in order; one result per op."""

    async def set_vectors(self, items: list[m.MetaDir]) -> None:
        """Set the modes and times of metadata vectors (where the content matches)."""

    async def refreshed(self) -> Hashes:
        """The root hashes now, after this run's writes."""



class Local:
    """This machine's directory: a replica, scanned as ``tree``."""

    def __init__(self, replica: Replica, tree: Entry, stamps: int | None = None) -> None:
        self.replica = replica
        self.tree = tree
        # ``tree`` has stamp roots (rdc.local.stamproots), the true roots of files modified
        # since this time: None if it has true roots only.
        self.stamps = stamps
        self._one = trio.CapacityLimiter(1)  # (listings made one batch at a time)

    @property
    def unreadable(self) -> list[str]:
        """What the last scan could not read (left out of ``tree``)."""
        return [path for path, _ in self.replica.errors]

    async def listings(self, paths: list[str], hb: int, meta: bool = False,
                       sizes: bool = False, have: Listings | None = None,
                       later: list[str] | None = None) -> Listings:
        tree = self.tree  # (the tree as asked: `refreshed` may put another in its place)
        if len(paths) < THREAD_FROM:
            return _listings(tree, paths, hb, meta, sizes)
        return await trio.to_thread.run_sync(_listings, tree, paths, hb, meta, sizes,
                                             limiter=self._one)

    async def apply(self, ops: list[m.Op]) -> list[m.Failure | None]:
        if not ops:
            return []
        replica = self.replica
        return await trio.to_thread.run_sync(apply_ops, replica, ops, replica.excludes, True)

    async def set_vectors(self, items: list[m.MetaDir]) -> None:
        if items:
            await trio.to_thread.run_sync(apply_metas, self.replica, self.tree, items)

    async def refreshed(self) -> Hashes:
        """The tree after this run's writes (renames made durable first): a rescan of the
        directories they touched."""
        await trio.to_thread.run_sync(self.replica.sync_dirs)
        if self.stamps is not None:
            self.tree = await trio.to_thread.run_sync(self._restamped, self.stamps)
        else:
            self.tree = await trio.to_thread.run_sync(self.replica.rescan)
        return Hashes.of_tree(self.tree, len(self.replica.errors))

    def _restamped(self, limit: int) -> Entry:
        """The tree of stamp roots after this run's writes; walked again where a rescan
        cannot vouch for it."""
        replica = self.replica
        try:
            return replica.restamp(self.tree, limit)
        except (Unsure, OSError, PathError):
            walked = replica.walk()
            replica.errors = list(walked.errors)
            return replica.stamped(walked.tree, limit, True)

    def hashes(self) -> Hashes:
        return Hashes.of_tree(self.tree, len(self.replica.errors))


def _listings(tree: Entry, paths: list[str], hb: int, meta: bool, sizes: bool) -> Listings:
    """`Local.listings` of ``tree`` (blocking)."""
    out: Listings = {}
    for path in paths:
        entries = listing(tree, path, hb, meta, sizes)
        out[path] = None if entries is None else {e.name: e for e in entries}
    return out


@record
class Requests:
    """The ``list`` requests for some paths, and what this side named in them."""

    batches: list[tuple[list[str], list[bytes | None], list[bytes | None]]]  # (paths,
    # fingerprints, sketches) of each request
    named: dict[str, list[m.Listed]]  # the entries fingerprinted or sketched, in order
    sketched: dict[str, tuple[bytes, bytes]]  # (elements, sums) of each path sketched


def _list_requests(paths: list[str], have: Listings | None, short: bool, sketch: bool,
                   changed: Changed | None = None) -> Requests:
    """The ``list`` requests for ``paths``: each names what this side has there, by a set
    sketch (``sketch``: the peer has the feature; where fingerprints would cost more than
    SKETCH_FROM_BYTES, and ``changed`` does not find it `likely_past_capacity`) or
    by fingerprints (HAVE_FROM to HAVE_ENTRIES entries); LIST_BATCH directories and
    HAVE_BUDGET bytes of fingerprints a request."""
    out = Requests([], {}, {})
    budget = 0
    for path in paths:
        mine = (have or {}).get(path)
        prints = sums = None
        if mine is not None and HAVE_FROM <= len(mine) <= HAVE_ENTRIES:
            named = out.named[path] = list(mine.values())
            items = elements(named) if (
                sketch and sketch_bytes(len(named), short) > SKETCH_FROM_BYTES
                and not (changed and changed.likely_past_capacity(path, len(named)))) else b""
            if items and distinct(items):
                sums = _native.set_sketch(items, SKETCH_CAPACITY)
                out.sketched[path] = (items, sums)
            else:
                prints = fingerprints(named, short)
        if not out.batches or len(out.batches[-1][0]) == LIST_BATCH or (
                prints and budget + len(prints) > HAVE_BUDGET):
            out.batches.append(([], [], []))
            budget = 0
        out.batches[-1][0].append(path)
        out.batches[-1][1].append(prints)
        out.batches[-1][2].append(sums)
        budget += len(prints or b"")
    return out


class Changed:
    """How much the files differed in the directories listed so far, in each and in all:
    what `likely_past_capacity` judges a subdirectory by."""

    def __init__(self) -> None:
        self.share: dict[str, float] = {}  # per directory with CHANGE_FROM files or more
        self.files = self.differ = 0  # in every directory listed
        self.failed: set[str] = set()  # directories whose sketch did not decode

    def note(self, path: str, mine: dict[str, m.Listed], theirs: dict[str, m.Listed]) -> None:
        """Count the files of ``path`` in either listing, and those that differ."""
        names = {n for n, e in mine.items() if e.kind == "f"}
        names.update(n for n, e in theirs.items() if e.kind == "f")
        differ = 0
        for name in names:
            a, b = mine.get(name), theirs.get(name)
            if a is None or b is None or a.kind != b.kind or a.digest != b.digest:
                differ += 1
        self.files += len(names)
        self.differ += differ
        if len(names) >= CHANGE_FROM:
            self.share[path] = differ / len(names)

    def likely_past_capacity(self, path: str, entries: int) -> bool:
        """Whether more of the directory ``path``'s ``entries`` than a sketch holds
        probably differ, judged by the share of files that differed in its parent, else
        in every directory so far: a sketch that fails costs its bytes and a round trip
        more for the directory, and its subdirectories wait for that round trip (the
        renamed and scattered trees failed 54 and 52 of their 58 and 60 sketches and
        waited for about 20 listing round trips one after another, where a version pair
        waits for 8). An edited file is two elements of the difference (its old and new
        entry). Only for directories of up to GUESS_UP_TO entries, whose fingerprints cost
        little more than a sketch where the guess is wrong; and for any whose sketch
        failed already. The top, of which nothing is known yet, goes by fingerprints: the
        comparison asks for it because something below differs, and its sketch failed in
        every case of the bench (a version pair, the renamed and scattered trees, a 1%
        edit of 100,000 files: three or more of its entries differ), a round trip more
        before anything else is asked."""
        if path in self.failed:
            return True
        if entries > GUESS_UP_TO:
            return False
        if not path:
            return True
        share = self.share.get(path.rpartition("/")[0])
        if share is None:
            if self.files < CHANGE_FROM * 8:
                return False
            share = self.differ / self.files
        return 2 * share * entries > SKETCH_CAPACITY


# Fewer files than this in a directory say little of how much its subdirectories changed.
CHANGE_FROM = 4
# Larger directories are sketched whatever `Changed` expects: a wrong guess would cost
# their fingerprints, 4 bytes an entry (Django 5.0.6 -> 5.0.7: +1.3 KB, 3.5%, with no
# bound; the renamed tree's -1.6 KB of failed sketches kept with this one).
GUESS_UP_TO = 32


class Remote:
    """The opened remote directory, reached over ``connection``."""

    def __init__(self, connection: Connection, opened: m.Opened | m.Finished) -> None:
        self.connection = connection
        self.hashes = Hashes.of_message(opened)
        self._early: tuple[tuple, Conversation] | None = None  # (`metadata`'s arguments, it)
        self._changed = Changed()  # in the directories listed against ``have``

    def ask_metadata_early(self, hb: int) -> None:
        """Ask now for what a push's metadata walk asks first (`metadata` of the top,
        without vectors): the server rescans what the content phase wrote to answer it,
        while this side seals its own tree (after a first copy, 0.3 s of Django's on each
        side). `metadata` takes the answer if its first question is that one;
        `drop_early` forgets it (the server has rescanned all the same)."""
        self.drop_early()
        question = ([""], hb, False, False)
        self._early = (question, self.connection.start(
            m.MetaList(paths=[""], hb=hb, vectors=False, levels=False)))

    def drop_early(self) -> None:
        if self._early is not None:
            self._early[1].close()  # (its answer is dropped as it arrives)
            self._early = None

    async def listings(self, paths: list[str], hb: int, meta: bool = False,
                       sizes: bool = False, have: Listings | None = None,
                       later: list[str] | None = None) -> Listings:
        """Batched (LIST_BATCH directories, HAVE_BUDGET bytes of fingerprints a request),
        the requests overlapping. A directory whose sketch did not decode (more entries
        differ than it holds) is asked for again with fingerprints: here, or by the caller
        (``later``: it is never sketched again)."""
        sketch = SKETCH in self.connection.frames.features
        result, again = await self._listings(paths, hb, meta, sizes, have, sketch)
        if again and later is not None:
            self._changed.failed.update(again)
            later += again
        elif again:
            result.update((await self._listings(again, hb, meta, sizes, have, False))[0])
        if have is not None and sketch:
            for path, theirs in result.items():
                mine = have.get(path)
                if mine is not None and theirs is not None:
                    self._changed.note(path, mine, theirs)
        return result

    async def _listings(self, paths: list[str], hb: int, meta: bool, sizes: bool,
                        have: Listings | None, sketch: bool) -> tuple[Listings, list[str]]:
        """`listings` asked once: what came, and the paths to ask for again."""
        result: Listings = {}
        again: list[str] = []
        short = SHORT in self.connection.frames.features
        if have is None or len(paths) < THREAD_FROM:
            requests = _list_requests(paths, have, short, sketch, self._changed)
        else:
            requests = await trio.to_thread.run_sync(_list_requests, paths, have, short,
                                                     sketch, self._changed)
        conversations = [
            self.connection.start(m.List(
                paths=batch, hb=hb, meta=meta, sizes=sizes,
                have=prints if any(p is not None for p in prints) else None,
                sketch=sums if any(s is not None for s in sums) else None))
            for batch, prints, sums in requests.batches
        ]
        named, sketched = requests.named, requests.sketched
        for (asked, _, _), conversation in zip(requests.batches, conversations, strict=True):
            places = iter(asked)  # (an item that names no path: the next asked for)
            while True:
                message = await conversation.receive(m.Listings)
                for item in message.dirs:
                    path = item.path if item.path is not None else next(places, None)
                    if path is None:
                        raise ProtocolError(message="listing: more unnamed directories "
                                            "than were asked for")
                    if item.entries is None:
                        result[path] = None
                        continue
                    if item.sums is not None:
                        if path not in sketched or path in result:
                            raise ProtocolError(message=f"listing: sums for {path!r}, "
                                                "which was not sketched")
                        merged = merge_sketch(named[path], *sketched[path], item.sums,
                                              item.entries)
                        if merged is None:
                            again.append(path)
                        else:
                            result[path] = merged
                        continue
                    found = result.get(path) or {}
                    result[path] = found
                    if item.matched is not None and path in named:
                        found.update(merge(named[path], (), item.matched))
                    found.update((entry.name, entry) for entry in item.entries)
                if not message.more:
                    break
            conversation.close()
        return result, again

    async def metadata(self, paths: list[str], hb: int, vectors: bool = True,
                       levels: bool = False, deep: Sequence[str] = (),
                       unsplit: Sequence[str] = ()) -> list[m.MetaDir]:
        """Batched like `listings` (an ``mlist`` names at most MAX_ITEMS directories);
        ``deep``: more paths asked at the same time without ``levels``. With ``levels``,
        ``paths`` are asked with ``split`` where the server has the feature, and
        ``unsplit`` (each path's one-level vectors whole) without."""
        early = self._early
        if (early is not None and early[0] == (paths, hb, vectors, levels) and not deep
                and not unsplit):
            self._early = None
            asked = [(paths, early[1])]  # (asked by `ask_metadata_early`)
        else:
            self.drop_early()
            split = levels and SPLIT_META in self.connection.frames.features
            asked = [
                (chunk, self.connection.start(m.MetaList(
                    paths=chunk, hb=hb, vectors=vectors, levels=by_levels, split=by_split)))
                for questions, by_levels, by_split in ((paths, levels, split),
                                                       (list(deep), False, False),
                                                       (list(unsplit), True, False))
                for chunk in (questions[i : i + LIST_BATCH]
                              for i in range(0, len(questions), LIST_BATCH))
            ]
        items: list[m.MetaDir] = []
        for chunk, conversation in asked:
            places = iter(chunk)  # (an item that names no path: the next asked for)
            while True:
                message = await conversation.receive(m.MetaListing)
                for item in message.dirs:
                    if item is not None and item.path is not None:
                        items.append(item)
                        continue
                    place = next(places, None)
                    if place is None:
                        raise ProtocolError(message="mlisting: more unnamed items than "
                                            "directories were asked for")
                    if item is not None:
                        items.append(replace(item, path=place))
                if not message.more:
                    break
            conversation.close()
        return items

    async def apply(self, ops: list[m.Op]) -> list[m.Failure | None]:
        results: list[m.Failure | None] = []
        for start in range(0, len(ops), MAX_ITEMS):
            conversation = self.connection.start(m.Ops(ops=ops[start : start + MAX_ITEMS]))
            results += (await conversation.receive(m.OpResults)).results
            conversation.close()
        return results

    async def set_vectors(self, items: list[m.MetaDir]) -> None:
        for start in range(0, len(items), MSET_BATCH):
            conversation = self.connection.start(m.MetaSet(dirs=items[start : start + MSET_BATCH]))
            await conversation.receive(m.Ok)
            conversation.close()

    async def refreshed(self) -> Hashes:
        """The server's hashes after what this connection wrote (``finish``)."""
        conversation = self.connection.start(m.Finish())
        try:
            return Hashes.of_message(await conversation.receive(m.Finished))
        finally:
            conversation.close()

