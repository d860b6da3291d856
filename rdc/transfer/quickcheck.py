"""Whether a sync goes by stamp roots (`rdc.local.stamproots`): the client's sample and the
server's judgement of it (docs/protocol.md, ``stamps``).

Stamp roots pay where most files that are on both sides have the same size and time on
both (a tree copied by rsync ``-a``, ``cp -a``, or an earlier sync, then edited here and
there): the comparison then skips what stat says is in step, as rsync does, and nothing
else is read. Where most differ in time (two releases unpacked from their archives, a
tree copied without its times), every such file would be listed and offered, where
content roots find most of them equal: there the sync reads, as it would without. Which
case it is, sketches of both sides' sets of (path, size, time) say.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from collections.abc import Iterable

from rdc.local.snapshot import Entry, Walk, iter_files
from rdc.wire import messages as m

STAMP_ROOTS = "stamp-roots"  # the handshake feature
# A client with a warm index offers stamps too: where the server's index is cold, it would
# read every file of the share to compare content (a share filled by rsync, or its state
# lost), when the two trees may be copies with the same times.
WARM_STAMPS = "warm-stamps"
# Stamp roots are taken where the two sides' sets of (path, size, time) of their files
# are at least this similar (Jaccard): about 8% of the files both have differ in stamp.
# (Django 5.0.6 and 5.0.7 unpacked differ in 23%, in 34 files of content: listing and
# offering the other 1,557 by stamp was 4.6 times the bytes.)
SIMILAR_FROM = 0.85
BINS = m.STAMP_BINS  # one-permutation MinHash: the smallest hash value in each of these
EMPTY = 0xFFFFFFFF  # a bin no file fell in
SUBSAMPLE = 4  # one path in this many (by a hash of the path alone) is in the sketch
_ITEM = struct.Struct("<Qq")
_BINS = struct.Struct(f"<{BINS}I")
NO_FILES = _BINS.pack(*[EMPTY] * BINS)  # the sketch of no file


def stamp_sketch(files: Iterable[tuple[str, int, int]]) -> bytes:
    """A MinHash sketch of the set of (path, size, time) of ``files``, over the paths
    that `SUBSAMPLE` picks (the same on both sides): 4 bytes a bin. Two sketches tell
    how much of the two sets is common (`similarity`) for 4 KiB of hashing a 1,000 files,
    not a read of any."""
    mins = [EMPTY] * BINS
    for path, size, mtime in files:
        raw = path.encode("utf-8", "surrogateescape")  # (os.fsencode, on Linux)
        if zlib.crc32(raw) % SUBSAMPLE:
            continue
        h = int.from_bytes(hashlib.blake2b(raw + _ITEM.pack(size, mtime), digest_size=8,
                                           person=b"rdc stamps").digest(), "little")
        b, v = h % BINS, (h >> 32) % EMPTY
        if v < mins[b]:
            mins[b] = v
    return _BINS.pack(*mins)


def walk_sketch(walked: Walk, limit: int) -> bytes:
    """`stamp_sketch` of a walk's regular files modified before ``limit`` (racy ones
    say nothing by their stamps)."""
    return stamp_sketch((path, seen.st_size, seen.st_mtime_ns)
                        for path, seen in walked.files.items() if seen.st_mtime_ns < limit)


def tree_sketch(tree: Entry, limit: int) -> bytes:
    """`stamp_sketch` of a tree's regular files (as `walk_sketch`)."""
    return stamp_sketch((path, entry.size, entry.mtime_ns)
                        for _, _, entry, path in iter_files(tree) if entry.mtime_ns < limit)


def similarity(a: bytes, b: bytes) -> float | None:
    """The share of the union of two sketched sets that both have (Jaccard), estimated
    from the bins either filled; None if neither filled any."""
    x, y = _BINS.unpack(a), _BINS.unpack(b)
    filled = same = 0
    for p, q in zip(x, y, strict=True):
        if p == EMPTY and q == EMPTY:
            continue
        filled += 1
        same += p == q
    return same / filled if filled else None


def stamps_tell(mine: bytes, theirs: bytes, cold: bool) -> bool:
    """Whether to sync by stamp roots, on the server (``mine``: its sketch, ``cold``: its
    index is) given the client's sketch: where both sets of stamps are alike, or the
    client has no file (nothing to tell apart) and this side would read all of its own."""
    if theirs == NO_FILES:
        return cold
    return (similarity(mine, theirs) or 0.0) >= SIMILAR_FROM
