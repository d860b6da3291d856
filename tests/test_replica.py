"""The replica's quick path: root hashes reused only while stat vouches for every entry."""

from __future__ import annotations

import os
import random

from rdc.local.ignore import Excludes
from rdc.local.replica import Replica

OLD = 1_600_000_000 * 10**9


def _count_reads(monkeypatch) -> list[object]:
    """Each file an index refresh reads and signs from now on: streamed, small and read
    whole, or one of many read natively (`index_rows_of_files`)."""
    import rdc.local.index.update as update

    read: list[object] = []
    for name in ("signature_of_file", "signature_of_bytes"):
        real = getattr(update, name)
        monkeypatch.setattr(update, name,
                            lambda f, *a, real=real, **k: read.append(f) or real(f, *a, **k))
    many = update.index_rows_of_files

    def counted(files, *args, **kwargs):
        out = many(files, *args, **kwargs)
        read.extend(file for file, one in zip(files, out, strict=True) if one is not None)
        return out

    monkeypatch.setattr(update, "index_rows_of_files", counted)
    return read


def make(tmp_path, excludes=()) -> Replica:
    root = tmp_path / "root"
    (root / "d").mkdir(parents=True, exist_ok=True)
    for name, data in (("a.txt", b"alpha\n" * 100), ("d/b.txt", b"beta\n" * 100)):
        path = root / name
        if not path.exists():
            path.write_bytes(data)
            os.utime(path, ns=(OLD, OLD))
    return Replica(str(root), tmp_path / "index.sqlite3", Excludes(excludes))


def test_an_unchanged_tree_reuses_its_sealed_hashes(tmp_path) -> None:
    replica = make(tmp_path)
    tree = replica.scan()
    cached, walked = replica.quick()
    assert cached == (tree.content, tree.meta, tree.smeta)
    assert len(walked.files) == 2
    replica.close()


def test_any_change_stat_can_see_drops_them(tmp_path) -> None:
    replica = make(tmp_path)
    replica.scan()
    root = tmp_path / "root"
    changes = [
        lambda: os.utime(root / "a.txt", ns=(OLD + 1, OLD + 1)),
        lambda: os.chmod(root / "d" / "b.txt", 0o600),
        lambda: ((root / "d" / "new").write_bytes(b"x"),
                 os.utime(root / "d" / "new", ns=(OLD, OLD))),  # (not racy)
        lambda: os.remove(root / "d" / "new"),
        lambda: os.symlink("a.txt", root / "link"),
        lambda: os.rename(root / "link", root / "link2"),
    ]
    for change in changes:
        change()
        cached, walked = replica.quick()
        assert cached is None
        tree = replica.scan(walked=walked)
        assert replica.quick()[0] == (tree.content, tree.meta, tree.smeta)
    replica.close()


def test_a_new_replica_of_an_unchanged_tree_builds_it_without_a_refresh(
        tmp_path, monkeypatch) -> None:
    """A daemon's next session (or a new client process) opens the replica anew: when the
    walk is the one last sealed, the tree comes from the index's roots, not a refresh."""
    first = make(tmp_path)
    tree = first.scan()
    first.close()
    again = make(tmp_path)
    cached, walked = again.quick()
    assert cached == (tree.content, tree.meta, tree.smeta)

    def no_refresh(*args, **kwargs):
        raise AssertionError("refreshed an index the walk vouched for")

    monkeypatch.setattr("rdc.local.replica.refresh", no_refresh)
    rebuilt = again.scan(walked=walked)
    assert (rebuilt.content, rebuilt.meta, rebuilt.smeta) == cached
    assert rebuilt.children["d"].children["b.txt"].root == tree.children["d"].children[
        "b.txt"].root
    assert again.stats.files == 2 and again.stats.signed == 0
    again.close()


def test_sealed_hashes_that_do_not_add_up_are_dropped_and_the_tree_refreshed(
        tmp_path) -> None:
    """Defence in depth: if the cached hashes of a walk disagree with the tree its rows
    seal to, they are forgotten and the index refreshed in full."""
    first = make(tmp_path)
    tree = first.scan()
    cached, walked = first.quick()
    with first.lock, first.db.transaction():
        first.db.cache_hashes(walked.fingerprint, (b"\1" * 32, tree.meta, tree.smeta))
    first.close()
    again = make(tmp_path)
    cached, walked = again.quick()
    assert cached is not None and cached[0] == b"\1" * 32
    rebuilt = again.scan(walked=walked)
    assert rebuilt.content == tree.content
    assert again.quick()[0] == (tree.content, tree.meta, tree.smeta)
    again.close()


def test_an_unchanged_tree_is_vouched_for_without_a_python_walk(tmp_path, monkeypatch) -> None:
    """The quick path's stamp is walked in C: the tree is walked in Python only when its
    entries are asked for (or when something changed)."""
    replica = make(tmp_path)
    tree = replica.scan()
    replica.close()
    again = make(tmp_path)
    walks = []
    real_walk = again.walk

    def counted(*args, **kwargs):
        walks.append(1)
        return real_walk(*args, **kwargs)

    monkeypatch.setattr(again, "walk", counted)
    cached, walked = again.quick()
    assert cached == (tree.content, tree.meta, tree.smeta)
    assert not walks
    assert walked.file_count == 2 and walked.top == (tree.mode, tree.mtime_ns)
    assert sorted(walked.files) == ["a.txt", "d/b.txt"] and len(walks) == 1
    os.utime(tmp_path / "root" / "a.txt", ns=(OLD + 5, OLD + 5))
    cached, walked = again.quick()  # changed: no hashes, and still no walk in Python
    assert cached is None and walked.pending and walked.dirs is not None
    tree = again.scan(walked=walked)  # from the tree kept in the index
    assert len(walks) == 1 and tree.children["a.txt"].mtime_ns == OLD + 5
    again.close()


def test_excludes_and_temporaries_take_the_python_walk(tmp_path) -> None:
    replica = make(tmp_path, excludes=["*.log"])
    replica.scan()
    cached, walked = replica.quick()
    assert cached is not None and walked._tree is not None  # walked in Python
    replica.close()
    plain = make(tmp_path / "other")
    plain.scan()
    temp = tmp_path / "other" / "root" / ".rdc-tmp-0123456789abcdef-a.txt"
    temp.write_bytes(b"partial")
    cached, walked = plain.quick()
    assert walked.temporaries == [temp.name] and walked._tree is not None
    plain.close()


def test_other_excludes_are_another_tree(tmp_path) -> None:
    replica = make(tmp_path)
    replica.scan()
    other = Replica(replica.root, tmp_path / "index.sqlite3", Excludes(["d/"]))
    assert other.quick()[0] is None
    replica.close()
    other.close()


def test_a_racy_file_is_never_vouched_for(tmp_path) -> None:
    """A file modified within the racy window could change again within its mtime tick:
    its stat cannot vouch for its content, so nothing is cached."""
    replica = make(tmp_path)
    (tmp_path / "root" / "a.txt").write_bytes(b"just written\n")  # mtime: now
    replica.scan()
    assert replica.quick()[0] is None
    replica.close()


def test_temporaries_are_seen_but_not_part_of_the_tree(tmp_path) -> None:
    replica = make(tmp_path)
    (tmp_path / "root" / "d" / ".rdc-tmp-0123456789abcdef-x").write_bytes(b"in flight")
    tree = replica.scan()
    assert replica.temporaries == ["d/.rdc-tmp-0123456789abcdef-x"]
    assert sorted(tree.children["d"].children) == ["b.txt"]
    replica.close()


def test_times_rdc_sets_keep_index_rows_current_unless_the_file_changed(tmp_path) -> None:
    replica = make(tmp_path)
    replica.scan()
    root = tmp_path / "root"
    replica.set_meta("a.txt", mtime_ns=OLD + 5)  # one at a time: its own transaction
    retimed: list = []
    replica.set_meta("d", mtime_ns=OLD + 6, retimed=retimed)  # a directory: nothing to record
    replica.set_meta("d/b.txt", mtime_ns=OLD + 7, retimed=retimed)
    assert [path for path, _, _ in retimed] == ["d/b.txt"]
    replica.record_times(retimed)
    assert os.stat(root / "a.txt").st_mtime_ns == OLD + 5
    assert os.stat(root / "d/b.txt").st_mtime_ns == OLD + 7
    replica.scan()
    assert replica.stats.signed == 0 and replica.stats.unchanged == 2

    (root / "a.txt").write_bytes(b"changed behind the index's back\n")
    replica.set_meta("a.txt", mtime_ns=OLD + 8)  # its row no longer describes it: not made current
    replica.scan()
    assert replica.stats.signed == 1
    replica.close()


def test_many_directories_written_into_are_made_durable_by_one_syncfs(
    tmp_path, monkeypatch
) -> None:
    """sync_dirs fsyncs each directory renamed or made into when there are a few, and
    syncs the whole file system once when there are many."""
    from rdc.local import fs as fs_module
    from rdc.local import replica as replica_module

    replica = make(tmp_path)
    replica.scan()
    fsynced: list[int] = []
    synced_fs: list[int] = []
    monkeypatch.setattr(replica_module.os, "fsync", lambda fd: fsynced.append(fd))
    monkeypatch.setattr(fs_module.os, "fsync", lambda fd: fsynced.append(fd))
    monkeypatch.setattr(replica_module, "sync_filesystem",
                        lambda root: synced_fs.append(1) or True)
    for count, expect_fsyncs, expect_syncfs in ((3, 3, 0), (40, 0, 1)):
        for i in range(count):
            replica.mkdir(f"n{count}-{i}", 0o755)
        replica.sync_dirs()
        fsynced.clear()
        synced_fs.clear()
        for i in range(count):  # one new directory in each: as many to sync
            replica.mkdir(f"n{count}-{i}/sub", 0o755)
        replica.sync_dirs()
        assert (len(fsynced), len(synced_fs)) == (expect_fsyncs, expect_syncfs)
    replica.close()


def test_a_row_another_replica_deletes_meanwhile_is_no_seed_and_no_crash(tmp_path) -> None:
    """The daemon keeps a replaced directory's old replica for its current users while a
    new one serves the same path: two connections to one index, each with its own lock.
    A row the other deletes between two statements of a lookup is skipped as a seed and
    signed afresh by `sign` (found by fuzzing: a TypeError in the index, an internal
    error for the connection)."""
    import pytest

    from rdc.content.tree import TreeFormatError

    root = tmp_path / "root"
    root.mkdir()
    (root / "a.bin").write_bytes(os.urandom(50_000))
    index = tmp_path / "index.sqlite3"
    old, new = Replica(str(root), index), Replica(str(root), index)
    old.scan()
    row = old.db.get("a.bin")
    assert row is not None
    real_get, real_get_many = old.db.get, old.db.get_many

    def lose() -> None:
        with new.lock, new.db.transaction():
            new.db.delete_tree("a.bin")  # the other replica, between two statements

    def get_then_lose(path):
        found = real_get(path)
        lose()
        return found

    def get_many_then_lose(paths):
        found = real_get_many(paths)
        lose()
        return found

    old.db.get = get_then_lose  # type: ignore[method-assign]
    old.db.get_many = get_many_then_lose  # type: ignore[method-assign]
    assert old.seed_trees("a.bin", None) == []
    with pytest.raises(TreeFormatError, match="no longer in the index"):
        new.db.tree(row.id)
    # sign: its lookup loses the row again (get_then_lose), so it reads the file afresh
    signature, _, f = old.sign("a.bin")
    f.close()
    assert signature.root == row.root
    old.close()
    new.close()


def test_a_moved_file_keeps_its_index_row_and_is_not_read_again(tmp_path, monkeypatch) -> None:
    """`Replica.move` carries a current row to the new path (the rescan reads nothing);
    a row that no longer describes the file goes, so the next scan reads it."""
    replica = make(tmp_path)
    replica.scan()
    before = replica.indexed(["a.txt"])["a.txt"]
    replica.move("a.txt", "d/moved.txt")
    rows = replica.indexed(["a.txt", "d/moved.txt"])
    assert "a.txt" not in rows and rows["d/moved.txt"].root == before.root
    assert rows["d/moved.txt"].id == before.id
    read = _count_reads(monkeypatch)
    tree = replica.rescan()
    assert "a.txt" not in tree.children and "moved.txt" in tree.children["d"].children
    assert tree.children["d"].children["moved.txt"].root == before.root
    assert read == []

    root = tmp_path / "root"
    (root / "d" / "b.txt").write_bytes(b"changed behind the index\n")
    os.utime(root / "d" / "b.txt", ns=(OLD, OLD))
    replica.move("d/b.txt", "b.txt")
    assert "b.txt" not in replica.indexed(["b.txt"])
    assert replica.scan().children["b.txt"].size == len(b"changed behind the index\n")
    assert len(read) == 1  # that one file, read again
    replica.close()


def test_a_small_file_changed_while_a_scan_reads_it_is_read_again(tmp_path, monkeypatch
                                                                  ) -> None:
    """A scan reads small files whole (`SafeRoot.read_whole`) and signs the bytes read;
    one written to between its fstat and the end of the read is marked racy, so the next
    scan reads it again and the index ends with what is on disk."""
    import rdc.local.fs as fs
    from rdc import _native

    monkeypatch.setattr(_native, "sign_files", None)  # (the native read: see test_index)
    replica = make(tmp_path)
    path = tmp_path / "root" / "a.txt"
    real = fs.os.read
    changed: list[bool] = []

    def read_then_append(fd: int, n: int) -> bytes:
        data = real(fd, n)
        if not changed and os.path.samestat(os.fstat(fd), os.stat(path)):
            changed.append(True)
            with open(path, "ab") as out:
                out.write(b"written while it was read\n")
            os.utime(path, ns=(OLD, OLD))  # even with its old time: the ctime moved
        return data

    monkeypatch.setattr(fs.os, "read", read_then_append)
    replica.scan()
    assert changed and replica.indexed(["a.txt"])["a.txt"].racy
    monkeypatch.setattr(fs.os, "read", real)
    tree = replica.scan()
    assert tree.children["a.txt"].size == path.stat().st_size
    row = replica.indexed(["a.txt"])["a.txt"]
    assert row.size == path.stat().st_size and not row.racy
    replica.close()


def test_small_files_read_many_at_once_are_what_reading_each_alone_gives(
        tmp_path, monkeypatch) -> None:
    """`sign_small_many` (a batch's offers: read and signed in one native call) gives what
    `sign_small` gives for each file, and records the same rows: a file without a row, one
    its row describes, one its row describes but whose bytes are not the row's (suspect:
    bit rot), one rewritten since its row. What it cannot read in bulk (a symlink, a file
    over the limit, a path below a file, one through a symlinked directory, a path rdc
    refuses) is None, left to `sign_small`."""
    from rdc import _native
    from rdc.local.fs import HeldDirs

    from .test_sign_native import _sign

    monkeypatch.setattr(_native, "sign_files", _sign.sign_files)  # (also in the pure run)
    results, rows = [], []
    for many in (True, False):
        root = tmp_path / f"root-{many}"
        for d in range(3):
            (root / f"d{d}").mkdir(parents=True)
            for i in range(4):
                (root / f"d{d}" / f"f{i}").write_bytes(b"content %d %d\n" % (d, i) * (i + 1))
                os.utime(root / f"d{d}" / f"f{i}", ns=(OLD, OLD))
        replica = Replica(str(root), tmp_path / f"index-{many}.sqlite3")
        replica.scan()
        rotten = root / "d1" / "f2"  # same size and time: the row still describes it
        rotten.write_bytes(rotten.read_bytes().replace(b"1", b"7"))
        os.utime(rotten, ns=(OLD, OLD))
        (root / "d2" / "f0").write_bytes(b"rewritten")  # (the row does not describe it)
        (root / "d0" / "new").write_bytes(b"no row yet\n")
        (root / "d0" / "link").symlink_to("f0")
        (root / "d0" / "big").write_bytes(b"b" * 5000)
        for name in ("d2/f0", "d0/new", "d0/big"):
            os.utime(root / name, ns=(OLD + 7, OLD + 7))
        paths = sorted(f"d{d}/{p.name}" for d in range(3) for p in (root / f"d{d}").iterdir())
        (root / "via").symlink_to("d1")  # (a directory reached through a link: not read)
        refused = ["../d0/f0", "d0//f0", "d0/", "/d0/f0"]  # (a peer's paths, not rdc's)
        paths += ["d0/f0/below", "via/f0", *refused]
        indexed = replica.indexed([p for p in paths if p not in refused])
        bulk_leaves = ("d0/big", "d0/link", "d0/f0/below", "via/f0", *refused)
        with replica.recording_together(), HeldDirs(replica.fs) as held:
            if many:
                got = replica.sign_small_many(paths, indexed, 4096)
                assert [one is None for one in got] == [p in bulk_leaves for p in paths]
            else:
                got = [None if p in bulk_leaves
                       else replica.sign_small(p, indexed.get(p), 4096, held) for p in paths]
        results.append([None if one is None else
                        (one[0], (one[1].st_mode, one[1].st_size, one[1].st_mtime_ns,
                                  one[1].st_ino != 0), one[2], one[3]) for one in got])
        assert [p for p, one in zip(paths, got, strict=True)
                if one is not None and one[3]] == ["d1/f2"]
        rows.append({f.path: (f.size, f.mtime_ns, f.mode, f.root, f.sketch, f.racy)
                     for f in replica.db.files()})
        replica.close()
    assert results[0] == results[1]
    assert rows[0] == rows[1] and "d0/new" in rows[0]


def test_a_large_rebuilt_file_signs_on_a_thread_of_its_own_to_the_same_root(
    tmp_path, monkeypatch
) -> None:
    """Past SIGN_APART bytes a temporary is signed on a thread beside its writes; the
    signature is that of the bytes written, also where the leaf ends were given (a
    delta's), and an abandoned one stops its thread."""
    import threading
    from itertools import accumulate

    from rdc.content.signature import signature_of_bytes
    from rdc.content.stream import SigningThread
    from rdc.transfer import target

    monkeypatch.setattr(target, "SIGN_APART", 50_000)
    replica = make(tmp_path)
    data = random.Random(3).randbytes(300_000)
    expected = signature_of_bytes(data)
    kept = target._Assembly(replica, "big.bin")
    known = target._Assembly(replica, "known.bin")
    known.expect_ends(list(accumulate(expected.tree.leaves.lengths)))
    dropped = target._Assembly(replica, "other.bin")
    try:
        for at in range(0, len(data), 7_000):
            piece = bytearray(data[at : at + 7_000])
            kept.write(piece)
            known.write(piece)
            dropped.write(memoryview(piece))
            known.expect_ends([len(data)])  # (too late: ignored once bytes are written)
            piece[:] = bytes(len(piece))
        assert isinstance(kept.signer, SigningThread)
        dropped.abort()
        assert kept.signer.finish() == expected
        assert known.signer.finish() == expected
    finally:
        kept.abort()
        known.abort()
        replica.close()
    assert not [t for t in threading.enumerate() if t.name == "rdc-sign"]


def test_a_batch_of_seed_look_ups_finds_what_one_look_up_each_finds(tmp_path) -> None:
    """`seed_trees_many` (a batch's seeds, at once) gives each (path, sketch) the seeds the
    look-ups one at a time give: the file at the path if indexed, then the files whose
    sketches resemble it, best first, without the file itself; a row whose tree does not
    parse is no seed, and paths without a row or sketch look only where they can."""
    from rdc.content.tree import TreeFormatError
    from rdc.local.index.db import CANDIDATE_LIMIT

    rng = random.Random(5)
    root = tmp_path / "root"
    (root / "d").mkdir(parents=True)
    bases = [rng.randbytes(40_000) for _ in range(4)]
    for i in range(40):  # ten variants of each of four files: each resembles its kin
        data = bytearray(bases[i % 4])
        at = rng.randrange(len(data) - 64)
        data[at : at + 64] = rng.randbytes(64)
        (root / "d" / f"f{i}.bin").write_bytes(bytes(data))
    replica = Replica(str(root), tmp_path / "index.sqlite3")
    replica.scan()
    db = replica.db
    broken = db.get("d/f5.bin")
    assert broken is not None
    with replica.lock, db.transaction():
        db.conn.execute("UPDATE file SET tree = ? WHERE id = ?", (b"not a tree", broken.id))

    def one_at_a_time(path, sketch):
        rows = [db.get(path)] if path is not None else []
        rows = [row for row in rows if row is not None]
        if sketch is not None:
            exclude = rows[0].id if rows else None
            rows += [db.by_id(i) for i, _ in db.candidates(
                sketch, db.seed_threshold(), CANDIDATE_LIMIT, exclude=exclude)]
        out = []
        for row in rows:
            try:
                out.append((row.path, db.tree(row.id)))
            except TreeFormatError:
                continue
        return out

    kin = db.get("d/f2.bin").sketch  # asked for with no path
    wanted = [(f"d/f{i}.bin", db.get(f"d/f{i}.bin").sketch) for i in range(0, 40, 3)]
    wanted += [("d/f5.bin", db.get("d/f5.bin").sketch), ("d/new.bin", None), (None, None),
               (None, kin), ("d/f7.bin", None)]
    got = replica.seed_trees_many(wanted)
    assert got == [one_at_a_time(path, sketch) for path, sketch in wanted]
    assert all(len(seeds) > 1 for seeds in got[:14])  # (kin found, for the case to count)
    assert "d/f5.bin" not in {path for seeds in got for path, _ in seeds}
    assert got[-4:-2] == [[], []] and got[-2]
    assert all(int(path[3:-4]) % 4 == 2 for path, _ in got[-2])  # f2's kin
    replica.close()


def test_a_file_signed_just_after_a_write_stays_racy_in_the_index(tmp_path) -> None:
    """A file read by `sign` or `sign_small` (a source offering it) within 2 s of its last
    write is racy in the index, as a scan's row of it would be: a later write in the same
    mtime tick must not be trusted away. One written long ago is not."""
    replica = make(tmp_path)
    try:
        now = tmp_path / "root" / "now.txt"
        now.write_bytes(b"just written\n")
        old = tmp_path / "root" / "d" / "b.txt"
        os.utime(old, ns=(OLD, OLD))
        replica.sign("now.txt")[2].close()
        with replica.recording_together():
            replica.sign_small("d/b.txt", None, 1 << 16)
        rows = replica.indexed(["now.txt", "d/b.txt"])
        assert rows["now.txt"].racy and not rows["d/b.txt"].racy
    finally:
        replica.close()
