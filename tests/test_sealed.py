"""The sealed tree kept in the index (rdc.local.sealed): a new process's scan starts from
it, lists again only the directories whose stamps changed, and ends with exactly the tree
a full scan makes."""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import blake3
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rdc.local import sealed, snapshot
from rdc.local.replica import Replica

from .test_entry_trees import trees

OLD = 1_600_000_000 * 10**9


def grow(root: Path, dirs: int = 12, files: int = 5, seed: int = 1) -> None:
    rng = random.Random(seed)
    for d in range(dirs):
        where = root / f"d{d % 4}" / f"e{d}"
        where.mkdir(parents=True, exist_ok=True)
        for f in range(files):
            path = where / f"f{f}.txt"
            path.write_bytes(rng.randbytes(rng.randrange(0, 3000)))
            os.utime(path, ns=(OLD + f, OLD + f))
    os.symlink("d0/e0/f0.txt", root / "link")


def full_scan(root: Path, index: Path) -> snapshot.Entry:
    """A scan with no kept tree (a fresh index): the reference."""
    shutil.rmtree(index.parent, ignore_errors=True)
    replica = Replica(str(root), index)
    try:
        return replica.scan()
    finally:
        replica.close()


def kept_scan(root: Path, index: Path, walks: list | None = None
              ) -> tuple[snapshot.Entry, Replica]:
    """A new process's scan; the Python walks it made are counted in ``walks``."""
    replica = Replica(str(root), index)
    real = replica.walk

    def walk(*args, **kwargs):
        if walks is not None:
            walks.append(1)
        return real(*args, **kwargs)

    replica.walk = walk  # type: ignore[method-assign]
    _cached, walked = replica.quick()
    return replica.scan(walked=walked), replica


def same(a: snapshot.Entry, b: snapshot.Entry) -> bool:
    return (a.content, a.meta, a.smeta, a.count) == (b.content, b.meta, b.smeta, b.count)


def _vouched_body(body: bytes) -> bytes:
    """``body`` behind its own hash: what the hash cannot catch, rdc's own mistakes."""
    return sealed.VERSION + blake3.blake3(body).digest() + body


def _both_unpackings(data: bytes) -> list:
    """What `sealed.unpack` and its Python specification make of ``data`` (None where one
    refuses it)."""
    outcomes = []
    for unpack in (sealed.unpack, _reference):
        try:
            outcomes.append(unpack(data))
        except sealed.Damaged:
            outcomes.append(None)
    return outcomes


def test_a_packed_tree_unpacks_to_itself_and_damage_is_refused(tmp_path) -> None:
    grow(tmp_path / "root")
    tree = full_scan(tmp_path / "root", tmp_path / "x" / "index.sqlite3")
    snapshot.stamp(tree)
    packed = sealed.pack(tree)
    back = sealed.unpack(packed)
    assert same(back, tree) and back.seen == tree.seen
    assert back == tree  # every field of every entry
    assert snapshot.entries_below(back) is not None
    assert [(p, e.kind, e.root, e.target, e.mode, e.mtime_ns, e.size, e.ino)
            for p, e in snapshot.entries_below(back)] == [
        (p, e.kind, e.root, e.target, e.mode, e.mtime_ns, e.size, e.ino)
        for p, e in snapshot.entries_below(tree)]
    for damaged in (packed[:-1], packed[:40], bytes([packed[0] ^ 0xFF]) + packed[1:],
                    packed[:60] + bytes([packed[60] ^ 1]) + packed[61:]):
        with pytest.raises(sealed.Damaged):
            sealed.unpack(damaged)
    import marshal

    vouched = _vouched_body

    def record(value: object, short: int = 0) -> bytes:  # a length, then the marshal bytes
        raw = marshal.dumps(value)
        return (len(raw) - short).to_bytes(4, "little") + raw

    ok = (0, 0, 0, b"c", b"m", b"s", 0, b"x", (), ())
    assert sealed.unpack(vouched(record(ok))).content == b"c"
    for body in (packed[33:] + b"x", record((1, 2, 3)), record(None),
                 record((0, 0, 0, b"c", b"m", b"s", 0, b"", (), ())),
                 record(ok)[:-1], record(ok, short=1), b"\0\0\0\0",
                 record((0, 0, 0, b"c", b"m", b"s", 0, b"x", ("a",), (None,))),  # (no record)
                 marshal.dumps(ok)):  # (version 2: records without lengths)
        with pytest.raises(sealed.Damaged):
            sealed.unpack(vouched(body))


def test_a_new_process_lists_again_only_the_directories_that_changed(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, index = tmp_path / "root", tmp_path / "state" / "index.sqlite3"
    grow(root)
    first = Replica(str(root), index)
    first.scan()
    first.close()
    (root / "d1" / "e5" / "f2.txt").write_bytes(b"edited")
    os.utime(root / "d1" / "e5" / "f2.txt", ns=(OLD + 99, OLD + 99))
    listed: list[str] = []
    real_list = snapshot.Scan.list

    def counting(self, fd, rel, node, kept=None):
        listed.append(rel)
        return real_list(self, fd, rel, node, kept)

    monkeypatch.setattr(snapshot.Scan, "list", counting)
    walks: list[int] = []
    tree, again = kept_scan(root, index, walks)
    assert not walks and sorted(listed) == ["", "d1", "d1/e5"]  # it, and its ancestors
    assert again.stats.signed == 1
    again.close()
    monkeypatch.setattr(snapshot.Scan, "list", real_list)
    assert same(tree, full_scan(root, tmp_path / "ref" / "index.sqlite3"))


@pytest.mark.parametrize("changed", ["one directory", "most directories"])
def test_the_tree_sealed_last_is_kept_as_the_base_of_the_next_scan(
    tmp_path, changed: str
) -> None:
    """The next push compares against what it left the target holding (the tree sealed
    last), whether this scan patched a few directories into it or, much having changed,
    scanned in full: a renamed tree's push asked the server again for the listings of
    every directory it had touched."""
    root, index = tmp_path / "root", tmp_path / "state" / "index.sqlite3"
    grow(root)
    first = Replica(str(root), index)
    before = first.scan()
    first.close()
    where = [root / "d1" / "e5"] if changed == "one directory" else sorted(
        path for path in root.glob("d*/e*"))
    for directory in where:
        (directory / "f0.txt").rename(directory / "renamed.txt")
    tree, again = kept_scan(root, index)
    try:
        assert again.base is not None and same(again.base, before)
        assert not same(tree, before)
        assert same(tree, full_scan(root, tmp_path / "ref" / "index.sqlite3"))
    finally:
        again.close()


def test_a_cold_index_walks_the_tree_once_and_a_sealed_one_stamps_it_first(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stamp walked in C only pays where the index has hashes or a tree it could match:
    in a cold index, `quick` goes straight to the one walk the scan needs."""
    from rdc.local import replica as replica_module

    root, index = tmp_path / "root", tmp_path / "state" / "index.sqlite3"
    grow(root)
    stamps: list[int] = []
    real_stamp = replica_module.stamp_tree

    def counting(*args):
        stamps.append(1)
        return real_stamp(*args)

    monkeypatch.setattr(replica_module, "stamp_tree", counting)
    cold = Replica(str(root), index)
    cached, walked = cold.quick()
    assert cached is None and not stamps and walked.tree.children  # walked, not deferred
    cold.scan(walked=walked)
    cold.close()
    warm = Replica(str(root), index)
    cached, _ = warm.quick()
    assert len(stamps) == 1 and cached is not None  # nothing changed: the stamp says so
    warm.close()


def test_renamed_files_are_read_at_their_new_paths(tmp_path) -> None:
    """A rename is patched in without a walk, its files read again at their new paths (a
    scan cannot tell a rename from a new file on a freed inode: rdc.local.index.update)
    and their old paths' rows gone; the tree is the full scan's."""
    root, index = tmp_path / "root", tmp_path / "state" / "index.sqlite3"
    grow(root)
    first = Replica(str(root), index)
    first.scan()
    first.close()
    os.rename(root / "d2" / "e2", root / "d3" / "moved")
    os.rename(root / "d0" / "e4" / "f1.txt", root / "d0" / "e4" / "renamed.txt")
    walks: list[int] = []
    tree, again = kept_scan(root, index, walks)
    assert not walks and again.stats.signed == 6
    assert again.db.get("d3/moved/f3.txt") is not None and again.db.get("d2/e2/f3.txt") is None
    again.close()
    assert same(tree, full_scan(root, tmp_path / "ref" / "index.sqlite3"))


def test_a_damaged_kept_tree_is_dropped_and_the_scan_is_full(tmp_path) -> None:
    root, index = tmp_path / "root", tmp_path / "state" / "index.sqlite3"
    grow(root)
    first = Replica(str(root), index)
    tree = first.scan()
    first.close()
    again = Replica(str(root), index)
    with again.lock, again.db.transaction():
        fingerprint, packed = again.db.kept_tree(b"")
        again.db.keep_tree(fingerprint, b"", packed[:100] + b"x" + packed[101:])
    _cached, walked = again.quick()
    assert same(again.scan(walked=walked), tree)
    again.close()


# Changes a user makes between two syncs, on a small tree.
changes = st.lists(st.tuples(
    st.sampled_from(["edit", "touch", "chmod", "add", "remove", "rename", "mkdir", "rmdir",
                     "movedir", "link"]),
    st.integers(0, 1000)), min_size=1, max_size=8)


def test_a_scan_from_the_kept_tree_is_the_full_scan(tmp_path_factory) -> None:
    """Whatever changed between two processes, the scan that starts from the kept tree
    ends with the tree and index roots a full scan makes; and most examples start from
    the kept tree, not a full walk (the path under test)."""
    incremental: list[bool] = []

    @settings(max_examples=40, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(changes)
    def check(ops: list[tuple[str, int]]) -> None:
        base = tmp_path_factory.mktemp("kept")
        root, index = base / "root", base / "state" / "index.sqlite3"
        grow(root, dirs=24, files=2)
        first = Replica(str(root), index)
        first.scan()
        first.close()
        for op, n in ops:
            _change(root, op, n)
        walks: list[int] = []
        tree, again = kept_scan(root, index, walks)
        incremental.append(not walks)
        roots = {p: e.root for p, e in snapshot.entries_below(tree) if e.kind == "f"}
        rows = {p: again.db.get(p).root for p in roots}
        again.close()
        reference = full_scan(root, base / "ref" / "index.sqlite3")
        assert same(tree, reference)
        assert roots == rows == {p: e.root for p, e in snapshot.entries_below(reference)
                                 if e.kind == "f"}

    check()
    assert len(incremental) >= 20 and sum(incremental) >= len(incremental) // 2


def _change(root: Path, op: str, n: int) -> None:
    files = sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink())
    dirs = sorted(p for p in root.rglob("*") if p.is_dir() and not p.is_symlink())
    rng = random.Random(n)
    if op == "edit" and files:
        path = rng.choice(files)
        path.write_bytes(path.read_bytes() + b"more")
        os.utime(path, ns=(OLD + n, OLD + n))
    elif op == "touch" and files:
        os.utime(rng.choice(files), ns=(OLD + 7 * n, OLD + 7 * n))
    elif op == "chmod" and files:
        os.chmod(rng.choice(files), 0o600 + n % 0o100)
    elif op == "add" and dirs:
        path = rng.choice(dirs) / f"new{n}.txt"
        path.write_bytes(rng.randbytes(n))
        os.utime(path, ns=(OLD, OLD))
    elif op == "remove" and files:
        rng.choice(files).unlink()
    elif op == "rename" and files:
        path = rng.choice(files)
        path.rename(path.with_name(f"renamed{n}.txt"))
    elif op == "mkdir" and dirs:
        (rng.choice(dirs) / f"dir{n}").mkdir(exist_ok=True)
    elif op == "rmdir" and len(dirs) > 1:
        shutil.rmtree(rng.choice(dirs[1:]))
    elif op == "movedir" and len(dirs) > 2:
        source, into = rng.sample(dirs, 2)
        clear = not os.path.lexists(into / source.name)
        if into != source and source not in into.parents and clear:
            source.rename(into / source.name)
    elif op == "link" and dirs:
        link = rng.choice(dirs) / f"link{n}"
        if not os.path.lexists(link):
            os.symlink(f"target{n}", link)


def test_roots_set_from_rows_in_any_order_and_files_without_one_dropped(tmp_path) -> None:
    """A scan streams its index's (path, root) rows into the tree: rows of paths that are
    not files of the tree (gone, a directory, excluded) are ignored, and a file no row
    names is dropped (unreadable), as a dict look-up per file did."""
    import os

    from rdc.local.snapshot import clear_roots, drop_rootless, set_roots, walk

    for rel in ("a/x", "a/b/y", "z"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(rel.encode())
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        tree = walk(fd).tree
    finally:
        os.close(fd)
    rows = [("z", b"Z" * 32), ("gone", b"G" * 32), ("a", b"D" * 32), ("a/b/y", b"Y" * 32),
            ("a/b/y/deeper", b"Q" * 32)]
    set_roots(tree, reversed(rows))
    assert tree.children["z"].root == b"Z" * 32
    assert tree.children["a"].children["b"].children["y"].root == b"Y" * 32
    clear_roots(tree)
    set_roots(tree, rows[:2])
    assert drop_rootless(tree) == ["a/b/y", "a/x"]
    assert set(tree.children) == {"a", "z"} and not tree.children["a"].children["b"].children




def _reference(packed: bytes) -> snapshot.Entry:
    """`sealed.unpack` by its Python specification (`_entry`), whatever is compiled."""
    real = sealed._native.unpack_sealed
    sealed._native.unpack_sealed = None
    try:
        return sealed.unpack(packed)
    finally:
        sealed._native.unpack_sealed = real


@settings(max_examples=300, deadline=None)
@given(trees(), st.data())
def test_the_compiled_unpacking_makes_what_the_python_one_makes(
    tree: snapshot.Entry, data: st.DataObject
) -> None:
    packed = sealed.pack(tree)
    assert sealed.unpack(packed) == _reference(packed) == tree
    # Bodies no packer made, vouched for by their hash (rdc's own mistakes, not damage):
    # both unpackings refuse them, or both make the same tree.
    body = bytearray(packed[33:])
    for _ in range(data.draw(st.integers(1, 3))):
        if not body:
            break
        at = data.draw(st.integers(0, len(body) - 1))
        body[at] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(body)))
    body = body[:cut] if data.draw(st.booleans()) else body
    outcomes = _both_unpackings(_vouched_body(bytes(body)))
    assert outcomes[0] == outcomes[1]


def _vouched(records: list[tuple]) -> bytes:
    """A body of the given directory records, its hash right: as if rdc had packed it."""
    import marshal

    return _vouched_body(b"".join(len(r).to_bytes(4, "little") + r
                                  for r in (marshal.dumps(rec, 4) for rec in records)))


def _directory(names: tuple = (), items: tuple = ()) -> tuple:
    return (0o755, 1, 2, b"C" * 32, b"M", b"S", 0, b"seen", names, items)


@pytest.mark.parametrize("record", [
    _directory(("a",), ("r\0\0",)),  # an item that is a string of three characters
    _directory(("a",), ((0, 0, 0, b"R" * 32, "0"),)),  # a file's ino that is not an int
    _directory(("a",), ((0.5, "t", 0),)),  # a link's time that is not an int
    _directory("a", ((0, "t", 0),)),  # names a string, not a tuple
    _directory((b"a",), ((0, "t", 0),)),  # a name that is not a string
    (0o755, "1", 2, b"C" * 32, b"M", b"S", 0, b"seen", (), ()),  # a directory's time a str
    (0o755, 1, 2, b"C" * 32, b"M", b"S", 0, b"", (), ()),  # no stamp
], ids=["item-str", "file-ino", "link-time", "names-str", "name-bytes", "dir-time", "seen"])
def test_records_of_the_wrong_types_are_refused_by_both_unpackings(record: tuple) -> None:
    data = _vouched([record])
    for unpack in (sealed.unpack, _reference):
        with pytest.raises(sealed.Damaged):
            unpack(data)


def test_a_field_that_holds_itself_is_refused_by_both_unpackings() -> None:
    """marshal's back-references can make a tuple that holds itself (a changed byte did, in
    CI); an entry of such a value compared with anything recursed without end. Here every
    back-reference of a record is pointed at every object marshal numbered, the tuples
    that hold it among them."""
    import marshal

    root = b"R" * 32
    first, second = (0, 0, 0, root, 0), (0, 0, 0, root, 0)  # (held: marshal numbers them)
    body = _vouched([_directory(("a", "b"), (first, second))])[33:]
    refs = [at for at in range(4, len(body) - 4) if body[at] == ord("r")]
    cycles = 0
    for at in refs:
        for index in range(16):
            mutated = bytearray(body)
            mutated[at + 1 : at + 5] = index.to_bytes(4, "little")
            try:
                items = marshal.loads(bytes(mutated[4:]))[9]
                cycles += any(field is item for item in items for field in item)
            except (ValueError, IndexError, TypeError, EOFError):
                pass
            outcomes = _both_unpackings(_vouched_body(bytes(mutated)))
            assert outcomes[0] == outcomes[1], (at, index)
    assert cycles  # the case of CI's was among them


@pytest.mark.parametrize("extra", [0, 1])
def test_a_tree_deeper_than_the_limit_is_refused_by_both_unpackings(extra: int) -> None:
    depth = sealed.DEPTH_LIMIT + extra
    records = [_directory(("d",), (None,)) for _ in range(depth - 1)] + [_directory()]
    data = _vouched(records)
    for unpack in (sealed.unpack, _reference):
        if extra:
            with pytest.raises(sealed.Damaged):
                unpack(data)
        else:
            tree = unpack(data)
            for _ in range(depth - 1):
                tree = tree.children["d"]
            assert tree.children == {}
