"""End to end: ``--dry-run`` changes nothing on either side and says what it would do;
``--exclude`` and ``.rdcignore`` keep paths out of a sync in both directions and protect
them from ``--delete``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from .e2e_support import E2E, assert_same_tree, snapshot, stamp_times, write


def planned(result_stdout: str) -> set[str]:
    return {line for line in result_stdout.splitlines() if line}


def small_tree(root: Path) -> None:
    (root / "keep" / "sub").mkdir(parents=True)
    write(root / "keep" / "same.txt", b"same on both sides\n" * 100)
    write(root / "keep" / "sub" / "edited.txt", b"version 1\n" * 200)
    write(root / "gone.txt", b"deleted at the source later\n")
    write(root / "mode.txt", b"mode changes\n", 0o644)
    os.symlink("keep/same.txt", root / "link")
    stamp_times(root, seed=11)


def change(root: Path) -> None:
    write(root / "keep" / "sub" / "edited.txt", b"version 2\n" * 200)
    os.unlink(root / "gone.txt")
    (root / "newdir").mkdir()
    write(root / "newdir" / "new.txt", b"new\n")
    write(os.fsencode(root) + b"/new-\xe9.txt", b"a name that is not UTF-8\n")
    os.chmod(root / "mode.txt", 0o600)
    os.unlink(root / "link")
    os.symlink("mode.txt", root / "link")
    stamp_times(root, seed=12)


def test_push_dry_run_changes_nothing_and_lists_the_plan(e2e: E2E) -> None:
    src = e2e.tmp / "src"
    src.mkdir()
    small_tree(src)
    share = e2e.tmp / "share"
    share.mkdir()
    server = e2e.serve({"s": share})
    e2e.push(src, server.url("s")).ok()
    change(src)
    here, there = snapshot(src), snapshot(share)

    result = e2e.push(src, server.url("s"), "--dry-run", "--delete").ok()
    assert snapshot(share) == there
    assert snapshot(src) == here
    lines = planned(result.stdout)
    assert {
        "would send keep/sub/edited.txt",
        "would send newdir/new.txt",
        "would create newdir/",
        "would delete gone.txt",
        "would chmod mode.txt",
        "would link link -> mode.txt",
    } <= lines, result.stdout
    # same.txt got a new time (stamp_times), no new content: it is touched, never sent.
    assert not any("same.txt" in line and "touch" not in line for line in lines), result.stdout
    assert b"would send new-\xe9.txt\n" in result.raw_stdout  # the name's own bytes
    assert result.stats["files_transferred"] == 0
    assert result.stats["literal_bytes"] == 0

    e2e.push(src, server.url("s"), "--delete").ok()  # the plan, carried out
    assert_same_tree(src, share)


def test_pull_dry_run_changes_nothing_and_lists_the_plan(e2e: E2E) -> None:
    share = e2e.tmp / "share"
    share.mkdir()
    small_tree(share)
    server = e2e.serve({"s": share})
    dst = e2e.tmp / "dst"
    e2e.pull(server.url("s"), dst).ok()
    change(share)
    here, there = snapshot(dst), snapshot(share)

    result = e2e.pull(server.url("s"), dst, "--dry-run", "--delete").ok()
    assert snapshot(dst) == here
    assert snapshot(share) == there
    lines = planned(result.stdout)
    assert {
        "would fetch keep/sub/edited.txt",
        "would fetch newdir/new.txt",
        "would create newdir/",
        "would delete gone.txt",
        "would chmod mode.txt",
        "would link link -> mode.txt",
    } <= lines, result.stdout
    assert b"would fetch new-\xe9.txt\n" in result.raw_stdout

    e2e.pull(server.url("s"), dst, "--delete").ok()
    assert_same_tree(share, dst)


def test_pull_dry_run_into_a_new_directory_creates_nothing(e2e: E2E) -> None:
    share = e2e.tmp / "share"
    share.mkdir()
    small_tree(share)
    server = e2e.serve({"s": share})
    dst = e2e.tmp / "not" / "there"
    result = e2e.pull(server.url("s"), dst, "--dry-run").ok()
    assert "would fetch keep/same.txt" in planned(result.stdout)
    assert not (e2e.tmp / "not").exists()


EXCLUDED = (b"build", b"scratch.log", b"sub/deep.log", b"secret.key", b"server.log",
            b"server-secret.key")


def excluded(rel: bytes) -> bool:
    return any(rel == p or rel.startswith(p + b"/") for p in EXCLUDED)


def test_excludes_keep_paths_out_of_a_push_and_safe_from_delete(e2e: E2E) -> None:
    src = e2e.tmp / "src"
    (src / "sub").mkdir(parents=True)
    (src / "build").mkdir()
    write(src / ".rdcignore", b"# generated\nbuild/\n*.key\n")
    write(src / "kept.txt", b"kept\n")
    write(src / "sub" / "kept.txt", b"kept too\n")
    write(src / "scratch.log", b"excluded by --exclude\n")
    write(src / "sub" / "deep.log", b"excluded below the top too\n")
    write(src / "build" / "out.o", b"excluded directory\n")
    write(src / "secret.key", b"excluded by .rdcignore\n")
    share = e2e.tmp / "share"
    share.mkdir()
    (share / "build").mkdir()
    write(share / "build" / "server-artifact", b"the server's own, excluded\n")
    write(share / "server.log", b"the server's own log\n")
    write(share / "server-secret.key", b"the server's own key\n")
    write(share / "stale.txt", b"not excluded: --delete removes it\n")
    theirs = snapshot(share, lambda rel: not excluded(rel))
    server = e2e.serve({"s": share})

    result = e2e.push(src, server.url("s"), "--exclude", "*.log", "--delete").ok()
    assert_same_tree(src, share, skip=excluded)
    assert snapshot(share, lambda rel: not excluded(rel)) == theirs  # untouched
    assert not (share / "stale.txt").exists()
    assert result.stats["in_step"] is True

    dry = e2e.push(src, server.url("s"), "--exclude", "*.log", "--delete", "--dry-run").ok()
    assert dry.stdout == ""  # in step: nothing planned, excluded paths least of all


def test_excludes_keep_paths_out_of_a_pull_and_safe_from_delete(e2e: E2E) -> None:
    share = e2e.tmp / "share"
    (share / "sub").mkdir(parents=True)
    (share / "build").mkdir()
    ignore = b"build/\n*.key\n"
    write(share / ".rdcignore", ignore)
    write(share / "kept.txt", b"kept\n")
    write(share / "sub" / "kept.txt", b"kept too\n")
    write(share / "scratch.log", b"excluded by --exclude\n")
    write(share / "sub" / "deep.log", b"excluded below the top\n")
    write(share / "build" / "out.o", b"excluded directory\n")
    write(share / "secret.key", b"excluded by .rdcignore\n")
    dst = e2e.tmp / "dst"
    (dst / "build").mkdir(parents=True)
    write(dst / ".rdcignore", ignore)
    write(dst / "build" / "local-artifact", b"mine, excluded\n")
    write(dst / "server.log", b"my log, excluded\n")
    write(dst / "server-secret.key", b"my key, excluded\n")
    write(dst / "stale.txt", b"not excluded: --delete removes it\n")
    mine = snapshot(dst, lambda rel: not excluded(rel))
    server = e2e.serve({"s": share})

    result = e2e.pull(server.url("s"), dst, "--exclude", "*.log", "--delete").ok()
    assert_same_tree(share, dst, skip=excluded)
    assert snapshot(dst, lambda rel: not excluded(rel)) == mine
    assert not (dst / "stale.txt").exists()
    assert result.stats["in_step"] is True




@pytest.mark.parametrize("direction", ["push", "pull"])
def test_delete_spares_excluded_files_inside_a_directory_it_removes(
    e2e: E2E, direction: str
) -> None:
    """A directory only the target has goes with --delete, but not the excluded files in
    it: they are neither sent nor deleted (docs/protocol.md, open.excludes)."""
    source, target = e2e.tmp / "source", e2e.tmp / "target"
    source.mkdir()
    write(source / "kept.txt", b"kept\n")
    (target / "old").mkdir(parents=True)
    write(target / "old" / "stale.txt", b"goes with --delete\n")
    write(target / "old" / "precious.log", b"excluded: must stay\n")
    if direction == "push":
        server = e2e.serve({"s": target})
        e2e.push(source, server.url("s"), "--exclude", "*.log", "--delete").ok()
    else:
        server = e2e.serve({"s": source})
        e2e.pull(server.url("s"), target, "--exclude", "*.log", "--delete").ok()
    assert not (target / "old" / "stale.txt").exists()
    assert (target / "old" / "precious.log").read_bytes() == b"excluded: must stay\n"


def test_progress_shows_files_bytes_and_rate(e2e: E2E) -> None:
    src, share = e2e.tmp / "src", e2e.tmp / "share"
    src.mkdir()
    share.mkdir()
    for n in range(5):
        write(src / f"f{n}.bin", os.urandom(50_000))
    server = e2e.serve({"s": share})
    result = e2e.push(src, server.url("s"), "--progress", "--stats").ok()
    bar = result.stderr.rsplit("\r", 1)[-1]
    assert "5/5 files" in bar and "/s" in bar and "wire" in bar, result.stderr
    assert "files: 5 total, 5 transferred" in result.stdout
