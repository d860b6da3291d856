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

import zlib

from rdc.content.entries import put_varint, read_varint
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
    starts = list(range(0, size - REFINE_BLOCK + 1, REFINE_BLOCK))
    if size % REFINE_BLOCK and size >= REFINE_BLOCK:
        starts.append(size - REFINE_BLOCK)
    return starts


def _key(block: bytes | memoryview) -> bytes:
    return (zlib.crc32(block) & 0xFFFFFFFF).to_bytes(4, "little")[:REFINE_HASH]


def block_hashes(old: bytes | memoryview) -> bytes:
    """The hashes of the blocks of ``old`` (`block_starts`), concatenated."""
    view = memoryview(old)
    return b"".join(_key(view[s : s + REFINE_BLOCK]) for s in block_starts(len(view)))


def worth_refining(new_length: int, old_length: int) -> bool:
    """Whether a literal range of ``new_length`` bytes replacing ``old_length`` old bytes
    is worth describing: long enough, and of a size that an edit (not a rewrite) leaves."""
    return (new_length >= REFINE_FROM and REFINE_BLOCK <= old_length <= REFINE_LIMIT
            and old_length <= 2 * new_length + REFINE_BLOCK
            and new_length <= 2 * old_length + REFINE_BLOCK)


def encode(new: bytes | memoryview, hashes: bytes, old_length: int) -> bytes:
    """``new`` as ops against the blocks of ``old_length`` old bytes whose hashes are
    ``hashes`` (the source's side). A short hash matches by chance about once in 65,536
    lookups, so a block is taken on one hash only where an edit would leave it: in line
    with the last block copied (or the old bytes' start), or with the old bytes' end (an
    edit before it moved it by the difference in length); anywhere else only with the
    block after it matching too."""
    starts = block_starts(old_length)
    count = len(starts)
    if old_length > REFINE_LIMIT or len(hashes) != count * REFINE_HASH:
        raise ValueError(f"{len(hashes)} bytes of block hashes for {old_length} old bytes")
    keys = [hashes[i * REFINE_HASH : (i + 1) * REFINE_HASH] for i in range(count)]
    where: dict[bytes, int] = {}
    for k, key in enumerate(keys):
        where.setdefault(key, k)
    block_at = {start: k for k, start in enumerate(starts)}
    view = memoryview(new)
    runs: list[list] = []  # [literal before, first block, blocks]
    literal_from = pos = 0
    left = 0  # new position minus old position of the last block copied
    right = len(view) - old_length  # ... of blocks after the last edit
    end = len(view) - REFINE_BLOCK
    while pos <= end:
        key = _key(view[pos : pos + REFINE_BLOCK])
        k = block_at.get(pos - left)
        if k is None or keys[k] != key:
            k = block_at.get(pos - right)
            if k is None or keys[k] != key:
                k = where.get(key)
                if k is None or k + 1 >= count or pos + 2 * REFINE_BLOCK > len(view) or (
                        keys[k + 1] != _key(view[pos + REFINE_BLOCK : pos + 2 * REFINE_BLOCK])):
                    pos += 1
                    continue
        if runs and pos == literal_from and k == runs[-1][1] + runs[-1][2]:
            runs[-1][2] += 1
        else:
            runs.append([view[literal_from:pos], k, 1])
        left = pos - starts[k]
        pos += REFINE_BLOCK
        literal_from = pos
    out = bytearray()
    for literal, first, blocks in runs:
        put_varint(len(literal), out)
        out += literal
        put_varint(blocks, out)
        put_varint(first, out)
    put_varint(len(view) - literal_from, out)
    out += view[literal_from:]
    put_varint(0, out)
    return bytes(out)


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
