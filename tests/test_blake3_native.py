"""The C chunk hashes agree with their specification (blake3-py, one call per chunk) bit for
bit, on every code path this CPU can run."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from array import array

import blake3
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rdc import _native
from rdc._native import blake3_ref

from .conftest import PURE, scaled

_blake3 = pytest.importorskip("rdc._native._blake3") if PURE else None
if _blake3 is None:
    from rdc._native import _blake3

PATHS = _blake3.paths()
KiB = 1 << 10
MiB = 1 << 20
# Around the block (64 bytes) and BLAKE3-chunk (1 KiB) edges, where flags and the tree
# change shape.
EDGES = [0, 1, 63, 64, 65, 127, 128, 1023, 1024, 1025, 2047, 2048, 2049, 3072, 3073, 4095,
         4096, 4097, 8191, 8192, 8193, 16 * KiB, 31 * KiB, 33 * KiB + 7, MiB - 1, MiB]
# The official test vectors' input lengths; their input is bytes i % 251.
VECTOR_LENGTHS = [0, 1, 1023, 1024, 1025, 2048, 2049, 3072, 3073, 4096, 4097, 5120, 5121,
                  6144, 6145, 7168, 7169, 8192, 8193, 16384, 31744, 102400]


def expected(data: bytes | memoryview, ends: list[int], start: int = 0) -> bytes:
    starts = [start, *ends][: len(ends)]
    return b"".join(blake3.blake3(data[s:e]).digest() for s, e in zip(starts, ends, strict=True))


@st.composite
def chunked(draw: st.DrawFn) -> tuple[bytes, list[int], int]:
    """(data, ends, start): random bytes after a prefix of 0..70 bytes (so chunks start at
    every alignment), cut into chunks of edge, small, odd, multiple-of-64 and multiple-of-1024
    lengths, and up to two large ones (to 1 MiB) among them."""
    rng = random.Random(draw(st.integers(0, 2**32)))
    small = st.one_of(
        st.sampled_from(EDGES[:-2]),
        st.integers(0, 20_000),
        st.integers(0, 300).map(lambda k: 64 * k),
        st.integers(0, 20).map(lambda k: 1024 * k),
        st.integers(0, 10_000).map(lambda k: 2 * k + 1),
    )
    lengths = draw(st.lists(small, max_size=scaled(80, 20)))
    big = draw(st.lists(st.one_of(st.sampled_from(EDGES[-2:]), st.integers(0, MiB)), max_size=2))
    for n in big:
        lengths.insert(rng.randint(0, len(lengths)), n)
    start = draw(st.integers(0, 70))
    data = rng.randbytes(start + sum(lengths) + draw(st.integers(0, 100)))
    ends, at = [], start
    for n in lengths:
        at += n
        ends.append(at)
    return data, ends, start


# None: the best path, which runs a short last run of jobs on a narrower kernel.
@pytest.mark.parametrize("path", [*PATHS, None])
@given(case=chunked())
def test_hashes_match_blake3(path: str | None, case: tuple[bytes, list[int], int]) -> None:
    data, ends, start = case
    hashes, lengths = _blake3.hash_chunks(data, ends, start, path=path)
    assert hashes == expected(data, ends, start)
    assert (hashes, lengths) == blake3_ref.hash_chunks(data, ends, start)


CONTEXTS = ["rdc 2026-11 merkle tree node v1", "", "x" * 1500]  # one block, empty, 2 chunks


@pytest.mark.parametrize("path", PATHS)
@given(case=chunked(), context=st.sampled_from(CONTEXTS))
def test_derive_key_mode_matches_blake3(
    path: str, case: tuple[bytes, list[int], int], context: str
) -> None:
    """Tree nodes are hashed in BLAKE3's derive-key mode: a context key, then every
    compression of the material under it with its own flag."""
    data, ends, start = case
    starts = [start, *ends][: len(ends)]
    want = b"".join(
        blake3.blake3(data[s:e], derive_key_context=context).digest()
        for s, e in zip(starts, ends, strict=True)
    )
    hashes, _ = _blake3.hash_chunks(data, ends, start, path=path, context=context)
    assert hashes == want
    assert blake3_ref.hash_chunks(data, ends, start, context=context)[0] == want
    if ends and ends[-1] > start:
        assert hashes != _blake3.hash_chunks(data, ends, start, path=path)[0]


@pytest.mark.parametrize("path", PATHS)
def test_official_vector_lengths(path: str) -> None:
    data = bytes(i % 251 for i in range(max(VECTOR_LENGTHS)))
    for n in VECTOR_LENGTHS:
        assert _blake3.hash_chunks(data, [n], path=path)[0] == blake3.blake3(data[:n]).digest()
    # All in one call, each from the start of the pattern: one batch, lanes of all lengths.
    joined = b"".join(data[:n] for n in VECTOR_LENGTHS)
    ends = [sum(VECTOR_LENGTHS[: i + 1]) for i in range(len(VECTOR_LENGTHS))]
    assert _blake3.hash_chunks(joined, ends, path=path)[0] == expected(joined, ends)


def test_official_vector_of_empty_input() -> None:
    """The one official vector short enough to quote, so the comparisons above cannot share
    a mistake with the blake3 package."""
    digest = "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
    for path in PATHS:
        assert _blake3.hash_chunks(b"", [0], path=path)[0].hex() == digest


@pytest.mark.parametrize("path", PATHS)
def test_many_chunks_across_batches(path: str) -> None:
    """More BLAKE3 chunks than one batch holds (1024), and whole 1 MiB chunks between small
    ones, so batches are cut at every kind of place."""
    rng = random.Random(7)
    lengths = [rng.choice([0, 1, 1500, 8192, 12_000, MiB, MiB - 1, 700_000]) for _ in range(30)]
    data = rng.randbytes(sum(lengths) + 3)
    ends = [sum(lengths[: i + 1]) + 3 for i in range(len(lengths))]
    assert _blake3.hash_chunks(data, ends, 3, path=path)[0] == expected(data, ends, 3)


@pytest.mark.parametrize("path", PATHS)
def test_unaligned_buffers(path: str) -> None:
    rng = random.Random(8)
    data = rng.randbytes(20_000)
    for offset in range(0, 40, 3):
        view = memoryview(data)[offset:]
        ends = sorted(rng.randrange(len(view)) for _ in range(9))
        assert _blake3.hash_chunks(view, ends, path=path)[0] == expected(view, ends)


@pytest.mark.parametrize("impl", [_blake3.hash_chunks, blake3_ref.hash_chunks])
def test_bad_ends_are_refused(impl) -> None:
    data = bytes(3 * MiB)
    assert impl(data, []) == (b"", array("Q"))
    for ends, start in (([5, 4], 0), ([3], 4), ([len(data) + 1], 0), ([MiB + 1], 0)):
        with pytest.raises(ValueError):
            impl(data, ends, start)
    assert impl(data, [MiB + 1], 1)[1].tolist() == [MiB]


def test_unknown_path_is_refused() -> None:
    with pytest.raises(ValueError):
        _blake3.hash_chunks(b"abc", [3], path="neon")
    assert _blake3.default_path() in PATHS
    assert PATHS[0] == "scalar"


def run_with_path(value: str) -> subprocess.CompletedProcess:
    code = "from rdc._native import _blake3; print(_blake3.default_path())"
    env = {**os.environ, "RDC_BLAKE3_PATH": value}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)


def test_a_path_can_be_forced_from_the_environment() -> None:
    done = run_with_path("scalar")
    assert done.returncode == 0 and done.stdout.strip() == "scalar"
    done = run_with_path("neon")
    assert done.returncode != 0 and "RDC_BLAKE3_PATH=neon" in done.stderr


def test_the_picked_implementation() -> None:
    expected_impl = blake3_ref.hash_chunks if PURE else _blake3.hash_chunks
    assert _native.hash_chunks is expected_impl
