"""Signing bytes as they are written: the target checks a rebuilt file's root without
reading it back, and keeps the signature for its index."""

from __future__ import annotations

from array import array

from rdc import _native
from rdc.content.chunking import Buffer, scanner_for
from rdc.content.signature import FileSignature, sketch_for
from rdc.content.tree import Level, build_tree
from rdc.params import DEFAULT_SIGNATURE, SKETCH_MIN_LEAVES, SignatureParams


class StreamSigner:
    """Feed a file's bytes in order, in pieces of any size; `finish` gives the same
    signature as `rdc.content.signature.signature_of_bytes` of the whole. Chunks and hashes
    each piece where it lies: only the bytes since the last cut are copied, into the next
    piece's head (a rebuilt 256 MiB file went through two buffers and two memmoves, about
    40% of its signing time). Holds the first few chunks too, which a small file's sketch
    needs."""

    def __init__(self, params: SignatureParams = DEFAULT_SIGNATURE) -> None:
        self.params = params
        self._scanner = scanner_for(params.chunks)
        self._max = params.chunks.max_size
        self._tail = bytearray()  # the stream from the last cut on
        self._hashes = bytearray()
        self._lengths = array("Q")
        self._head: bytearray | None = bytearray()
        self._small_limit = SKETCH_MIN_LEAVES * params.chunks.max_size
        self.size = 0

    def feed(self, data: Buffer) -> None:
        view = memoryview(data).cast("B")
        start = self.size  # the stream offset of view[0]
        self.size += len(view)
        if self._tail:
            # Enough of the piece to decide every cut up to it: cuts are decided with
            # max_size bytes in sight, so the rest of the piece starts past the last one.
            base = start - len(self._tail)
            joint = self._tail + view[: self._max]
            self._take(joint, base, final=False)
            if len(view) <= self._max:
                self._tail = joint[self._scanner.last_cut - base :]
                return
            view = view[self._scanner.last_cut - start :]
            start = self._scanner.last_cut
        self._take(view, start, final=False)
        self._tail = bytearray(view[self._scanner.last_cut - start :])

    def _take(self, data: Buffer, base: int, final: bool) -> None:
        """Cut and hash ``data``, the stream from ``base`` (the last cut); the bytes past
        the new last cut (``self._scanner.last_cut``) are the caller's to keep."""
        cuts = self._scanner.scan(data, base, final)
        if not cuts:
            return
        hashes, lengths = _native.hash_chunks(data, [c - base for c in cuts])
        self._hashes += hashes
        self._lengths.extend(lengths)
        if self._head is not None:
            self._head += memoryview(data)[: cuts[-1] - base]
            if len(self._head) > self._small_limit:
                self._head = None

    def finish(self) -> FileSignature:
        self._take(self._tail, self.size - len(self._tail), final=True)
        self._tail = bytearray()
        leaves = Level(bytes(self._hashes), self._lengths)
        tree = build_tree(leaves, self.params.groups)
        head = bytes(self._head) if self._head is not None else None
        return FileSignature(tree, sketch_for(leaves, head, self.params))
