"""Which stored chunk a new chunk resembles: its sketch (12 traits of 6 bits over its
sub-chunks, as rdc sketches a small file) and three super-features of four traits each,
the keys of an exact-match inverted index (Shilane et al., FAST 2012; Finesse, FAST 2019).

A bucket per single trait (as the signature index keeps for files) holds 1/64 of all
chunks, so a query over a repository of 10^6 chunks would count 10^5 rows; a
super-feature bucket holds 1/2^24 of them. Two chunks of Jaccard similarity J share a
super-feature with probability 1 - (1 - p^4)^3, p = (63 J + 1) / 64: 0.96 at J = 0.9,
0.58 at J = 0.7, 0.19 at J = 0.5.
"""

from __future__ import annotations

from rdc import _native
from rdc.content.chunking import boundaries
from rdc.content.sketch import matching_traits
from rdc.params import SUB_PARAMS

FEATURES = 3
TRAITS_PER_FEATURE = 4
# Candidates must share this many traits of 12: chance alone gives 4 with probability
# 3e-5, so few false candidates get as far as a trial delta.
MIN_TRAITS = 4
# Chunks smaller than this are not worth a sketch (a delta saves at most their size).
MIN_SKETCHED = 256


def chunk_sketch(data: bytes | memoryview) -> bytes | None:
    """The sketch of a chunk over its sub-chunks; None for a chunk too small to bother."""
    if len(data) < MIN_SKETCHED:
        return None
    ends = boundaries(data, SUB_PARAMS)
    hashes, _ = _native.hash_chunks(data, ends)
    return _native.sketch(hashes)


def features(sketch: bytes, kind: int = 0) -> list[int]:
    """The super-feature keys of a sketch of a blob of ``kind``: feature ``i`` is
    ``(kind * 3 + i) << 24`` and its four traits (blobs of two kinds never meet)."""
    keys = []
    for i in range(FEATURES):
        value = kind * FEATURES + i
        for trait in sketch[i * TRAITS_PER_FEATURE : (i + 1) * TRAITS_PER_FEATURE]:
            value = value << 6 | trait
        keys.append(value)
    return keys


def node_sketch(child_hashes: bytes) -> bytes | None:
    """The sketch of a tree node over its children's hashes: a node of an edited file
    differs from its old version in one or two children of about eight."""
    return _native.sketch(child_hashes)


def rank(sketch: bytes, candidates: list[tuple[bytes, bytes, int]], max_depth: int
         ) -> list[tuple[int, bytes, int]]:
    """Candidates as (traits shared, storage id, depth), best first, keeping those that
    share at least MIN_TRAITS and whose depth leaves room for one more delta."""
    scored = [(matching_traits(sketch, other), sid, depth)
              for sid, other, depth in candidates if depth < max_depth]
    scored = [s for s in scored if s[0] >= MIN_TRAITS]
    scored.sort(key=lambda s: (-s[0], s[2]))
    return scored
