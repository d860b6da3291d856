"""Refinement below the fine sub-chunks (rdc.content.refine): a literal range described as
ops against the block hashes of the old bytes it replaces; in a transfer, what it saves and
what happens when a short block hash matches the wrong bytes."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rdc._native import refine_ref
from rdc.content import refine
from rdc.content.signature import signature_of_bytes
from rdc.params import REFINE_BLOCK
from rdc.transfer.descent import SeedFile, SeedMap, SourceFile, rebuild, simulate
from rdc.transfer.stats import Options

from .conftest import PURE
from .protocol_support import Pair, tree_state, write

try:
    from rdc._native import _refine
except ImportError:  # the pure-Python run may have no build
    if not PURE:
        raise
    _refine = None


@st.composite
def edited(draw: st.DrawFn) -> tuple[bytes, bytes]:
    """Old bytes and a version of them with a few insertions, deletions, overwrites."""
    old = draw(st.binary(max_size=1500))
    new = bytearray(old)
    for _ in range(draw(st.integers(0, 4))):
        at = draw(st.integers(0, len(new)))
        cut = draw(st.integers(0, 40))
        new[at : at + cut] = draw(st.binary(max_size=40))
    return old, bytes(new)


def wide_hashes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hashes long enough that a chance match never happens in a test."""
    monkeypatch.setattr(refine, "REFINE_HASH", 4)
    monkeypatch.setattr(refine, "MAX_HASHES", 4 * (refine.REFINE_LIMIT // REFINE_BLOCK + 1))


@settings(max_examples=300, deadline=None)
@given(edited())
def test_ops_rebuild_the_new_bytes(pair: tuple[bytes, bytes]) -> None:
    old, new = pair
    with pytest.MonkeyPatch.context() as monkeypatch:
        wide_hashes(monkeypatch)
        ops = refine.encode(new, refine.block_hashes(old), len(old))
        out, copied = refine.decode(ops, old, len(new))
    assert out == new
    assert copied % REFINE_BLOCK == 0 and copied <= len(new)
    assert len(ops) <= len(new) + 3 * (len(new) // REFINE_BLOCK + 2)


@settings(max_examples=300, deadline=None)
@given(edited())
def test_two_byte_hashes_always_rebuild_the_right_length(pair: tuple[bytes, bytes]) -> None:
    """With the real, short hashes a chance match gives wrong bytes, never a wrong length:
    the leaf or root check downstream is what catches it."""
    old, new = pair
    out, _ = refine.decode(refine.encode(new, refine.block_hashes(old), len(old)), old,
                           len(new))
    assert len(out) == len(new)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.binary(max_size=300), st.integers(0, 400))
def test_malformed_ops_are_a_value_error(ops: bytes, old: bytes, length: int) -> None:
    try:
        out, copied = refine.decode(ops, old, length)
    except ValueError:
        return
    assert len(out) == length and copied <= length


def test_a_small_edit_costs_its_bytes_not_its_range() -> None:
    rng = random.Random(5)
    old = bytes(rng.randrange(32, 127) for _ in range(4010))
    new = old[:1000] + b"a new word" + old[1003:]
    ops = refine.encode(new, refine.block_hashes(old), len(old))
    assert refine.decode(ops, old, len(new))[0] == new
    assert len(ops) < 2 * REFINE_BLOCK + 20  # the edit's block or two, and a few varints
    assert len(refine.block_hashes(old)) == 2 * (4010 // REFINE_BLOCK + 1)  # and a tail


def test_worth_refining_wants_an_edit_not_a_rewrite() -> None:
    assert refine.worth_refining(200, 180)
    assert not refine.worth_refining(40, 40)  # too short to gain
    assert not refine.worth_refining(200, 4000)  # not the same range
    assert not refine.worth_refining(5000, 20_000)  # more old bytes than a request carries


def _text(rng: random.Random, words: int) -> bytes:
    vocabulary = [b"alpha", b"beta", b"gamma", b"delta", b"sync", b"chunk", b"tree", b"\n"]
    return b" ".join(rng.choice(vocabulary) + b"%d" % rng.randrange(1000)
                     for _ in range(words))


def _scattered(data: bytes, rng: random.Random, edits: int) -> bytes:
    out = bytearray(data)
    for _ in range(edits):
        at = rng.randrange(len(out) - 10)
        out[at : at + 4] = b"EDIT"
    return bytes(out)


def test_a_descent_sends_the_changed_bytes_below_the_sub_chunks() -> None:
    rng = random.Random(7)
    old = _text(rng, 30_000)
    new = _scattered(old, rng, 12)
    seeds = SeedMap([SeedFile(signature_of_bytes(old).tree, lambda o, n: old[o : o + n])])
    source = SourceFile(signature_of_bytes(new).tree, lambda o, n: new[o : o + n])
    plan, report, literal = simulate(source, seeds, False)
    assert rebuild(plan, seeds, literal) == new
    assert report.refined_bytes > 0 and any(item.old for item in plan.fetch)
    # fine sub-chunks alone sent ~12 x 180+ bytes; the edits themselves are 48
    assert report.literal_bytes < plan.literal_bytes() / 2
    assert report.literal_bytes + report.refined_bytes == plan.literal_bytes()


async def _pushed_then_edited(tmp_path: Path, seed: int) -> tuple[Pair, Path]:
    """A server holding a 200 KB text file, and its source with 6 small edits since."""
    rng = random.Random(seed)
    src = tmp_path / "src"
    src.mkdir()
    old = _text(rng, 20_000)
    write(src / "big.txt", old)
    pair = Pair(tmp_path)
    await pair.run("push", src)
    write(src / "big.txt", _scattered(old, rng, 6))
    return pair, src


async def test_a_chance_block_match_is_fetched_again_plain(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every block hash the same: each refined range is rebuilt wrong, its leaf fails its
    check, and the target asks for the range again plain; the file arrives right."""
    pair, src = await _pushed_then_edited(tmp_path, 11)
    monkeypatch.setattr(refine, "refine_encode", refine_ref.encode)  # a key it can patch
    monkeypatch.setattr(refine_ref, "key", lambda block, size: b"\0" * size)
    stats = await pair.run("push", src, options=Options())
    assert stats.in_step and not stats.failed
    assert tree_state(pair.share) == tree_state(src)
    assert 0 < stats.literal_bytes < 10_000  # ranges, not the whole file
    pair.close()


async def test_a_push_of_scattered_edits_refines(tmp_path) -> None:
    pair, src = await _pushed_then_edited(tmp_path, 13)
    stats = await pair.run("push", src)
    assert stats.in_step and not stats.failed
    assert tree_state(pair.share) == tree_state(src)
    assert stats.literal_bytes < 6 * 2 * REFINE_BLOCK + 200  # about a block or two each
    pair.close()


async def test_a_fetch_of_more_to_refine_than_a_target_asks_is_refused() -> None:
    """Refining costs the source a search per byte: one fetch asks for at most as much as
    a target ever does."""
    from rdc.errors import ProtocolError
    from rdc.transfer import source as source_side

    data = bytes(range(256)) * 4
    file = SourceFile(signature_of_bytes(data).tree, lambda o, n: data[o : o + n])
    item = (0, 0, len(data), b"\0\0", 32)
    items = [item] * (source_side.REFINED_LIMIT // len(data) + 1)
    with pytest.raises(ProtocolError, match="to refine"):
        await source_side._send_items(None, file, items)  # type: ignore[arg-type]


@st.composite
def encoder_inputs(draw: st.DrawFn) -> tuple[bytes, bytes, int, int]:
    """An edited pair, the block and hash sizes, and (sometimes) hashes of other bytes:
    chance matches, runs merged and not, blocks found far from where they were."""
    old, new = draw(edited())
    block = draw(st.sampled_from([4, 8, REFINE_BLOCK]))
    hash_bytes = draw(st.sampled_from([1, 2, 4]))
    starts = refine_ref.block_starts(len(old), block)
    if draw(st.booleans()):
        hashes = b"".join(refine_ref.key(old[s : s + block], hash_bytes) for s in starts)
    else:
        hashes = draw(st.binary(min_size=len(starts) * hash_bytes,
                                max_size=len(starts) * hash_bytes))
    return new, hashes, len(old), block, hash_bytes


@settings(max_examples=400, deadline=None)
@given(encoder_inputs())
def test_the_c_encoder_gives_the_references_ops(case) -> None:
    new, hashes, old_length, block, hash_bytes = case
    c_encode = _refine.encode if _refine is not None else None
    expected = refine_ref.encode(new, hashes, old_length, block, hash_bytes, 1 << 14)
    if c_encode is None:
        pytest.skip("the pure-Python run has no C encoder")
    assert c_encode(new, hashes, old_length, block, hash_bytes, 1 << 14) == expected
    assert c_encode(memoryview(bytearray(new)), hashes, old_length, block, hash_bytes,
                    1 << 14) == expected


def test_the_encoders_refuse_the_same_inputs() -> None:
    encoders = [refine_ref.encode] + ([_refine.encode] if _refine is not None else [])
    for encode in encoders:
        with pytest.raises(ValueError):
            encode(b"x" * 100, b"ab", 64, 32, 2, 1 << 14)  # 2 blocks need 4 bytes
        with pytest.raises(ValueError):
            encode(b"x" * 100, b"", (1 << 14) + 1, 32, 2, 1 << 14)
    if _refine is not None:
        with pytest.raises(ValueError):
            _refine.encode(b"x", b"", 0, 32, 5, 1 << 14)
        with pytest.raises(TypeError):
            _refine.encode("text", b"", 0, 32, 2, 1 << 14)
