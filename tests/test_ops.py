"""Ops applied against what is there now: a compare and swap that fails because another
client made exactly what this op wanted is no conflict; anything else still is."""

from __future__ import annotations

import dataclasses
import os
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rdc import _native
from rdc.errors import Refusal
from rdc.local.fs import SafeRoot
from rdc.local.ignore import Excludes
from rdc.local.paths import join
from rdc.local.replica import Replica
from rdc.local.snapshot import lookup, meta_of
from rdc.transfer.ops import apply_ops, mlisting
from rdc.wire import messages as m
from tests.protocol_support import tree_state
from tests.test_entry_trees import trees


@pytest.fixture
def replica(tmp_path: Path):
    (tmp_path / "root").mkdir()
    replica = Replica(str(tmp_path / "root"), tmp_path / "index.sqlite3", Excludes(()))
    yield replica
    replica.close()


def racing_link(monkeypatch: pytest.MonkeyPatch, root: Path, target: str) -> None:
    """Another client makes ``l`` (a link to ``target``) just before this one's swap."""
    real = SafeRoot.symlink

    def late(self: SafeRoot, rel: str, *args: object, **kwargs: object) -> os.stat_result:
        if not os.path.lexists(root / rel):
            os.symlink(target, root / rel)
        return real(self, rel, *args, **kwargs)

    monkeypatch.setattr(SafeRoot, "symlink", late)


def test_a_link_made_meanwhile_as_wanted_is_no_conflict(replica, tmp_path, monkeypatch) -> None:
    root = tmp_path / "root"
    racing_link(monkeypatch, root, "../big.bin")
    results = apply_ops(replica, [m.Op("link", "l", target=b"../big.bin", expect=m.NOTHING)])
    assert results == [None]
    assert os.readlink(root / "l") == "../big.bin"


def test_a_link_made_meanwhile_elsewhere_is_a_conflict(replica, tmp_path, monkeypatch) -> None:
    root = tmp_path / "root"
    racing_link(monkeypatch, root, "other")
    [failure] = apply_ops(replica, [m.Op("link", "l", target=b"../big.bin", expect=m.NOTHING)])
    assert failure is not None and failure.code == "conflict"
    assert os.readlink(root / "l") == "other"


names = st.sampled_from(["a", "b", "c", "d/a", "d/b", "d/e/a", "d", "d/e", "x", "n", "n/m"])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["mv", "mv", "mv", "rm", "mkdir", "mkdir"]), names,
                          names, st.booleans()), min_size=1, max_size=12))
def test_a_batch_of_moves_does_what_the_moves_one_by_one_do(tmp_path_factory, ops) -> None:
    """Moves applied in one batch (their rows looked up at once, the index changed in one
    transaction at the end) give each op the result, the disk the entries, and the index
    the rows that applying them one by one gives, chains of moves (a to b, then b to c),
    moves of directories and removals among them; every row left describes its file. The
    batch makes runs of directories natively (`Replica.mkdir_many`); one by one, each is
    made step by step, as without the C extension."""
    from rdc.content.signature import signature_of_bytes

    def run(batched: bool) -> tuple[list, dict, dict]:
        base = tmp_path_factory.mktemp("ops")
        root = base / "root"
        (root / "d" / "e").mkdir(parents=True)
        for name in ["a", "b", "c", "d/a", "d/e/a"]:
            (root / name).write_bytes(name.encode() * 100)
        replica = Replica(str(root), base / "index.sqlite3", Excludes(()))
        tree = replica.scan()
        listed = {name: lookup(tree, name) for name in ["a", "b", "c", "d/a", "d/b", "d/e/a"]}
        batch = []
        for kind, path, other, expecting in ops:
            entry = listed.get(path)
            expect = (m.Expected("f", entry.root[:8]) if expecting and entry is not None
                      and entry.kind == "f" else None)
            if kind == "mv":
                batch.append(m.Op("mv", path, destination=other, expect=expect))
            elif kind == "rm":
                batch.append(m.Op("rm", path, expect=expect))
            else:
                batch.append(m.Op("mkdir", path, mode=0o755))
        if batched:
            results = apply_ops(replica, batch)
        else:
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(_native, "make_dirs", None)
                results = [result for op in batch for result in apply_ops(replica, [op])]
        disk = {str(p.relative_to(root)): p.read_bytes() if p.is_file() else p.stat().st_mode
                for p in root.rglob("*")}
        rows = {row.path: row.root for row in replica.db.files()}
        for path, root_hash in rows.items():  # never a wrong row
            assert isinstance(disk.get(path), bytes)
            assert signature_of_bytes(disk[path]).root == root_hash
        replica.close()
        return [r if r is None else r.code for r in results], disk, rows

    assert run(True) == run(False)


def test_a_directory_moved_among_file_moves_is_not_reached_by_its_old_path(replica,
                                                                         tmp_path) -> None:
    """A batch's file moves reach their directories through descriptors held across ops;
    a directory moved away and made again between them is the new one for the moves after
    (a descriptor still held on the old one would put the file in the moved directory)."""
    root = tmp_path / "root"
    (root / "d").mkdir()
    for name in ("a", "b"):
        (root / name).write_bytes(name.encode() * 100)
    tree = replica.scan()

    def expect(name: str) -> m.Expected:
        return m.Expected("f", lookup(tree, name).root[:8])

    ops = [m.Op("mv", "a", destination="d/a", expect=expect("a")),
           m.Op("mv", "d", destination="moved"),
           m.Op("mkdir", "d", mode=0o755),
           m.Op("mv", "b", destination="d/b", expect=expect("b"))]
    assert apply_ops(replica, ops) == [None] * 4
    assert sorted(os.listdir(root / "moved")) == ["a"]
    assert sorted(os.listdir(root / "d")) == ["b"]


def test_a_batch_of_moves_changes_the_index_once_and_keeps_the_rows(replica, tmp_path) -> None:
    """50 renamed files and 20 removed: their rows looked up in one query, and the index
    changed in one transaction (one each took three holds of the index lock a move), each
    moved row kept at its new path, so nothing is read again."""
    root = tmp_path / "root"
    for i in range(70):
        (root / f"f{i}").write_bytes(os.urandom(2000))
    for i in range(70):  # (old enough that their rows are not racy)
        os.utime(root / f"f{i}", ns=(1_600_000_000_000_000_000, 1_600_000_000_000_000_000))
    tree = replica.scan()
    before = {row.path: (row.id, row.root) for row in replica.db.files()}
    transactions, lookups = [], []
    real_transaction, real_indexed = replica.db.transaction, replica.indexed

    def transaction():
        transactions.append(1)
        return real_transaction()

    def indexed(paths):
        lookups.append(len(paths))
        return real_indexed(paths)

    replica.db.transaction = transaction
    replica.indexed = indexed
    ops = [m.Op("mv", f"f{i}", destination=f"g{i}",
                expect=m.Expected("f", lookup(tree, f"f{i}").root[:8])) for i in range(50)]
    ops += [m.Op("rm", f"f{i}", expect=m.Expected("f", lookup(tree, f"f{i}").root[:8]))
            for i in range(50, 70)]
    assert apply_ops(replica, ops) == [None] * 70
    assert transactions == [1] and lookups == [70]
    assert {row.path: (row.id, row.root) for row in replica.db.files()} == {
        f"g{i}": before[f"f{i}"] for i in range(50)}


def _tree_of_thirty(root: Path, mode: int, mtime_ns: int) -> None:
    """63 directories in three levels, 4 files in each of the 30 deepest; every file's mode
    ``mode``, every entry's time ``mtime_ns`` (set deepest first)."""
    for d in range(30):
        where = root / f"d{d % 3}" / f"e{d % 10}" / f"x{d}"
        where.mkdir(parents=True, exist_ok=True)
        for f in range(4):
            (where / f"f{f}").write_bytes(f"{d} {f}\n".encode() * 40)
    for dirpath, dirnames, filenames in os.walk(root, topdown=False):
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), mode)
            os.utime(os.path.join(dirpath, name), ns=(mtime_ns, mtime_ns))
        for name in dirnames:
            os.utime(os.path.join(dirpath, name), ns=(mtime_ns, mtime_ns))


def _vectors(tree, hb: int) -> list[m.MetaDir]:
    """A walk's vectors of every directory of ``tree``, one level each, top first."""
    items, frontier = [], [""]
    while frontier:
        path = frontier.pop(0)
        items.append(mlisting(tree, path, hb, levels=True))
        frontier += [join(path, name) for name, entry in lookup(tree, path).sorted_children()
                     if entry.kind == "d"]
    return items


@pytest.mark.parametrize("workers", [1, 2])
def test_vectors_applied_on_two_threads_do_what_one_thread_does(
        tmp_path, monkeypatch, workers: int) -> None:
    """Every mode and time of a tree of 183 entries changed, sent as 64 one-level vectors:
    applied two at a time (both threads at work at once, which a barrier holding the first
    two vectors proves) or one at a time, the tree on disk and the tree of entries end as
    the source's, every entry counted, and the index rows stay current (a scan after
    reads no file again), recorded in one transaction at the end."""
    from rdc.transfer import ops

    old, new = 1_600_000_000_000_000_000, 1_650_000_000_123_456_789
    _tree_of_thirty(tmp_path / "src", 0o640, new)
    _tree_of_thirty(tmp_path / "dst", 0o604, old)
    source = Replica(str(tmp_path / "src"), tmp_path / "src.sqlite3", Excludes(()))
    target = Replica(str(tmp_path / "dst"), tmp_path / "dst.sqlite3", Excludes(()))
    items = _vectors(source.scan(), m.HASH_BYTES)
    tree = target.scan()
    assert len(items) == 64
    monkeypatch.setattr(ops, "META_WORKERS", workers)
    first_two = threading.Barrier(2, timeout=10)
    threads: set[int] = set()
    real = ops.apply_meta

    def spying(replica, tree, item, **kw):
        threads.add(threading.get_ident())
        if workers > 1 and item in items[:2]:
            first_two.wait()  # (one thread alone would wait here until the timeout)
        return real(replica, tree, item, **kw)

    monkeypatch.setattr(ops, "apply_meta", spying)
    recorded: list[int] = []
    real_record = target.record_times
    monkeypatch.setattr(target, "record_times",
                        lambda retimed: recorded.append(len(retimed)) or real_record(retimed))
    assert ops.apply_metas(target, tree, items) == (2 * 120 + 63, 0)
    assert len(threads) == workers
    assert recorded == [120]  # every file's row, in one transaction
    assert tree_state(tmp_path / "dst") == tree_state(tmp_path / "src")
    assert meta_of(tree, True) == meta_of(lookup(source.scan(), ""), True)
    target.scan()
    assert target.stats.signed == 0 and target.stats.unchanged == 120
    source.close()
    target.close()


def test_the_first_bad_vector_in_order_is_the_error_raised(tmp_path) -> None:
    """Two of 64 vectors refused (a mode out of range, at the 4th and the 21st): whichever
    thread meets its bad vector first, the error raised is the 4th's, as one thread
    applying them in order would raise."""
    from rdc.transfer import ops

    _tree_of_thirty(tmp_path / "src", 0o640, 1_650_000_000_000_000_000)
    _tree_of_thirty(tmp_path / "dst", 0o604, 1_600_000_000_000_000_000)
    source = Replica(str(tmp_path / "src"), tmp_path / "src.sqlite3", Excludes(()))
    target = Replica(str(tmp_path / "dst"), tmp_path / "dst.sqlite3", Excludes(()))
    items = _vectors(source.scan(), m.HASH_BYTES)
    for k, bad in ((3, 0o10000), (20, 0o20000)):
        items[k] = dataclasses.replace(
            items[k], modes=m.Vector.encode([bad] * len(items[k].modes.decode())))
    with pytest.raises(Refusal, match="bad mode 10000"):
        ops.apply_metas(target, target.scan(), items)
    source.close()
    target.close()


def _directories(tree, path: str = ""):
    yield path, tree
    for name, entry in tree.sorted_children():
        if entry.kind == "d":
            yield from _directories(entry, join(path, name))


@settings(max_examples=200, deadline=None)
@given(trees(), st.integers(0, 2**62), st.sampled_from([5, 8, m.HASH_BYTES]))
def test_a_split_item_joined_with_this_sides_entries_is_the_whole_one(
        tree, shift: int, hb: int) -> None:
    """`mlist` ``split``: the server's vectors of a directory's subdirectories and a hash of
    its other entries' times and modes, joined with this side's own entries where that hash
    is this side's, make exactly the one-level item the server sends without ``split``;
    where one of those entries' time differs here, the hash does not match and the
    directory is asked for again whole (None)."""
    import copy

    from rdc.transfer.metadata import _joined

    for path, directory in _directories(tree):
        split = mlisting(tree, path, hb, levels=True, split=True)
        whole = mlisting(tree, path, hb, levels=True)
        assert split is not None and whole is not None and split.files
        assert len(split.times.decode()) == sum(e.kind == "d" for e in directory.children.values())
        assert _joined(split, directory) == whole
        others = [name for name, entry in directory.sorted_children() if entry.kind != "d"]
        if others and shift:
            mine = copy.deepcopy(directory)
            entry = mine.children[others[shift % len(others)]]
            entry.mtime_ns = (entry.mtime_ns + shift) % 2**63
            if hb == m.HASH_BYTES:  # (shorter prefixes: 2^-40 a chance to pass all the same)
                assert _joined(split, mine) is None
