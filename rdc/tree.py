"""Recursive signatures: a file's chunk list grouped, level by level, into a Merkle tree.

Level 1 holds one entry per chunk, ``(blake3(chunk), length)``. A level is cut into groups
by the same sequential winnowing as bytes, one unit per entry, the key of an entry being
the first 8 bytes of its hash (little-endian); each group becomes one entry of the next
level, ``(node_hash(level + 1, group), total length)``. The first level with a single
entry holds the root. Node hashes use BLAKE3's key-derivation mode with their own
context, so no node hash equals the plain BLAKE3 hash of any chunk.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import blake3

HASH_BYTES = 32
NODE_CONTEXT = "rdc 2026-11 merkle tree node v1"


@dataclass(frozen=True, slots=True)
class GroupParams:
    """Group sizes of the recursion: between ``min_entries + 1`` and ``max_entries``
    entries, but for the last group of a level."""

    min_entries: int = 4
    max_entries: int = 12

    def __post_init__(self) -> None:
        if not 1 <= self.min_entries < self.max_entries <= 4096:
            raise ValueError("need 1 <= min_entries < max_entries <= 4096")


DEFAULT_GROUPS = GroupParams()


@dataclass(frozen=True, slots=True)
class Level:
    """Entries of one tree level: ``hashes`` is ``32 * n`` bytes, ``lengths`` n lengths."""

    hashes: bytes
    lengths: array  # array("Q")

    def __len__(self) -> int:
        return len(self.lengths)

    def hash(self, i: int) -> bytes:
        return self.hashes[HASH_BYTES * i : HASH_BYTES * (i + 1)]

    def entries(self) -> Iterator[tuple[bytes, int]]:
        for i, length in enumerate(self.lengths):
            yield self.hashes[HASH_BYTES * i : HASH_BYTES * (i + 1)], length

    def keys(self) -> list[int]:
        return [
            int.from_bytes(self.hashes[i : i + 8], "little")
            for i in range(0, len(self.hashes), HASH_BYTES)
        ]


def group_cuts(keys: Sequence[int], params: GroupParams = DEFAULT_GROUPS) -> list[int]:
    """End indices of the groups of a key sequence: having cut at ``p``, the next cut
    follows the rightmost minimal key in ``(p + min_entries, min(p + max_entries, n)]``
    (1-based positions); when at most ``min_entries`` remain, they end the last group."""
    n = len(keys)
    cuts: list[int] = []
    p = 0
    while p < n:
        if n - p <= params.min_entries:
            cuts.append(n)
            break
        best, best_key = -1, 1 << 64
        for j in range(p + params.min_entries + 1, min(p + params.max_entries, n) + 1):
            if keys[j - 1] <= best_key:
                best, best_key = j, keys[j - 1]
        cuts.append(best)
        p = best
    return cuts


def node_hash(level: int, hashes: bytes, lengths: Sequence[int]) -> bytes:
    """Hash of a node of ``level`` (>= 2) over its children's entries: the level byte, then
    per child its 32-byte hash and its length as 8 bytes little-endian."""
    payload = bytearray([level])
    for i, length in enumerate(lengths):
        payload += hashes[HASH_BYTES * i : HASH_BYTES * (i + 1)]
        payload += length.to_bytes(8, "little")
    return blake3.blake3(payload, derive_key_context=NODE_CONTEXT).digest()


def next_level(level_number: int, below: Level, params: GroupParams) -> Level:
    """Group ``below`` (at ``level_number - 1``) into the nodes of ``level_number``."""
    hashes = bytearray()
    lengths = array("Q")
    start = 0
    for end in group_cuts(below.keys(), params):
        part = below.hashes[HASH_BYTES * start : HASH_BYTES * end]
        child_lengths = below.lengths[start:end]
        hashes += node_hash(level_number, part, child_lengths)
        lengths.append(sum(child_lengths))
        start = end
    return Level(bytes(hashes), lengths)


@dataclass(frozen=True, slots=True)
class Tree:
    """All levels of a file's tree, ``levels[0]`` the leaves and ``levels[-1]`` the root."""

    levels: tuple[Level, ...]

    @property
    def root(self) -> bytes:
        return self.levels[-1].hashes

    @property
    def size(self) -> int:
        return self.levels[-1].lengths[0]

    @property
    def leaves(self) -> Level:
        return self.levels[0]


def build_tree(leaves: Level, params: GroupParams = DEFAULT_GROUPS) -> Tree:
    """The tree over a file's leaf entries. The root is always a node (level >= 2), so an
    empty file and one-chunk files have roots unlike any chunk hash."""
    levels = [leaves]
    while True:
        if len(levels[-1]) == 0:
            levels.append(Level(node_hash(2, b"", []), array("Q", [0])))
        else:
            levels.append(next_level(len(levels) + 1, levels[-1], params))
        if len(levels[-1]) == 1:
            return Tree(tuple(levels))


# ---------------------------------------------------------------- packed form

MAGIC = b"RDCT"
FORMAT_VERSION = 1


def _varint(value: int, out: bytearray) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _read_varint(data: memoryview, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("truncated or overlong varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


class TreeFormatError(ValueError):
    """A packed tree that does not parse or does not add up."""


def pack_tree(tree: Tree) -> bytes:
    """Compact form: magic, version, level count, then per level its entry count and
    entries (32-byte hash, varint length). docs/formats.md section 2."""
    out = bytearray(MAGIC)
    out.append(FORMAT_VERSION)
    _varint(len(tree.levels), out)
    for level in tree.levels:
        _varint(len(level), out)
        for i, length in enumerate(level.lengths):
            out += level.hashes[HASH_BYTES * i : HASH_BYTES * (i + 1)]
            _varint(length, out)
    return bytes(out)


def unpack_tree(blob: bytes, params: GroupParams = DEFAULT_GROUPS) -> Tree:
    """Parse a packed tree and check it: the upper levels must be exactly what the leaves
    give (a stored tree is a cache, never trusted blindly)."""
    data = memoryview(blob)
    if len(data) < 5 or bytes(data[:4]) != MAGIC or data[4] != FORMAT_VERSION:
        raise TreeFormatError("not a packed rdc tree of this version")
    pos = 5
    count, pos = _read_varint(data, pos)
    if not 2 <= count <= 64:
        raise TreeFormatError(f"implausible level count {count}")
    levels = []
    for _ in range(count):
        n, pos = _read_varint(data, pos)
        if n > (len(data) - pos) // (HASH_BYTES + 1):
            raise TreeFormatError("level longer than the data")
        hashes = bytearray()
        lengths = array("Q")
        for _ in range(n):
            hashes += data[pos : pos + HASH_BYTES]
            length, pos = _read_varint(data, pos + HASH_BYTES)
            lengths.append(length)
        levels.append(Level(bytes(hashes), lengths))
    if pos != len(data):
        raise TreeFormatError("trailing bytes after the tree")
    tree = Tree(tuple(levels))
    if build_tree(levels[0], params) != tree:
        raise TreeFormatError("upper levels do not match the leaves")
    return tree
