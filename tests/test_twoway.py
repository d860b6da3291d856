"""Two-way sync over in-memory streams: changes on either side, on both, and conflicts."""

from __future__ import annotations

import os
import shutil

import pytest

from .protocol_support import Pair, tree_state, write

T0 = 1_700_000_000_000_000_000


async def start(tmp_path):
    """A share and one local directory, synced once, with a few files."""
    pair = Pair(tmp_path)
    local = tmp_path / "local"
    write(local / "a.txt", b"alpha\n" * 500, T0)
    write(local / "dir" / "b.txt", b"beta\n" * 500, T0)
    write(local / "dir" / "c.bin", os.urandom(20_000), T0)
    stats = await pair.run("sync", local)
    assert stats.in_step and not stats.failed
    assert tree_state(local, False) == tree_state(pair.share, False)
    return pair, local


async def test_edits_on_either_side_flow_to_the_other(tmp_path) -> None:
    pair, local = await start(tmp_path)
    write(local / "a.txt", b"alpha, edited here\n" * 500, T0 + 10)
    write(pair.share / "dir" / "b.txt", b"beta, edited there\n" * 500, T0 + 20)
    write(pair.share / "new-there.txt", b"new on the server", T0 + 30)
    write(local / "dir" / "new-here.txt", b"new here", T0 + 40)
    stats = await pair.run("sync", local)
    assert stats.in_step and not stats.failed and not stats.conflicts
    assert tree_state(local, False) == tree_state(pair.share, False)
    assert (pair.share / "a.txt").read_bytes().startswith(b"alpha, edited here")
    assert (local / "dir" / "b.txt").read_bytes().startswith(b"beta, edited there")
    assert pair.actions.gets and pair.actions.pushes
    pair.close()


async def test_deletions_and_renames_propagate(tmp_path) -> None:
    pair, local = await start(tmp_path)
    os.remove(local / "a.txt")
    os.rename(pair.share / "dir" / "c.bin", pair.share / "dir" / "renamed.bin")
    stats = await pair.run("sync", local)
    assert stats.in_step and not stats.failed
    assert not (pair.share / "a.txt").exists()
    assert (local / "dir" / "renamed.bin").exists() and not (local / "dir" / "c.bin").exists()
    assert stats.literal_bytes == 0  # the rename's content was copied locally
    assert tree_state(local, False) == tree_state(pair.share, False)
    pair.close()


async def test_edits_on_both_sides_keep_both_versions(tmp_path) -> None:
    pair, local = await start(tmp_path)
    write(local / "a.txt", b"the local version\n", T0 + 100)
    write(pair.share / "a.txt", b"the remote version, newer\n", T0 + 200)
    stats = await pair.run("sync", local)
    assert stats.in_step and not stats.failed
    [(path, copy)] = stats.conflicts
    assert path == "a.txt" and copy.startswith("a.sync-conflict-") and copy.endswith(".txt")
    assert "here" in copy  # the local version lost (older): its host is named
    assert (local / "a.txt").read_bytes() == b"the remote version, newer\n"
    assert (local / copy).read_bytes() == b"the local version\n"
    assert tree_state(local, False) == tree_state(pair.share, False)
    pair.close()


async def test_delete_here_edit_there_restores_the_edit(tmp_path) -> None:
    pair, local = await start(tmp_path)
    shutil.rmtree(local / "dir")
    write(pair.share / "dir" / "b.txt", b"edited on the server\n", T0 + 5)
    stats = await pair.run("sync", local)
    assert stats.in_step and not stats.failed
    assert (local / "dir" / "b.txt").read_bytes() == b"edited on the server\n"
    assert not (local / "dir" / "c.bin").exists()  # untouched there: the deletion holds
    assert not (pair.share / "dir" / "c.bin").exists()
    assert tree_state(local, False) == tree_state(pair.share, False)
    pair.close()


async def test_the_same_new_file_on_both_sides_is_no_conflict(tmp_path) -> None:
    pair, local = await start(tmp_path)
    write(local / "same.txt", b"identical", T0 + 7)
    write(pair.share / "same.txt", b"identical", T0 + 7)
    stats = await pair.run("sync", local)
    assert stats.in_step and not stats.conflicts and stats.files_transferred == 0
    pair.close()


async def test_metadata_changes_flow_both_ways(tmp_path) -> None:
    pair, local = await start(tmp_path)
    os.chmod(local / "a.txt", 0o600)
    os.utime(pair.share / "dir" / "b.txt", ns=(T0 + 999, T0 + 999))
    stats = await pair.run("sync", local)
    assert stats.in_step and not stats.failed
    assert os.stat(pair.share / "a.txt").st_mode & 0o777 == 0o600
    assert os.stat(local / "dir" / "b.txt").st_mtime_ns == T0 + 999
    pair.close()


async def test_nothing_changed_is_one_round_trip(tmp_path) -> None:
    pair, local = await start(tmp_path)
    stats = await pair.run("sync", local)
    assert stats.in_step and not pair.actions
    assert stats.bytes_sent + stats.bytes_received < 1024
    pair.close()


async def test_a_directory_deleted_on_one_side_goes_on_both(tmp_path) -> None:
    pair, local = await start(tmp_path)
    shutil.rmtree(pair.share / "dir")
    stats = await pair.run("sync", local)
    assert stats.in_step and not stats.failed
    assert not (local / "dir").exists()
    pair.close()


async def test_a_file_where_the_other_side_made_a_directory(tmp_path) -> None:
    pair, local = await start(tmp_path)
    os.remove(local / "a.txt")
    write(local / "a.txt" / "inside.txt", b"a directory now", T0 + 50)
    write(pair.share / "a.txt", b"edited file there", T0 + 60)
    stats = await pair.run("sync", local)
    assert stats.in_step and not stats.failed
    [(path, copy)] = stats.conflicts
    assert path == "a.txt"
    assert (local / "a.txt" / "inside.txt").exists()  # the directory wins
    assert (local / copy).read_bytes() == b"edited file there"
    assert tree_state(local, False) == tree_state(pair.share, False)
    pair.close()


@pytest.mark.parametrize("failure", ["EIO", "ENOSPC"])
async def test_a_failed_round_loses_nothing(tmp_path, monkeypatch, failure: str) -> None:
    """A round in which a push fails (one file: EIO; the whole round, which a full disk
    ends: ENOSPC) stores a base that still tells both sides' changes apart, so the next
    round completes them and overwrites nothing."""
    import errno

    from rdc.errors import RemoteError
    from rdc.local.replica import Replica

    pair, local = await start(tmp_path)
    write(local / "a.txt", b"edited here\n", T0 + 300)
    write(pair.share / "dir" / "b.txt", b"edited there\n", T0 + 400)
    real_commit, real_install = Replica.commit, Replica.install
    real_install_all = Replica.install_all

    def full(path: str) -> None:
        if path == "a.txt":  # wherever a.txt is put in place (batched, inline or alone)
            code = getattr(errno, failure)
            raise OSError(code, f"{os.strerror(code)} (simulated)", path)

    def commit(self, temp, path, *args):
        full(path)
        return real_commit(self, temp, path, *args)

    def install(self, temp, path, *args):
        full(path)
        return real_install(self, temp, path, *args)

    def install_all(self, items):
        failed = {}
        for k, (temp, _) in enumerate(items):
            try:
                full(temp.path)
            except OSError as exc:
                failed[k] = exc
        rest = iter(real_install_all(self, [item for k, item in enumerate(items)
                                            if k not in failed]))
        return [failed[k] if k in failed else next(rest) for k in range(len(items))]

    monkeypatch.setattr(Replica, "commit", commit)
    monkeypatch.setattr(Replica, "install", install)
    monkeypatch.setattr(Replica, "install_all", install_all)
    if failure == "ENOSPC":
        with pytest.raises(RemoteError) as ended:
            await pair.run("sync", local)
        assert ended.value.code == "full" and ended.value.exit_code == 9
    else:
        stats = await pair.run("sync", local)
        assert stats.failed and not stats.in_step
        assert (local / "dir" / "b.txt").read_bytes() == b"edited there\n"
    monkeypatch.setattr(Replica, "commit", real_commit)
    monkeypatch.setattr(Replica, "install", real_install)
    monkeypatch.setattr(Replica, "install_all", real_install_all)
    stats = await pair.run("sync", local)
    assert stats.in_step and not stats.failed and not stats.conflicts
    assert (pair.share / "a.txt").read_bytes() == b"edited here\n"
    assert (local / "a.txt").read_bytes() == b"edited here\n"
    assert tree_state(local, False) == tree_state(pair.share, False)
    pair.close()
