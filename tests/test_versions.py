"""Versions: names, retention (property tests), and the keeper that SafeRoot calls before it
replaces or removes an entry."""

from __future__ import annotations

import calendar
import errno
import itertools
import os
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rdc.errors import UsageError
from rdc.local import versions as v
from rdc.local.fs import Expect, SafeRoot
from rdc.local.versions import Retention, VersionStore, parse_version_name, version_name

NOW = 1_800_000_000.0
names = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="/\0"), min_size=1,
    max_size=60,
).filter(lambda n: n not in (".", "..") and len(os.fsencode(n)) <= 200)


# ---------------------------------------------------------------- names and policies


@given(names, st.floats(0, 4e9), st.integers(1, 50))
def test_a_version_name_gives_back_the_name_and_the_time(name: str, when: float, n: int) -> None:
    parsed = parse_version_name(version_name(name, when, n))
    assert parsed == (name, float(int(when)), n)


def test_a_version_name_keeps_the_extension_last() -> None:
    when = float(calendar.timegm((2026, 11, 22, 19, 30, 11)))
    assert version_name("report.txt", when) == "report~20261122-193011.txt"
    assert version_name("report.txt", when, 2) == "report~20261122-193011-2.txt"
    assert version_name(".bashrc", when) == ".bashrc~20261122-193011"
    assert parse_version_name("report.txt") is None


def test_a_long_name_is_shortened_to_fit() -> None:
    name = "x" * 250 + ".txt"
    out = version_name(name, NOW)
    assert len(out.encode()) <= 255 and out.endswith(".txt")
    assert version_name("y" * 250 + ".txt", NOW) != out


@pytest.mark.parametrize(("text", "kind", "count", "days"), [
    ("5", "keep", 5, 365), ("keep:3", "keep", 3, 365), ("staggered", "staggered", 0, 365),
    ("staggered:30", "staggered", 0, 30), ("all", "all", 0, 365), (7, "keep", 7, 365),
])
def test_policies_parse(text: str | int, kind: str, count: int, days: float) -> None:
    policy = Retention.parse(text)
    assert (policy.kind, policy.count, policy.max_days) == (kind, count, days)


@pytest.mark.parametrize("text", ["0", "keep:", "keep:x", "staggered:-1", "forever", "all:3"])
def test_bad_policies_are_usage_errors(text: str) -> None:
    with pytest.raises(UsageError, match="bad versions policy"):
        Retention.parse(text)


stamp_lists = st.lists(st.floats(NOW - 800 * v.DAY, NOW), max_size=60)


@given(stamp_lists, st.integers(1, 10))
def test_keep_n_keeps_the_newest_n(stamps: list[float], n: int) -> None:
    doomed = Retention("keep", count=n).doomed(stamps, NOW)
    kept = [s for i, s in enumerate(stamps) if i not in doomed]
    assert len(kept) == min(n, len(stamps))
    assert sorted(kept) == sorted(stamps)[len(stamps) - len(kept):]


@given(stamp_lists, st.sampled_from([30.0, 365.0]))
def test_staggered_thins_by_age_and_is_stable(stamps: list[float], days: float) -> None:
    policy = Retention("staggered", max_days=days)
    doomed = policy.doomed(stamps, NOW)
    kept = sorted((s for i, s in enumerate(stamps) if i not in doomed), reverse=True)
    young = [s for s in stamps if NOW - s <= days * v.DAY]
    if young:
        assert kept and kept[0] == max(young)  # the newest is always kept
    assert all(NOW - s <= days * v.DAY for s in kept)
    for newer, older in itertools.pairwise(kept):
        assert newer - older >= v.stagger_step(NOW - older)
    assert policy.doomed(kept, NOW) == set()  # pruning again removes nothing


def test_staggered_keeps_one_per_step() -> None:
    stamps = [NOW - 10 * i for i in range(360)]  # one every 10 s for an hour
    kept = len(stamps) - len(Retention("staggered").doomed(stamps, NOW))
    assert 110 <= kept <= 130  # about one per 30 s


# ---------------------------------------------------------------- the keeper


@pytest.fixture
def tree(tmp_path: Path):
    root = tmp_path / "tree"
    root.mkdir()
    fs = SafeRoot(str(root))
    store = VersionStore(tmp_path / "store", str(root))
    fs.keeper = store.keeper()
    yield root, fs, store
    fs.close()


def replace(fs: SafeRoot, rel: str, data: bytes, expect: Expect | None = None) -> None:
    with fs.create_temp(rel) as temp:
        temp.write(data)
        temp.commit(0o644, time.time_ns(), expect)


def test_an_overwritten_file_is_kept(tree) -> None:
    root, fs, store = tree
    (root / "a.txt").write_bytes(b"old")
    os.utime(root / "a.txt", ns=(10**18, 10**18))
    replace(fs, "a.txt", b"new")
    assert (root / "a.txt").read_bytes() == b"new"
    [kept] = store.versions()
    assert kept.path == "a.txt" and kept.location.read_bytes() == b"old"
    assert kept.mtime_ns == 10**18 and abs(kept.kept - time.time()) < 60
    assert not (root / ".rdc-versions").exists()  # nothing is added to the tree


def test_removed_files_and_trees_are_kept(tree) -> None:
    root, fs, store = tree
    (root / "d" / "e").mkdir(parents=True)
    (root / "d" / "one").write_bytes(b"1")
    (root / "d" / "e" / "two").write_bytes(b"2")
    os.symlink("one", root / "d" / "link")
    (root / "f").write_bytes(b"f")
    assert fs.remove("f") and fs.remove("d")
    found = {k.path: k.location.read_bytes() for k in store.versions()}
    assert found == {"d/one": b"1", "d/e/two": b"2", "f": b"f"}
    assert [k.path for k in store.versions("d")] == ["d/e/two", "d/one"]
    assert [k.path for k in store.versions("d/one")] == ["d/one"]


def test_new_files_and_links_keep_nothing(tree) -> None:
    _root, fs, store = tree
    replace(fs, "new.txt", b"first", Expect.absent())
    fs.symlink("l", "target")
    fs.symlink("l", "other")
    assert store.versions() == []


def test_keep_n_prunes_as_it_keeps(tree) -> None:
    _root, fs, store = tree
    store.retention = Retention("keep", count=2)
    for i in range(5):
        replace(fs, "a", b"v%d" % i)
    assert [k.location.read_bytes() for k in store.versions("a")] == [b"v2", b"v3"]


def test_only_and_prefix_choose_what_is_kept(tmp_path: Path) -> None:
    root = tmp_path / "share" / "sub"
    root.mkdir(parents=True)
    (root / "x").write_bytes(b"x")
    (root / "y").write_bytes(b"y")
    (root / "d").mkdir()
    (root / "d" / "in").write_bytes(b"in")
    (root / "d" / "out").write_bytes(b"out")
    store = VersionStore(tmp_path / "store", str(tmp_path / "share"))
    with SafeRoot(str(root)) as fs:
        fs.keeper = store.keeper(prefix="sub", only=lambda p: p in ("sub/x", "sub/d/in"))
        fs.remove("x")
        fs.remove("y")
        fs.remove("d")
    assert [k.path for k in store.versions()] == ["sub/d/in", "sub/x"]


def test_another_device_means_a_copy(tree, monkeypatch) -> None:
    root, fs, store = tree
    (root / "a").write_bytes(b"old content")
    os.chmod(root / "a", 0o640)

    def cross_device(*args, **kwargs):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(v.os, "link", cross_device)
    replace(fs, "a", b"new")
    [kept] = store.versions()
    assert kept.location.read_bytes() == b"old content" and kept.mode == 0o640
    assert store.copies == 1


def test_a_version_that_cannot_be_kept_stops_the_change(tree) -> None:
    root, fs, store = tree
    (root / "a").write_bytes(b"precious")
    store.location.write_bytes(b"a file where the store should be")
    with pytest.raises(v.VersionKeepError, match="cannot keep a version of a"):
        replace(fs, "a", b"new")
    with pytest.raises(v.VersionKeepError):
        fs.remove("a")
    assert (root / "a").read_bytes() == b"precious"
    assert sorted(os.listdir(root)) == ["a"]  # no temporary left either


def test_restore_brings_a_version_back_and_keeps_the_current_one(tree, tmp_path: Path) -> None:
    root, fs, store = tree
    (root / "a").write_bytes(b"first")
    replace(fs, "a", b"second")
    [first] = store.versions("a")
    v.restore(first, fs, "a")
    assert (root / "a").read_bytes() == b"first"
    assert [k.location.read_bytes() for k in store.versions("a")] == [b"first", b"second"]
    v.restore(first, fs, "elsewhere/a")
    assert (root / "elsewhere" / "a").read_bytes() == b"first"
    v.restore_to(first, str(tmp_path / "out"))
    assert (tmp_path / "out").read_bytes() == b"first"
    with pytest.raises(FileExistsError):
        v.restore_to(first, str(tmp_path / "out"))


def test_a_store_is_found_again_by_its_marker(tree, tmp_path: Path) -> None:
    root, fs, store = tree
    (root / "a").write_bytes(b"1")
    fs.remove("a")
    again = VersionStore.existing(store.location)
    assert again.root == str(root) and [k.path for k in again.versions()] == ["a"]
    with pytest.raises(UsageError, match="no versions"):
        VersionStore.existing(tmp_path / "nowhere")
