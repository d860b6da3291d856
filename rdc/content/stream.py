"""Signing bytes as they are written: the target checks a rebuilt file's root without
reading it back, and keeps the signature for its index."""

from __future__ import annotations

import queue
import threading
from array import array

from rdc import _native
from rdc.content.chunking import Buffer, KnownCuts, scanner_for
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

    def __init__(self, params: SignatureParams = DEFAULT_SIGNATURE,
                 ends: list[int] | None = None) -> None:
        """``ends``: where the leaves end, if known (`KnownCuts`)."""
        self.params = params
        self._scanner: _native.Scanner | KnownCuts = (
            scanner_for(params.chunks) if ends is None
            else KnownCuts(ends, params.chunks.max_size))
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


class SigningThread:
    """A `StreamSigner` fed on a thread of its own, so that a large file is chunked and
    hashed while the next piece is read and written (a 256 MiB file rebuilt from its old
    version: read, write, chunk and hash had been one after another on one thread). The
    chunker and the hashes release the GIL. Pieces wait in a queue of DEPTH, so a
    signer that falls behind holds up the writer rather than growing memory."""

    DEPTH = 8

    def __init__(self, signer: StreamSigner) -> None:
        self._signer = signer
        self._queue: queue.Queue[bytes | None] = queue.Queue(self.DEPTH)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="rdc-sign", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (data := self._queue.get()) is not None:
            if self._error is None:  # (after an error, drain: the writer must not block)
                try:
                    self._signer.feed(data)
                except BaseException as exc:  # raised again by finish
                    self._error = exc

    def feed(self, data: Buffer) -> None:
        """Queue ``data``; it must not change afterwards (bytes are kept, others copied)."""
        self._queue.put(data if type(data) is bytes else bytes(data))

    def finish(self) -> FileSignature:
        self.close()
        if self._error is not None:
            raise self._error
        return self._signer.finish()

    def close(self) -> None:
        """Stop the thread once it has taken what was queued (idempotent)."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
