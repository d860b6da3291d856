"""The backup commands against a real S3 server (the session's SeaweedFS): backup,
restore, ls, diff, forget, prune and check, encrypted and not, and two backups into one
bucket at once."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
from pathlib import Path

import pytest

from rdc.repo import crypto

from .conftest import scaled
from .e2e_support import E2E, RDC, RUN_SECONDS, assert_same_tree, random_file
from .repo_support import PASSWORD, make_tree, root_meta, run, run_json
from .seaweedfs import SeaweedFS, credentials_env

# The session fixture `seaweedfs`, registered once for every module that names it.
pytest_plugins = ["tests.seaweedfs_plugin"]


@pytest.fixture
def location(seaweedfs: SeaweedFS, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh repository location in the session's bucket; credentials in the environment."""
    for key, value in credentials_env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("RDC_PASSWORD", raising=False)
    monkeypatch.setattr(crypto, "KDF_N", 1 << 12)
    return seaweedfs.url(prefix=f"repo-{secrets.token_hex(6)}")


@pytest.mark.parametrize("encrypted", [False, True])
def test_every_command_against_s3(location: str, tmp_path: Path, capsys, encrypted: bool,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    if encrypted:
        monkeypatch.setenv("RDC_PASSWORD", PASSWORD)
        assert run(capsys, "init", "--encrypt", location)[0] == 0
    else:
        assert run(capsys, "init", location)[0] == 0
    src = make_tree(tmp_path / "src", seed=1, big=scaled(1 << 20, 100_000))
    random_file(src / "only-first.bin", scaled(1 << 20, 100_000), seed=2)
    first = run_json(capsys, "backup", str(src), location)
    (src / "only-first.bin").unlink()
    (src / "src" / "pkg" / "mod2.py").write_text("edited\n")
    os.utime(src / "src" / "pkg" / "mod2.py", ns=(10**18, 10**18))  # old: not racy
    second = run_json(capsys, "backup", str(src), location)
    shutil.copytree(src, tmp_path / "second", symlinks=True)
    changes = run_json(capsys, "diff", location, first["short_id"], second["short_id"])
    assert changes["removed"] == ["only-first.bin"] and changes["changed"] == ["src/pkg/mod2.py"]
    assert any(e["path"] == "deep/a/tiny" for e in run_json(capsys, "ls", location,
                                                            "latest")["entries"])
    dst = tmp_path / "dst"
    run_json(capsys, "restore", location, second["short_id"], str(dst))
    assert_same_tree(src, dst)
    assert root_meta(dst) == root_meta(src)
    forgotten = run_json(capsys, "forget", location, "--keep-last", "1", "--prune")
    assert forgotten["removed"] == [first["short_id"]]
    assert forgotten["prune"]["bytes_deleted"] > forgotten["prune"]["bytes_written"]
    report = run_json(capsys, "check", "--read-data", location)
    assert report["ok"] and report["snapshots"] == 1
    again = tmp_path / "again"
    run_json(capsys, "restore", location, "latest", str(again))
    assert_same_tree(tmp_path / "second", again)
    unchanged = run_json(capsys, "backup", str(src), location)
    assert unchanged["files_read"] == 0 and unchanged["added_bytes"] == 0


def test_two_backups_into_one_bucket_at_once(e2e: E2E, location: str, tmp_path: Path) -> None:
    e2e.env.update(credentials_env())
    e2e.rdc("init", location).ok()
    one = make_tree(tmp_path / "one", seed=3)
    two = make_tree(tmp_path / "two", seed=4)
    processes = [subprocess.Popen([*RDC, "backup", "--json", str(src), location],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, env=e2e.env) for src in (one, two)]
    e2e.started += processes
    reports = []
    for process in processes:
        out, err = process.communicate(timeout=RUN_SECONDS)
        assert process.returncode == 0, err.decode()
        reports.append(json.loads(out))
    checked = json.loads(e2e.rdc("check", "--read-data", "--json", location).stdout)
    assert checked["ok"] and checked["snapshots"] == 2, checked["errors"]
    for src, report in zip((one, two), reports, strict=True):
        dst = tmp_path / f"dst-{src.name}"
        e2e.rdc("restore", location, report["short_id"], str(dst)).ok()
        assert_same_tree(src, dst)
