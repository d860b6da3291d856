"""The specification of the C refinement encoder (`_refine.encode`), and the pure-Python
implementation: a literal range described as ops against the blocks of the old bytes it
replaces (rdc.content.refine has the format and why)."""

from __future__ import annotations

import zlib


def _varint(value: int, out: bytearray) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def block_starts(size: int, block: int) -> list[int]:
    """Where the blocks of ``size`` old bytes start: a grid of ``block`` from 0, and one
    block ending at ``size`` when the grid leaves a remainder."""
    starts = list(range(0, size - block + 1, block))
    if size % block and size >= block:
        starts.append(size - block)
    return starts


def key(data: bytes | memoryview, hash_bytes: int) -> bytes:
    """A block's short hash: the first ``hash_bytes`` of its CRC-32, little-endian."""
    return (zlib.crc32(data) & 0xFFFFFFFF).to_bytes(4, "little")[:hash_bytes]


def encode(new: bytes | memoryview, hashes: bytes, old_length: int, block: int,
           hash_bytes: int, limit: int) -> bytes:
    """``new`` as ops against the blocks of ``old_length`` old bytes whose hashes are
    ``hashes`` (``hash_bytes`` each, `key`). A short hash matches by chance about once in
    65,536 lookups, so a block is taken on one hash only where an edit would leave it: in
    line with the last block copied (or the old bytes' start), or with the old bytes' end
    (an edit before it moved it by the difference in length); anywhere else only with the
    block after it matching too. ValueError if ``old_length`` exceeds ``limit`` or the
    hashes are not one per block."""
    starts = block_starts(old_length, block)
    count = len(starts)
    if old_length > limit or len(hashes) != count * hash_bytes:
        raise ValueError(f"{len(hashes)} bytes of block hashes for {old_length} old bytes")
    keys = [hashes[i * hash_bytes : (i + 1) * hash_bytes] for i in range(count)]
    where: dict[bytes, int] = {}
    for k, hashed in enumerate(keys):
        where.setdefault(hashed, k)
    block_at = {start: k for k, start in enumerate(starts)}
    view = memoryview(new)
    runs: list[list] = []  # [literal before, first block, blocks]
    literal_from = pos = 0
    left = 0  # new position minus old position of the last block copied
    right = len(view) - old_length  # ... of blocks after the last edit
    end = len(view) - block
    while pos <= end:
        hashed = key(view[pos : pos + block], hash_bytes)
        k = block_at.get(pos - left)
        if k is None or keys[k] != hashed:
            k = block_at.get(pos - right)
            if k is None or keys[k] != hashed:
                k = where.get(hashed)
                if k is None or k + 1 >= count or pos + 2 * block > len(view) or (
                        keys[k + 1] != key(view[pos + block : pos + 2 * block], hash_bytes)):
                    pos += 1
                    continue
        if runs and pos == literal_from and k == runs[-1][1] + runs[-1][2]:
            runs[-1][2] += 1
        else:
            runs.append([view[literal_from:pos], k, 1])
        left = pos - starts[k]
        pos += block
        literal_from = pos
    out = bytearray()
    for literal, first, blocks in runs:
        _varint(len(literal), out)
        out += literal
        _varint(blocks, out)
        _varint(first, out)
    _varint(len(view) - literal_from, out)
    out += view[literal_from:]
    _varint(0, out)
    return bytes(out)
