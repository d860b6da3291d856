"""The per-file exchange, sans I/O: what a target asks for and how it rebuilds the file.

The target holds seeds (older versions, similar files). Given the source's offer it either
has the file already, asks for all of it (no seeds, or a tiny file), or descends the
source's tree: it asks for the children of nodes it does not know, level by level; for
unknown leaves it asks for their sub-chunk lists and looks for those sub-chunks in the
seed region between the leaf's matched neighbours; it fetches only what it still lacks.

`target_descent` is a generator: it yields wants (the wire messages) and is sent the entry
lists that answer them; it returns a `Plan` of pieces that rebuild the file. `SourceFile`
answers the wants. The protocol
engine runs many of these at once over one connection; `simulate` runs one in memory and
counts the bytes each way, which is what ``rdc delta`` reports.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Generator
from dataclasses import dataclass, field, replace
from itertools import accumulate

from rdc.content import refine, subchunks
from rdc.content.entries import pack_varints, prefixes, unpack_varints
from rdc.content.signature import chunk_hash, signature_of_bytes
from rdc.content.tree import HASH_BYTES, Tree
from rdc.params import (
    DEFAULT_CHUNKS,
    FINE_PARAMS,
    MAX_CHUNK_LIMIT,
    MID_PARAMS,
    SUB_PREFIX,
    WIRE_PREFIX,
    ChunkParams,
)
from rdc.records import record
from rdc.wire.codec import pack
from rdc.wire.messages import (
    Data,
    EntryList,
    Lists,
    Message,
    Offer,
    WantExpand,
    WantFetch,
    WantFine,
    WantSubs,
    WantWhole,
    encode,
    same_root,
)

# A file this small is cheaper to send whole than to describe.
WHOLE_BELOW = 256
# An unknown leaf this small is fetched whole rather than split into sub-chunks.
SUBS_FROM = 1024
# When not one node, leaf or mid of a file was found in its seeds and this many of its
# mids want fine lists, the file may be new data (rewritten, recompressed, encrypted),
# whose fine lists would cost about 3% of its bytes and find nothing: FINE_PROBE of those
# mids, evenly spread, are asked for first, and the rest only if they find something.
# (Text rewritten around its old phrases, translation catalogues say, finds fines where
# no mid matched, so a file is not written off without asking.)
FINE_PROBE_FROM = 16
FINE_PROBE = 4
# The seed region searched for a leaf's sub-chunks is at most this long.
REGION_LIMIT = 1 << 20
# A file of at most this many bytes of which no chunk was found in any seed has its
# unknown leaves looked up in every seed (`_regions`).
SEARCH_ALL_SEEDS = 64 << 10
# Literal data asked for in one request: bounds what is in flight per file.
FETCH_LIMIT = 4 << 20
FETCH_ITEMS = 4096
MAX_DEPTH = 64
MAX_LEAF = MAX_CHUNK_LIMIT


# ---------------------------------------------------------------- entry lists


def decode_entries(entries: EntryList, prefix: int) -> list[tuple[bytes, int]]:
    """(hash prefix, length) of each entry of a tree node's child list."""
    if len(entries.prefixes) % prefix:
        raise ValueError("prefix list has a partial entry")
    count = len(entries.prefixes) // prefix
    lengths = unpack_varints(entries.lengths, count)
    return [(entries.prefixes[i * prefix : (i + 1) * prefix], n) for i, n in enumerate(lengths)]


def split_list(data: bytes | memoryview, params: ChunkParams, prefix: int = SUB_PREFIX
               ) -> EntryList:
    """The list of ``data`` split with ``params``, as it travels."""
    keys, lengths = subchunks.encode(data, params, prefix)
    return EntryList(0, keys, lengths)


# The target's requests are the wire's wants; its replies, entry lists or data pieces.
Request = WantExpand | WantSubs | WantFine
Reply = list[EntryList]


def wire_size(message: Message) -> int:
    """Bytes of a message as it travels in a conversation (without the frame)."""
    return len(pack(encode(message, 1)))


# ---------------------------------------------------------------- the target's side


@record
class SeedFile:
    tree: Tree
    read: Callable[[int, int], bytes]  # (offset, length) -> bytes


class SeedMap:
    """Every node and leaf of the seed trees by hash prefix: where its bytes are."""

    def __init__(self, seeds: list[SeedFile], prefix: int = WIRE_PREFIX) -> None:
        self.seeds = seeds
        self.prefix = prefix
        self.where: dict[bytes, tuple[int, int, int]] = {}
        for s, seed in enumerate(seeds):
            for level in seed.tree.levels:
                offset = 0
                for i, length in enumerate(level.lengths):
                    key = level.hashes[HASH_BYTES * i : HASH_BYTES * i + prefix]
                    self.where.setdefault(key, (s, offset, length))
                    offset += length

    def __bool__(self) -> bool:
        return bool(self.seeds)

    def find(self, key: bytes, length: int) -> tuple[int, int] | None:
        hit = self.where.get(key)
        if hit is None or hit[2] != length:
            return None
        return hit[0], hit[1]


@record
class Piece:
    """``length`` bytes of the new file at ``offset``: from a seed (``seed``,
    ``seed_offset``) or, with ``seed == -1``, literal: the data of fetch item ``item``."""

    offset: int
    length: int
    seed: int = -1
    seed_offset: int = 0
    item: int = -1


@record
class FetchItem:
    """Literal data to ask the source for: ``length`` bytes of a leaf from ``start``;
    with ``old`` (seed, offset, length), described against those old bytes, whose block
    ``hashes`` go with the request (`rdc.content.refine`)."""

    leaf: int
    start: int
    length: int
    old: tuple[int, int, int] | None = None
    hashes: bytes = b""

    def wire(self) -> tuple[int, int, int] | tuple[int, int, int, bytes, int]:
        """The item as a ``fetch`` want carries it."""
        if self.old is None:
            return (self.leaf, self.start, self.length)
        return (self.leaf, self.start, self.length, self.hashes, self.old[2])


@dataclass
class Plan:
    """How to rebuild the file: ``have`` (nothing to do), ``whole`` (ask for all of it), or
    ``pieces`` in file order, the literal ones filled by the ``fetch`` items in the same
    order. ``checks``: ``(leaf, offset, length, prefix)`` of leaves rebuilt from sub-chunks, whose
    hash must start with ``prefix``."""

    have: bool = False
    whole: bool = False
    pieces: list[Piece] = field(default_factory=list)
    fetch: list[FetchItem] = field(default_factory=list)
    checks: list[tuple[int, int, int, bytes]] = field(default_factory=list)
    root: bytes = b""  # the offered root, which the rebuilt file must have
    size: int = 0
    ends: list[int] | None = None  # where the new file's leaves end, if known (`leaf_ends`)

    def matched_bytes(self) -> int:
        return sum(p.length for p in self.pieces if p.seed >= 0)

    def literal_bytes(self) -> int:
        if self.have:
            return 0
        if self.whole:
            return self.size
        return sum(item.length for item in self.fetch)

    def fetch_batches(self, limit: int = FETCH_LIMIT) -> list[list[int]]:
        """Fetch item indices in file order, cut into batches of at most ``limit`` bytes
        (or one item), so that the data in flight for one file stays bounded."""
        batches: list[list[int]] = []
        size = limit
        for i, item in enumerate(self.fetch):
            if size + item.length > limit or len(batches[-1]) >= FETCH_ITEMS:
                batches.append([])
                size = 0
            batches[-1].append(i)
            size += item.length
        return batches


Region = tuple[int, int, int]  # (seed, start, stop): seed bytes [start, stop)


def _regions(
    known: list[Piece], starts: list[int], offset: int, end: int, seeds: SeedMap,
    fallback: int, *, small: bool, firsts: list[tuple[int, int]],
) -> tuple[Region, ...]:
    """Where the old version of new-file range [offset, end) should be, as seed regions to
    look in, in order (none: past the end of every seed). First `_region`'s; then, where
    that one is in another seed, in the first seed (the file at the same path, when there
    is one), placed by the nearest piece found there (`_first_seed_region`). Placed by a
    neighbour alone, a chunk found in a similar file (the English strings every
    translation catalogue holds) sent the search for the rest of the file there, and the
    edited catalogue's old version was never looked at: 15.2 KB of literal data for a
    29 KB file that costs 6.4 KB against its old version alone. With nothing of a
    ``small`` file found, every seed is searched, from its start, REGION_LIMIT bytes in
    all (no more than one seed's region cost before): the first may be what its path held
    before (a file moved over another), and the file's own old version the next. (In a
    large file nothing found at all is a rewrite, not a move: more regions would only
    lengthen its lists' prefixes.) ``firsts``: (offset, displacement) of the pieces found
    in the first seed, sorted."""
    if not known and small:  # in each seed, from its start: REGION_LIMIT in all
        share = REGION_LIMIT // len(seeds.seeds)
        return tuple(r for seed in range(len(seeds.seeds))
                     if (r := _clipped(seeds, seed, 0, min(share, seeds.seeds[seed].tree.size))))
    near = _region(known, starts, offset, end, seeds, fallback)
    if near is not None and near[0] == 0:
        return (near,)
    first = _first_seed_region(firsts, offset, end, seeds, max(end - offset, fallback))
    return tuple(r for r in (near, first) if r is not None)


def _region(
    known: list[Piece], starts: list[int], offset: int, end: int, seeds: SeedMap,
    fallback: int,
) -> Region | None:
    """Where in a seed the old version of new-file range [offset, end) should be:
    ``(seed, start, stop)``. Between the matched neighbours when both come from one seed in
    order; else where one neighbour's displacement (its seed offset minus its new offset)
    puts the range, widened by its length (at least ``fallback``) on each side, since other
    unknown ranges may lie between it and that neighbour; with no neighbour, the first seed
    (the file at the same path, when there is one). ``starts``: the offsets of ``known``,
    which is in file order."""
    at = bisect.bisect_left(starts, offset)
    left = known[at - 1] if at > 0 else None
    right = known[at] if at < len(known) else None
    slack = max(end - offset, fallback)
    if left and right and left.seed == right.seed and (
        left.seed_offset + left.length <= right.seed_offset
    ):
        seed, start, stop = left.seed, left.seed_offset + left.length, right.seed_offset
    elif left or right:
        near = left or right
        assert near is not None
        shift = near.seed_offset - near.offset
        seed, start, stop = near.seed, offset + shift - slack, end + shift + slack
    else:
        seed, start, stop = 0, 0, seeds.seeds[0].tree.size
    return _clipped(seeds, seed, start, stop)


def _first_seed_region(firsts: list[tuple[int, int]], offset: int, end: int, seeds: SeedMap,
                       slack: int) -> Region | None:
    """Where in the first seed range [offset, end) should be: by the displacement of the
    piece found there nearest to it (``firsts``: (offset, displacement) of those pieces,
    sorted), widened by ``slack`` on each side; with none found there, the whole seed, as
    `_region` without neighbours."""
    if not firsts:
        return _clipped(seeds, 0, 0, seeds.seeds[0].tree.size)
    at = bisect.bisect_left(firsts, (offset,))
    shift = min((firsts[k] for k in (at - 1, at) if 0 <= k < len(firsts)),
                key=lambda first: abs(first[0] - offset))[1]
    return _clipped(seeds, 0, offset + shift - slack, end + shift + slack)


def _clipped(seeds: SeedMap, seed: int, start: int, stop: int) -> Region | None:
    """[start, stop) of ``seed`` cut to the seed and to REGION_LIMIT bytes; None if empty."""
    size = seeds.seeds[seed].tree.size
    start, stop = max(0, start), min(size, stop, max(0, start) + REGION_LIMIT)
    return (seed, start, stop) if stop > start else None


class _Lookup:
    """The indexes of a leaf's seed regions: a piece is taken from the first that has it."""

    def __init__(self, indexes: list[subchunks.RegionIndex]) -> None:
        self.indexes = indexes

    def mid(self, key: bytes, length: int) -> tuple[int, int] | None:
        """(seed, offset) of a mid piece with this hash prefix and length."""
        return self._find("mids", key, length)

    def fine(self, key: bytes, length: int) -> tuple[int, int] | None:
        """(seed, offset) of a fine piece with this hash prefix and length."""
        return self._find("fines", key, length)

    def _find(self, kind: str, key: bytes, length: int) -> tuple[int, int] | None:
        for index in self.indexes:
            hit = getattr(index, kind).find(key, length)
            if hit is not None:
                return index.seed, hit
        return None

    def fines(self) -> int:
        """Fine pieces in all the regions (what a fine list's prefix length is chosen for)."""
        return sum(len(index.fines) for index in self.indexes)


def _prefix(regions: tuple[Region, ...], params: ChunkParams, leaf: int) -> int:
    """The prefix length for a list of ``params`` pieces looked up in ``regions``."""
    return subchunks.prefix_for(sum(subchunks.pieces_in(stop - start, params)
                                    for _, start, stop in regions), params, leaf)


def whole_is_best(size: int, depth: int, seeded: bool, old_size: int | None = None) -> bool:
    """Whether a target should ask for a file whole rather than descend its tree: with no
    seeds, for a file too small to describe more cheaply than to send (under WHOLE_BELOW,
    or a single chunk under SUBS_FROM that is not `refined_whole` against its first seed,
    of ``old_size`` bytes)."""
    return not seeded or size < WHOLE_BELOW or (
        depth == 2 and size < SUBS_FROM and not refined_whole(size, depth, old_size))


def refined_whole(size: int, depth: int, old_size: int | None) -> bool:
    """Whether a file of one chunk too small to split (under SUBS_FROM) is fetched as one
    range described against its first seed's bytes, ``old_size`` of them (a refined item,
    `rdc.content.refine`): their block hashes cost a sixteenth of their length, and only
    the blocks that changed come back. On 244 such files with a few words edited each the
    bytes were 29 KB, against 42 KB sent whole and compressed."""
    return (depth == 2 and WHOLE_BELOW <= size < SUBS_FROM and old_size is not None
            and refine.worth_refining(size, old_size))


def target_descent(
    offer: Offer, seeds: SeedMap, have_root: bool, short: bool = False
) -> Generator[Request, Reply | None, Plan]:
    """The target's decisions for one file: yields wants (expand, subs, fine), is sent the
    entry lists that answer them, and returns the plan (whose literal data the caller
    fetches). ``short``: the source takes the prefix length of sub-chunk lists from the
    want (`subchunks.prefix_for`), else they come with SUB_PREFIX bytes."""
    if have_root:
        return Plan(have=True, root=offer.root, size=offer.size)
    old_size = seeds.seeds[0].tree.size if seeds else None
    if whole_is_best(offer.size, offer.depth, bool(seeds), old_size):
        return Plan(whole=True, root=offer.root, size=offer.size)
    if refined_whole(offer.size, offer.depth, old_size):
        assert old_size is not None
        old = seeds.seeds[0].read(0, old_size)
        if len(old) != old_size:  # (a seed shorter than its signature)
            return Plan(whole=True, root=offer.root, size=offer.size)
        item = FetchItem(0, 0, offer.size, (0, 0, old_size), refine.block_hashes(old))
        return Plan(pieces=[Piece(0, offer.size, item=0)], fetch=[item], root=offer.root,
                    size=offer.size)

    prefix = seeds.prefix
    known: list[Piece] = []
    unknown: list[tuple[int, int, int, bytes]] = []  # (leaf index, offset, length, key)
    supplied: dict[int, EntryList] = {}
    if offer.subs is not None and offer.depth == 2:  # one leaf, its sub-chunks at hand
        unknown.append((0, 0, offer.size, b""))
        supplied[0] = offer.subs
        frontier = []
    else:
        frontier = [(offer.depth, 0)]
    if not 2 <= offer.depth <= MAX_DEPTH:
        raise ValueError(f"a tree of depth {offer.depth}")
    spans = {(offer.depth, 0): (0, offer.size)}
    while frontier:
        reply = yield WantExpand(nodes=list(frontier))
        assert reply is not None
        next_frontier = []
        for node, entry_list in zip(frontier, reply, strict=True):
            level = node[0]
            offset, node_length = spans[node]
            entries = decode_entries(entry_list, prefix)
            if sum(length for _, length in entries) != node_length or (
                level == 2 and any(length > MAX_LEAF for _, length in entries)
            ):
                raise ValueError(f"the children of node {node} do not add up to it")
            if entry_list.first + len(entries) > offer.size:  # each entry holds a byte
                raise ValueError(f"the children of node {node} are numbered past the file")
            for i, (key, length) in enumerate(entries):
                child = (level - 1, entry_list.first + i)
                found = seeds.find(key, length)
                if found:
                    known.append(Piece(offset, length, found[0], found[1]))
                elif level - 1 == 1:
                    unknown.append((child[1], offset, length, key))
                else:
                    next_frontier.append(child)
                    spans[child] = (offset, length)
                offset += length
        frontier = next_frontier
    known.sort(key=lambda p: p.offset)
    unknown.sort(key=lambda u: u[1])
    ends = leaf_ends(known, unknown, seeds, offer.size)
    pieces = list(known)

    # Unknown leaves: the larger ones are split into mids, looked up in the seed region
    # around the leaf; unknown mids are split into fine pieces, looked up the same way.
    fetch = [(u[0], 0, u[2]) for u in unknown if u[2] < SUBS_FROM]  # (leaf, start, length)
    leaf_at = {u[0]: u[1] for u in unknown}
    leaf_length = {u[0]: u[2] for u in unknown}
    checks: list[tuple[int, int, int, bytes]] = []
    split = [u for u in unknown if u[2] >= SUBS_FROM]
    if split:
        # A leaf with no seed region to look in (past the end of every seed: the tail of a
        # file resumed from a partial one) is fetched without asking for its mids.
        starts = [p.offset for p in known]
        small = offer.size <= SEARCH_ALL_SEEDS
        firsts = sorted((p.offset, p.seed_offset - p.offset) for p in known if p.seed == 0)
        regions = {u[0]: _regions(known, starts, u[1], u[1] + u[2], seeds, u[2], small=small,
                                  firsts=firsts)
                   for u in split}
        wanted = [u[0] for u in split if u[0] not in supplied and regions[u[0]]]
        mid_prefix = {leaf: SUB_PREFIX for leaf in supplied}  # (an offer's inline list)
        if wanted:
            p = SUB_PREFIX
            if short:  # one length for the want: the one its largest region calls for
                p = max(_prefix(regions[leaf], MID_PARAMS, leaf_length[leaf])
                        for leaf in wanted)
            reply = yield WantSubs(leaves=wanted, prefix=p)
            assert reply is not None
            supplied.update(zip(wanted, reply, strict=True))
            mid_prefix.update(dict.fromkeys(wanted, p))
        indexes: dict[Region, subchunks.RegionIndex] = {}
        fine_wanted: list[tuple[int, int, int, int, _Lookup]] = []
        for leaf, offset, length, leaf_key in split:
            if not regions[leaf]:
                fetch.append((leaf, 0, length))
                continue
            mids = subchunks.decode(supplied[leaf].prefixes, supplied[leaf].lengths, length,
                                    MID_PARAMS, mid_prefix[leaf])
            for region in regions[leaf]:
                if region not in indexes:
                    seed, begin, stop = region
                    data = seeds.seeds[seed].read(begin, stop - begin)
                    indexes[region] = subchunks.index_region(seed, begin, data)
            lookup = _Lookup([indexes[region] for region in regions[leaf]])
            start = 0
            for k, (key, n) in enumerate(mids):
                hit = lookup.mid(key, n)
                if hit is not None:
                    pieces.append(Piece(offset + start, n, *hit))
                elif n >= subchunks.FINE_FROM:
                    fine_wanted.append((leaf, k, start, n, lookup))
                else:
                    fetch.append((leaf, start, n))
                start += n
            if leaf_key:  # (a single leaf is checked by the root)
                checks.append((leaf, offset, length, leaf_key))
        rounds = [fine_wanted]
        if not pieces and len(fine_wanted) >= FINE_PROBE_FROM:
            # Nothing of the file found so far (no node, leaf or mid is a piece): ask for a
            # few evenly spread mids' fine lists first, and for the rest only if those find
            # something.
            step = len(fine_wanted) // FINE_PROBE
            probe = range(0, step * FINE_PROBE, step)
            rounds = [[fine_wanted[i] for i in probe],
                      [w for i, w in enumerate(fine_wanted) if i not in probe]]
        for i, some in enumerate(rounds):
            found = yield from _fine_lists(some, short, leaf_length, leaf_at, pieces, fetch)
            if not found and i + 1 < len(rounds):
                fetch += [(leaf, start, n) for leaf, _, start, n, _ in rounds[i + 1]]
                break
    items: list[FetchItem] = []
    for leaf, start, length in sorted(fetch):  # adjacent ranges of a leaf go as one
        if items and items[-1].leaf == leaf and items[-1].start + items[-1].length == start:
            items[-1] = FetchItem(leaf, items[-1].start, items[-1].length + length)
        else:
            items.append(FetchItem(leaf, start, length))
    items = _refined(items, pieces, leaf_at, seeds)
    checked = {c[0] for c in checks}
    refined = {item.leaf for item in items if item.old is not None}
    for leaf, offset, length, leaf_key in unknown:  # a refined whole leaf is checked too
        if leaf_key and leaf in refined and leaf not in checked:
            checks.append((leaf, offset, length, leaf_key))
    for i, item in enumerate(items):
        pieces.append(Piece(leaf_at[item.leaf] + item.start, item.length, item=i))
    pieces.sort(key=lambda p: p.offset)
    return Plan(pieces=pieces, fetch=items, checks=checks, root=offer.root, size=offer.size,
                ends=ends)


def leaf_ends(known: list[Piece], unknown: list[tuple[int, int, int, bytes]], seeds: SeedMap,
              size: int) -> list[int] | None:
    """Where the new file's leaves end, from what the descent found: a node found in a
    seed holds that seed's leaves (equal hashes, equal children), an unknown leaf is one.
    ``known`` and ``unknown`` (by offset) tile the file; None where they do not, or a leaf
    is longer than the chunker makes them (then the file is chunked to be checked)."""
    ends: list[int] = []
    seed_ends: dict[int, list[int]] = {}
    spans = sorted([(p.offset, p.length, p.seed, p.seed_offset) for p in known]
                   + [(offset, length, -1, 0) for _, offset, length, _ in unknown])
    at = 0
    for offset, length, seed, seed_offset in spans:
        if offset != at or length <= 0:
            return None
        if seed < 0:
            ends.append(offset + length)
        else:
            if seed not in seed_ends:
                seed_ends[seed] = list(accumulate(seeds.seeds[seed].tree.leaves.lengths))
            inside = seed_ends[seed]
            first = bisect.bisect_right(inside, seed_offset)
            last = bisect.bisect_right(inside, seed_offset + length)
            begins = inside[first - 1] if first else 0
            if first == last or begins != seed_offset or inside[last - 1] != seed_offset + length:
                return None
            shift = offset - seed_offset
            ends += [end + shift for end in inside[first:last]]
        at = offset + length
    if at != size or not ends:
        return None
    limit = DEFAULT_CHUNKS.max_size
    if any(b - a > limit for a, b in zip([0, *ends], ends, strict=False)):
        return None
    return ends


def _fine_lists(
    wanted: list[tuple[int, int, int, int, _Lookup]], short: bool,
    leaf_length: dict[int, int], leaf_at: dict[int, int], pieces: list[Piece],
    fetch: list[tuple[int, int, int]],
) -> Generator[Request, Reply | None, int]:
    """Asks for the fine lists of the ``wanted`` mids, (leaf, mid index, start, length,
    the seed regions' indexes) each, and looks them up: a fine piece found becomes a piece,
    one not found a range to fetch. Returns how many were found."""
    if not wanted:
        return 0
    p = SUB_PREFIX
    if short:
        p = max(subchunks.prefix_for(lookup.fines(), FINE_PARAMS, leaf_length[leaf])
                for leaf, _, _, _, lookup in wanted)
    reply = yield WantFine(mids=[(leaf, k) for leaf, k, _, _, _ in wanted], prefix=p)
    assert reply is not None
    found = 0
    for (leaf, _, start, n, lookup), fine_list in zip(wanted, reply, strict=True):
        for key, m in subchunks.decode(fine_list.prefixes, fine_list.lengths, n,
                                       FINE_PARAMS, p):
            hit = lookup.fine(key, m)
            if hit is not None:
                pieces.append(Piece(leaf_at[leaf] + start, m, *hit))
                found += 1
            else:
                fetch.append((leaf, start, m))
            start += m
    return found


def _refined(
    items: list[FetchItem], matched: list[Piece], leaf_at: dict[int, int], seeds: SeedMap
) -> list[FetchItem]:
    """The items, each that replaces old bytes of a likely edit (`refine.worth_refining`)
    with those old bytes and their block hashes: the seed bytes between the item's matched
    neighbours, or as many after the left one (before the right one) when there is one."""
    ending = {p.offset + p.length: p for p in matched}
    starting = {p.offset: p for p in matched}
    out = []
    for item in items:
        offset = leaf_at[item.leaf] + item.start
        left, right = ending.get(offset), starting.get(offset + item.length)
        if left and right and left.seed == right.seed and (
                left.seed_offset + left.length <= right.seed_offset):
            seed, begin = left.seed, left.seed_offset + left.length
            size = right.seed_offset - begin
        elif left:
            seed, begin, size = left.seed, left.seed_offset + left.length, item.length
        elif right:
            seed, begin = right.seed, max(0, right.seed_offset - item.length)
            size = right.seed_offset - begin
        else:
            out.append(item)
            continue
        size = min(size, seeds.seeds[seed].tree.size - begin)
        if not refine.worth_refining(item.length, size):
            out.append(item)
            continue
        old = seeds.seeds[seed].read(begin, size)
        if len(old) != size:
            out.append(item)  # a seed shorter than its signature: the plain bytes
            continue
        out.append(FetchItem(item.leaf, item.start, item.length, (seed, begin, size),
                             refine.block_hashes(old)))
    return out


# ---------------------------------------------------------------- the source's side


class SourceFile:
    """Answers a target's requests from the new file's tree and bytes."""

    def __init__(self, tree: Tree, read: Callable[[int, int], bytes], prefix: int = WIRE_PREFIX):
        self.tree = tree
        self.read = read
        self.prefix = prefix
        self._last: tuple[int, bytes] | None = None  # the last leaf read, checked
        self._mids: tuple[int, list[tuple[int, int]]] | None = None  # ... and its mids
        self._leaf_offsets = [0]
        for length in tree.leaves.lengths:
            self._leaf_offsets.append(self._leaf_offsets[-1] + length)
        # children of node i of level k+1 are entries first[k][i] .. first[k][i+1] of level k
        self._first: list[list[int]] = []
        for below, above in zip(tree.levels, tree.levels[1:], strict=False):
            firsts, j, total = [0], 0, 0
            for length in above.lengths:
                while total < length:
                    total += below.lengths[j]
                    j += 1
                firsts.append(j)
                total = 0
            self._first.append(firsts)

    def offer(self, sketch: bytes | None = None, inline_subs: bool = False) -> Offer:
        """The offer; ``inline_subs``: the target probably holds an older version."""
        subs = None
        if inline_subs and len(self.tree.leaves) == 1 and self.tree.size >= SUBS_FROM:
            subs = self.subs(0)
        return Offer(size=self.tree.size, root=self.tree.root, depth=len(self.tree.levels),
                     sketch=sketch, subs=subs)

    def lists(self, request: Request) -> list[EntryList]:
        """The entry lists that answer a want; ValueError for one that does not fit this
        file."""
        if isinstance(request, WantExpand):
            return [self.children(level, i) for level, i in request.nodes]
        if isinstance(request, WantSubs):
            return [self.subs(leaf, request.prefix) for leaf in request.leaves]
        return [self.fines(leaf, mid, request.prefix) for leaf, mid in request.mids]

    def children(self, level: int, index: int) -> EntryList:
        """The entries below node ``index`` of ``level`` (2 = the level above the leaves)."""
        if not 2 <= level <= len(self.tree.levels) or not 0 <= index < len(
            self.tree.levels[level - 1]
        ):
            raise ValueError(f"no node {index} at level {level}")
        below = self.tree.levels[level - 2]
        first = self._first[level - 2][index]
        stop = self._first[level - 2][index + 1]
        return EntryList(
            first,
            prefixes(below.hashes[HASH_BYTES * first : HASH_BYTES * stop], self.prefix),
            pack_varints(below.lengths[first:stop]),
        )

    def leaf_bytes(self, leaf: int) -> bytes:
        """The bytes of one leaf, checked against its hash: a file whose content changed
        without its signature (bit rot) is SourceChanged, not served."""
        if not 0 <= leaf < len(self.tree.leaves):
            raise ValueError(f"no leaf {leaf}")
        if self._last is not None and self._last[0] == leaf:
            return self._last[1]
        start = self._leaf_offsets[leaf]
        length = self._leaf_offsets[leaf + 1] - start
        data = self.read(start, length)
        if len(data) != length:
            raise SourceChanged(f"the file is shorter than its signature (leaf {leaf})")
        if chunk_hash(data) != self.tree.leaves.hash(leaf):
            raise SourceChanged(f"chunk {leaf} (at byte {start:,}) differs from its signature")
        self._last = (leaf, data)
        return data

    def subs(self, leaf: int, prefix: int = SUB_PREFIX) -> EntryList:
        """The mid list of one leaf."""
        return split_list(self.leaf_bytes(leaf), MID_PARAMS, prefix)

    def fines(self, leaf: int, mid: int, prefix: int = SUB_PREFIX) -> EntryList:
        """The fine sub-chunk list of mid ``mid`` of a leaf."""
        data = self.leaf_bytes(leaf)
        if self._mids is None or self._mids[0] != leaf:  # (a want names a leaf's mids in turn)
            self._mids = (leaf, subchunks.spans(data, MID_PARAMS))
        cuts = self._mids[1]
        if not 0 <= mid < len(cuts):
            raise ValueError(f"leaf {leaf} has {len(cuts)} mids, not {mid + 1}")
        start, end = cuts[mid]
        return split_list(memoryview(data)[start:end], FINE_PARAMS, prefix)

    def data(self, leaf: int, start: int, length: int) -> bytes:
        """``length`` bytes of a leaf from ``start``."""
        data = self.leaf_bytes(leaf)
        if not (start >= 0 and length > 0 and start + length <= len(data)):
            raise ValueError(f"bytes {start}+{length} are not in leaf {leaf}")
        return data[start : start + length]

    def item(self, item: tuple) -> bytes:
        """What answers one item of a ``fetch`` want: the bytes, or, for an item with the
        block hashes and length of the old bytes it replaces (a fourth and fifth element),
        the ops that rebuild the bytes from those old bytes."""
        data = self.data(*item[:3])
        return refine.encode(data, item[3], item[4]) if len(item) == 5 else data


class SourceChanged(OSError):
    """The source file no longer matches the signature being served."""


# ---------------------------------------------------------------- in memory


@dataclass
class DeltaReport:
    literal_bytes: int = 0
    matched_bytes: int = 0
    signature_bytes: int = 0  # entry lists from the source, per level below
    request_bytes: int = 0  # everything the target sent
    offer_bytes: int = 0
    data_message_bytes: int = 0  # literal data with its framing
    round_trips: int = 0
    refined_bytes: int = 0  # of literal ranges, rebuilt from old blocks (rdc.content.refine)
    false_matches: int = 0  # refined ranges rebuilt wrong (a block hash matched by chance)
    have: bool = False
    signature_bytes_by_level: dict[str, int] = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        return (
            self.offer_bytes + self.request_bytes + self.signature_bytes + self.data_message_bytes
        )

    def add(self, other: DeltaReport) -> None:
        for name in (
            "literal_bytes",
            "matched_bytes",
            "signature_bytes",
            "request_bytes",
            "offer_bytes",
            "data_message_bytes",
            "refined_bytes",
            "false_matches",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.round_trips = max(self.round_trips, other.round_trips)
        for level, n in other.signature_bytes_by_level.items():
            self.signature_bytes_by_level[level] = self.signature_bytes_by_level.get(level, 0) + n


def simulate(
    source: SourceFile,
    seeds: SeedMap,
    have_root: bool,
    sketch: bytes | None = None,
    inline_subs: bool = False,
    short: bool = True,
) -> tuple[Plan, DeltaReport, list[bytes]]:
    """Run one file's exchange in memory; count what each side would send (messages as
    they travel, without frames); ``short`` as for `target_descent`. Returns the plan, the
    report and the literal data (the whole file when the plan is ``whole``, else one item
    per fetch item)."""
    report = DeltaReport()
    offer = source.offer(sketch, inline_subs)
    report.offer_bytes = wire_size(offer)
    report.round_trips = 1
    steps = target_descent(offer, seeds, have_root, short)
    reply = None

    def ask(request: Message) -> None:
        report.request_bytes += wire_size(request)
        report.round_trips += 1

    try:
        while True:
            request = steps.send(reply)
            ask(request)
            reply = source.lists(request)
            size = wire_size(Lists(lists=reply))
            report.signature_bytes += size
            key = (
                "sub" if isinstance(request, WantSubs | WantFine)
                else f"level {request.nodes[0][0] - 1}"
            )
            report.signature_bytes_by_level[key] = (
                report.signature_bytes_by_level.get(key, 0) + size
            )
    except StopIteration as done:
        plan: Plan = done.value
    literal: list[bytes] = []
    copies: list[int] = []  # per item: bytes a refined item took from old blocks
    if plan.whole:
        ask(WantWhole())
        literal = [source.read(0, source.tree.size)]
        report.data_message_bytes += wire_size(Data(d=literal, end=True))
    elif not plan.have:
        for batch in plan.fetch_batches():
            items = [plan.fetch[i].wire() for i in batch]
            ask(WantFetch(items=items))
            pieces = [source.item(item) for item in items]
            report.data_message_bytes += wire_size(Data(d=pieces, end=True))
            for i, piece in zip(batch, pieces, strict=True):
                data, copied = unrefine(plan.fetch[i], piece, seeds)
                plain = plan.fetch[i].wire()[:3]
                if copied and data != source.data(*plain):  # a block hash matched by chance:
                    report.false_matches += 1  # the target's check fails, it asks plain
                    ask(WantFetch(items=[plain]))
                    data, copied = source.data(*plain), 0
                    report.data_message_bytes += wire_size(Data(d=[data], end=True))
                literal.append(data)
                copies.append(copied)
        plan = _leaves_checked(plan, seeds, literal, copies, source, report, ask)
    report.have = plan.have
    report.refined_bytes = sum(copies)
    report.literal_bytes = (plan.size - plan.matched_bytes() - report.refined_bytes
                            if plan.pieces else plan.literal_bytes())
    report.matched_bytes = plan.matched_bytes() + report.refined_bytes
    return plan, report, literal


def _leaves_checked(plan: Plan, seeds: SeedMap, literal: list[bytes], copies: list[int],
                    source: SourceFile, report: DeltaReport,
                    ask: Callable[[Message], None]) -> Plan:
    """The target's leaf checks: a leaf rebuilt from sub-chunks whose hash does not match
    (a sub-chunk prefix named the wrong old bytes) is fetched whole, as `rdc.transfer.target`
    does; its pieces become one literal piece, its refined items no longer count."""
    pieces = plan.pieces
    for leaf, offset, length, key in plan.checks:
        inside = [p for p in pieces if offset <= p.offset < offset + length]
        data = b"".join(seeds.seeds[p.seed].read(p.seed_offset, p.length) if p.seed >= 0
                        else literal[p.item] for p in inside)
        if chunk_hash(data).startswith(key):
            continue
        report.false_matches += 1
        ask(WantFetch(items=[(leaf, 0, length)]))
        whole = source.data(leaf, 0, length)
        report.data_message_bytes += wire_size(Data(d=[whole], end=True))
        for p in inside:
            if p.seed < 0:
                copies[p.item] = 0
        literal.append(whole)
        pieces = [p for p in pieces if not offset <= p.offset < offset + length]
        pieces.append(Piece(offset=offset, length=length, item=len(literal) - 1))
        pieces.sort(key=lambda p: p.offset)
    if pieces is not plan.pieces:
        plan = replace(plan, pieces=pieces)
    return plan


def unrefine(item: FetchItem, piece: bytes, seeds: SeedMap) -> tuple[bytes, int]:
    """An item's bytes from what answered it, and how many came from old blocks; ValueError
    for an answer that does not fit."""
    if item.old is None:
        return piece, 0
    seed, begin, size = item.old
    old = seeds.seeds[seed].read(begin, size)
    if len(old) != size:
        raise SeedChanged("a seed file is shorter than its signature")
    return refine.decode(piece, old, item.length)


class SeedChanged(OSError):
    """A seed file changed between planning and copying."""


def rebuild(plan: Plan, seeds: SeedMap, literal: list[bytes], check_root: bool = True
            ) -> bytes:
    """The new file's bytes from a plan and its literal data (the target's assembly, in
    memory); raises ValueError if anything does not check out (the root too, unless the
    caller checks it with the signature it makes anyway: not ``check_root``)."""
    if plan.whole:
        out = bytearray(b"".join(literal))
    else:
        out = bytearray()
        for piece in plan.pieces:
            if piece.offset != len(out):
                raise ValueError("plan pieces do not tile the file")
            if piece.seed >= 0:
                data = seeds.seeds[piece.seed].read(piece.seed_offset, piece.length)
            else:
                data = literal[piece.item]
            if len(data) != piece.length:
                raise ValueError("a piece is shorter or longer than planned")
            out += data
        for _, offset, length, key in plan.checks:
            if not chunk_hash(out[offset : offset + length]).startswith(key):
                raise ValueError(f"leaf at {offset} rebuilt from sub-chunks fails its check")
    if check_root and plan.root and not same_root(signature_of_bytes(bytes(out)).root,
                                                   plan.root):
        raise ValueError("the rebuilt file does not have the offered root")
    return bytes(out)
