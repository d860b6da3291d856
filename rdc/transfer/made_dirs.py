"""The target's prelude (entries of another kind removed, new directories made) applied in
stages while the files already go.

A first copy of Django makes 3,221 directories before its first file: one `ops` message
that held every file back for 0.13 s of a 1.8 s push. The prelude is in walk order
(level by level, parents first), as are the files, so the first files need only the first
directories. Here the ops go in stages of `FIRST_STAGE` ops, twice as many each time, one
after another (a directory's parent is made in its own stage or an earlier one), and a
file waits only for the stage that makes its directory (or removes what was at its path).
"""

from __future__ import annotations

from collections.abc import Iterable

import trio

from rdc.local.paths import parent
from rdc.transfer.sides import Side
from rdc.transfer.stats import Stats
from rdc.wire import messages as m

FIRST_STAGE = 64


class MadeDirs:
    """The prelude ``ops`` (removals, then mkdirs parents first) applied in stages by
    `make`, while files wait in `ready` for the stages their paths need."""

    def __init__(self, ops: list[m.Op]) -> None:
        self._ops = ops
        self._at = {op.path: k for k, op in enumerate(ops)}  # a path's last op
        self._done = 0  # ops[:done] applied, each done or failed
        self._progress = trio.Event()

    async def make(self, target: Side, stats: Stats) -> None:
        """Apply the ops in stages, in order; count the directories made in ``stats``."""
        size = FIRST_STAGE
        while self._done < len(self._ops):
            stage = self._ops[self._done : self._done + size]
            done = stats.ops_done(stage, await target.apply(stage))
            stats.dirs_created += sum(ok for op, ok in zip(stage, done, strict=True)
                                      if op.kind == "mkdir")
            self._done += len(stage)
            size *= 2
            self._progress.set()
            self._progress = trio.Event()

    async def ready(self, paths: Iterable[str]) -> None:
        """Return once the ops at ``paths`` and at their directories have been applied
        (done or failed: a file in a directory that could not be made fails when it is
        written, as it did when every directory was made first)."""
        if self._done < len(self._ops):  # (once all are applied, no path need be looked up)
            at = self._at
            await self._until(1 + max(
                (max(at.get(path, -1), at.get(parent(path), -1)) for path in paths),
                default=-1))

    async def all_made(self) -> None:
        """Return once every op has been applied."""
        await self._until(len(self._ops))

    async def _until(self, count: int) -> None:
        """Return once the first ``count`` ops have been applied."""
        while self._done < count:
            await self._progress.wait()
