"""Edited small files described in their batch (rdc.transfer.lockstep): every round of the
batch's descents is one message each way, the files are rebuilt and written with the
batch, and whatever does not check out goes by the per-file exchange."""

from __future__ import annotations

import itertools
import os
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rdc.errors import ProtocolError
from rdc.params import SUB_PREFIX
from rdc.transfer import batch, lockstep, serving, target
from rdc.transfer.descent import SourceFile
from rdc.transfer.stats import Options
from rdc.transfer.target import WANT_ITEMS
from rdc.wire import messages as m

from .protocol_support import Pair, tree_state, write

OLD = 1_600_000_000_123_456_789


def edited_tree(root: Path, files: int, seed: int = 3) -> None:
    rng = random.Random(seed)
    for i in range(files):
        text = b"".join(b"line %d of file %d: %x\n" % (n, i, rng.getrandbits(64))
                        for n in range(rng.randrange(60, 1500)))
        write(root / f"d{i % 5}" / f"f{i}.txt", text, OLD + i)


def edit(root: Path, names: list[str], seed: int = 4) -> None:
    """A few bytes of each file replaced in place, somewhere in its middle."""
    rng = random.Random(seed)
    for name in names:
        data = bytearray((root / name).read_bytes())
        at = rng.randrange(len(data) // 4, len(data) // 2)
        data[at : at + 6] = b"EDITED"
        write(root / name, bytes(data), OLD + 10**9 + rng.randrange(10**6))


def names(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*.txt"))


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Per-file exchanges the server served, and rounds of batch descents (either side)."""
    counts = {"single": 0, "rounds": 0, "batches": 0}
    real_file, real_advance = serving.receive_file, lockstep.Descents.advance
    real_init = lockstep.Descents.__init__

    async def single(*args):
        counts["single"] += 1
        return await real_file(*args)

    def advance(self, replies):
        counts["rounds"] += 1
        return real_advance(self, replies)

    def init(self, *args):
        counts["batches"] += 1
        real_init(self, *args)

    monkeypatch.setattr(serving, "receive_file", single)
    monkeypatch.setattr(lockstep.Descents, "advance", advance)
    monkeypatch.setattr(lockstep.Descents, "__init__", init)
    return counts


async def test_edited_files_are_deltas_in_their_batch_both_ways(tmp_path, counted) -> None:
    """100 edited files of one batch: no per-file exchange, a bounded number of rounds
    for all of them (not per file), only the edits' bytes as literal data, pushed and
    pulled."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    edited_tree(src, 120)
    pair = Pair(tmp_path)
    await pair.run("push", src)
    await pair.run("pull", dst)
    chosen = names(src)[:100]
    edit(src, chosen)
    counted.update(single=0, rounds=0, batches=0)
    stats = await pair.run("push", src)
    assert stats.in_step and not stats.failed
    assert tree_state(pair.share) == tree_state(src)
    assert counted["single"] == 0
    assert sorted(p for p, (how, _, _) in stats.moved.items() if how == "delta") == chosen
    # Per batch (a few, by content), not per file: an expand per tree level (two at most
    # here), subs, fine, and the last that ends them.
    assert counted["batches"] <= 5 and counted["rounds"] <= 5 * counted["batches"]
    assert stats.literal_bytes < 100 * 400  # each edit costs a fine piece or so, not a file

    counted.update(single=0, rounds=0, batches=0)
    stats = await pair.run("pull", dst)
    assert stats.in_step and not stats.failed
    assert tree_state(dst) == tree_state(src)
    assert sorted(p for p, (how, _, _) in stats.moved.items() if how == "delta") == chosen
    assert counted["batches"] <= 5 and counted["rounds"] <= 5 * counted["batches"]
    assert stats.literal_bytes < 100 * 400
    pair.close()


@pytest.mark.parametrize("direction", ["push", "pull"])
async def test_a_delta_that_does_not_check_out_goes_alone(
    tmp_path, counted, monkeypatch: pytest.MonkeyPatch, direction: str
) -> None:
    """A file whose rebuilt content is wrong (a sub-chunk prefix matched other bytes, a
    seed changed) is not written: it goes by the per-file exchange, and arrives."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    edited_tree(src, 12)
    pair = Pair(tmp_path)
    await pair.run("push", src)
    await pair.run("pull", dst)
    bad = "d2/f7.txt"
    edit(src if direction == "push" else pair.share, [bad, "d3/f8.txt"])
    real = lockstep.rebuild
    edited_root = signature_root((src if direction == "push" else pair.share) / bad)

    def wrong(plan, seeds, literal, check_root=True):  # a byte matched by chance, say
        content = real(plan, seeds, literal, check_root)
        return content[:-1] + b"?" if edited_root.startswith(plan.root) else content

    monkeypatch.setattr(lockstep, "rebuild", wrong)
    stats = await pair.run(direction, src if direction == "push" else dst)
    assert stats.in_step and not stats.failed
    assert tree_state(pair.share) == tree_state(src if direction == "push" else dst)
    assert stats.moved["d3/f8.txt"][0] == "delta"
    assert stats.moved[bad][0] == "delta"  # the per-file exchange's descent
    if direction == "push":
        assert counted["single"] == 1
    pair.close()


def signature_root(path: Path) -> bytes:
    from rdc.content.signature import signature_of_bytes

    return signature_of_bytes(path.read_bytes()).root


async def test_a_peer_without_batch_deltas_gets_edited_files_alone(
    tmp_path, counted, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the feature (an older peer) nothing says ``delta``: the edited files go by
    the per-file exchange, as before."""
    src = tmp_path / "src"
    edited_tree(src, 20)
    pair = Pair(tmp_path)
    await pair.run("push", src)
    edit(src, names(src)[:5])
    monkeypatch.setattr(batch, "DELTAS", "not-a-feature")
    counted.update(single=0, rounds=0, batches=0)
    stats = await pair.run("push", src)
    assert stats.in_step and not stats.failed
    assert tree_state(pair.share) == tree_state(src)
    assert counted["single"] == 5 and counted["rounds"] == 0
    pair.close()


async def test_small_edited_files_travel_as_their_changed_blocks(tmp_path) -> None:
    """Files of a few hundred bytes (one chunk, too small to split): each edited one is a
    ``delta`` of the batch, described against its old bytes, and only about the blocks
    the edit touched travel; none goes by the per-file exchange."""
    src = tmp_path / "src"
    rng = random.Random(7)
    for i in range(60):
        write(src / f"s{i}.txt", b"".join(b"%x " % rng.getrandbits(32)
                                          for _ in range(rng.randrange(40, 110))), OLD + i)
    pair = Pair(tmp_path)
    await pair.run("push", src)
    chosen = names(src)[:40]
    edit(src, chosen)
    stats = await pair.run("push", src)
    assert stats.in_step and not stats.failed
    assert tree_state(pair.share) == tree_state(src)
    assert sorted(p for p, (how, _, _) in stats.moved.items() if how == "delta") == chosen
    assert stats.literal_bytes <= 40 * 3 * 32  # a block or three each, not whole files
    pair.close()


async def test_renamed_and_edited_files_are_described_against_their_old_selves(
    tmp_path,
) -> None:
    """A file renamed and edited has no older version at its path; one that half its
    sketch's traits find (a file of 8 chunks or more is sketched over its chunks, and one
    edited chunk changes several traits) is described in its batch against the file
    that resembles it, small ones (one chunk under 1 KiB) too: a few blocks travel, not
    the files."""
    src = tmp_path / "src"
    rng = random.Random(9)
    for i in range(6):
        size = 600 if i % 2 else 60_000  # one chunk, and about 8
        text = b"".join(b"%x\n" % rng.getrandbits(64) for _ in range(size // 17 + 1))
        write(src / "old" / f"f{i}.txt", text[:size], OLD + i)
    pair = Pair(tmp_path)
    await pair.run("push", src)
    (src / "new").mkdir()
    for i in range(6):
        data = bytearray((src / "old" / f"f{i}.txt").read_bytes())
        data[len(data) // 2 : len(data) // 2] = b"# an inserted line\n"
        write(src / "new" / f"g{i}.txt", bytes(data), OLD + 100 + i)
        (src / "old" / f"f{i}.txt").unlink()
    stats = await pair.run("push", src, options=Options(delete=True))
    assert stats.in_step and not stats.failed
    assert tree_state(pair.share) == tree_state(src)
    how = {p: h for p, (h, _, _) in stats.moved.items()}
    assert [how[f"new/g{i}.txt"] for i in (0, 2, 4)] == ["delta"] * 3
    # Small files' sketches (over their few sub-chunks) vary more: these two resemble
    # their old selves enough, the third (3 traits of 12) goes whole.
    assert [how[f"new/g{i}.txt"] for i in (1, 3, 5)] == ["delta", "delta", "whole"]
    assert stats.literal_bytes < 5 * 200 + 619  # a block or so each, and the whole one
    pair.close()


@pytest.mark.parametrize("short", [True, False])
async def test_edited_files_are_listed_in_the_prefix_length_the_target_asks(
    tmp_path, monkeypatch: pytest.MonkeyPatch, short: bool
) -> None:
    """With the feature ``short-prefixes`` the target asks for the pieces of small files'
    edited chunks with short hash prefixes (few pieces in each seed region: a byte less
    per piece saves more than the rare false match costs); without it (an older peer),
    with SUB_PREFIX bytes. Either way every file arrives exactly."""
    src = tmp_path / "src"
    edited_tree(src, 40)
    pair = Pair(tmp_path)
    await pair.run("push", src)
    edit(src, names(src)[:30])
    if not short:
        monkeypatch.setattr(target, "SHORT", "not-a-feature")
    asked: list[int] = []
    real = lockstep._lists

    def lists(sources, wants):
        asked.extend(want.prefix for want in wants if want.kind != "expand")
        return real(sources, wants)

    monkeypatch.setattr(lockstep, "_lists", lists)
    stats = await pair.run("push", src)
    assert stats.in_step and not stats.failed
    assert tree_state(pair.share) == tree_state(src)
    assert asked and (max(asked) < SUB_PREFIX if short else set(asked) == {SUB_PREFIX})
    pair.close()


@given(st.lists(st.tuples(st.integers(0, 255), st.sampled_from(["subs", "expand"]),
                          st.integers(1, 3000)), max_size=20))
def test_wants_are_cut_into_messages_that_keep_every_item_in_order(wants) -> None:
    file_wants = [m.FileWant(f, kind, [(2, i) if kind == "expand" else i for i in range(n)])
                  for f, kind, n in wants]
    parts = list(lockstep._cut(file_wants))
    assert all(0 < sum(len(w.asked) for w in part) <= WANT_ITEMS for part in parts)
    flat = [(w.file, w.kind, a) for part in parts for w in part for a in w.asked]
    assert flat == [(w.file, w.kind, a) for w in file_wants for a in w.asked]


def test_a_source_refuses_wants_of_files_that_are_not_its_deltas() -> None:
    """A target's want of a file the batch did not make a delta, or that does not fit the
    file, is a protocol error; a fetch of too much to refine too."""
    data = bytes(random.Random(1).randbytes(30_000))
    from rdc.content.signature import signature_of_bytes

    sources = {3: lockstep.source_of(signature_of_bytes(data).tree, data)}
    assert lockstep._lists(sources, [m.FileWant(3, "subs", [0])])
    with pytest.raises(ProtocolError, match="not a delta"):
        lockstep._lists(sources, [m.FileWant(4, "subs", [0])])
    with pytest.raises(ValueError):
        lockstep._lists(sources, [m.FileWant(3, "subs", [99])])
    assert lockstep._items(sources, [m.FileFetch(3, [(0, 0, 10)])], 30_000) == [
        (3, data[:10])]
    with pytest.raises(ProtocolError, match="not a delta"):
        lockstep._items(sources, [m.FileFetch(0, [(0, 0, 10)])], 30_000)
    with pytest.raises(ProtocolError, match="to refine"):
        lockstep._items(sources, [m.FileFetch(3, [(0, 0, 5 << 20, b"ab", 100)])], 30_000)
    with pytest.raises(ProtocolError, match="from files of"):  # the same bytes, many times
        lockstep._items(sources, [m.FileFetch(3, [(0, 0, 4000)] * 4000)], 30_000)
    assert isinstance(sources[3], SourceFile)


def test_files_to_describe_fill_batches_by_their_own_budget() -> None:
    """A file the target holds a version of travels as a fraction of its size: batches
    hold up to DELTA_BYTES of those beside BATCH_BYTES of files sent whole; without the
    peer's feature they go alone."""
    edited = [(f"e{i}", b"12345678") for i in range(600)]
    new = [(f"n{i}", None) for i in range(100)]
    sizes = {path: 40_000 for path, _ in edited + new}
    groups, alone = batch.batches(edited + new, sizes, deltas=True)
    assert not alone and sum(map(len, groups)) == 700
    for group in groups:
        assert len(group) <= batch.BATCH_FILES
        assert sum(sizes[p] for p, there in group if there) <= batch.DELTA_BYTES
        assert sum(sizes[p] for p, there in group if not there) <= batch.BATCH_BYTES
    fit = batch.DELTA_BYTES // 40_000, batch.BATCH_BYTES // 40_000  # files a batch holds
    assert len(groups) <= -(-600 // fit[0]) + -(-100 // fit[1])  # (full, but for the last)
    groups, alone = batch.batches(edited + new, sizes, deltas=False)
    assert alone == edited and sum(map(len, groups)) == 100


def test_what_a_batch_offers_is_the_bytes_its_tree_describes(tmp_path) -> None:
    """A ``delta``'s answers come from the bytes a source offered, so they must be what the
    offered tree describes. A file whose bytes disagree with its stored tree (bit rot, or a
    file still changing) is read again and signed from the very bytes read, whatever they
    are (a push once failed as a whole on such a file: "a delta's source does not add
    up")."""
    from rdc.content.signature import signature_of_bytes
    from rdc.local.replica import Replica

    root = tmp_path / "root"
    edited_tree(root, 3)
    replica = Replica(str(root), tmp_path / "index.sqlite3")
    replica.scan()
    files = [(name, None) for name in names(root)]
    assert all(isinstance(offer, m.FileOffer) for offer, _, _ in batch.offer_batch(replica,
                                                                                  files))
    for path, _ in files:  # bit rot: other bytes, the same size, time and inode
        where = root / path
        before = where.stat()
        with open(where, "r+b") as f:
            f.write(bytes(b ^ 0xFF for b in where.read_bytes()[:16]))
        os.utime(where, ns=(before.st_atime_ns, before.st_mtime_ns))
    noticed: list[str] = []
    offered = batch.offer_batch(replica, files, changed=noticed.append)
    assert len(offered) == 3 and sorted(noticed) == sorted(path for path, _ in files)
    for (path, _), (offer, data, tree) in zip(files, offered, strict=True):
        assert isinstance(offer, m.FileOffer) and data is not None and tree is not None
        assert data == (root / path).read_bytes()
        assert signature_of_bytes(data).root == tree.root == offer.root
    replica.close()


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 79), st.integers(0, 70_000), st.integers(0, 5_000)),
                min_size=1, max_size=300),
       st.sampled_from([1 << 20, 20_000]))
def test_seed_readers_read_each_small_seed_whole_once(tmp_path_factory, reads, whole) -> None:
    """Reads of a batch's seeds, in any order, are the files' bytes at those places. A seed
    small by its tree is read whole once while the readers keep it (a batch of 200 edits
    has more seeds than OPEN_SEEDS, and each round of its descents opened them all again,
    then read each in many small reads); past ``whole`` bytes kept, the least recently
    read is dropped and read again when asked for. A seed that grew past WHOLE_SEED since
    it was indexed is read through a descriptor; one that is gone reads as empty."""
    from rdc.local.replica import Replica

    root = tmp_path_factory.mktemp("seeds")
    rng = random.Random(len(reads))
    sizes = [rng.randrange(0, 12_000) for _ in range(78)] + [100, 100]
    for i, size in enumerate(sizes):
        write(root / f"s{i}", rng.randbytes(size), OLD)
    (root / "s78").write_bytes(rng.randbytes(lockstep.WHOLE_SEED + 1))  # grew since
    (root / "s79").unlink()  # gone since
    replica = Replica(str(root), tmp_path_factory.mktemp("index") / "index.sqlite3")
    wholes: list[str] = []
    real_whole = replica.fs.read_whole

    def read_whole(rel, limit, held=None):
        wholes.append(rel)
        return real_whole(rel, limit, held)

    replica.fs.read_whole = read_whole
    readers = lockstep.SeedReaders(replica, limit=4, whole=whole)
    read = [readers.reader(f"s{i}", size) for i, size in enumerate(sizes)]
    content = {i: (root / f"s{i}").read_bytes() for i in range(79)} | {79: b""}
    for i, offset, length in reads:
        assert read[i](offset, length) == content[i][offset : offset + length]
    asked = [f"s{i}" for i, _, _ in reads]
    if whole == 1 << 20:  # every small seed kept: each read whole once, at its first read
        assert wholes == list(dict.fromkeys(asked))
    else:  # dropped and read again, but never twice in a row
        assert set(wholes) == set(asked)
        assert all(a != b for a, b in itertools.pairwise(wholes))
        assert readers._held <= whole
    readers.close()
    replica.close()
