"""Checking bytes against the tree they are supposed to have, leaf by leaf, as they are read.

A source serves a file by its stored signature (an index that stat vouches for); if the
bytes on disk changed without a change of size or time (bit rot, an edit that kept the
time), what it sends would not be what it offered. Hashing each leaf as it goes out (one
BLAKE3 call per read, over the leaves it completes: no chunking, no tree) finds that
before the target commits anything.
"""

from __future__ import annotations

from bisect import bisect_right
from itertools import accumulate

from rdc.content.leaves import hash_chunks
from rdc.content.tree import HASH_BYTES, Tree


class Mismatch(ValueError):
    """Bytes read do not have the hashes of the leaves they should be."""


class LeafCheck:
    """Bytes of a file fed in order from offset 0, checked against ``tree``'s leaves as
    each leaf is complete. Holds at most one leaf plus the last piece fed."""

    def __init__(self, tree: Tree) -> None:
        self.tree = tree
        self.ends = list(accumulate(tree.leaves.lengths))
        self.leaf = 0  # the first leaf not checked yet
        self.offset = 0  # file offset of pending[0]
        self.pending = bytearray()

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Take the next bytes; `Mismatch` as soon as a completed leaf has another hash,
        or the bytes run past the file's size."""
        self.pending += data
        end = self.offset + len(self.pending)
        if end > (self.ends[-1] if self.ends else 0):
            raise Mismatch("longer than its signature")
        done = bisect_right(self.ends, end, lo=self.leaf)
        if done == self.leaf:
            return
        ends = [e - self.offset for e in self.ends[self.leaf : done]]
        hashes, _ = hash_chunks(self.pending, ends)
        if hashes != self.tree.leaves.hashes[HASH_BYTES * self.leaf : HASH_BYTES * done]:
            raise Mismatch(f"a chunk near byte {self.offset:,} differs from its signature")
        del self.pending[: ends[-1]]
        self.offset = self.ends[done - 1]
        self.leaf = done

    def finish(self) -> None:
        """`Mismatch` unless every leaf was fed and checked."""
        if self.pending or self.leaf != len(self.ends):
            raise Mismatch("shorter than its signature")


def matches(tree: Tree, data: bytes | bytearray | memoryview) -> bool:
    """Whether ``data`` is the whole content ``tree`` describes."""
    check = LeafCheck(tree)
    try:
        check.feed(data)
        check.finish()
    except Mismatch:
        return False
    return True
