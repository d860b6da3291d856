"""Backups with real ``rdc`` processes: killed with SIGKILL in the middle of a backup and
of a prune (the repository stays whole, and the next backup completes and reuses what the
killed one stored), and two backups into one repository at once."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from .conftest import scaled
from .e2e_support import E2E, RDC, RUN_SECONDS, assert_same_tree, random_file
from .repo_support import make_tree


def start(e2e: E2E, *args: str) -> subprocess.Popen[bytes]:
    process = subprocess.Popen([*RDC, *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env=e2e.env)
    e2e.started.append(process)
    return process


def finish(process: subprocess.Popen[bytes]) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=RUN_SECONDS)
    return process.returncode, out.decode(errors="replace"), err.decode(errors="replace")


def kill(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=RUN_SECONDS)


def names(repo: str, prefix: str) -> set[str]:
    """The objects of a local repository under ``prefix`` (temporaries left out)."""
    found = set()
    for dirpath, _, filenames in os.walk(os.path.join(repo, prefix)):
        found |= {os.path.join(dirpath, f) for f in filenames if not f.startswith(".")}
    return found


def kill_when(process: subprocess.Popen[bytes], condition, what: str) -> bool:
    """SIGKILL ``process`` as soon as ``condition()`` holds (polled every few ms); True if
    it was killed, False if it ended first."""
    deadline = time.monotonic() + RUN_SECONDS
    while not condition():
        if process.poll() is not None:
            process.communicate(timeout=RUN_SECONDS)
            return False
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.002)
    kill(process)
    return True


def checked(e2e: E2E, repo: str) -> dict:
    result = e2e.rdc("check", "--read-data", "--json", repo)
    assert result.stdout, result.stderr
    report = json.loads(result.stdout)
    assert result.returncode == 0 and report["ok"], report["errors"]
    return report


def backed_up(e2e: E2E, src: Path, repo: str) -> dict:
    result = e2e.rdc("backup", "--json", str(src), repo)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def random_tree(root: Path, files: int, size: int, seed: int) -> Path:
    root.mkdir(parents=True)
    for i in range(files):
        random_file(root / f"part{i}.bin", size, seed=seed * 100 + i)
    return root


@pytest.mark.slow
def test_a_backup_killed_at_any_moment_leaves_a_whole_repository(
    e2e: E2E, tmp_path: Path
) -> None:
    repo = str(tmp_path / "repo")
    e2e.rdc("init", repo).ok()
    # Several packs' worth (packs close at 16 MiB) in the C run: flushes happen mid-backup.
    src = random_tree(tmp_path / "src", scaled(6, 3), scaled(8 << 20, 150_000), seed=1)
    rng = random.Random(2)
    moments = [
        ("a first index object", lambda before: names(repo, "index")),
        ("a new pack", lambda before: names(repo, "data") - before),
        ("a random moment", None),
    ]
    killed = 0
    for what, condition in moments:
        before = names(repo, "data")
        process = start(e2e, "backup", str(src), repo)
        if condition is None:
            time.sleep(rng.uniform(0.1, 1.0))
            killed += process.poll() is None
            kill(process)
        else:
            killed += kill_when(process, lambda c=condition, b=before: c(b), what)
        checked(e2e, repo)
    assert killed >= scaled(2, 1)  # caught in the middle, not after (pure: one flush)
    indexed = bool(names(repo, "index"))
    total = sum(p.stat().st_size for p in src.iterdir())
    report = backed_up(e2e, src, repo)
    if indexed:
        assert report["stored"]["new_chunk_bytes"] < total  # reused the killed ones' chunks
    checked(e2e, repo)
    e2e.rdc("restore", repo, "latest", str(tmp_path / "dst")).ok()
    assert_same_tree(src, tmp_path / "dst")


@pytest.mark.slow
def test_a_prune_killed_at_any_moment_leaves_a_whole_repository(
    e2e: E2E, tmp_path: Path
) -> None:
    repo = str(tmp_path / "repo")
    e2e.rdc("init", repo).ok()
    size = scaled(6 << 20, 100_000)
    src = random_tree(tmp_path / "src", 4, size, seed=3)
    backed_up(e2e, src, repo)  # packs holding parts 0-3
    for i in (0, 1):  # gone from the later snapshots: whole packs go, others are repacked
        os.unlink(src / f"part{i}.bin")
    random_file(src / "part4.bin", size, seed=304)
    backed_up(e2e, src, repo)
    kept = tmp_path / "kept"
    shutil.copytree(src, kept)
    e2e.rdc("forget", repo, "--keep-last", "1").ok()
    rng = random.Random(4)
    before = names(repo, "data"), names(repo, "index")
    moments = [  # prune writes packs, then an index object, then deletes
        ("a repacked pack", lambda: names(repo, "data") - before[0]),
        ("the new index object", lambda: names(repo, "index") - before[1]),
        ("old packs deleted", lambda: before[0] - names(repo, "data")),
        ("a random moment", None),
    ]
    killed = 0
    for what, condition in moments:
        process = start(e2e, "prune", repo)
        if condition is None:
            time.sleep(rng.uniform(0.05, 0.5))
            killed += process.poll() is None
            kill(process)
        else:
            killed += kill_when(process, condition, what)
        checked(e2e, repo)
        e2e.rdc("restore", repo, "latest", str(tmp_path / "probe")).ok()
        assert_same_tree(kept, tmp_path / "probe")
        shutil.rmtree(tmp_path / "probe")
    assert killed >= 1
    result = e2e.rdc("prune", "--json", repo)
    assert result.returncode == 0, result.stderr
    checked(e2e, repo)
    e2e.rdc("restore", repo, "latest", str(tmp_path / "dst")).ok()
    assert_same_tree(kept, tmp_path / "dst")
    again = json.loads(e2e.rdc("prune", "--json", repo).ok().stdout)
    assert again["packs_deleted"] == again["packs_repacked"] == again["unindexed_deleted"] == 0


def test_two_backups_into_one_repository_at_once(e2e: E2E, tmp_path: Path) -> None:
    repo = str(tmp_path / "repo")
    e2e.rdc("init", repo).ok()
    one = make_tree(tmp_path / "one", seed=5)
    two = make_tree(tmp_path / "two", seed=6)
    random_file(two / "shared-with-one.bin", scaled(2 << 20, 100_000), seed=7)
    shutil.copy(two / "shared-with-one.bin", one / "shared-with-one.bin")
    first, second = start(e2e, "backup", "--json", str(one), repo), \
        start(e2e, "backup", "--json", str(two), repo)
    reports = []
    for process in (first, second):
        code, out, err = finish(process)
        assert code == 0, err
        reports.append(json.loads(out))
    checked(e2e, repo)
    snaps = json.loads(e2e.rdc("snapshots", "--json", repo).ok().stdout)
    assert {s["id"] for s in snaps} == {r["snapshot"] for r in reports}
    for src, report in ((one, reports[0]), (two, reports[1])):
        dst = tmp_path / f"dst-{src.name}"
        e2e.rdc("restore", repo, report["short_id"], str(dst)).ok()
        assert_same_tree(src, dst)


def test_the_command_line_end_to_end(e2e: E2E, tmp_path: Path) -> None:
    """Every command once through a real process, text output included."""
    repo = str(tmp_path / "repo")
    e2e.env["RDC_PASSWORD"] = "an end-to-end passphrase"
    assert "made encrypted repository" in e2e.rdc("init", "--encrypt", repo).ok().stdout
    src = make_tree(tmp_path / "src", seed=8, big=20_000)
    out = e2e.rdc("backup", str(src), repo, "--tag", "e2e").ok().stdout
    assert "snapshot" in out and "saved" in out
    (src / "added.txt").write_text("added\n")
    e2e.rdc("backup", str(src), repo).ok()
    listing = e2e.rdc("snapshots", repo).ok().stdout
    ids = [line.split()[0] for line in listing.splitlines()[1:]]
    assert len(ids) == 2 and "[e2e]" in listing
    assert "+ added.txt" in e2e.rdc("diff", repo, *ids).ok().stdout
    assert "src/pkg/mod1.py" in e2e.rdc("ls", repo, ids[1], "src").ok().stdout
    e2e.rdc("restore", repo, ids[1], str(tmp_path / "dst")).ok()
    assert_same_tree(src, tmp_path / "dst")
    assert "kept 1 snapshots" in e2e.rdc("forget", repo, "--keep-last", "1", "--prune").ok().stdout
    assert "no errors" in e2e.rdc("check", "--read-data", repo).ok().stdout
    e2e.env["RDC_PASSWORD"] = "wrong"
    result = e2e.rdc("snapshots", repo)
    assert result.returncode == 4 and "wrong passphrase" in result.stderr
