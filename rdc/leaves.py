"""The leaf level of a stream on all cores: segments chunked and hashed in parallel, then
spliced into exactly the sequential result.

A cut depends only on the previous cut and the bytes after it. So a chunker started at an
arbitrary offset ``q`` (not a cut) yields a chain of cuts that, once one of them coincides
with a cut of the true chain (the one from offset 0), equals the true chain from there on.
Each segment ``[q, q + segment_size)`` is chunked from ``q`` and its chunks hashed on a
worker thread (the chunker and BLAKE3 release the GIL). The calling thread carries the true
chain from its last cut into the next segment, chunk by chunk, until it lands on a cut of
that segment's chain (on random data within a chunk or two), and takes the segment's
leaves from there. Where the chains never meet (long runs of one byte, misaligned with the
segment), the calling thread chunks the segment itself: the same leaves, at the speed of
one core.

Memory stays bounded: at most ``workers + 2`` segment buffers, recycled between files.
"""

from __future__ import annotations

import os
import threading
from array import array
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import BinaryIO

import blake3

from rdc import _native
from rdc.params import ChunkParams
from rdc.tree import HASH_BYTES, Level

Buffer = bytes | bytearray | memoryview

SEGMENT_SIZE = 2 << 20
READ_SIZE = 1 << 20
WORKERS = max(1, min(os.cpu_count() or 1, 8))
# The true chain usually meets a segment's chain at its first or second cut: the calling
# thread copies this many max-size chunks of a segment to look for the meeting, and all of
# it only when they do not meet there.
PROBE_CHUNKS = 4


# One thread hashes at a time. blake3 releases the GIL for each chunk and takes it back after;
# two threads doing that at once pass the GIL to and fro (bench/signatures.py measures it).
# While one thread hashes, the other chunks, which needs no GIL.
_hash_lock = threading.Lock()


def hash_chunks(data: Buffer, ends: list[int], start: int = 0) -> tuple[bytes, array]:
    """Packed BLAKE3 hashes and lengths of the chunks of ``data`` ending at ``ends`` (buffer
    offsets), the first starting at ``start``."""
    view = memoryview(data)
    starts = [start, *ends[:-1]] if ends else []
    b3 = blake3.blake3
    with _hash_lock:
        hashes = b"".join([b3(view[s:e]).digest() for s, e in zip(starts, ends, strict=True)])
    return hashes, array("Q", [e - s for s, e in zip(starts, ends, strict=True)])


def _scanner(params: ChunkParams) -> _native.Scanner:
    return _native.Scanner(params.window, params.min_size, params.max_size)


def _chunk_and_hash(
    data: Buffer, final: bool, params: ChunkParams
) -> tuple[list[int], bytes, array]:
    """A worker's job: the chain of ``data`` taken as a stream of its own."""
    ends = _scanner(params).scan(data, 0, final)
    return (ends, *hash_chunks(data, ends))


@dataclass
class _Segment:
    start: int  # stream offset of data[0]
    data: Buffer
    final: bool
    owned: bytearray | None  # a pool buffer to give back once spliced


class _Leaves:
    """The true chain so far: its leaves, its last cut, and the bytes after that cut."""

    def __init__(self, params: ChunkParams) -> None:
        self.params = params
        self.hashes: list[bytes] = []
        self.lengths = array("Q")
        self.cut = 0
        self.tail = b""  # stream bytes [cut, start of the next segment)
        self.met = 0  # segments whose chain the true chain met
        self.rechunked = 0  # segments the calling thread had to chunk itself

    def take(self, hashes: bytes, lengths: array) -> None:
        self.hashes.append(hashes)
        self.lengths.extend(lengths)

    def splice(self, seg: _Segment, ends: list[int], hashes: bytes, lengths: array) -> None:
        """Extend the chain through ``seg``, whose own chain (from ``seg.start``) ends its
        chunks at ``ends`` (segment offsets) with these hashes and lengths."""
        if self.tail:
            self._carry(seg, ends, hashes, lengths)
            return
        # The chain is at the segment's start, so the segment's chain is the true one.
        self.take(hashes, lengths)
        if ends:
            self.cut = seg.start + ends[-1]
        self.tail = bytes(memoryview(seg.data)[self.cut - seg.start :])

    def _carry(self, seg: _Segment, ends: list[int], hashes: bytes, lengths: array) -> None:
        """Chunk the true chain from its last cut into ``seg``, a step at a time, until it
        lands on a cut of the segment's chain; from there, take the segment's leaves. If
        they never meet, the true chunks of the whole segment are hashed here."""
        offset = len(self.tail)  # data offset of the segment's first byte
        meeting = {end + offset: i for i, end in enumerate(ends)}
        scanner = _scanner(self.params)
        step = self.params.max_size
        total = offset + len(seg.data)
        data: Buffer = self.tail + memoryview(seg.data)[: PROBE_CHUNKS * step]
        true_ends: list[int] = []
        upto = 0
        while upto < total:
            if upto == len(data):  # past the probe: the rest of the segment
                data = self.tail + memoryview(seg.data)
            upto = min(upto + step, len(data))
            last = scanner.last_cut
            for end in scanner.scan(memoryview(data)[last:upto], last, seg.final and upto == total):
                true_ends.append(end)
                i = meeting.get(end)
                if i is not None:
                    self.take(*hash_chunks(data, true_ends))
                    self.take(hashes[HASH_BYTES * (i + 1) :], lengths[i + 1 :])
                    self.cut = seg.start + ends[-1]
                    self.tail = bytes(memoryview(seg.data)[ends[-1] :])
                    self.met += 1
                    return
        self.rechunked += 1
        self.take(*hash_chunks(data, true_ends))
        done = true_ends[-1] if true_ends else 0
        self.cut += done
        self.tail = bytes(memoryview(data)[done:])

    def level(self) -> Level:
        return Level(b"".join(self.hashes), self.lengths)


# ---------------------------------------------------------------- segment sources

_pool_lock = threading.Lock()
_free: list[bytearray] = []
_executor: ThreadPoolExecutor | None = None
KEEP_BUFFERS = 4


def _buffer(size: int) -> bytearray:
    with _pool_lock:
        while _free:
            buf = _free.pop()
            if len(buf) == size:
                return buf
    return bytearray(size)


def _give_back(buf: bytearray) -> None:
    with _pool_lock:
        if len(_free) < KEEP_BUFFERS:
            _free.append(buf)


def _workers() -> ThreadPoolExecutor:
    global _executor
    with _pool_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(WORKERS, thread_name_prefix="rdc-leaves")
        return _executor


def segments_of_buffer(data: Buffer, segment_size: int) -> Iterator[_Segment]:
    view = memoryview(data).cast("B")
    for start in range(0, max(len(view), 1), segment_size):
        end = min(start + segment_size, len(view))
        yield _Segment(start, view[start:end], end == len(view), None)


def segments_of_file(f: BinaryIO, segment_size: int, read_size: int) -> Iterator[_Segment]:
    """Segments of ``f`` read from its position, each into a pool buffer. One segment is
    read ahead, to know whether the one before it is the last."""
    start = 0
    pending: _Segment | None = None
    while True:
        buf = _buffer(segment_size)
        view = memoryview(buf)
        filled = 0
        while filled < segment_size:
            n = f.readinto(view[filled : filled + read_size])
            if not n:
                break
            filled += n
        if pending is not None:
            pending.final = filled == 0
            yield pending
        if filled == 0:
            _give_back(buf)
            if pending is None:
                yield _Segment(0, b"", True, None)
            return
        pending = _Segment(start, view[:filled], False, buf)
        start += filled


def leaf_level(
    segments: Iterator[_Segment], params: ChunkParams, content_limit: int = 0
) -> tuple[Level, bytes | None]:
    """The leaf level of the stream the segments cover, and its content if it is at most
    ``content_limit`` bytes (small files are sketched over their sub-chunks)."""
    first = next(segments)
    if first.final:
        _, hashes, lengths = _chunk_and_hash(first.data, True, params)
        content = bytes(first.data) if len(first.data) <= content_limit else None
        if first.owned is not None:
            _give_back(first.owned)
        return Level(hashes, lengths), content
    leaves = _Leaves(params)
    executor = _workers()
    in_flight: deque[tuple[_Segment, Future]] = deque()
    head: bytearray | None = bytearray()  # the content while it is within the limit

    def submit(seg: _Segment) -> None:
        nonlocal head
        if head is not None:
            head += seg.data
            if len(head) > content_limit:
                head = None
        in_flight.append((seg, executor.submit(_chunk_and_hash, seg.data, seg.final, params)))

    def splice_oldest() -> None:
        seg, future = in_flight.popleft()
        leaves.splice(seg, *future.result())
        if seg.owned is not None:
            _give_back(seg.owned)

    submit(first)
    for seg in segments:
        submit(seg)
        while len(in_flight) > WORKERS or (in_flight and in_flight[0][1].done()):
            splice_oldest()
    while in_flight:
        splice_oldest()
    return leaves.level(), None if head is None else bytes(head)
