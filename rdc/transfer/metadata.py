"""The metadata phase of push and pull: modes and modification times, after the content.

Top-down over metadata hashes (``mlist``). Where a directory's content is the same on both
sides, its entries' times and modes travel as vectors without names (cheap: Django's 10,000
entries cost a few KB). Where it is not (the receiver keeps extra entries, without
``--delete``), that directory is listed with its entries' times and modes instead, and the
entries both sides have are set one by one.

Before the walk, a push sets the times and modes of the directories whose entries it wrote
(`touched`): each install moved such a directory's time on the target, and where few files
changed they are most of what differs. Set first, they leave the walk nothing to send for
a subtree whose other entries kept their metadata, where it would otherwise send vectors
of the whole subtree. A server with ``kept-dir-times`` sets the directories of a pushed
batch back to their times itself, and a push sends no op for those where it only replaced
files edited in place (`kept_dirs`).

A pull has no such ops to send: it is the target. Before its walk it puts the times of the
directories it wrote in back to what its scan saw (`put_back_times`). Where the source's
directory kept its time (files edited in place), the two now agree and the walk stops at
the root; where it did not, the walk finds it, as it would have found the time the writes
left. A pull of 1% edited files among 100,000 spent 388 KB on the walk's vectors.
"""

from __future__ import annotations

from rdc.local.paths import join, parent
from rdc.local.replica import Replica
from rdc.local.snapshot import Entry, entries_below, files_meta, lookup, meta_of
from rdc.records import record
from rdc.transfer.compare import Changes
from rdc.transfer.ops import WHOLE_META
from rdc.transfer.sides import Local, Remote
from rdc.wire import messages as m

# An op names its directory (a path and a score of bytes); a whole subtree's vectors cost
# a byte or more per entry. Directories set one by one pay where they are at most one in
# this many of the tree's entries. Measured: a 1% edit of 100,000 files in 4,165
# directories sent 1,170 KB of vectors and now 49 KB of ops (before compression);
# scattered edits in 636 of Django's directories, 2.5% fewer bytes on the wire; a Django
# release pair, where every file's time changed and the vectors travel anyway, 0.9% more;
# a first copy of Django, whose 3,222 directories are a third of its entries, keeps its
# vectors.
TOUCHED_SHARE = 8


def touched(changes: Changes) -> list[str]:
    """The directories below the top whose entries ``changes`` writes: those created and
    the parents of every entry created, replaced or removed, parents first. (Where the
    removals are not made, their directories differ in content, and the walk sets their
    times one by one: setting them first is what it would do.)"""
    dirs = _written_in(changes, [path for path, _ in changes.files])
    dirs.discard("")
    return sorted(dirs, key=lambda path: (path.count("/"), path))


def _written_in(changes: Changes, files: list[str]) -> set[str]:
    """The directories whose entries ``changes`` writes, counting of its files only
    ``files``: those created, and the parents of every entry created, replaced or
    removed."""
    paths = [path for path, _ in changes.replace] + [path for path, _ in changes.mkdirs]
    paths += files + [path for path, _, _ in changes.links]
    paths += [path for path, _ in changes.removals]
    return {parent(path) for path in paths} | {path for path, _ in changes.mkdirs}


def put_back_times(replica: Replica, before: Entry, changes: Changes) -> None:
    """Set each directory below the top that ``changes`` wrote in, and that ``before`` (the
    scan the writes started from) holds, back to the time it had there (blocking)."""
    back: list[tuple[str, int]] = []
    for path in touched(changes):
        entry = lookup(before, path)
        if entry is not None and entry.kind == "d":
            back.append((path, entry.mtime_ns))
    replica.set_dir_times(back)


def kept_dirs(changes: Changes, kept: set[str], tree: Entry) -> set[str]:
    """The directories of ``tree`` (the source's) that need no op after the content phase:
    ``changes`` only replaced files there, each in ``kept`` (written by a pushed batch whose
    server set the directory's time back, ``kept-dir-times``) and newer than the directory
    (edited in place: a save by rename would have moved the directory's time with the
    file's). One guessed wrong costs bytes, not the result: the walk finds it."""
    replaced: set[str] = set()
    others: list[str] = []  # the files written otherwise
    for path, there in changes.files:
        if there is None or path not in kept:  # (a first copy's files: no look-ups)
            others.append(path)
            continue
        where = parent(path)
        entry, directory = lookup(tree, path), lookup(tree, where)
        if entry is not None and directory is not None and entry.mtime_ns > directory.mtime_ns:
            replaced.add(where)
        else:
            others.append(path)
    return replaced - _written_in(changes, others)


def first_ops(tree: Entry, changes: Changes | None, kept: set[str] | None,
              entries: int) -> list[m.Op]:
    """A push's ops that set the directories ``changes`` wrote in (`touched`) to their
    modes and times in ``tree``, where they are few among the tree's ``entries``
    (TOUCHED_SHARE); none for those whose times the server kept (`kept_dirs` of the files
    in ``kept``)."""
    dirs = touched(changes) if changes is not None else []
    if not _few(dirs, entries):
        return []
    settled = kept_dirs(changes, kept, tree) if changes is not None and kept else set()
    ops = []
    for path in dirs:
        entry = lookup(tree, path)
        if entry is not None and entry.kind == "d" and path not in settled:
            ops.append(m.Op("meta", path, mode=entry.mode, mtime_ns=entry.mtime_ns))
    return ops


def _few(dirs: list[str], entries: int) -> bool:
    return bool(dirs) and len(dirs) * TOUCHED_SHARE <= entries


@record
class Single:
    """One entry whose mode or time differs, in a directory whose content differs."""

    path: str
    local: Entry
    remote: m.Listed


async def walk(remote: Remote, tree: Entry, their_vectors: bool = True, *, hb: int,
               levels: bool = False) -> tuple[list[tuple[m.MetaDir, Entry]], list[Single]]:
    """The metadata that differs between ``tree`` and the server's: the server's vectors
    with their local directory, for directories of equal content, and `Single` entries.
    Without ``their_vectors`` (a push, which sends its own), a whole subtree whose meta hash
    differs comes with empty vectors, and one whose hash is the same is left out. ``hb``:
    the hash prefix length (`rdc.transfer.compare.first_prefix`); ``levels``: ask level by
    level (a pull that wrote in few directories, `bring_in_step`), except below a directory
    most of whose own entries differ (`_widespread`): there the subdirectories that differ
    are asked for whole, as without ``levels``. A push below a directory most of whose
    subdirectories differ asks at once for the levels the server splits (`_split_below`),
    each answer taken once its parent's says it differs."""
    vectors: list[tuple[m.MetaDir, Entry]] = []
    singles: list[Single] = []
    frontier, deep = [""], []  # asked level by level (with ``levels``), and whole
    unsplit: list[str] = []  # asked level by level, their files' vectors too
    ahead: set[str] = set()  # asked before their parents' answers said they differ
    while frontier or deep or unsplit:
        next_ahead: list[str] = []
        next_frontier: list[str] = []
        next_deep: list[str] = []
        next_unsplit: list[str] = []
        mismatched: list[str] = []
        items = await remote.metadata(frontier, hb, vectors=their_vectors, levels=levels,
                                      deep=deep, unsplit=unsplit)
        answered = {item.path for item in items}
        reached = {path for path in [*frontier, *deep, *unsplit] if path not in ahead}
        for item in sorted(items, key=lambda item: _depth(item.path)):  # parents first
            local = lookup(tree, item.path)
            if item.path not in reached or local is None or local.kind != "d":
                continue
            if local.content[: len(item.content)] != item.content:
                mismatched.append(item.path)
                continue
            if item.files:
                joined = _joined(item, local)
                if joined is None:  # its other entries differ too: ask for them
                    next_unsplit.append(item.path)
                    continue
                item = joined
            if item.whole and _hash_only(item, hb) and item.metas == local.meta[:hb]:
                continue  # the same subtree metadata: nothing to send
            vectors.append((item, local))
            if not item.whole:
                subdirs = [(n, e) for n, e in local.sorted_children() if e.kind == "d"]
                differ = [
                    (join(item.path, name), entry) for k, (name, entry) in enumerate(subdirs)
                    if item.metas[k * hb : (k + 1) * hb] != entry.meta[:hb]
                ]
                if levels and _widespread(item, local):
                    next_deep += [path for path, _ in differ]
                    continue
                # Most differ (a push of a new release: every time): the levels below that
                # the server splits are asked for now, not one round trip each.
                look_ahead = not their_vectors and 2 * len(differ) > len(subdirs)
                for path, entry in differ:
                    if path in answered:  # (asked ahead last round)
                        reached.add(path)
                        continue
                    next_frontier.append(path)
                    if look_ahead:
                        next_ahead += _split_below(entry, path, AHEAD_MAX - len(next_ahead))
        if mismatched:
            listings = await remote.listings(mismatched, hb, meta=True)
            for path in mismatched:
                theirs_all = listings.get(path) or {}
                local = lookup(tree, path)
                assert local is not None
                for name, entry in local.sorted_children():
                    theirs = theirs_all.get(name)
                    if theirs is None or theirs.kind != entry.kind:
                        continue
                    if theirs.mode != entry.mode or theirs.mtime_ns != entry.mtime_ns:
                        singles.append(Single(join(path, name), entry, theirs))
                    if entry.kind == "d" and theirs.meta != entry.meta[:hb]:
                        next_frontier.append(join(path, name))
        # (a path named as differing too is reached whatever its parent's answer says)
        ahead = set(next_ahead).difference(next_frontier)
        frontier = list(dict.fromkeys(next_frontier + next_ahead))
        deep, unsplit = next_deep, next_unsplit
    return vectors, singles


def _depth(path: str) -> int:
    return path.count("/") + 1 if path else 0


# Directories a push's walk asks for in one round ahead of their parents' answers, at most.
AHEAD_MAX = 256


def _split_below(directory: Entry, path: str, most: int) -> list[str]:
    """Breadth first, up to ``most`` directories below ``directory`` (at ``path``) that a
    walk would reach if every subtree's metadata differed: the subdirectories of each
    directory the server describes level by level (more than WHOLE_META entries:
    `rdc.transfer.ops.mlisting`). Asked for at once, those levels cost one round trip,
    not one each (the answers for those that turn out the same are a few bytes each)."""
    out: list[str] = []
    queue = [(path, directory)]
    while queue:
        at, entry = queue.pop(0)
        if entry.count <= WHOLE_META:
            continue
        for name, child in entry.sorted_children():
            if child.kind == "d":
                if len(out) >= most:
                    return out
                out.append(join(at, name))
                queue.append((out[-1], child))
    return out


def _joined(item: m.MetaDir, local: Entry) -> m.MetaDir | None:
    """A ``split`` item made whole: its subdirectories' vectors, with this side's own times
    and modes for the other entries, where the hash of those (`files_meta`) is the
    server's; None where it is not (or the item does not fit the directory)."""
    if files_meta(local)[: len(item.files)] != item.files:
        return None
    try:
        times, modes = iter(item.times.decode()), iter(item.modes.decode())
        whole_times, whole_modes = [], []
        for _, entry in local.sorted_children():
            if entry.kind == "d":
                whole_times.append(next(times))
                whole_modes.append(next(modes))
            else:
                whole_times.append(entry.mtime_ns)
                whole_modes.append(entry.mode)
    except (ValueError, StopIteration):
        return None
    if next(times, None) is not None or next(modes, None) is not None:
        return None
    return m.MetaDir(item.path, item.content, False, m.Vector.encode(whole_times),
                     m.Vector.encode(whole_modes), item.metas)


def _widespread(item: m.MetaDir, local: Entry) -> bool:
    """Whether most of a directory's own entries differ in mode or time from the server's
    one-level vectors (``item``): then its subtrees most likely differ throughout (a new
    release unpacked: every time changed), and one whole vector each costs a byte or so an
    entry where a vector per directory cost ten (3,197 of them, 65 KB, for a pull of Django
    5.0.1 -> 5.0.2 that wrote in a few directories)."""
    try:
        times, modes = item.times.decode(), item.modes.decode()
    except ValueError:
        return False
    children = local.sorted_children()
    if not children or not len(times) == len(modes) == len(children):
        return False
    differing = sum(entry.mtime_ns != mtime or (entry.kind != "l" and entry.mode != mode)
                    for (_, entry), mtime, mode in zip(children, times, modes, strict=True))
    return 2 * differing > len(children)


def _hash_only(item: m.MetaDir, hb: int) -> bool:
    """A whole item described by its meta hash alone (``mlist`` without ``vectors``; a
    server that ignores the field sends vectors and no hash)."""
    return len(item.metas) == hb and not item.times.table and not item.times.index


def differences(vectors: list[tuple[m.MetaDir, Entry]], singles: list[Single]
                ) -> list[tuple[str, str]]:
    """(path, "mode", "time" or "mode and time") of every entry whose metadata differs: for
    a dry run's listing."""
    out = []
    for item, local in vectors:
        try:
            theirs = list(zip(item.times.decode(), item.modes.decode(), strict=True))
        except ValueError:
            continue
        entries = entries_below(local) if item.whole else local.sorted_children()
        if len(entries) != len(theirs):
            continue
        for (rel, entry), (mtime, mode) in zip(entries, theirs, strict=True):
            out.append((join(item.path, rel),
                        what(entry.mode != mode, entry.mtime_ns != mtime)))
    for single in singles:
        out.append((single.path, what(single.local.mode != single.remote.mode,
                                      single.local.mtime_ns != single.remote.mtime_ns)))
    return [(path, change) for path, change in out if change]


def what(mode: bool, time: bool) -> str:
    """How an entry's metadata differs, in a dry run's words ("" if it does not)."""
    return "mode and time" if mode and time else "mode" if mode else "time" if time else ""


async def bring_in_step(local: Local, remote: Remote, push: bool, last: list[m.Op],
                        hb: int, changes: Changes | None = None, kept: set[str] | None = None,
                        sent: tuple[list[m.Op], list[m.Failure | None]] | None = None,
                        ) -> tuple[list[m.Op], list[m.Failure | None]]:
    """Bring the target's modes and times (the server's in a push, else this side's) to
    the source's. ``last`` ops go after all others (the opened directory's own time, which
    the others may move); ``hb``: as for `walk`; ``changes``: what the content phase
    wrote, whose directories (`touched`) a push sets first where they are few
    (`first_ops`), unless ``sent`` has those ops and their results already. Returns the
    per-entry ops and their results."""
    if sent is not None:
        first, done = sent
    else:
        first = first_ops(local.tree, changes, kept, local.tree.count) if push else []
        if first:
            remote.drop_early()  # (asked before these ops: its answer would not show them)
        done = await remote.apply(first) if first else []
    few = not push and _few(touched(changes) if changes is not None else [],
                            local.tree.count)
    # A pull that wrote in few directories walks down to them level by level: the whole
    # vectors of every subtree above one would be most of its bytes. (A push has set them
    # first; where every entry's time differs, level by level would cost ten times the
    # whole vectors' plain bytes.)
    vectors, singles = await walk(remote, local.tree, their_vectors=not push, hb=hb,
                                  levels=few)
    if push:
        updates = []
        for item, directory in vectors:
            mine = meta_of(directory, item.whole)
            try:
                theirs = (item.times.decode(), item.modes.decode())
            except ValueError:
                theirs = ([], [])
            if mine != theirs:
                updates.append(m.MetaDir(item.path, item.content, item.whole,
                                         m.Vector.encode(mine[0]), m.Vector.encode(mine[1])))
        await remote.set_vectors(updates)
        ops = [m.Op("meta", s.path, mode=s.local.mode, mtime_ns=s.local.mtime_ns)
               for s in singles]
        target = remote
    else:
        await local.set_vectors([item for item, _ in vectors])
        ops = [m.Op("meta", s.path, mode=s.remote.mode, mtime_ns=s.remote.mtime_ns)
               for s in singles]
        target = local  # type: ignore[assignment]
    ops += last
    return first + ops, done + await target.apply(ops)
