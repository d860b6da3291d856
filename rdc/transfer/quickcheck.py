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
# Where they are less alike, stamp roots still pay if the files the two sides have at
# the same path are nearly all of them (this share of the paths or more) and nearly none
# of those differs in time alone (at most this share): their stamps then differ where
# their content does, which a sync reads either way, and nothing else is read. (A tree
# with small edits in 15% of its files: every edited file changed size; Django 5.0.6 and
# 5.0.7 unpacked: 23% of their files differ in time alone; 20% of a tree renamed: 67% of
# the paths in common, and renamed files need the seeds a cold side finds only by reading.)
PATHS_FROM = 0.95
TOUCHED_AT_MOST = 0.05
BINS = m.STAMP_BINS  # one-permutation MinHash: the smallest hash value in each of these
EMPTY = 0xFFFFFFFF  # a bin no file fell in
SUBSAMPLE = 4  # one path in this many (by a hash of the path alone) is in the sketch
_ITEM = struct.Struct("<Qq")
_BINS = struct.Struct(f"<{BINS}I")
_TAG = struct.Struct("<q")
_PATH_BINS = struct.Struct(f"<{BINS}I{BINS}H{BINS}H")
NO_FILES = _BINS.pack(*[EMPTY] * BINS)  # the sketch of no file


def sketches(files: Iterable[tuple[str, int, int]]) -> tuple[bytes, bytes]:
    """Two MinHash sketches of ``files``, over the paths that `SUBSAMPLE` picks (the same
    on both sides), for 4 KiB of hashing a 1,000 files and no read of any:

    - of the set of their (path, size, time): 4 bytes a bin; two tell how much of the
      two sets is common (`similarity`);
    - of the set of their paths, each bin with 2-byte tags of the size and the time of
      the file whose path it holds: 8 bytes a bin; two tell how many paths both sides
      have and, of those, how many differ in time alone (`path_likeness`)."""
    mins = [EMPTY] * BINS
    paths = [EMPTY] * BINS
    sizes = [0] * BINS
    times = [0] * BINS
    for path, size, mtime in files:
        raw = path.encode("utf-8", "surrogateescape")  # (os.fsencode, on Linux)
        if zlib.crc32(raw) % SUBSAMPLE:
            continue
        h = int.from_bytes(hashlib.blake2b(raw + _ITEM.pack(size, mtime), digest_size=8,
                                           person=b"rdc stamps").digest(), "little")
        b, v = h % BINS, (h >> 32) % EMPTY
        if v < mins[b]:
            mins[b] = v
        h = int.from_bytes(hashlib.blake2b(raw, digest_size=8, person=b"rdc paths").digest(),
                           "little")
        b, v = h % BINS, (h >> 32) % EMPTY
        if v < paths[b]:
            paths[b] = v
            sizes[b] = zlib.crc32(_TAG.pack(size)) & 0xFFFF
            times[b] = zlib.crc32(_TAG.pack(mtime)) & 0xFFFF
    return _BINS.pack(*mins), _PATH_BINS.pack(*paths, *sizes, *times)


def walk_sketch(walked: Walk, limit: int) -> tuple[bytes, bytes]:
    """`sketches` of a walk's regular files modified before ``limit`` (racy ones say
    nothing by their stamps)."""
    return sketches((path, seen.st_size, seen.st_mtime_ns)
                    for path, seen in walked.files.items() if seen.st_mtime_ns < limit)


def tree_sketch(tree: Entry, limit: int) -> tuple[bytes, bytes]:
    """`sketches` of a tree's regular files (as `walk_sketch`)."""
    return sketches((path, entry.size, entry.mtime_ns)
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


def path_likeness(a: bytes, b: bytes) -> tuple[float, float] | None:
    """From two paths sketches (`sketches`): the share of the union of the two sets of
    paths that both have, and of those, the share whose files have the same size and
    another time (estimated from the bins where both hold the same path); None if neither
    filled a bin or no path is common."""
    x, y = _PATH_BINS.unpack(a), _PATH_BINS.unpack(b)
    filled = same = touched = 0
    for k in range(BINS):
        if x[k] == EMPTY and y[k] == EMPTY:
            continue
        filled += 1
        if x[k] != y[k]:
            continue
        same += 1
        touched += x[BINS + k] == y[BINS + k] and x[2 * BINS + k] != y[2 * BINS + k]
    return (same / filled, touched / same) if same else None


def stamps_tell(mine: tuple[bytes, bytes], theirs: bytes, cold: bool,
                their_paths: bytes | None = None) -> bool:
    """Whether to sync by stamp roots, on the server (``mine``: its `sketches`, ``cold``:
    its index is) given the client's sketch (and its paths sketch, if it sent one): where
    both sets of stamps are alike, or nearly all paths are on both sides and their stamps
    differ only where their sizes do (`PATHS_FROM`), or the client has no file (nothing to
    tell apart) and this side would read all of its own."""
    if theirs == NO_FILES:
        return cold
    if (similarity(mine[0], theirs) or 0.0) >= SIMILAR_FROM:
        return True
    likeness = None if their_paths is None else path_likeness(mine[1], their_paths)
    return likeness is not None and likeness[0] >= PATHS_FROM and likeness[1] <= TOUCHED_AT_MOST
