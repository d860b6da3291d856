"""Syncs by stamp roots (rdc.local.stamproots, rdc.transfer.quickcheck): a side with a cold
index compares sizes and times across the link, reads only what differs, and still never
takes one file for another."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rdc.local.ignore import Excludes
from rdc.local.index import IndexDatabase
from rdc.local.replica import Replica
from rdc.local.snapshot import Entry, seal, walk
from rdc.local.stamproots import stamp_root, stamped
from rdc.params import FORMAT
from rdc.transfer import oneway, quickcheck
from rdc.transfer.stats import Options

from .e2e_support import E2E, TOKEN, RawClient
from .protocol_support import Pair, tree_state, write

OLD = 1_600_000_000_123_456_789


def a_tree(root: Path, files: int = 40) -> None:
    for i in range(files):
        write(root / f"d{i % 4}" / f"f{i}.txt", b"file %d\n" % i * (20 + i), OLD + i)


def rows(index: Path) -> int:
    """The files an index holds a row for (what its side read)."""
    db = IndexDatabase(index)
    try:
        return db.count()
    finally:
        db.close()


def server_index(pair: Pair) -> Path:
    found = [p for p in pair.state.rglob("*.sqlite3")]
    assert len(found) == 1, found
    return found[0]


def in_step_copy(tmp_path: Path, files: int = 40) -> tuple[Path, Pair]:
    """A tree on the client and a copy with the same times in the share: two cold indexes."""
    src = tmp_path / "src"
    a_tree(src, files)
    pair = Pair(tmp_path)
    shutil.copytree(src, pair.share / "t", copy_function=shutil.copy2)
    for path in [src, pair.share / "t"]:  # (directories' times too, as cp -a)
        for dirpath, _, _ in os.walk(path):
            os.utime(dirpath, ns=(OLD, OLD))
    return src, pair


async def test_trees_in_step_are_compared_without_reading_a_file(tmp_path) -> None:
    src, pair = in_step_copy(tmp_path)
    stats = await pair.run("push", src, path="t")
    assert stats.by_stamps and stats.in_step and stats.files_transferred == 0
    assert rows(tmp_path / "client-src.sqlite3") == 0
    assert rows(server_index(pair)) == 0
    pair.close()


@pytest.mark.parametrize("verb", ["push", "pull"])
async def test_an_edit_is_found_and_only_it_is_read(tmp_path, verb) -> None:
    src, pair = in_step_copy(tmp_path)
    source = src if verb == "push" else pair.share / "t"
    write(source / "d1" / "f5.txt", b"edited\n" * 30, OLD + 10**10)
    stats = await pair.run(verb, src, path="t")
    assert stats.by_stamps and stats.in_step and stats.files_transferred == 1
    assert tree_state(src) == tree_state(pair.share / "t")
    # The source read the file it sent, the target its old version (a seed): nothing else.
    assert rows(tmp_path / "client-src.sqlite3") <= 2
    assert rows(server_index(pair)) <= 2
    pair.close()


@pytest.mark.parametrize("verb", ["push", "pull"])
async def test_a_file_modified_just_now_is_read_whatever_its_stamp(tmp_path, verb) -> None:
    """Same size and time on both sides but another content: where the time is recent (a
    later write could keep it), both sides read the file, and it is sent."""
    src, pair = in_step_copy(tmp_path)
    now = time.time_ns()
    write(src / "d2" / "f6.txt", b"A" * 100, now)
    write(pair.share / "t" / "d2" / "f6.txt", b"B" * 100, now)
    stats = await pair.run(verb, src, path="t")
    assert stats.by_stamps and stats.in_step
    assert tree_state(src) == tree_state(pair.share / "t")
    pair.close()


@pytest.mark.parametrize("verb", ["push", "pull"])
async def test_a_move_found_by_stamps_is_made_only_where_the_content_is_the_same(
        tmp_path, verb) -> None:
    """A file gone from one path and new at another with the same size and time is moved
    (its inode kept) when it holds the same content; another file that only happens to
    have the same size and time is not moved there, but sent."""
    src, pair = in_step_copy(tmp_path)
    source = src if verb == "push" else pair.share / "t"
    target = pair.share / "t" if verb == "push" else src
    os.rename(source / "d0" / "f0.txt", source / "d3" / "moved.txt")  # a true move
    os.unlink(source / "d1" / "f1.txt")  # and a new file that only looks like it
    write(source / "d2" / "lookalike.txt", b"X" * (target / "d1" / "f1.txt").stat().st_size,
          (target / "d1" / "f1.txt").stat().st_mtime_ns)
    inode = (target / "d0" / "f0.txt").stat().st_ino
    stats = await pair.run(verb, src, path="t", options=Options(delete=True))
    assert stats.by_stamps and stats.in_step
    assert tree_state(src) == tree_state(pair.share / "t")
    assert (target / "d3" / "moved.txt").stat().st_ino == inode
    assert stats.moved["d3/moved.txt"][0] == "move"
    assert stats.moved["d2/lookalike.txt"][0] != "move"
    pair.close()


async def test_trees_whose_times_differ_widely_are_read_as_without(tmp_path) -> None:
    """Every file touched on the client (same content, other times): stamps would list and
    offer all of them, so the sync reads both trees and compares content, as a warm one."""
    src, pair = in_step_copy(tmp_path)
    for i, path in enumerate(sorted(src.rglob("*.txt"))):
        os.utime(path, ns=(OLD + 10**12 + i, OLD + 10**12 + i))
    stats = await pair.run("push", src, path="t")
    assert not stats.by_stamps and stats.in_step and stats.files_transferred == 0
    assert tree_state(src) == tree_state(pair.share / "t")
    assert rows(server_index(pair)) == 40
    pair.close()


async def test_checksum_reads_what_stamps_would_take_for_the_same(tmp_path) -> None:
    """Same size and (old) time, other content: stamps take them for the same, as rsync -a
    does; --checksum reads both and sends it."""
    src, pair = in_step_copy(tmp_path)
    target = pair.share / "t" / "d3" / "f7.txt"
    st = target.stat()
    write(target, b"?" * st.st_size, st.st_mtime_ns)
    quick = await pair.run("push", src, path="t")
    assert quick.by_stamps and quick.files_transferred == 0
    assert target.read_bytes() != (src / "d3" / "f7.txt").read_bytes()
    pair.forget_client(src)
    full = await pair.run("push", src, path="t", options=Options(checksum=True))
    assert not full.by_stamps and full.in_step and full.files_transferred == 1
    assert tree_state(src) == tree_state(pair.share / "t")
    pair.close()


async def test_two_warm_indexes_compare_content(tmp_path, monkeypatch) -> None:
    """After a sync by content (--checksum) both indexes know their trees: the next sync
    compares content roots, and the client never makes the sketch of its stamps (the
    server, warm, does not ask for it)."""
    src, pair = in_step_copy(tmp_path)
    await pair.run("push", src, path="t", options=Options(checksum=True))
    write(src / "d0" / "f4.txt", b"edited\n", OLD + 10**10)
    sketched: list[int] = []
    monkeypatch.setattr(oneway, "tree_sketch", lambda *a: sketched.append(1) or b"")
    stats = await pair.run("push", src, path="t")
    assert not stats.by_stamps and stats.in_step and stats.files_transferred == 1
    assert not sketched
    pair.close()


@pytest.mark.parametrize("verb", ["push", "pull"])
async def test_a_warm_client_syncs_by_stamps_with_a_share_whose_index_is_cold(
        tmp_path, verb) -> None:
    """A client whose index knows its tree, and a share whose state was lost (or that rsync
    filled): the server would read its whole tree to compare content roots; stamps tell
    the trees apart instead, and the server reads the one file that differs."""
    src, pair = in_step_copy(tmp_path)
    await pair.run("push", src, path="t", options=Options(checksum=True))
    pair.forget_server()
    source = src if verb == "push" else pair.share / "t"
    write(source / "d1" / "f9.txt", b"edited\n" * 9, OLD + 10**10)
    stats = await pair.run(verb, src, path="t")
    assert stats.by_stamps and stats.in_step and stats.files_transferred == 1
    assert tree_state(src) == tree_state(pair.share / "t")
    assert rows(server_index(pair)) <= 1
    # The client stays warm: its index still vouches for the rest, and the next sync with
    # a warm share again compares content.
    assert rows(tmp_path / "client-src.sqlite3") == 40
    again = await pair.run(verb, src, path="t")
    assert again.by_stamps and again.in_step and again.files_transferred == 0
    pair.close()


async def test_a_warm_client_reads_as_without_where_the_stamps_differ_widely(
        tmp_path) -> None:
    """Warm client, cold share, every time different (the same content): the server asks
    for the sketch, turns stamps down, and both compare content."""
    src, pair = in_step_copy(tmp_path)
    await pair.run("push", src, path="t", options=Options(checksum=True))
    pair.forget_server()
    for i, path in enumerate(sorted((pair.share / "t").rglob("*.txt"))):
        os.utime(path, ns=(OLD + 10**12 + i, OLD + 10**12 + i))
    stats = await pair.run("pull", src, path="t")
    assert not stats.by_stamps and stats.in_step and stats.files_transferred == 0
    assert rows(server_index(pair)) == 40
    pair.close()


def kept_stamp_trees(index: Path) -> int:
    """Whether an index keeps a tree of stamp roots (0 or 1)."""
    db = IndexDatabase(index)
    try:
        return db.conn.execute("SELECT COUNT(*) FROM stamp_sealed").fetchone()[0]
    finally:
        db.close()


@pytest.mark.parametrize("verb", ["push", "pull"])
async def test_a_side_synced_by_stamps_starts_the_next_from_the_tree_it_kept(
        tmp_path, monkeypatch, verb) -> None:
    """Both indexes cold: each side keeps its tree of stamp roots after the sync, and the
    next sync starts from it (a stamp walk, the directories that changed listed again)
    instead of stamping a whole walk; an edit made meanwhile is found and sent."""
    src, pair = in_step_copy(tmp_path)
    first = await pair.run(verb, src, path="t")
    assert first.by_stamps and first.in_step
    assert kept_stamp_trees(tmp_path / "client-src.sqlite3") == 1
    assert kept_stamp_trees(server_index(pair)) == 1
    source = src if verb == "push" else pair.share / "t"
    write(source / "d2" / "f10.txt", b"edited again\n", OLD + 10**10)
    write(source / "d2" / "new.txt", b"a new file\n", OLD + 10**10)
    (source / "d2" / "f6.txt").unlink()

    def walked_again(*args, **kwargs):
        raise AssertionError("a whole walk stamped again")

    monkeypatch.setattr(Replica, "stamped", walked_again)
    second = await pair.run(verb, src, path="t", options=Options(delete=True))
    assert second.by_stamps and second.in_step and second.files_transferred == 2
    assert tree_state(src) == tree_state(pair.share / "t")
    assert rows(tmp_path / "client-src.sqlite3") <= 2 and rows(server_index(pair)) <= 2
    pair.close()


@pytest.mark.parametrize("verb", ["push", "pull"])
async def test_a_file_modified_just_now_is_read_by_sides_that_kept_their_stamps(
        tmp_path, verb) -> None:
    """After a sync by stamps both sides keep their trees; a file then written on each
    side with the same size and (recent) time but another content is still read by both
    and sent: the kept trees are brought to the walk with its racy files' true roots."""
    src, pair = in_step_copy(tmp_path)
    assert (await pair.run(verb, src, path="t")).by_stamps
    now = time.time_ns()
    write(src / "d1" / "f13.txt", b"A" * 100, now)
    write(pair.share / "t" / "d1" / "f13.txt", b"B" * 100, now)
    stats = await pair.run(verb, src, path="t")
    assert stats.by_stamps and stats.in_step and stats.files_transferred == 1
    assert tree_state(src) == tree_state(pair.share / "t")
    pair.close()


async def test_a_tree_with_a_file_modified_just_now_is_not_kept(tmp_path) -> None:
    """A file modified within the racy window has its true root in a tree of stamp roots:
    such a tree is not kept (later, stat alone would give that file its stamp root)."""
    src, pair = in_step_copy(tmp_path)
    now = time.time_ns()
    for root in (src, pair.share / "t"):
        write(root / "d0" / "recent.txt", b"same\n", now)
    stats = await pair.run("push", src, path="t")
    assert stats.by_stamps and stats.in_step
    assert kept_stamp_trees(tmp_path / "client-src.sqlite3") == 0
    assert kept_stamp_trees(server_index(pair)) == 0
    pair.close()


def _edit(root: Path, how: str) -> None:
    if how == "size":
        write(root / "d1" / "f1.txt", b"longer than it was\n" * 9, OLD + 1)
    elif how == "time":
        os.utime(root / "d1" / "f5.txt", ns=(OLD + 7, OLD + 7))
    elif how == "new file":
        write(root / "d2" / "g.txt", b"new\n", OLD)
    elif how == "gone file":
        (root / "d3" / "f3.txt").unlink()
    elif how == "new directory":
        write(root / "d5" / "e" / "h.txt", b"deep\n", OLD)
    elif how == "gone directory":
        shutil.rmtree(root / "d0")
    elif how == "link":
        os.symlink("d1/f1.txt", root / "d2" / "link")


@pytest.mark.parametrize("how", ["size", "time", "new file", "gone file", "new directory",
                                 "gone directory", "link", "nothing"])
def test_a_kept_stamp_tree_brought_to_a_walk_is_the_walk_stamped(tmp_path, how) -> None:
    """What `kept_stamps` makes of the kept tree and a stamp walk after a change is what
    stamping a fresh walk makes; a file noted unsure since makes it give up."""
    root = tmp_path / "tree"
    a_tree(root)
    replica = Replica(str(root), tmp_path / "index.sqlite3", Excludes([]))
    try:
        limit = time.time_ns() - 10**10
        replica.keep_stamps(replica.stamped(replica.walk().tree, limit, True), limit)
        _edit(root, how)
        _, walked = replica.quick()
        assert walked.pending  # (a stamp walk, in C: no tree walked)
        kept = replica.kept_stamps(walked, limit)
        assert kept is not None
        fresh = replica.stamped(replica.walk().tree, limit, True)
        assert (kept.content, kept.meta) == (fresh.content, fresh.meta)
        replica.db.note_unsure("d1/f9.txt", (root / "d1" / "f9.txt").stat())
        assert replica.kept_stamps(replica.quick()[1], limit) is None
    finally:
        replica.close()


# ---------------------------------------------------------------- the pieces


@given(st.integers(0, 2**63 - 1), st.integers(-(2**63), 2**63 - 1),
       st.integers(0, 2**63 - 1), st.integers(-(2**63), 2**63 - 1))
def test_stamp_roots_differ_where_stamps_do(size_a, time_a, size_b, time_b) -> None:
    same = (size_a, time_a) == (size_b, time_b)
    assert (stamp_root(size_a, time_a) == stamp_root(size_b, time_b)) == same
    assert len(stamp_root(size_a, time_a)) == 32


def _file(size: int, mtime: int) -> Entry:
    return Entry("f", 0o644, mtime, size)


@settings(max_examples=50)
@given(st.dictionaries(st.text("ab/", min_size=1, max_size=6).filter(
    lambda p: "" not in p.split("/")), st.tuples(st.integers(0, 99), st.integers(0, 9)),
    max_size=12), st.data())
def test_a_tree_of_stamp_roots_changes_with_any_stamp(files, data) -> None:
    """Two trees with the same paths, sizes and times have the same content hash; a
    change of one file's size or time changes it; the tree given is not changed."""
    def build(stamps: dict[str, tuple[int, int]]) -> Entry | None:
        top = Entry("d", 0o755, 0, children={})
        for path, (size, mtime) in sorted(stamps.items()):
            node, *parts = top, *path.split("/")
            for part in parts[:-1]:
                child = node.children.setdefault(part, Entry("d", 0o755, 0, children={}))
                if child.kind != "d":
                    return None
                node = child
            if parts[-1] in node.children:
                return None
            node.children[parts[-1]] = _file(size, mtime)
        return top

    tree = build(files)
    if tree is None or not files:
        return
    limit = 10**6  # (all "old": none keeps its true root)
    a = stamped(tree, lambda paths: {}, limit)
    assert a.content == stamped(build(files), lambda paths: {}, limit).content
    assert all(not e.root for e in _files(tree))  # (the input is left alone)
    path = data.draw(st.sampled_from(sorted(files)))
    size, mtime = files[path]
    changed = dict(files)
    changed[path] = (size, mtime + 1) if data.draw(st.booleans()) else (size + 1, mtime)
    assert stamped(build(changed), lambda paths: {}, limit).content != a.content


def _files(tree: Entry) -> list[Entry]:
    out, stack = [], [tree]
    while stack:
        for entry in stack.pop().children.values():
            if entry.kind == "d":
                stack.append(entry)
            else:
                out.append(entry)
    return out


def test_files_modified_since_the_limit_keep_their_true_roots(tmp_path) -> None:
    write(tmp_path / "old.txt", b"old", OLD)
    write(tmp_path / "new.txt", b"new", OLD + 10)
    tree = walk(str(tmp_path)).tree
    asked: list[list[str]] = []

    def true_roots(paths: list[str]) -> dict[str, bytes]:
        asked.append(paths)
        return {path: b"T" * 32 for path in paths}

    out = stamped(tree, true_roots, OLD + 5)
    assert asked == [["new.txt"]]
    assert out.children["new.txt"].root == b"T" * 32
    assert out.children["old.txt"].root == stamp_root(3, OLD)
    plain = Entry("d", 0o755, 0, children={"x": _file(3, OLD)})
    seal(plain)
    assert out.content != plain.content


def _sketch(items: list[tuple[str, int, int]]) -> bytes:
    return quickcheck.sketches(items)[0]


def test_sketches_tell_how_alike_two_sets_of_stamps_are() -> None:
    base = [(f"dir{i % 50}/file{i}", i * 7, OLD + i) for i in range(8000)]
    assert quickcheck.similarity(_sketch(base), _sketch(base)) == 1.0
    one_in_ten = [(p, s, t + (1 if i % 10 == 0 else 0)) for i, (p, s, t) in enumerate(base)]
    alike = quickcheck.similarity(_sketch(base), _sketch(one_in_ten))
    assert alike is not None and 0.65 < alike < 0.95  # (Jaccard 0.82)
    other = [(p, s, t + 1) for p, s, t in base]
    assert (quickcheck.similarity(_sketch(base), _sketch(other)) or 0) < 0.1
    assert quickcheck.similarity(_sketch([]), _sketch([])) is None


def test_the_server_takes_stamps_where_the_sketches_are_alike() -> None:
    base = [(f"f{i}", i, OLD + i) for i in range(4000)]
    edited = [(p, s, t + (1 if i % 100 == 0 else 0)) for i, (p, s, t) in enumerate(base)]
    touched = [(p, s, t + (1 if i % 4 == 0 else 0)) for i, (p, s, t) in enumerate(base)]
    mine = quickcheck.sketches(base)
    assert quickcheck.stamps_tell(mine, _sketch(edited), cold=False)
    assert not quickcheck.stamps_tell(mine, _sketch(touched), cold=True)
    # A client with no file: stamps where this side would read all of its own.
    assert quickcheck.stamps_tell(mine, _sketch([]), cold=True)
    assert not quickcheck.stamps_tell(mine, _sketch([]), cold=False)


def _kinds_of_change(files: int = 4000) -> dict[str, list[tuple[str, int, int]]]:
    """A set of stamps and, in a quarter of its files: edits (size and time), times alone,
    renames."""
    base = [(f"d{i % 20}/f{i}", 1000 + i, OLD + i) for i in range(files)]
    return {"base": base,
            "edited": [(p, s + 7 * (i % 4 == 0), t + 10**10 * (i % 4 == 0))
                       for i, (p, s, t) in enumerate(base)],
            "touched": [(p, s, t + 10**10 * (i % 4 == 0)) for i, (p, s, t) in enumerate(base)],
            "renamed": [(p + "r" * (i % 4 == 0), s, t) for i, (p, s, t) in enumerate(base)]}


def test_stamps_are_taken_where_they_differ_only_with_the_size() -> None:
    """Where a quarter of the files were edited (their stamps differ, and so does their
    content, which the sync reads either way), the stamp sketches alone are too unlike,
    but the paths sketch tells that nothing else differs; where a quarter only differ in
    time (same content, most likely) or were renamed (whose seeds a cold side finds only by
    reading), it does not."""
    sets = _kinds_of_change()
    mine = quickcheck.sketches(sets["base"])
    edited = quickcheck.sketches(sets["edited"])
    assert (quickcheck.similarity(mine[0], edited[0]) or 0) < quickcheck.SIMILAR_FROM
    assert quickcheck.path_likeness(mine[1], edited[1]) == (1.0, 0.0)
    assert quickcheck.stamps_tell(mine, edited[0], True, edited[1])
    assert not quickcheck.stamps_tell(mine, edited[0], True)  # (a client without it)
    touched = quickcheck.sketches(sets["touched"])
    same, time_alone = quickcheck.path_likeness(mine[1], touched[1]) or (0, 0)
    assert same == 1.0 and 0.1 < time_alone < 0.45  # (a quarter)
    assert not quickcheck.stamps_tell(mine, touched[0], True, touched[1])
    renamed = quickcheck.sketches(sets["renamed"])
    assert (quickcheck.path_likeness(mine[1], renamed[1]) or (1, 0))[0] < 0.8  # (0.6)
    assert not quickcheck.stamps_tell(mine, renamed[0], True, renamed[1])


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.text(min_size=1, max_size=12), st.integers(0, 2**40),
                          st.integers(0, 2**62)), max_size=60),
       st.lists(st.tuples(st.text(min_size=1, max_size=12), st.integers(0, 2**40),
                          st.integers(0, 2**62)), max_size=60))
def test_path_likeness_is_symmetric_and_whole_for_one_set(
        a: list[tuple[str, int, int]], b: list[tuple[str, int, int]]) -> None:
    x, y = quickcheck.sketches(a)[1], quickcheck.sketches(b)[1]
    assert quickcheck.path_likeness(x, y) == quickcheck.path_likeness(y, x)
    alone = quickcheck.path_likeness(x, x)
    assert alone is None or alone == (1.0, 0.0)
    assert (alone is None) == (x == quickcheck.sketches([])[1])


@pytest.mark.parametrize("verb", ["push", "pull"])
async def test_many_edited_files_go_by_stamps_and_only_they_are_read(tmp_path, verb) -> None:
    """A third of the files edited in a copy: both cold sides read the edited files (the
    source to send them, the target its old versions as seeds) and nothing else."""
    src, pair = in_step_copy(tmp_path, files=300)
    source = src if verb == "push" else pair.share / "t"
    edited = [f"d{i % 4}/f{i}.txt" for i in range(0, 300, 3)]
    for path in edited:
        write(source / path, b"edited %s\n" % path.encode() * 9, OLD + 10**10)
    stats = await pair.run(verb, src, path="t")
    assert stats.by_stamps and stats.in_step and stats.files_transferred == len(edited)
    assert tree_state(src) == tree_state(pair.share / "t")
    assert rows(tmp_path / "client-src.sqlite3") <= len(edited)
    assert rows(server_index(pair)) <= len(edited)
    pair.close()


async def test_a_large_edited_file_goes_in_its_batch_by_stamps(tmp_path, counted) -> None:
    """By stamp roots the source has indexed none of the files it offers: a batch reads
    an edited file of 64 KiB to 1 MiB whole by the size it was walked with, as it would by
    its indexed size, instead of sending it back to go by its own exchange (four round
    trips more: 21 such files of the scattered tree cost 6 round trips over a slow link)."""
    src, pair = in_step_copy(tmp_path)
    big = b"".join(b"line %d of a file of 100 KB or so\n" % n for n in range(3000))
    for root in (src, pair.share / "t"):
        write(root / "d0" / "big.txt", big, OLD + 100)
    write(src / "d0" / "big.txt", big[:-9] + b"edited!!\n", OLD + 10**10)
    stats = await pair.run("push", src, path="t")
    assert stats.by_stamps and stats.in_step and stats.files_transferred == 1
    assert tree_state(src) == tree_state(pair.share / "t")
    assert counted["single"] == 0 and counted["batches"] == 1
    assert stats.literal_bytes < 1_000  # (described against its old version)
    pair.close()


def test_a_walk_is_stamped_in_place_to_the_same_hashes_as_a_copy(tmp_path) -> None:
    a_tree(tmp_path / "t")
    copied = stamped(walk(str(tmp_path / "t")).tree, lambda paths: {}, OLD + 10**12)
    tree = walk(str(tmp_path / "t")).tree
    same = stamped(tree, lambda paths: {}, OLD + 10**12, in_place=True)
    assert same is tree and (same.content, same.meta) == (copied.content, copied.meta)
    with pytest.raises(AssertionError):  # (a sealed tree is never stamped in place)
        stamped(same, lambda paths: {}, OLD, in_place=True)


def test_a_stamps_request_that_overtakes_its_open_waits_for_it(e2e: E2E) -> None:
    """Requests are served as they come, in no set order: a ``stamps`` sent in the same
    frame as (even before) its ``open`` is answered once the open decided; a second one
    is a protocol error."""
    share = e2e.tmp / "share"
    write(share / "a.txt", b"a file\n", OLD)
    server = e2e.serve({"s": share})
    client = RawClient(server.port)
    try:
        client.send({"t": "hello", "proto": [2, 2], "agent": "e2e/0",
                     "features": ["stamp-roots"], "token": TOKEN, "format": FORMAT})
        welcome = client.receive()
        assert welcome is not None and "stamp-roots" in welcome[0]["features"]
        sketch = quickcheck.sketches([("a.txt", 7, OLD)])[0]
        client.send({"t": "stamps", "id": 1, "sketch": sketch, "racy_from": OLD + 10**12},
                    {"t": "open", "id": 2, "share": "s", "path": b"", "write": False,
                     "create": False, "excludes": [], "stamps": True})
        answers: dict[str, dict] = {}
        while not {"stamped", "opened"} <= set(answers):  # (in either order)
            batch = client.receive()
            assert batch is not None, answers
            answers.update((message["t"], message) for message in batch)
        assert answers["stamped"]["stamps"] is True and "content" in answers["opened"]
        again = client.request("stamps", sketch=sketch, racy_from=0)
        (error,) = client.answer(again)
        assert error["t"] == "error" and error["code"] == "protocol"
    finally:
        client.close()


def test_a_warm_client_is_asked_for_its_sketch_only_by_a_cold_share(e2e: E2E) -> None:
    """An ``open`` with ``warm`` hears ``stamped`` with ``want`` first where the share's
    index is cold, and its ``stamps`` then decides; a warm share answers ``opened`` alone
    (the sync compares content roots)."""
    share = e2e.tmp / "share"
    write(share / "a.txt", b"a file\n", OLD)
    server = e2e.serve({"s": share})

    def open_warm(client: RawClient) -> dict:
        client.send({"t": "hello", "proto": [2, 2], "agent": "e2e/0",
                     "features": ["stamp-roots", "warm-stamps"], "token": TOKEN,
                     "format": FORMAT})
        welcome = client.receive()
        assert welcome is not None and "warm-stamps" in welcome[0]["features"]
        client.next_id = 2
        client.send({"t": "open", "id": 1, "share": "s", "path": b"", "write": False,
                     "create": False, "excludes": [], "warm": True})
        batch = client.receive()
        assert batch is not None and len(batch) == 1
        return batch[0]

    cold = RawClient(server.port)
    try:
        asked = open_warm(cold)
        assert asked["t"] == "stamped" and asked["want"] is True and not asked.get("stamps")
        sketch = quickcheck.sketches([("a.txt", 7, OLD)])[0]
        cold.send({"t": "stamps", "id": 2, "sketch": sketch, "racy_from": OLD + 10**12})
        answers: dict[str, dict] = {}
        while not {"stamped", "opened"} <= set(answers):
            batch = cold.receive()
            assert batch is not None, answers
            answers.update((message["t"], message) for message in batch)
        assert answers["stamped"]["stamps"] is True
    finally:
        cold.close()
    assert e2e.pull(server.url("s"), e2e.tmp / "copy", "--checksum").ok()  # (warms it)
    warm = RawClient(server.port)
    try:
        assert open_warm(warm)["t"] == "opened"
    finally:
        warm.close()


def test_the_command_pushes_and_pulls_a_copy_by_stamps_end_to_end(e2e: E2E) -> None:
    """``rdc push`` and ``rdc pull`` against a real server, neither side indexed: a `cp
    -a` of the share is in step without a file sent; an edit here is pushed, one there
    pulled, and `--stats` says how the trees were compared. (400 files: in a tree of 40,
    a quarter of them sketched, two edits can look like a fifth of the tree, and so small
    a tree is read instead.)"""
    share, local = e2e.tmp / "share", e2e.tmp / "local"
    a_tree(share, 400)
    shutil.copytree(share, local, copy_function=shutil.copy2)
    server = e2e.serve({"s": share})
    same = e2e.push(local, server.url("s"), "--stats").ok()
    assert same.stats["by_stamps"] and same.stats["files_transferred"] == 0
    assert "compared by size and time" in same.stdout
    write(local / "d0" / "f8.txt", b"edited here\n", OLD + 10**10)
    pushed = e2e.push(local, server.url("s")).ok()
    assert pushed.stats["by_stamps"] and pushed.stats["files_transferred"] == 1
    write(share / "d1" / "f9.txt", b"edited there\n", OLD + 10**10)
    pulled = e2e.pull(server.url("s"), local).ok()
    assert pulled.stats["by_stamps"] and pulled.stats["files_transferred"] == 1
    assert tree_state(local) == tree_state(share)
