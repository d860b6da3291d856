"""End to end: a tree hard-linked into snapshots on the server (``cp -al current snapA``,
the rsnapshot way) is never changed through its links by a push: content, modes and times
of the snapshot stay as they were, whatever the push changes in the live tree."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from .e2e_support import E2E, assert_same_tree, random_file, snapshot, stamp_times, write


def make_tree(root: Path) -> None:
    (root / "docs" / "deep").mkdir(parents=True)
    write(root / "a.txt", b"first version\n" * 50, 0o644)
    write(root / "docs" / "b.txt", b"bee\n" * 2000, 0o600)
    write(root / "docs" / "deep" / "c.txt", b"sea\n" * 10, 0o640)
    random_file(root / "big.bin", 300_000, seed=5)
    write(root / "same.txt", b"unchanged\n")
    os.symlink("a.txt", root / "link")
    stamp_times(root, seed=11)


def test_a_hard_linked_snapshot_is_never_changed_through_its_links(e2e: E2E) -> None:
    src, top = e2e.tmp / "src", e2e.tmp / "srv"
    make_tree(src)
    current, snap = top / "current", top / "snapA"
    current.mkdir(parents=True)
    server = e2e.serve({"s": current})
    e2e.push(src, server.url("s")).ok()
    subprocess.run(["cp", "-al", str(current), str(snap)], check=True, timeout=30)
    frozen = snapshot(snap)
    assert os.stat(snap / "a.txt").st_nlink == 2

    # Metadata only: modes and times of every entry, the link's time too.
    for name, mode in (("a.txt", 0o600), ("docs/b.txt", 0o644), ("same.txt", 0o444)):
        os.chmod(src / name, mode)
    stamp_times(src, seed=12)
    e2e.push(src, server.url("s")).ok()
    assert_same_tree(src, current)
    assert snapshot(snap) == frozen

    # Content: edits in place, a file replaced, one deleted, one new.
    with open(src / "big.bin", "r+b") as f:
        f.seek(1000)
        f.write(b"edited")
    write(src / "a.txt", b"second version\n" * 50, 0o644)
    os.unlink(src / "docs" / "deep" / "c.txt")
    write(src / "new.txt", b"new\n")
    stamp_times(src, seed=13)
    e2e.push(src, server.url("s"), "--delete").ok()
    assert_same_tree(src, current)
    assert snapshot(snap) == frozen


def test_pull_and_sync_leave_a_local_snapshot_alone(e2e: E2E) -> None:
    """The same on the client: a pull or a two-way sync into a tree that has a hard-linked
    snapshot beside it changes the tree, never the snapshot."""
    share, local, snap = e2e.tmp / "share", e2e.tmp / "local", e2e.tmp / "snap"
    make_tree(share)
    server = e2e.serve({"s": share})
    e2e.pull(server.url("s"), local).ok()
    subprocess.run(["cp", "-al", str(local), str(snap)], check=True, timeout=30)
    frozen = snapshot(snap)

    os.chmod(share / "a.txt", 0o600)
    stamp_times(share, seed=21)
    with open(share / "docs" / "b.txt", "ab") as f:
        f.write(b"more\n")
    e2e.pull(server.url("s"), local, "--delete").ok()
    assert_same_tree(share, local)
    assert snapshot(snap) == frozen

    e2e.rdc("sync", str(local), server.url("s"), "--token-file", str(e2e.token_file)).ok()
    os.chmod(share / "same.txt", 0o600)
    os.utime(share / "docs" / "deep" / "c.txt", ns=(1_600_000_000 * 10**9,) * 2)
    e2e.rdc("sync", str(local), server.url("s"), "--token-file", str(e2e.token_file)).ok()
    assert os.stat(local / "same.txt").st_mode & 0o777 == 0o600
    assert os.stat(local / "docs" / "deep" / "c.txt").st_mtime_ns == 1_600_000_000 * 10**9
    assert snapshot(snap) == frozen
