"""Choosing seeds for a file the target is about to receive: the file at the same path
and the files whose sketches resemble the offered one (cross-file RDC)."""

from __future__ import annotations

from collections.abc import Callable

from rdc.local.replica import Replica
from rdc.transfer.descent import SeedFile


def choose_seeds(replica: Replica, path: str | None, sketch: bytes | None) -> list[SeedFile]:
    """Seeds from ``replica``'s index: ``path`` itself if indexed, then the best sketch
    candidates; a file that cannot be opened is skipped."""
    seeds = []
    for seed_path, tree in replica.seed_trees(path, sketch):
        read = replica.reader(seed_path)
        if read is not None:
            seeds.append(SeedFile(tree, read))
    return seeds


def file_reader(path: str) -> Callable[[int, int], bytes]:
    """(offset, length) -> bytes of the file at ``path`` (short if it shrank): a seed or
    source outside any replica (``rdc delta`` of two files)."""

    def read(offset: int, length: int) -> bytes:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(length)

    return read
