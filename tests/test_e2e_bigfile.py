"""End to end: a big file with a few small edits (overwrites, an insertion, a deletion)
costs little on the wire, in both directions, and arrives byte for byte."""

from __future__ import annotations

import os
import random
import shutil

import pytest

from .conftest import scaled
from .e2e_support import E2E, assert_same_tree, edited_copy, random_file

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
    """Apply `small_edits` to ``path`` the way an editor saves: a new file renamed over.
    It gets a modification time in the past, as files do by the time they are synced (one
    from the last two seconds is "racy": every scan would read all of it again)."""
    path = os.fspath(path)
    edited_copy(path, path + ".new", small_edits(seed, os.path.getsize(path)))
    os.replace(path + ".new", path)
    past(path, seed)


def past(path: os.PathLike[str] | str, seed: int) -> None:
    ns = 1_600_000_000_000_000_000 + seed * 1_000_000_007
    os.utime(path, ns=(ns, ns))


@pytest.mark.slow
def test_small_edits_to_a_big_file_send_little_both_ways(e2e: E2E) -> None:
    src, share = e2e.tmp / "src", e2e.tmp / "share"
    src.mkdir()
    share.mkdir()
    random_file(src / "big.bin", SIZE, seed=2024)
    shutil.copyfile(src / "big.bin", share / "big.bin")  # the server holds the old version
    past(share / "big.bin", 0)
    server = e2e.serve({"s": share})

    edit_in_place(src / "big.bin", seed=1)
    pushed = e2e.push(src, server.url("s")).ok()
    assert_same_tree(src, share)  # byte for byte (sha256), and mode and mtime
    stats = pushed.stats
    assert stats["files_transferred"] == 1
    assert 0 < stats["literal_bytes"] < SMALL, stats
    assert stats["bytes_sent"] < SMALL, stats
    assert stats["bytes_received"] < SMALL, stats
    assert stats["literal_bytes"] + stats["matched_bytes"] == os.path.getsize(src / "big.bin")
    assert stats["in_step"] is True

    edit_in_place(share / "big.bin", seed=2)  # now the server's copy changes
    pulled = e2e.pull(server.url("s"), src).ok()
    assert_same_tree(share, src)
    stats = pulled.stats
    assert stats["files_transferred"] == 1
    assert 0 < stats["literal_bytes"] < SMALL, stats
    assert stats["bytes_received"] < SMALL, stats
    assert stats["bytes_sent"] < SMALL, stats
    assert stats["in_step"] is True


UNRELATED = scaled(48 << 20, 1 << 20)  # over 4,096 unknown leaves with the C extension


@pytest.mark.slow
def test_a_big_file_replaced_by_unrelated_content_arrives_both_ways(e2e: E2E) -> None:
    """The old version is a seed but shares nothing: the target's descent finds thousands
    of unknown leaves, more than one want may name (MAX_ITEMS)."""
    src, share = e2e.tmp / "src", e2e.tmp / "share"
    src.mkdir()
    share.mkdir()
    random_file(src / "f.bin", UNRELATED, seed=1)
    random_file(share / "f.bin", UNRELATED, seed=2)
    past(src / "f.bin", 1)
    past(share / "f.bin", 2)
    server = e2e.serve({"s": share})
    pushed = e2e.push(src, server.url("s")).ok()
    assert_same_tree(src, share)
    assert pushed.stats["literal_bytes"] >= UNRELATED

    random_file(share / "f.bin", UNRELATED, seed=3)
    past(share / "f.bin", 3)
    pulled = e2e.pull(server.url("s"), src).ok()
    assert_same_tree(share, src)
    assert pulled.stats["literal_bytes"] >= UNRELATED




@pytest.mark.slow
def test_a_sub_chunk_prefix_collision_does_not_send_the_file_twice(e2e: E2E) -> None:
    # Seeds found by running the descent in memory: these contents collide (both sizes).
    src, share = e2e.tmp / "src", e2e.tmp / "share"
    src.mkdir()
    share.mkdir()
    random_file(share / "f.bin", UNRELATED, seed=1000)
    random_file(src / "f.bin", UNRELATED, seed=scaled(1003, 1181))
    past(src / "f.bin", 1)
    past(share / "f.bin", 2)
    server = e2e.serve({"s": share})
    pushed = e2e.push(src, server.url("s")).ok()
    assert_same_tree(src, share)
    assert pushed.stats["bytes_sent"] < UNRELATED * 1.25, pushed.stats


def test_copied_pieces_come_from_the_heap_not_fresh_mappings() -> None:
    """A rebuilt file's seed bytes are read a piece at a time into buffers under the
    allocator's mapping threshold (with the bytes object's header), so that each comes
    from the heap the last one went back to; a mapped one is faulted in page by page."""
    import sys

    from rdc.allocator import MMAP_THRESHOLD
    from rdc.transfer import target

    assert sys.getsizeof(bytes(target.COPY_PIECE)) < MMAP_THRESHOLD
    assert target.COPY_RUNS >= target.COPY_PIECE
