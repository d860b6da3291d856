"""The leaf level of a stream on all cores: segments chunked and hashed in parallel, then
spliced into exactly the sequential result.

A cut depends only on the previous cut and the bytes after it. So a chunker started at an
arbitrary offset ``q`` (not a cut) yields a chain of cuts that, once one of them coincides
with a cut of the true chain (the one from offset 0), equals the true chain from there on.
Each segment ``[q, q + segment_size)`` is chunked from ``q`` and its chunks hashed, both on
one worker thread and without the GIL (the chunker and `rdc._native.hash_chunks`, which
hashes all of a segment's chunks in one call, in SIMD lanes), so the workers run side by
side on all cores and each segment stays in its worker's cache. The calling thread carries
the true chain from its last cut into the next segment until it lands on a cut of that
segment's chain (on random data at its first or second cut), and takes the segment's leaves
from there. Where the chains never meet (long runs of one byte, misaligned with the
segment), the calling thread chunks the segment itself: the same leaves, at the speed of
one core.

Large regular files are read by the workers themselves (``preadv`` at each segment's
offset); other streams are read in order on the calling thread; a buffer in memory is
chunked and hashed where it is (a copy would cost more than it saves). Memory stays
bounded: a call holds at most ``IN_FLIGHT + 1`` segment buffers, and up to
``KEEP_BUFFERS`` are kept for reuse between files.
"""

from __future__ import annotations

import os
import stat
import threading
from array import array
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import BinaryIO

from rdc import _native
from rdc.params import ChunkParams
from rdc.tree import HASH_BYTES, Level

Buffer = bytes | bytearray | memoryview

SEGMENT_SIZE = 2 << 20
READ_SIZE = 1 << 20
WORKERS = max(1, min(os.cpu_count() or 1, 8))
IN_FLIGHT = 2 * WORKERS + 2
# The calling thread looks for the meeting of the chains this many max-size chunks at a time.
STEP_CHUNKS = 2


# Packed hashes and lengths of the chunks of a buffer: (data, ends, start=0) -> (bytes, array).
hash_chunks = _native.hash_chunks


def _scanner(params: ChunkParams) -> _native.Scanner:
    return _native.Scanner(params.window, params.min_size, params.max_size)


@dataclass
class Segment:
    start: int  # stream offset of data[0]
    data: Buffer
    final: bool
    owned: bytearray | None  # a pool buffer to give back once spliced
    fill: Callable[[Segment], None] | None = None  # reads data on the worker


class _Job:
    """One segment's own chain: read (if a worker reads it), chunked and hashed on a worker."""

    def __init__(self, seg: Segment, params: ChunkParams) -> None:
        self.seg = seg
        self.params = params
        self.ends: list[int] = []
        self.hashes = b""
        self.lengths = array("Q")
        self.error: BaseException | None = None
        self.done = threading.Event()

    def result(self) -> tuple[list[int], bytes, array]:
        self.done.wait()
        if self.error is not None:
            raise self.error
        return self.ends, self.hashes, self.lengths


def _chunk_and_hash(job: _Job) -> None:
    """A worker's task. Reading, chunking and hashing all release the GIL."""
    try:
        if job.seg.fill is not None:
            job.seg.fill(job.seg)
        job.ends = _scanner(job.params).scan(job.seg.data, 0, job.seg.final)
        job.hashes, job.lengths = hash_chunks(job.seg.data, job.ends)
    except BaseException as exc:
        job.error = exc
    job.done.set()


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

    def splice(self, seg: Segment, ends: list[int], hashes: bytes, lengths: array) -> None:
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

    def _carry(self, seg: Segment, ends: list[int], hashes: bytes, lengths: array) -> None:
        """Chunk the true chain from its last cut into ``seg``, a few chunks at a time, until
        it lands on a cut of the segment's chain; from there, take the segment's leaves. If
        they never meet, the true chunks of the whole segment are hashed here."""
        offset = len(self.tail)  # data offset of the segment's first byte
        total = offset + len(seg.data)
        step = STEP_CHUNKS * self.params.max_size
        scanner = _scanner(self.params)
        data: Buffer = self.tail + memoryview(seg.data)[: 2 * step]
        true_ends: list[int] = []
        upto = j = 0
        while upto < total:
            if upto == len(data):  # past the first steps: copy the rest of the segment
                data = self.tail + memoryview(seg.data)
            upto = min(upto + step, len(data))
            last = scanner.last_cut
            for end in scanner.scan(memoryview(data)[last:upto], last, seg.final and upto == total):
                true_ends.append(end)
                while j < len(ends) and ends[j] + offset < end:
                    j += 1
                if j < len(ends) and ends[j] + offset == end:
                    self.take(*hash_chunks(data, true_ends))
                    self.take(hashes[HASH_BYTES * (j + 1) :], lengths[j + 1 :])
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
KEEP_BUFFERS = IN_FLIGHT + 1


def _buffer(size: int) -> bytearray:
    with _pool_lock:
        while _free:
            buf = _free.pop()
            if len(buf) == size:
                return buf
    return bytearray(size)


def _give_back(buf: bytearray) -> None:
    with _pool_lock:
        if len(_free) < KEEP_BUFFERS and len(buf) == SEGMENT_SIZE:
            _free.append(buf)


def _forget_after_fork() -> None:
    """A forked child has none of its parent's threads: start afresh."""
    global _executor, _pool_lock
    _executor = None
    _pool_lock = threading.Lock()
    _free.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def _workers() -> ThreadPoolExecutor:
    global _executor
    with _pool_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(WORKERS, thread_name_prefix="rdc-leaves")
        return _executor


def segments_of_buffer(data: Buffer, segment_size: int) -> Iterator[Segment]:
    """Segments of a buffer, views of it: a worker chunks a segment from memory, then
    hashes it from its cache."""
    view = memoryview(data).cast("B")
    for start in range(0, max(len(view), 1), segment_size):
        end = min(start + segment_size, len(view))
        yield Segment(start, view[start:end], end == len(view), None)


def segments_of_file(
    f: BinaryIO, segment_size: int, read_size: int, content_limit: int = 0
) -> Iterator[Segment]:
    """Segments of ``f`` from its position to its end, each in a pool buffer. A regular
    file larger than a segment (and than ``content_limit``) is read by the workers at known
    offsets; other streams are read here, in order."""
    fd = _positional(f)
    if fd is not None:
        base = f.tell()
        if os.fstat(fd).st_size - base > max(segment_size, content_limit):
            yield from _segments_at_offsets(f, fd, base, segment_size)
            return
    yield from _segments_in_order(f, segment_size, read_size)


def _positional(f: BinaryIO) -> int | None:
    """The descriptor of ``f`` if it is a regular file that can be read at offsets."""
    try:
        fd = f.fileno()
        if not (hasattr(os, "preadv") and f.seekable()):
            return None
        return fd if stat.S_ISREG(os.fstat(fd).st_mode) else None
    except (AttributeError, OSError, ValueError):
        return None


def _segments_at_offsets(f: BinaryIO, fd: int, base: int, segment_size: int) -> Iterator[Segment]:
    """Segments filled by ``os.preadv`` on the worker that chunks them (no read on the
    calling thread), up to the size the file has; then, while it has grown, more; then an
    empty final segment. Leaves ``f`` at the end."""

    def filler(length: int) -> Callable[[Segment], None]:
        def fill(seg: Segment) -> None:
            assert seg.owned is not None
            view = memoryview(seg.owned)[:length]
            n = 0
            while n < length:
                got = os.preadv(fd, [view[n:]], base + seg.start + n)
                if not got:
                    break
                n += got
            seg.data = view[:n]

        return fill

    start = 0
    while True:
        size = os.fstat(fd).st_size - base
        if start >= size and not os.pread(fd, 1, base + start):
            break
        while start < size:
            length = min(segment_size, size - start)
            yield Segment(start, b"", False, _buffer(segment_size), filler(length))
            start += length
    f.seek(base + start)
    yield Segment(start, b"", True, None)


def _segments_in_order(f: BinaryIO, segment_size: int, read_size: int) -> Iterator[Segment]:
    """Segments read here, in order. One is read ahead, to know whether the one before it
    is the last."""
    start = 0
    pending: Segment | None = None
    while True:
        buf = _buffer(segment_size)
        view = memoryview(buf)
        filled = 0
        while filled < segment_size:
            n = f.readinto(view[filled : filled + read_size])
            if not n:
                break
            filled += n
        if filled == 0:
            _give_back(buf)  # before the last yield: the consumer need not resume us
            if pending is None:
                pending = Segment(0, b"", False, None)
            pending.final = True
            yield pending
            return
        if pending is not None:
            yield pending
        pending = Segment(start, view[:filled], False, buf)
        start += filled


def leaf_level(
    segments: Iterator[Segment], params: ChunkParams, content_limit: int = 0
) -> tuple[Level, bytes | None]:
    """The leaf level of the stream the segments cover, and its content if it is at most
    ``content_limit`` bytes (small files are sketched over their sub-chunks)."""
    first = next(segments)
    if first.final:  # one segment: no threads
        ends = _scanner(params).scan(first.data, 0, True)
        level = Level(*hash_chunks(first.data, ends))
        content = bytes(first.data) if len(first.data) <= content_limit else None
        if first.owned is not None:
            _give_back(first.owned)
        return level, content
    leaves = _Leaves(params)
    executor = _workers()
    in_flight: deque[_Job] = deque()
    head: bytearray | None = bytearray()  # the content while it is within the limit

    def submit(seg: Segment) -> None:
        nonlocal head
        if seg.fill is not None and not seg.data:  # to be read on a worker: a large file
            head = None
        if head is not None:
            head += seg.data
            if len(head) > content_limit:
                head = None
        job = _Job(seg, params)
        executor.submit(_chunk_and_hash, job)
        in_flight.append(job)

    def splice_oldest() -> None:
        job = in_flight.popleft()
        leaves.splice(job.seg, *job.result())
        if job.seg.owned is not None:
            _give_back(job.seg.owned)

    submit(first)
    for seg in segments:
        submit(seg)
        while len(in_flight) >= IN_FLIGHT or (in_flight and in_flight[0].done.is_set()):
            splice_oldest()
    while in_flight:
        splice_oldest()
    return leaves.level(), None if head is None else bytes(head)
