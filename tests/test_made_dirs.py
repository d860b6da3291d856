"""The prelude in stages (`rdc.transfer.made_dirs`): files wait only for the stage that
makes their directory, stages go in order, and failures are counted as before."""

from __future__ import annotations

import trio
import trio.testing

from rdc.transfer.made_dirs import FIRST_STAGE, MadeDirs
from rdc.transfer.stats import Stats
from rdc.wire import messages as m


class StagedTarget:
    """A target side that applies each `apply` call only when the test lets it (one
    ``go`` per call), recording the paths of each call; mkdirs of ``failing`` fail."""

    def __init__(self, failing: frozenset[str] = frozenset()) -> None:
        self.stages: list[list[str]] = []
        self.failing = failing
        self.go = trio.Semaphore(0)

    async def apply(self, ops: list[m.Op]) -> list[m.Failure | None]:
        await self.go.acquire()
        self.stages.append([op.path for op in ops])
        return [m.Failure("io", "no") if op.path in self.failing else None for op in ops]


def tree_prelude(width: int) -> list[m.Op]:
    """One removal, then ``width`` top directories and a child in each, level by level
    (the order `rdc.transfer.compare` gives)."""
    ops = [m.Op("rm", "was-a-file", expect=m.NOTHING)]
    ops += [m.Op("mkdir", f"d{n:03}", mode=0o755) for n in range(width)]
    ops += [m.Op("mkdir", f"d{n:03}/sub", mode=0o755) for n in range(width)]
    return ops


async def test_files_go_once_their_stage_is_made_not_the_whole_prelude() -> None:
    ops = tree_prelude(100)  # 201 ops: stages of 64, 128, then 9
    target, stats = StagedTarget(), Stats()
    made = MadeDirs(ops)
    ready_at: dict[str, int] = {}

    async def wait(path: str) -> None:
        await made.ready([path])
        ready_at[path] = len(target.stages)  # stages applied when it was let go

    async with trio.open_nursery() as nursery:
        nursery.start_soon(made.make, target, stats)
        for path in ("top.txt", "d000/a", "d070/a", "d000/sub/a", "d099/sub/a", "was-a-file"):
            nursery.start_soon(wait, path)
        await trio.testing.wait_all_tasks_blocked()
        assert ready_at == {"top.txt": 0}  # nothing to wait for at the top
        target.go.release()
        await trio.testing.wait_all_tasks_blocked()
        # the first stage made d000, and removed what was at was-a-file: those files go
        # while the rest of the prelude is still to come
        assert ready_at == {"top.txt": 0, "d000/a": 1, "was-a-file": 1}
        target.go.release()
        await trio.testing.wait_all_tasks_blocked()
        assert ready_at["d070/a"] == ready_at["d000/sub/a"] == 2
        assert "d099/sub/a" not in ready_at
        target.go.release()
    assert ready_at["d099/sub/a"] == 3
    assert [len(stage) for stage in target.stages] == [FIRST_STAGE, 2 * FIRST_STAGE, 9]
    assert [path for stage in target.stages for path in stage] == [op.path for op in ops]
    assert stats.dirs_created == 200  # the removal is not a directory made
    await made.all_made()  # returns at once now


async def test_a_directory_that_fails_lets_its_files_go_to_fail_and_is_counted_as_before(
) -> None:
    ops = tree_prelude(3)
    target, stats = StagedTarget(failing=frozenset({"d001"})), Stats()
    made = MadeDirs(ops)
    target.go.release()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(made.make, target, stats)
        with trio.fail_after(5):
            await made.ready(["d001/x", "d001/sub/y"])  # failed, not waited for forever
            await made.all_made()
    assert stats.dirs_created == 5
    assert [path for path, _ in stats.failed] == ["d001"]


async def test_no_prelude_waits_for_nothing() -> None:
    made = MadeDirs([])
    target = StagedTarget()
    with trio.fail_after(5):
        await made.ready(["a/b/c"])
        await made.make(target, Stats())
        await made.all_made()
    assert target.stages == []
