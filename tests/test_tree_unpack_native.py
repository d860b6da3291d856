"""The native reader of a packed tree's levels (`_native.unpack_level`) against the Python
loop it replaces (`rdc.content.tree._level_in_python`): the same levels from any blob, the
same exception types from any malformed one, and `unpack_tree` the same either way."""

from __future__ import annotations

import random
from array import array
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rdc import _native
from rdc.content.entries import put_varint, read_varint
from rdc.content.tree import (
    PACKED_HEAD,
    Level,
    Tree,
    TreeFormatError,
    _level_in_python,
    build_tree,
    pack_tree,
    unpack_tree,
)
from rdc.params import GroupParams

native = pytest.mark.skipif(_native.unpack_level is None, reason="no native code in the pure run")


@contextmanager
def python_levels() -> Iterator[None]:
    """`unpack_tree` as it was: every level read by the Python loop."""
    saved = _native.unpack_level
    _native.unpack_level = None
    try:
        yield
    finally:
        _native.unpack_level = saved


def outcome(fn: Callable[..., Any], *args: Any) -> Any:
    """What ``fn(*args)`` gives, or the exact type of what it raises."""
    try:
        return fn(*args)
    except Exception as exc:
        return type(exc)


def unpacked_both_ways(blob: bytes) -> Any:
    """`unpack_tree`'s outcome on ``blob``, checked to be the same natively and in Python."""
    with python_levels():
        before = outcome(unpack_tree, blob)
    assert outcome(unpack_tree, blob) == before
    return before


def level_spans(blob: bytes) -> list[tuple[int, int]]:
    """(position, entry count) of each level of a well-formed packed tree."""
    data = memoryview(blob)
    count, pos = read_varint(data, len(PACKED_HEAD))
    spans = []
    for _ in range(count):
        n, pos = read_varint(data, pos)
        spans.append((pos, n))
        _, _, pos = _level_in_python(data, pos, n)
    assert pos == len(blob)
    return spans


def random_tree(seed: int, n: int, max_length: int) -> Tree:
    rng = random.Random(seed)
    lengths = array("Q", [rng.randrange(max_length + 1) for _ in range(n)])
    return build_tree(Level(rng.randbytes(32 * n), lengths), GroupParams(2, 8))


def packed_levels(levels: list[list[tuple[bytes, int]]]) -> bytes:
    return pack_tree(Tree(tuple(
        Level(b"".join(h for h, _ in level), array("Q", [n for _, n in level]))
        for level in levels)))


# ---------------------------------------------------------------- well-formed trees


@given(st.integers(0, 2**32 - 1), st.integers(0, 600), st.sampled_from([0, 200, 1 << 40]))
def test_trees_round_trip(seed: int, n: int, max_length: int) -> None:
    tree = random_tree(seed, n, max_length)
    blob = pack_tree(tree)
    assert unpack_tree(blob, GroupParams(2, 8)) == tree
    with python_levels():
        assert unpack_tree(blob, GroupParams(2, 8)) == tree


@native
@given(st.integers(0, 2**32 - 1), st.integers(0, 600), st.sampled_from([0, 200, 1 << 40]))
def test_native_levels_are_the_reference_levels(seed: int, n: int, max_length: int) -> None:
    blob = pack_tree(random_tree(seed, n, max_length))
    for data in (blob, memoryview(blob), bytearray(blob)):
        for pos, count in level_spans(blob):
            got = _native.unpack_level(data, pos, count)
            assert got == _level_in_python(data, pos, count)
            assert type(got[0]) is bytes and got[1].typecode == "Q"


@native
@given(st.lists(st.lists(st.tuples(st.binary(min_size=32, max_size=32),
                                    st.integers(0, (1 << 64) - 1)), max_size=40),
                min_size=1, max_size=5))
def test_native_levels_read_every_varint_width(levels: list) -> None:
    """Any levels (not a tree's), lengths up to 64 bits: the same entries either way."""
    blob = packed_levels(levels)
    for (pos, count), level in zip(level_spans(blob), levels, strict=True):
        hashes, lengths, _ = _native.unpack_level(blob, pos, count)
        assert (hashes, lengths) == _level_in_python(blob, pos, count)[:2]
        assert list(lengths) == [n for _, n in level]


@native
def test_an_empty_level_reads_as_nothing() -> None:
    for data in (b"", b"x" * 40):
        assert _native.unpack_level(data, 0, 0) == (b"", array("Q"), 0)
        assert _native.unpack_level(data, len(data), 0) == (b"", array("Q"), len(data))


# ---------------------------------------------------------------- malformed input


def small_blob() -> bytes:
    return pack_tree(random_tree(3, 12, 1 << 20))


def test_truncated_blobs_fail_the_same_way() -> None:
    blob = small_blob()
    for cut in range(len(blob)):
        got = unpacked_both_ways(blob[:cut])
        assert got is TreeFormatError, (cut, got)


@native
def test_truncated_levels_fail_the_same_way() -> None:
    blob = small_blob()
    spans = level_spans(blob)
    for cut in range(len(blob) + 1):
        data = blob[:cut]
        for pos, count in spans:
            want = outcome(_level_in_python, data, pos, count)
            assert outcome(_native.unpack_level, data, pos, count) == want, (cut, pos)


def one_leaf_level(length_varint: bytes) -> bytes:
    return b"\xab" * 32 + length_varint


@native
@pytest.mark.parametrize(("varint", "want"), [
    (b"\x80" * 9 + b"\x01", 1 << 63),  # 10 bytes, 64 bits: the widest length
    (b"\xff" * 9 + b"\x01", (1 << 64) - 1),
    (b"\x80" * 9 + b"\x02", OverflowError),  # 10 bytes, 65 bits
    (b"\xff" * 9 + b"\x7f", OverflowError),
    (b"\x80" * 10 + b"\x00", ValueError),  # 11 bytes
    (b"\x80" * 12 + b"\x00", ValueError),
    (b"\x80" * 10, ValueError),  # cut short within the varint
    (b"\x80\x80\x80\x80\x80\x80\x80\x80\x80\x82" + b"\x00" * 4, ValueError),
])
def test_overlong_varints(varint: bytes, want: Any) -> None:
    data = one_leaf_level(varint) + b"\0" * 8  # room enough for the plausibility check
    got = outcome(_level_in_python, data, 0, 1)
    if isinstance(want, int):
        assert got[1][0] == want and got[2] == 32 + len(varint)
    else:
        assert got is want
    assert outcome(_native.unpack_level, data, 0, 1) == got


@native
@pytest.mark.parametrize(("pos", "count"), [
    (-1, 1), (-1, 0), (-(1 << 70), 0), (0, -1), (0, -(1 << 70)),  # negative
    (0, 3), (0, 10**9), (0, 1 << 62), (0, 1 << 70), (5, 2),  # more than the data holds
    (100, 0), (1 << 70, 0),  # beyond the data
])
def test_out_of_range_positions_and_counts(pos: int, count: int) -> None:
    data = one_leaf_level(b"\x05") * 2  # 66 bytes: two entries at 0
    assert outcome(_level_in_python, data, pos, count) is ValueError
    assert outcome(_native.unpack_level, data, pos, count) is ValueError
    assert _native.unpack_level(data, 0, 2)[1] == array("Q", [5, 5])


@native
def test_native_refuses_what_is_not_a_buffer_or_index() -> None:
    with pytest.raises(TypeError):
        _native.unpack_level("text", 0, 0)
    with pytest.raises(TypeError):
        _native.unpack_level(b"", 0.0, 0)
    with pytest.raises(TypeError):
        _native.unpack_level(b"", 0)


def blob_of(*parts: bytes | int) -> bytes:
    """A packed-tree head and then ``parts``: ints as varints, bytes as they are."""
    out = bytearray(PACKED_HEAD)
    for part in parts:
        if isinstance(part, int):
            put_varint(part, out)
        else:
            out += part
    return bytes(out)


@pytest.mark.parametrize(("blob", "want"), [
    # a bad varint in a level (too long, over 64 bits, cut short) is damage like any other
    (blob_of(2, 1, one_leaf_level(b"\x80" * 10 + b"\x00"), 1, b"\0" * 40), TreeFormatError),
    (blob_of(2, 1, one_leaf_level(b"\x80" * 9 + b"\x02"), 1, b"\0" * 40), TreeFormatError),
    (blob_of(2, 1, one_leaf_level(b"\x80" * 9)), TreeFormatError),  # cut short in a length
    # and in a hash: the first length's 10 bytes leave the second hash 24
    (blob_of(2, 2, one_leaf_level(b"\x80" * 9 + b"\x00"), b"\xab" * 24), TreeFormatError),
    (blob_of(2, 10**9, b"\0" * 100), TreeFormatError),
    (blob_of(2, 1 << 63, b"\0" * 100), TreeFormatError),
    (blob_of(2, 1 << 70, b"\0" * 100), TreeFormatError),  # an 11-byte varint
    (blob_of(2, 1, b"\0" * 32), TreeFormatError),
    (blob_of(65, b"\0" * 100), TreeFormatError),
    (blob_of(2, 0, 0, b"\0"), TreeFormatError),  # trailing bytes
    (blob_of(2, 0, 1, one_leaf_level(b"\x00")), TreeFormatError),  # not the leaves' root
])
def test_malformed_blobs_are_tree_format_errors(blob: bytes, want: type) -> None:
    assert unpacked_both_ways(blob) is want


@given(st.data())
def test_damaged_blobs_fail_the_same_way(data: st.DataObject) -> None:
    blob = bytearray(small_blob())
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(blob) - 1))
        blob[at] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(blob)))
    got = unpacked_both_ways(bytes(blob[:cut]))
    assert got is TreeFormatError or isinstance(got, Tree)  # never another error
