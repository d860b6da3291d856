"""Reading snapshots for people: the entries of one (`ls`), and what changed between two
(`diff`, comparing every entry's kind, content digest, mode and time)."""

from __future__ import annotations

from dataclasses import dataclass

from rdc.repo.errors import CorruptRepo, SnapshotNotFound
from rdc.repo.repository import Repository
from rdc.repo.snapshots import Snapshot
from rdc.repo.trees import Item, walk


def items(repo: Repository, snap: Snapshot, path: str = "") -> list[Item]:
    """The entries of a snapshot (below ``path``, itself included), depth-first by name."""
    try:
        found = list(walk(repo, snap.tree, snap.meta))
    except ValueError as exc:
        raise CorruptRepo(location=repo.location,
                          message=f"snapshot {snap.short_id}: {exc}") from None
    path = path.strip("/")
    if not path:
        return found
    chosen = [i for i in found if i.path == path or i.path.startswith(path + "/")]
    if not chosen:
        raise SnapshotNotFound(location=repo.location,
                               message=f"no {path} in snapshot {snap.short_id}")
    return chosen


@dataclass(frozen=True)
class Change:
    kind: str  # "+" added, "-" removed, "M" content (or type) changed, "m" mode or time only
    path: str


def diff(old: list[Item], new: list[Item]) -> list[Change]:
    """What turns ``old`` into ``new``, in path order."""
    before = {i.path: i for i in old}
    after = {i.path: i for i in new}
    changes = []
    for path in sorted(before.keys() | after.keys()):
        a, b = before.get(path), after.get(path)
        if a is None:
            changes.append(Change("+", path))
        elif b is None:
            changes.append(Change("-", path))
        elif a.entry.kind != b.entry.kind or (a.entry.kind != "d"
                                              and a.entry.digest() != b.entry.digest()):
            changes.append(Change("M", path))
        elif (a.mode, a.mtime_ns) != (b.mode, b.mtime_ns):
            changes.append(Change("m", path))
    return changes
