"""The counters of a finished run: the files of a tree answer as their set would."""

from __future__ import annotations

import os

from hypothesis import given, settings
from hypothesis import strategies as st

from rdc.local.snapshot import walk
from rdc.transfer.stats import Stats, count_files
from rdc.transfer.tally import files_of
from rdc.wire import messages as m

names = st.sampled_from(["a", "b", "c.txt", "dir", "é"])
paths = st.lists(st.lists(names, min_size=1, max_size=3).map("/".join), max_size=12)


@settings(max_examples=40, deadline=None)
@given(paths, paths)
def test_the_files_of_a_tree_answer_as_their_set(tmp_path_factory, made, asked) -> None:
    root = tmp_path_factory.mktemp("tree")
    for rel in made:
        target = root / rel
        if any(p.is_file() for p in target.parents) or target.is_dir():
            continue  # a file where a directory would be, or the reverse
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(b"x")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        tree = walk(fd).tree
    finally:
        os.close(fd)
    expected = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}
    assert count_files(tree) == len(expected)
    files = files_of(tree)
    assert len(files) == len(expected) and set(files) == expected
    for rel in [*asked, *made, "", "a/", "/a"]:
        assert (rel in files) == (rel in expected)


def test_counters_count_each_file_once() -> None:
    """Covered files, transferred ones (also when no longer in the tree), failures of
    planned or unreadable files not transferred, and the rest unchanged."""
    stats = Stats()
    for path in ("new", "gone-since"):
        stats.file_done(path, m.Done(ok=True, how="whole", literal=3))
    stats.failed += [("broken", "io: no"), ("dir/", "mkdir: no"), ("unread", "cannot read")]
    stats.settle({"new", "broken", "same", "unread"}, ["new", "gone-since", "broken"],
                 ["unread"])
    assert (stats.files_total, stats.files_transferred, stats.files_failed,
            stats.files_unchanged) == (5, 2, 2, 1)
