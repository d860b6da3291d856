"""Backups into a repository that a real ``rdc serve`` exports (``rdc://HOST:PORT/NAME``):
every command through the server, what a second backup sends, a read-only token, an
unknown name, two backups at once through one server, and a server whose repository is
in S3 (the session's SeaweedFS)."""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
from pathlib import Path

from .conftest import scaled
from .e2e_support import (
    E2E,
    OTHER_TOKEN,
    RDC,
    RUN_SECONDS,
    TOKEN,
    Server,
    assert_same_tree,
    random_file,
)
from .repo_support import make_tree
from .seaweedfs import SeaweedFS, credentials_env

pytest_plugins = ["tests.seaweedfs_plugin"]


def serve_repo(e2e: E2E, location: str, name: str = "bk") -> Server:
    """A server exporting ``location`` as ``name``: read-write for the usual token,
    read-only for OTHER_TOKEN."""
    e2e.token_file.write_text(f"{TOKEN}\n{OTHER_TOKEN} {name}:ro\n")
    return e2e.serve({}, None, "--repo", f"{name}={location}")


def rdc(e2e: E2E, *args: str, token: Path | None = None):
    return e2e.rdc(*args, "--token-file", str(token or e2e.token_file))


def read_only_token(e2e: E2E) -> Path:
    path = e2e.tmp / "ro-token"
    path.write_text(f"{OTHER_TOKEN}\n")
    return path


def test_every_command_through_the_server(e2e: E2E, tmp_path: Path) -> None:
    server = serve_repo(e2e, str(tmp_path / "srv" / "bk"))
    url = server.url("bk")
    assert "made repository" in rdc(e2e, "init", url).ok().stdout
    src = make_tree(tmp_path / "src", seed=21)
    first = json.loads(rdc(e2e, "backup", "--json", str(src), url).ok().stdout)
    # The first backup sends what it adds (packs, compressed already) and little else.
    added = first["added_bytes"]
    assert added / 2 < first["wire"]["sent"] < added * 1.05 + (64 << 10), (first, added)
    (src / "src" / "added.txt").write_text("one new line\n")
    second = json.loads(rdc(e2e, "backup", "--json", str(src), url).ok().stdout)
    # Dedup is the client's: the second backup sends only the new file, its directories'
    # tree blobs and the snapshot, a small fraction of the tree.
    assert second["wire"]["sent"] < first["bytes"] / 10, (second["wire"], first["bytes"])
    assert second["stored"]["new_chunks"] <= 3

    snaps = json.loads(rdc(e2e, "snapshots", "--json", url).ok().stdout)
    ids = [s["short_id"] for s in snaps]
    assert len(ids) == 2
    assert "+ src/added.txt" in rdc(e2e, "diff", url, *ids).ok().stdout
    assert "src/pkg/__init__.py" in rdc(e2e, "ls", url, ids[1], "src/pkg").ok().stdout
    rdc(e2e, "restore", url, ids[1], str(tmp_path / "dst")).ok()
    assert_same_tree(src, tmp_path / "dst")

    out = rdc(e2e, "forget", url, "--keep-last", "1", "--prune").ok().stdout
    assert "kept 1 snapshots, removed 1" in out
    assert "no errors" in rdc(e2e, "check", "--read-data", url).ok().stdout
    # Only the objects of the repository are in its directory; nothing of the server's.
    stored = {p.relative_to(tmp_path / "srv" / "bk").parts[0]
              for p in (tmp_path / "srv" / "bk").rglob("*") if p.is_file()}
    assert stored <= {"config", "data", "index", "snapshots", "keys", "locks"}
    assert "locks" not in stored  # every lock was released


def test_a_read_only_token_restores_but_cannot_back_up(e2e: E2E, tmp_path: Path) -> None:
    server = serve_repo(e2e, str(tmp_path / "srv" / "bk"))
    url = server.url("bk")
    ro = read_only_token(e2e)
    src = make_tree(tmp_path / "src", seed=22, big=50_000)
    rdc(e2e, "init", url).ok()
    rdc(e2e, "backup", str(src), url).ok()
    for args in (["backup", str(src), url], ["prune", url], ["init", url],
                 ["forget", url, "--keep-last", "1"]):
        result = rdc(e2e, *args, token=ro)
        assert result.returncode == 4, result
        assert "grants this token reading only" in result.stderr and "Traceback" not in \
            result.stderr
    # Reading needs no write: a read-only token restores and checks (without a lock).
    rdc(e2e, "restore", url, "latest", str(tmp_path / "dst"), token=ro).ok()
    assert_same_tree(src, tmp_path / "dst")
    assert "no errors" in rdc(e2e, "check", url, token=ro).ok().stdout
    assert len(json.loads(rdc(e2e, "snapshots", "--json", url, token=ro).ok().stdout)) == 1


def test_an_unknown_repository_and_a_path_after_the_name(e2e: E2E, tmp_path: Path) -> None:
    server = serve_repo(e2e, str(tmp_path / "srv" / "bk"))
    result = rdc(e2e, "snapshots", server.url("nope"))
    assert result.returncode == 1 and "no repository 'nope'" in result.stderr, result
    result = rdc(e2e, "init", server.url("bk", "sub"))
    assert result.returncode == 2 and "nothing after the name" in result.stderr, result
    # Exported, but nobody ran rdc init yet.
    result = rdc(e2e, "snapshots", server.url("bk"), token=read_only_token(e2e))
    assert result.returncode == 1 and "no rdc repository here" in result.stderr, result


def test_two_backups_through_one_server_at_once(e2e: E2E, tmp_path: Path) -> None:
    server = serve_repo(e2e, str(tmp_path / "srv" / "bk"))
    url = server.url("bk")
    rdc(e2e, "init", url).ok()
    one = make_tree(tmp_path / "one", seed=23)
    two = make_tree(tmp_path / "two", seed=24)
    random_file(two / "shared.bin", scaled(2 << 20, 100_000), seed=25)
    shutil.copy(two / "shared.bin", one / "shared.bin")
    started = [subprocess.Popen([*RDC, "backup", "--json", str(src), url, "--token-file",
                                 str(e2e.token_file)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=e2e.env) for src in (one, two)]
    e2e.started += started
    reports = []
    for process in started:
        out, err = process.communicate(timeout=RUN_SECONDS)
        assert process.returncode == 0, err.decode()
        reports.append(json.loads(out))
    report = json.loads(rdc(e2e, "check", "--read-data", "--json", url).stdout)
    assert report["ok"], report["errors"]
    for src, done in ((one, reports[0]), (two, reports[1])):
        dst = tmp_path / f"dst-{src.name}"
        rdc(e2e, "restore", url, done["short_id"], str(dst)).ok()
        assert_same_tree(src, dst)


def test_a_server_whose_repository_is_in_s3(e2e: E2E, tmp_path: Path,
                                            seaweedfs: SeaweedFS) -> None:
    e2e.env.update(credentials_env())  # the server's credentials; the client needs none
    location = seaweedfs.url(prefix=f"served-{secrets.token_hex(6)}")
    server = serve_repo(e2e, location)
    for key in credentials_env():
        e2e.env.pop(key)
    url = server.url("bk")
    src = make_tree(tmp_path / "src", seed=26, big=100_000)
    rdc(e2e, "init", url).ok()
    rdc(e2e, "backup", str(src), url).ok()
    rdc(e2e, "restore", url, "latest", str(tmp_path / "dst")).ok()
    assert_same_tree(src, tmp_path / "dst")
    assert "no errors" in rdc(e2e, "check", "--read-data", url).ok().stdout
