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
from bisect import bisect_left, bisect_right
from math import comb

from rdc import _native
from rdc._native.constants import TRAITS
from rdc.content.sketch import TRAIT_VALUES, buckets

BUCKETS = TRAITS * TRAIT_VALUES
LOAD_ROWS = 16384
# A stored sketch of another length (a damaged row): its traits as they are, none past them.
_NONE = bytes([255]) * TRAITS


def _twelve(sketch: bytes) -> bytes:
    return sketch if len(sketch) == TRAITS else (sketch + _NONE)[:TRAITS]

# Unrelated files a seed query may expect among its candidates, by chance alone: each
# costs a tree read and a seed map, for nothing (docs/formats.md section 4).
CHANCE_CANDIDATES = 0.25


def chance(traits: int) -> float:
    """The probability that an unrelated file shares at least ``traits`` of the 12 traits
    with a query (each agrees with probability 1/64)."""
    p = 1 / TRAIT_VALUES
    return sum(comb(TRAITS, k) * p**k * (1 - p) ** (TRAITS - k) for k in range(traits, TRAITS + 1))


def seed_threshold(files: int, least: int) -> int:
    """The fewest common traits, at least ``least``, at which ``files`` unrelated files are
    expected to give fewer than CHANCE_CANDIDATES candidates: 4 up to ~9,400 files, 5 up
    to ~370,000, 6 beyond (at 4 among 100,000 files, 2.9 a query, and the look-up of
    their trees was a tenth of a server's CPU on a 1%-edited sync)."""
    threshold = least
    while threshold < TRAITS and files * chance(threshold) > CHANCE_CANDIDATES:
        threshold += 1
    return threshold


class TraitLists:
    """File ids by trait bucket (``t * 64 + value``)."""

    def __init__(self) -> None:
        self.lists = [array("I") for _ in range(BUCKETS)]
        self.max_id = 0

    @classmethod
    def load(cls, conn: sqlite3.Connection) -> TraitLists:
        """The lists of every sketch in the index, LOAD_ROWS rows at a time in id order
        (`add_many`; 12 appends a file from Python were 0.2 s for 100,000 files, at every
        writable session's start)."""
        out = cls()
        cursor = conn.execute("SELECT id, sketch FROM file WHERE sketch IS NOT NULL ORDER BY id")
        while rows := cursor.fetchmany(LOAD_ROWS):
            out.add_many([file_id for file_id, _ in rows], [sketch for _, sketch in rows])
        return out

    @property
    def files(self) -> int:
        """How many files the lists hold (each is in one bucket of trait 0)."""
        return sum(len(ids) for ids in self.lists[:TRAIT_VALUES])

    def add(self, file_id: int, sketch: bytes) -> None:
        for bucket in buckets(sketch):
            self.lists[bucket].append(file_id)
        self.max_id = max(self.max_id, file_id)

    def add_many(self, ids: list[int], sketches: list[bytes]) -> None:
        """`add` of files whose ids, ascending, are above every id the lists hold (a
        batch's new rows, or the rows `load` reads), sorted into their buckets natively
        (`_native.trait_buckets`): 12 appends a file from Python were 3% of a first copy's
        server time."""
        if not ids:
            return
        chunks = _native.trait_buckets(array("I", ids), b"".join(map(_twelve, sketches)))
        for ids_there, chunk in zip(self.lists, chunks, strict=True):
            if chunk:
                ids_there.frombytes(chunk)
        self.max_id = max(self.max_id, ids[-1])

    def remove(self, file_id: int, sketch: bytes) -> None:
        """Out of its 12 lists, found by bisection: each list is in id order (loaded so,
        and a new row's id is above every id in the index). ``array.remove`` compared
        its way through ~1,600 boxed ids per list at 100,000 files: 0.4 ms a file
        rewritten, a tenth of a server's CPU on a 1%-edited sync."""
        for bucket in buckets(sketch):
            ids = self.lists[bucket]
            at = bisect_left(ids, file_id)
            if at < len(ids) and ids[at] == file_id:
                del ids[at]
                continue
            try:  # (out of order: cannot be, but then the long way)
                ids.remove(file_id)
            except ValueError:
                continue

    def candidates(self, sketch: bytes, threshold: int, limit: int,
                   exclude: int | None, upto: int | None = None) -> list[tuple[int, int]]:
        """Files sharing at least ``threshold`` traits with ``sketch``, best first (most
        traits, then lowest id, as the SQL query ordered them): (file id, traits); only
        those of id at most ``upto``, if given (each list is in id order)."""
        lists = [self.lists[bucket] for bucket in buckets(sketch)]
        top = self.max_id
        if upto is not None and upto < top:
            lists = [ids[: bisect_right(ids, upto)] for ids in lists]
            top = upto
        return _native.trait_candidates(
            lists, top, threshold, limit, -1 if exclude is None else exclude
        )
