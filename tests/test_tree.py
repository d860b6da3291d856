"""Leaf signatures and the recursive Merkle tree."""

from __future__ import annotations

import io
import random
from array import array

import blake3
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rdc import _native
from rdc.content.chunking import Chunk, chunks_of
from rdc.content.signature import signature_of_bytes, signature_of_file
from rdc.content.tree import (
    Level,
    Tree,
    TreeFormatError,
    build_tree,
    group_cuts,
    node_hash,
    pack_tree,
    packed_in_python,
    unpack_tree,
)
from rdc.params import DEFAULT_GROUPS, GroupParams

from .conftest import scaled


@given(st.binary(max_size=scaled(200_000, 40_000)), st.integers(1, 70_000))
def test_root_depends_on_content_only(data: bytes, read_size: int) -> None:
    whole = signature_of_bytes(data)
    streamed = signature_of_file(io.BytesIO(data), read_size=read_size)
    assert streamed.tree == whole.tree
    assert streamed.sketch == whole.sketch


def test_roots_are_frozen() -> None:
    """Golden roots: a change here is a format break."""
    rng = random.Random(77)
    inputs = {
        "empty": b"",
        "one byte": b"x",
        "random 300k": rng.randbytes(300_000),
        "zeros 100k": bytes(100_000),
        "text": b"".join(b"line %d of the merkle tree test\n" % i for i in range(20_000)),
    }
    roots = {name: signature_of_bytes(data).root.hex()[:24] for name, data in inputs.items()}
    assert roots == {
        "empty": GOLDEN["empty"],
        "one byte": GOLDEN["one byte"],
        "random 300k": GOLDEN["random 300k"],
        "zeros 100k": GOLDEN["zeros 100k"],
        "text": GOLDEN["text"],
    }


GOLDEN = {
    "empty": "0804b9c4df8b325bbd743f1b",
    "one byte": "a5fa852bc24949db97309943",
    "random 300k": "668854acc3adf8eb7719f9c0",
    "zeros 100k": "24926ecae686be1820665106",
    "text": "222676575c57baff06a94a3d",
}


def test_node_hashes_are_domain_separated_from_chunk_hashes() -> None:
    data = b"a file of one chunk"
    signature = signature_of_bytes(data)
    assert len(signature.tree.leaves) == 1
    assert signature.tree.leaves.hash(0) == blake3.blake3(data).digest()
    assert signature.root != blake3.blake3(data).digest()
    payload = bytes([2]) + blake3.blake3(data).digest() + len(data).to_bytes(8, "little")
    assert signature.root == node_hash(2, signature.tree.leaves.hashes, [len(data)])
    assert signature.root != blake3.blake3(payload).digest()


def test_every_level_covers_the_file_and_groups_respect_their_bounds() -> None:
    data = random.Random(5).randbytes(scaled(8 << 20, 1 << 20))
    tree = signature_of_bytes(data).tree
    assert len(tree.levels[-1]) == 1
    for below, above in zip(tree.levels, tree.levels[1:], strict=False):
        assert sum(below.lengths) == sum(above.lengths) == len(data)
        cuts = group_cuts(below.keys())
        sizes = [b - a for a, b in zip([0, *cuts], cuts, strict=False)]
        assert len(sizes) == len(above)
        assert all(DEFAULT_GROUPS.min_entries < n <= DEFAULT_GROUPS.max_entries
                   for n in sizes[:-1])


def test_group_cuts_are_rightmost_minima() -> None:
    keys = [5, 3, 9, 3, 7, 8, 1, 6, 2, 4]
    # after 0: window (1, 4] over keys[1..3] = 3, 9, 3 -> rightmost minimum at position 4
    assert group_cuts(keys, GroupParams(1, 4))[0] == 4
    assert group_cuts(keys, GroupParams(1, 4)) == [4, 7, 9, 10]


def test_pack_round_trip_and_corruption_is_detected() -> None:
    tree = signature_of_bytes(random.Random(6).randbytes(300_000)).tree
    blob = pack_tree(tree)
    assert unpack_tree(blob) == tree
    assert len(blob) < 40 * 1.2 * len(tree.leaves)  # packed: ~34 bytes an entry
    rng = random.Random(1)
    for _ in range(50):
        damaged = bytearray(blob)
        damaged[rng.randrange(len(blob))] ^= 1 << rng.randrange(8)
        with pytest.raises((TreeFormatError, ValueError)):
            unpack_tree(bytes(damaged))
    for bad in (b"", b"RDCT", blob[:-1], blob + b"\0", b"XXXX" + blob[4:]):
        with pytest.raises((TreeFormatError, ValueError)):
            unpack_tree(bad)


@given(st.lists(st.lists(st.tuples(st.binary(min_size=32, max_size=32),
                                    st.integers(0, (1 << 64) - 1)), max_size=40),
                min_size=1, max_size=5))
def test_packing_natively_gives_the_reference_bytes(levels: list) -> None:
    """Any levels, lengths up to 64 bits (every varint width): the same bytes either way."""
    tree = Tree(tuple(Level(b"".join(h for h, _ in level), array("Q", [n for _, n in level]))
                      for level in levels))
    assert pack_tree(tree) == packed_in_python(tree)


@pytest.mark.skipif(_native.pack_tree is None, reason="no native code in the pure run")
def test_native_packing_refuses_levels_that_do_not_add_up() -> None:
    with pytest.raises(ValueError, match="multiple of 32"):
        _native.pack_tree(b"RDCT\1", [Level(b"x" * 31, array("Q", [1]))])
    with pytest.raises(ValueError, match="one length"):
        _native.pack_tree(b"RDCT\1", [Level(b"x" * 32, array("Q", [1, 2]))])
    with pytest.raises(AttributeError):
        _native.pack_tree(b"RDCT\1", [object()])


def test_empty_file_has_a_root() -> None:
    tree = build_tree(Level(b"", array("Q")))
    assert len(tree.levels) == 2 and tree.size == 0
    assert unpack_tree(pack_tree(tree)) == tree


def leaves_after_edit(old: bytes, old_chunks: list[Chunk], new: bytes, at: int, delta: int):
    """New chunk list of ``new`` = ``old`` edited at ``at`` (length change ``delta``),
    re-chunking only around the edit: cuts depend only on the data since the previous
    cut, so the chain is unchanged before the edit and rejoins the old one after it."""
    start_index = max(0, next(i for i, c in enumerate(old_chunks) if c.offset + c.length > at) - 2)
    start = old_chunks[start_index].offset
    old_ends = {c.offset + c.length + delta for c in old_chunks if c.offset > at}
    window = new[start : min(len(new), at + 400_000)]
    redone = []
    for c in chunks_of(window):
        end = start + c.offset + c.length
        redone.append(Chunk(start + c.offset, c.length))
        if end in old_ends:
            break
    resume = next(i for i, c in enumerate(old_chunks) if c.offset + c.length + delta == end) + 1
    tail = [Chunk(c.offset + delta, c.length) for c in old_chunks[resume:]]
    return old_chunks[:start_index] + redone + tail


def level_of_chunks(data, chunks: list[Chunk], known: dict | None = None,
                    dirty: int = -1) -> Level:
    """Leaf level of ``chunks``; ``known`` maps (offset, length) to hashes of chunks that
    did not change, unless they contain offset ``dirty``."""
    hashes = bytearray()
    for c in chunks:
        cached = known.get((c.offset, c.length)) if known else None
        if cached is None or c.offset <= dirty < c.offset + c.length:
            cached = blake3.blake3(data[c.offset : c.offset + c.length]).digest()
        hashes += cached
    return Level(bytes(hashes), array("Q", (c.length for c in chunks)))


def hashes_by_span(chunks: list[Chunk], level: Level) -> dict:
    return {(c.offset, c.length): level.hash(i) for i, c in enumerate(chunks)}


class ByteEdits:
    """A large buffer edited one byte at a time, in place (no copies of the whole)."""

    def __init__(self, size: int, seed: int) -> None:
        self.rng = random.Random(seed)
        self.old = self.rng.randbytes(size)
        self.data = bytearray(self.old)
        self.chunks = chunks_of(self.old)
        self.level = level_of_chunks(self.old, self.chunks)
        self.known = hashes_by_span(self.chunks, self.level)
        self.tree = build_tree(self.level)

    def edits(self, count: int):
        """Yield (offset, tree of the edited data) for ``count`` random one-byte edits."""
        for _ in range(count):
            at = self.rng.randrange(len(self.old))
            self.data[at] ^= 0x5A
            chunks = leaves_after_edit(self.old, self.chunks, self.data, at, 0)
            yield at, build_tree(level_of_chunks(self.data, chunks, self.known, at))
            self.data[at] ^= 0x5A


def test_one_edited_byte_changes_few_nodes_per_level() -> None:
    edits = ByteEdits(scaled(64 << 20, 2 << 20), 12)
    changed_per_level: dict[int, list[int]] = {}
    for _, tree in edits.edits(scaled(100, 20)):
        for depth, (a, b) in enumerate(zip(edits.tree.levels, tree.levels, strict=False)):
            old_set = set(a.entries())
            changed = sum(1 for entry in b.entries() if entry not in old_set)
            changed_per_level.setdefault(depth + 1, []).append(changed)
    means = {level: sum(v) / len(v) for level, v in changed_per_level.items()}
    assert all(mean <= 3 for mean in means.values()), means
    assert means[1] >= 1  # an edit does change its chunk


def test_incremental_rechunking_helper_matches_full_chunking() -> None:
    rng = random.Random(13)
    old = rng.randbytes(scaled(3 << 20, 1 << 20))
    old_chunks = chunks_of(old)
    for _ in range(10):
        at = rng.randrange(len(old) - 200)
        size = rng.randint(1, 100)
        if rng.random() < 0.5:
            new, delta = old[:at] + rng.randbytes(size) + old[at:], size
        else:
            new, delta = old[:at] + old[at + size :], -size
        assert leaves_after_edit(old, old_chunks, new, at, delta) == chunks_of(new)
