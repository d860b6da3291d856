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
from rdc.content.chunking import scanner_for
from rdc.content.tree import HASH_BYTES, Level
from rdc.params import ChunkParams

Buffer = bytes | bytearray | memoryview

SEGMENT_SIZE = 2 << 20
# Streams known to be this large are cut into segments of at least LARGE_SEGMENT_SIZE: each
# segment costs a splice on the calling thread and two thread hand-offs (2-3% of two cores
# at 2 MiB), and a large stream still gives each worker many segments.
LARGE_STREAM = 64 << 20
LARGE_SEGMENT_SIZE = 4 << 20
READ_SIZE = 1 << 20
WORKERS = max(1, min(os.cpu_count() or 1, 8))
IN_FLIGHT = 2 * WORKERS + 2
# The calling thread looks for the meeting of the chains this many max-size chunks at a time.
STEP_CHUNKS = 2
# Bytes of the next segment a source hands a worker with each segment (``Segment.ahead``):
# the worker continues its chain into them (at most STEP_CHUNKS max-size chunks), so that
# the splice usually only has to compare offsets.
OVERHANG = 64 << 10


# Packed hashes and lengths of the chunks of a buffer: (data, ends, start=0) -> (bytes, array).
hash_chunks = _native.hash_chunks


def segment_size_for(total: int, segment_size: int) -> int:
    """The segment size for a stream of ``total`` bytes, given the smallest wanted."""
    return max(segment_size, LARGE_SEGMENT_SIZE) if total >= LARGE_STREAM else segment_size


@dataclass
class Segment:
    start: int  # stream offset of data[0]
    data: Buffer
    final: bool
    owned: bytearray | None  # a pool buffer to give back once spliced
    fill: Callable[[Segment], None] | None = None  # reads data (and ahead) on the worker
    ahead: Buffer = b""  # the stream bytes that follow data, up to OVERHANG of them


@dataclass
class OwnChain:
    """A segment's own chain (from its first byte): its cuts (segment offsets), the hashes
    and lengths of its chunks, and the same for its continuation into ``Segment.ahead``."""

    ends: list[int]
    hashes: bytes
    lengths: array
    ahead_ends: list[int]
    ahead_hashes: bytes
    ahead_lengths: array


def own_chain(seg: Segment, params: ChunkParams) -> OwnChain:
    """Chunk and hash a segment from its first byte, then on into the bytes ahead of it.
    Runs on a worker: the chunker and the hashes release the GIL."""
    scanner = scanner_for(params)
    ends = scanner.scan(seg.data, 0, seg.final)
    hashes, lengths = hash_chunks(seg.data, ends)
    ahead_ends: list[int] = []
    ahead_hashes, ahead_lengths = b"", array("Q")
    if ends and seg.ahead and not seg.final:
        last = ends[-1]
        probe = memoryview(seg.ahead)[: STEP_CHUNKS * params.max_size]
        joined = bytes(memoryview(seg.data)[last:]) + probe
        ahead_ends = scanner.scan(joined, last, False)
        ahead_hashes, ahead_lengths = hash_chunks(joined, [e - last for e in ahead_ends])
    return OwnChain(ends, hashes, lengths, ahead_ends, ahead_hashes, ahead_lengths)


class _Job:
    """One segment's own chain: read (if a worker reads it), chunked and hashed on a worker."""

    def __init__(self, seg: Segment, params: ChunkParams) -> None:
        self.seg = seg
        self.params = params
        self.chain: OwnChain | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()

    def result(self) -> OwnChain:
        self.done.wait()
        if self.error is not None:
            raise self.error
        assert self.chain is not None
        return self.chain


def _chunk_and_hash(job: _Job) -> None:
    """A worker's task. Reading, chunking and hashing all release the GIL."""
    try:
        if job.seg.fill is not None:
            job.seg.fill(job.seg)
        job.chain = own_chain(job.seg, job.params)
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
        # The chain's cuts in the next segment's first bytes, when the last segment's chain
        # is the true one through its last cut: (ends, hashes, lengths), ends as offsets in
        # the next segment.
        self.ahead: tuple[list[int], bytes, array] | None = None
        self.met = 0  # segments whose chain the true chain met
        self.rechunked = 0  # segments the calling thread had to chunk itself

    def take(self, hashes: bytes, lengths: array) -> None:
        self.hashes.append(hashes)
        self.lengths.extend(lengths)

    def splice(self, seg: Segment, chain: OwnChain) -> None:
        """Extend the chain through ``seg``, whose own chain (from ``seg.start``) is
        ``chain``."""
        ahead, self.ahead = self.ahead, None
        if not self.tail:
            # The chain is at the segment's start, so the segment's chain is the true one.
            self.take(chain.hashes, chain.lengths)
        elif not (ahead and self._meet_ahead(ahead, chain)):
            self._carry(seg, chain)
            return
        self._adopt(seg, chain)

    def _adopt(self, seg: Segment, chain: OwnChain) -> None:
        """The true chain is the segment's own through its last cut: go on from there."""
        if chain.ends:
            self.cut = seg.start + chain.ends[-1]
            shift = len(seg.data)
            self.ahead = ([e - shift for e in chain.ahead_ends], chain.ahead_hashes,
                          chain.ahead_lengths)
        self.tail = bytes(memoryview(seg.data)[self.cut - seg.start :])

    def _meet_ahead(self, ahead: tuple[list[int], bytes, array], chain: OwnChain) -> bool:
        """Where the true chain's cuts past the segment's start (found by the worker of the
        segment before) meet the segment's own chain, take the first up to the meeting and
        the second after it. False if they do not meet there."""
        ahead_ends, ahead_hashes, ahead_lengths = ahead
        ends = chain.ends
        j = 0
        for i, end in enumerate(ahead_ends):
            while j < len(ends) and ends[j] < end:
                j += 1
            if j < len(ends) and ends[j] == end:
                self.take(ahead_hashes[: HASH_BYTES * (i + 1)], ahead_lengths[: i + 1])
                self.take(chain.hashes[HASH_BYTES * (j + 1) :], chain.lengths[j + 1 :])
                self.met += 1
                return True
        return False

    def _carry(self, seg: Segment, chain: OwnChain) -> None:
        """Chunk the true chain from its last cut into ``seg``, a few chunks at a time, until
        it lands on a cut of the segment's chain; from there, take the segment's leaves. If
        they never meet, the true chunks of the whole segment are hashed here."""
        ends, hashes, lengths = chain.ends, chain.hashes, chain.lengths
        offset = len(self.tail)  # data offset of the segment's first byte
        total = offset + len(seg.data)
        step = STEP_CHUNKS * self.params.max_size
        scanner = scanner_for(self.params)
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
                    self._adopt(seg, chain)
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
# Bytes of idle buffers kept for the next file (a fresh buffer costs its page faults).
KEEP_BYTES = (IN_FLIGHT + 1) * (SEGMENT_SIZE + OVERHANG)


def _buffer(size: int) -> bytearray:
    with _pool_lock:
        for i, buf in enumerate(_free):
            if len(buf) == size:
                return _free.pop(i)
    return bytearray(size)


def _give_back(buf: bytearray) -> None:
    """Keep ``buf`` for reuse, dropping the buffers given back longest ago if the pool is
    full: the sizes in use now (a run of small files after a large one) stay."""
    with _pool_lock:
        _free.append(buf)
        while sum(map(len, _free)) > KEEP_BYTES:
            _free.pop(0)


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
    segment_size = segment_size_for(len(view), segment_size)
    for start in range(0, max(len(view), 1), segment_size):
        end = min(start + segment_size, len(view))
        ahead = view[end : end + OVERHANG]
        yield Segment(start, view[start:end], end == len(view), None, ahead=ahead)


def segments_of_file(
    f: BinaryIO, segment_size: int, read_size: int, content_limit: int = 0
) -> Iterator[Segment]:
    """Segments of ``f`` from its position to its end, each in a pool buffer. A regular
    file larger than a segment (and than ``content_limit``) is read by the workers at known
    offsets; other streams are read here, in order."""
    at = positional(f)
    if at is not None:
        fd, base, size = at
        if size > max(segment_size, content_limit):
            yield from _segments_at_offsets(f, fd, base, segment_size_for(size, segment_size))
            return
    yield from _segments_in_order(f, segment_size, read_size)


def positional(f: BinaryIO) -> tuple[int, int, int] | None:
    """(descriptor, position, bytes from there to the end) of ``f`` if it is a regular file
    that can be read at offsets (one fstat says both what it is and how long)."""
    try:
        fd = f.fileno()
        if not (hasattr(os, "preadv") and f.seekable()):
            return None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        base = f.tell()
        return fd, base, st.st_size - base
    except (AttributeError, OSError, ValueError):
        return None


def _segments_at_offsets(f: BinaryIO, fd: int, base: int, segment_size: int) -> Iterator[Segment]:
    """Segments filled by ``os.preadv`` on the worker that chunks them (no read on the
    calling thread), up to the size the file has; then, while it has grown, more; then an
    empty final segment. Leaves ``f`` at the end."""

    def filler(length: int) -> Callable[[Segment], None]:
        def fill(seg: Segment) -> None:
            assert seg.owned is not None
            view = memoryview(seg.owned)[: length + OVERHANG]
            n = 0
            while n < len(view):
                got = os.preadv(fd, [view[n:]], base + seg.start + n)
                if not got:
                    break
                n += got
            seg.data = view[: min(n, length)]
            seg.ahead = view[len(seg.data) : n] if n >= length else b""

        return fill

    start = 0
    while True:
        size = os.fstat(fd).st_size - base
        if start >= size and not os.pread(fd, 1, base + start):
            break
        while start < size:
            length = min(segment_size, size - start)
            yield Segment(start, b"", False, _buffer(segment_size + OVERHANG), filler(length))
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
        ends = scanner_for(params).scan(first.data, 0, True)
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
        leaves.splice(job.seg, job.result())
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
