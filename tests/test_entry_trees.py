"""Trees of entries sealed and stamped natively (rdc._native._entries) are hashed exactly as
the Python specifications (`rdc.local.snapshot._seal`, `_stamp`) hash them: names in any
script or undecodable, links, subtrees already sealed, and directories whose hash input is
over the native hash's 1 MiB."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rdc import _native
from rdc.local import snapshot
from rdc.local.snapshot import Entry

from .conftest import PURE

# Names as a walk decodes them: any text, and bytes that are not UTF-8 (surrogate escapes).
names = st.one_of(
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="/\0"),
             min_size=1, max_size=6),
    st.binary(min_size=1, max_size=6).filter(lambda b: b"/" not in b and b"\0" not in b)
    .map(lambda b: b.decode("utf-8", "surrogateescape")),
)


def _tree(draw: st.DrawFn, depth: int = 0) -> Entry:
    """A directory with files, links and directories with arbitrary fields, some of its
    subdirectories sealed and stamped already (as a rescan leaves those it did not list)."""
    children: dict[str, Entry] = {}
    for name in draw(st.lists(names, max_size=5, unique=True)):
        kind = draw(st.sampled_from("fld" if depth < 3 else "fl"))
        if kind == "f":
            children[name] = Entry(
                "f", draw(st.integers(0, 0o7777)), draw(st.integers(-(2**63), 2**63 - 1)),
                draw(st.integers(0, 2**64 - 1)), draw(st.binary(min_size=32, max_size=32)),
                ino=draw(st.integers(0, 2**64 - 1)))
        elif kind == "l":
            children[name] = Entry("l", 0, draw(st.integers(0, 2**62)), target=draw(names),
                                   ino=draw(st.integers(0, 2**40)))
        else:
            children[name] = _tree(draw, depth + 1)
    return Entry("d", draw(st.integers(0, 0o7777)), draw(st.integers(0, 2**62)),
                 children=children, content=draw(st.binary(min_size=1, max_size=32)),
                 meta=draw(st.binary(max_size=32)), smeta=draw(st.binary(max_size=32)),
                 count=draw(st.integers(0, 2**31)), ino=draw(st.integers(0, 2**40)),
                 seen=draw(st.binary(min_size=1, max_size=32)))


trees = st.composite(_tree)


def _forget(directory: Entry, rng: st.DataObject) -> None:
    """Drop the hashes and stamps of some directories (and so of those above them)."""
    for entry in directory.children.values():
        if entry.kind == "d":
            _forget(entry, rng)
            if not entry.content:
                directory.content = b""
            if not entry.seen:
                directory.seen = b""
    if rng.draw(st.booleans()):
        directory.content = directory.seen = b""


def _fields(directory: Entry) -> list:
    out = [(directory.content, directory.meta, directory.smeta, directory.count,
            directory.seen)]
    for _, entry in directory.sorted_children():
        if entry.kind == "d":
            out += _fields(entry)
    return out


needs_c = pytest.mark.skipif(PURE, reason="the pure run has only the specification")


@needs_c
@settings(max_examples=400, deadline=None)
@given(trees(), st.data())
def test_native_seal_and_stamp_hash_as_the_specification(tree: Entry, data: st.DataObject
                                                         ) -> None:
    _forget(tree, data)
    mine = copy.deepcopy(tree)
    snapshot._seal(tree)
    snapshot._stamp(tree)
    snapshot.seal(mine)
    snapshot.stamp(mine)
    assert _fields(mine) == _fields(tree)


@needs_c
def test_a_directory_over_a_mebibyte_of_hash_input_is_hashed_whole() -> None:
    big = Entry("d", 0o755, 1, children={
        f"{i:06d}-{'x' * 40}": Entry("f", 0o644, i, i, bytes(32), ino=i) for i in range(20_000)
    })
    top = Entry("d", 0o755, 2, children={"big": big, "link": Entry("l", 0, 3, target="big")})
    reference = copy.deepcopy(top)
    snapshot.seal(top)
    snapshot._seal(reference)
    assert snapshot.stamp(top) == snapshot._stamp(reference)
    assert _fields(top) == _fields(reference)
    assert top.count == reference.count == 20_002


@needs_c
def test_what_is_not_a_tree_of_entries_is_refused() -> None:
    class Other:
        pass

    bad_kind = Entry("d", 0, 0, children={"x": Entry("q", 0, 0)})
    with pytest.raises(ValueError):
        snapshot.seal(bad_kind)
    not_entry = Entry("d", 0, 0, children={"x": Other()})  # type: ignore[dict-item]
    with pytest.raises(TypeError):
        snapshot.stamp(not_entry)
    huge_mode = Entry("d", 0, 0, children={"x": Entry("f", 1 << 16, 0, root=bytes(32))})
    with pytest.raises(OverflowError):
        _native.seal_entries(huge_mode, snapshot._CONTEXTS, snapshot._hash_big)


def _paths(directory: Entry, prefix: str = "") -> list[str]:
    out = []
    for name, entry in directory.children.items():
        out.append(prefix + name)
        if entry.kind == "d":
            out += _paths(entry, f"{prefix}{name}/")
    return out


@settings(max_examples=60, deadline=None)
@given(tree=trees(), data=st.data())
def test_roots_set_in_runs_by_directory_land_where_a_lookup_per_path_puts_them(
        tree: Entry, data: st.DataObject) -> None:
    """`set_roots` looks a directory up once per run of its paths: whatever the order
    (by directory, shuffled) and whatever the paths name (files, links, directories, a
    path below a file, one not there), each file named gets its root and nothing else
    changes, as with `lookup` per path."""
    known = _paths(tree)
    extra = ["", "nowhere/x", *(f"{path}/below" for path in known)]
    paths = data.draw(st.lists(st.sampled_from(known + extra), max_size=30)) if known else extra
    if data.draw(st.booleans()):
        paths.sort(key=lambda path: path.rpartition("/")[0])
    rows = [(path, bytes([k % 256]) * 32) for k, path in enumerate(paths)]
    expected = copy.deepcopy(tree)
    for path, root in rows:
        entry = snapshot.lookup(expected, path)
        if entry is not None and entry.kind == "f":
            entry.root = root
    snapshot.set_roots(tree, rows)
    assert _roots(tree) == _roots(expected)


def _roots(directory: Entry) -> list:
    return [(path, entry.kind, entry.root) for path in _paths(directory)
            for entry in [snapshot.lookup(directory, path)]]
