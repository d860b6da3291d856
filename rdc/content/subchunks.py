"""Below the leaves: an unknown chunk is split again, content-defined, in two steps.

First into *mid* pieces of about 1.3 KB; the target looks those up in the seed region
around the chunk; then only the mids it did not find are split into *fine* sub-chunks of
about 180 bytes, looked up the same way. A small edit in an 8 KB chunk so costs a mid list
(~40 bytes) and one fine list (~40 bytes) instead of one list of all its fine sub-chunks
(~240 bytes), for one more round trip (which overlaps other files' traffic). Fine
sub-chunks are cut within their mid, so both sides cut the same bytes the same way.

Lists travel as hash prefixes (looked up only within one seed region, by prefix and
length, and every leaf rebuilt from them is checked against its 8-byte prefix) and the
lengths of all but the last piece, each as its excess over ``min_size + 1``; the last is
what remains. A prefix is SUB_PREFIX (4) bytes, or as many as the target asks for
(`prefix_for`: 2 for the few pieces of a small file's region, where a byte less per piece
saves more than the rare false match costs).
"""

from __future__ import annotations

from dataclasses import dataclass

from rdc import _native
from rdc.content.chunking import boundaries
from rdc.content.entries import pack_varints, unpack_varints
from rdc.content.tree import HASH_BYTES
from rdc.params import FINE_PARAMS, MID_PARAMS, SUB_PREFIX, ChunkParams

# An unknown mid smaller than this is fetched whole rather than split again.
FINE_FROM = 256
# The prefix lengths a target may ask lists in (the feature "short-prefixes").
SHORT_PREFIXES = (2, 3, SUB_PREFIX)


def spans(data: bytes | memoryview, params: ChunkParams) -> list[tuple[int, int]]:
    """(start, end) of each piece of ``data``."""
    ends = boundaries(data, params)
    return list(zip([0, *ends[:-1]], ends, strict=True))


def prefixes(data: bytes | memoryview, ends: list[int], start: int = 0,
             prefix: int = SUB_PREFIX) -> list[bytes]:
    """The hash prefix of each piece of ``data`` ending at ``ends``, the first at ``start``."""
    hashes = _native.hash_chunks(data, ends, start)[0]
    return [hashes[i : i + prefix] for i in range(0, len(hashes), HASH_BYTES)]


def prefix_for(pieces: int, params: ChunkParams, refetch: int) -> int:
    """The prefix length at which a list looked up among ``pieces`` seed pieces costs the
    fewest bytes expected: each byte less saves one per listed piece, but a listed piece
    then names other seed bytes of its length with a chance of ``pieces`` in 256**p times
    the spread of lengths, and such a false match costs a refetch of ``refetch`` bytes (the
    leaf, whose check finds it)."""
    spread = params.max_size - params.min_size
    return min(SHORT_PREFIXES,
               key=lambda p: p + pieces * refetch / (256**p * spread))


def pieces_in(size: int, params: ChunkParams) -> int:
    """About how many pieces ``size`` bytes are cut into (for `prefix_for`)."""
    return size // ((params.min_size + params.max_size) // 2) + 1


def encode(data: bytes | memoryview, params: ChunkParams, prefix: int = SUB_PREFIX
           ) -> tuple[bytes, bytes]:
    """The list of ``data``'s pieces as it travels: (prefixes, lengths)."""
    view = memoryview(data)
    ends = boundaries(view, params)
    keys = b"".join(prefixes(view, ends, prefix=prefix))
    base = params.min_size + 1
    return keys, pack_varints([e - s - base for s, e in zip([0, *ends], ends[:-1], strict=False)])


def decode(
    prefixes: bytes, lengths: bytes, total: int, params: ChunkParams, prefix: int = SUB_PREFIX
) -> list[tuple[bytes, int]]:
    """(prefix, length) of the pieces of ``total`` bytes; ValueError unless they add up."""
    if not prefixes or len(prefixes) % prefix:
        raise ValueError("sub-chunk prefix list is empty or has a partial entry")
    count = len(prefixes) // prefix
    base = params.min_size + 1
    excess = unpack_varints(lengths, count - 1, params.max_size - base)
    sizes = [base + e for e in excess]
    last = total - sum(sizes)
    if not 0 < last <= params.max_size:
        raise ValueError("sub-chunk list does not cover its chunk")
    sizes.append(last)
    return [(prefixes[i * prefix : (i + 1) * prefix], n) for i, n in enumerate(sizes)]


class Pieces:
    """One kind of piece of a seed region: found by (hash prefix, length), where the
    first piece with both is taken; an index per prefix length, made when first asked."""

    def __init__(self, hashes: bytes, offsets: list[int], lengths: list[int]) -> None:
        self.hashes = hashes
        self.offsets = offsets
        self.lengths = lengths
        self._by: dict[int, dict[tuple[bytes, int], int]] = {}

    def __len__(self) -> int:
        return len(self.offsets)

    def find(self, key: bytes, length: int) -> int | None:
        """The seed offset of a piece whose hash starts with ``key`` and whose length is
        ``length``, if the region has one."""
        by = self._by.get(len(key))
        if by is None:
            by = self._by[len(key)] = {}
            p = len(key)
            for i, (offset, n) in enumerate(zip(self.offsets, self.lengths, strict=True)):
                by.setdefault((self.hashes[i * HASH_BYTES : i * HASH_BYTES + p], n), offset)
        return by.get((key, length))


@dataclass
class RegionIndex:
    """Mid and fine pieces of a seed region, found by hash prefix and length: their
    offsets in the seed."""

    seed: int
    mids: Pieces
    fines: Pieces


def _pieces(view: memoryview, start: int, ends: list[int]) -> Pieces:
    if not ends:  # no bytes (a seed that read as empty: gone since it was chosen)
        return Pieces(b"", [], [])
    starts = [0, *ends[:-1]]
    hashes = _native.hash_chunks(view, ends)[0]
    return Pieces(hashes, [start + s for s in starts],
                   [e - s for s, e in zip(starts, ends, strict=True)])


def index_region(seed: int, start: int, data: bytes) -> RegionIndex:
    """Cut seed bytes ``data`` (at ``start`` in seed ``seed``) into mids, and each mid into
    fine pieces, as a source cuts an unknown chunk."""
    view = memoryview(data)
    mid_ends = boundaries(view, MID_PARAMS)
    fine_ends: list[int] = []  # of all mids: each mid's fine pieces end at its own end
    for s, e in zip([0, *mid_ends], mid_ends, strict=False):
        fine_ends += [s + end for end in boundaries(view[s:e], FINE_PARAMS)]
    return RegionIndex(seed, _pieces(view, start, mid_ends),
                       _pieces(view, start, fine_ends))
