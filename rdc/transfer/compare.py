"""Top-down comparison of a source tree with a target tree (docs/protocol.md, "list").

Only directories whose content hash differs are listed, level by level: each level asks
each side for all its differing directories at once (a remote side in one ``list``
request; the local side answers from its scan). A directory the target lacks is listed on
the source only. The result says what the target must do: directories to create, files to
send, links to make, entries to replace or remove. Modes and times are metadata, brought
in step afterwards (`rdc.transfer.metadata`), not here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from rdc.local.paths import join, to_wire
from rdc.local.snapshot import Entry, lookup
from rdc.params import SHORT_WIRE_PREFIX, WIRE_PREFIX
from rdc.transfer.ops import listed
from rdc.transfer.sides import Listings, Side
from rdc.wire import messages as m
from rdc.wire.connection import Connection, unwrap_group

# The feature both sides must have for listings in SHORT_WIRE_PREFIX bytes (and for
# offers' roots in OFFER_ROOT: rdc.transfer.batch.offer_root).
SHORT_DIGESTS = "short-digests"


@dataclass
class Changes:
    """What the target needs, in the order it is applied. An ``expect`` describes what
    the target holds now (what a change to it must still find there)."""

    replace: list[tuple[str, m.Expected]] = field(default_factory=list)  # rm before creating
    mkdirs: list[tuple[str, int]] = field(default_factory=list)  # parents first
    files: list[tuple[str, bytes | None]] = field(default_factory=list)  # root prefix there
    links: list[tuple[str, bytes, m.Expected]] = field(default_factory=list)
    removals: list[tuple[str, m.Expected]] = field(default_factory=list)  # only with --delete
    meta: list[tuple[str, str]] = field(default_factory=list)  # dry runs: (path, what)
    sizes: dict[str, int] = field(default_factory=dict)  # files: size where known
    digests: dict[str, bytes] = field(default_factory=dict)  # files new at their path: root prefix

    def __bool__(self) -> bool:
        return any((self.replace, self.mkdirs, self.files, self.links, self.removals))


def expected(entry: m.Listed | None) -> m.Expected:
    return m.NOTHING if entry is None else m.Expected(entry.kind, entry.digest)


def first_prefix(connection: Connection) -> int:
    """The hash prefix length of a sync's first comparison, listings and metadata alike
    (the second, if the roots still differ after it, is in whole hashes)."""
    short = SHORT_DIGESTS in connection.frames.features
    return SHORT_WIRE_PREFIX if short else WIRE_PREFIX


Known = Callable[[str, bytes], dict[str, m.Listed] | None]


def known_listings(base: Entry | None, hb: int) -> Known | None:
    """The target's listing of a directory, given the content hash prefix the target has
    for it, where ``base`` holds a directory at that path with that content hash: its
    entries are the target's, names, kinds and contents (a content hash covers them; the
    modes it does not cover are not compared here). ``base`` is the tree this side
    sealed last, which a push left in step with the target: after it, a directory the
    target did not change since need not be asked for (a 1%-edited push of 100,000 files
    asked for the listings of 4,000 directories, 83,000 entries, 250 KB of fingerprints
    and 17 round trips, to learn what this side already knew). A prefix matched by chance
    gives a wrong listing, which the final comparison of root hashes finds: the second
    comparison, in whole hashes, asks for everything."""
    if base is None:
        return None

    def known(path: str, digest: bytes) -> dict[str, m.Listed] | None:
        directory = lookup(base, path)
        if (directory is None or directory.kind != "d" or not directory.content
                or not digest or not directory.content.startswith(digest)):
            return None
        return {name: listed(name, entry, hb)
                for name, entry in directory.children.items()}

    return known


# Requests for listings in flight at once, and the fewest directories one asks for while
# others are in flight. A level waited for the one before it, and the two sides took
# turns: 17 levels in the bench's tree of 100,000 files, 0.34 s for 1,791 directories with
# either side busy half the time. With requests overlapping, this side lists and
# fingerprints one batch while the other side answers another, and a directory's
# subdirectories are asked for as soon as its own listing is in. What waits goes out in
# shares of the free requests: a request answered frees one, and took all that waited
# (half of it had, the rest a round trip later: over a 200 ms link the renamed tree's
# listings took 17 round trips for 9 levels, 14 now, with `Changed` and the second
# requests of failed sketches not holding up their batch).
IN_FLIGHT = 4
MIN_BATCH = 32


async def compare(source: Side, target: Side, hb: int, pull: bool = False,
                  known: Known | None = None, root: bytes = b"") -> Changes:
    """What ``target`` needs to have ``source``'s content (their root contents differ).
    ``pull``: the source is the remote side. ``known`` (a push): the target's listings
    this side knows given the target's content hash prefix of a directory
    (`known_listings`), ``root`` the target's root content hash. The changes come in the
    order of a level-by-level walk, whatever order the listings arrived in."""
    known = None if pull else known
    # The target's content hash prefixes of the directories asked for, where known.
    digests: dict[str, bytes] = {"": root[:hb]}
    found: dict[str, tuple[Changes | None, list[tuple[str, bool]]]] = {}  # per directory
    pending: list[tuple[str, bool]] = [("", True)]  # (directory, the target has it)
    arrived_send, arrived = trio.open_memory_channel[tuple[list, Listings, Listings]](
        math.inf)

    async def ask(batch: list[tuple[str, bool]]) -> None:
        nonlocal in_flight
        later: list[str] = []
        mine, theirs = await _listings(source, target, batch, hb, pull, known, digests, later)
        if later:  # (asked again at once; the rest of the batch goes on meanwhile)
            again = set(later)
            in_flight += 1
            nursery.start_soon(ask, [item for item in batch if item[0] in again])
            batch = [item for item in batch if item[0] not in again]
        arrived_send.send_nowait((batch, mine, theirs))

    in_flight = 0
    with unwrap_group():  # (a failed request raises as itself, as it did unbatched)
        async with trio.open_nursery() as nursery:
            while pending or in_flight:
                while pending and in_flight < IN_FLIGHT:
                    free = IN_FLIGHT - in_flight  # (all that waits goes out, in shares)
                    take = min(len(pending), max(MIN_BATCH, -(-len(pending) // free)))
                    batch, pending = pending[:take], pending[take:]
                    nursery.start_soon(ask, batch)
                    in_flight += 1
                batch, mine, theirs = await arrived.receive()
                in_flight -= 1
                for path, has in batch:
                    dst = (theirs.get(path) or {}) if has else {}
                    if known is not None:
                        digests.update((join(path, name), e.digest) for name, e in dst.items()
                                       if e.kind == "d")
                    pending += _compared(path, mine.get(path) or {}, dst, found)
    return _in_walk_order(found)


def _compared(path: str, src: dict[str, m.Listed], dst: dict[str, m.Listed],
              found: dict[str, tuple[Changes | None, list[tuple[str, bool]]]]
              ) -> list[tuple[str, bool]]:
    """Compare the directory ``path``'s entries on both sides: its changes (None if it has
    none) and the subdirectories to look into go in ``found``; those are returned."""
    here, below = Changes(), []
    for name in sorted(set(src) | set(dst), key=to_wire):
        rel = join(path, name)
        descend = _compare_entry(rel, src.get(name), dst.get(name), here)
        if descend is not None:
            below.append((rel, descend))
    found[path] = (here if here else None, below)
    return below


async def _listings(source: Side, target: Side, batch: list[tuple[str, bool]], hb: int,
                    pull: bool, known: Known | None, digests: dict[str, bytes],
                    later: list[str]) -> tuple[Listings, Listings]:
    """Both sides' listings of ``batch``. What the local side has in a directory goes
    along to the remote side, which sends back only what differs
    (`rdc.transfer.reconcile`): the source's entries in a push, the target's in a pull.
    Not when comparing again with whole hashes (a prefix matched by chance). A
    directory the remote side needs another request for is named in ``later`` (its
    listings here are not to be used)."""
    reconcile = hb != m.HASH_BYTES
    paths = [path for path, _ in batch]
    held = [path for path, has in batch if has]
    if pull:
        theirs = await target.listings(held, hb)
        mine = await source.listings(paths, hb, sizes=True, have=theirs if reconcile else None,
                                     later=later)
        return mine, theirs
    mine = await source.listings(paths, hb, sizes=True)
    held_here: Listings = {}
    if known is not None:
        for path in held:
            entries = known(path, digests.get(path, b""))  # (b"": not known)
            if entries is not None:
                held_here[path] = entries
    theirs = await target.listings([path for path in held if path not in held_here], hb,
                                   have=mine if reconcile else None, later=later)
    theirs.update(held_here)
    return mine, theirs


def _in_walk_order(found: dict[str, tuple[Changes | None, list[tuple[str, bool]]]]
                   ) -> Changes:
    """The changes of each directory listed, joined as a level-by-level walk from the top
    meets the directories (parents before children: the order they are applied in)."""
    changes = Changes()
    level = [""]
    while level:
        below = []
        for path in level:
            here, children = found[path]
            if here is not None:
                for name in ("replace", "mkdirs", "files", "links", "removals"):
                    getattr(changes, name).extend(getattr(here, name))
                changes.sizes.update(here.sizes)
                changes.digests.update(here.digests)
            below += [child for child, _ in children]
        level = below
    return changes


def _compare_entry(rel: str, source: m.Listed | None, target: m.Listed | None,
                   changes: Changes) -> bool | None:
    """Record what the target lacks at ``rel``; for a directory to look into next, return
    whether the target has it."""
    if source is None:
        changes.removals.append((rel, expected(target)))
        return None
    if target is not None and target.kind != source.kind:
        changes.replace.append((rel, expected(target)))
        target = None
    if source.kind == "d":
        if target is None:
            changes.mkdirs.append((rel, source.mode))
            return False
        return True if source.digest != target.digest else None
    if target is not None and source.digest == target.digest:
        return None
    if source.kind == "f":
        changes.files.append((rel, None if target is None else target.digest))
        if source.size is not None:
            changes.sizes[rel] = source.size
        if target is None:
            changes.digests[rel] = source.digest
    else:
        changes.links.append((rel, source.digest, expected(target)))
    return None


def moves(changes: Changes) -> list[tuple[str, str, m.Expected]]:
    """(path, new path, what is at path) for each file new at its path whose content the
    target holds at a path it is to remove (a renamed or moved file): moved there
    instead, the content neither sent nor read again. A prefix that matched by accident
    moves the wrong file, which the final comparison of root hashes finds and sends."""
    held: dict[bytes, list[tuple[str, m.Expected]]] = {}
    for path, expect in changes.removals:
        if expect.kind == "f" and expect.digest:
            held.setdefault(expect.digest, []).append((path, expect))
    out = []
    for path, there in changes.files:
        digest = changes.digests.get(path)
        candidates = held.get(digest) if there is None and digest else None
        if candidates:
            old, expect = candidates.pop()
            out.append((old, path, expect))
    return out


def everything(tree: Entry) -> Changes:
    """What an empty target needs to have ``tree`` (which need not be sealed: no hash is
    used), in the order `compare` would give it: level by level, names in wire order."""
    changes = Changes()
    level: list[tuple[str, Entry]] = [("", tree)]
    while level:
        below: list[tuple[str, Entry]] = []
        for path, directory in level:
            for name in sorted(directory.children, key=to_wire):
                entry = directory.children[name]
                rel = join(path, name)
                if entry.kind == "d":
                    changes.mkdirs.append((rel, entry.mode))
                    below.append((rel, entry))
                elif entry.kind == "f":
                    changes.files.append((rel, None))
                    changes.sizes[rel] = entry.size
                else:
                    changes.links.append((rel, entry.digest(), m.NOTHING))
        level = below
    return changes
