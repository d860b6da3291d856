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

import blake3

from rdc import _native
from rdc._native import signature_ref
from rdc.content.entries import put_varint, read_varint
from rdc.params import DEFAULT_GROUPS, NODE_CONTEXT, GroupParams
from rdc.records import record

HASH_BYTES = 32


@record
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
    (1-based positions); when at most ``min_entries`` remain, they end the last group.
    (The readable reference; trees are built by `rdc._native.next_level_payloads`.)"""
    return signature_ref.cuts_of_keys(keys, params.min_entries, params.max_entries)


def node_hash(level: int, hashes: bytes, lengths: Sequence[int]) -> bytes:
    """Hash of a node of ``level`` (>= 2) over its children's entries: the level byte, then
    per child its 32-byte hash and its length as 8 bytes little-endian."""
    payload = bytearray([level])
    for i, length in enumerate(lengths):
        payload += hashes[HASH_BYTES * i : HASH_BYTES * (i + 1)]
        payload += length.to_bytes(8, "little")
    return blake3.blake3(payload, derive_key_context=NODE_CONTEXT).digest()


def next_level(level_number: int, below: Level, params: GroupParams) -> Level:
    """Group ``below`` (at ``level_number - 1``) into the nodes of ``level_number``: the
    grouping, the payloads and the node hashes (all of a level's in one call) are native."""
    payload, ends, lengths = _native.next_level_payloads(
        level_number, below.hashes, below.lengths, params.min_entries, params.max_entries
    )
    hashes, _ = _native.hash_chunks(payload, ends, context=NODE_CONTEXT)
    return Level(hashes, lengths)


@record
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


class TreeFormatError(ValueError):
    """A packed tree that does not parse or does not add up."""


PACKED_HEAD = MAGIC + bytes([FORMAT_VERSION])  # what every packed tree begins with


def pack_tree(tree: Tree) -> bytes:
    """Compact form: magic, version, level count, then per level its entry count and
    entries (32-byte hash, varint length). docs/formats.md section 2. Natively where it
    can (`_native.pack_tree`: every file an index records is packed, 3 us each here)."""
    if _native.pack_tree is not None:
        return _native.pack_tree(PACKED_HEAD, tree.levels)
    return packed_in_python(tree)


def packed_in_python(tree: Tree) -> bytes:
    """`pack_tree` step by step: the reference the native packer is tested against."""
    out = bytearray(MAGIC)
    out.append(FORMAT_VERSION)
    put_varint(len(tree.levels), out)
    for level in tree.levels:
        put_varint(len(level), out)
        for i, length in enumerate(level.lengths):
            out += level.hashes[HASH_BYTES * i : HASH_BYTES * (i + 1)]
            put_varint(length, out)
    return bytes(out)


def unpack_tree(blob: bytes, params: GroupParams = DEFAULT_GROUPS) -> Tree:
    """Parse a packed tree and check it: the upper levels must be exactly what the leaves
    give (a stored tree is a cache, never trusted blindly). Anything wrong with it is a
    TreeFormatError, which callers take for no tree. The levels are read natively
    where they can be (`_native.unpack_level`: every large transfer reads a tree back, and
    a 32,000-leaf one unpacks in 2 ms rather than 21 ms, the check now most of it)."""
    data = memoryview(blob)
    if len(data) < 5 or bytes(data[:4]) != MAGIC or data[4] != FORMAT_VERSION:
        raise TreeFormatError("not a packed rdc tree of this version")
    unpack_level = _native.unpack_level or _level_in_python
    pos = 5
    try:
        count, pos = read_varint(data, pos)
        if not 2 <= count <= 64:
            raise TreeFormatError(f"implausible level count {count}")
        levels = []
        for _ in range(count):
            n, pos = read_varint(data, pos)
            hashes, lengths, pos = unpack_level(data, pos, n)  # (a count past the data,
            levels.append(Level(hashes, lengths))              # ValueError there too)
    except TreeFormatError:
        raise
    except (ValueError, OverflowError) as exc:  # cut short, too long, past the data: damage
        raise TreeFormatError(f"a packed tree that does not parse: {exc}") from None
    if pos != len(data):
        raise TreeFormatError("trailing bytes after the tree")
    tree = Tree(tuple(levels))
    if build_tree(levels[0], params) != tree:
        raise TreeFormatError("upper levels do not match the leaves")
    return tree


def _level_in_python(data: bytes | memoryview, pos: int, n: int) -> tuple[bytes, array, int]:
    """``n`` entries (hash, varint length) of a packed level at ``data[pos:]``, their
    hashes, lengths and the position after them: the reference `_native.unpack_level` is
    tested against. ValueError if cut short or a varint is over 10 bytes; OverflowError
    for a length over 64 bits (array("Q") refuses it)."""
    if pos < 0 or n < 0 or n > (len(data) - pos) // (HASH_BYTES + 1):
        raise ValueError(f"level of {n} entries at {pos} does not fit {len(data)} bytes")
    hashes = bytearray()
    lengths = array("Q")
    for _ in range(n):
        hashes += data[pos : pos + HASH_BYTES]
        length, pos = read_varint(data, pos + HASH_BYTES)
        lengths.append(length)
    return bytes(hashes), lengths, pos
