"""Folder modes of ``rdc sync`` over in-memory streams: send-only leaves the server's own
changes there; receive-only makes an exact mirror and keeps the local changes it undoes as
versions."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from rdc.local.versions import VersionStore
from rdc.transfer import twoway
from rdc.transfer.stats import Options
from rdc.transfer.twoway import RECEIVE_ONLY, SEND_ONLY, undoes

from .protocol_support import Pair, tree_state, write

T0 = 1_700_000_000_000_000_000


class KeepingPair(Pair):
    """A pair whose client keeps what a receive-only round undoes, as ``rdc sync`` does."""

    def __init__(self, tmp: Path, readonly: bool = False) -> None:
        super().__init__(tmp, readonly)
        self.undone: set[str] = set()
        self.store = VersionStore(tmp / "versions", str(tmp / "local"))

    async def _run(self, connection, replica, direction, path, patterns, options, between):
        replica.fs.keeper = self.store.keeper(only=lambda p: undoes(p, self.undone))
        remote, tree = await twoway.open_round(connection, replica, "s", path, options,
                                               patterns)
        base = self.tmp / f"base-{replica.fs.path.rpartition('/')[2]}"

        def planned(round_: twoway.TwoWay) -> None:
            self.undone = round_.undone

        stats, self.actions, _ = await twoway.sync_round(
            remote, replica, base, ("here", "there"), options, tree, planned)
        return stats

    def kept(self) -> dict[str, bytes]:
        return {v.path: v.location.read_bytes() for v in self.store.versions()}


async def start(tmp_path: Path, readonly: bool = False) -> tuple[KeepingPair, Path]:
    """A share and a local directory in step (a first receive-only round fills it)."""
    pair = KeepingPair(tmp_path, readonly)
    local = tmp_path / "local"
    local.mkdir()
    write(pair.share / "a.txt", b"alpha\n" * 500, T0)
    write(pair.share / "dir" / "b.txt", b"beta\n" * 500, T0)
    write(pair.share / "dir" / "c.bin", os.urandom(20_000), T0)
    stats = await pair.run("sync", local, options=Options(mode=RECEIVE_ONLY))
    assert stats.in_step and not stats.failed
    assert tree_state(local, False) == tree_state(pair.share, False)
    return pair, local


RECEIVE = Options(mode=RECEIVE_ONLY)
SEND = Options(mode=SEND_ONLY)


async def test_receive_only_undoes_local_changes_and_keeps_them(tmp_path) -> None:
    pair, local = await start(tmp_path, readonly=True)
    write(local / "a.txt", b"edited here\n", T0 + 10)
    write(local / "new.txt", b"made here\n", T0 + 10)
    write(local / "newdir" / "x.txt", b"in a new directory\n", T0 + 10)
    os.remove(local / "dir" / "c.bin")
    write(pair.share / "dir" / "b.txt", b"edited there\n", T0 + 20)
    stats = await pair.run("sync", local, options=RECEIVE)
    assert stats.in_step and not stats.failed and not stats.conflicts
    assert tree_state(local, False) == tree_state(pair.share, False)
    assert (local / "dir" / "b.txt").read_bytes() == b"edited there\n"
    assert pair.kept() == {"a.txt": b"edited here\n", "new.txt": b"made here\n",
                           "newdir/x.txt": b"in a new directory\n"}
    assert not pair.actions.pushes and not pair.actions.remote_rms
    # The server's own edits replace local files that were not changed here: not kept.
    write(pair.share / "a.txt", b"edited there too\n", T0 + 30)
    stats = await pair.run("sync", local, options=RECEIVE)
    assert stats.in_step and len(pair.store.versions("a.txt")) == 1
    pair.close()


async def test_receive_only_keeps_a_local_edit_inside_a_directory_the_server_deleted(
    tmp_path,
) -> None:
    pair, local = await start(tmp_path)
    write(local / "dir" / "b.txt", b"edited here\n", T0 + 10)
    shutil.rmtree(pair.share / "dir")
    stats = await pair.run("sync", local, options=RECEIVE)
    assert stats.in_step and not (local / "dir").exists()
    assert pair.kept() == {"dir/b.txt": b"edited here\n"}  # c.bin was the server's as is
    pair.close()


async def test_receive_only_into_a_directory_that_has_other_files(tmp_path) -> None:
    pair = KeepingPair(tmp_path, readonly=True)
    local = tmp_path / "local"
    write(pair.share / "same.txt", b"same", T0)
    write(pair.share / "differs.txt", b"the server's", T0)
    write(local / "same.txt", b"same", T0)
    write(local / "differs.txt", b"mine", T0)
    write(local / "only-here.txt", b"mine alone", T0)
    stats = await pair.run("sync", local, options=RECEIVE)
    assert stats.in_step and tree_state(local, False) == tree_state(pair.share, False)
    assert pair.kept() == {"differs.txt": b"mine", "only-here.txt": b"mine alone"}
    pair.close()


async def test_send_only_sends_local_changes_and_leaves_the_servers(tmp_path) -> None:
    pair, local = await start(tmp_path)
    write(local / "a.txt", b"edited here\n", T0 + 10)
    write(local / "mine.txt", b"new here\n", T0 + 10)
    os.chmod(local / "dir" / "c.bin", 0o600)
    write(pair.share / "dir" / "b.txt", b"edited there\n", T0 + 20)
    write(pair.share / "theirs.txt", b"new there\n", T0 + 20)
    os.remove(pair.share / "dir" / "c.bin")
    os.utime(local / "dir" / "b.txt", ns=(T0 + 5, T0 + 5))
    stats = await pair.run("sync", local, options=SEND)
    assert stats.in_step and not stats.failed and not stats.conflicts
    assert (pair.share / "a.txt").read_bytes() == b"edited here\n"
    assert (pair.share / "mine.txt").read_bytes() == b"new here\n"
    assert (pair.share / "dir" / "b.txt").read_bytes() == b"edited there\n"
    assert not (pair.share / "dir" / "c.bin").exists()  # a deletion there is not undone
    assert (local / "dir" / "b.txt").read_bytes() == b"beta\n" * 500  # nor fetched here
    assert (local / "dir" / "c.bin").exists() and not (local / "theirs.txt").exists()
    assert not pair.actions.gets and not pair.actions.local_rms
    assert not pair.actions.local_meta
    # The next round finds nothing to do: the server's changes stay "changed there".
    stats = await pair.run("sync", local, options=SEND)
    assert stats.in_step and not pair.actions
    # Until this side changes one of them: then it goes up (the server's edit kept aside).
    write(local / "dir" / "b.txt", b"edited here later\n", T0 + 40)
    stats = await pair.run("sync", local, options=SEND)
    [(path, copy)] = stats.conflicts
    assert path == "dir/b.txt" and (pair.share / copy).read_bytes() == b"edited there\n"
    assert (pair.share / "dir" / "b.txt").read_bytes() == b"edited here later\n"
    assert not (local / copy).exists()
    pair.close()


async def test_send_only_mode_change_goes_up_and_a_server_one_stays(tmp_path) -> None:
    pair, local = await start(tmp_path)
    os.chmod(local / "a.txt", 0o600)
    os.chmod(pair.share / "dir" / "b.txt", 0o640)
    stats = await pair.run("sync", local, options=SEND)
    assert stats.in_step and not stats.failed
    assert os.stat(pair.share / "a.txt").st_mode & 0o777 == 0o600
    assert os.stat(local / "dir" / "b.txt").st_mode & 0o777 == 0o644
    assert os.stat(pair.share / "dir" / "b.txt").st_mode & 0o777 == 0o640
    stats = await pair.run("sync", local, options=SEND)
    assert not pair.actions
    pair.close()


async def test_send_only_a_directory_deleted_here_goes_there(tmp_path) -> None:
    pair, local = await start(tmp_path)
    shutil.rmtree(local / "dir")
    os.remove(pair.share / "a.txt")
    stats = await pair.run("sync", local, options=SEND)
    assert stats.in_step and not stats.failed
    assert not (pair.share / "dir").exists()
    assert (local / "a.txt").exists()  # deleted there: left here
    pair.close()
