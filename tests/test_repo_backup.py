"""Backup and restore through the ``rdc`` command, in this process, with and without
encryption: identical trees back, an unchanged backup that reads nothing and adds only its
snapshot record, deltas for similar content, ls, diff, and clear errors."""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest

from rdc.local.fs import SafeRoot
from rdc.repo import crypto
from rdc.repo.repository import Repository
from rdc.repo.restore import restore

from .conftest import scaled
from .e2e_support import assert_same_tree, random_file
from .repo_support import PASSWORD, make_tree, objects, root_meta, run, run_json


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("RDC_PASSWORD", raising=False)
    monkeypatch.delenv("RDC_PASSWORD_FILE", raising=False)
    monkeypatch.setattr(crypto, "KDF_N", 1 << 12)  # cheap keys: this is not the KDF's test


@pytest.fixture(params=["plain", "encrypted"])
def repo(request: pytest.FixtureRequest, tmp_path: Path, capsys, monkeypatch) -> str:
    location = str(tmp_path / "repo")
    if request.param == "encrypted":
        monkeypatch.setenv("RDC_PASSWORD", PASSWORD)
        assert run(capsys, "init", "--encrypt", location)[0] == 0
    else:
        assert run(capsys, "init", location)[0] == 0
    return location


def test_backup_then_restore_gives_the_same_tree(repo: str, tmp_path: Path, capsys) -> None:
    src = make_tree(tmp_path / "src", seed=1)
    report = run_json(capsys, "backup", str(src), repo, "--tag", "first")
    assert report["files_read"] == report["files"] and not report["errors"]
    dst = tmp_path / "dst"
    restored = run_json(capsys, "restore", repo, report["short_id"], str(dst))
    assert restored["files"] == report["files"] and not restored["errors"]
    assert_same_tree(src, dst)
    assert root_meta(dst) == root_meta(src)
    assert os.path.islink(dst / "link-dangling")
    [snap] = run_json(capsys, "snapshots", repo)
    assert snap["tags"] == ["first"] and snap["paths"] == [str(src)]


def test_an_unchanged_backup_reads_nothing_and_adds_only_its_record(
    repo: str, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = make_tree(tmp_path / "src", seed=2)
    run_json(capsys, "backup", str(src), repo)
    before = objects(repo)

    def no_reading(self: SafeRoot, rel: object) -> None:
        raise AssertionError(f"read {rel!r}")

    monkeypatch.setattr(SafeRoot, "open_read", no_reading)
    report = run_json(capsys, "backup", str(src), repo)
    assert report["files_read"] == 0 and report["bytes_read"] == 0
    assert report["files_unchanged"] == report["files"]
    after = objects(repo)
    added = set(after) - set(before)
    assert len(added) == 1 and next(iter(added)).startswith("snapshots/")
    assert {k: v for k, v in after.items() if k in before} == before


def test_a_changed_file_is_read_again_and_similar_content_is_a_delta(
    repo: str, tmp_path: Path, capsys
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    size = scaled(1 << 20, 150_000)
    random_file(src / "data.bin", size, seed=3)
    first = run_json(capsys, "backup", str(src), repo)
    data = bytearray((src / "data.bin").read_bytes())
    for offset in range(1000, size, size // 5):
        data[offset : offset + 10] = b"0123456789"  # five scattered overwrites
    (src / "data.bin").write_bytes(bytes(data))
    second = run_json(capsys, "backup", str(src), repo)
    assert second["files_read"] == 1
    stored = second["stored"]
    assert 1 <= stored["new_chunks"] <= 10
    assert stored["delta_chunks"] == stored["new_chunks"]
    assert stored["stored_chunk_bytes"] < stored["new_chunk_bytes"] / 20
    assert second["added_bytes"] < first["added_bytes"] / 5
    dst = tmp_path / "dst"
    run_json(capsys, "restore", repo, "latest", str(dst))
    assert (dst / "data.bin").read_bytes() == bytes(data)


def test_restore_of_a_path_inside_a_snapshot(repo: str, tmp_path: Path, capsys) -> None:
    src = make_tree(tmp_path / "src", seed=4)
    run_json(capsys, "backup", str(src), repo)
    run_json(capsys, "restore", repo, "latest:deep/a", str(tmp_path / "part"))
    assert_same_tree(src / "deep" / "a", tmp_path / "part")
    assert root_meta(tmp_path / "part") == root_meta(src / "deep" / "a")
    run_json(capsys, "restore", repo, "latest:run.sh", str(tmp_path / "one"))
    assert os.listdir(tmp_path / "one") == ["run.sh"]
    code, _, err = run(capsys, "restore", repo, "latest:no/such", str(tmp_path / "x"))
    assert code == 1 and "no no/such in snapshot" in err


def test_several_sources_go_under_their_names(repo: str, tmp_path: Path, capsys) -> None:
    a = make_tree(tmp_path / "a", seed=5, big=10_000)
    (tmp_path / "single.txt").write_bytes(b"a file on its own\n")
    run_json(capsys, "backup", str(a), str(tmp_path / "single.txt"), repo)
    dst = tmp_path / "dst"
    run_json(capsys, "restore", repo, "latest", str(dst))
    assert sorted(os.listdir(dst)) == ["a", "single.txt"]
    assert_same_tree(a, dst / "a")
    code, _, err = run(capsys, "backup", str(a), str(tmp_path / "b" / "a"), repo)
    assert code == 2 and "cannot back up" in err


def test_excluded_paths_are_left_out(repo: str, tmp_path: Path, capsys) -> None:
    src = make_tree(tmp_path / "src", seed=6, big=1000)
    run_json(capsys, "backup", str(src), repo, "--exclude", "*.py", "--exclude", "/deep/")
    listed = run_json(capsys, "ls", repo, "latest")
    paths = {e["path"] for e in listed["entries"]}
    assert "src/pkg" in paths and not any(p.endswith(".py") or p.startswith("deep")
                                          for p in paths)


def test_ls_and_diff(repo: str, tmp_path: Path, capsys) -> None:
    src = make_tree(tmp_path / "src", seed=7, big=1000)
    one = run_json(capsys, "backup", str(src), repo)["short_id"]
    (src / "src" / "pkg" / "mod1.py").write_text("changed\n")
    (src / "new.txt").write_text("new\n")
    os.unlink(src / "secret")
    os.chmod(src / "run.sh", 0o700)
    two = run_json(capsys, "backup", str(src), repo)["short_id"]
    changes = run_json(capsys, "diff", repo, one, two)
    assert changes["added"] == ["new.txt"] and changes["removed"] == ["secret"]
    assert changes["changed"] == ["src/pkg/mod1.py"]
    assert "run.sh" in changes["metadata"]
    listed = run_json(capsys, "ls", repo, two, "src/pkg")
    assert [e["path"] for e in listed["entries"]][:2] == ["src/pkg", "src/pkg/__init__.py"]
    [link] = [e for e in run_json(capsys, "ls", repo, two)["entries"]
              if e["path"] == "link-relative"]
    assert link["kind"] == "link" and link["target"] == "src/pkg/mod1.py"
    code, out, _ = run(capsys, "ls", repo, two)
    assert code == 0 and "caf\\xe9-\\xff.txt" in out  # shown as the bytes it is


def test_restore_never_writes_outside_its_destination(repo: str, tmp_path: Path, capsys) -> None:
    src = make_tree(tmp_path / "src", seed=8, big=1000)
    run_json(capsys, "backup", str(src), repo)
    outside = tmp_path / "outside"
    outside.mkdir()
    dst = tmp_path / "dst"
    dst.mkdir()
    os.symlink(outside, dst / "deep")  # where the snapshot has a directory
    os.symlink(outside / "secret", dst / "secret")  # where it has a file
    code, out, _ = run(capsys, "restore", repo, "latest", str(dst))
    assert code == 3 and "cannot restore deep" in out
    assert os.listdir(outside) == []
    assert (dst / "secret").read_bytes() == b"private\n" and not os.path.islink(dst / "secret")


def test_an_encrypted_repository_hides_content_and_needs_its_passphrase(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    location = str(tmp_path / "repo")
    monkeypatch.setenv("RDC_PASSWORD", PASSWORD)
    assert run(capsys, "init", "--encrypt", location)[0] == 0
    src = tmp_path / "src"
    src.mkdir()
    marker = b"a very recognisable sentence that must not appear in the repository\n"
    (src / "plain.txt").write_bytes(marker * 50)
    (src / "known-name-ab12.txt").write_bytes(b"x")
    run_json(capsys, "backup", str(src), location)
    for dirpath, _, filenames in os.walk(location):
        for name in filenames:
            data = Path(dirpath, name).read_bytes()
            assert marker[:30] not in data and b"known-name-ab12" not in data
    monkeypatch.setenv("RDC_PASSWORD", "not the passphrase")
    code, _, err = run(capsys, "snapshots", location)
    assert code == 4 and "wrong passphrase" in err and "Traceback" not in err
    monkeypatch.delenv("RDC_PASSWORD")
    code, _, err = run(capsys, "snapshots", location)
    assert code == 2 and "encrypted" in err
    (tmp_path / "pw").write_text(PASSWORD + "\n")
    dst = tmp_path / "dst"
    assert run(capsys, "restore", location, "latest", str(dst), "--password-file",
               str(tmp_path / "pw"))[0] == 0
    assert (dst / "plain.txt").read_bytes() == marker * 50


def test_clear_errors(tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    code, _, err = run(capsys, "snapshots", str(tmp_path / "nothing"))
    assert code == 1 and "no rdc repository here" in err
    monkeypatch.delenv("RDC_TOKEN", raising=False)
    code, _, err = run(capsys, "backup", str(tmp_path), "rdc://host/name")
    assert code == 2 and "no token" in err  # asked before connecting
    assert run(capsys, "init", str(tmp_path / "r"))[0] == 0
    code, _, err = run(capsys, "init", str(tmp_path / "r"))
    assert code == 1 and "not empty" in err
    code, _, err = run(capsys, "restore", str(tmp_path / "r"), "latest", str(tmp_path / "d"))
    assert code == 1 and "no snapshots yet" in err
    code, _, err = run(capsys, "backup", str(tmp_path / "missing"), str(tmp_path / "r"))
    assert code == 2 and "cannot back up" in err
    code, _, err = run(capsys, "forget", str(tmp_path / "r"))
    assert code == 2 and "keep" in err and "Traceback" not in err


def test_an_unreadable_file_is_reported_and_the_rest_backed_up(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    location = str(tmp_path / "repo")
    run(capsys, "init", location)
    src = make_tree(tmp_path / "src", seed=9, big=1000)
    real = SafeRoot.open_read

    def refuse_secret(self: SafeRoot, rel: str | bytes):  # type: ignore[no-untyped-def]
        if rel == "secret":
            raise PermissionError(13, "Permission denied", rel)
        return real(self, rel)

    monkeypatch.setattr(SafeRoot, "open_read", refuse_secret)
    code, out, _ = run(capsys, "backup", str(src), location)
    assert code == 3 and "cannot back up secret: Permission denied" in out
    monkeypatch.setattr(SafeRoot, "open_read", real)
    dst = tmp_path / "dst"
    assert run(capsys, "restore", location, "latest", str(dst))[0] == 0
    assert not (dst / "secret").exists() and (dst / "run.sh").exists()


def test_a_lost_local_index_is_rebuilt_from_the_repository(tmp_path: Path, capsys) -> None:
    location = str(tmp_path / "repo")
    run(capsys, "init", location)
    src = make_tree(tmp_path / "src", seed=10)
    first = run_json(capsys, "backup", str(src), location)
    shutil.rmtree(tmp_path / "cache")
    again = run_json(capsys, "backup", str(src), location)
    assert again["files_read"] == again["files"]  # the file cache went with it
    assert again["stored"]["new_chunks"] == 0 and again["stored"]["new_tree_blobs"] == 0
    assert first["stored"]["new_chunks"] > 0
    with Repository.open(location) as repo:
        result = restore(repo, "latest", str(tmp_path / "dst"))
    assert not result.errors
    assert_same_tree(src, tmp_path / "dst")


def test_similar_files_in_one_backup_are_stored_as_deltas(tmp_path: Path, capsys) -> None:
    location = str(tmp_path / "repo")
    run(capsys, "init", location)
    src = tmp_path / "src"
    src.mkdir()
    rng = random.Random(11)
    base = rng.randbytes(4000)  # one chunk
    for i in range(20):  # twenty small files, each the base with its own small edit
        edited = bytearray(base)
        edited[i * 190 : i * 190 + 8] = rng.randbytes(8)
        (src / f"f{i:02}").write_bytes(bytes(edited))
    report = run_json(capsys, "backup", str(src), location)
    stored = report["stored"]
    assert stored["new_chunks"] == 20 and stored["delta_chunks"] >= 15
    assert stored["stored_chunk_bytes"] < 2 * 4000 + 20 * 200  # a miss costs one copy


def test_progress_is_shown_when_asked(tmp_path: Path, capsys) -> None:
    location = str(tmp_path / "repo")
    run(capsys, "init", location)
    src = make_tree(tmp_path / "src", seed=12, big=1000)
    code, _, err = run(capsys, "backup", "--progress", str(src), location)
    assert code == 0 and "backing up" in err and "files" in err
    code, _, err = run(capsys, "restore", "--progress", location, "latest", str(tmp_path / "d"))
    assert code == 0 and "restoring" in err
    code, _, err = run(capsys, "backup", "--no-progress", str(src), location)
    assert code == 0 and err == ""


def test_a_repository_inside_its_source_is_left_out(tmp_path: Path, capsys) -> None:
    src = make_tree(tmp_path / "home", seed=13, big=1000)
    location = str(src / "my backups [daily]")  # gitignore specials in its name
    run(capsys, "init", location)
    run_json(capsys, "backup", str(src), location)
    report = run_json(capsys, "backup", str(src), location)
    paths = {e["path"] for e in run_json(capsys, "ls", location, report["short_id"])["entries"]}
    assert "run.sh" in paths and not any(p.startswith("my backups") for p in paths)
