"""Tree operations and listings that both roles share: the server applies a pushing
client's ``ops`` and ``mset`` with these, a pulling client applies the same changes to its
own directory with them, and listings are built here."""

from __future__ import annotations

import functools
import os
import stat
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from rdc.errors import Refusal, disk_full
from rdc.local.fs import ConflictError, Expect, HeldDirs, SafeRoot
from rdc.local.ignore import Excludes
from rdc.local.index import IndexedFile
from rdc.local.paths import PathError, join
from rdc.local.replica import Replica, Retimed
from rdc.local.snapshot import Entry, entries_below, files_meta, lookup, meta_of
from rdc.wire import messages as m

# A subtree with at most this many entries travels as one metadata vector.
WHOLE_META = 4096
# Threads a message's metadata vectors are applied on (`apply_metas`). Most of a vector's
# time is spent without the GIL (the native mode and time setting, opening directories,
# SQLite), which a second thread's Python overlaps: Django 5.0.2 -> 5.0.3, every mode and
# time changed (38 vectors, 19,868 changes), 0.17-0.21 s on one thread, 0.13-0.17 s on
# two, 0.15-0.24 s on three or four (no better than one).
META_WORKERS = 2
# The ops whose paths' index rows a batch looks up at once.
_LOOKED_UP = ("mv", "rm")


def expectation(replica: Replica, path: str, expect: m.Expected | None,
                row: IndexedFile | bool | None = True,
                held: HeldDirs | None = None) -> Expect | None:
    """An ``expect`` (none: no check; nothing there; or a listing entry, a file's by its
    root prefix) as a check of what is at ``path`` when a change lands there. What can be
    checked now is (ConflictError): nothing there, or the version of a file (``row``: its
    index row, if the caller looked it up already). ``held``: `rdc.local.fs.HeldDirs`."""
    if expect is None:
        return None
    if expect.kind == "":
        if replica.fs.lstat(path, held) is not None:
            raise ConflictError(path=path, expected="nothing", found="an entry")
        return Expect.absent()
    if expect.kind == "d":
        return Expect.directory()
    if expect.kind == "l":
        return Expect.link(expect.digest)
    return replica.expect_version(path, expect.digest, row, held)


def holds(replica: Replica, path: str, root: bytes) -> bool:
    """Whether the file at ``path`` has content ``root`` now (read again if the index
    cannot vouch for it; ``root`` as an offer names it, `m.same_root`). A change whose
    expectation failed is no conflict when what is there is what it wanted (two clients
    pushing the same content at once)."""
    try:
        signature, _, f = replica.sign(path)
    except (OSError, PathError):
        return False
    f.close()
    return m.same_root(signature.root, root)


def apply_op(replica: Replica, op: m.Op, excludes: Excludes | None = None,
             top: bool = False, row: IndexedFile | bool | None = True,
             held: HeldDirs | None = None) -> None:
    """One op (blocking; raises Refusal, ConflictError, PathError or OSError). ``top``: the
    opened directory's own mode and time may be set (``meta`` with the empty path).
    ``row``: the index row of the op's path, if the caller looked it up (None: it has
    none; True: look it up here). ``held``: directory descriptors to reach the op's paths
    through, for an op that moves no directory (`_within`)."""
    path = op.path
    if not path and not (op.kind == "meta" and top):
        raise PathError(path=path, reason="the opened directory itself cannot be changed")
    if _plain_mkdir(op):
        _make_dir(replica, op)
        return
    fs = replica.fs
    if op.kind == "link" and _is_link_to(fs, path, op.target):
        return  # made meanwhile (by another client): what was wanted is there
    check = expectation(replica, path, op.expect, row, held)
    if op.kind == "mkdir":  # in place of a file or link, which goes if it is as expected
        st = fs.lstat(path)
        if st is not None and not stat.S_ISDIR(st.st_mode):
            fs.remove(path, expect=check)
            replica.forget(path)
            st = None
        if st is None:
            replica.mkdir(path, op.mode | 0o700)
    elif op.kind == "link":
        try:
            fs.symlink(path, op.target, expect=check)
        except ConflictError:
            if not _is_link_to(fs, path, op.target):
                raise  # else made between the look above and the swap: as wanted
        replica.forget(path)
    elif op.kind == "rm":
        st = fs.lstat(path, held)
        if excludes and excludes.patterns and st is not None and stat.S_ISDIR(st.st_mode):
            if check is not None and check.kind != "directory":
                raise ConflictError(path=path, expected=str(check), found="a directory")
            _remove_except(replica, path, excludes)
        else:
            fs.remove(path, expect=check, held=held)
        replica.forget(path)
    elif op.kind == "rmdir":
        fs.rmdir(path)
    elif op.kind == "mv":
        replica.move(path, op.destination, check, row, held)
    else:  # meta
        if fs.lstat(path, held) is None:
            raise FileNotFoundError(2, "no such entry", path)
        replica.set_meta(path, op.mode, op.mtime_ns, held=held)


def _is_link_to(fs: SafeRoot, path: str, target: bytes) -> bool:
    st = fs.lstat(path)
    return st is not None and stat.S_ISLNK(st.st_mode) and os.fsencode(
        fs.read_link(path)) == target


def _make_dir(replica: Replica, op: m.Op) -> None:
    """A directory where nothing (or a directory) is expected: one look at the parent, as
    most of a first copy's ops are these. Owner rwx while it is filled; the metadata phase
    sets the final mode."""
    absent = op.expect is not None and op.expect.kind == ""
    try:
        replica.mkdir(op.path, op.mode | 0o700)
    except FileExistsError:
        if absent:
            raise ConflictError(path=op.path, expected="nothing", found="an entry") from None
        raise Refusal("path", message=f"{op.path} exists and is not a directory") from None


def _remove_except(replica: Replica, path: str, excludes: Excludes) -> bool:
    """Remove the directory at ``path`` but what ``excludes`` matches inside it (with the
    directories that hold it): excluded paths are neither sent nor deleted. True if the
    directory went."""
    fs = replica.fs
    kept = False
    for name in fs.listdir(path):
        child = join(path, name)
        st = fs.lstat(child)
        is_dir = st is not None and stat.S_ISDIR(st.st_mode)
        if excludes(child, is_dir):
            kept = True
        elif is_dir:
            kept = not _remove_except(replica, child, excludes) or kept
        else:
            fs.remove(child)
    if not kept:
        fs.rmdir(path)
    return not kept


def apply_ops(
    replica: Replica, ops: list[m.Op], excludes: Excludes | None = None, top: bool = False
) -> list[m.Failure | None]:
    """Apply ``ops`` in order; one result per op (None, or why it failed). ``excludes``:
    the connection's, which a recursive removal spares; ``top`` as for `apply_op`. The
    rows of the moves' and removals' paths are looked up at once, and what the ops change
    in the index is stored together (`Replica.changing_together`); an op at a path an
    earlier one changed (a move of a file just moved there) first stores those, and looks
    its row up then."""
    results: list[m.Failure | None] = []
    looked_up = [op.path for op in ops if op.kind in _LOOKED_UP]
    rows = replica.indexed(looked_up) if looked_up else {}
    touched = _Touched()
    made: dict[int, bool] = {}  # (op index: its directory made in a native run)
    with replica.changing_together(), HeldDirs(replica.fs) as held:
        for at, op in enumerate(ops):
            if at not in made and _plain_mkdir(op):
                made.update(_made_together(replica, ops, at))
            if made.get(at):
                touched.add(op.path)
                results.append(None)
                continue
            row: IndexedFile | bool | None = True
            if op.kind in _LOOKED_UP and not touched.near(op.path) and not touched.near(
                    op.destination):
                row = rows.get(op.path)
            else:
                replica.store_changes()
            touched.add(op.path)
            touched.add(op.destination)
            within = _within(op)
            results.append(_applied(replica, op, excludes, top, row, held if within else None))
            if not within:
                held.close()  # (a directory it moved or removed may be one held)
    return results


def _within(op: m.Op) -> bool:
    """Whether ``op`` leaves every directory where it is (so a descriptor held on one
    still reaches it by its path): a move or removal of the file or link it expects, or a
    mode and time set. (989 moves of a renamed tree opened three directories each.)"""
    return op.kind == "meta" or (op.kind in _LOOKED_UP and op.expect is not None
                                 and op.expect.kind in ("f", "l"))


def _made_together(replica: Replica, ops: list[m.Op], start: int) -> dict[int, bool]:
    """Make the directories of the run of plain ``mkdir`` ops from ``start`` (nothing, or
    a directory, expected there: a first copy's thousands) in native runs
    (`Replica.mkdir_many`), when the ops before them are done; whether each was made, by
    op index. One not made is applied one by one, in its place (something is there: it
    says what)."""
    end = start
    while end < len(ops) and _plain_mkdir(ops[end]):
        end += 1
    done = replica.mkdir_many([(op.path, op.mode | 0o700) for op in ops[start:end]])
    return dict(zip(range(start, end), done, strict=True))


def _plain_mkdir(op: m.Op) -> bool:
    """Whether ``op`` is a ``mkdir`` that `_make_dir` makes (nothing, or a directory,
    expected there), not one that replaces a file or link."""
    return op.kind == "mkdir" and bool(op.path) and (op.expect is None
                                                     or op.expect.kind in ("", "d"))


class _Touched:
    """The paths a batch of ops changed so far: a path is near one if it is one, or is
    inside one, or holds one."""

    def __init__(self) -> None:
        self.paths: set[str] = set()
        self.holding: set[str] = set()  # every directory that holds one

    def add(self, path: str) -> None:
        if not path:
            return
        self.paths.add(path)
        while "/" in path:
            path = path.rpartition("/")[0]
            self.holding.add(path)

    def near(self, path: str) -> bool:
        if path in self.paths or path in self.holding:
            return True
        while "/" in path:
            path = path.rpartition("/")[0]
            if path in self.paths:
                return True
        return False


def _applied(replica: Replica, op: m.Op, excludes: Excludes | None, top: bool,
             row: IndexedFile | bool | None, held: HeldDirs | None) -> m.Failure | None:
    """`apply_op`'s outcome as an op result."""
    try:
        apply_op(replica, op, excludes, top, row, held)
    except ConflictError as exc:
        return m.Failure("conflict", str(exc))
    except PathError as exc:
        return m.Failure("path", str(exc))
    except Refusal as exc:
        return m.Failure(exc.code, str(exc))
    except OSError as exc:
        if disk_full(exc):  # no one op's failure: the run ends
            raise
        return m.Failure("io", f"{op.path}: {exc.strerror or exc}")
    return None


# ---------------------------------------------------------------- listings


def listed(name: str, entry: Entry, hb: int, meta: bool = False,
           sizes: bool = False) -> m.Listed:
    """How a listing describes ``entry``: with ``meta``, also its mtime and (directories)
    meta and sync meta hash prefixes; with ``sizes``, its size (0 but for files)."""
    digest = entry.digest()
    digest = digest if entry.kind == "l" else digest[:hb]
    size = (entry.size if entry.kind == "f" else 0) if sizes else None
    if not meta:
        return m.Listed(name, entry.kind, entry.mode, digest, size=size)
    return m.Listed(name, entry.kind, entry.mode, digest, entry.mtime_ns, entry.meta[:hb],
                    entry.smeta[:hb], True, size)


def listing(tree: Entry, path: str, hb: int, meta: bool = False,
            sizes: bool = False) -> list[m.Listed] | None:
    """The entries of the directory at ``path`` in a listing (None if it is not one)."""
    directory = lookup(tree, path)
    if directory is None or directory.kind != "d":
        return None
    return [listed(name, entry, hb, meta, sizes)
            for name, entry in directory.sorted_children()]


# The handshake feature of ``mlist`` ``split`` (docs/protocol.md "Metadata").
SPLIT_META = "split-meta"
# ... and of ``mlisting`` items that name no path: one per path asked for, in order, nil
# where it is not a directory (the paths were 66 of the 102 KB of a 100,000-file pull's
# split items).
ASKED_META = "asked-meta"


def mlisting(tree: Entry, path: str, hb: int, vectors: bool = True, levels: bool = False,
             split: bool = False) -> m.MetaDir | None:
    """The metadata of the directory at ``path``: its content hash prefix, whether the
    vectors cover the whole subtree, the times and modes vectors, and the meta hashes of
    its subdirectories (when they do not). Without ``vectors``, a whole subtree is
    described by its own meta hash alone: a pushing client needs no more to tell whether
    to send its own vectors, and the server's would cross the wire for nothing. With
    ``levels``, never the whole subtree; with ``split`` too, the vectors are of the
    subdirectories alone and one hash prefix stands for the other entries' (`files_meta`)."""
    directory = lookup(tree, path)
    if directory is None or directory.kind != "d":
        return None
    whole = directory.count <= WHOLE_META and not levels
    if whole and not vectors:
        empty = m.Vector([], b"")
        return m.MetaDir(path, directory.content[:hb], True, empty, empty, directory.meta[:hb])
    subdirs = [] if whole else [
        entry for _, entry in directory.sorted_children() if entry.kind == "d"]
    metas = b"".join(entry.meta[:hb] for entry in subdirs)
    if levels and split:
        return m.MetaDir(path, directory.content[:hb], False,
                         m.Vector.encode([entry.mtime_ns for entry in subdirs]),
                         m.Vector.encode([entry.mode for entry in subdirs]), metas,
                         files_meta(directory)[:hb])
    times, modes = meta_of(directory, whole)
    return m.MetaDir(path, directory.content[:hb], whole, m.Vector.encode(times),
                     m.Vector.encode(modes), metas)


def apply_metas(replica: Replica, tree: Entry, items: Sequence[m.MetaDir]) -> tuple[int, int]:
    """`apply_meta` of each of ``items``, up to META_WORKERS at a time: (entries changed,
    vectors skipped). The vectors of a walk set disjoint entries (a directory's own mode and
    time are in its parent's vector, its entries in its own), so their order matters only
    where one moves a directory's time: a hard-linked file replaced by a copy, in a vector
    applied after its parent's, whichever thread runs it (one by one, parents came first
    too). The first error in the order of ``items`` is raised once the vectors already
    started are done; the rest are not started. The index learns the stamps they moved in
    one transaction at the end, done or not: one a vector was a third of a pull's metadata
    phase where 3,197 one-level vectors came (each row is restamped only if it still
    describes the file as it was before, so a file replaced meanwhile keeps its row)."""
    retimed: list[Retimed] = []  # (both threads append: a list's append is atomic)
    apply = functools.partial(apply_meta, replica, tree, retimed=retimed)
    try:
        if len(items) < 2 or META_WORKERS < 2:
            totals = [apply(item) for item in items]
        else:
            pool = ThreadPoolExecutor(META_WORKERS, thread_name_prefix="apply-meta")
            try:
                totals = list(pool.map(apply, items))
            finally:
                pool.shutdown(wait=True, cancel_futures=True)
    finally:
        replica.record_times(retimed)
    return sum(done for done, _ in totals), sum(missed for _, missed in totals)


def apply_meta(replica: Replica, tree: Entry, item: m.MetaDir, retimed: list[Retimed]
               ) -> tuple[int, int]:
    """Set the modification times and modes of a metadata vector where the directory's
    content is the one the vector describes. Returns (entries changed, vectors skipped).
    What the index is to record is appended to ``retimed``, for `apply_metas` to record
    (`Replica.record_times`)."""
    directory = lookup(tree, item.path)
    if directory is None or directory.kind != "d" or not directory.content.startswith(
        item.content
    ):
        return 0, 1
    try:
        new_times, new_modes = item.times.decode(), item.modes.decode()
    except ValueError as exc:
        raise Refusal("protocol", message=f"bad metadata vector: {exc}") from None
    entries = entries_below(directory) if item.whole else directory.sorted_children()
    if not len(new_times) == len(new_modes) == len(entries):
        return 0, 1
    changes: list[tuple[str, int | None, int | None]] = []  # (path, mode, mtime_ns) to set
    changing: list[tuple[Entry, int, int, int]] = []  # (entry, mode, mtime, fields changed)
    # Deepest first, so that a directory's own time is set after its children changed.
    for (rel, entry), mtime, mode in reversed(list(zip(entries, new_times, new_modes,
                                                        strict=True))):
        new_mode = entry.kind != "l" and entry.mode != mode
        if new_mode and not 0 <= mode <= 0o7777:
            raise Refusal("protocol", message=f"bad mode {mode:o}")
        new_time = entry.mtime_ns != mtime
        if new_mode or new_time:
            changes.append((join(item.path, rel), mode if new_mode else None,
                            mtime if new_time else None))
            changing.append((entry, mode if new_mode else entry.mode, mtime,
                             new_mode + new_time))
    changed = 0
    held = HeldDirs(replica.fs)  # (a vector's entries share a few directories)
    try:
        for (entry, mode, mtime, fields), _ in zip(
            changing, replica.set_meta_many(changes, retimed, held), strict=False
        ):
            entry.mode, entry.mtime_ns = mode, mtime
            changed += fields
    finally:
        held.close()
    return changed, 0
