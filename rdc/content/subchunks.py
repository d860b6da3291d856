"""Below the leaves: an unknown chunk is split again, content-defined, in two steps.

First into *mid* pieces of about 1.3 KB; the target looks those up in the seed region
around the chunk; then only the mids it did not find are split into *fine* sub-chunks of
about 180 bytes, looked up the same way. A small edit in an 8 KB chunk so costs a mid list
(~40 bytes) and one fine list (~40 bytes) instead of one list of all its fine sub-chunks
(~240 bytes), for one more round trip (which overlaps other files' traffic). Fine
sub-chunks are cut within their mid, so both sides cut the same bytes the same way.

Lists travel as 4-byte hash prefixes (looked up only within one seed region, and every
leaf rebuilt from them is checked against its 8-byte prefix) and the lengths of all but
the last piece, each as its excess over ``min_size + 1``; the last is what remains.
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


def spans(data: bytes | memoryview, params: ChunkParams) -> list[tuple[int, int]]:
    """(start, end) of each piece of ``data``."""
    ends = boundaries(data, params)
    return list(zip([0, *ends[:-1]], ends, strict=True))


def prefixes(data: bytes | memoryview, ends: list[int], start: int = 0) -> list[bytes]:
    """The hash prefix of each piece of ``data`` ending at ``ends``, the first at ``start``."""
    hashes = _native.hash_chunks(data, ends, start)[0]
    return [hashes[i : i + SUB_PREFIX] for i in range(0, len(hashes), HASH_BYTES)]


def encode(data: bytes | memoryview, params: ChunkParams) -> tuple[bytes, bytes]:
    """The list of ``data``'s pieces as it travels: (prefixes, lengths)."""
    view = memoryview(data)
    ends = boundaries(view, params)
    keys = b"".join(prefixes(view, ends))
    base = params.min_size + 1
    return keys, pack_varints([e - s - base for s, e in zip([0, *ends], ends[:-1], strict=False)])


def decode(
    prefixes: bytes, lengths: bytes, total: int, params: ChunkParams
) -> list[tuple[bytes, int]]:
    """(prefix, length) of the pieces of ``total`` bytes; ValueError unless they add up."""
    if not prefixes or len(prefixes) % SUB_PREFIX:
        raise ValueError("sub-chunk prefix list is empty or has a partial entry")
    count = len(prefixes) // SUB_PREFIX
    base = params.min_size + 1
    excess = unpack_varints(lengths, count - 1, params.max_size - base)
    sizes = [base + e for e in excess]
    last = total - sum(sizes)
    if not 0 < last <= params.max_size:
        raise ValueError("sub-chunk list does not cover its chunk")
    sizes.append(last)
    return [(prefixes[i * SUB_PREFIX : (i + 1) * SUB_PREFIX], n) for i, n in enumerate(sizes)]


@dataclass
class RegionIndex:
    """Mid and fine pieces of a seed region by hash prefix: their offsets in the seed."""

    seed: int
    mids: dict[bytes, int]
    fines: dict[bytes, int]


def index_region(seed: int, start: int, data: bytes) -> RegionIndex:
    """Cut seed bytes ``data`` (at ``start`` in seed ``seed``) into mids, and each mid into
    fine pieces, as a source cuts an unknown chunk."""
    view = memoryview(data)
    mids: dict[bytes, int] = {}
    fines: dict[bytes, int] = {}
    mid_ends = boundaries(view, MID_PARAMS)
    fine_ends: list[int] = []  # of all mids: each mid's fine pieces end at its own end
    for s, e in zip([0, *mid_ends], mid_ends, strict=False):
        fine_ends += [s + end for end in boundaries(view[s:e], FINE_PARAMS)]
    for key, s in zip(prefixes(view, mid_ends), [0, *mid_ends], strict=False):
        mids.setdefault(key, start + s)
    for key, s in zip(prefixes(view, fine_ends), [0, *fine_ends], strict=False):
        fines.setdefault(key, start + s)
    return RegionIndex(seed, mids, fines)
