"""Two-way sync (``rdc sync``): the local tree, the remote tree and the base (what both
had at the last sync) compared top-down, then the changes made in both directions.

Per entry, with L, R, B its local, remote and base states:

- L and R have the same content: in step (metadata: the side that changed it wins; if both
  did, the newer mtime).
- Only one side differs from B: that side's change is made on the other side (an edit, a
  new entry, a deletion, a rename, which is a deletion plus a new entry whose content the
  receiver already has).
- Both differ from B: a deletion loses to an edit (the edit is restored on the side that
  deleted); two different contents are both kept: the older one (by mtime; remote wins a
  tie) is moved aside to a conflict copy, ``NAME.sync-conflict-YYYYMMDD-HHMMSS-HOST.EXT``,
  which then syncs like any new file; a directory beats a file or link.

Modes (``Options.mode``): ``two-way`` as above; ``send-only``, where only this side's
changes are made (on the server): a change made only on the server is left alone and its
base entry kept, so it stays "changed there" (an edit on both sides still goes up, the
server's version moved aside to a conflict copy there); and ``receive-only``, an exact
mirror of the server: every difference is settled the server's way, and the local changes
that this undoes are named in ``TwoWay.undone`` (kept as versions by the caller).

Every change on the remote side carries ``expect`` (what the listing showed), and every
local one checks the local state, so a change made meanwhile is not overwritten: that
action fails, and the next sync sees it. The new base records the planned state of each
entry, and the old base state for entries whose action failed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import trio

from rdc.local.index import Progress as ScanProgress
from rdc.local.paths import join, to_wire
from rdc.local.replica import Replica
from rdc.local.snapshot import EMPTY_CONTENT, Entry, lookup
from rdc.local.verify import CHANGED
from rdc.records import record
from rdc.transfer import guards
from rdc.transfer import sync_base as base_store
from rdc.transfer.oneway import local_marker, move_files, request_open, scan_while_opening
from rdc.transfer.sides import Hashes, Local, Remote
from rdc.transfer.stats import Options, Progress, Stats, count_files
from rdc.transfer.sync_base import DIGEST_BYTES, Known
from rdc.transfer.tally import settle_two_way
from rdc.wire import messages as m
from rdc.wire.connection import Connection

HB = DIGEST_BYTES
TWO_WAY, SEND_ONLY, RECEIVE_ONLY = "two-way", "send-only", "receive-only"
MODES = (TWO_WAY, SEND_ONLY, RECEIVE_ONLY)


@record
class State:
    """An entry as the three-way comparison sees it."""

    kind: str
    mode: int
    mtime_ns: int
    digest: bytes  # a file's root prefix, a link's whole target; directories: content prefix
    meta: bytes = b""  # directories: sync meta hash prefix (empty in the base)


def of_local(entry: Entry | None) -> State | None:
    if entry is None:
        return None
    digest = entry.digest()
    return State(entry.kind, entry.mode, entry.mtime_ns,
                 digest if entry.kind == "l" else digest[:HB], entry.smeta[:HB])


def of_remote(entry: m.Listed | None) -> State | None:
    if entry is None:
        return None
    return State(entry.kind, entry.mode, entry.mtime_ns, entry.digest, entry.smeta)


def of_base(known: Known | None) -> State | None:
    if known is None:
        return None
    return State(known.kind, known.mode, known.mtime_ns, known.digest)


def same_content(a: State | None, b: State | None) -> bool:
    """Same kind and content. Directories compare equal here when both exist: their
    content is compared entry by entry."""
    if a is None or b is None:
        return a is b
    if a.kind != b.kind:
        return False
    if a.kind == "d":
        return True
    return a.digest[:HB] == b.digest[:HB] if a.kind == "f" else a.digest == b.digest


def damaged(now: State | None, old: State | None) -> bool:
    """Whether a file's content changed since the base while its modification time did
    not: what bit rot looks like once a read finds it (an edit moves the time)."""
    return (now is not None and old is not None and now.kind == old.kind == "f"
            and now.mtime_ns == old.mtime_ns and now.digest[:HB] != old.digest[:HB])


def same_meta(a: State, b: State) -> bool:
    return a.mode == b.mode and (a.kind == "d" or a.mtime_ns == b.mtime_ns)


def known_of(entry: Entry) -> Known:
    state = of_local(entry)
    assert state is not None
    digest = b"" if entry.kind == "d" else state.digest
    known = Known(state.kind, state.mode, state.mtime_ns, digest)
    for name, child in entry.children.items():
        known.children[name] = known_of(child)
    return known


def conflict_name(path: str, host: str, when: float) -> str:
    """``dir/NAME.sync-conflict-YYYYMMDD-HHMMSS-HOST.EXT`` for ``dir/NAME.EXT``."""
    directory, _, name = path.rpartition("/")
    stem, ext = os.path.splitext(name)
    if not stem:
        stem, ext = name, ""
    host = "".join(c if c.isalnum() or c in "-_" else "-" for c in host)[:40] or "host"
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(when))
    return join(directory, f"{stem}.sync-conflict-{stamp}-{host}{ext}")


def undoes(path: str, undone: set[str]) -> bool:
    """Whether ``path`` is, or is inside, one of the ``undone`` local changes."""
    while path:
        if path in undone:
            return True
        path = path.rpartition("/")[0]
    return False


def _spec(state: State | None) -> m.Expected:
    return m.NOTHING if state is None else m.Expected(state.kind, state.digest)


@dataclass
class Actions:
    """What one sync round does, in the order it is done. Each item names the path whose
    base entry reverts if the action fails."""

    local_moves: list[tuple[str, str, list]] = field(default_factory=list)
    remote_moves: list[tuple[str, str, list]] = field(default_factory=list)
    local_replace: list[tuple[str, list]] = field(default_factory=list)
    remote_replace: list[tuple[str, list]] = field(default_factory=list)
    local_mkdirs: list[tuple[str, int]] = field(default_factory=list)
    remote_mkdirs: list[tuple[str, int]] = field(default_factory=list)
    gets: list[tuple[str, bytes | None]] = field(default_factory=list)
    pushes: list[tuple[str, bytes | None]] = field(default_factory=list)
    local_links: list[tuple[str, bytes, list]] = field(default_factory=list)
    remote_links: list[tuple[str, bytes, list]] = field(default_factory=list)
    local_rms: list[tuple[str, list]] = field(default_factory=list)
    remote_rms: list[tuple[str, list]] = field(default_factory=list)
    local_rmdirs: list[str] = field(default_factory=list)  # emptied directories
    remote_rmdirs: list[str] = field(default_factory=list)
    local_meta: list[tuple[str, int, int]] = field(default_factory=list)
    remote_meta: list[tuple[str, int, int]] = field(default_factory=list)
    conflicts: list[tuple[str, str]] = field(default_factory=list)  # (path, conflict copy)

    def __bool__(self) -> bool:
        return any(getattr(self, name) for name in self.__dataclass_fields__)


class TwoWay:
    """One round of two-way sync between ``local`` (a scanned tree) and the opened remote
    directory, given the ``base`` of the last round."""

    def __init__(
        self,
        local: Entry,
        base: Known | None,
        local_host: str,
        remote_host: str,
        unreadable_here: list[str] = (),  # type: ignore[assignment]
        unreadable_there: int = 0,
        mode: str = TWO_WAY,
    ) -> None:
        self.local = local
        self.mode = mode
        # receive-only: the local changes this round undoes (files, or whole new subtrees)
        self.undone: set[str] = set()
        # What a scan could not read is missing from its tree, not deleted: no deletion is
        # made on the other side on its account (here: by path; there: by count, so no
        # local deletion at all).
        self.unreadable_here = tuple(unreadable_here)
        self.unreadable_there = unreadable_there
        self.base = base
        self.local_host = local_host
        self.remote_host = remote_host
        self.now = time.time()
        self.actions = Actions()
        self.new_base = Known("d", local.mode, 0)
        # Directories deleted on one side ("here" or "there") but kept, maybe changed, on
        # the other: decided entry by entry, then kept if anything inside them was.
        self.half: dict[str, tuple[str, State]] = {}
        self.kept: set[str] = set()
        # Actions still to succeed per path: its new base entry stands only when none is left.
        self.pending: dict[str, int] = {}
        self._remote_side: set[str] = set()
        self.remote_sizes: dict[str, int] = {}  # the server's files' sizes, from listings
        self._pending_children: dict[str, list[tuple[str, Known | None]]] = {}

    # ------------------------------------------------------------ the base

    def _record(self, path: str, known: Known | None) -> None:
        parent, _, name = path.rpartition("/")
        if parent in self.half:
            self._pending_children.setdefault(parent, []).append((path, known))
        holder = self.new_base
        for part in parent.split("/") if parent else ():
            holder = holder.children.setdefault(part, Known("d", 0o755, 0))
        if known is None:
            holder.children.pop(name, None)
        else:
            holder.children[name] = known

    def _record_state(self, path: str, state: State | None) -> None:
        if state is None:
            self._record(path, None)
        else:
            digest = b"" if state.kind == "d" else state.digest
            self._record(path, Known(state.kind, state.mode, state.mtime_ns, digest))

    def _count_actions(self) -> None:
        a = self.actions
        # Paths with an action on the server: only the server's word confirms those.
        self._remote_side = {item[0] for items in (
            a.remote_moves, a.remote_replace, a.remote_mkdirs, a.pushes, a.remote_links,
            a.remote_rms, a.remote_meta) for item in items} | set(a.remote_rmdirs)
        self.pending = {}
        for name in self.actions.__dataclass_fields__:
            if name == "conflicts":
                continue
            for item in getattr(self.actions, name):
                path = item if isinstance(item, str) else item[0]
                self.pending[path] = self.pending.get(path, 0) + 1

    def confirm(self, path: str) -> None:
        """One action on ``path`` succeeded; its planned base entry stands once all did."""
        if self.pending.get(path, 0) > 0:
            self.pending[path] -= 1

    def revert_pending(self, replica: Replica | None = None) -> None:
        """The round ended (or was cut off): every entry with an action that did not
        succeed keeps its old base entry, so the next round still sees that change. With
        ``replica``, an entry that is here now just as planned (a file fetched or an entry
        removed before the connection dropped) counts as done: it is in step."""
        for path in sorted(self.pending, key=lambda p: p.count("/")):
            if self.pending[path] and not (replica and self._arrived(replica, path)):
                self.revert(path)
        self.pending.clear()

    def _arrived(self, replica: Replica, path: str) -> bool:
        planned: Known | None = self.new_base
        for part in path.split("/"):
            planned = planned.children.get(part) if planned is not None else None
        try:
            if planned is None:
                return replica.fs.lstat(path) is None and path not in self._remote_side
            if planned.kind == "f" and path not in self._remote_side:
                root = replica.current_root(path)
                return root is not None and root.startswith(planned.digest)
        except OSError:
            return False
        return False

    def revert(self, path: str) -> None:
        """An action on ``path`` failed: its base entry stays what it was."""
        old: Known | None = self.base
        for part in path.split("/"):
            old = old.children.get(part) if old is not None else None
        self._record(path, old)

    # ------------------------------------------------------------ planning

    async def plan(self, remote: Remote) -> Actions:
        opened = remote.hashes
        if self.local.content == opened.content and self.local.smeta == opened.smeta:
            self.new_base = known_of(self.local)
            self.new_base.children = dict(self.new_base.children)
            return self.actions
        # (path, local entry, base entry, whether the server has a directory there)
        queue: list[tuple[str, Entry | None, Known | None, bool]] = [
            ("", self.local, self.base, True)
        ]
        while queue:
            wanted = [path for path, _, _, listed in queue if listed]
            listings = await remote.listings(wanted, HB, meta=True, sizes=True) if wanted else {}
            next_queue: list[tuple[str, Entry | None, Known | None, bool]] = []
            for path, here, before, listed in queue:
                there = (listings.get(path) or {}) if listed else {}
                self.remote_sizes.update(
                    (join(path, name), entry.size) for name, entry in there.items()
                    if entry.kind == "f" and entry.size is not None
                )
                mine = here.children if here is not None and here.kind == "d" else {}
                old = before.children if before is not None and before.kind == "d" else {}
                for name in sorted(set(mine) | set(there) | set(old), key=to_wire):
                    self._entry(join(path, name), mine.get(name), there.get(name),
                                old.get(name), next_queue)
            queue = next_queue
        self._settle_halves()
        self._count_actions()
        return self.actions

    def _settle_halves(self) -> None:
        """A directory deleted on one side is made again there if something inside it is
        kept (restored); else the other side's (now empty) directory goes too."""
        for path in list(self.kept):
            parent = path.rpartition("/")[0]
            while parent in self.half and parent not in self.kept:
                self.kept.add(parent)
                parent = parent.rpartition("/")[0]
        a = self.actions
        for path in sorted(self.half, key=lambda p: p.count("/")):
            deleted_on, survivor = self.half[path]
            if not self.applies(to_local=(deleted_on == "here") == (path in self.kept)):
                self.revert(path)  # the side this would change is left alone
            elif path in self.kept:
                (a.local_mkdirs if deleted_on == "here" else a.remote_mkdirs).append(
                    (path, survivor.mode)
                )
                self._record_state(path, survivor)
                self._record_children_back(path)
            else:
                (a.remote_rmdirs if deleted_on == "here" else a.local_rmdirs).append(path)
                self._record(path, None)

    def _record_children_back(self, path: str) -> None:
        """Base entries of a kept directory's children were recorded before the directory
        itself was; `_record_state` replaced the directory: put them back."""
        for child, state in self._pending_children.pop(path, []):
            self._record(child, state)

    def _entry(self, path: str, here: Entry | None, there: m.Listed | None, before: Known | None,
               queue: list) -> None:
        mine, theirs, old = of_local(here), of_remote(there), of_base(before)
        if self.mode == RECEIVE_ONLY:
            self._mirror(path, here, there, before, queue)
            return
        if mine is not None and theirs is not None and mine.kind == theirs.kind == "d":
            if mine.digest != theirs.digest or mine.meta != theirs.meta:
                keep_mine = same_meta(mine, theirs) or self.mode == SEND_ONLY
                self._record_state(path, mine if keep_mine else theirs)
                self._dir_meta(path, mine, theirs, old)
                queue.append((path, here, before, True))
            else:
                self._record(path, known_of(here))  # type: ignore[arg-type]
            return
        if same_content(mine, theirs):
            if mine is not None and theirs is not None:
                self._meta(path, mine, theirs, old)
            return
        if old is not None and old.kind == "d" and (mine is None or theirs is None):
            survivor = mine if theirs is None else theirs
            if survivor is not None and survivor.kind == "d":  # deleted on one side only
                self.half[path] = ("there" if theirs is None else "here", survivor)
                queue.append((path, here, before, theirs is not None))
                return
        changed_here = not same_content(mine, old)
        changed_there = not same_content(theirs, old)
        if changed_here != changed_there and damaged(theirs if changed_there else mine, old):
            # Content changed without a time change on one side, the other still as it
            # was: damage (bit rot found by a scrub, --checksum or verify), not an edit.
            # The good copy repairs it, rather than the damage spreading.
            self._take(path, here, theirs, before, queue, to_local=changed_here)
            return
        if not changed_here or (changed_there and mine is None):
            self._take(path, here, theirs, before, queue, to_local=True)
        elif not changed_there or theirs is None:
            self._take(path, here, theirs, before, queue, to_local=False)
        else:
            self._conflict(path, here, theirs, before, queue)

    def _mirror(self, path: str, here: Entry | None, there: m.Listed | None,
                before: Known | None, queue: list) -> None:
        """receive-only: the local entry made like the server's, whatever changed where;
        what that undoes of the local changes since the base goes into ``undone``."""
        mine, theirs = of_local(here), of_remote(there)
        a = self.actions
        if mine is not None and theirs is not None and mine.kind == theirs.kind == "d":
            if mine.digest != theirs.digest or mine.meta != theirs.meta:
                if mine.mode != theirs.mode:
                    a.local_meta.append((path, theirs.mode, mine.mtime_ns))
                self._record_state(path, theirs)
                queue.append((path, here, before, True))
            else:
                self._record(path, known_of(here))  # type: ignore[arg-type]
            return
        if same_content(mine, theirs):
            if mine is not None and theirs is not None:
                if not same_meta(mine, theirs):
                    a.local_meta.append((path, theirs.mode, theirs.mtime_ns))
                self._record_state(path, theirs)
            return
        if here is not None:
            self._note_undone(path, here, before)
        self._take(path, here, theirs, before, queue, to_local=True)

    def _note_undone(self, path: str, here: Entry, before: Known | None) -> None:
        """Name the local changes at or under ``path`` (against the base ``before``) that
        making it like the server's undoes."""
        if here.kind != "d":
            if not same_content(of_local(here), of_base(before)):
                self.undone.add(path)
            return
        if before is None or before.kind != "d":
            self.undone.add(path)  # a new directory: all of it
            return
        for name, child in here.children.items():
            self._note_undone(join(path, name), child, before.children.get(name))

    def _meta(self, path: str, mine: State, theirs: State, old: State | None) -> None:
        """Same content on both sides; bring modes and times in step."""
        if same_meta(mine, theirs):
            self._record_state(path, mine)
            return
        if self.mode == SEND_ONLY:  # this side's metadata goes up if it changed here
            winner = mine if old is None or not same_meta(mine, old) else None
            if winner is not None:
                self.actions.remote_meta.append((path, mine.mode, mine.mtime_ns))
            self._record_state(path, mine)
            return
        if old is not None and same_meta(mine, old):
            winner = theirs
        elif old is not None and same_meta(theirs, old):
            winner = mine
        else:
            winner = mine if mine.mtime_ns > theirs.mtime_ns else theirs
        if winner is theirs:
            self.actions.local_meta.append((path, theirs.mode, theirs.mtime_ns))
        else:
            self.actions.remote_meta.append((path, mine.mode, mine.mtime_ns))
        self._record_state(path, winner)

    def _dir_meta(self, path: str, mine: State, theirs: State, old: State | None) -> None:
        if mine.mode == theirs.mode:
            return
        if old is not None and old.mode == mine.mode:
            if self.applies(to_local=True):
                self.actions.local_meta.append((path, theirs.mode, mine.mtime_ns))
        else:
            self.actions.remote_meta.append((path, mine.mode, theirs.mtime_ns))

    def _take(self, path: str, here: Entry | None, theirs: State | None, before: Known | None,
              queue: list, to_local: bool) -> None:
        """Make one side like the other: the remote state ``theirs`` comes here
        (``to_local``), or the local entry ``here`` goes there."""
        if not self.applies(to_local):  # the mode leaves that side alone: still a change
            self.revert(path)
            return
        a = self.actions
        mine = of_local(here)
        source, target = (theirs, mine) if to_local else (mine, theirs)
        replace, mkdirs, links, rms, metas = (
            (a.local_replace, a.local_mkdirs, a.local_links, a.local_rms, a.local_meta)
            if to_local else
            (a.remote_replace, a.remote_mkdirs, a.remote_links, a.remote_rms, a.remote_meta)
        )
        if source is None:
            if self._unsure_of_absence(path, to_local):
                self.revert(path)
                return
            rms.append((path, _spec(target)))
            self._record(path, None)
            return
        parent = path.rpartition("/")[0]
        if parent in self.half and self.half[parent][0] == ("here" if to_local else "there"):
            self.kept.add(parent)
        if target is not None and target.kind != source.kind:
            replace.append((path, _spec(target)))
            target = None
        if source.kind == "f":
            expect = target.digest if target is not None else None
            (a.gets if to_local else a.pushes).append((path, expect))
        elif source.kind == "l":
            links.append((path, source.digest, _spec(target)))
            metas.append((path, 0, source.mtime_ns))
        else:
            if target is None:
                mkdirs.append((path, source.mode))
            same_dir = here if here is not None and here.kind == "d" else None
            old_dir = before if before is not None and before.kind == "d" else None
            queue.append((path, same_dir, old_dir, theirs is not None))
        self._record_state(path, source)

    def applies(self, to_local: bool) -> bool:
        """Whether this mode makes changes here (``to_local``) or on the server."""
        if self.mode == SEND_ONLY:
            return not to_local
        return to_local or self.mode != RECEIVE_ONLY

    def _unsure_of_absence(self, path: str, to_local: bool) -> bool:
        """Whether the side that lacks ``path`` may only have failed to read it."""
        if to_local:
            return self.unreadable_there > 0
        return any(path == u or path.startswith(u + "/") or not u
                   for u in self.unreadable_here)

    def _conflict(self, path: str, here: Entry, theirs: State, before: Known | None,
                  queue: list) -> None:
        """Both sides changed ``path`` to different contents: keep both."""
        mine = of_local(here)
        assert mine is not None
        a = self.actions
        remote_wins = self.mode != SEND_ONLY and (theirs.kind == "d" or (
            mine.kind != "d" and theirs.mtime_ns >= mine.mtime_ns
        ))
        if remote_wins:  # move the local version aside, send it as a new entry
            copy = conflict_name(path, self.local_host, self.now)
            a.local_moves.append((path, copy, _spec(mine)))
            self._take(copy, here, None, None, queue, to_local=False)
            self._take(path, None, theirs, None, queue, to_local=True)
        else:  # move the remote version aside, fetch it as a new entry
            copy = conflict_name(path, self.remote_host, self.now)
            a.remote_moves.append((path, copy, _spec(theirs)))
            self._take(copy, None, theirs, None, queue, to_local=True)
            self._take(path, here, None, None, queue, to_local=False)
        a.conflicts.append((path, copy))


# ---------------------------------------------------------------- carrying it out


async def execute(local: Local, remote: Remote, round_: TwoWay, options: Options) -> Stats:
    """Carry out a planned round; failed actions revert their base entries."""
    a = round_.actions
    stats = Stats()

    async def apply(side: Local | Remote, ops: list[m.Op]) -> int:
        """Apply ``ops`` on ``side``; how many succeeded."""
        where = "local" if side is local else "remote"
        ok = stats.ops_done(ops, await side.apply(ops), where) if ops else []
        for op, done in zip(ops, ok, strict=True):
            round_.confirm(op.path) if done else round_.revert(op.path)
        return sum(ok)

    for side, moves in ((local, a.local_moves), (remote, a.remote_moves)):
        await apply(side, [m.Op("mv", p, destination=new, expect=e) for p, new, e in moves])
    for side, replace in ((local, a.local_replace), (remote, a.remote_replace)):
        await apply(side, [m.Op("rm", p, expect=e) for p, e in replace])
    for side, mkdirs in ((local, a.local_mkdirs), (remote, a.remote_mkdirs)):
        parents_first = sorted(mkdirs, key=lambda item: item[0].count("/"))
        stats.dirs_created += await apply(side, [m.Op("mkdir", p, mode=mode)
                                                 for p, mode in parents_first])
    connection, replica = remote.connection, local.replica
    local_sizes = {path: entry.size for path, _ in a.pushes
                   if (entry := lookup(local.tree, path)) is not None and entry.kind == "f"}
    sizes = [local_sizes.get(p, 0) for p, _ in a.pushes]
    sizes += [round_.remote_sizes.get(p, 0) for p, _ in a.gets]
    progress = Progress(options, len(sizes), sum(sizes), stats)

    def arrived(action: str) -> Callable[[str, int, bool], None]:
        def done(path: str, size: int, ok: bool) -> None:
            round_.confirm(path) if ok else round_.revert(path)
            progress.file_done(path, size, ok, action)

        return done

    async with trio.open_nursery() as nursery:
        nursery.start_soon(move_files, connection, replica, a.pushes, local_sizes, True,
                           options, stats, arrived("send"))
        nursery.start_soon(move_files, connection, replica, a.gets, round_.remote_sizes,
                           False, options, stats, arrived("fetch"))
    for side, links in ((local, a.local_links), (remote, a.remote_links)):
        stats.links += await apply(side, [m.Op("link", p, target=t, expect=e)
                                          for p, t, e in links])
    for side, rms in ((local, a.local_rms), (remote, a.remote_rms)):
        stats.deleted += await apply(side, [m.Op("rm", p, expect=e) for p, e in rms])
    for side, rmdirs in ((local, a.local_rmdirs), (remote, a.remote_rmdirs)):
        deepest_first = sorted(rmdirs, key=lambda p: -p.count("/"))
        await apply(side, [m.Op("rmdir", p) for p in deepest_first])
    for side, metas in ((local, a.local_meta), (remote, a.remote_meta)):
        await apply(side, [m.Op("meta", p, mode=mode, mtime_ns=mtime)
                           for p, mode, mtime in metas])
    stats.conflicts = list(a.conflicts)
    return stats


async def hold_back_deletions(actions: Actions, local: Local, remote: Remote,
                              options: Options) -> list[str]:
    """The deletion guards (`rdc.transfer.guards`) for each direction: deletions there
    follow this side, deletions here follow the server's. A direction whose deletions a
    guard stops has them taken out of ``actions`` (their base entries then stay as they
    were, so the next round weighs them again); returns why, per stopped direction."""
    replica, tree, hashes = local.replica, local.tree, remote.hashes
    here = f"the local directory {replica.root}"
    directions = (
        (actions.remote_rms, actions.remote_rmdirs, remote,
         guards.Source(here, local_marker(replica, options).lost, not tree.children),
         -1 if hashes.files is None else hashes.files, "the server"),
        (actions.local_rms, actions.local_rmdirs, local,
         guards.Source("the server's directory", hashes.marker_lost,
                       hashes.content == EMPTY_CONTENT),
         count_files(tree), here),
    )
    refused = []
    for rms, rmdirs, side, source, files, name in directions:
        size = await guards.size_of(side, rms)
        size = guards.Size(size.entries + len(rmdirs), size.files)
        why = guards.refusal(source, size, files, name, options)
        if why is not None:
            refused.append(why)
            rms.clear()
            rmdirs.clear()
    return refused


async def open_round(connection: Connection, replica: Replica, share: str, path: str,
                     options: Options, excludes: list[str],
                     progress: Callable[[ScanProgress], None] | None = None,
                     ) -> tuple[Remote, Entry]:
    """Open the remote directory for a sync (writable unless a dry run) and scan the local
    one meanwhile (``progress``: of that scan); the remote side and the local tree."""
    if options.markers is not None and not options.dry_run:  # before the scan
        await trio.to_thread.run_sync(local_marker, replica, options, True)
    write = not options.dry_run and options.mode != RECEIVE_ONLY
    opening = request_open(connection, share, path, write, excludes, options.checksum)
    answer, tree = await scan_while_opening(replica, opening, progress,
                                            checksum=options.checksum)
    return Remote(connection, answer), tree


async def sync_round(
    remote: Remote,
    replica: Replica,
    base_path: Path,
    hosts: tuple[str, str],
    options: Options,
    tree: Entry | None = None,
    planned: Callable[[TwoWay], None] | None = None,
    scan: Callable[[], Awaitable[Entry]] | None = None,
    confirm: bool = True,
) -> tuple[Stats, Actions, Entry]:
    """One round of ``rdc sync``: scan, plan against the stored base, carry it out (unless a
    dry run), store the new base, and check the result. ``remote.hashes`` holds the
    server's current root hashes (from ``opened`` or ``finished``). Returns the stats, the
    actions and the local tree at the end. ``tree``: the local tree if it was scanned just
    now. ``planned`` is called with the planned round before anything is changed (its
    ``undone``: what a receive-only round undoes here, for a keeper of versions; its
    ``pending``: the actions still to do, for a status). ``scan``: how to scan the local
    tree (default: ``replica.scan`` on a worker thread; a server scans under its lock).
    Without ``confirm``, a round that changed nothing there is judged against the
    server's hashes as they were at its start, not asked for again (``finish``): a
    receive-only watcher learns of later changes from the server's notices anyway, and
    the server is spared a scan per round and replica."""

    async def rescan() -> Entry:
        return await (scan() if scan is not None else trio.to_thread.run_sync(replica.scan))

    if tree is None:
        tree = await rescan()
    started = (tree.content, tree.smeta)
    damage = [f"{path}: {CHANGED} (read again by --checksum)" for path in
              getattr(getattr(replica, "stats", None), "mismatched", []) if options.checksum]
    round_ = TwoWay(tree, base_store.load(base_path), *hosts,
                    unreadable_here=[p for p, _ in replica.errors],
                    unreadable_there=remote.hashes.unreadable, mode=options.mode)
    actions = await round_.plan(remote)
    moving = [path for path, _ in actions.pushes + actions.gets]
    if planned is not None and not options.dry_run:
        planned(round_)
    local = Local(replica, tree)
    refused = await hold_back_deletions(actions, local, remote, options)
    if options.dry_run:
        stats = Stats(conflicts=list(actions.conflicts), refused=refused, warnings=damage)
        return settle_two_way(stats, replica, tree, moving, True), actions, tree
    try:
        stats = await execute(local, remote, round_, options) if actions else Stats()
        stats.refused += refused
        stats.warnings += damage
    finally:
        # Even when cut off: what was done is recorded, the rest keeps its old base.
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(replica.sync_dirs)
        round_.revert_pending(replica)
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(base_store.save, base_path, round_.new_base)
    stats.failed += [(path, f"cannot read: {reason}") for path, reason in replica.errors]
    finished: Hashes = remote.hashes
    if actions:
        there = any(getattr(actions, name) for name in (
            "remote_moves", "remote_replace", "remote_mkdirs", "pushes", "remote_links",
            "remote_rms", "remote_rmdirs", "remote_meta"))
        if confirm or there:
            finished = await remote.refreshed()
        tree = await rescan()
    stats.seq = finished.seq
    stats.in_step = tree.content == finished.content and tree.smeta == finished.smeta
    if options.mode == SEND_ONLY and not stats.in_step:
        # What the server changed stays there: done, unless something failed or changed
        # here during the round (then another round sends it).
        stats.in_step = not stats.failed and (tree.content, tree.smeta) == started
    return settle_two_way(stats, replica, tree, moving, False), actions, tree
