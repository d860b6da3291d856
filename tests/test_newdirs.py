"""A target's new directories are made a part at a time while the files go
(`rdc.transfer.newdirs`)."""

from __future__ import annotations

import os
import threading

import pytest
import trio

from rdc.transfer import newdirs, serving
from rdc.transfer.newdirs import NewDirs
from rdc.transfer.stats import Options, Stats
from rdc.wire import messages as m

from .protocol_support import Pair, tree_state, write


class _Target:
    """A side whose ``apply`` records the ops and fails those at ``failing`` paths."""

    def __init__(self, failing: frozenset[str] = frozenset()) -> None:
        self.applied: list[list[str]] = []
        self.failing = failing

    async def apply(self, ops: list[m.Op]) -> list[m.Failure | None]:
        await trio.sleep(0)
        self.applied.append([op.path for op in ops])
        return [m.Failure("exists", "no") if op.path in self.failing else None for op in ops]


async def test_a_file_waits_only_for_the_part_that_makes_its_directory() -> None:
    """Parts are made in order; a file under a directory of part k may go once parts up
    to k are made, a file under an old directory at once; failures are counted apart."""
    mkdirs = [(f"d{i:02d}", 0o755) for i in range(10)]
    dirs = NewDirs(mkdirs, part=4)
    target = _Target(failing=frozenset({"d05"}))
    stats = Stats()
    seen: list[tuple[str, list[list[str]]]] = []

    async def file(path: str) -> None:
        await dirs.holding([path])
        seen.append((path, [list(part) for part in target.applied]))

    async with trio.open_nursery() as nursery:
        for path in ("d09/x", "d01/y", "old/z", "top", "d05/w"):
            nursery.start_soon(file, path)
        nursery.start_soon(dirs.make, target, stats)
    assert target.applied == [[f"d{i:02d}" for i in range(k, min(k + 4, 10))]
                              for k in (0, 4, 8)]
    made_before = {path: len(parts) for path, parts in seen}
    assert made_before["old/z"] == 0 and made_before["top"] == 0
    assert made_before["d01/y"] >= 1 and made_before["d05/w"] >= 2
    assert made_before["d09/x"] == 3
    assert stats.dirs_created == 9
    assert [path for path, _ in stats.failed] == ["d05"]
    await dirs.all_made()  # (returns at once when all are made)


async def test_a_target_without_new_directories_waits_for_nothing() -> None:
    dirs = NewDirs([])
    with trio.fail_after(1):
        await dirs.holding(["a/b", "c"])
        await dirs.all_made()
        await dirs.make(_Target(), Stats())


@pytest.mark.parametrize("delete", [False, True])
async def test_files_go_before_the_last_directories_are_made(tmp_path, monkeypatch,
                                                             delete: bool) -> None:
    """A first copy of 600 directories (three parts): the server makes the last part only
    once a batch of files has come (it waits up to 10 s), and the copy ends as the
    source is; with --delete, a renamed file moves into a new directory."""
    monkeypatch.setattr(newdirs, "PART", 256)
    src = tmp_path / "src"
    pair = Pair(tmp_path)
    if delete:
        write(src / "old.bin", os.urandom(5000), 1_600_000_000_000_000_000)
        await pair.run("push", src)
    for i in range(600):  # d00..d29, each with 20 directories: 630 directories, 3 parts
        write(src / f"d{i // 20:02d}" / f"e{i:03d}" / "f.txt", b"x%d" % i + os.urandom(100),
              1_600_000_000_000_000_000 + i)
    if delete:
        (src / "d29" / "new").mkdir()
        (src / "old.bin").rename(src / "d29" / "new" / "moved.bin")
    offered, waited = threading.Event(), []
    real_receive, real_apply = serving.receive_offers, serving.apply_ops

    async def receive(*args, **kwargs):
        offered.set()
        return await real_receive(*args, **kwargs)

    def apply_ops(replica, ops, *args):
        if any(op.kind == "mkdir" and op.path.startswith("d29/") for op in ops):
            waited.append(offered.wait(10))
        return real_apply(replica, ops, *args)

    monkeypatch.setattr(serving, "receive_offers", receive)
    monkeypatch.setattr(serving, "apply_ops", apply_ops)
    stats = await pair.run("push", src, options=Options(delete=delete))
    assert stats.in_step and not stats.failed
    assert tree_state(pair.share) == tree_state(src)
    assert waited == [True]
    if delete:
        assert stats.moved["d29/new/moved.bin"][0] == "move"
    pair.close()
