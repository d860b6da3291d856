"""Every format parameter: what both sides of a transfer (and every index) must share,
because chunk boundaries, tree nodes, sketches, hash prefixes and directory hashes depend
on it. `FORMAT` names them all; the handshake compares it, so a peer built with other
parameters is told so instead of failing every file at the root check.

docs/formats.md says how each value was chosen.
"""

from __future__ import annotations

from rdc._native import constants as _native
from rdc._native.constants import check_limits
from rdc.records import record

MAX_CHUNK_LIMIT = _native.MAX_CHUNK_LIMIT  # the largest chunk any parameters allow


@record
class ChunkParams:
    """Winnowing parameters (DESIGN.md section 1).

    ``window``: bytes behind each position that its key depends on (16, 32 or 64: the lead
    hash is a 64-bit gear shifted by 64 / window bits per byte, so it forgets exactly
    ``window`` bytes back). Chunks are between ``min_size + 1`` and ``max_size`` bytes, but
    for the last chunk of a file, which may be shorter.
    """

    window: int = 32
    min_size: int = 4096
    max_size: int = 12288

    def __post_init__(self) -> None:
        check_limits(self.window, self.min_size, self.max_size)

    @property
    def shift(self) -> int:
        """Bits the gear state moves per byte."""
        return 64 // self.window

    def __str__(self) -> str:
        return f"{self.window}/{self.min_size}/{self.max_size}"


@record
class GroupParams:
    """Group sizes of the tree's recursion: between ``min_entries + 1`` and
    ``max_entries`` entries, but for the last group of a level."""

    min_entries: int = 4
    max_entries: int = 12

    def __post_init__(self) -> None:
        if not 1 <= self.min_entries < self.max_entries <= 4096:
            raise ValueError("need 1 <= min_entries < max_entries <= 4096")

    def __str__(self) -> str:
        return f"{self.min_entries}/{self.max_entries}"


# Chunks: about 8.4 KiB on average.
DEFAULT_CHUNKS = ChunkParams()
DEFAULT_GROUPS = GroupParams()
# Sub-chunks: the level below the leaves, computed only where a chunk is unknown (and for
# the sketches of small files): *fine* pieces of about 180 bytes, cut within *mids* of
# about 1.3 KB.
SUB_PARAMS = ChunkParams(window=16, min_size=48, max_size=320)
MID_PARAMS = ChunkParams(window=16, min_size=512, max_size=2048)
FINE_PARAMS = SUB_PARAMS
# A file of fewer chunks than this is sketched over its sub-chunks.
SKETCH_MIN_LEAVES = 8


@record
class SignatureParams:
    chunks: ChunkParams = DEFAULT_CHUNKS
    groups: GroupParams = DEFAULT_GROUPS
    sub_chunks: ChunkParams = SUB_PARAMS


DEFAULT_SIGNATURE = SignatureParams()

# Hash prefixes per entry on the wire: tree entries, and mid and fine sub-chunks (which
# are looked up within one seed region only).
WIRE_PREFIX = 8
SUB_PREFIX = 4
# ... of a listing's entries and of metadata hashes between peers with the feature
# "short-digests": a differing entry taken for the same is one in 2**40, and is caught at
# the end anyway (the roots differ: the sync compares again with whole hashes). Where most
# of a listing's entries travel whole (a renamed tree), 3 bytes an entry is 7% of the sync.
SHORT_WIRE_PREFIX = 5
# ... and of a file's root in a batch's offer ("short-digests" too). The receiver checks
# what it writes against it (a wrong file passing is one in 2**128), computes the whole
# root from the bytes it wrote, and the whole roots are compared at the end; a batch of
# small edited files saves 16 bytes a file (a third of an offer).
OFFER_ROOT = 16
# Below the fine pieces (rdc.content.refine): a literal range is described against the old
# bytes it replaces, in blocks of this many bytes, each named by a hash of this many bytes.
REFINE_BLOCK = 32
REFINE_HASH = 2

# BLAKE3 key-derivation contexts: a node hash never equals a chunk hash, and the three
# directory hashes never equal each other.
NODE_CONTEXT = "rdc 2026-11 merkle tree node v1"
CONTENT_CONTEXT = "rdc 2026-11 directory content v2"
META_CONTEXT = "rdc 2026-11 directory meta v2"
SYNC_META_CONTEXT = "rdc 2026-11 directory sync meta v1"
LISTING_CONTEXT = "rdc 2026-11 listing entry fingerprint v1"
STAMP_ROOT_CONTEXT = "rdc 2026-11 stamp root v1"


def describe(params: SignatureParams = DEFAULT_SIGNATURE) -> str:
    """Every format parameter, as ``name=value`` words: two peers (or an index and this
    rdc) agree on the format exactly when these strings are equal."""
    return " ".join([
        f"chunks={params.chunks}", f"groups={params.groups}", f"subs={params.sub_chunks}",
        f"mids={MID_PARAMS}", f"fines={FINE_PARAMS}", f"sketch-small={SKETCH_MIN_LEAVES}",
        f"prefixes={WIRE_PREFIX}/{SUB_PREFIX}", f"refine={REFINE_BLOCK}/{REFINE_HASH}",
        f"sketch={_native.TRAITS}x{_native.TRAIT_BITS}/{_native.SKETCH_SEED:x}",
        f"rabin={_native.POLY_Q:x}", f"gear={_native.GEAR_SEED:x}",
        "tree=v1", "dirs=v2",
    ])


FORMAT = describe()


def mismatch(mine: str, theirs: str) -> str:
    """What differs between two `describe` strings, for an error message."""
    a, b = dict(w.partition("=")[::2] for w in mine.split()), dict(
        w.partition("=")[::2] for w in theirs.split()
    )
    parts = [f"{k} {a.get(k, '-')} here, {b.get(k, '-')} there"
             for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    return "; ".join(parts) or "none"
