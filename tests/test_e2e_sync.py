"""End to end: ``rdc push`` and ``rdc pull`` against a real ``rdc serve`` keep trees in
step, entry for entry: contents, kinds, permission bits, mtimes to the nanosecond (files,
directories, links), links as links, empty directories, names that are not UTF-8; and
they send little for what the other side already has."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from .conftest import scaled
from .e2e_support import (
    E2E,
    Server,
    assert_same_tree,
    random_file,
    snapshot,
    stamp_times,
    temporaries,
    tree_diff,
    write,
)

BIG = scaled(2 << 20, 256 << 10)  # a file of many chunks
QUIET = 10_000  # bytes a run with nothing to do may put on the wire, each way


def build_tree(root: Path, outside: Path) -> None:
    """A tree with one of everything rdc syncs."""
    root.mkdir()
    write(root / "a.txt", b"hello, world\n" * 10, 0o644)
    write(root / "run.sh", b"#!/bin/sh\necho hi\n", 0o755)
    write(root / "secret", b"s" * 300, 0o600)
    write(root / "zero", b"", 0o640)
    write(root / "tiny255", b"t" * 255)
    write(root / "tiny256", b"u" * 256)
    (root / "data" / "nested" / "deep").mkdir(parents=True)
    random_file(root / "data" / "big.bin", BIG, seed=1)
    random_file(root / "data" / "other.bin", BIG // 2, seed=2)
    write(root / "data" / "nested" / "deep" / "leaf.txt", b"leaf\n" * 1000)
    (root / "empty").mkdir(mode=0o750)
    (root / "empty").chmod(0o750)
    (root / "sticky").mkdir()
    (root / "sticky").chmod(0o1777)
    (root / "private").mkdir()
    write(root / "private" / "key", b"k" * 2000, 0o400)
    (root / "private").chmod(0o700)
    links = root / "links"
    links.mkdir()
    os.symlink("../a.txt", links / "rel")
    os.symlink("/etc/hostname", links / "abs")
    os.symlink("nowhere/at/all", links / "dangling")
    os.symlink(os.path.relpath(outside, links), links / "out")  # a directory outside
    os.symlink(str(outside / "secret.txt"), links / "out-file")
    os.symlink("../data", links / "dirlink")
    raw = os.fsencode(root)
    write(raw + b"/caf\xe9.txt", b"latin-1 name\n")
    os.mkdir(raw + b"/d\xff\xfe")
    write(raw + b"/d\xff\xfe/\x80\x81", b"x" * 5000)
    os.symlink(b"t\xe9rget", raw + b"/l\xe9")
    write(root / ("n" * 255), b"the longest name there is; its temporary name is cut\n")
    stamp_times(root, seed=7)


def make_outside(tmp: Path) -> Path:
    outside = tmp / "outside"
    outside.mkdir()
    write(outside / "secret.txt", b"not to be synced\n")
    return outside


def test_push_then_pull_carry_every_kind_of_entry_exactly(e2e: E2E) -> None:
    outside = make_outside(e2e.tmp)
    before_outside = snapshot(outside)
    src = e2e.tmp / "src"
    build_tree(src, outside)
    share = e2e.tmp / "share"
    share.mkdir()
    server = e2e.serve({"s": share})

    pushed = e2e.push(src, server.url("s"), "-v").ok()
    entries = assert_same_tree(src, share)
    listed = pushed.raw_stdout.splitlines()
    assert b"send caf\xe9.txt" in listed and b"send d\xff\xfe/\x80\x81" in listed, listed
    assert b"link l\xe9 -> t\xe9rget" in listed and b"create empty/" in listed, listed
    files = sum(1 for n in entries.values() if n.kind == "f")
    assert pushed.stats["files_total"] == files
    assert pushed.stats["files_transferred"] == files
    assert pushed.stats["in_step"] is True
    assert pushed.stats["errors"] == []
    assert pushed.stats["literal_bytes"] >= BIG + BIG // 2
    assert pushed.stats["bytes_sent"] > BIG  # (compression cannot shrink random data)
    assert pushed.stats["seconds"] > 0
    # Links were copied as links: nothing of what they point to came along.
    assert os.readlink(share / "links" / "out") == os.readlink(src / "links" / "out")
    assert not (share / "links" / "secret.txt").exists()

    again = e2e.push(src, server.url("s")).ok()
    assert again.stats["files_transferred"] == 0
    assert again.stats["literal_bytes"] == 0
    assert again.stats["bytes_sent"] < QUIET and again.stats["bytes_received"] < QUIET
    assert again.stats["in_step"] is True

    dst = e2e.tmp / "dst"
    pulled = e2e.pull(server.url("s"), dst).ok()
    assert_same_tree(share, dst)
    assert pulled.stats["files_transferred"] == files
    assert pulled.stats["in_step"] is True
    assert pulled.stats["bytes_received"] > BIG

    again = e2e.pull(server.url("s"), dst).ok()
    assert again.stats["files_transferred"] == 0
    assert again.stats["bytes_sent"] < QUIET and again.stats["bytes_received"] < QUIET
    assert_same_tree(src, dst)
    assert snapshot(outside) == before_outside
    assert not temporaries(e2e.tmp)


def edit(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def change_tree(root: Path) -> dict[str, list[str]]:
    """Edits, a rename, a copy, deletions, mode and type changes; returns the paths
    deleted (``gone``) and those made from content the other side already holds."""
    edit(root / "data" / "big.bin", BIG // 3, b"EDIT" * 4)
    edit(root / "data" / "big.bin", 2 * BIG // 3, b"more")
    with open(root / "a.txt", "ab") as f:
        f.write(b"appended\n")
    (root / "moved").mkdir()
    os.rename(root / "data" / "other.bin", root / "moved" / "renamed.bin")
    shutil.copyfile(root / "data" / "big.bin", root / "copy.bin")
    edit(root / "copy.bin", 10, b"copy-edit")
    shutil.copyfile(root / "private" / "key", root / "key-copy")
    os.unlink(root / "tiny255")
    shutil.rmtree(root / "data" / "nested")
    os.chmod(root / "run.sh", 0o700)
    os.chmod(root / "sticky", 0o755)
    os.unlink(root / "links" / "rel")
    os.symlink("../run.sh", root / "links" / "rel")  # same name, new target
    os.unlink(root / "secret")
    (root / "secret").mkdir()  # file -> directory
    write(root / "secret" / "inside", b"now a directory")
    shutil.rmtree(root / "empty")
    write(root / "empty", b"now a file")  # directory -> file
    os.unlink(root / "links" / "dangling")
    (root / "links" / "dangling").mkdir()  # link -> directory
    os.unlink(root / "tiny256")
    os.symlink("a.txt", root / "tiny256")  # file -> link
    raw = os.fsencode(root)
    os.rename(raw + b"/caf\xe9.txt", raw + b"/d\xff\xfe/caf\xe9-moved.txt")
    stamp_times(root, seed=8)
    return {
        "gone": ["tiny255", "data/nested", "data/other.bin", os.fsdecode(b"caf\xe9.txt")],
        "reused": ["moved/renamed.bin", "key-copy"],
    }


def check_extras_kept(source: Path, target: Path, gone: list[str], times: bool = True) -> None:
    """Without --delete: the target holds everything of the source exactly (``times``:
    mtimes included), plus what the source deleted or moved away."""
    for rel in gone:
        assert os.path.lexists(target / rel), f"{rel} was deleted without --delete"
    kept = {os.fsencode(rel) for rel in gone}
    theirs = snapshot(target, lambda rel: any(rel == k or rel.startswith(k + b"/")
                                              for k in kept))
    mine = snapshot(source)
    if not times:
        mine = {rel: replace(n, mtime_ns=0) for rel, n in mine.items()}
        theirs = {rel: replace(n, mtime_ns=0) for rel, n in theirs.items()}
    diff = tree_diff(mine, theirs)
    assert not diff, "\n".join(diff)


def test_push_of_changes_sends_little_and_deletes_only_with_delete(e2e: E2E) -> None:
    outside = make_outside(e2e.tmp)
    src = e2e.tmp / "src"
    build_tree(src, outside)
    share = e2e.tmp / "share"
    share.mkdir()
    server = e2e.serve({"s": share})
    e2e.push(src, server.url("s")).ok()
    changes = change_tree(src)

    pushed = e2e.push(src, server.url("s")).ok()
    check_extras_kept(src, share, changes["gone"], times=True)
    stats = pushed.stats
    assert stats["errors"] == []
    assert stats["files_copied_locally"] >= 2  # the rename and the exact copy
    assert stats["literal_bytes"] < BIG // 8, stats  # edits, not whole files
    assert stats["matched_bytes"] >= BIG + BIG // 2  # big.bin, copy.bin, renamed.bin
    assert stats["bytes_sent"] < stats["literal_bytes"] + 64 * 1024
    assert stats["in_step"] is False  # the extras are still there
    assert stats["deleted"] == 0

    deleted = e2e.push(src, server.url("s"), "--delete").ok()
    assert_same_tree(src, share)
    assert deleted.stats["in_step"] is True
    assert deleted.stats["deleted"] == len(changes["gone"])
    assert deleted.stats["literal_bytes"] == 0
    assert not temporaries(e2e.tmp)


def test_pull_of_changes_sends_little_and_deletes_only_with_delete(e2e: E2E) -> None:
    outside = make_outside(e2e.tmp)
    share = e2e.tmp / "share"
    build_tree(share, outside)
    server = e2e.serve({"s": share})
    dst = e2e.tmp / "dst"
    e2e.pull(server.url("s"), dst).ok()
    assert_same_tree(share, dst)
    changes = change_tree(share)  # changed on the server meanwhile

    pulled = e2e.pull(server.url("s"), dst).ok()
    check_extras_kept(share, dst, changes["gone"], times=False)
    stats = pulled.stats
    assert stats["errors"] == []
    assert stats["files_copied_locally"] >= 2
    assert stats["literal_bytes"] < BIG // 8, stats
    assert stats["matched_bytes"] >= BIG + BIG // 2
    assert stats["bytes_received"] < stats["literal_bytes"] + 64 * 1024
    assert stats["deleted"] == 0

    deleted = e2e.pull(server.url("s"), dst, "--delete").ok()
    assert_same_tree(share, dst)
    assert deleted.stats["in_step"] is True
    assert deleted.stats["deleted"] == len(changes["gone"])
    assert not temporaries(e2e.tmp)


def _pushed_and_pulled(e2e: E2E, src: Path) -> tuple[Path, Server, Path]:
    """A share served with ``src`` pushed into it and pulled from it into dst."""
    share = e2e.tmp / "share"
    share.mkdir()
    server = e2e.serve({"s": share})
    e2e.push(src, server.url("s")).ok()
    dst = e2e.tmp / "dst"
    e2e.pull(server.url("s"), dst).ok()
    return share, server, dst


def test_a_rename_costs_no_literal_bytes_either_way(e2e: E2E) -> None:
    src = e2e.tmp / "src"
    (src / "a").mkdir(parents=True)
    random_file(src / "a" / "file.bin", BIG, seed=3)
    share, server, dst = _pushed_and_pulled(e2e, src)

    (src / "b").mkdir()
    os.rename(src / "a" / "file.bin", src / "b" / "renamed.bin")
    pushed = e2e.push(src, server.url("s"), "--delete").ok()
    assert_same_tree(src, share)
    assert pushed.stats["literal_bytes"] == 0
    assert pushed.stats["files_transferred"] == 1
    assert pushed.stats["files_copied_locally"] == 1
    assert pushed.stats["matched_bytes"] == BIG
    assert pushed.stats["bytes_sent"] < QUIET

    pulled = e2e.pull(server.url("s"), dst, "--delete").ok()
    assert_same_tree(share, dst)
    assert pulled.stats["literal_bytes"] == 0
    assert pulled.stats["files_copied_locally"] == 1
    assert pulled.stats["bytes_received"] < QUIET


def _moves(result) -> set[str]:
    events = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    return {e["path"] for e in events if e["type"] == "file" and e["how"] == "move"}


def test_renamed_files_are_moved_by_the_receiver_with_delete(e2e: E2E) -> None:
    """Files renamed or moved at the source are moved at the receiver (the same inodes, no
    content sent or read again) by a push or pull with --delete; an edited one is sent.
    Without --delete the old names stay, so the new ones are copies."""
    src = e2e.tmp / "src"
    for d in ("a", "b"):
        (src / d).mkdir(parents=True)
        for i in range(10):
            write(src / d / f"f{i}.txt", f"file {d}{i}\n".encode() * (50 + i))
    random_file(src / "a" / "big.bin", BIG, seed=4)
    share, server, dst = _pushed_and_pulled(e2e, src)
    inodes = {p: (share / p).stat().st_ino for p in ("a/f1.txt", "a/f2.txt", "a/big.bin")}

    (src / "c").mkdir()
    os.rename(src / "a" / "f1.txt", src / "a" / "renamed.txt")  # in its directory
    os.rename(src / "a" / "f2.txt", src / "c" / "f2.txt")  # to a new one
    os.rename(src / "a" / "big.bin", src / "b" / "big.bin")
    os.rename(src / "b" / "f3.txt", src / "b" / "g3.txt")
    with open(src / "b" / "g3.txt", "ab") as f:
        f.write(b"edited after the rename\n")
    pushed = e2e.push(src, server.url("s"), "--delete", "--json").ok()
    assert_same_tree(src, share)
    assert _moves(pushed) == {"a/renamed.txt", "c/f2.txt", "b/big.bin"}
    assert (share / "a" / "renamed.txt").stat().st_ino == inodes["a/f1.txt"]
    assert (share / "c" / "f2.txt").stat().st_ino == inodes["a/f2.txt"]
    assert (share / "b" / "big.bin").stat().st_ino == inodes["a/big.bin"]
    summary = json.loads(pushed.stdout.splitlines()[-1])
    assert summary["files_transferred"] == 4 and summary["files_copied_locally"] == 3
    assert summary["deleted"] == 1  # b/f3.txt: its new self was edited, so sent
    assert summary["literal_bytes"] < 2_000

    before = {p: (dst / p).stat().st_ino for p in ("a/f1.txt", "a/big.bin")}
    pulled = e2e.pull(server.url("s"), dst, "--delete", "--json").ok()
    assert_same_tree(share, dst)
    assert _moves(pulled) == {"a/renamed.txt", "c/f2.txt", "b/big.bin"}
    assert (dst / "a" / "renamed.txt").stat().st_ino == before["a/f1.txt"]
    assert (dst / "b" / "big.bin").stat().st_ino == before["a/big.bin"]

    os.rename(src / "a" / "f4.txt", src / "a" / "kept.txt")
    copied = e2e.push(src, server.url("s"), "--json").ok()
    assert _moves(copied) == set()
    assert (share / "a" / "f4.txt").exists() and (share / "a" / "kept.txt").exists()

    os.rename(src / "a" / "f5.txt", src / "a" / "held.txt")  # a guard holds deletions back:
    held = e2e.push(src, server.url("s"), "--delete", "--max-delete", "0", "--json")
    assert held.returncode == 7 and _moves(held) == set()  # ... and the move with them
    assert (share / "a" / "f5.txt").exists() and (share / "a" / "held.txt").exists()


def test_mtime_and_mode_changes_alone_travel_without_content(e2e: E2E) -> None:
    src = e2e.tmp / "src"
    (src / "d" / "e").mkdir(parents=True)
    random_file(src / "d" / "f.bin", BIG, seed=4)
    os.symlink("f.bin", src / "d" / "link")
    stamp_times(src, seed=1)
    share = e2e.tmp / "share"
    share.mkdir()
    server = e2e.serve({"s": share})
    e2e.push(src, server.url("s")).ok()

    stamp_times(src, seed=2)  # every time changes, nothing else
    os.chmod(src / "d" / "f.bin", 0o600)
    os.chmod(src / "d" / "e", 0o711)
    pushed = e2e.push(src, server.url("s")).ok()
    assert_same_tree(src, share)
    assert pushed.stats["literal_bytes"] == 0
    assert pushed.stats["files_transferred"] == 0
    assert pushed.stats["bytes_sent"] < QUIET

    dst = e2e.tmp / "dst"
    e2e.pull(server.url("s"), dst).ok()
    stamp_times(share, seed=3)
    os.chmod(share / "d" / "f.bin", 0o644)
    pulled = e2e.pull(server.url("s"), dst).ok()
    assert_same_tree(share, dst)
    assert pulled.stats["literal_bytes"] == 0
    assert pulled.stats["bytes_received"] < QUIET


def test_the_target_never_writes_through_its_own_symlinks(e2e: E2E) -> None:
    """Where the source has a directory and the target a link to somewhere outside, the
    target replaces the link; it never writes into what the link points to."""
    outside = make_outside(e2e.tmp)
    before = snapshot(outside)
    src = e2e.tmp / "src"
    (src / "d").mkdir(parents=True)
    write(src / "d" / "secret.txt", b"overwritten?\n")
    write(src / "d" / "new.txt", b"planted?\n")
    share = e2e.tmp / "share"
    share.mkdir()
    os.symlink(outside, share / "d")
    server = e2e.serve({"s": share})

    e2e.push(src, server.url("s")).ok()
    assert snapshot(outside) == before
    assert_same_tree(src, share)

    dst = e2e.tmp / "dst"
    dst.mkdir()
    os.symlink(outside, dst / "d")
    e2e.pull(server.url("s"), dst).ok()
    assert snapshot(outside) == before
    assert_same_tree(share, dst)


def test_pull_without_delete_still_syncs_times(e2e: E2E) -> None:
    share = e2e.tmp / "share"
    (share / "d").mkdir(parents=True)
    write(share / "d" / "f", b"content")
    server = e2e.serve({"s": share})
    dst = e2e.tmp / "dst"
    e2e.pull(server.url("s"), dst).ok()
    write(dst / "extra", b"only here")
    stamp_times(share, seed=5)  # only times change on the server
    e2e.pull(server.url("s"), dst).ok()
    check_extras_kept(share, dst, ["extra"], times=True)




@pytest.mark.parametrize("direction", ["push", "pull"])
def test_read_only_directories_with_content_arrive(e2e: E2E, direction: str) -> None:
    e2e.unprivileged()
    src = e2e.tmp / "src"
    (src / "ro" / "sub").mkdir(parents=True)
    write(src / "ro" / "f.txt", b"in a read-only directory\n")
    write(src / "ro" / "sub" / "g.txt", b"deeper\n", 0o444)
    for d in (src / "ro" / "sub", src / "ro"):
        d.chmod(0o555)
    stamp_times(src, seed=9)
    share = e2e.tmp / "share"
    share.mkdir()
    dst = e2e.tmp / "dst"
    try:
        if direction == "push":
            server = e2e.serve({"s": share})
            e2e.push(src, server.url("s")).ok()
            assert_same_tree(src, share)
        else:
            server = e2e.serve({"s": src})
            e2e.pull(server.url("s"), dst).ok()
            assert_same_tree(src, dst)
    finally:
        for root in (src, share, dst):  # let pytest clean up, whoever runs it
            for dirpath, _, _ in os.walk(root):
                os.chmod(dirpath, 0o755)




def deep_tree(root: Path) -> bytes:
    """A file 16 directories of 250-byte names down: a relative path of about 4,000 bytes
    (within the protocol's limit). Returns it."""
    root.mkdir(parents=True)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    parts = []
    try:
        for n in range(16):
            name = b"d%02d" % n + b"x" * 247
            os.mkdir(name, dir_fd=fd)
            step = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = step
            parts.append(name)
        out = os.open("deep.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(out, b"at the bottom\n")
        os.close(out)
    finally:
        os.close(fd)
    return b"/".join([*parts, b"deep.txt"])


@pytest.mark.parametrize("direction", ["push", "pull"])
def test_paths_longer_than_path_max_with_their_root_are_synced(
    e2e: E2E, direction: str
) -> None:
    source = e2e.tmp / ("L" * 200) / "source"  # a long root makes the absolute path long
    rel = deep_tree(source)
    assert len(os.fsencode(source)) + 1 + len(rel) > 4096 >= len(rel)
    target = e2e.tmp / "target"
    target.mkdir()
    if direction == "push":
        server = e2e.serve({"s": target})
        e2e.push(source, server.url("s")).ok()
    else:
        server = e2e.serve({"s": source})
        e2e.pull(server.url("s"), target).ok()
    assert rel in snapshot(target)
    assert_same_tree(source, target)




def test_unreadable_source_entries_are_reported(e2e: E2E) -> None:
    e2e.unprivileged()
    src = e2e.tmp / "src"
    (src / "closed").mkdir(parents=True)
    write(src / "ok.txt", b"readable\n")
    write(src / "unreadable.txt", b"secret\n", 0o000)
    write(src / "closed" / "inside.txt", b"in a directory that cannot be listed\n")
    (src / "closed").chmod(0o000)
    share = e2e.tmp / "share"
    share.mkdir()
    server = e2e.serve({"s": share})
    try:
        result = e2e.push(src, server.url("s"))
    finally:
        (src / "closed").chmod(0o755)
    assert (share / "ok.txt").read_bytes() == b"readable\n"  # the rest was done
    assert result.returncode == 3, result
    assert "unreadable.txt" in result.stderr and "closed" in result.stderr, result
    assert result.stats is not None and len(result.stats["errors"]) == 2, result.stats


def top_of(path: Path) -> tuple[int, int]:
    st = os.lstat(path)
    return st.st_mode & 0o7777, st.st_mtime_ns


def test_the_opened_directory_gets_its_own_mode_and_time(e2e: E2E) -> None:
    """As with ``rsync -a SRC/ DST/``: the directory a push or pull opened ends with the
    mode and mtime of the source's, so a 0700 directory stays private, but a share's own
    top directory is left as whoever set up the share made it."""
    src = e2e.tmp / "src"
    (src / "d").mkdir(parents=True)
    write(src / "d" / "f.txt", b"private\n", 0o600)
    stamp_times(src, seed=5)
    src.chmod(0o700)
    os.utime(src, ns=(1_500_000_000_123_456_789, 1_500_000_000_123_456_789))
    share, other = e2e.tmp / "share", e2e.tmp / "other"
    share.mkdir()
    other.mkdir()
    other.chmod(0o755)
    other_top = top_of(other)
    server = e2e.serve({"s": share, "t": other})

    # Into a directory inside the share: created, then given the source's mode and time.
    pushed = e2e.push(src, server.url("s", "backup")).ok()
    assert pushed.stats["in_step"] is True
    assert top_of(share / "backup") == top_of(src)
    assert_same_tree(src, share / "backup")

    # Only the top directory's time changed: that alone travels, and nothing else.
    os.utime(src, ns=(1_600_000_000_000_000_007, 1_600_000_000_000_000_007))
    src.chmod(0o750)
    dry = e2e.push(src, server.url("s", "backup"), "--dry-run").ok()
    assert dry.stdout.split() == ["would", "chmod", ".", "would", "touch", "."]
    assert top_of(share / "backup") != top_of(src)
    again = e2e.push(src, server.url("s", "backup")).ok()
    assert again.stats["in_step"] is True and again.stats["bytes_sent"] < QUIET
    assert top_of(share / "backup") == top_of(src)
    quiet = e2e.push(src, server.url("s", "backup")).ok()
    assert quiet.stats["in_step"] is True and quiet.stdout == ""

    # Into a share itself: the content arrives, the share's own directory is not set.
    pushed = e2e.push(src, server.url("t")).ok()
    assert pushed.stats["in_step"] is True
    assert (other / "d" / "f.txt").read_bytes() == b"private\n"
    # (its time moved, as the entries were made in it, but rdc did not set it)
    assert top_of(other)[0] == other_top[0] and top_of(other)[1] != top_of(src)[1]
    assert e2e.push(src, server.url("t"), "--dry-run").ok().stdout == ""

    # A pull gives the local directory the remote one's mode and time, a new one included.
    (share / "backup").chmod(0o711)
    os.utime(share / "backup", ns=(1_400_000_000_000_000_001, 1_400_000_000_000_000_001))
    dst = e2e.tmp / "dst"
    pulled = e2e.pull(server.url("s", "backup"), dst).ok()
    assert pulled.stats["in_step"] is True
    assert top_of(dst) == top_of(share / "backup")
    os.utime(dst, ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_000))
    pulled = e2e.pull(server.url("s", "backup"), dst).ok()
    assert pulled.stats["in_step"] is True and pulled.stats["bytes_received"] < QUIET
    assert top_of(dst) == top_of(share / "backup")


def test_many_new_directories_and_entries_of_another_kind_arrive_both_ways(e2e: E2E) -> None:
    """Hundreds of new directories, files in each: the prelude of removals and directories
    goes in stages while the files already go (`rdc.transfer.made_dirs`), each file once
    the stage that makes its directory, or removes what was at its path, is done."""
    src = e2e.tmp / "src"
    for n in range(100):  # 300 directories: stages of 64, 128 and the rest
        (src / f"d{n:03}" / "sub" / "leaf").mkdir(parents=True)
        write(src / f"d{n:03}" / "sub" / "leaf" / "f.txt", f"file {n}\n".encode() * 20)
    (src / "kind" / "was-file").mkdir(parents=True)
    write(src / "kind" / "was-file" / "inside.txt", b"a directory where a file was\n")
    write(src / "kind" / "was-dir", b"a file where a directory was\n")
    stamp_times(src, seed=3)
    share, dst = e2e.tmp / "share", e2e.tmp / "dst"
    for side in (share, dst):
        (side / "kind" / "was-dir" / "deep").mkdir(parents=True)
        write(side / "kind" / "was-file", b"the old file\n")
        write(side / "kind" / "was-dir" / "deep" / "old.txt", b"an old file below\n")
    server = e2e.serve({"s": share})

    pushed = e2e.push(src, server.url("s"), "--json").ok()
    assert_same_tree(src, share)
    summary = json.loads(pushed.stdout.splitlines()[-1])
    assert summary["dirs_created"] == 301 and summary["files_transferred"] == 102
    pulled = e2e.pull(server.url("s"), dst, "--json").ok()
    assert_same_tree(share, dst)
    assert json.loads(pulled.stdout.splitlines()[-1])["dirs_created"] == 301
    assert not temporaries(share) and not temporaries(dst)
