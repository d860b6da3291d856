"""The winnowing chunker: fast path == reference, streaming, bounds, shift resistance, and
the frozen format."""

from __future__ import annotations

import functools
import hashlib
import itertools
import os
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rdc import _native
from rdc._native import chunker_ref
from rdc.content.chunking import Chunker, boundaries, chunks_of
from rdc.params import DEFAULT_CHUNKS, SUB_PARAMS, ChunkParams

from .conftest import PURE, scaled


def reference_cuts(data: bytes, params: ChunkParams) -> list[int]:
    scanner = chunker_ref.ReferenceScanner(params.window, params.min_size, params.max_size)
    return scanner.scan(data, 0, True)


def fast_cuts(data: bytes, params: ChunkParams, filter: bool = True) -> list[int]:
    return _native.Scanner(params.window, params.min_size, params.max_size, filter).scan(
        data, 0, True
    )


def assert_all_paths_agree(data: bytes, params: ChunkParams) -> list[int]:
    expected = reference_cuts(data, params)
    assert fast_cuts(data, params) == expected
    assert fast_cuts(data, params, filter=False) == expected
    return expected


params_strategy = st.sampled_from([16, 32, 64]).flatmap(
    lambda w: st.integers(w, w + 600).flatmap(
        lambda lo: st.builds(ChunkParams, st.just(w), st.just(lo), st.integers(lo + 1, lo + 2500))
    )
)


def low_entropy(draw_bytes: bytes) -> bytes:
    """Bytes from a tiny alphabet, in runs: many tied lead bytes and repeated windows."""
    out = bytearray()
    for b in draw_bytes:
        out += bytes([b & 3]) * (1 + (b >> 2))
    return bytes(out)


@given(st.binary(max_size=scaled(20000, 6000)), params_strategy)
def test_fast_path_matches_reference_on_arbitrary_data(data: bytes, params: ChunkParams) -> None:
    assert_all_paths_agree(data, params)


@given(st.binary(max_size=scaled(3000, 800)), params_strategy)
def test_fast_path_matches_reference_on_low_entropy_data(data: bytes, params) -> None:
    assert_all_paths_agree(low_entropy(data), params)


GRID = [
    ChunkParams(16, 16, 17),
    ChunkParams(16, 64, 300),
    ChunkParams(32, 256, 1024),
    ChunkParams(64, 64, 5000),
    ChunkParams(32, 2048, 14336),
    DEFAULT_CHUNKS,
]


def data_classes(size: int) -> dict[str, bytes]:
    rng = random.Random(size)
    words = b"winnowing chunk rabin gear lead window minimum sketch trait merkle".split()
    text = b" ".join(rng.choice(words) for _ in range(size // 4))[:size]
    classes = {
        "random": rng.randbytes(size),
        "zeros": bytes(size),
        "text": text,
        "zeros-then-random": bytes(size // 2) + rng.randbytes(size - size // 2),
    }
    for period in range(1, 65):
        classes[f"period-{period}"] = (rng.randbytes(period) * (size // period + 1))[:size]
    return classes


@pytest.mark.parametrize("params", GRID, ids=lambda p: f"{p.window}-{p.min_size}-{p.max_size}")
def test_fast_path_matches_reference_on_data_classes(params: ChunkParams) -> None:
    for name, data in data_classes(scaled(120_000, 30_000)).items():
        expected = reference_cuts(data, params)
        assert fast_cuts(data, params) == expected, name
        assert fast_cuts(data, params, filter=False) == expected, name


@pytest.mark.parametrize("order", ["up", "down"])
@pytest.mark.parametrize("max_size", [40, 280, 1000])
def test_fast_path_matches_reference_on_sorted_keys(fixtures_dir, order, max_size) -> None:
    with open(os.path.join(fixtures_dir, f"sorted_keys_{order}.bin"), "rb") as f:
        data = f.read()
    assert_all_paths_agree(data, ChunkParams(16, 16, max_size))
    assert_all_paths_agree(data, ChunkParams(16, 30, max_size + 7))


def test_sorted_keys_fixture_really_has_long_sorted_runs(fixtures_dir) -> None:
    with open(os.path.join(fixtures_dir, "sorted_keys_up.bin"), "rb") as f:
        data = f.read()
    keys = [k for _, k in chunker_ref.window_keys(data, 16, len(data), ChunkParams(16, 16, 17))]
    ascending = sum(b >= a for a, b in itertools.pairwise(keys))
    assert ascending >= 0.98 * (len(keys) - 1)


def test_lead_filter_evaluates_ext_rarely_on_random_data() -> None:
    if PURE:
        pytest.skip("the reference evaluates every key by design")
    data = random.Random(1).randbytes(8 << 20)
    scanner = _native.Scanner(32, 2048, 14336)
    scanner.scan(data, 0, True)
    assert scanner.ext_evaluations < 0.01 * len(data)
    baseline = _native.Scanner(32, 2048, 14336, False)
    baseline.scan(data, 0, True)
    assert baseline.ext_evaluations > 0.5 * len(data)


def test_zeros_need_no_ext_at_all() -> None:
    if PURE:
        pytest.skip("the reference evaluates every key by design")
    scanner = _native.Scanner(32, 2048, 14336)
    scanner.scan(bytes(1 << 20), 0, True)
    assert scanner.ext_evaluations == 0


# ---------------------------------------------------------------- streaming


def stream_cuts(data: bytes, splits: list[int], params: ChunkParams) -> list[int]:
    chunker = Chunker(params)
    cuts: list[int] = []
    start = 0
    for size in splits:
        cuts += chunker.feed(data[start : start + size])
        start += size
    cuts += chunker.feed(data[start:])
    return cuts + chunker.finish()


@given(
    st.binary(max_size=scaled(30000, 8000)),
    st.lists(st.integers(0, 5000), max_size=40),
    params_strategy,
)
def test_streaming_splits_do_not_move_boundaries(data, splits, params) -> None:
    assert stream_cuts(data, splits, params) == boundaries(data, params)


def test_one_byte_reads_give_the_same_boundaries() -> None:
    params = ChunkParams(32, 64, 700)
    data = random.Random(9).randbytes(scaled(40_000, 6_000))
    data += bytes(3000) + data[:5000]
    assert stream_cuts(data, [1] * len(data), params) == boundaries(data, params)


def test_streaming_keeps_bounded_memory() -> None:
    params = ChunkParams(32, 256, 1024)
    chunker = Chunker(params)
    rng = random.Random(4)
    for _ in range(scaled(200, 20)):
        chunker.feed(rng.randbytes(4096))
        assert len(chunker._pending) < params.max_size + 4096


def test_feed_after_finish_is_refused() -> None:
    chunker = Chunker()
    chunker.feed(b"abc")
    assert chunker.finish() == [3]
    with pytest.raises(ValueError):
        chunker.feed(b"more")


# ---------------------------------------------------------------- sizes


@pytest.mark.parametrize("params", GRID[1:], ids=lambda p: f"{p.min_size}-{p.max_size}")
def test_chunks_stay_within_bounds(params: ChunkParams) -> None:
    for name, data in data_classes(scaled(300_000, 20_000)).items():
        lengths = [c.length for c in chunks_of(data, params)]
        assert sum(lengths) == len(data)
        assert all(params.min_size < n <= params.max_size for n in lengths[:-1]), name
        assert 0 < lengths[-1] <= params.max_size


def test_zeros_give_exactly_max_size_chunks() -> None:
    params = DEFAULT_CHUNKS
    size = scaled(100, 6) * params.max_size + 123
    lengths = [c.length for c in chunks_of(bytes(size), params)]
    assert lengths == [params.max_size] * (size // params.max_size) + [123]


def test_empty_and_tiny_inputs() -> None:
    assert boundaries(b"") == []
    assert boundaries(b"x") == [1]
    assert boundaries(bytes(DEFAULT_CHUNKS.min_size)) == [DEFAULT_CHUNKS.min_size]


def test_invalid_parameters_are_refused() -> None:
    for bad in [(24, 100, 200), (32, 16, 200), (32, 200, 200), (32, 100, (1 << 20) + 1)]:
        with pytest.raises(ValueError):
            ChunkParams(*bad)
        with pytest.raises(ValueError):
            _native.Scanner(*bad)


def test_scan_refuses_data_after_the_last_cut() -> None:
    scanner = _native.Scanner(32, 64, 128)
    with pytest.raises(ValueError):
        scanner.scan(b"x" * 10, 5, False)


# ---------------------------------------------------------------- shift resistance


def surviving_fraction(old: bytes, new: bytes, params: ChunkParams) -> float:
    """Fraction of the old chunks (by bytes) found unchanged among the new ones."""
    new_chunks = {new[c.offset : c.offset + c.length] for c in chunks_of(new, params)}
    old_chunks = chunks_of(old, params)
    kept = sum(c.length for c in old_chunks if old[c.offset : c.offset + c.length] in new_chunks)
    return kept / len(old)


@pytest.mark.parametrize("edit", ["insert", "delete"])
def test_small_edits_near_the_start_keep_almost_all_chunks(edit: str) -> None:
    # 16 MiB with the default parameters; the pure run keeps the chunk count (about 1,900)
    # by scaling the chunk sizes down with the data.
    params = DEFAULT_CHUNKS if not PURE else ChunkParams(32, 128, 896)
    rng = random.Random(edit)
    old = rng.randbytes(scaled(16 << 20, 1 << 20))
    for size in (1, 2, 7, 31, 64, 100):
        at = rng.randrange(100, 3 * params.max_size)
        if edit == "insert":
            new = old[:at] + rng.randbytes(size) + old[at:]
        else:
            new = old[:at] + old[at + size :]
        assert surviving_fraction(old, new, params) >= 0.99, (edit, size, at)


# ---------------------------------------------------------------- frozen format


def digest_of_cuts(cuts: list[int]) -> str:
    return hashlib.sha256(b"".join(c.to_bytes(8, "little") for c in cuts)).hexdigest()[:16]


GOLDEN_INPUTS = {
    "random": lambda: random.Random(2024).randbytes(300_000),
    "text": lambda: b"".join(
        b"%d rows of winnowing in the %s\n" % (i, b"book" if i % 7 else b"code")
        for i in range(12_000)
    ),
    "zeros": lambda: bytes(100_000),
}
GOLDEN_PARAMS = [
    ChunkParams(16, 64, 300),
    ChunkParams(32, 256, 1024),
    ChunkParams(64, 1000, 9000),
    DEFAULT_CHUNKS,
]
# Computed once and checked equal to the reference scanner's cuts.
GOLDEN = {
    "random/16/64/300": "857f4dc0df486d68",
    "random/32/256/1024": "9dc92b1cb03aa01b",
    "random/32/4096/12288": "40335a1e6369abe3",
    "random/64/1000/9000": "cb905c4a95ca3bdd",
    "text/16/64/300": "a3729cd4b7179428",
    "text/32/256/1024": "1ac1d739fad8ffff",
    "text/32/4096/12288": "6f202c8a51b2dd7d",
    "text/64/1000/9000": "f0abad1bd033dc59",
    "zeros/16/64/300": "9f6155027b8102a8",
    "zeros/32/256/1024": "b5b34506af003177",
    "zeros/32/4096/12288": "02b519d5cc891fe2",
    "zeros/64/1000/9000": "302fb3fa5165abd6",
}


def test_boundaries_are_frozen() -> None:
    """A change here is a format break: every stored signature would stop matching."""
    found = {}
    for name, make in GOLDEN_INPUTS.items():
        data = make()
        for p in GOLDEN_PARAMS:
            found[f"{name}/{p.window}/{p.min_size}/{p.max_size}"] = digest_of_cuts(
                boundaries(data, p)
            )
    assert found == GOLDEN


# ---------------------------------------------------------------- code paths, sparse rolling
#
# Every code path the CPU runs (portable, sse2, avx2) and every sparse setting (automatic;
# off: every lead stored; forced thresholds, which also make short windows roll sparse and
# miss often) must cut exactly where the reference does.

C_ONLY = pytest.mark.skipif(PURE, reason="the C code paths; the pure run tests the reference")
if PURE:
    PATHS: list[str] = []
else:
    from rdc._native import _chunker

    PATHS = _chunker.paths()
SPARSE = [None, -1, 0, 3, 255]
CONFIGS = [(path, sparse) for path in PATHS for sparse in SPARSE]
config_ids = [f"{path}-sparse{sparse}" for path, sparse in CONFIGS]


def config_scanner(params: ChunkParams, path: str, sparse: int | None) -> _native.Scanner:
    return _chunker.Scanner(
        params.window, params.min_size, params.max_size, path=path, sparse_lead=sparse
    )


def config_cuts(data: bytes, params: ChunkParams, path: str, sparse: int | None) -> list[int]:
    return config_scanner(params, path, sparse).scan(data, 0, True)


def config_stream_cuts(
    data: bytes, splits: list[int], params: ChunkParams, path: str, sparse: int | None
) -> list[int]:
    """Feed `data` in pieces of the given sizes (then the rest), keeping only the bytes
    from the last cut, as `Chunker` does."""
    scanner = config_scanner(params, path, sparse)
    pending, base, start, cuts = b"", 0, 0, []
    for size in [*splits, len(data)]:
        pending += data[start : start + size]
        start += size
        new = scanner.scan(pending, base, False)
        if new:
            pending = pending[new[-1] - base :]
            base = new[-1]
        cuts += new
    return cuts + scanner.scan(pending, base, True)


def mixed_segments(seed: int, size: int, random_run: int = 30000) -> bytes:
    """Random stretches between zeros and short periods: windows flip between sparse rolling
    and stored leads, and some sparse windows find no small lead and roll again."""
    rng = random.Random(seed)
    out = bytearray()
    while len(out) < size:
        kind = rng.randrange(3)
        if kind == 0:
            out += rng.randbytes(rng.randrange(2000, random_run))
            continue
        n = rng.randrange(2000, 30000)
        if kind == 1:
            out += bytes(n)
        else:
            out += (rng.randbytes(rng.randrange(1, 80)) * n)[:n]
    return bytes(out[:size])


CLASS_PARAMS = [GRID[1], GRID[2], ChunkParams(32, 1024, 5000), DEFAULT_CHUNKS]


@functools.cache
def classes_with_reference_cuts() -> list[tuple[str, bytes, ChunkParams, list[int]]]:
    """The data classes (a few of the periods) and a mix, with the reference's cuts under
    each of CLASS_PARAMS: computed once for all the configurations that compare with them."""
    classes = data_classes(60_000)
    chosen = {k: v for k, v in classes.items() if not k.startswith("period-")}
    for period in (1, 2, 3, 4, 5, 8, 13, 32, 63, 64):
        chosen[f"period-{period}"] = classes[f"period-{period}"]
    chosen["mixed"] = mixed_segments(1, 240_000)
    return [
        (name, data, params, reference_cuts(data, params))
        for name, data in chosen.items()
        for params in CLASS_PARAMS
    ]


@C_ONLY
@pytest.mark.parametrize(("path", "sparse"), CONFIGS, ids=config_ids)
def test_every_path_and_sparse_setting_matches_reference_on_data_classes(path, sparse) -> None:
    for name, data, params, expected in classes_with_reference_cuts():
        assert config_cuts(data, params, path, sparse) == expected, (name, params)


@C_ONLY
@pytest.mark.parametrize(("path", "sparse"), CONFIGS, ids=config_ids)
def test_every_path_and_sparse_setting_matches_reference_on_sorted_keys(
    fixtures_dir, path, sparse
) -> None:
    for order in ("up", "down"):
        with open(os.path.join(fixtures_dir, f"sorted_keys_{order}.bin"), "rb") as f:
            data = f.read()
        for lo, hi in ((16, 40), (30, 1007), (64, 3000)):
            params = ChunkParams(16, lo, hi)
            assert config_cuts(data, params, path, sparse) == reference_cuts(data, params)
        # Tiled, with the default sizes: windows span whole sorted runs.
        tiled = data * 40
        params = ChunkParams(16, DEFAULT_CHUNKS.min_size, DEFAULT_CHUNKS.max_size)
        assert config_cuts(tiled, params, path, sparse) == reference_cuts(tiled, params)


@C_ONLY
@given(
    st.binary(max_size=20000),
    params_strategy,
    st.sampled_from(CONFIGS or [("portable", None)]),
)
def test_every_path_matches_reference_on_arbitrary_data(data, params, config) -> None:
    assert config_cuts(data, params, *config) == reference_cuts(data, params)


@C_ONLY
@given(
    st.binary(max_size=3000),
    params_strategy,
    st.sampled_from(CONFIGS or [("portable", None)]),
)
def test_every_path_matches_reference_on_low_entropy_data(data, params, config) -> None:
    data = low_entropy(data)
    assert config_cuts(data, params, *config) == reference_cuts(data, params)


@C_ONLY
@given(
    st.integers(0, 2**32),
    st.integers(1000, 60000),
    params_strategy,
    st.sampled_from(CONFIGS or [("portable", None)]),
)
def test_every_path_matches_reference_on_mixed_segments(seed, size, params, config) -> None:
    data = mixed_segments(seed, size)
    assert config_cuts(data, params, *config) == reference_cuts(data, params)


@C_ONLY
@given(
    st.binary(max_size=30000),
    st.lists(st.integers(0, 5000), max_size=40),
    params_strategy,
    st.sampled_from(CONFIGS or [("portable", None)]),
)
def test_every_path_streams_to_the_same_cuts(data, splits, params, config) -> None:
    assert config_stream_cuts(data, splits, params, *config) == reference_cuts(data, params)


# Windows too short to roll sparse (the sub-chunks among them) roll their leads ahead, a
# ring of 8 KiB or more at a time, whatever the last cut: buffers of several rings, and
# buffers shorter than the window or the minimum size, whole and streamed.
AHEAD_PARAMS = [
    SUB_PARAMS,
    ChunkParams(16, 16, 17),
    ChunkParams(32, 40, 900),
    ChunkParams(64, 64, 2000),
]
AHEAD_CONFIGS = [(path, sparse) for path in PATHS for sparse in (None, -1)]


@st.composite
def ring_sized_data(draw) -> bytes:
    size = draw(st.one_of(st.integers(0, 70), st.integers(0, 40_000)))
    rng = random.Random(draw(st.integers(0, 2**32)))
    kind = draw(st.sampled_from(["random", "zeros", "periodic", "sorted", "mixed"]))
    if kind == "random":
        return rng.randbytes(size)
    if kind == "zeros":
        return bytes(size)
    if kind == "periodic":
        return (rng.randbytes(rng.randrange(1, 80)) * size)[:size]
    if kind == "sorted":
        return bytes(sorted(rng.randbytes(size)))
    return mixed_segments(rng.randrange(2**32), size, random_run=3000)


@C_ONLY
@given(
    ring_sized_data(),
    st.sampled_from(AHEAD_PARAMS),
    st.lists(st.integers(0, 9000), max_size=8),
    st.sampled_from(AHEAD_CONFIGS or [("portable", None)]),
)
def test_rolling_ahead_matches_reference(data, params, splits, config) -> None:
    expected = reference_cuts(data, params)
    assert config_cuts(data, params, *config) == expected
    assert config_stream_cuts(data, splits, params, *config) == expected


@C_ONLY
@pytest.mark.parametrize(("path", "sparse"), CONFIGS, ids=config_ids)
def test_every_path_fed_one_byte_at_a_time(path, sparse) -> None:
    params = ChunkParams(32, 64, 2600)
    data = mixed_segments(7, 12_000) + random.Random(9).randbytes(8000)
    expected = reference_cuts(data, params)
    assert config_stream_cuts(data, [1] * len(data), params, path, sparse) == expected


@C_ONLY
@pytest.mark.parametrize("path", PATHS)
def test_scans_may_start_before_the_last_cut(path) -> None:
    """Each scan passes the stream from its start, growing: bytes before the last cut are
    there again, and ignored."""
    params = ChunkParams(32, 512, 4000)
    data = mixed_segments(3, 80_000)
    scanner = config_scanner(params, path, None)
    cuts = []
    for end in range(0, len(data), 7919):
        cuts += scanner.scan(data[:end], 0, False)
    cuts += scanner.scan(data, 0, True)
    assert cuts == reference_cuts(data, params)


@C_ONLY
@pytest.mark.parametrize("path", PATHS)
def test_random_data_is_rolled_sparse_and_zeros_densely(path) -> None:
    rand = random.Random(5).randbytes(4 << 20)
    scanner = config_scanner(DEFAULT_CHUNKS, path, None)
    scanner.scan(rand, 0, True)
    assert scanner.sparse_windows > 0
    assert scanner.dense_windows == scanner.rerolled == 0
    assert scanner.ext_evaluations < 0.01 * len(rand)
    zeros = config_scanner(DEFAULT_CHUNKS, path, None)
    zeros.scan(bytes(4 << 20), 0, True)
    # Zeros have no small lead: the first window is rolled again, then all stay dense.
    assert zeros.sparse_windows == 0
    assert zeros.rerolled <= 1
    assert zeros.dense_windows > 300
    assert zeros.ext_evaluations == 0


@C_ONLY
@pytest.mark.parametrize("path", PATHS)
def test_mixed_data_switches_modes_without_moving_cuts(path) -> None:
    data = mixed_segments(11, 3 << 20, random_run=300_000)
    scanner = config_scanner(DEFAULT_CHUNKS, path, None)
    cuts = scanner.scan(data, 0, True)
    assert scanner.sparse_windows > 20
    assert scanner.dense_windows > 20
    assert scanner.rerolled > 0
    dense = config_scanner(DEFAULT_CHUNKS, path, -1)
    assert cuts == dense.scan(data, 0, True)
    assert dense.sparse_windows == dense.rerolled == 0


@C_ONLY
def test_sparse_rolling_is_automatic_only_for_long_windows() -> None:
    data = random.Random(6).randbytes(1 << 20)
    long_windows = config_scanner(ChunkParams(32, 1024, 3072), PATHS[-1], None)
    long_windows.scan(data, 0, True)
    assert long_windows.sparse_windows > 0
    short = ChunkParams(32, 256, 1024)
    automatic = config_scanner(short, PATHS[-1], None)
    cuts = automatic.scan(data, 0, True)
    assert automatic.sparse_windows == 0
    forced = config_scanner(short, PATHS[-1], 0)
    assert forced.scan(data, 0, True) == cuts
    # About one such window in twenty has no lead of 0 and is rolled again.
    assert forced.sparse_windows > 0
    assert forced.rerolled > 0
