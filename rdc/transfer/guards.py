"""Deletion guards: the checks a run's deletions must pass before any is made.

A sync deletes on one side what the other side (the *source* of the deletion) no longer
has. When the source is not what it seems (a disk not mounted, a wrong directory), that
is everything. So, before deleting anything, a run checks, in this order:

1. the source lost its folder marker (`rdc.local.marker`): it had one and has not now;
2. the source is empty;
3. more entries would go than ``--max-delete`` allows;
4. more than DELETE_SHARE of the receiving side's files would go (and more than
   DELETE_FREE of them: small trees are not held to the share).

If one holds, none of that run's deletions is made (all or nothing: a partial deletion
would be the hardest state to reason about), everything else is, and the run says why
and exits with its own code (`rdc.errors.EXIT_DELETE_REFUSED`). ``--force`` lifts all four.
"""

from __future__ import annotations

from rdc.local.marker import MARKER
from rdc.local.paths import join
from rdc.records import record
from rdc.transfer.sides import Side
from rdc.transfer.stats import Options
from rdc.wire import messages as m

DELETE_SHARE = 0.5  # of the receiving side's files, at most, in one run ...
DELETE_FREE = 10  # ... unless it deletes at most this many files


@record
class Source:
    """The side whose state a deletion follows: how to name it, whether it lost its
    marker, whether it is empty."""

    where: str
    lost: bool = False
    empty: bool = False


@record
class Size:
    """What a set of deletions would remove: entries (every file, link and directory, a
    directory's whole subtree included) and, among them, regular files."""

    entries: int = 0
    files: int = 0


async def size_of(target: Side, removals: list[tuple[str, m.Expected | None]]) -> Size:
    """What removing ``removals`` (path, what the target holds there) from ``target``
    removes: directories are listed to the bottom (only those that would go)."""
    entries = files = 0
    frontier: list[str] = []
    for path, expect in removals:
        kind = expect.kind if expect is not None else "d"
        entries += 1
        files += kind == "f"
        if kind == "d":
            frontier.append(path)
    while frontier:
        found = await target.listings(frontier, 8)
        next_frontier = []
        for path in frontier:
            for name, entry in (found.get(path) or {}).items():
                entries += 1
                files += entry.kind == "f"
                if entry.kind == "d":
                    next_frontier.append(join(path, name))
        frontier = next_frontier
    return Size(entries, files)


def refusal(source: Source, size: Size, target_files: int, target: str,
            options: Options) -> str | None:
    """Why deletions of ``size`` from ``target`` (which holds ``target_files`` files; -1:
    unknown) must not be made, or None."""
    if size.entries == 0 or options.force:
        return None
    if source.lost:
        return (f"{source.where} has lost its folder marker {MARKER} (a disk that is not "
                f"mounted looks like this): nothing was deleted from {target}. If it is the "
                f"right directory, put the marker back (touch {MARKER} there) or run again "
                "with --force")
    if source.empty:
        return (f"{source.where} is empty (a disk that is not mounted looks like this): "
                f"nothing was deleted from {target}; --force deletes anyway")
    if options.max_delete is not None and size.entries > options.max_delete:
        return (f"{size.entries:,} entries would be deleted from {target}, more than "
                f"--max-delete {options.max_delete:,}: nothing was deleted; --force deletes "
                "anyway")
    if size.files > DELETE_FREE and target_files >= 0 and size.files > DELETE_SHARE * target_files:
        return (f"{size.files:,} of the {target_files:,} files of {target} would be deleted, "
                f"more than {DELETE_SHARE:.0%} of them: nothing was deleted; --force "
                "deletes anyway")
    return None
