"""Index refresh: only changed files are read; renames, deletions, racy writes, kills and
corruption are handled."""

from __future__ import annotations

import contextlib
import errno
import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from rdc.content.signature import signature_of_path
from rdc.local.index import IndexDatabase, refresh, row_of
from rdc.local.index.db import SCHEMA_VERSION, WAL_PAGES
from rdc.params import DEFAULT_SIGNATURE, GroupParams, SignatureParams

from .conftest import scaled

OLD_NS = 1_600_000_000 * 10**9  # long ago: not racy


def make_tree(root, count: int = 20, size: int = 30_000, seed: int = 1) -> dict[str, bytes]:
    rng = random.Random(seed)
    files = {}
    for i in range(count):
        rel = f"d{i % 3}/file{i}.bin"
        data = rng.randbytes(rng.randrange(size // 2, size))
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        os.utime(path, ns=(OLD_NS, OLD_NS + i))
        files[rel] = data
    return files


def contents(db: IndexDatabase) -> dict[str, bytes]:
    return {f.path: f.root for f in db.files()}


def expected(root) -> dict[str, bytes]:
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            full = os.path.join(dirpath, name)
            out[os.path.relpath(full, root)] = signature_of_path(full).root
    return out


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "data"
    make_tree(root)
    db = IndexDatabase(tmp_path / "index.sqlite3")
    yield root, db
    db.close()


def test_first_refresh_signs_everything_and_second_reads_nothing(tree) -> None:
    root, db = tree
    stats = refresh(db, str(root))
    assert (stats.files, stats.signed, stats.unchanged) == (20, 20, 0)
    assert contents(db) == expected(root)
    stats = refresh(db, str(root))
    assert (stats.signed, stats.unchanged) == (0, 20)


def test_modify_touch_rename_delete_and_replace(tree) -> None:
    root, db = tree
    refresh(db, str(root))
    (root / "d0/file0.bin").write_bytes(b"new content")
    os.utime(root / "d0/file0.bin", ns=(OLD_NS, OLD_NS + 100))
    os.utime(root / "d1/file1.bin", ns=(OLD_NS, OLD_NS + 101))  # touched only
    os.rename(root / "d2/file2.bin", root / "d0/renamed.bin")
    os.unlink(root / "d0/file3.bin")
    # replaced by a different file of the same size and mtime: a new inode tells
    same = (root / "d1/file4.bin").stat()
    (root / "tmp").write_bytes(os.urandom(same.st_size))
    os.utime(root / "tmp", ns=(same.st_atime_ns, same.st_mtime_ns))
    os.replace(root / "tmp", root / "d1/file4.bin")
    stats = refresh(db, str(root))
    assert stats.deleted == 2  # the renamed file's old path too
    assert stats.signed == 4  # modified, touched, renamed (read at its new path), replaced
    assert contents(db) == expected(root)


def test_a_new_file_on_a_freed_inode_with_the_same_size_and_time_is_read(tree) -> None:
    """A file deleted and another made (ext4 gives it the freed inode), of the same size and
    modification time (a copy that keeps times: `cp -a`, `rsync -a`, an archive unpacked):
    the new path is read, not taken for the old file renamed. Taken for a rename it kept
    the old file's signature, and a push sent the old content under the new name."""
    root, db = tree
    refresh(db, str(root))
    old, new = root / "d2/file5.bin", root / "d2/other.bin"
    before = old.stat()
    os.unlink(old)
    for _ in range(50):  # (ext4 reuses it at once, or once a reader closed it; others may not)
        new.write_bytes(os.urandom(before.st_size))
        os.utime(new, ns=(before.st_atime_ns, before.st_mtime_ns))
        if new.stat().st_ino == before.st_ino:
            break
        new.unlink()
        time.sleep(0.01)
    else:
        pytest.skip("this file system did not reuse the freed inode")
    stats = refresh(db, str(root))
    assert stats.signed == 1
    assert contents(db) == expected(root)


def test_a_new_path_whose_lstat_names_a_vanished_files_inode_is_never_its_signature(
        tree) -> None:
    """The same as the test above whatever the file system does with inodes: the walk's
    lstat of the new path is made to carry the vanished file's inode, size and time. The
    new path gets no row but of its own bytes (here none: its real inode differs from the
    walk's, so it changed while read)."""
    from rdc.local.filestat import Seen
    from rdc.local.index.update import walk_files

    root, db = tree
    refresh(db, str(root))
    old, new = root / "d2/file5.bin", root / "d2/other.bin"
    before = old.stat()
    old.unlink()
    new.write_bytes(os.urandom(before.st_size))
    os.utime(new, ns=(before.st_atime_ns, before.st_mtime_ns))
    files = dict(walk_files(str(root)))
    files["d2/other.bin"] = Seen(before.st_mode, before.st_size, before.st_mtime_ns,
                                 before.st_ino)
    refresh(db, str(root), files=files)
    row = db.get("d2/other.bin")
    assert row is None or row.root == signature_of_path(str(new)).root
    assert db.get("d2/file5.bin") is None


def test_racy_files_are_read_again(tree) -> None:
    root, db = tree
    path = root / "d0/file6.bin"
    path.write_bytes(b"A" * 1000)  # mtime now: racy
    refresh(db, str(root))
    assert db.get("d0/file6.bin").racy
    st = path.stat()
    path.write_bytes(b"B" * 1000)  # same size, and the same mtime again
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    refresh(db, str(root))
    assert db.get("d0/file6.bin").root == signature_of_path(str(path)).root


def test_symlinks_and_special_files_are_not_indexed(tree) -> None:
    root, db = tree
    os.symlink("/etc/passwd", root / "link")
    os.mkfifo(root / "fifo")
    refresh(db, str(root))
    assert "link" not in contents(db) and "fifo" not in contents(db)


def test_unreadable_files_are_reported_not_fatal(tree, monkeypatch) -> None:
    root, db = tree
    import rdc.local.index.update as module

    real = module._sign

    def sign(opener, rel):
        if rel.endswith("file0.bin"):
            raise PermissionError(13, "Permission denied", rel)
        return real(opener, rel)

    monkeypatch.setattr(module, "_sign", sign)
    stats = refresh(db, str(root))
    assert stats.errors == [("d0/file0.bin", "Permission denied")]
    assert stats.signed == 19 and "d0/file0.bin" not in contents(db)


def built_index(tmp_path, count: int):
    """A tree of ``count`` files and the location of its index, refreshed and closed."""
    root = tmp_path / "data"
    make_tree(root, count=count)
    location = tmp_path / "index.sqlite3"
    db = IndexDatabase(location)
    refresh(db, str(root))
    db.close()
    return root, location


def test_corrupt_index_is_rebuilt(tmp_path) -> None:
    root, location = built_index(tmp_path, 5)
    with open(location, "r+b") as f:
        f.seek(0)
        f.write(b"this is not a database" * 50)
    db = IndexDatabase(location)
    refresh(db, str(root))
    assert contents(db) == expected(root)
    db.close()


def test_index_of_other_parameters_is_rebuilt(tmp_path) -> None:
    _, location = built_index(tmp_path, 3)
    other = SignatureParams(groups=GroupParams(3, 9))
    db = IndexDatabase(location, other)
    assert db.count() == 0
    db.close()
    db = IndexDatabase(location, DEFAULT_SIGNATURE)
    assert db.count() == 0
    db.close()


def _writers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("index-writer")]


def test_a_refresh_signs_on_while_its_rows_are_stored(tmp_path, monkeypatch) -> None:
    """A refresh's rows go in on a thread of their own: while a transaction of them is
    stored (held here until the refresh has recorded a file past it), the refreshing
    thread goes on; every row is in the index when it returns."""
    import rdc.local.index.update as update

    root = tmp_path / "data"
    make_tree(root, count=24, size=2_000)
    monkeypatch.setattr(update, "BATCH_FILES", 4)
    past_it = threading.Event()
    store = IndexDatabase.put_rows

    def held(self, rows) -> None:
        if not past_it.is_set():
            assert past_it.wait(10), "the refresh waited for its first rows to be stored"
        store(self, rows)

    def progress(event) -> None:
        if event.files_done > 4:
            past_it.set()

    monkeypatch.setattr(IndexDatabase, "put_rows", held)
    db = IndexDatabase(tmp_path / "index.sqlite3")
    stats = refresh(db, str(root), workers=1, progress=progress)
    assert stats.signed == 24 and contents(db) == expected(root)
    assert not _writers()
    db.close()


def test_a_refresh_fails_with_the_error_that_stored_its_rows(tmp_path, monkeypatch) -> None:
    root = tmp_path / "data"
    make_tree(root, count=12, size=2_000)

    def failing(self, rows) -> None:
        raise OSError(errno.EIO, "the disk failed")

    monkeypatch.setattr("rdc.local.index.update.BATCH_FILES", 4)
    monkeypatch.setattr(IndexDatabase, "put_rows", failing)
    db = IndexDatabase(tmp_path / "index.sqlite3")
    with pytest.raises(OSError, match="the disk failed"):
        refresh(db, str(root), workers=1)
    assert db.count() == 0 and not _writers()
    db.close()


def test_killed_refresh_is_completed_by_the_next(tmp_path) -> None:
    root = tmp_path / "data"
    make_tree(root, count=120, size=scaled(400_000, 40_000), seed=3)
    location = tmp_path / "index.sqlite3"
    script = textwrap.dedent(f"""
        import sys
        import rdc.local.index.update as r
        from rdc.local.index import IndexDatabase
        r.BATCH_FILES = 3
        db = IndexDatabase({str(location)!r})
        def progress(event):
            print(event.files_done, flush=True)
        r.refresh(db, {str(root)!r}, workers=1, progress=progress)
        print("finished", flush=True)
    """)
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        for line in child.stdout:
            if line.strip() == "finished":
                pytest.fail("the refresh finished before it could be killed")
            if int(line) >= 20:
                child.send_signal(signal.SIGKILL)
                break
    finally:
        child.wait(timeout=60)
    db = IndexDatabase(location)
    partial = db.count()
    assert 0 < partial < 120
    stats = refresh(db, str(root))
    assert stats.signed == 120 - partial
    assert contents(db) == expected(root)
    db.close()


def test_files_changing_while_read_are_marked_racy(tree, monkeypatch) -> None:
    root, db = tree
    import rdc.local.index.update as module

    real = module.signature_of_file

    def sign_and_change(f, *args, **kwargs):
        result = real(f, *args, **kwargs)
        with open(f.name, "ab") as out:
            out.write(b"appended while reading")
        return result

    monkeypatch.setattr(module, "signature_of_file", sign_and_change)
    refresh(db, str(root), workers=1)
    assert all(f.racy for f in db.files())
    monkeypatch.setattr(module, "signature_of_file", real)
    time.sleep(0)  # next refresh reads them all again and now they are stable
    stats = refresh(db, str(root))
    assert stats.signed == 20
    assert contents(db) == expected(root)


def test_small_files_signed_here_and_large_ones_on_the_pool_agree(tmp_path, monkeypatch) -> None:
    import rdc.local.index.update as module

    monkeypatch.setattr(module, "INLINE_BYTES", 30_000)
    root = tmp_path / "data"
    make_tree(root, count=40, size=40_000, seed=5)
    sizes = {rel: os.path.getsize(root / rel) for rel in expected(root)}
    assert 10 < sum(size < 30_000 for size in sizes.values()) < 30  # both ways, many each
    refused = {min(sizes, key=sizes.get), max(sizes, key=sizes.get)}  # one on each path

    def opener(rel: str):
        if rel in refused:
            raise PermissionError(13, "Permission denied", rel)
        return open(root / rel, "rb")

    db = IndexDatabase(tmp_path / "index.sqlite3")
    events = []
    stats = refresh(db, str(root), progress=events.append, opener=opener)
    assert sorted(path for path, _ in stats.errors) == sorted(refused)
    assert stats.signed == 38 and set(contents(db)) == set(sizes) - refused
    assert [e.files_done for e in events] == list(range(1, 39))
    assert events[-1].bytes_done == sum(sizes[path] for path in contents(db))
    assert contents(db).items() <= expected(root).items()
    db.close()


def _rows(db: IndexDatabase) -> dict[str, tuple]:
    return {f.path: (f.size, f.mtime_ns, f.inode, f.mode, f.root, f.sketch, f.racy)
            for f in db.files()}


@pytest.mark.parametrize(("workers", "openat2"), [(1, True), (2, True), (2, False)])
def test_small_files_read_in_bulk_are_indexed_as_read_one_by_one(tmp_path, monkeypatch,
                                                                 workers: int,
                                                                 openat2: bool) -> None:
    """With the root's descriptor (and native code), small files are read and signed many
    at a time off this thread, their directories opened natively below it (with openat2,
    or one component at a time); the rows are those of reading them one by one. What the
    bulk read leaves goes the one-file way and fails as it would there: a file that became
    a symlink after the walk, and the files of a directory that became a symlink to a
    directory (not followed)."""
    import rdc.local.index.update as module
    from rdc import _native

    from .test_sign_native import _sign

    monkeypatch.setattr(_native, "sign_files", _sign.sign_files)  # (also in the pure run)
    monkeypatch.setattr(module, "INLINE_BYTES", 30_000)
    monkeypatch.setattr(module, "BULK_FILES", 7)  # several groups, in flight together
    root = tmp_path / "data"
    make_tree(root, count=60, size=40_000, seed=8)
    walked = dict(module.walk_files(str(root)))
    os.unlink(root / "d0/file3.bin")
    os.symlink("file0.bin", root / "d0/file3.bin")
    refused_dir = "d2"
    os.rename(root / refused_dir, root / "elsewhere")
    os.symlink("elsewhere", root / refused_dir)

    def opener(rel: str):
        if rel.startswith(refused_dir + "/"):
            raise PermissionError(13, "Permission denied", rel)
        if os.path.islink(root / rel):
            raise OSError(40, "Too many levels of symbolic links", rel)
        return open(root / rel, "rb")

    bulk_calls: list[int] = []
    many = module.index_rows_of_files
    monkeypatch.setattr(module, "index_rows_of_files",
                        lambda files, *a, **k: bulk_calls.append(len(files)) or many(files, *a,
                                                                                        **k))
    top = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    _sign.use_openat2(openat2)
    results = []
    events: list = []
    try:
        for beneath in (top, None):
            db = IndexDatabase(tmp_path / f"index-{beneath is None}.sqlite3")
            events.clear()
            stats = refresh(db, str(root), files=walked, opener=opener, beneath=beneath,
                            workers=workers, progress=events.append)
            results.append((sorted(stats.errors), stats.signed, _rows(db)))
            db.close()
            # An event a group or a file, counting up to every file signed.
            done = [event.files_done for event in events]
            assert done == sorted(set(done)) and done[-1] == stats.signed
            assert events[-1].bytes_done == sum(size for size, *_ in results[-1][2].values())
    finally:
        _sign.use_openat2(True)
        os.close(top)
    (bulk_errors, bulk_signed, bulk_rows), (one_errors, one_signed, one_rows) = results
    assert bulk_calls and max(bulk_calls) == 7
    assert bulk_errors == one_errors and {path for path, _ in one_errors} == (
        {"d0/file3.bin"} | {rel for rel in walked if rel.startswith("d2/")})
    assert bulk_signed == one_signed and bulk_rows == one_rows
    assert sum(size < 30_000 for size, *_ in one_rows.values()) > 15  # the bulk path, many


def test_a_small_file_whose_stamp_moved_during_its_bulk_read_is_racy(tmp_path,
                                                                      monkeypatch) -> None:
    """A file the native read finds racy (its fstat after the read differs from the one
    before: written to meanwhile, `test_sign_native`) gets a racy row, read again by the
    next refresh."""
    import rdc.local.index.update as module
    from rdc import _native

    from .test_sign_native import _sign

    monkeypatch.setattr(_native, "sign_files", _sign.sign_files)
    root = tmp_path / "data"
    make_tree(root, count=6, size=3000)
    many = module.index_rows_of_files

    def moved_under_the_read(files, *args, **kwargs):
        out = many(files, *args, **kwargs)
        return [(*out[0][:-1], 1), *out[1:]]

    monkeypatch.setattr(module, "index_rows_of_files", moved_under_the_read)
    db = IndexDatabase(tmp_path / "index.sqlite3")
    top = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        refresh(db, str(root), beneath=top)
        assert sum(f.racy for f in db.files()) == 1
        monkeypatch.setattr(module, "index_rows_of_files", many)
        assert refresh(db, str(root), beneath=top).signed == 1  # that one, read again
    finally:
        os.close(top)
    assert not any(f.racy for f in db.files()) and contents(db) == expected(root)
    db.close()


def open_at_once(location, count: int) -> tuple[list[IndexDatabase], list[BaseException]]:
    """``count`` threads open the index at ``location`` at the same moment."""
    start = threading.Barrier(count)
    opened: list[IndexDatabase] = []
    failures: list[BaseException] = []

    def open_one() -> None:
        start.wait()
        try:
            opened.append(IndexDatabase(location))
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return opened, failures


def test_indexes_opened_at_once_are_made_once(tmp_path) -> None:
    """Connections that open a new index at the same moment (the daemon's clients, two
    commands on one directory) all get the same schema and parameters, none an error."""
    for attempt in range(scaled(30, 10)):
        opened, failures = open_at_once(tmp_path / f"index{attempt}.sqlite3", 6)
        assert failures == []
        assert len(opened) == 6
        for db in opened:
            assert db.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
            assert db.count() == 0
            db.close()


@contextlib.contextmanager
def locked(location, how: str) -> Iterator[None]:
    """Another connection holds the index at ``location`` (``BEGIN <how>``)."""
    holder = sqlite3.connect(location, isolation_level=None)
    holder.execute(f"BEGIN {how}")
    try:
        yield
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_a_locked_index_is_an_error_not_a_rebuild(tmp_path) -> None:
    """Another process writing the index for too long is no reason to delete it."""
    root, location = built_index(tmp_path, 4)
    with locked(location, "EXCLUSIVE"), pytest.raises(sqlite3.OperationalError, match="locked"):
        IndexDatabase(location, busy_timeout=0.05)
    db = IndexDatabase(location, busy_timeout=0.05)
    (root / "d0" / "new.bin").write_bytes(b"new" * 1000)
    with locked(location, "IMMEDIATE"), pytest.raises(sqlite3.OperationalError, match="locked"):
        refresh(db, str(root))
    assert len(contents(db)) == 4  # what was indexed before is still there
    refresh(db, str(root))
    assert contents(db) == expected(root)
    db.close()


def test_files_with_one_content_are_found_by_path_and_as_few_as_asked(tmp_path) -> None:
    root = tmp_path / "data"
    root.mkdir()
    for n in range(10):
        (root / f"copy{n}").write_bytes(b"same content\n")
    (root / "other").write_bytes(b"other content\n")
    db = IndexDatabase(tmp_path / "index.sqlite3")
    refresh(db, str(root))
    content = signature_of_path(str(root / "copy0")).root
    assert [f.path for f in db.with_root(content)] == [f"copy{n}" for n in range(10)]
    assert [f.path for f in db.with_root(content, 3)] == ["copy0", "copy1", "copy2"]
    assert db.with_root(b"\0" * 32) == []
    db.close()


def test_a_directory_turned_symlink_before_its_files_are_read_is_an_error_not_a_crash(
    tmp_path,
) -> None:
    """The walk saw ``d/f``; by the time the refresh reads it, ``d`` is a symlink to the
    outside. The file is reported as unreadable, nothing outside is read, and the rest of
    the refresh completes."""
    from rdc.local.fs import SafeRoot
    from rdc.local.snapshot import walk

    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "d").mkdir(parents=True)
    (root / "d" / "f").write_bytes(b"inside" * 100)
    (root / "g").write_bytes(b"other" * 100)
    outside.mkdir()
    (outside / "f").write_bytes(b"secret" * 100)
    walked = walk(str(root))
    os.rename(root / "d", tmp_path / "moved")
    os.symlink(outside, root / "d")
    db = IndexDatabase(tmp_path / "index.sqlite3")
    with SafeRoot(root) as fs:
        stats = refresh(db, str(root), files=walked.files, opener=fs.open_read)
    assert [path for path, _ in stats.errors] == ["d/f"]
    assert set(contents(db)) == {"g"}
    db.close()


def test_trait_lists_in_memory_agree_with_the_sketches(tmp_path) -> None:
    """Candidates come from the trait lists held in memory; every kind of write keeps them
    in step with the sketches in the database (counted here file by file), and a write by
    another connection is seen."""
    import random as _random

    rng = _random.Random(5)
    root = tmp_path / "data"
    root.mkdir()
    files = {}
    for i in range(60):
        data = bytes(rng.randrange(4) for _ in range(rng.randrange(2000, 60000)))
        files[f"d{i % 3}/f{i}"] = data
        (root / f"d{i % 3}").mkdir(exist_ok=True)
        (root / f"d{i % 3}" / f"f{i}").write_bytes(data)
    db = IndexDatabase(tmp_path / "index.sqlite3")
    refresh(db, str(root))

    def from_table(sketch: bytes, exclude: int | None = None) -> list[tuple[int, int]]:
        counted = []
        for file_id, other in db.conn.execute("SELECT id, sketch FROM file"):
            if other is not None and file_id != exclude:
                n = sum(a == b for a, b in zip(sketch, other, strict=True))
                if n >= 4:
                    counted.append((-n, file_id))
        return [(file_id, -n) for n, file_id in sorted(counted)[:5]]

    def agree() -> None:
        for f in db.files():
            if f.sketch is not None:
                assert db.candidates(f.sketch, 4, 5, exclude=f.id) == from_table(f.sketch, f.id)

    agree()
    (root / "d0" / "f0").write_bytes(b"changed" * 900)  # put: a new row, the old one gone
    os.rename(root / "d1" / "f1", root / "d1" / "moved")  # move
    os.remove(root / "d2" / "f2")  # delete
    refresh(db, str(root))
    agree()
    with db.transaction():
        db.delete_tree("d1")
    agree()
    # Many at once, one path twice (a file signed twice in one batch): the last stays.
    from rdc.content.signature import signature_of_bytes

    st = os.lstat(root / "d2" / "f5")
    first, last = signature_of_bytes(files["d2/f5"]), signature_of_bytes(b"later" * 700)
    other = signature_of_bytes(files["d0/f3"][::-1])
    with db.transaction():
        db.put_rows([row_of("d2/f5", st, first, False), row_of("d0/f3", st, other, False),
                     row_of("d2/f5", st, last, True)])
    assert db.get("d2/f5").root == last.root and db.get("d2/f5").racy
    assert db.get("d0/f3").root == other.root
    agree()
    # Kept in step, the lists are what a load makes of the table, in id order (which is
    # what lets a removal find an id by bisection).
    from rdc.local.index.traits import TraitLists

    kept = db._trait_lists().lists
    assert kept == TraitLists.load(db.conn).lists
    assert all(list(ids) == sorted(ids) for ids in kept)
    other = IndexDatabase(tmp_path / "index.sqlite3")  # another connection writes
    with other.transaction():
        other.delete_tree("d0")
    other.close()
    agree()
    assert not any(f.path.startswith(("d0/", "d1/")) for f in db.files())
    db.close()


def test_an_index_of_schema_1_is_upgraded_in_place(tmp_path) -> None:
    """Schema 2 drops the trait table (3 adds the kept tree's, 4 swaps the root and inode
    indexes for one of the roots' first bytes, 5 adds the unsure files' table, 6 the kept
    tree of stamp roots): an index
    made by schema 1 keeps its rows,
    loses the table, still answers candidate queries (from the sketch column) and finds
    its files by root through the new index."""
    from rdc.local.index.db import _migrations, _statements

    root = tmp_path / "data"
    root.mkdir()
    (root / "a").write_bytes(bytes(range(256)) * 40)
    (root / "b").write_bytes(bytes(range(256)) * 39 + b"edited")
    db = IndexDatabase(tmp_path / "index.sqlite3")
    refresh(db, str(root))
    rows = sorted((f.path, f.root) for f in db.files())
    db.close()
    conn = sqlite3.connect(tmp_path / "index.sqlite3", isolation_level=None)
    (_, first), *_ = _migrations()
    for statement in _statements(first):
        if "CREATE TABLE trait" in statement or "CREATE INDEX" in statement:
            conn.execute(statement)
    conn.execute("DROP TABLE sealed")  # (schema 3's)
    conn.execute("DROP INDEX file_root8")  # (schema 4's)
    conn.execute("DROP TABLE unsure")  # (schema 5's)
    conn.execute("DROP TABLE stamp_sealed")  # (schema 6's)
    conn.execute("PRAGMA user_version=1")
    conn.close()
    db = IndexDatabase(tmp_path / "index.sqlite3")
    assert db.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 6
    tables = {name for (name,) in db.conn.execute("SELECT name FROM sqlite_master")}
    assert "trait" not in tables
    assert {"file", "sealed", "file_root8", "unsure", "stamp_sealed"} <= tables
    assert not {"file_root", "file_inode"} & tables
    assert sorted((f.path, f.root) for f in db.files()) == rows
    for path, root in rows:
        assert [f.path for f in db.with_root(root)] == [path]
        assert db.with_roots([root, root[:5]]) == {root: [path], root[:5]: [path]}
    a = next(f for f in db.files() if f.path == "a")
    assert [file_id for file_id, _ in db.candidates(a.sketch, 4, 5, exclude=a.id)] == [
        f.id for f in db.files() if f.path == "b"
    ]
    db.close()


@given(st.lists(st.text(alphabet=st.characters(codec="utf-8") | st.sampled_from(
    ["\udcc3", "\udcff", "a", "B", "é", "\U0001f600", "~"]), min_size=1, max_size=6),
    unique=True, max_size=12))
@example(["é", "\udcc3", "z"])  # str order puts é first; byte order the escaped 0xC3
def test_children_sort_in_name_byte_order(names: list[str]) -> None:
    """Hashes and vectors depend on this order: the ASCII fast path must agree with
    sorting by the names' bytes (non-UTF-8 names, as surrogate escapes, included)."""
    from rdc.local.snapshot import Entry

    directory = Entry("d", 0o755, 0, children={n: Entry("f", 0o644, 0) for n in names})
    got = [name for name, _ in directory.sorted_children()]
    assert got == sorted(names, key=os.fsencode)


def test_the_seed_threshold_keeps_chance_candidates_rare_as_an_index_grows() -> None:
    """4 common traits while an index is small; more once its files would give a query
    more than CHANCE_CANDIDATES unrelated candidates at 4, and never more than needed."""
    from rdc.local.index.traits import CHANCE_CANDIDATES, chance, seed_threshold

    assert chance(0) == pytest.approx(1.0) and chance(12) == pytest.approx(64.0**-12)
    for files in (0, 100, 7_000, 9_000, 10_000, 100_000, 300_000, 400_000, 10**6, 10**8):
        t = seed_threshold(files, 4)
        assert files * chance(t) <= CHANCE_CANDIDATES
        assert t == 4 or files * chance(t - 1) > CHANCE_CANDIDATES
    assert [seed_threshold(n, 4) for n in (7_000, 100_000, 10**6)] == [4, 5, 6]


def _byte_runs() -> st.SearchStrategy[bytes]:
    """32-byte roots that share prefixes often, 0xff runs among them (a prefix's end)."""
    head = st.sampled_from([b"", b"\x00", b"\x7f", b"\x7f\xff", b"\xff" * 7, b"\xff" * 8,
                            b"\x01" * 8 + b"\xff", b"\xff" * 15, b"\xff" * 16])
    return st.tuples(head, st.binary(min_size=32, max_size=32)).map(
        lambda t: (t[0] + t[1])[:32])


@given(st.lists(_byte_runs(), min_size=1, max_size=30, unique=True), st.data())
def test_roots_are_found_by_their_first_bytes(tmp_path_factory, roots, data) -> None:
    """`with_roots` of a prefix (a batch's offer may name a root by its first 16 bytes)
    finds exactly the paths whose roots start with it, as of a whole root those with it;
    prefixes shorter and longer than the index's key (ROOT_KEY bytes) alike."""
    db = IndexDatabase(tmp_path_factory.mktemp("prefixes") / "index.sqlite3")
    try:
        with db.transaction():
            for i, root in enumerate(roots):
                db.conn.execute(
                    "INSERT INTO file (path, size, mtime_ns, inode, mode, root, sketch, tree,"
                    " racy) VALUES (?, 0, 0, ?, 33188, ?, NULL, x'', 0)", (b"f%d" % i, i, root))
        cut = st.integers(1, 31)
        asked = data.draw(st.lists(st.one_of(
            st.tuples(st.sampled_from(roots), cut).map(lambda t: t[0][: t[1]]),
            st.sampled_from(roots), st.tuples(_byte_runs(), cut).map(lambda t: t[0][: t[1]])),
            min_size=1, max_size=10))
        found = db.with_roots(asked)
        for query in asked:
            want = sorted(f"f{i}" for i, root in enumerate(roots) if root.startswith(query))
            assert sorted(found.get(query, [])) == want
    finally:  # (hypothesis ends some examples inside: their descriptors are not left behind)
        db.close()


def test_the_wal_is_checkpointed_only_when_large(tmp_path) -> None:
    """Each connection checkpoints at WAL_PAGES, not SQLite's 1,000 (docs/formats.md
    section 7): a first copy's commits write about a page a row. The WAL holds what was
    written since, and a second connection reads it."""
    db = IndexDatabase(tmp_path / "index.sqlite3")
    try:
        assert db.conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == WAL_PAGES > 1000
        rows = [(b"f%d" % i, 1, 1, i, 0o100644, os.urandom(32), None, bytes(3000), 0)
                for i in range(2000)]  # (a large tree each: 6 MB of pages)
        for at in range(0, len(rows), 100):
            with db.transaction():
                db.put_rows(rows[at : at + 100])
        wal = tmp_path / "index.sqlite3-wal"
        assert wal.stat().st_size > 1000 * 4096  # past SQLite's own point, not copied back
        other = IndexDatabase(tmp_path / "index.sqlite3")
        try:
            assert other.count() == 2000
        finally:
            other.close()
    finally:
        db.close()


def test_files_are_found_by_root_through_the_index(tmp_path) -> None:
    """Each look-up by root (whole, many, by prefix) searches the index of the roots' first
    bytes: a query that names the root any other way than the index's expression is a
    scan of every row, which no result would show."""
    db = IndexDatabase(tmp_path / "index.sqlite3")
    try:
        roots = [os.urandom(32) for _ in range(20)]
        with db.transaction():
            db.put_rows([(b"f%d" % i, 1, 1, i, 0o100644, root, None, b"", 0)
                         for i, root in enumerate(roots)])
        statements: list[str] = []
        db.conn.set_trace_callback(statements.append)
        assert [f.path for f in db.with_root(roots[3])] == ["f3"]
        assert db.with_roots([roots[4], roots[5][:16], roots[6][:5]]) == {
            roots[4]: ["f4"], roots[5][:16]: ["f5"], roots[6][:5]: ["f6"]}
        db.conn.set_trace_callback(None)
        asked = [s for s in statements if "root" in s and s.lstrip().startswith(("SELECT",
                                                                                "WITH"))]
        assert len(asked) == 3, statements
        for statement in asked:
            plan = " ".join(row[3] for row in db.conn.execute("EXPLAIN QUERY PLAN " + statement))
            assert "USING INDEX file_root8" in plan, (statement, plan)
    finally:
        db.close()
