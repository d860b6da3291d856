"""Choosing seeds for a file the target is about to receive: the file at the same path and
the files whose sketches resemble the offered one (cross-file RDC)."""

from __future__ import annotations

import os
from collections.abc import Callable

from rdc.descent import SeedFile
from rdc.index import CANDIDATE_LIMIT, CANDIDATE_THRESHOLD, IndexDatabase
from rdc.tree import TreeFormatError


def file_reader(path: str) -> Callable[[int, int], bytes]:
    """(offset, length) -> bytes of the file at ``path`` (short if it shrank)."""

    def read(offset: int, length: int) -> bytes:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(length)

    return read


def choose_seeds(
    db: IndexDatabase,
    root: str,
    path: str | None,
    sketch: bytes | None,
    threshold: int = CANDIDATE_THRESHOLD,
    limit: int = CANDIDATE_LIMIT,
) -> list[SeedFile]:
    """Seeds from the index of the directory ``root``: ``path`` itself if indexed, then the
    best sketch candidates. A stored tree that does not check out is skipped."""
    chosen: list[int] = []
    same = db.get(path) if path is not None else None
    if same is not None:
        chosen.append(same.id)
    if sketch is not None:
        for file_id, _ in db.candidates(sketch, threshold, limit, exclude=same and same.id):
            chosen.append(file_id)
    seeds = []
    for file_id in chosen:
        row = db.by_id(file_id)
        try:
            tree = db.tree(file_id)
        except TreeFormatError:
            continue
        seeds.append(SeedFile(tree, file_reader(os.path.join(root, row.path))))
    return seeds
