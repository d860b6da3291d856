"""prune reclaims what no snapshot reaches and keeps everything one does (delta bases
included); check finds damage and names it: a flipped byte in any pack, a missing pack."""

from __future__ import annotations

import itertools
import os
import random
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rdc.repo import prune as prune_module
from rdc.repo.indexfile import PackInfo

from .conftest import scaled
from .e2e_support import assert_same_tree, random_file
from .repo_support import make_tree, objects, run, run_json


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("RDC_PASSWORD", raising=False)


def repo_bytes(location: str) -> int:
    return sum(objects(location).values())


def test_prune_reclaims_what_nothing_uses_and_keeps_what_something_does(
    tmp_path: Path, capsys
) -> None:
    location = str(tmp_path / "repo")
    run(capsys, "init", location)
    src = make_tree(tmp_path / "src", seed=1, big=1000)
    size = scaled(2 << 20, 200_000)
    random_file(src / "only-in-first.bin", size, seed=2)  # reachable from snapshot 1 only
    random_file(src / "evolving.bin", size, seed=3)
    first = run_json(capsys, "backup", str(src), location)["short_id"]
    os.unlink(src / "only-in-first.bin")
    data = bytearray((src / "evolving.bin").read_bytes())
    data[size // 2 : size // 2 + 100] = random.Random(4).randbytes(100)
    (src / "evolving.bin").write_bytes(bytes(data))  # its new chunk: a delta on snapshot 1's
    second = run_json(capsys, "backup", str(src), location)
    assert second["stored"]["delta_chunks"] >= 1
    shutil.copytree(src, tmp_path / "second-tree", symlinks=True)
    before = repo_bytes(location)
    forgotten = run_json(capsys, "forget", location, "--keep-last", "1")
    assert forgotten["removed"] == [first] and forgotten["kept"] == [second["short_id"]]
    result = run_json(capsys, "prune", location)
    assert result["packs_deleted"] + result["packs_repacked"] >= 1
    after = repo_bytes(location)
    assert before - after >= size * 0.9  # the file only the first snapshot had
    assert run(capsys, "check", "--read-data", location)[0] == 0
    dst = tmp_path / "dst"
    run_json(capsys, "restore", location, "latest", str(dst))
    assert_same_tree(tmp_path / "second-tree", dst)
    # Nothing more to reclaim: a second prune deletes nothing.
    again = run_json(capsys, "prune", location)
    assert again["packs_deleted"] == again["packs_repacked"] == again["unindexed_deleted"] == 0
    assert run(capsys, "check", "--read-data", location)[0] == 0


def test_forget_with_prune_and_dry_run(tmp_path: Path, capsys) -> None:
    location = str(tmp_path / "repo")
    run(capsys, "init", location)
    src = make_tree(tmp_path / "src", seed=5, big=1000)
    ids = []
    for i in range(3):
        (src / "counter").write_text(f"{i}\n" * 2000)
        ids.append(run_json(capsys, "backup", str(src), location)["short_id"])
    dry = run_json(capsys, "forget", location, "--keep-last", "1", "--dry-run")
    assert dry["removed"] == [ids[1], ids[0]]
    assert len(run_json(capsys, "snapshots", location)) == 3
    done = run_json(capsys, "forget", location, "--keep-last", "2", "--prune")
    assert done["removed"] == [ids[0]] and done["prune"] is not None
    assert [s["short_id"] for s in run_json(capsys, "snapshots", location)] == ids[1:]
    assert run(capsys, "check", "--read-data", location)[0] == 0


@pytest.mark.parametrize("encrypted", [False, True])
def test_check_names_a_flipped_byte_in_any_pack(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch, encrypted: bool
) -> None:
    location = str(tmp_path / "repo")
    if encrypted:
        from rdc.repo import crypto

        monkeypatch.setattr(crypto, "KDF_N", 1 << 12)
        monkeypatch.setenv("RDC_PASSWORD", "flip")
        run(capsys, "init", "--encrypt", location)
    else:
        run(capsys, "init", location)
    src = make_tree(tmp_path / "src", seed=6)
    run_json(capsys, "backup", str(src), location)
    (src / "more.txt").write_text("more\n")
    run_json(capsys, "backup", str(src), location)
    assert run(capsys, "check", "--read-data", location)[0] == 0
    packs = sorted(name for name in objects(location) if name.startswith("data/"))
    assert len(packs) >= 3  # data and tree packs of two backups
    rng = random.Random(7)
    for name in packs:
        path = Path(location, name)
        original = path.read_bytes()
        damaged = bytearray(original)
        at = rng.randrange(len(damaged))
        damaged[at] ^= 1 << rng.randrange(8)
        os.chmod(path, 0o600)
        path.write_bytes(bytes(damaged))
        try:
            code, out, _ = run(capsys, "check", "--read-data", location)
            assert code == 1, f"a flipped byte at {at} of {name} went unnoticed"
            assert f"error: {name}" in out
        finally:
            path.write_bytes(original)
    assert run(capsys, "check", "--read-data", location)[0] == 0


def test_check_names_a_missing_pack_and_a_damaged_index(tmp_path: Path, capsys) -> None:
    location = str(tmp_path / "repo")
    run(capsys, "init", location)
    src = make_tree(tmp_path / "src", seed=8, big=1000)
    run_json(capsys, "backup", str(src), location)
    names = objects(location)
    pack = next(n for n in names if n.startswith("data/"))
    index = next(n for n in names if n.startswith("index/"))
    os.rename(Path(location, pack), tmp_path / "aside")
    report = run_json_code(capsys, 1, "check", location)
    assert f"{pack}: indexed, but missing" in report["errors"]
    os.rename(tmp_path / "aside", Path(location, pack))
    Path(location, index).write_bytes(b"garbage")
    report = run_json_code(capsys, 1, "check", location)
    assert any(e.startswith(f"{index}: does not read") for e in report["errors"])


def run_json_code(capsys, code: int, *args: str) -> dict:
    import json

    got, out, err = run(capsys, *args, "--json")
    assert got == code, err
    return json.loads(out)


def test_prune_removes_packs_left_unindexed(tmp_path: Path, capsys) -> None:
    import blake3

    from rdc.repo import codec
    from rdc.repo.blobs import Kind
    from rdc.repo.packs import PackWriter, pack_name
    from rdc.repo.repository import Repository

    location = str(tmp_path / "repo")
    run(capsys, "init", location)
    src = make_tree(tmp_path / "src", seed=9, big=1000)
    run_json(capsys, "backup", str(src), location)
    # What a backup killed between a pack and its index object leaves: a whole pack that
    # no index object names.
    with Repository.open(location) as repo:
        writer = PackWriter(repo.crypto)
        orphan = b"orphan" * 1000
        encoding, record = codec.compress(orphan)
        writer.add(Kind.CHUNK, blake3.blake3(orphan).digest(), encoding, record, len(orphan))
        pack_id, data = writer.finish()
        repo.store.put(pack_name(pack_id), data)
    report = run_json(capsys, "check", "--read-data", location)
    assert report["ok"] and report["notes"] == [
        "1 packs are not indexed (left by an interrupted backup or prune; prune removes them)"]
    result = run_json(capsys, "prune", location)
    assert result["unindexed_deleted"] == 1
    assert pack_name(pack_id) not in objects(location)
    report = run_json(capsys, "check", "--read-data", location)
    assert report["ok"] and not report["notes"]


def test_a_prune_interrupted_after_its_index_object_is_completed_by_the_next(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed between its new index object and the deletes, a prune leaves old and new
    index objects naming the same blobs; the next prune makes the same repacked pack again
    (same records, same name) and must not delete it as a duplicate."""
    from rdc.storage import LocalStore

    location = str(tmp_path / "repo")
    run(capsys, "init", location)
    src = tmp_path / "src"
    src.mkdir()
    size = scaled(1 << 20, 100_000)
    for i in range(3):
        random_file(src / f"part{i}.bin", size, seed=20 + i)
    run_json(capsys, "backup", str(src), location)
    os.unlink(src / "part0.bin")
    run_json(capsys, "backup", str(src), location)
    run_json(capsys, "forget", location, "--keep-last", "1")
    real_delete = LocalStore.delete

    def interrupted(self: LocalStore, name: str) -> None:
        if name.startswith("index/"):
            raise KeyboardInterrupt  # as if killed here
        real_delete(self, name)

    monkeypatch.setattr(LocalStore, "delete", interrupted)
    assert run(capsys, "prune", location)[0] == 130
    monkeypatch.setattr(LocalStore, "delete", real_delete)
    result = run_json(capsys, "prune", location)
    assert result["packs_written"] >= 1  # the same pack as the interrupted prune's
    assert run(capsys, "check", "--read-data", location)[0] == 0
    dst = tmp_path / "dst"
    run_json(capsys, "restore", location, "latest", str(dst))
    assert_same_tree(src, dst)


@given(st.lists(st.integers(0, 50), max_size=40), st.integers(1, 60))
def test_index_groups_keep_every_pack_in_order_and_bound_their_blobs(
    blobs: list[int], limit: int
) -> None:
    infos = [PackInfo(i.to_bytes(32, "big"), 0, [None] * n) for i, n in enumerate(blobs)]
    groups = prune_module._index_groups(infos, limit)
    assert [info for group in groups for info in group] == infos
    for group in groups:
        assert group and (len(group) == 1 or sum(len(i.entries) for i in group) <= limit)
    for before, after in itertools.pairwise(groups):  # each group as full as can be
        assert sum(len(i.entries) for i in before) + len(after[0].entries) > limit


def test_prune_writes_index_objects_of_bounded_size(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prune's new index is cut into objects of at most INDEX_BLOBS blobs (so each is a
    few MB, one put to an rdc serve), and the repository reads the same from them."""
    location = str(tmp_path / "repo")
    run(capsys, "init", location)
    src = make_tree(tmp_path / "src", seed=9, big=1000)
    run_json(capsys, "backup", str(src), location)
    random_file(src / "more.bin", scaled(1 << 20, 100_000), seed=10)
    run_json(capsys, "backup", str(src), location)
    monkeypatch.setattr(prune_module, "INDEX_BLOBS", 5)
    run_json(capsys, "prune", location)
    indexes = [n for n in objects(location) if n.startswith("index/")]
    assert len(indexes) >= 2
    assert run(capsys, "check", "--read-data", location)[0] == 0
    run_json(capsys, "restore", location, "latest", str(tmp_path / "dst"))
    assert_same_tree(src, tmp_path / "dst")
    run_json(capsys, "prune", location)  # the same packs: the same index objects
    assert sorted(n for n in objects(location) if n.startswith("index/")) == sorted(indexes)
