"""End to end: a big file with a few small edits (overwrites, an insertion, a deletion)
costs little on the wire, in both directions, and arrives byte for byte."""

from __future__ import annotations

import os
import random
import shutil

import pytest

from .conftest import scaled
from .e2e_support import E2E, assert_same_tree, edited_copy, file_hash, random_file

SIZE = scaled(256 << 20, 2 << 20)  # the pure-Python chunker is about 100x slower
SMALL = 1 << 20  # what a few small edits may cost, literal data and wire bytes alike


def small_edits(seed: int, size: int) -> list[tuple[int, int, bytes]]:
    """Three overwrites, an insertion and a deletion, spread over the file."""
    rng = random.Random(seed)
    offsets = sorted(rng.sample(range(4096, size - 4096, 4096), 5))
    return [
        (offsets[0], 16, rng.randbytes(16)),
        (offsets[1], 100, rng.randbytes(100)),
        (offsets[2], 0, b"inserted " * 11),  # everything after it shifts
        (offsets[3], 4, b"ABCD"),
        (offsets[4], 50, b""),  # deleted
    ]


def edit_in_place(path: os.PathLike[str] | str, seed: int) -> None:
    """Apply `small_edits` to ``path`` the way an editor saves: a new file renamed over."""
    path = os.fspath(path)
    edited_copy(path, path + ".new", small_edits(seed, os.path.getsize(path)))
    os.replace(path + ".new", path)


@pytest.mark.slow
def test_small_edits_to_a_big_file_send_little_both_ways(e2e: E2E) -> None:
    src, share = e2e.tmp / "src", e2e.tmp / "share"
    src.mkdir()
    share.mkdir()
    random_file(src / "big.bin", SIZE, seed=2024)
    shutil.copyfile(src / "big.bin", share / "big.bin")  # the server holds the old version
    server = e2e.serve({"s": share})

    edit_in_place(src / "big.bin", seed=1)
    new = file_hash(src / "big.bin")
    pushed = e2e.push(src, server.url("s")).ok()
    assert file_hash(share / "big.bin") == new
    assert_same_tree(src, share)
    stats = pushed.stats
    assert stats["files_transferred"] == 1
    assert 0 < stats["literal_bytes"] < SMALL, stats
    assert stats["bytes_sent"] < SMALL, stats
    assert stats["bytes_received"] < SMALL, stats
    assert stats["literal_bytes"] + stats["matched_bytes"] == os.path.getsize(src / "big.bin")
    assert stats["in_step"] is True

    edit_in_place(share / "big.bin", seed=2)  # now the server's copy changes
    new = file_hash(share / "big.bin")
    pulled = e2e.pull(server.url("s"), src).ok()
    assert file_hash(src / "big.bin") == new
    assert_same_tree(share, src)
    stats = pulled.stats
    assert stats["files_transferred"] == 1
    assert 0 < stats["literal_bytes"] < SMALL, stats
    assert stats["bytes_received"] < SMALL, stats
    assert stats["bytes_sent"] < SMALL, stats
    assert stats["in_step"] is True
