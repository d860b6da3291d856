"""Signing bytes as they are written: the target checks a rebuilt file's root without
reading it back, and keeps the signature for its index."""

from __future__ import annotations

from array import array

from rdc import _native
from rdc.content.chunking import Buffer, Chunker
from rdc.content.signature import FileSignature, sketch_for
from rdc.content.tree import Level, build_tree
from rdc.params import DEFAULT_SIGNATURE, SKETCH_MIN_LEAVES, SignatureParams


class StreamSigner:
    """Feed a file's bytes in order, in pieces of any size; `finish` gives the same
    signature as `rdc.content.signature.signature_of_bytes` of the whole. Holds the chunks of at
    most one piece (plus the first few chunks, which a small file's sketch needs)."""

    def __init__(self, params: SignatureParams = DEFAULT_SIGNATURE) -> None:
        self.params = params
        self._chunker = Chunker(params.chunks)
        self._pending = bytearray()
        self._base = 0
        self._hashes = bytearray()
        self._lengths = array("Q")
        self._head: bytearray | None = bytearray()
        self._small_limit = SKETCH_MIN_LEAVES * params.chunks.max_size
        self.size = 0

    def feed(self, data: Buffer) -> None:
        self._pending += data
        self.size += len(data)
        self._take(self._chunker.feed(data))

    def _take(self, cuts: list[int]) -> None:
        """Hash the chunks ending at ``cuts`` (stream offsets) in one call, and drop them."""
        if not cuts:
            return
        n = cuts[-1] - self._base
        chunks = memoryview(self._pending)[:n]
        hashes, lengths = _native.hash_chunks(chunks, [c - self._base for c in cuts])
        self._hashes += hashes
        self._lengths.extend(lengths)
        if self._head is not None:
            self._head += chunks
            if len(self._head) > self._small_limit:
                self._head = None
        chunks.release()
        del self._pending[:n]
        self._base = cuts[-1]

    def finish(self) -> FileSignature:
        self._take(self._chunker.finish())
        leaves = Level(bytes(self._hashes), self._lengths)
        tree = build_tree(leaves, self.params.groups)
        head = bytes(self._head) if self._head is not None else None
        return FileSignature(tree, sketch_for(leaves, head, self.params))
