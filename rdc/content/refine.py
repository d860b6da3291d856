"""Below the fine sub-chunks: a literal range described against the old bytes it replaces.

A few changed bytes cost a whole fine sub-chunk (~180 bytes) of literal plus the neighbour
it disturbs. Where the target knows which old bytes the range replaces (the seed bytes
between its matched neighbours), it sends, with the fetch it makes anyway, a short hash of
each REFINE_BLOCK-byte block of those old bytes (a grid from their start, plus one block
ending at their end). The source answers the range as *ops*: literal runs and runs of old
blocks, found by sliding over the new bytes (rsync's search, within one small region), so
that only the bytes that really changed travel. It costs no round trip of its own.

The hashes are short (REFINE_HASH bytes: a false match is about one in 65,000 lookups);
every range rebuilt this way lies in a leaf that is checked against its hash, or in a file
checked against its root, and the target fetches that leaf or file again when a check
fails.

Ops as they travel, repeated until the range is covered: varint literal length L, L
bytes, varint run length R (blocks; 0 ends the ops), and for R > 0 a varint first block K:
blocks K .. K+R-1 of the old bytes, in that order.
"""

from __future__ import annotations

from rdc._native import refine_encode, refine_ref
from rdc.content.entries import read_varint
from rdc.params import REFINE_BLOCK, REFINE_HASH

# Old bytes longer than this are not refined against (the hashes would cost more than a
# small edit saves, and a request stays small).
REFINE_LIMIT = 16 << 10
# A literal range shorter than this goes as it is.
REFINE_FROM = 64
MAX_HASHES = REFINE_HASH * (REFINE_LIMIT // REFINE_BLOCK + 1)


def block_starts(size: int) -> list[int]:
    """Where the blocks of ``size`` old bytes start: a grid of REFINE_BLOCK from 0, and one
    block ending at ``size`` when the grid leaves a remainder."""
    return refine_ref.block_starts(size, REFINE_BLOCK)


def block_hashes(old: bytes | memoryview) -> bytes:
    """The hashes of the blocks of ``old`` (`block_starts`), concatenated."""
    view = memoryview(old)
    return b"".join(refine_ref.key(view[s : s + REFINE_BLOCK], REFINE_HASH)
                    for s in block_starts(len(view)))


def worth_refining(new_length: int, old_length: int) -> bool:
    """Whether a literal range of ``new_length`` bytes replacing ``old_length`` old bytes
    is worth describing: long enough, and of a size that an edit (not a rewrite) leaves."""
    return (new_length >= REFINE_FROM and REFINE_BLOCK <= old_length <= REFINE_LIMIT
            and old_length <= 2 * new_length + REFINE_BLOCK
            and new_length <= 2 * old_length + REFINE_BLOCK)


def encode(new: bytes | memoryview, hashes: bytes, old_length: int) -> bytes:
    """``new`` as ops against the blocks of ``old_length`` old bytes whose hashes are
    ``hashes`` (the source's side; `rdc._native.refine_ref.encode` has the rule for when a
    short hash is trusted). ValueError if the hashes are not one per block of at most
    REFINE_LIMIT old bytes."""
    return refine_encode(new, hashes, old_length, REFINE_BLOCK, REFINE_HASH, REFINE_LIMIT)


def decode(ops: bytes, old: bytes | memoryview, length: int) -> tuple[bytes, int]:
    """The range rebuilt from ``ops`` and the ``old`` bytes (the target's side), and how
    many of its bytes came from old blocks; ValueError unless the ops are well formed and
    rebuild exactly ``length`` bytes."""
    starts = block_starts(len(old))
    view = memoryview(old)
    out = bytearray()
    copied = pos = 0
    while True:
        n, pos = read_varint(ops, pos)
        if n > length - len(out) or pos + n > len(ops):
            raise ValueError("a literal run past the range or the ops")
        out += ops[pos : pos + n]
        pos += n
        run, pos = read_varint(ops, pos)
        if not run:
            break
        first, pos = read_varint(ops, pos)
        if first + run > len(starts) or len(out) + run * REFINE_BLOCK > length:
            raise ValueError("a run of old blocks past the blocks or the range")
        for k in range(first, first + run):
            out += view[starts[k] : starts[k] + REFINE_BLOCK]
        copied += run * REFINE_BLOCK
    if pos != len(ops) or len(out) != length:
        raise ValueError(f"ops rebuild {len(out)} bytes of {length}, or run past their end")
    return bytes(out), copied
