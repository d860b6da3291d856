"""Rescans: after any sequence of writes made through a replica, the tree a rescan patches
together equals, hash for hash and stamp for stamp, the tree a full scan of the same
directory builds from nothing; and it lists only what the writes touched."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rdc.local import fs as fs_module
from rdc.local import replica as replica_module
from rdc.local import rescan as rescan_module
from rdc.local.fs import Expect, HeldDirs, TempFile, sync_all
from rdc.local.ignore import Excludes
from rdc.local.replica import Replica
from rdc.local.snapshot import Entry, Scan, entries_below, fingerprint

OLD = 1_600_000_000 * 10**9
NAMES = ["a", "b", "c", "é"]
PATHS = [p for p in (*NAMES, *(f"{d}/{n}" for d in NAMES[:2] for n in NAMES),
                     *(f"a/{d}/{n}" for d in NAMES[:2] for n in NAMES[:2]))]

op = st.one_of(
    st.tuples(st.just("write"), st.sampled_from(PATHS), st.binary(max_size=3000),
              st.sampled_from([0o644, 0o600])),
    st.tuples(st.just("mkdir"), st.sampled_from(PATHS)),
    st.tuples(st.just("makedirs"), st.sampled_from(PATHS)),
    st.tuples(st.just("remove"), st.sampled_from(PATHS)),
    st.tuples(st.just("rename"), st.sampled_from(PATHS), st.sampled_from(PATHS)),
    st.tuples(st.just("move"), st.sampled_from(PATHS), st.sampled_from(PATHS)),
    st.tuples(st.just("link"), st.sampled_from(PATHS), st.sampled_from(["x", "../y", "a"])),
    st.tuples(st.just("meta"), st.sampled_from(["", *PATHS]), st.sampled_from([0o755, 0o700]),
              st.integers(0, 5)),
    st.tuples(st.just("batch"), st.lists(st.sampled_from(PATHS), min_size=1, max_size=3),
              st.binary(max_size=300)),
    st.tuples(st.just("abandon"), st.sampled_from(PATHS)),
)


def apply(replica: Replica, step: tuple) -> None:
    """One write through the replica, as the transfer code makes them; a write that the
    tree does not allow (no parent, something in the way) fails as it would there."""
    fs = replica.fs
    kind, path, *rest = step
    try:
        if kind == "write":
            data, mode = rest
            temp = fs.create_temp(path)
            temp.write(data)
            replica.commit(temp, path, mode, OLD + len(data), None)
        elif kind == "mkdir":
            replica.mkdir(path, 0o755)
        elif kind == "makedirs":
            fs.makedirs(path, 0o755)
        elif kind == "remove":
            fs.remove(path)
            replica.forget(path)
        elif kind == "rename":
            fs.rename(path, rest[0])
            replica.forget(path)
            replica.forget(rest[0])
        elif kind == "move":  # as an op moves: the file's index row goes with it
            replica.move(path, rest[0])
        elif kind == "link":
            fs.symlink(path, rest[0], mtime_ns=OLD)
            replica.forget(path)
        elif kind == "batch":  # as a batch writes: natively, linked in where nothing was
            _write_batch(replica, path, rest[0])
        elif kind == "abandon":  # a temporary made, then removed
            fs.create_temp(path).abort()
        else:
            mode, seconds = rest
            replica.set_meta(path, mode, OLD + seconds * 10**9)
    except (OSError, ValueError):
        pass
    except Exception as exc:  # PathError, ConflictError: refused, nothing done
        if type(exc).__name__ not in ("PathError", "ConflictError"):
            raise


def _write_batch(replica: Replica, paths: list[str], data: bytes) -> None:
    """Write ``paths`` (each once) as `rdc.transfer.batch` does: temporaries made in one
    go, made durable together, installed together (those where nothing is, by a link).
    Their rows go, as `Replica.commit` without a signature drops one (a batch records new
    ones): a row left describing the old file could vouch for the new one when its inode
    number comes back with the same size and the test's made-up time."""
    paths = list(dict.fromkeys(paths))
    with HeldDirs(replica.fs) as held:
        temps = list(replica.fs.create_temps(
            [(path, data + path.encode(), 0o644, OLD + len(data)) for path in paths], held))
    made = [temp for temp in temps if isinstance(temp, TempFile)]
    sync_all(replica.fs, made)
    expects = [Expect.absent() if replica.fs.lstat(temp.path) is None else None
               for temp in made]
    replica.install_all(list(zip(made, expects, strict=True)))
    for temp in made:
        replica.forget(temp.path)


def described(tree: Entry) -> list[tuple]:
    top = [("", tree.mode, tree.mtime_ns, tree.ino)]
    return top + [(path, e.kind, e.mode, e.mtime_ns, e.size, e.root, e.target, e.content,
                   e.meta, e.smeta, e.count, e.ino) for path, e in entries_below(tree)]


def full_scan(root: str, index: Path, excludes: Excludes) -> tuple[Entry, bytes]:
    other = Replica(root, index, excludes)
    try:
        _, walked = other.quick()
        return other.scan(walked=walked), walked.fingerprint
    finally:
        other.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rounds=st.lists(st.lists(op, max_size=12), min_size=1, max_size=3),
       exclude=st.booleans(), notes=st.sampled_from([2, fs_module.NOTES_MAX]))
def test_a_rescan_equals_a_full_scan(rounds: list[list[tuple]], exclude: bool,
                                     notes: int) -> None:
    """(``notes``: how many installed files and made directories the root notes before it
    leaves the rest to listings.)"""
    base = Path(tempfile.mkdtemp())
    saved_notes, fs_module.NOTES_MAX = fs_module.NOTES_MAX, notes
    try:
        root = base / "root"
        (root / "a" / "b").mkdir(parents=True)
        for name in ("a/one", "a/b/two", "three"):
            (root / name).write_bytes(name.encode() * 50)
            os.utime(root / name, ns=(OLD, OLD))
        excludes = Excludes(["c/"] if exclude else [])
        replica = Replica(str(root), base / "index.sqlite3", excludes)
        replica.scan()
        for n, steps in enumerate(rounds):
            for step in steps:
                apply(replica, step)
            with pytest.MonkeyPatch.context() as mp:  # the roots read a few rows at a time
                mp.setattr(replica_module, "ROOTS_AT_ONCE", 2)
                patched = replica.rescan()
            fs_module.NOTES_MAX = notes  # (for the next round's writes)
            fresh, walked_print = full_scan(str(root), base / f"fresh{n}.sqlite3", excludes)
            assert described(patched) == described(fresh)
            assert (patched.content, patched.meta, patched.smeta) == (
                fresh.content, fresh.meta, fresh.smeta)
            salt = "\n".join(excludes.patterns).encode()
            assert fingerprint(patched, salt) == walked_print
        replica.close()
    finally:
        fs_module.NOTES_MAX = saved_notes
        shutil.rmtree(base)


def _count_listings(monkeypatch) -> list[str]:
    """The directories a replica lists from now on (not those it opens to read files in)."""
    listed: list[str] = []
    original = Scan.list

    def counting(self: Scan, fd: int, rel: str, node: Entry, kept=None):
        listed.append(rel)
        return original(self, fd, rel, node, kept)

    monkeypatch.setattr(Scan, "list", counting)
    return listed


def test_a_rescan_lists_only_the_touched_directories(tmp_path, monkeypatch) -> None:
    """In a tree of 40 directories, a directory removed from one lists that one and its
    parent again, no other; the next quick walk finds the hashes the rescan cached."""
    root = tmp_path / "root"
    for i in range(40):
        (root / f"d{i}" / "sub").mkdir(parents=True)
        (root / f"d{i}" / "sub" / "f").write_bytes(b"x" * i)
        os.utime(root / f"d{i}" / "sub" / "f", ns=(OLD, OLD))
    replica = Replica(str(root), tmp_path / "index.sqlite3")
    replica.scan()
    listed = _count_listings(monkeypatch)
    replica.fs.remove("d7/sub")
    replica.forget("d7/sub")
    tree = replica.rescan()
    assert sorted(listed) == ["", "d7"]
    assert replica.quick()[0] == (tree.content, tree.meta, tree.smeta)
    assert replica.rescan() is tree  # nothing written since: the same tree
    replica.close()


def test_what_this_replica_installed_and_made_is_patched_in_without_a_listing(
        tmp_path, monkeypatch) -> None:
    """New directories two levels deep, files installed in them one by one and in a batch,
    and an old file written again: no directory is listed again, and the rescan equals a
    full scan; the next quick walk finds the hashes it cached. A temporary removed, or a
    file written twice before the rescan, lists its directory."""
    root = tmp_path / "root"
    for i in range(10):
        (root / f"d{i}").mkdir(parents=True)
        (root / f"d{i}" / "f").write_bytes(b"x" * i)
        os.utime(root / f"d{i}" / "f", ns=(OLD, OLD))
    replica = Replica(str(root), tmp_path / "index.sqlite3")
    replica.scan()
    listed = _count_listings(monkeypatch)
    for path in ("new", "new/deeper", "d3/new"):
        assert replica.mkdir(path, 0o750)
    for path in ("new/one", "d4/f"):
        temp = replica.fs.create_temp(path)
        temp.write(path.encode())
        replica.commit(temp, path, 0o640, OLD + 5, None)
    _write_batch(replica, ["new/deeper/two", "new/three", "d3/new/four", "d5/f"], b"batch")
    tree = replica.rescan()
    assert listed == []
    fresh, walked_print = full_scan(str(root), tmp_path / "fresh.sqlite3", Excludes([]))
    assert described(tree) == described(fresh)
    assert fingerprint(tree, b"") == walked_print
    assert replica.quick()[0] == (tree.content, tree.meta, tree.smeta)

    listed.clear()  # (the full scan and the walk listed everything)
    replica.fs.create_temp("d6/f").abort()
    for _ in range(2):
        _write_batch(replica, ["d7/g"], b"twice")
    tree = replica.rescan()
    assert sorted(listed) == ["", "d6", "d7"]
    fresh, _ = full_scan(str(root), tmp_path / "fresh2.sqlite3", Excludes([]))
    assert described(tree) == described(fresh)
    replica.close()


def test_files_moved_and_removed_are_patched_in_without_a_listing(
        tmp_path, monkeypatch) -> None:
    """Files moved across directories (their rows with them, as an op moves them), and
    files and links removed: no directory is listed again, no file read, and the rescan
    equals a full scan. A path noted twice (removed, then written again; moved there, then
    moved on) lists its directories instead, and still equals a full scan."""
    root = tmp_path / "root"
    for i in range(6):
        (root / f"d{i}").mkdir(parents=True)
        for name in ("f", "g"):
            (root / f"d{i}" / name).write_bytes(f"{i}{name}".encode() * 40)
            os.utime(root / f"d{i}" / name, ns=(OLD, OLD))
        os.symlink("f", root / f"d{i}" / "link")
    replica = Replica(str(root), tmp_path / "index.sqlite3")
    replica.scan()
    listed = _count_listings(monkeypatch)
    read: list[str] = []
    real_open = replica.fs.open_read
    monkeypatch.setattr(replica.fs, "open_read", lambda rel: read.append(rel) or real_open(rel))
    with replica.changing_together():
        for i in range(3):
            replica.move(f"d{i}/f", f"d{i + 3}/moved{i}")
    for path in ("d0/g", "d1/link"):
        replica.fs.remove(path)
        replica.forget(path)
    tree = replica.rescan()
    assert listed == [] and read == []
    assert sorted(tree.children["d3"].children) == ["f", "g", "link", "moved0"]
    fresh, walked_print = full_scan(str(root), tmp_path / "fresh.sqlite3", Excludes([]))
    assert described(tree) == described(fresh)
    assert fingerprint(tree, b"") == walked_print
    assert replica.quick()[0] == (tree.content, tree.meta, tree.smeta)

    listed.clear()
    replica.fs.remove("d2/g")
    _write_batch(replica, ["d2/g"], b"again")
    replica.move("d3/moved0", "d4/there")
    replica.move("d4/there", "d5/on")
    tree = replica.rescan()
    assert sorted(listed) == ["", "d2", "d3", "d4", "d5"]
    fresh, _ = full_scan(str(root), tmp_path / "fresh2.sqlite3", Excludes([]))
    assert described(tree) == described(fresh)
    replica.close()


def test_the_rows_of_files_written_and_recorded_are_read_once(tmp_path, monkeypatch) -> None:
    """Files a batch wrote and recorded (as `rdc.transfer.batch` does): the rescan takes
    their roots with the rows that vouch for them, and looks up no root again; a file
    written without a row is read, and its root looked up after."""
    from rdc.content.signature import signature_of_bytes
    from rdc.local.index.db import IndexDatabase

    root = tmp_path / "root"
    (root / "d").mkdir(parents=True)
    replica = Replica(str(root), tmp_path / "index.sqlite3")
    replica.scan()
    paths = [f"d/f{i}" for i in range(30)]
    _write_batch(replica, paths, b"recorded")
    replica.record_many([(path, os.lstat(root / path),
                          signature_of_bytes(b"recorded" + path.encode())) for path in paths],
                        racy=False)
    _write_batch(replica, ["d/unrecorded"], b"not recorded")
    asked: list[list[str]] = []
    real = IndexDatabase.roots_of

    def roots_of(self: IndexDatabase, some: list[str]) -> dict[str, bytes]:
        asked.append(list(some))
        return real(self, some)

    monkeypatch.setattr(IndexDatabase, "roots_of", roots_of)
    tree = replica.rescan()
    assert asked == [["d/unrecorded"]]
    fresh, _ = full_scan(str(root), tmp_path / "fresh.sqlite3", Excludes([]))
    assert described(tree) == described(fresh)
    replica.close()


def test_a_temporary_still_being_written_at_a_rescan_is_patched_in_at_the_next(
        tmp_path) -> None:
    """A temporary made before a rescan and installed after it: the first rescan has the
    directory's new time and not the temporary, the second the installed file; each equals
    a full scan."""
    root = tmp_path / "root"
    (root / "d").mkdir(parents=True)
    (root / "d" / "old").write_bytes(b"old")
    replica = Replica(str(root), tmp_path / "index.sqlite3")
    replica.scan()
    temp = replica.fs.create_temp("d/new")
    temp.write(b"being written")
    for n in range(2):
        tree = replica.rescan()
        fresh, _ = full_scan(str(root), tmp_path / f"fresh{n}.sqlite3", Excludes([]))
        assert described(tree) == described(fresh)
        assert sorted(tree.children["d"].children) == (["old"] if n == 0 else ["new", "old"])
        if n == 0:
            replica.commit(temp, "d/new", 0o644, OLD, None)
    replica.close()


def test_a_file_another_program_adds_beside_an_installed_one_is_found_by_the_next_walk(
        tmp_path) -> None:
    """The rescan does not list a directory this replica only added to, so it cannot see a
    file another program put there meanwhile (as it never saw one put in a directory it
    did not touch); the next quick walk's stamp differs, and the scan after it has both."""
    root = tmp_path / "root"
    (root / "d").mkdir(parents=True)
    replica = Replica(str(root), tmp_path / "index.sqlite3")
    replica.scan()
    _write_batch(replica, ["d/ours"], b"ours")
    (root / "d" / "theirs").write_bytes(b"theirs")
    tree = replica.rescan()
    assert sorted(tree.children["d"].children) == ["ours"]
    cached, walked = replica.quick()
    assert cached is None
    assert sorted(replica.scan(walked=walked).children["d"].children) == ["ours", "theirs"]
    replica.close()


def test_modes_and_times_set_in_place_are_patched_in_without_a_listing(
        tmp_path, monkeypatch) -> None:
    """Setting the time and mode of every file and directory (a release whose sdist
    touched them all) lists no directory again; the rescan still equals a full scan, and
    the next quick walk finds the hashes it cached."""
    root = tmp_path / "root"
    for i in range(20):
        (root / f"d{i}" / "sub").mkdir(parents=True)
        for name in (f"d{i}/f", f"d{i}/sub/g"):
            (root / name).write_bytes(name.encode() * 30)
            os.utime(root / name, ns=(OLD, OLD))  # not racy: the index vouches for them
        os.symlink("f", root / f"d{i}" / "link")
    replica = Replica(str(root), tmp_path / "index.sqlite3")
    before = replica.scan()
    listed = _count_listings(monkeypatch)
    for path, entry in reversed(entries_below(before)):
        mode = None if entry.kind == "l" else (0o700 if entry.kind == "d" else 0o600)
        replica.set_meta(path, mode, OLD + len(path))
    tree = replica.rescan()
    assert listed == []
    fresh, walked_print = full_scan(str(root), tmp_path / "fresh.sqlite3", Excludes([]))
    assert described(tree) == described(fresh)
    assert fingerprint(tree, b"") == walked_print
    assert tree.content == before.content and tree.meta != before.meta
    assert replica.quick()[0] == (tree.content, tree.meta, tree.smeta)
    replica.close()


def test_a_retimed_entry_the_tree_does_not_hold_lists_its_directory(tmp_path) -> None:
    """A file another program made after the last scan, then given a time through the
    replica (a batch's "have"), is found by listing its directory again; so is a file
    retimed twice (two writers' notes may come in either order)."""
    root = tmp_path / "root"
    (root / "d").mkdir(parents=True)
    (root / "d" / "old").write_bytes(b"old")
    replica = Replica(str(root), tmp_path / "index.sqlite3")
    replica.scan()
    (root / "d" / "new").write_bytes(b"made meanwhile")
    replica.set_meta("d/new", 0o600, OLD)
    tree = replica.rescan()
    assert sorted(tree.children["d"].children) == ["new", "old"]
    assert tree.children["d"].children["new"].mtime_ns == OLD
    replica.set_meta("d/old", 0o600, OLD + 1)
    replica.set_meta("d/old", 0o600, OLD + 2)
    assert replica.fs.take_changes() == {"d"} and replica.fs.retimed.keys() == {"d/old"}
    replica.close()


def test_an_unlistable_directory_means_a_full_scan(tmp_path, monkeypatch) -> None:
    root = tmp_path / "root"
    (root / "d").mkdir(parents=True)
    replica = Replica(str(root), tmp_path / "index.sqlite3")
    replica.scan()
    temp = replica.fs.create_temp("d/f")
    temp.write(b"data")
    replica.commit(temp, "d/f", 0o644, OLD, None)
    scans: list[int] = []
    original = Replica.scan

    def scan(self: Replica, *args, **kwargs) -> Entry:
        scans.append(1)
        return original(self, *args, **kwargs)

    def refuse(*args, **kwargs):
        raise rescan_module.Unsure("cannot list")

    monkeypatch.setattr(Replica, "scan", scan)
    monkeypatch.setattr("rdc.local.replica.patch", refuse)
    tree = replica.rescan()
    assert scans == [1] and "f" in tree.children["d"].children
    replica.close()


def test_a_scan_of_an_unchanged_tree_reuses_the_sealed_one(tmp_path, monkeypatch) -> None:
    """A daemon's next session scans again: when the walk sees the tree exactly as the last
    scan or rescan sealed it, the index is not refreshed and the same tree is returned; an
    edit made outside the replica is seen."""
    root = tmp_path / "root"
    (root / "d").mkdir(parents=True)
    (root / "d" / "f").write_bytes(b"one")
    os.utime(root / "d" / "f", ns=(OLD, OLD))  # not racy: the index vouches for it
    replica = Replica(str(root), tmp_path / "index.sqlite3")
    first = replica.scan()
    temp = replica.fs.create_temp("d/g")
    temp.write(b"two")
    replica.commit(temp, "d/g", 0o644, OLD, None)
    patched = replica.rescan()
    refreshes: list[int] = []
    real_refresh = replica_module.refresh

    def counting(*args, **kwargs):
        refreshes.append(1)
        return real_refresh(*args, **kwargs)

    monkeypatch.setattr(replica_module, "refresh", counting)
    assert replica.scan() is patched and refreshes == []
    (root / "d" / "f").write_bytes(b"changed outside")
    os.utime(root / "d" / "f", ns=(OLD + 10**9, OLD + 10**9))
    fresh = replica.scan()
    assert refreshes == [1] and fresh is not patched and fresh.content != first.content
    assert fresh.content != patched.content
    replica.close()


def test_a_directory_made_again_with_its_old_inode_number_is_listed_anew(tmp_path) -> None:
    """A directory removed and made again can get its inode number back (it did, in one CI
    run in ten): the rescan must not take it for the old one and keep the old children.
    The reuse is made certain here by giving the old tree's entry the new number."""
    root = tmp_path / "root"
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "one").write_bytes(b"one" * 50)
    replica = Replica(str(root), tmp_path / "index.sqlite3")
    try:
        old = replica.scan()
        replica.fs.remove("a")
        replica.mkdir("a", 0o755)
        assert old.children["a"].children  # the old one had entries
        old.children["a"].ino = os.stat(root / "a").st_ino
        patched = replica.rescan()
        fresh, _ = full_scan(str(root), tmp_path / "fresh.sqlite3", Excludes([]))
        assert patched.children["a"].children == {}
        assert described(patched) == described(fresh)
    finally:
        replica.close()


def test_a_file_committed_without_its_signature_loses_its_index_row(tmp_path) -> None:
    """A stamp is size, mtime and inode: a new file of the same size and mtime that got the
    old file's inode number back would pass for it and keep its root (a CI run in ten
    found one), unless the commit that does not know the signature drops the row."""
    root = tmp_path / "root"
    root.mkdir()
    replica = Replica(str(root), tmp_path / "index.sqlite3")
    try:
        for data in (b"\0" * 7 + b"\1", b"\0" * 8):
            temp = replica.fs.create_temp("b")
            temp.write(data)
            replica.commit(temp, "b", 0o644, OLD, None)
            assert replica.db.get("b") is None
            tree = replica.rescan()
            assert replica.db.get("b") is not None  # read again, and recorded
        fresh, _ = full_scan(str(root), tmp_path / "fresh.sqlite3", Excludes([]))
        assert tree.children["b"].root == fresh.children["b"].root
    finally:
        replica.close()


def test_a_row_missing_from_a_later_read_of_roots_means_a_full_scan(tmp_path,
                                                                     monkeypatch) -> None:
    """The roots of the files a rescan listed are read a few rows at a time; when a row is
    missing from a read after others were already put in the tree (the index lost it), the
    rescan scans in full, which reads that file again, and the tree is a full scan's."""
    monkeypatch.setattr(replica_module, "ROOTS_AT_ONCE", 2)
    root = tmp_path / "root"
    root.mkdir()
    replica = Replica(str(root), tmp_path / "index.sqlite3")
    try:
        replica.scan()
        names = [f"f{i}" for i in range(5)]
        for name in names:
            temp = replica.fs.create_temp(name)
            temp.write(name.encode() * 100)
            replica.commit(temp, name, 0o644, OLD, None)
        for name in names:  # (committed without a signature: rows the rescan makes)
            assert replica.db.get(name) is None
        original = replica.db.roots_of
        reads: list[list[str]] = []

        def losing_the_last(paths: list[str]) -> dict[str, bytes]:
            reads.append(paths)
            roots = original(paths)
            roots.pop(names[-1], None)
            return roots

        monkeypatch.setattr(replica.db, "roots_of", losing_the_last)
        scans: list[tuple] = []
        original_scan = replica.scan

        def scan(*args, **kwargs) -> Entry:
            scans.append(args)
            return original_scan(*args, **kwargs)

        monkeypatch.setattr(replica, "scan", scan)
        tree = replica.rescan()
        assert [len(paths) for paths in reads][:3] == [2, 2, 1]
        assert scans  # fell back to a full scan
        fresh, _ = full_scan(str(root), tmp_path / "fresh.sqlite3", Excludes([]))
        assert described(tree) == described(fresh)
    finally:
        replica.close()


def test_a_directory_listed_again_keeps_the_entries_of_its_unchanged_files(tmp_path) -> None:
    """A rescan of a directory where one file of many was written makes an entry for that
    one only: the others are the old tree's entries (stat vouches for their roots), and the
    tree is still the one a full scan builds."""
    root = tmp_path / "root"
    (root / "d").mkdir(parents=True)
    for k in range(20):
        (root / "d" / f"f{k}").write_bytes(b"x" * k)
        os.utime(root / "d" / f"f{k}", ns=(OLD, OLD))
    replica = Replica(str(root), tmp_path / "index.sqlite3")
    try:
        old = replica.scan()
        before = dict(old.children["d"].children)
        temp = replica.fs.create_temp("d/f3")
        temp.write(b"edited")
        replica.commit(temp, "d/f3", 0o644, OLD, None)
        tree = replica.rescan()
        now = tree.children["d"].children
        assert {name for name in now if now[name] is before[name]} == {
            f"f{k}" for k in range(20) if k != 3}
        assert now["f3"].size == 6 and now["f3"].root != before["f3"].root
        fresh, _ = full_scan(str(root), tmp_path / "fresh.sqlite3", Excludes([]))
        assert described(tree) == described(fresh)
    finally:
        replica.close()


entry_names = st.text(st.characters(codec="utf-8", exclude_characters="/\x00"), min_size=1,
                      max_size=8) | st.sampled_from(["n" * 130, "é" * 70])
leaf = st.one_of(
    st.builds(lambda mode, t, root: Entry("f", mode, t, 1, root),
              st.integers(0, 0o7777), st.integers(-(1 << 63), (1 << 63) - 1),
              st.binary(min_size=32, max_size=32)),
    st.builds(lambda t, target: Entry("l", 0, t, target=target),
              st.integers(-(1 << 40), 1 << 40), st.text(min_size=1, max_size=140)),
)
trees = st.recursive(
    leaf, lambda inner: st.builds(
        lambda mode, t, kids: Entry("d", mode, t, children=kids),
        st.integers(0, 0o7777), st.integers(0, 1 << 62),
        st.dictionaries(entry_names, inner, max_size=6)),
    max_leaves=30)


def spec_hashes(d: Entry) -> tuple[bytes, bytes, bytes, int]:
    """docs/formats.md section 5, read literally: (content, meta, sync meta, count)."""
    import blake3

    from rdc.content.entries import put_varint
    from rdc.params import CONTENT_CONTEXT, META_CONTEXT, SYNC_META_CONTEXT

    content, meta, smeta, count = bytearray(), bytearray(), bytearray(), 0
    for name in sorted(d.children, key=os.fsencode):
        e = d.children[name]
        raw = os.fsencode(name)
        put_varint(len(raw), content)
        content += raw + e.kind.encode()
        mode, mtime = e.mode.to_bytes(2, "little"), e.mtime_ns.to_bytes(8, "little", signed=True)
        meta += mode + mtime
        smeta += mode
        count += 1
        if e.kind == "d":
            sub = spec_hashes(e)
            content += sub[0]
            meta += sub[1]
            smeta += sub[2]
            count += sub[3]
        elif e.kind == "f":
            content += e.root
            smeta += mtime
        else:
            target = os.fsencode(e.target)
            put_varint(len(target), content)
            content += target
            smeta += mtime
    return (blake3.blake3(content, derive_key_context=CONTENT_CONTEXT).digest(),
            blake3.blake3(meta, derive_key_context=META_CONTEXT).digest(),
            blake3.blake3(smeta, derive_key_context=SYNC_META_CONTEXT).digest(), count)


@given(trees.filter(lambda e: e.kind == "d"))
def test_directory_hashes_are_those_of_the_format(tree: Entry) -> None:
    """`seal` gives every directory the content, meta and sync meta hashes (and subtree
    count) that docs/formats.md section 5 defines: names in byte order (non-ASCII and
    names of more than 127 bytes too), links with their targets, times of any sign."""
    from rdc.local.snapshot import seal

    seal(tree)
    assert (tree.content, tree.meta, tree.smeta, tree.count) == spec_hashes(tree)
