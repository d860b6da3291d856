"""The C sketch and tree grouping agree with their pure-Python specification bit for bit."""

from __future__ import annotations

import random
from array import array

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rdc import _native
from rdc._native import signature_ref
from rdc.params import GroupParams

from .conftest import PURE

_signature = pytest.importorskip("rdc._native._signature") if PURE else None
if _signature is None:
    from rdc._native import _signature


@st.composite
def packed_hashes(draw: st.DrawFn, max_entries: int = 3000) -> bytes:
    """Packed hashes with the cases that matter: duplicates, distinct hashes sharing their
    first 8 bytes (ties in every h_t and in group keys), sorted keys, and random ones."""
    n = draw(st.integers(0, max_entries))
    rng = random.Random(draw(st.integers(0, 2**32)))
    pool_size = draw(st.sampled_from([1, 2, 7, max(1, n)]))
    style = draw(st.sampled_from(["random", "shared prefix", "ascending", "descending"]))
    if style == "shared prefix":
        prefixes = [rng.randbytes(8) for _ in range(max(1, pool_size // 3))]
        pool = [rng.choice(prefixes) + rng.randbytes(24) for _ in range(pool_size)]
    else:
        pool = [rng.randbytes(32) for _ in range(pool_size)]
    entries = [rng.choice(pool) for _ in range(n)]
    if style in ("ascending", "descending"):
        entries.sort(key=lambda h: h[:8][::-1], reverse=style == "descending")
    return b"".join(entries)


group_params = st.integers(1, 40).flatmap(
    lambda lo: st.builds(GroupParams, st.just(lo), st.integers(lo + 1, lo + 60))
)


def test_compiled_salts_are_the_specified_ones() -> None:
    salt_h, salt_g = _signature.salts()
    assert tuple(salt_h) == signature_ref.SALT_H
    assert tuple(salt_g) == signature_ref.SALT_G


@given(packed_hashes())
def test_sketch_matches_reference(hashes: bytes) -> None:
    assert _signature.sketch(hashes) == signature_ref.sketch(hashes)


@given(packed_hashes(), group_params)
def test_group_cuts_match_reference(hashes: bytes, params: GroupParams) -> None:
    lo, hi = params.min_entries, params.max_entries
    assert _signature.group_cuts(hashes, lo, hi) == signature_ref.group_cuts(hashes, lo, hi)


@given(packed_hashes(max_entries=600), group_params, st.integers(2, 64), st.integers(0, 2**32))
def test_node_payloads_match_reference(
    hashes: bytes, params: GroupParams, level: int, seed: int
) -> None:
    rng = random.Random(seed)
    lengths = array("Q", (rng.choice([0, 1, 8192, 2**40, 2**52 - 1]) for _ in hashes[::32]))
    lo, hi = params.min_entries, params.max_entries
    expected = signature_ref.next_level_payloads(level, hashes, lengths, lo, hi)
    assert _signature.next_level_payloads(level, hashes, lengths, lo, hi) == expected


def test_group_cuts_at_the_largest_groups() -> None:
    hashes = random.Random(3).randbytes(32 * 9000)
    for lo, hi in ((1, 4096), (4095, 4096), (2048, 4096)):
        assert _signature.group_cuts(hashes, lo, hi) == signature_ref.group_cuts(hashes, lo, hi)


@pytest.mark.parametrize("impl", [_signature, signature_ref], ids=["c", "python"])
def test_bad_arguments_are_refused(impl) -> None:
    with pytest.raises(ValueError):
        impl.sketch(bytes(33))
    with pytest.raises(ValueError):
        impl.group_cuts(bytes(32), 0, 4)
    with pytest.raises(ValueError):
        impl.next_level_payloads(2, bytes(64), array("Q", [1]), 4, 12)


def test_the_selected_implementation_is_the_compiled_one() -> None:
    chosen = (_native.sketch, _native.group_cuts, _native.next_level_payloads)
    if PURE:
        assert chosen == (
            signature_ref.sketch,
            signature_ref.group_cuts,
            signature_ref.next_level_payloads,
        )
    else:
        assert chosen == (
            _signature.sketch,
            _signature.group_cuts,
            _signature.next_level_payloads,
        )


@given(st.lists(st.lists(st.integers(0, 300), max_size=60, unique=True), min_size=1,
                max_size=12),
       st.integers(1, 6), st.integers(0, 20), st.integers(-1, 300))
def test_trait_candidates_match_the_reference(lists, threshold, limit, exclude) -> None:
    buffers = [array("I", ids) for ids in lists]
    got = _native.trait_candidates(buffers, 300, threshold, limit, exclude)
    assert got == signature_ref.trait_candidates(lists, 300, threshold, limit, exclude)


def test_trait_candidates_refuse_an_id_over_the_limit() -> None:
    with pytest.raises(ValueError):
        _native.trait_candidates([array("I", [5])], 4, 1, 1, -1)
    if not PURE:  # the C function reads the ids as uint32 buffers
        with pytest.raises(TypeError):
            _native.trait_candidates([array("Q", [5])], 9, 1, 1, -1)


@given(st.lists(st.binary(min_size=12, max_size=12), max_size=300))
def test_trait_buckets_match_the_reference(sketches) -> None:
    ids = array("I", range(7, 7 + len(sketches)))
    joined = b"".join(sketches)
    assert _signature.trait_buckets(ids, joined) == signature_ref.trait_buckets(ids, joined)
    with pytest.raises(ValueError):
        _signature.trait_buckets(ids, joined + b"x")
