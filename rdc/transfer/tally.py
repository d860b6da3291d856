"""The file counters of a finished run, from the trees it saw (`Stats.settle` does the
counting): which files a push, pull or sync round covered, which it set out to move, and
which it could not read."""

from __future__ import annotations

import stat
from collections.abc import Collection, Iterable, Iterator

from rdc.local.replica import Replica
from rdc.local.snapshot import Entry, iter_files, lookup
from rdc.transfer.stats import Stats, count_files


class TreeFiles(Collection[str]):
    """The regular files of a tree by path, answering as their set would, without a path
    string and a set entry each (for 100,000 files, 20 MB at the end of a first copy: the
    client's peak)."""

    def __init__(self, tree: Entry | None) -> None:
        self.tree = tree
        self._count: int | None = None

    def __len__(self) -> int:
        if self._count is None:
            self._count = 0 if self.tree is None else count_files(self.tree)
        return self._count

    def __contains__(self, path: object) -> bool:
        if not isinstance(path, str) or self.tree is None:
            return False
        entry = lookup(self.tree, path)
        return entry is not None and entry.kind == "f"

    def __iter__(self) -> Iterator[str]:
        if self.tree is not None:
            yield from (path for _, _, _, path in iter_files(self.tree))


def files_of(tree: Entry | None) -> TreeFiles:
    """The regular files of ``tree``, by path."""
    return TreeFiles(tree)


def unreadable_files(replica: Replica) -> list[str]:
    """The paths the last scan could not read that are regular files (not directories)."""
    out = []
    for path, _ in replica.errors:
        try:
            st = replica.fs.lstat(path)
        except OSError:
            st = None
        if st is None or stat.S_ISREG(st.st_mode):
            out.append(path)
    return out


def _outside(files: Collection[str], paths: Iterable[str]) -> set[str]:
    """``files`` without those at or below any of ``paths``."""
    prefixes = tuple(p + "/" for p in paths)
    cut = set(paths)
    return {f for f in files if f not in cut and not f.startswith(prefixes)}


def settle_one_way(stats: Stats, replica: Replica, push: bool, dry_run: bool,
                   files: Collection[str] | None = None) -> Stats:
    """Settle a push's or pull's counters. The files covered are the source's: a push's
    local tree (as scanned; ``files`` when it was not scanned again); for a pull, the
    local tree at the end but for what only this side has and kept (no ``--delete``)."""
    changes = stats.changes
    planned = [path for plan in stats.plans() for path, _ in plan.files]
    covered = (files if files is not None else stats.covered if stats.covered is not None
               else files_of(replica.tree))
    unreadable: list[str] = []
    if push:
        unreadable = unreadable_files(replica)
    elif changes is not None:
        removed = {path for kind, path, _ in stats.applied if kind == "rm"}
        covered = _outside(covered, [p for p, _ in changes.removals if p not in removed])
    stats.settle(covered, planned, unreadable, dry_run)
    return stats


def settle_in_step(stats: Stats, files: int) -> Stats:
    """Settle the counters of a push or pull that found both sides in step: all of the
    source's ``files`` unchanged (as `settle_one_way` counts them, without their names:
    a walk that found nothing changed may not have listed them)."""
    stats.files_total = stats.files_unchanged = files
    return stats


def settle_two_way(stats: Stats, replica: Replica, tree: Entry, moved: Iterable[str],
                   dry_run: bool) -> Stats:
    """Settle a sync round's counters: the files covered are those here at its end (in
    step, the server's too), and those it failed to bring here."""
    stats.settle(files_of(tree), moved, unreadable_files(replica), dry_run)
    return stats
