"""Chunking and hashing in parallel segments gives exactly the sequential leaves."""

from __future__ import annotations

import io
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rdc.content.chunking import boundaries
from rdc.content.leaves import _Leaves, hash_chunks, own_chain, segments_of_buffer, segments_of_file
from rdc.content.signature import signature_of_bytes, signature_of_file
from rdc.content.tree import Level
from rdc.params import FINE_PARAMS, MID_PARAMS, ChunkParams, SignatureParams

from .conftest import scaled

SMALL = ChunkParams(window=16, min_size=64, max_size=300)  # many chunks in little data


def sequential_leaves(data: bytes, params: ChunkParams) -> Level:
    return Level(*hash_chunks(data, boundaries(data, params)))


def spliced(data: bytes, params: ChunkParams, segment_size: int, ahead: bool = True) -> _Leaves:
    """The leaves as ``leaf_level`` splices them, here on one thread; without ``ahead``, no
    segment sees the bytes after it (as when a pipe is read in order)."""
    leaves = _Leaves(params)
    for seg in segments_of_buffer(data, segment_size):
        if not ahead:
            seg.ahead = b""
        leaves.splice(seg, own_chain(seg, params))
    return leaves


def data_of(kind: str, size: int, rng: random.Random) -> bytes:
    """Input classes: random, zeros, short periods, few-symbol runs, and random with long
    zero runs (chains that stop meeting, then meet again)."""
    if kind == "random":
        return rng.randbytes(size)
    if kind == "zeros":
        return bytes(size)
    if kind == "periodic":
        return (rng.randbytes(rng.randint(1, 40)) * (size + 1))[:size]
    if kind == "runs":
        out = bytearray()
        while len(out) < size:
            out += bytes([rng.randrange(3)]) * rng.randint(1, 200)
        return bytes(out[:size])
    out = bytearray()
    while len(out) < size:
        out += rng.randbytes(rng.randint(1, 3000)) + bytes(rng.randint(0, 3000))
    return bytes(out[:size])


kinds = st.sampled_from(["random", "zeros", "periodic", "runs", "random and zeros"])
segment_sizes = st.one_of(st.integers(1, 1200), st.sampled_from([299, 300, 301, 600, 4096]))


@given(
    kinds, st.integers(0, scaled(40_000, 8_000)), segment_sizes, st.integers(0, 2**32),
    st.booleans(),
)
def test_spliced_segments_equal_sequential_chunking(
    kind: str, size: int, segment_size: int, seed: int, ahead: bool
) -> None:
    data = data_of(kind, size, random.Random(seed))
    assert spliced(data, SMALL, segment_size, ahead).level() == sequential_leaves(data, SMALL)


@given(kinds, st.integers(0, scaled(12_000, 6_000)), segment_sizes, st.integers(1, 5000))
def test_signatures_do_not_depend_on_segments_or_reads(
    kind: str, size: int, segment_size: int, read_size: int
) -> None:
    params = SignatureParams(chunks=SMALL)
    data = data_of(kind, size, random.Random(size))
    whole = signature_of_bytes(data, params, segment_size=1 << 30)
    assert whole.tree.leaves == sequential_leaves(data, SMALL)
    assert signature_of_bytes(data, params, segment_size=segment_size) == whole
    streamed = signature_of_file(
        io.BytesIO(data), params, read_size=read_size, segment_size=segment_size
    )
    assert streamed == whole


@pytest.mark.parametrize("ahead", [True, False])
def test_random_data_meets_each_segment_within_the_probe(ahead: bool) -> None:
    data = random.Random(4).randbytes(scaled(300_000, 60_000))
    leaves = spliced(data, SMALL, 3000, ahead)
    assert leaves.level() == sequential_leaves(data, SMALL)
    assert leaves.rechunked == 0
    assert leaves.met == len(range(0, len(data), 3000)) - 1


def test_the_bytes_ahead_spare_the_calling_thread_any_chunking(monkeypatch) -> None:
    """With the bytes ahead of each segment, random data is spliced by comparing offsets:
    the calling thread chunks only where the chains meet later than the probe reaches."""
    data = random.Random(5).randbytes(scaled(300_000, 60_000))
    carried = []
    real = _Leaves._carry
    monkeypatch.setattr(_Leaves, "_carry", lambda self, *a: (carried.append(1), real(self, *a)))
    leaves = spliced(data, SMALL, 3000)
    assert leaves.level() == sequential_leaves(data, SMALL)
    segments = len(range(0, len(data), 3000))
    assert leaves.met == segments - 1
    assert len(carried) <= segments // 20


def test_misaligned_zeros_are_rechunked_and_still_exact() -> None:
    data = b"x" * 7 + bytes(scaled(20_000, 6_000))
    leaves = spliced(data, SMALL, 1000)
    assert leaves.level() == sequential_leaves(data, SMALL)
    assert leaves.rechunked > 0


def test_default_parameters_over_real_segments(tmp_path) -> None:
    data = random.Random(9).randbytes(scaled(9 << 20, 1 << 20) + 12345)
    path = tmp_path / "big"
    path.write_bytes(data)
    one_segment = signature_of_bytes(data, segment_size=1 << 30)
    with open(path, "rb") as f:
        assert signature_of_file(f, segment_size=scaled(1 << 20, 200_000)) == one_segment
        assert f.read() == b""  # the file was read to its end
    assert signature_of_bytes(data, segment_size=scaled(1 << 20, 200_000)) == one_segment


def test_files_read_at_offsets_by_the_workers(tmp_path) -> None:
    """A regular file larger than a segment is read with preadv on the workers, from the
    file's position, and left at its end."""
    data = random.Random(10).randbytes(scaled(3 << 20, 400_000) + 777)
    path = tmp_path / "file"
    path.write_bytes(data)
    for skip, segment_size in ((0, 100_000), (12_345, 150_001), (len(data) - 5, 1000)):
        with open(path, "rb") as f:
            f.seek(skip)
            signature = signature_of_file(f, segment_size=segment_size)
            assert f.tell() == len(data)
        assert signature == signature_of_bytes(data[skip:], segment_size=1 << 30)


def test_a_file_growing_while_read_is_read_to_its_end(tmp_path) -> None:
    path = tmp_path / "growing"
    first = random.Random(11).randbytes(300_000)
    path.write_bytes(first)
    more = random.Random(12).randbytes(50_000)
    with open(path, "rb") as f:
        segments = segments_of_file(f, 100_000, 1 << 20, 0)
        planned = [next(segments) for _ in range(3)]
        with open(path, "ab") as g:
            g.write(more)
        rest = list(segments)
    assert [s.start for s in planned + rest] == [0, 100_000, 200_000, 300_000, 350_000]
    assert rest[-1].final and not rest[-1].fill


def test_concurrent_signatures_share_the_workers() -> None:
    """Callers on several threads (as in an index refresh) share the workers, and each gets
    its own exact result."""
    from concurrent.futures import ThreadPoolExecutor

    rng = random.Random(13)
    inputs = [rng.randbytes(scaled(1 << 20, 150_000) + i) for i in range(4)]
    expected = [signature_of_bytes(d, segment_size=1 << 30) for d in inputs]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda d: signature_of_bytes(d, segment_size=40_000), inputs))
    assert got == expected


@given(kinds, st.integers(0, scaled(60_000, 10_000)), st.lists(st.integers(1, 9000), min_size=1))
def test_stream_signer_hashes_each_piece_as_signature_of_bytes(
    kind: str, size: int, pieces: list[int]
) -> None:
    from rdc.content.stream import StreamSigner

    params = SignatureParams(chunks=SMALL)
    data = data_of(kind, size, random.Random(size))
    signer = StreamSigner(params)
    at = 0
    while at < len(data):
        n = pieces[at % len(pieces)]
        signer.feed(data[at : at + n])
        at += n
    assert signer.finish() == signature_of_bytes(data, params)


def fed(signer, data: bytes, pieces: list[int]):
    at = 0
    while at < len(data):
        n = pieces[at % len(pieces)]
        signer.feed(data[at : at + n])
        at += n
    return signer.finish()


@given(kinds, st.integers(1, scaled(60_000, 10_000)), st.lists(st.integers(1, 9000), min_size=1),
       st.integers(0, 2**32))
def test_a_stream_signed_at_known_leaf_ends_has_its_signature_and_other_ends_another_root(
    kind: str, size: int, pieces: list[int], seed: int
) -> None:
    """Told the leaf ends (a delta's target knows them from the source's tree), the signer
    hashes there without chunking: the same signature. Told other ends, or fed more or
    fewer bytes than they cover, it makes another root (a file that is not taken), never
    an error."""
    from rdc.content.chunking import boundaries
    from rdc.content.stream import StreamSigner

    params = SignatureParams(chunks=SMALL)
    data = data_of(kind, size, random.Random(size))
    ends = boundaries(data, SMALL)
    expected = signature_of_bytes(data, params)
    assert fed(StreamSigner(params, ends=ends), data, pieces) == expected
    rng = random.Random(seed)
    moved = list(ends)
    k = rng.randrange(len(moved))
    low = moved[k - 1] + 1 if k else 1
    if moved[k] - 1 >= low:  # an end one byte or more earlier (as long as a leaf is left)
        moved[k] = rng.randrange(low, moved[k])
        assert fed(StreamSigner(params, ends=moved), data, pieces).root != expected.root
    cut = rng.randrange(len(data))
    assert fed(StreamSigner(params, ends=ends), data[:cut], pieces).root != expected.root
    longer = data + b"x"
    assert fed(StreamSigner(params, ends=ends), longer, pieces).root != expected.root


@given(kinds, st.integers(0, scaled(60_000, 10_000)), st.lists(st.integers(1, 9000), min_size=1),
       st.sampled_from([bytes, bytearray, memoryview]))
def test_a_signing_thread_signs_as_the_stream_signer_even_if_the_pieces_change_after(
    kind: str, size: int, pieces: list[int], form: type
) -> None:
    """Pieces fed to a SigningThread give the signature of the bytes as they were fed, also
    when the caller reuses its buffer at once (bytearray, memoryview)."""
    from rdc.content.stream import SigningThread, StreamSigner

    params = SignatureParams(chunks=SMALL)
    data = data_of(kind, size, random.Random(size))
    signer = SigningThread(StreamSigner(params))
    at = 0
    while at < len(data):
        n = pieces[at % len(pieces)]
        buffer = bytearray(data[at : at + n])
        signer.feed(bytes(buffer) if form is bytes else form(buffer))
        buffer[:] = bytes(len(buffer))  # the caller's next read, into the same buffer
        at += n
    assert signer.finish() == signature_of_bytes(data, params)
    signer.close()  # (again: a no-op)


def test_a_signing_thread_raises_its_error_at_finish_and_lets_the_writer_on() -> None:
    from rdc.content.stream import SigningThread, StreamSigner

    class Broken(StreamSigner):
        def feed(self, data) -> None:
            raise MemoryError("no room")

    signer = SigningThread(Broken())
    for _ in range(4 * SigningThread.DEPTH):  # more than the queue holds: none blocks
        signer.feed(b"x" * 100)
    with pytest.raises(MemoryError):
        signer.finish()


@given(kinds, st.integers(1, scaled(20_000, 5_000)), st.integers(0, 2**32))
def test_sub_chunk_prefixes_are_blake3_of_each_piece(kind: str, size: int, seed: int) -> None:
    import blake3

    from rdc.content import subchunks
    from rdc.params import SUB_PREFIX

    data = data_of(kind, size, random.Random(seed))

    def prefix(piece: bytes) -> bytes:
        return blake3.blake3(piece).digest()[:SUB_PREFIX]

    mids = subchunks.spans(data, MID_PARAMS)
    keys, _ = subchunks.encode(data, MID_PARAMS)
    assert keys == b"".join(prefix(data[s:e]) for s, e in mids)
    region = subchunks.index_region(3, 1000, data)
    for p in subchunks.SHORT_PREFIXES:
        want_mids: dict[tuple[bytes, int], int] = {}
        want_fines: dict[tuple[bytes, int], int] = {}
        for s, e in mids:
            want_mids.setdefault((prefix(data[s:e])[:p], e - s), 1000 + s)
            for fs, fe in subchunks.spans(data[s:e], FINE_PARAMS):
                want_fines.setdefault((prefix(data[s + fs : s + fe])[:p], fe - fs),
                                      1000 + s + fs)
        for want, pieces in ((want_mids, region.mids), (want_fines, region.fines)):
            assert len(pieces) >= len(want)
            for (key, length), offset in want.items():
                assert pieces.find(key, length) == offset
                assert pieces.find(key, length + 1) in (None, *want.values())


def test_the_buffer_pool_keeps_the_sizes_in_use(monkeypatch) -> None:
    """After a large file fills the pool with large buffers, small files still reuse theirs
    (a fresh buffer per file costs a map and unmap of its pages)."""
    from rdc.content import leaves

    monkeypatch.setattr(leaves, "_free", [])
    for _ in range(3):
        leaves._give_back(bytearray(leaves.KEEP_BYTES // 3))
    small = leaves._buffer(leaves.SEGMENT_SIZE)
    leaves._give_back(small)
    assert leaves._buffer(leaves.SEGMENT_SIZE) is small
    leaves._give_back(small)
    assert sum(map(len, leaves._free)) <= leaves.KEEP_BYTES
