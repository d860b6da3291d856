"""The 12 inverted trait lists of an index, in memory (DESIGN.md section 3).

A candidate query reads 12 lists of about n/64 files each, whatever it asks; SQLite took
4 ms for it among 100,000 files, and a first copy asks it once per new file. Held here as
768 arrays of 4-byte file ids (5 MB for 100,000 files) and counted in C
(`rdc._native.trait_candidates`), the same query takes microseconds. The database stays
the truth: the lists are built from its ``sketch`` column on first use, kept in step by the index's
own writes, and dropped when another connection may have changed it. (Until index schema 2
they were a table as well: 12 rows in two B-trees per file written.)
"""

from __future__ import annotations

import sqlite3
from array import array

from rdc import _native
from rdc._native.constants import TRAITS
from rdc.content.sketch import TRAIT_VALUES, buckets

BUCKETS = TRAITS * TRAIT_VALUES


class TraitLists:
    """File ids by trait bucket (``t * 64 + value``)."""

    def __init__(self) -> None:
        self.lists = [array("I") for _ in range(BUCKETS)]
        self.max_id = 0

    @classmethod
    def load(cls, conn: sqlite3.Connection) -> TraitLists:
        out = cls()
        lists = out.lists
        top = 0
        for file_id, sketch in conn.execute(
            "SELECT id, sketch FROM file WHERE sketch IS NOT NULL ORDER BY id"
        ):
            for bucket in buckets(sketch):
                lists[bucket].append(file_id)
            top = file_id
        out.max_id = top
        return out

    def add(self, file_id: int, sketch: bytes) -> None:
        for bucket in buckets(sketch):
            self.lists[bucket].append(file_id)
        self.max_id = max(self.max_id, file_id)

    def remove(self, file_id: int, sketch: bytes) -> None:
        for bucket in buckets(sketch):
            ids = self.lists[bucket]
            try:
                ids.remove(file_id)
            except ValueError:
                continue

    def candidates(self, sketch: bytes, threshold: int, limit: int,
                   exclude: int | None) -> list[tuple[int, int]]:
        """Files sharing at least ``threshold`` traits with ``sketch``, best first (most
        traits, then lowest id, as the SQL query ordered them): (file id, traits)."""
        lists = [self.lists[bucket] for bucket in buckets(sketch)]
        return _native.trait_candidates(
            lists, self.max_id, threshold, limit, -1 if exclude is None else exclude
        )
