"""Signing bytes as they are written: the target checks a rebuilt file's root without
reading it back, and keeps the signature for its index."""

from __future__ import annotations

from array import array

from rdc.chunking import Buffer, Chunker
from rdc.signature import (
    DEFAULT_SIGNATURE,
    SKETCH_MIN_LEAVES,
    FileSignature,
    SignatureParams,
    chunk_hash,
    sketch_for,
)
from rdc.tree import Level, build_tree


class StreamSigner:
    """Feed a file's bytes in order, in pieces of any size; `finish` gives the same
    signature as `rdc.signature.signature_of_bytes` of the whole. Holds at most one chunk
    (plus the first few chunks, which a small file's sketch needs)."""

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
        for cut in self._chunker.feed(data):
            self._take(cut)

    def _take(self, cut: int) -> None:
        n = cut - self._base
        chunk = memoryview(self._pending)[:n]
        self._hashes += chunk_hash(chunk)
        self._lengths.append(n)
        if self._head is not None:
            self._head += chunk
            if len(self._head) > self._small_limit:
                self._head = None
        chunk.release()
        del self._pending[:n]
        self._base = cut

    def finish(self) -> FileSignature:
        for cut in self._chunker.finish():
            self._take(cut)
        leaves = Level(bytes(self._hashes), self._lengths)
        tree = build_tree(leaves, self.params.groups)
        head = bytes(self._head) if self._head is not None else None
        return FileSignature(tree, sketch_for(leaves, head, self.params))
