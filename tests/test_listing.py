"""The C directory listing says what the reference (os.scandir and lstat) says, whatever the
names, kinds and times; a walk's tree and fingerprint are built from it."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rdc._native import listing_ref

from .conftest import PURE

_listing = pytest.importorskip("rdc._native._listing") if PURE else None
_entries = pytest.importorskip("rdc._native._entries") if PURE else None
if _listing is None:
    from rdc._native import _entries, _listing

# Names as the disk holds them: any bytes but "/" and NUL, so also invalid UTF-8 (which a
# str carries as surrogate escapes), minus "." and "..".
names = st.binary(min_size=1, max_size=40).map(
    lambda b: b.replace(b"/", b"_").replace(b"\0", b"_")
).filter(lambda b: b not in (b".", b".."))
kinds = st.sampled_from(["file", "dir", "link", "fifo"])
# Times from before 1970 to past what 64 bits of nanoseconds hold (year 2262).
times = st.integers(min_value=-(2**34), max_value=2**34) | st.sampled_from(
    [0, 2**63 // 10**9 + 1, 10_413_792_000]  # just past 2262; 2300-01-01
)


def _listed(fd: int, lister) -> list:
    return sorted(lister(fd))


def _make(root: Path, entries: dict[bytes, tuple[str, int, int]]) -> int:
    base = os.fsencode(root)
    for raw, (kind, size, seconds) in entries.items():
        path = os.path.join(base, raw)
        if kind == "file":
            with open(path, "wb") as f:
                f.write(b"x" * size)
        elif kind == "dir":
            os.mkdir(path)
        elif kind == "link":
            os.symlink(b"target-" + raw[:10], path)
        else:
            os.mkfifo(path)
        os.utime(path, ns=(seconds * 10**9 + 7, seconds * 10**9 + 7), follow_symlinks=False)
    return os.open(root, os.O_RDONLY | os.O_DIRECTORY)


def _made(root: Path, entries: dict[bytes, tuple[str, int, int]]) -> int | None:
    """`_make`, or None where the file system cannot hold one of the times."""
    try:
        return _make(root, entries)
    except OSError as exc:
        if exc.errno in (errno.EINVAL, errno.EOVERFLOW):
            return None
        raise


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(names, st.tuples(kinds, st.integers(0, 5000), times), max_size=12))
def test_c_listing_equals_the_reference(tmp_path_factory, entries) -> None:
    root = tmp_path_factory.mktemp("listing")
    fd = _made(root, entries)
    if fd is None:
        return
    try:
        got = _listed(fd, _listing.list_dir)
        assert got == _listed(fd, listing_ref.list_dir)
        assert sorted(os.fsencode(name) for name, *_ in got) == sorted(entries)
        for name, mode, size, mtime, ino in got:
            st_ = os.lstat(os.path.join(root, name))
            assert (mode, mtime, ino) == (st_.st_mode, st_.st_mtime_ns, st_.st_ino)
            if stat.S_ISREG(mode):
                assert size == st_.st_size
    finally:
        os.close(fd)


def test_listing_leaves_the_descriptor_for_the_next_reader(tmp_path: Path) -> None:
    for n in range(300):  # more than one getdents buffer
        (tmp_path / f"f{n:03d}").write_bytes(b"")
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        first = _listing.list_dir(fd)
        assert len(first) == 300
        assert _listing.list_dir(fd) == first
        assert len(listing_ref.list_dir(fd)) == 300  # os.scandir after it sees everything
        assert _listing.list_dir(fd) == first
    finally:
        os.close(fd)


def test_listing_errors(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"x")
    fd = os.open(tmp_path / "file", os.O_RDONLY)
    try:
        with pytest.raises(NotADirectoryError):
            _listing.list_dir(fd)
    finally:
        os.close(fd)
    with pytest.raises(OSError) as caught:
        _listing.list_dir(fd)  # closed now
    assert caught.value.errno == errno.EBADF
    with pytest.raises(TypeError):
        _listing.list_dir("not a descriptor")


# ---------------------------------------------------------------- stamp_tree

STAMP_ARGS = (256, b".rdc-tmp-", b".rdc-folder")
# Mostly UTF-8 names (some not ASCII), now and then raw bytes, a temporary's prefix or the
# folder marker: the walk decodes the raw ones its own way, so the stamp must be unsure.
tree_names = (
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="/\0"),
            min_size=1, max_size=12).map(lambda t: t.encode()).filter(
        lambda b: b not in (b".", b"..") and len(b) < 200)
    | names
    | st.sampled_from([b".rdc-folder", b".rdc-tmp-0123456789abcdef-x", b"a", b"A", b"a.b"])
)


def _make_tree(root: Path, entries: dict, depth: int = 0) -> None:
    base = os.fsencode(root)
    for raw, (kind, size, inner) in entries.items():
        path = os.path.join(base, raw)
        if kind == "file":
            with open(path, "wb") as f:
                f.write(b"y" * size)
            os.chmod(path, 0o600 + size % 0o100)
        elif kind == "dir":
            os.mkdir(path)
            if depth < 2:
                _make_tree(Path(os.fsdecode(path)), inner, depth + 1)
        elif kind == "link":
            os.symlink(b"to-" + raw[:8], path)
        else:
            os.mkfifo(path)


tree_entries = st.recursive(
    st.just({}),
    lambda inner: st.dictionaries(tree_names, st.tuples(kinds, st.integers(0, 300), inner),
                                  max_size=6),
    max_leaves=14,
)


@settings(max_examples=80, deadline=None)
@given(tree_entries)
def test_stamp_tree_is_the_stamp_a_walk_seals(tmp_path_factory, entries) -> None:
    """Where the C stamp answers, it is the reference's, and the stamp and file count of
    the walk a replica makes; it answers for every tree of UTF-8 names without
    temporaries; it is unsure (None) exactly where the reference is."""
    from rdc.local.ignore import Excludes
    from rdc.local.snapshot import stamp, walk

    root = tmp_path_factory.mktemp("stamp")
    _make_tree(root, entries)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        got = _listing.stamp_tree(fd, *STAMP_ARGS)
        assert got == listing_ref.stamp_tree(fd, *STAMP_ARGS)
        walked = walk(fd, Excludes())
        every = [os.fsencode(p) for p in _all_names(root)]
        ordinary = all(_utf8(n) and not n.startswith(b".rdc-tmp-") for n in every)
        assert (got is not None) == ordinary
        if got is not None:
            assert got[:2] == (stamp(walked.tree), len(walked.files))
            assert got[2] == _dir_stamps(walked.tree)  # (stamp set each directory's seen)
    finally:
        os.close(fd)


def _dir_stamps(tree, rel: str = "") -> dict[str, bytes]:
    out = {rel: tree.seen}
    for name, entry in tree.children.items():
        if entry.kind == "d":
            out.update(_dir_stamps(entry, f"{rel}/{name}" if rel else name))
    return out


def _all_names(root: Path) -> list[str]:
    out = []
    for _, dirs, files in os.walk(os.fsencode(root)):
        dirs[:] = [d for d in dirs if d != b".rdc-folder"]  # left out, not looked into
        out += [os.fsdecode(n) for n in dirs + files if n != b".rdc-folder"]
    return out


def _utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def test_stamp_tree_is_unsure_below_its_depth_and_of_what_it_cannot_read(
        tmp_path: Path) -> None:
    deep = tmp_path / "a" / "b" / "c"
    deep.mkdir(parents=True)
    (deep / "f").write_bytes(b"x")
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert _listing.stamp_tree(fd, 3, *STAMP_ARGS[1:]) is not None
        assert _listing.stamp_tree(fd, 2, *STAMP_ARGS[1:]) is None
        assert listing_ref.stamp_tree(fd, 2, *STAMP_ARGS[1:]) is None
    finally:
        os.close(fd)
    fd = os.open(tmp_path / "a" / "b" / "c" / "f", os.O_RDONLY)
    try:
        with pytest.raises(OSError):
            _listing.list_dir(fd)
        assert _listing.stamp_tree(fd, *STAMP_ARGS) is None  # not a directory
    finally:
        os.close(fd)


# ---------------------------------------------------------------- a walk's listing


def _scan_list(patch: pytest.MonkeyPatch, native, fd: int, rel_dir: str, marker: bool
               ) -> tuple:
    """What `Scan.list` makes of directory ``fd`` (as ``rel_dir``) with the native listing
    ``native`` (None: the Python loop over `list_dir`), in a form to compare."""
    from rdc import _native
    from rdc.local.ignore import Excludes
    from rdc.local.snapshot import Entry, Scan

    patch.setattr(_native, "list_entries", native)
    scan = Scan(Excludes([]) if marker else None)
    node = Entry("d", 0o755, 0, children={})
    subdirs = scan.list(fd, rel_dir, node)
    assert subdirs is not None
    return (node.children, scan.files, sorted(scan.listed), sorted(subdirs),
            sorted(scan.errors), sorted(scan.temporaries))


@settings(max_examples=80, deadline=None)
@given(st.dictionaries(tree_names, st.tuples(kinds, st.integers(0, 3000), times), max_size=12),
       st.sampled_from([0, 1, 255, 256]), st.booleans())
def test_native_walk_listing_makes_what_the_python_loop_makes(
        tmp_path_factory, entries, depth, marker) -> None:
    """Files, directories, links, FIFOs, temporaries, the folder marker, names that are not
    UTF-8, times past 64 bits of nanoseconds, directories at and past the depth limit: the
    same entries, files, listing, subdirectories, errors and temporaries whichever way
    they are made."""
    from rdc.local.snapshot import MAX_DEPTH

    root = tmp_path_factory.mktemp("scanlist")
    fd = _made(root, entries)
    if fd is None:
        return
    rel_dir = "/".join(["d"] * depth)
    try:
        with pytest.MonkeyPatch.context() as patch:
            python = _scan_list(patch, None, fd, rel_dir, marker)
        with pytest.MonkeyPatch.context() as patch:
            native = _scan_list(patch, _entries.list, fd, rel_dir, marker)
    finally:
        os.close(fd)
    assert native == python
    _, files, listed, subdirs, _, _ = native
    assert sorted(os.fsencode(name) for name, *_ in subdirs) == sorted(
        raw for raw, (kind, *_) in entries.items() if kind == "dir" and depth < MAX_DEPTH
        and not raw.startswith(b".rdc-tmp-") and not (marker and raw == b".rdc-folder"))
    assert all(subdir.children == {} for _, _, subdir in subdirs)
    assert [path for _, path, _ in listed] == sorted(files)


def test_native_walk_listing_raises_for_what_is_not_a_directory(tmp_path: Path) -> None:
    from rdc.local.filestat import Seen
    from rdc.local.snapshot import NO_CHILDREN, Entry

    (tmp_path / "file").write_bytes(b"x")
    fd = os.open(tmp_path / "file", os.O_RDONLY)
    args = ("", {}, {}, [], Entry, Seen, NO_CHILDREN, False, None, b".rdc-tmp-")
    try:
        with pytest.raises(NotADirectoryError):
            _entries.list(fd, *args)
    finally:
        os.close(fd)
    with pytest.raises(TypeError):
        _entries.list(0, "", {}, {}, [], Entry, int, NO_CHILDREN, False, None, b"")
