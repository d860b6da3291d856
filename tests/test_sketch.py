"""Sketch statistics, the resemblance estimate, and candidate recall of the index."""

from __future__ import annotations

import math
import os
import random

import pytest

from rdc.content.signature import FileSignature, signature_of_bytes
from rdc.content.sketch import (
    TRAITS,
    matching_traits,
    resemblance,
    sketch_of,
    trait_match_probability,
)
from rdc.local.index import IndexDatabase, row_of

from .conftest import scaled


def set_pair(rng: random.Random, jaccard: float, union: int = 120) -> tuple[list, list]:
    """Two sets of random 32-byte hashes whose Jaccard similarity is ``jaccard`` (exactly,
    or one element more when the rest does not split evenly)."""
    shared = round(jaccard * union)
    shared += (union - shared) % 2
    only = (union - shared) // 2
    common = [rng.randbytes(32) for _ in range(shared)]
    return common + [rng.randbytes(32) for _ in range(only)], common + [
        rng.randbytes(32) for _ in range(only)
    ]


@pytest.mark.parametrize("jaccard", [0.0, 0.25, 0.5, 0.75, 0.9, 1.0])
def test_trait_match_rate_is_63j_plus_1_over_64(jaccard: float) -> None:
    rng = random.Random(int(jaccard * 1000))
    pairs = scaled(250, 120)
    matches = 0
    estimates = []
    for _ in range(pairs):
        a, b = set_pair(rng, jaccard)
        sa, sb = sketch_of(a), sketch_of(b)
        matches += matching_traits(sa, sb)
        estimates.append(resemblance(sa, sb).estimate)
    trials = pairs * TRAITS
    p = trait_match_probability(jaccard)
    sigma = math.sqrt(max(p * (1 - p), 1e-4) / trials)
    assert abs(matches / trials - p) <= 4 * sigma + 1e-9, (matches / trials, p)
    assert abs(sum(estimates) / pairs - jaccard) <= 4 * sigma * 64 / 63 + 0.01


def test_resemblance_reports_its_uncertainty() -> None:
    same = bytes(range(12))
    assert resemblance(same, same).estimate == 1.0
    half = bytes(range(6)) + bytes(range(40, 46))
    r = resemblance(same, half)
    assert r.matches == 6
    assert 0.45 < r.estimate < 0.55
    assert 0.1 < r.stderr < 0.2


def test_duplicates_count_once_and_empty_sets_have_no_sketch() -> None:
    rng = random.Random(4)
    items = [rng.randbytes(32) for _ in range(50)]
    assert sketch_of(items) == sketch_of(items + items[:20])
    assert sketch_of([]) is None
    assert signature_of_bytes(b"").sketch is None


def test_small_file_moved_and_edited_still_resembles_itself() -> None:
    rng = random.Random(5)
    words = [b"alpha", b"beta", b"gamma", b"delta", b"epsilon", b"zeta", b"eta", b"theta"]
    old = b" ".join(rng.choice(words) for _ in range(5000))  # ~30 KB: 3 or 4 chunks
    new = old[:9000] + b"inserted words here " + old[9000:]
    a, b = signature_of_bytes(old), signature_of_bytes(new)
    assert len(a.tree.leaves) < 8
    shared_leaves = len(set(a.tree.leaves.entries()) & set(b.tree.leaves.entries()))
    assert shared_leaves < len(a.tree.leaves)  # the edit changed chunks...
    assert matching_traits(a.sketch, b.sketch) >= 9  # ...but sub-chunks keep the sketch


# ---------------------------------------------------------------- candidate recall


class FakeStat:
    st_size = 0
    st_mtime_ns = 0
    st_mode = 0o100644

    def __init__(self, inode: int) -> None:
        self.st_ino = inode


def add(db: IndexDatabase, path: str, sketch: bytes, inode: int) -> None:
    empty = signature_of_bytes(b"")
    db.put_rows([row_of(path, FakeStat(inode), FileSignature(empty.tree, sketch), False)])


def random_sketch(rng: random.Random) -> bytes:
    """A random file's sketch: its traits are independent and uniform."""
    return bytes(rng.randrange(64) for _ in range(TRAITS))


def test_candidate_query_finds_planted_near_duplicates(tmp_path) -> None:
    rng = random.Random(2026)
    background = scaled(10_000, 3_000)
    db = IndexDatabase(tmp_path / "index.sqlite3")
    queries = []
    with db.transaction():
        for i in range(background):
            add(db, f"bg/{i}", random_sketch(rng), i)
        for k in range(50):
            a, b = set_pair(rng, rng.uniform(0.5, 0.9), union=120)
            add(db, f"planted/{k}", sketch_of(b), background + k)
            queries.append((f"planted/{k}", sketch_of(a)))
    found = 0
    for path, sketch in queries:
        top = [db.by_id(i).path for i, _ in db.candidates(sketch, limit=5)]
        found += path in top
    assert found >= 0.95 * len(queries)
    false = [len(db.candidates(random_sketch(rng), limit=50)) for _ in range(200)]
    # Chance alone: 12 traits, 1/64 each; at least 4 of them for about 1 file in 33,000.
    assert sum(false) / len(false) < 1.0, sum(false) / len(false)
    db.close()


def test_candidates_rank_more_matching_traits_first(tmp_path) -> None:
    db = IndexDatabase(tmp_path / "index.sqlite3")
    query = bytes(range(12))
    with db.transaction():
        add(db, "four", query[:4] + bytes([63] * 8), 1)
        add(db, "all", query, 2)
        add(db, "eight", query[:8] + bytes([63] * 4), 3)
        add(db, "three", query[:3] + bytes([63] * 9), 4)
    ranked = [(db.by_id(i).path, n) for i, n in db.candidates(query)]
    assert ranked == [("all", 12), ("eight", 8), ("four", 4)]
    assert os.path.exists(tmp_path / "index.sqlite3")
    db.close()


def test_a_trait_out_of_range_is_refused_on_the_wire_and_ignored_from_disk(tmp_path) -> None:
    """A sketch byte of 64 or more would index past the 768 inverted lists: the wire
    refuses it (a fuzzed bit flip in an offer's sketch was an IndexError, an internal
    error), and a damaged index row is looked up by its valid traits only."""
    from rdc.errors import ProtocolError
    from rdc.local.index.traits import TraitLists
    from rdc.wire import messages as m

    good = bytes(range(12))
    flipped = bytes([good[0] | 0x80]) + good[1:]
    offer = m.Offer(size=1, root=bytes(32), depth=1, sketch=good)
    raw = m.encode(offer, 3)
    assert m.decode(raw)[1] == offer
    with pytest.raises(ProtocolError, match=r"offer\.sketch"):
        m.decode({**raw, "sketch": flipped})
    lists = TraitLists()
    lists.add(1, good)
    lists.add(2, flipped)  # as a damaged row would load
    assert lists.candidates(flipped, 11, 10, None) == [(1, 11), (2, 11)]
    lists.remove(2, flipped)
    assert lists.candidates(good, 12, 10, None) == [(1, 12)]


def test_loaded_and_batched_lists_are_the_sketches_added_one_by_one(tmp_path,
                                                                    monkeypatch) -> None:
    """`TraitLists.load` sorts every stored sketch into its buckets natively, a few
    thousand rows at a time, and `add_many` a batch of new rows: the same lists, in id
    order, as adding each row, damaged rows (a trait out of range, a sketch too short or
    too long) by their valid traits."""
    import random
    import sqlite3

    from rdc.local.index import traits
    from rdc.local.index.traits import TraitLists

    rng = random.Random(4)
    conn = sqlite3.connect(tmp_path / "t.sqlite3")
    conn.execute("CREATE TABLE file (id INTEGER PRIMARY KEY, sketch BLOB)")
    rows = [(i, bytes(rng.randrange(64) for _ in range(12))) for i in range(1, 3000)]
    rows[5] = (rows[5][0], bytes([70]) + rows[5][1][1:])
    rows[9] = (rows[9][0], rows[9][1][:7])
    rows[11] = (rows[11][0], rows[11][1] + b"\x05")
    rows[13] = (rows[13][0], None)
    conn.executemany("INSERT INTO file VALUES (?, ?)", rows)
    one_by_one = TraitLists()
    for file_id, sketch in rows:
        if sketch is not None:
            one_by_one.add(file_id, sketch)
    monkeypatch.setattr(traits, "LOAD_ROWS", 1000)  # (several chunks)
    loaded = TraitLists.load(conn)
    conn.close()
    assert loaded.lists == one_by_one.lists and loaded.max_id == one_by_one.max_id == 2999
    # A batch's new rows at once (`add_many`, what an index write does), in batches of a
    # few hundred: the same lists again.
    batched = TraitLists()
    kept = [(file_id, sketch) for file_id, sketch in rows if sketch is not None]
    for at in range(0, len(kept), 256):
        some = kept[at : at + 256]
        batched.add_many([file_id for file_id, _ in some], [sketch for _, sketch in some])
    batched.add_many([], [])
    assert batched.lists == one_by_one.lists and batched.max_id == 2999
