"""End to end: the deletion guards. A source that lost its folder marker or is empty (a
disk that is not mounted looks like both), more deletions than ``--max-delete``, or more
than half of the receiving side's files: nothing is deleted, everything else is done, the
run says why and exits 7. ``--force`` deletes anyway. For push, pull, sync and watch."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from .e2e_support import (
    E2E,
    RDC,
    Result,
    assert_same_tree,
    snapshot,
    stamp_times,
    wait_for,
    write,
)

REFUSED = 7
MARKER = ".rdc-folder"


def a_tree(root: Path, files: int = 30) -> None:
    (root / "sub").mkdir(parents=True)
    for n in range(files):
        write(root / ("sub" if n % 3 else "") / f"f{n:02}.txt", f"file {n}\n".encode())
    stamp_times(root, seed=files)


def refused(result: Result, *words: str) -> None:
    assert result.returncode == REFUSED, str(result)
    assert "Traceback" not in result.stderr, str(result)
    line = [ln for ln in result.stderr.splitlines() if "to delete:" in ln]
    assert len(line) == 1, str(result)
    for word in words:
        assert word in line[0], line[0]


def unmount(local: Path) -> Path:
    """What a disk that is not mounted leaves: an empty directory at the same path. The
    "disk" (the tree as it was) is returned."""
    disk = local.with_name(local.name + ".disk")
    local.rename(disk)
    local.mkdir()
    return disk


def sync(e2e: E2E, local: Path, url: str, *extra: str) -> Result:
    return e2e.rdc("sync", str(local), url, "--token-file", str(e2e.token_file), *extra)


def test_sync_from_an_unmounted_disk_deletes_nothing(e2e: E2E) -> None:
    local, share = e2e.tmp / "local", e2e.tmp / "share"
    a_tree(local)
    share.mkdir()
    server = e2e.serve({"s": share})
    sync(e2e, local, server.url("s")).ok()
    assert (local / MARKER).is_file()  # it has content: it got its marker
    before = snapshot(share)
    assert len(before) == 31

    disk = unmount(local)
    refused(sync(e2e, local, server.url("s")), "lost its folder marker", str(local))
    assert snapshot(share) == before
    assert os.listdir(local) == []  # nor was anything fetched into the mount point

    shutil.rmtree(local)  # the disk is back: in step, nothing to do
    disk.rename(local)
    sync(e2e, local, server.url("s")).ok()
    assert snapshot(share) == before

    for name in os.listdir(local):  # emptied for real (the marker kept): still refused
        if name != MARKER:
            shutil.rmtree(local / name) if (local / name).is_dir() else os.unlink(local / name)
    refused(sync(e2e, local, server.url("s")), "is empty")
    assert snapshot(share) == before
    sync(e2e, local, server.url("s"), "--force").ok()
    assert snapshot(share) == {}


def test_push_delete_from_an_empty_or_unmarked_source(e2e: E2E) -> None:
    src, share = e2e.tmp / "src", e2e.tmp / "share"
    a_tree(src)
    share.mkdir()
    server = e2e.serve({"s": share})
    e2e.push(src, server.url("s"), "--delete").ok()
    before = snapshot(share)

    empty = e2e.tmp / "empty"
    empty.mkdir()
    result = e2e.push(empty, server.url("s"), "--delete")
    refused(result, "is empty", "nothing was deleted")
    assert result.stats["deletions_refused"] and result.stats["deleted"] == 0
    assert snapshot(share) == before
    refused(e2e.push(empty, server.url("s"), "--delete", "-n"), "is empty")

    os.unlink(src / MARKER)  # lost, though not empty: another disk mounted there, say
    os.unlink(src / "f00.txt")
    refused(e2e.push(src, server.url("s"), "--delete"), "lost its folder marker")
    assert snapshot(share) == before
    write(src / MARKER, b"")  # put back by hand, as the message says
    e2e.push(src, server.url("s"), "--delete").ok()
    assert_same_tree(src, share)


def test_max_delete_and_the_share_limit(e2e: E2E) -> None:
    src, share = e2e.tmp / "src", e2e.tmp / "share"
    a_tree(src, files=30)
    share.mkdir()
    server = e2e.serve({"s": share})
    e2e.push(src, server.url("s")).ok()
    for n in (1, 2, 4, 5):
        os.unlink(src / "sub" / f"f{n:02}.txt")
    refused(e2e.push(src, server.url("s"), "--delete", "--max-delete", "3"),
            "4 entries", "--max-delete 3")
    assert (share / "sub" / "f01.txt").exists()
    done = e2e.push(src, server.url("s"), "--delete", "--max-delete", "4").ok()
    assert done.stats["deleted"] == 4
    assert_same_tree(src, share)

    shutil.rmtree(src / "sub")  # 16 of the 26 files: over half
    result = e2e.push(src, server.url("s"), "--delete")
    refused(result, "16 of the 26 files", "50%")
    assert (share / "sub").is_dir() and result.stats["files_transferred"] == 0
    write(src / "new.txt", b"new\n")  # what is not a deletion still goes
    result = e2e.push(src, server.url("s"), "--delete")
    refused(result, "16 of the 26 files")
    assert (share / "new.txt").read_bytes() == b"new\n"
    e2e.push(src, server.url("s"), "--delete", "--force").ok()
    assert_same_tree(src, share)


def test_pull_delete_from_an_empty_or_unmarked_share(e2e: E2E) -> None:
    share, dst = e2e.tmp / "share", e2e.tmp / "dst"
    a_tree(share)
    server = e2e.serve({"s": share})
    e2e.pull(server.url("s"), dst, "--delete").ok()
    assert (share / MARKER).is_file()  # the server marked its share (it has content)
    before = snapshot(dst)

    disk = unmount(share)  # the server's disk goes
    refused(e2e.pull(server.url("s"), dst, "--delete"), "the server's directory",
            "lost its folder marker")
    assert snapshot(dst) == before
    write(share / "lonely.txt", b"only this\n")  # not empty, but not the synced tree
    refused(e2e.pull(server.url("s"), dst, "--delete"), "lost its folder marker")
    after = snapshot(dst)
    assert after.pop(b"lonely.txt").kind == "f"  # the rest was done
    assert after == before
    shutil.rmtree(share)
    disk.rename(share)
    e2e.pull(server.url("s"), dst, "--delete").ok()
    assert_same_tree(share, dst)


def test_the_marker_is_never_synced(e2e: E2E) -> None:
    src, share = e2e.tmp / "src", e2e.tmp / "share"
    a_tree(src)
    share.mkdir()
    server = e2e.serve({"s": share})
    e2e.push(src, server.url("s", "in/here")).ok()
    e2e.push(src, server.url("s", "in/here"), "--delete").ok()
    assert (src / MARKER).is_file()
    assert not (share / "in" / "here" / MARKER).exists()  # only a share's top gets one
    assert (share / MARKER).is_file()
    dst = e2e.tmp / "dst"
    e2e.pull(server.url("s"), dst).ok()
    assert not (dst / "in" / "here" / MARKER).exists()
    assert "Traceback" not in server.log()


def test_watch_holds_back_the_deletions_of_an_emptied_directory(e2e: E2E) -> None:
    local, share = e2e.tmp / "local", e2e.tmp / "share"
    a_tree(local)
    share.mkdir()
    server = e2e.serve({"s": share})
    sync(e2e, local, server.url("s")).ok()
    before = snapshot(share)
    log_path = e2e.tmp / "watch.log"
    with open(log_path, "wb") as log:
        watch = subprocess.Popen(
            [*RDC, "watch", str(local), server.url("s"), "--token-file", str(e2e.token_file)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=e2e.env)
    e2e.started.append(watch)
    wait_for(lambda: b"connected" in log_path.read_bytes(), 30, "the watch to connect")
    # Everything, marker first (an unmount takes it all at once; a round between two
    # removals must not see a marked directory that merely lost a few files).
    for name in sorted(os.listdir(local), key=lambda name: name != ".rdc-folder"):
        shutil.rmtree(local / name) if (local / name).is_dir() else os.unlink(local / name)
    wait_for(lambda: b"refused to delete" in log_path.read_bytes(), 30,
             "the watch to refuse the deletions")
    time.sleep(1.0)  # a refused round is not tried again at once (it was, in a loop)
    assert log_path.read_bytes().count(b"refused to delete") <= 2
    watch.send_signal(signal.SIGINT)
    watch.wait(15)
    assert snapshot(share) == before
    assert b"lost its folder marker" in log_path.read_bytes()
