"""Every read and write of a synced tree, confined to that tree and never half done.

A ``SafeRoot`` holds the root directory open and reaches everything by a checked relative
path (``rdc.local.paths.check_relpath``), opening one directory component at a time with
O_NOFOLLOW relative to the one before. So no symlink is ever followed, whoever put it
there: a link where a directory is expected is a ``PathError``, and a link as the last
component is handled as a link (``lstat``, ``read_link``, ``symlink``, ``remove``) or
refused (``open_read``, ``chmod``). The one symlink followed is the root path itself, which
the user chose.

New content is written to a temporary file beside its destination and renamed over it only
when complete, fsynced and (optionally) after checking that the destination is still what
the caller last saw (``Expect``). An interruption at any point leaves either the old entry
or the new one at the path, plus at most a stray temporary that ``clean_temporaries``
removes later (the one exception, replacing a directory, is under ``TempFile.commit``).
Blocking calls throughout: run them on a worker thread from trio. A ``SafeRoot`` may be
shared by threads (close it only when none is using it); a ``TempFile`` has one owner.

OSErrors that the environment causes (ENOENT, ENOSPC, EACCES, EISDIR, ...) propagate with
their errno, ``filename`` set to the relative path.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import functools
import os
import stat
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, BinaryIO, Literal, TypeVar

from rdc import _native
from rdc.errors import RdcError
from rdc.local import beneath, faults
from rdc.local.filestat import NS_MAX, NS_MIN, FileStat, Seen
from rdc.local.filestat import seen as seen_of
from rdc.local.paths import (
    MAX_NAME,
    TEMP_PREFIX,
    PathError,
    check_relpath,
    is_temporary,
    join,
    parent,
    temporary_name,
)
from rdc.local.paths import name as leaf_name
from rdc.records import record

# A temporary whose owner is alive is locked, so a regular temporary that is not locked is
# stale at once. The grace period covers what a lock cannot: symlink temporaries (never
# locked, and alive only within one call) and the instant between creating a file and
# locking it (a regular file gets FRESH_SECONDS for that). Tests set both to 0.
TEMP_GRACE_SECONDS = 5.0
FRESH_SECONDS = 1.0
# A regular temporary of at least PARTIAL_BYTES that no live writer holds is an interrupted
# transfer's partial file, kept for resuming it (rdc.transfer.resume) for PARTIAL_SECONDS.
PARTIAL_BYTES = 1 << 20
PARTIAL_SECONDS = 24 * 3600.0
# A temporary's pages are sent toward the disk every WRITEBACK_STEP bytes written, so the
# commit's fsync waits for the last few only (`_native.start_writeback`).
WRITEBACK_STEP = 8 << 20
# Setuid and setgid bits from a peer are dropped on files, so a daemon running as root
# cannot be made to plant a setuid program. Directories keep every bit.
ALLOW_SETID = False
# Entries of a metadata vector given to one native call (`SafeRoot.set_meta_many`): the
# first run, and the most a run grows to.
RUN_ENTRIES, RUN_ENTRIES_MAX = 64, 4096

_R = TypeVar("_R")
_V = TypeVar("_V")
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_TEMP_PREFIX = TEMP_PREFIX.encode()
# Called with (directory descriptor, name in it, relative path, its lstat) just before an
# entry is replaced or removed, to keep what is there (rdc.local.versions); an OSError it
# raises fails the change, which then leaves the entry as it was.
Keeper = Callable[[int, str, str, os.stat_result], None]
_TYPES = {
    stat.S_IFREG: "a regular file", stat.S_IFDIR: "a directory", stat.S_IFLNK: "a symlink",
    stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


class ConflictError(RdcError):
    """{path} changed meanwhile: expected {expected}, found {found}"""

    exit_code = 3


@record
class Expect:
    """What the caller believes is at a path now. A write or removal given one goes ahead only
    if it still holds (compare and swap), so a concurrent change is not silently lost. Fields
    left None are not compared. Build with the class methods.

    It is checked as late as possible, just before the rename or unlink, but no system call
    compares and renames in one step: a change made in the few calls between the check and
    the rename is overwritten. ``absent`` is the exception, exact because link(2) never
    replaces. A file rewritten in place with the same size within one mtime tick keeps its
    (size, mtime_ns, inode) and is not seen as changed."""

    kind: Literal["absent", "file", "link", "directory"]
    size: int | None = None
    mtime_ns: int | None = None
    inode: int | None = None
    target: str | None = None

    @classmethod
    def absent(cls) -> Expect:
        return cls("absent")

    @classmethod
    def file(
        cls, size: int | None = None, mtime_ns: int | None = None, inode: int | None = None
    ) -> Expect:
        """A regular file; with no arguments, any regular file."""
        return cls("file", size, mtime_ns, inode)

    @classmethod
    def link(cls, target: str | bytes | None = None) -> Expect:
        """A symlink; with no target, any symlink."""
        return cls("link", target=None if target is None else os.fsdecode(target))

    @classmethod
    def directory(cls) -> Expect:
        return cls("directory")

    @classmethod
    def from_stat(cls, st: os.stat_result | None) -> Expect:
        """The entry ``SafeRoot.lstat`` returned, unchanged (a link: any link)."""
        if st is None:
            return cls.absent()
        if stat.S_ISREG(st.st_mode):
            return cls.file(st.st_size, st.st_mtime_ns, st.st_ino)
        if stat.S_ISLNK(st.st_mode):
            return cls.link()
        if stat.S_ISDIR(st.st_mode):
            return cls.directory()
        raise ValueError("no expectation describes a special file")

    def __str__(self) -> str:
        if self.kind == "file":
            fields = [f"{k} {v}" for k in ("size", "mtime_ns", "inode")
                      if (v := getattr(self, k)) is not None]
            return "a regular file" + (f" ({', '.join(fields)})" if fields else "")
        if self.kind == "link":
            return "a symlink" + ("" if self.target is None else f" to {self.target!r}")
        return "nothing" if self.kind == "absent" else "a directory"


def _lstat_at(dfd: int, leaf: str) -> os.stat_result | None:
    try:
        return os.stat(leaf, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _open_regular(dfd: int, leaf: str, rel: str) -> tuple[int, os.stat_result]:
    """A descriptor of the regular file ``leaf`` in directory ``dfd``, open for reading,
    and its fstat. A symlink or special file there is a PathError, a directory
    IsADirectoryError; neither is opened."""
    st = _lstat_at(dfd, leaf)
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), rel)
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise PathError(path=rel, reason=f"is {_describe(st, dfd, leaf)}")
    # O_NONBLOCK: if a FIFO was swapped in since the lstat, do not hang opening it.
    fd = os.open(leaf, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise PathError(path=rel, reason="was replaced by something not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def _describe(st: os.stat_result | None, dfd: int, leaf: str) -> str:
    if st is None:
        return "nothing"
    if stat.S_ISREG(st.st_mode):
        return f"a regular file (size {st.st_size}, mtime_ns {st.st_mtime_ns}, inode {st.st_ino})"
    if stat.S_ISLNK(st.st_mode):
        with contextlib.suppress(OSError):
            return f"a symlink to {os.readlink(leaf, dir_fd=dfd)!r}"
    return _TYPES.get(stat.S_IFMT(st.st_mode), "a special file")


def _check(expect: Expect, st: os.stat_result | None, dfd: int, leaf: str, rel: str) -> None:
    """ConflictError unless ``st`` (just read from ``leaf``) is what ``expect`` says."""
    mode = st.st_mode if st is not None else 0
    if expect.kind == "absent":
        ok = st is None
    elif expect.kind == "directory":
        ok = stat.S_ISDIR(mode)
    elif expect.kind == "link":
        ok = stat.S_ISLNK(mode) and (
            expect.target is None or os.readlink(leaf, dir_fd=dfd) == expect.target
        )
    else:
        ok = stat.S_ISREG(mode) and all(
            want is None or want == have
            for want, have in ((expect.size, st.st_size), (expect.mtime_ns, st.st_mtime_ns),
                               (expect.inode, st.st_ino))
        )
    if not ok:
        raise ConflictError(path=repr(rel), expected=str(expect), found=_describe(st, dfd, leaf))


def _file_mode(mode: int) -> int:
    bits = stat.S_IMODE(mode)
    return bits if ALLOW_SETID else bits & ~(stat.S_ISUID | stat.S_ISGID)


def _open_step(fd: int, part: str, rel: str) -> int:
    """The directory ``part`` inside ``fd``, opened without following a link."""
    try:
        return os.open(part, _DIR, dir_fd=fd)
    except OSError as exc:
        # Linux says ENOTDIR (sometimes ELOOP) for a link opened with O_DIRECTORY|O_NOFOLLOW.
        if exc.errno in (errno.ENOTDIR, errno.ELOOP):
            st = _lstat_at(fd, part)
            if st is not None and stat.S_ISLNK(st.st_mode):
                raise PathError(path=rel, reason=f"goes through a symlink at {part!r}") from None
        raise


def _mkdir_at(dfd: int, leaf: str, mode: int, sync: bool = True) -> os.stat_result | None:
    """Make directory ``leaf`` with exactly ``mode`` (no umask): its fstat then, or None if
    something exists. ``sync``: fsync ``dfd`` so the new entry is durable (else the caller
    does, later)."""
    try:
        os.mkdir(leaf, 0o700, dir_fd=dfd)  # never wider than asked, even for an instant
    except FileExistsError:
        return None
    fd = os.open(leaf, _DIR, dir_fd=dfd)
    try:
        os.fchmod(fd, stat.S_IMODE(mode))
        made = os.fstat(fd)
    finally:
        os.close(fd)
    if sync:
        os.fsync(dfd)
    return made


def _rmtree_at(dfd: int, leaf: str) -> None:
    """Delete ``leaf`` in ``dfd`` and, if it is a directory, all below it, never following a
    link and never entering another file system (EXDEV; a bind mount of the same file
    system has the same st_dev and is not recognised). Iterative: a peer can build trees
    deeper than Python's recursion limit (which shutil.rmtree of 3.11 recurses into); one
    descriptor is held per level. Entries that vanish meanwhile are not errors."""
    stack: list[tuple[int, str, int, list[str]]] = []  # (parent fd, name, fd, subdirs left)

    def enter(pfd: int, entry: str) -> None:
        try:
            fd = os.open(entry, _DIR, dir_fd=pfd)
        except OSError as exc:
            if exc.errno in (errno.ENOTDIR, errno.ELOOP):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry, dir_fd=pfd)
                return
            if exc.errno != errno.ENOENT:
                raise
            return
        try:
            if os.fstat(fd).st_dev != device:
                raise OSError(errno.EXDEV, "a mount point; not removed", entry)
            subdirs = []
            with os.scandir(fd) as entries:
                for child in entries:
                    if child.is_dir(follow_symlinks=False):
                        subdirs.append(child.name)
                    else:
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(child.name, dir_fd=fd)
        except BaseException:
            os.close(fd)
            raise
        stack.append((pfd, entry, fd, subdirs))

    device = os.fstat(dfd).st_dev
    try:
        enter(dfd, leaf)
        while stack:
            pfd, entry, fd, subdirs = stack[-1]
            if subdirs:
                enter(fd, subdirs.pop())
                continue
            stack.pop()
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.rmdir(entry, dir_fd=pfd)
    finally:
        for _, _, fd, _ in stack:
            os.close(fd)


def _install(
    dfd: int, tmp: str, leaf: str, rel: str, tmp_st: os.stat_result,
    expect: Expect | None, replace_dir: bool, sync_dir: bool = True,
    keeper: Keeper | None = None,
) -> None:
    """Put the finished temporary ``tmp`` in place of ``leaf``, both in directory ``dfd``."""
    # Whatever now sits at our temporary name is installed by the rename: make sure it is
    # still the file we wrote and checked, not something swapped in.
    now = _lstat_at(dfd, tmp)
    if now is None or not os.path.samestat(now, tmp_st):
        raise ConflictError(path=repr(rel), expected="rdc's temporary file",
                            found="it replaced or removed")
    # The expectation is checked as late as possible; from here to the rename (a few
    # system calls) a concurrent writer can still slip in and be overwritten, except
    # for Expect.absent, which link(2) makes exact.
    current = _lstat_at(dfd, leaf)
    if expect is not None:
        _check(expect, current, dfd, leaf, rel)
    if keeper is not None and current is not None:
        keeper(dfd, leaf, rel, current)
    aside = None
    if current is not None and stat.S_ISDIR(current.st_mode):
        if not replace_dir:
            raise IsADirectoryError(errno.EISDIR, "a directory is there (replace_dir not set)", rel)
        aside = temporary_name(leaf)
        os.rename(leaf, aside, src_dir_fd=dfd, dst_dir_fd=dfd)
    try:
        if not (expect is not None and expect.kind == "absent" and _link_new(dfd, tmp, leaf, rel)):
            os.rename(tmp, leaf, src_dir_fd=dfd, dst_dir_fd=dfd)
    except BaseException:
        if aside is not None:
            with contextlib.suppress(OSError):
                os.rename(aside, leaf, src_dir_fd=dfd, dst_dir_fd=dfd)
        raise
    if sync_dir:
        os.fsync(dfd)
    if aside is not None:
        # The new entry is in place, so this is no failure of the install: anything left
        # (a mount point, no permission) stays under the temporary name.
        with contextlib.suppress(OSError):
            _rmtree_at(dfd, aside)


def _link_new(dfd: int, tmp: str, leaf: str, rel: str) -> bool:
    """Install ``tmp`` as ``leaf`` only if nothing is there, atomically: link(2) never
    replaces. False where the file system has no hard links (then: rename)."""
    try:
        os.link(tmp, leaf, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
    except FileExistsError:
        found = _describe(_lstat_at(dfd, leaf), dfd, leaf)
        raise ConflictError(path=repr(rel), expected="nothing", found=found) from None
    except OSError as exc:
        if exc.errno in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS, errno.EMLINK):
            return False
        raise
    with contextlib.suppress(OSError):  # a name left over is removed by clean_temporaries
        os.unlink(tmp, dir_fd=dfd)
    return True


def _unlink_if(dfd: int, tmp: str, st: os.stat_result) -> None:
    with contextlib.suppress(OSError):
        now = _lstat_at(dfd, tmp)
        if now is not None and os.path.samestat(now, st):
            os.unlink(tmp, dir_fd=dfd)


def _take_all(notes: set[str]) -> set[str]:
    """What ``notes`` holds, no longer held there. One noted meanwhile is either returned
    or kept for next time, never lost (each is noted after its change is made)."""
    taken = set(notes)
    notes.difference_update(taken)
    return taken


def _take_each(notes: dict[str, _V]) -> dict[str, _V]:
    """`_take_all` of notes with a value. A path noted again before it is taken is not
    overwritten (its directory is listed instead), so each value popped is the one taken."""
    taken = dict(notes)
    for rel in taken:
        notes.pop(rel, None)
    return taken


def _changes(*arguments: int, replaces: bool = False
             ) -> Callable[[Callable[..., _R]], Callable[..., _R]]:
    """Note, when the method returns or raises, the directories whose listing it may have
    changed: those holding the paths in positional ``arguments`` (see
    ``SafeRoot.changed``); with ``replaces``, the paths themselves in
    ``SafeRoot.replaced``."""
    def decorate(method: Callable[..., _R]) -> Callable[..., _R]:
        @functools.wraps(method)
        def noted(self: SafeRoot, *args: Any, **kwargs: Any) -> _R:
            try:
                return method(self, *args, **kwargs)
            finally:
                if self.changed is not None:
                    for i in arguments:
                        if i < len(args):
                            self.changed.add(parent(os.fsdecode(args[i])))
                            if replaces:
                                self.replaced.add(os.fsdecode(args[i]))
        return noted
    return decorate


class SafeRoot:
    """One synced directory tree, held open; every operation takes a relative path (str or
    bytes, checked by ``check_relpath``) and stays inside the tree.

    ``changed``, when a set, collects the directories whose listing a call here may have
    changed (their entries, or an entry's mode or time), noted after the change: what a
    rescan must list again (`rdc.local.rescan`). What this root made itself is noted
    instead where a rescan can patch it in without a listing: a file installed from a
    temporary (``installed``, with its stat), a directory made (``made``), a file moved
    (``moved``) or a file or link removed (``removed``), and the directories whose time
    that moved (``grown``: a rescan lstats them). A temporary that leaves its directory
    otherwise (removed, kept) notes it ``changed``, as does a directory moved or removed."""

    changed: set[str] | None = None

    def __init__(self, path: str | os.PathLike[str], *, fd: int | None = None) -> None:
        """Open the directory at ``path`` (following a symlink there: the user chose it),
        or, with ``fd``, take ownership of that directory descriptor (``path`` then only
        names it in messages)."""
        self.path = os.fspath(path)
        # With ``changed``: the paths whose entry was removed, renamed or replaced by a
        # link. A directory found there later is another one even if it got the old one's
        # inode number back (a rescan took a recreated directory for the old one, children
        # and all).
        self.replaced: set[str] = set()
        # With ``changed``: entries whose own mode or time `set_meta` changed in place, with
        # their lstat after: a rescan patches them in (their directory's listing is as it
        # was) instead of listing the directory again.
        self.retimed: dict[str, os.stat_result] = {}
        # With ``changed``: files installed from temporaries and directories made here,
        # with their stat after, and the directories that gained them (or a temporary).
        self.installed: dict[str, Seen] = {}
        self.made: dict[str, Seen] = {}
        self.grown: set[str] = set()
        # With ``changed``: files moved here (new path: old path, and the lstat the move
        # kept) and files or links removed, their directories in ``grown``: a rescan
        # patches them in too (a renamed tree's 989 moves and 347 removals listed 1,219
        # directories again, 0.11 s of a 0.95 s push).
        self.moved: dict[str, tuple[str, Seen]] = {}
        self.removed: set[str] = set()
        if fd is None:
            fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self._fd = fd
        self.keeper: Keeper | None = None  # what replaces or removes an entry calls first

    def subroot(self, rel: str | bytes, *, create: bool = False, mode: int = 0o755) -> SafeRoot:
        """The directory ``rel`` as a root of its own, reached component by component
        from this one without following a symlink (made, with missing parents, if
        ``create``). Only its descriptor is kept: whatever is later renamed or swapped in
        at ``rel``, the new root stays the directory it was when it was reached."""
        rel = check_relpath(rel, allow_root=True)
        if not rel:
            return SafeRoot(self.path, fd=os.dup(self._fd))
        if create:
            self.makedirs(rel, mode)
        try:
            fd = self._open_dir(rel, rel)
        except OSError as exc:
            exc.filename, exc.filename2 = rel, None
            raise
        return SafeRoot(os.path.join(self.path, rel), fd=fd)

    def identity(self) -> tuple[int, int]:
        """(device, inode) of the root directory."""
        st = os.fstat(self._fd)
        return st.st_dev, st.st_ino

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> SafeRoot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def fileno(self) -> int:
        return self._fd

    def open_dir(self, rel: str | bytes) -> int:
        """A new descriptor (the caller's to close) on the directory at ``rel`` ("" is the
        root), reached without following a symlink."""
        rel = check_relpath(rel, allow_root=True)
        try:
            return self._open_dir(rel, rel)
        except OSError as exc:
            exc.filename, exc.filename2 = rel, None
            raise

    def take_changes(self) -> set[str]:
        """The directories noted in ``changed`` so far, no longer noted. A change noted
        while this runs is either returned or kept for next time, never lost (each is
        noted after it is made, and taken before the caller looks)."""
        return set() if self.changed is None else _take_all(self.changed)

    def take_retimed(self) -> dict[str, os.stat_result]:
        """The entries noted in ``retimed`` so far, no longer noted (as `take_changes`)."""
        return _take_each(self.retimed)

    def _note_retimed(self, rel: str, after: os.stat_result) -> None:
        """``rel``'s own mode or time changed in place (``after``, its lstat then). Noted
        twice before a rescan takes it (two writers, whose notes may come in either
        order), its directory is listed again instead."""
        if self.changed is None:
            return
        if rel in self.retimed:
            self.changed.add(parent(rel))
        else:
            self.retimed[rel] = after

    def take_replaced(self) -> set[str]:
        """The paths noted in ``replaced`` so far, no longer noted (as `take_changes`)."""
        return _take_all(self.replaced)

    def take_made(self) -> tuple[set[str], dict[str, Seen], dict[str, Seen],
                                 dict[str, tuple[str, Seen]], set[str]]:
        """The directories noted in ``grown``, the files in ``installed``, the directories
        in ``made``, the files in ``moved`` and the paths in ``removed`` so far, no longer
        noted (as `take_changes`)."""
        return (_take_all(self.grown), _take_each(self.installed), _take_each(self.made),
                _take_each(self.moved), _take_all(self.removed))

    def _note_moved(self, rel: str, new: str, moved: os.stat_result | None) -> None:
        """``rel`` was renamed to ``new`` (``moved``: a regular file's lstat, which the
        move kept), or may have been (None: a directory, a link, or a move that failed
        part way: both directories are listed again)."""
        if self.changed is None:
            return
        self.replaced.update((rel, new))
        if (moved is None or not stat.S_ISREG(moved.st_mode) or new in self.moved
                or len(self.moved) >= NOTES_MAX):
            self.changed.update((parent(rel), parent(new)))
            return
        self.moved[new] = (rel, seen_of(moved))
        self.grown.update((parent(rel), parent(new)))

    def _note_removed(self, rel: str, unlinked: bool) -> None:
        """A file or link at ``rel`` was unlinked (``unlinked``), or something there may
        have been removed (a directory, or a removal that failed part way: its directory
        is listed again)."""
        if self.changed is None:
            return
        self.replaced.add(rel)
        if not unlinked or len(self.removed) >= NOTES_MAX:
            self.changed.add(parent(rel))
            return
        self.removed.add(rel)
        self.grown.add(parent(rel))

    def note_installed(self, rel: str, seen: FileStat | None) -> None:
        """A temporary for ``rel`` left its directory: installed there (``seen``: the
        file's stat after) or not (None: removed, or kept for resuming)."""
        if self.changed is None:
            return
        folder = parent(rel)
        # Listed again instead: a file not installed, one noted twice (two writers' notes
        # may come in either order), or one past the notes' bound.
        if seen is None or rel in self.installed or len(self.installed) >= NOTES_MAX:
            self.changed.add(folder)
        else:
            self.installed[rel] = seen_of(seen)
        self.grown.add(folder)

    def _note_made(self, rel: str, after: FileStat | None) -> None:
        """Directory ``rel`` was made here (``after``: its lstat then)."""
        if self.changed is None:
            return
        if (after is None or not stat.S_ISDIR(after.st_mode) or rel in self.made
                or len(self.made) >= NOTES_MAX):
            self.changed.add(parent(rel))
        else:
            self.made[rel] = Seen(after.st_mode, 0, after.st_mtime_ns, after.st_ino)
            self.grown.add(parent(rel))

    def _open_dir(self, rel_dir: str, rel: str) -> int:
        """A new descriptor on directory ``rel_dir``, reached without following a symlink:
        in one call where the kernel can, else (and for the precise error when it refuses)
        component by component."""
        if not rel_dir:
            return os.dup(self._fd)
        fd = beneath.open_dir(self._fd, rel_dir)
        if fd is not None:
            return fd
        fd = os.dup(self._fd)
        try:
            for part in rel_dir.split("/") if rel_dir else ():
                step = _open_step(fd, part, rel)
                os.close(fd)
                fd = step
        except BaseException:
            os.close(fd)
            raise
        return fd

    @contextlib.contextmanager
    def _parent(self, rel: str, held: HeldDirs | None = None) -> Iterator[tuple[int, str]]:
        """(descriptor of the directory holding ``rel``, last component): its own, or
        ``held``'s; OSErrors raised inside name ``rel``."""
        try:
            if held is not None:
                yield held.fd(parent(rel), rel), leaf_name(rel)
                return
            dfd = self._open_dir(parent(rel), rel)
            try:
                yield dfd, leaf_name(rel)
            finally:
                os.close(dfd)
        except OSError as exc:
            exc.filename, exc.filename2 = rel, None
            raise

    def lstat(self, rel: str | bytes, held: HeldDirs | None = None) -> os.stat_result | None:
        """The entry at ``rel`` itself (a link is not followed); None if nothing is there,
        a parent included. "" is the root. ``held``: see `HeldDirs`."""
        rel = check_relpath(rel, allow_root=True)
        if not rel:
            return os.fstat(self._fd)
        try:
            with self._parent(rel, held) as (dfd, leaf):
                return _lstat_at(dfd, leaf)
        except (FileNotFoundError, NotADirectoryError):
            return None

    def open_read(self, rel: str | bytes) -> BinaryIO:
        """The regular file at ``rel``, open for reading. A symlink or special file there is
        a PathError, a directory IsADirectoryError; neither is opened."""
        rel = check_relpath(rel)
        with self._parent(rel) as (dfd, leaf):
            fd, _ = _open_regular(dfd, leaf, rel)
        try:
            os.set_blocking(fd, True)
            return open(fd, "rb")
        except BaseException:
            os.close(fd)
            raise

    def read_whole(self, rel: str | bytes, limit: int, held: HeldDirs | None = None
                   ) -> tuple[os.stat_result, bytes, os.stat_result] | None:
        """The regular file at ``rel`` read whole if it has at most ``limit`` bytes: its
        fstat before the read, its bytes and its fstat after; None if it is larger (read
        it with `open_read`). Errors as `open_read`. The cheap way to read the many small
        files of a tree: no file object, and the directory from ``held`` (`HeldDirs`)."""
        rel = check_relpath(rel)
        with self._parent(rel, held) as (dfd, leaf):
            fd, before = _open_regular(dfd, leaf, rel)
        try:
            if before.st_size > limit:
                return None
            parts = [os.read(fd, before.st_size + 1)]
            total = len(parts[0])
            while parts[-1] and total <= limit:  # (short reads: a network file system)
                parts.append(os.read(fd, limit + 1 - total))
                total += len(parts[-1])
            if total > limit:
                return None  # it grew meanwhile
            return before, parts[0] if len(parts) <= 2 else b"".join(parts), os.fstat(fd)
        except OSError as exc:
            exc.filename, exc.filename2 = rel, None
            raise
        finally:
            os.close(fd)

    def read_link(self, rel: str | bytes) -> str:
        """The target of the symlink at ``rel`` as stored (fsdecoded); EINVAL if not a link."""
        rel = check_relpath(rel)
        with self._parent(rel) as (dfd, leaf):
            return os.readlink(leaf, dir_fd=dfd)

    def create_temp(self, rel: str | bytes, held: HeldDirs | None = None) -> TempFile:
        """A new, empty temporary file (mode 0600) in the directory of ``rel``, which must
        exist, to be committed over ``rel``. Nothing at ``rel`` changes until then.
        ``held``: see `HeldDirs`."""
        rel = check_relpath(rel)
        with self._parent(rel, held) as (dfd, leaf):
            for _ in range(3):
                tmp = temporary_name(leaf)
                try:
                    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                                 | os.O_CLOEXEC, 0o600, dir_fd=dfd)
                except FileExistsError:
                    continue
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # "alive": see clean_temporaries
                    if self.changed is not None:
                        self.grown.add(parent(rel))  # the directory's time moved
                    temp = TempFile(os.dup(dfd), rel, tmp, fd, self)
                    temp.keeper = self.keeper
                    temp.full = faults.full(os.path.join(self.path, rel))
                    return temp
                except BaseException:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp, dir_fd=dfd)
                    os.close(fd)
                    raise
            raise FileExistsError(errno.EEXIST, "no free temporary name", rel)

    def create_temps(
        self, files: Sequence[tuple[str, bytes, int, int]], held: HeldDirs,
    ) -> Iterator[TempFile | OSError | PathError]:
        """For each (rel, data, mode, mtime_ns) of ``files``, in order: a temporary beside
        ``rel`` (`create_temp`) holding ``data``, given ``mode`` and ``mtime_ns``
        (`TempFile.write`, `TempFile.prepare`: not yet durable), or the error that stopped
        it (nothing is left of that one). Runs of files go to one native call each
        (`rdc._native.make_temps`: the same steps, without the GIL, no Python between
        them); a file it cannot be given takes the steps one by one, which say why."""
        native = _native.make_temps is not None and faults.FULL_DIR is None
        at = 0
        while at < len(files):
            rels, run = held.run([rel for rel, _, _, _ in files[at:]]) if native else ([], [])
            if not run:
                yield self._temp_of(*files[at], held)
                at += 1
                continue
            made = _native.make_temps(
                [(dfd, leaf, data, _file_mode(mode), mtime) for (dfd, leaf), (_, data, mode, mtime)
                 in zip(run, files[at:], strict=False)], _TEMP_PREFIX, MAX_NAME)
            for rel, one in zip(rels, made, strict=True):
                if isinstance(one, int):
                    yield OSError(one, os.strerror(one), rel)
                    continue
                fd, dfd, tmp, st = one
                if self.changed is not None:
                    self.grown.add(parent(rel))  # the directory's time moved
                temp = TempFile(dfd, rel, os.fsdecode(tmp), fd, self, os.stat_result(st))
                temp.keeper = self.keeper
                yield temp
            at += len(run)

    def _temp_of(self, rel: str, data: bytes, mode: int, mtime_ns: int, held: HeldDirs
                 ) -> TempFile | OSError | PathError:
        """`create_temps` of one file, step by step."""
        try:
            temp = self.create_temp(rel, held)
            temp.write(data)
            temp.prepare(mode, mtime_ns)
        except (OSError, PathError) as exc:
            return exc
        return temp

    def mkdir(
        self, rel: str | bytes, mode: int, *, exist_ok: bool = True, sync: bool = True
    ) -> bool:
        """Make directory ``rel`` with exactly ``mode`` (umask ignored) in an existing parent;
        True if made. An existing directory is fine with ``exist_ok``; anything else there,
        a symlink included, is FileExistsError. Without ``sync`` the new entry is durable
        only once the caller syncs the parent (`sync_dir`)."""
        rel = check_relpath(rel)
        noted = False
        try:
            with self._parent(rel) as (dfd, leaf):
                made = _mkdir_at(dfd, leaf, mode, sync)
                if made is not None:
                    self._note_made(rel, made)
                    noted = True
                    return True
                st = _lstat_at(dfd, leaf)
                if not (exist_ok and st is not None and stat.S_ISDIR(st.st_mode)):
                    raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), rel)
                return False
        finally:
            if not noted and self.changed is not None:
                self.changed.add(parent(rel))

    def make_dirs(self, dirs: Sequence[tuple[str, int]], held: HeldDirs) -> list[bool]:
        """`mkdir` (without ``sync``) of each (rel, mode) of ``dirs`` in order, in runs of
        one native call each (`rdc._native.make_dirs`: from Python, each directory let the
        GIL go and took it back six times, and while other threads were busy, 256 of them
        took 0.2-0.7 s); True for each made. A directory not made here (something there, a
        parent missing or not yet opened, no native code) is the caller's to make one by
        one, which says why. Those after one whose directory does not open are all the
        caller's: made here first, they could give it a parent that it did not have in its
        place."""
        out = [False] * len(dirs)
        if _native.make_dirs is None:
            return out
        at = 0
        while at < len(dirs):
            rels, run = held.run([rel for rel, _ in dirs[at:]])
            if not run:
                break
            made = _native.make_dirs([(dfd, leaf, stat.S_IMODE(mode)) for (dfd, leaf), (_, mode)
                                      in zip(run, dirs[at:], strict=False)])
            for k, (rel, one) in enumerate(zip(rels, made, strict=True)):
                if isinstance(one, int) and not isinstance(one, bool):
                    continue  # (an errno: left to the caller)
                out[at + k] = True
                self._note_made(rel, None if one is True else Seen(*one))
            at += len(run)
        return out

    def makedirs(self, rel: str | bytes, mode: int) -> bool:
        """Make ``rel`` and missing parents, each with ``mode``; True if any was made. A
        symlink on the way is a PathError, another non-directory NotADirectoryError. The
        new entries are durable when it returns: the directories that gained one are
        synced together at the end, by one ``syncfs`` where more than SYNCFS_FROM did (a
        client may open a path 2,048 levels deep; an fsync a level, as each was made,
        kept a server on a slow disk at it for over 10 s)."""
        rel = check_relpath(rel)
        made = False
        fd = os.dup(self._fd)
        done = ""
        grown: list[int] = []  # descriptors of the directories that gained an entry
        whole = False  # more of them than to sync one by one: the file system at once
        try:
            for part in rel.split("/"):
                if _mkdir_at(fd, part, mode, sync=False) is not None:
                    made = True
                    if self.changed is not None:
                        self.changed.add(done)
                    if not whole:
                        grown.append(os.dup(fd))
                        if len(grown) > SYNCFS_FROM and _syncfs is not None:
                            whole = True
                            close_all(grown)
                done = join(done, part)
                step = _open_step(fd, part, rel)
                os.close(fd)
                fd = step
            if whole and _syncfs(fd) != 0:
                raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
            for grew in grown:
                os.fsync(grew)
        except OSError as exc:
            exc.filename, exc.filename2 = rel, None
            raise
        finally:
            os.close(fd)
            close_all(grown)
        return made

    @_changes(0, replaces=True)
    def symlink(
        self, rel: str | bytes, target: str | bytes, expect: Expect | None = None, *,
        mtime_ns: int | None = None, replace_dir: bool = False,
    ) -> os.stat_result:
        """Make ``rel`` a symlink to ``target``, replacing what is there atomically (made
        under a temporary name, then renamed). The target is stored as given, never
        followed or checked. ``expect``, ``replace_dir``: as for ``TempFile.commit``."""
        rel = check_relpath(rel)
        if not isinstance(target, str | bytes) or "\0" in os.fsdecode(target):
            raise PathError(path=rel, reason=f"bad link target {target!r}")
        with self._parent(rel) as (dfd, leaf):
            tmp = temporary_name(leaf)
            os.symlink(target, tmp, dir_fd=dfd)
            try:
                if mtime_ns is not None:
                    os.utime(tmp, ns=(mtime_ns, mtime_ns), dir_fd=dfd, follow_symlinks=False)
                tmp_st = os.stat(tmp, dir_fd=dfd, follow_symlinks=False)
                _install(dfd, tmp, leaf, rel, tmp_st, expect, replace_dir, keeper=self.keeper)
                return os.stat(leaf, dir_fd=dfd, follow_symlinks=False)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=dfd)
                raise

    def remove(self, rel: str | bytes, expect: Expect | None = None,
               held: HeldDirs | None = None) -> bool:
        """Remove the file, link or whole directory tree at ``rel`` (links are removed, not
        followed; mount points inside are not entered: EXDEV); True if something was there.
        Already absent is not an error, whatever ``expect`` says. A directory is first
        renamed to a temporary name, so it leaves its path at once; if removing it then
        fails, what is left is renamed back; if the process dies, ``clean_temporaries``
        removes the rest. ``held``: see `HeldDirs` (a caller removing a directory must not
        hold it, or anything below it, after)."""
        rel = check_relpath(rel)
        unlinked = False
        try:
            with self._parent(rel, held) as (dfd, leaf):
                current = _lstat_at(dfd, leaf)
                if current is None:
                    return False
                if expect is not None:
                    _check(expect, current, dfd, leaf, rel)
                if self.keeper is not None:
                    self.keeper(dfd, leaf, rel, current)
                if not stat.S_ISDIR(current.st_mode):
                    os.unlink(leaf, dir_fd=dfd)
                    unlinked = True
                    return True
                aside = temporary_name(leaf)
                os.rename(leaf, aside, src_dir_fd=dfd, dst_dir_fd=dfd)
                try:
                    _rmtree_at(dfd, aside)
                except OSError:
                    # What could not be removed goes back where the user will see it.
                    with contextlib.suppress(OSError):
                        os.rename(aside, leaf, src_dir_fd=dfd, dst_dir_fd=dfd)
                    raise
                return True
        except (FileNotFoundError, NotADirectoryError):
            return False
        finally:
            self._note_removed(rel, unlinked)

    def listdir(self, rel: str | bytes) -> list[str]:
        """The names in the directory at ``rel`` ("" is the root), reached without following
        symlinks."""
        rel = check_relpath(rel, allow_root=True)
        fd = self._open_dir(rel, rel)
        try:
            return [os.fsdecode(name) for name in os.listdir(fd)]
        finally:
            os.close(fd)

    def sync_dir(self, rel: str | bytes) -> None:
        """fsync the directory at ``rel`` ("" is the root): makes renames into it durable
        (for commits made with ``sync_dir=False``)."""
        rel = check_relpath(rel, allow_root=True)
        fd = self._open_dir(rel, rel)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    @_changes(0, replaces=True)
    def rmdir(self, rel: str | bytes) -> bool:
        """Remove the directory at ``rel`` if it is empty (OSError ENOTEMPTY if not; a
        symlink or file there is NotADirectoryError); True if it was there."""
        rel = check_relpath(rel)
        with self._parent(rel) as (dfd, leaf):
            st = _lstat_at(dfd, leaf)
            if st is None:
                return False
            if not stat.S_ISDIR(st.st_mode):
                raise NotADirectoryError(errno.ENOTDIR, "not a directory", rel)
            os.rmdir(leaf, dir_fd=dfd)
            os.fsync(dfd)
            return True

    def rename(self, rel: str | bytes, new: str | bytes, expect: Expect | None = None, *,
               sync: bool = True, held: HeldDirs | None = None) -> os.stat_result:
        """Move ``rel`` to ``new`` (both inside the tree, ``new``'s parent existing); nothing
        may be at ``new``: it is never replaced. ``expect`` is checked against ``rel``. A
        file or link moves by link-then-unlink, which refuses an existing destination
        atomically; a directory by rename after a check (a directory appearing at ``new``
        in between would be replaced only if empty). Without ``sync`` the caller fsyncs
        both directories later (a crash before may leave the entry at either path or at
        both, never neither). Returns the lstat of what moved, taken before (its inode,
        size, mode and time are the same at ``new``). ``held``: see `HeldDirs` (a caller
        moving a directory must not hold it, or anything below it, after)."""
        rel, new = check_relpath(rel), check_relpath(new)
        if new == rel or new.startswith(rel + "/"):
            raise PathError(path=new, reason=f"cannot move {rel!r} into itself")
        moved = None
        if held is not None:
            held.room(2)  # (the second directory must not close the first)
        try:
            with (self._parent(rel, held) as (sfd, sleaf),
                  self._parent(new, held) as (dfd, dleaf)):
                st = _lstat_at(sfd, sleaf)
                if expect is not None:
                    _check(expect, st, sfd, sleaf, rel)
                if st is None:
                    raise FileNotFoundError(errno.ENOENT, "nothing to move", rel)
                if stat.S_ISDIR(st.st_mode):
                    if _lstat_at(dfd, dleaf) is not None:
                        raise FileExistsError(errno.EEXIST, "destination exists", new)
                    os.rename(sleaf, dleaf, src_dir_fd=sfd, dst_dir_fd=dfd)
                else:
                    os.link(sleaf, dleaf, src_dir_fd=sfd, dst_dir_fd=dfd,
                            follow_symlinks=False)
                    os.unlink(sleaf, dir_fd=sfd)
                    moved = st
                if sync:
                    os.fsync(dfd)
                    os.fsync(sfd)
                return st
        finally:
            self._note_moved(rel, new, moved)

    def set_meta(
        self, rel: str | bytes, mode: int | None = None, mtime_ns: int | None = None,
        held: HeldDirs | None = None,
    ) -> tuple[os.stat_result | None, os.stat_result | None]:
        """Set the permission bits (see ALLOW_SETID; a link has none) and the access and
        modification times of the entry at ``rel`` itself, each only if given and
        different. Returns its lstat before and after ((None, None) if nothing is there).

        An inode with other hard links is never changed: such a file (or link) is
        replaced by a copy of itself that has the new mode and time, so a change made
        through a share never reaches a file outside it, nor a snapshot hard-linked to
        it. The inode is pinned (O_PATH) before it is looked at, so what is checked is
        what is changed. A special file there is a PathError.

        An entry changed in place is noted in ``retimed``; the root, a replaced entry, or
        one that failed half way, in ``changed`` (its directory is listed again).
        ``held``: see `HeldDirs`."""
        rel = check_relpath(rel, allow_root=True)
        try:
            before, after, in_place = self._set_meta(rel, mode, mtime_ns, held)
        except BaseException:
            if self.changed is not None:
                self.changed.add(parent(rel))
            raise
        if after is not None and before is not after and self.changed is not None:
            if in_place:  # never the root, whose own time is read at each rescan
                self._note_retimed(rel, after)
            else:
                self.changed.add(parent(rel))
        return before, after

    def set_meta_many(
        self, changes: Sequence[tuple[str | bytes, int | None, int | None]], held: HeldDirs,
    ) -> Iterator[tuple[FileStat | None, FileStat | None]]:
        """`set_meta` of each (rel, mode, mtime_ns) of ``changes``, in order, yielding what
        it returns as each is done (stats as `rdc.local.filestat.Seen`). Runs of entries go
        to one native call each (`rdc._native.set_meta`: the same steps, no Python between
        them); an entry it leaves, and the root, take `set_meta` itself, which says why or
        does more (a hard-linked file replaced by a copy)."""
        at, size = 0, RUN_ENTRIES
        while at < len(changes):
            end = min(len(changes), at + size)
            stop = at  # (a time out of 64-bit range: set_meta refuses it)
            while stop < end and (
                (t := changes[stop][2]) is None or NS_MIN <= t <= NS_MAX
            ):
                stop += 1
            rels, run = held.run([rel for rel, _, _ in changes[at:stop]]) if (
                _native.set_meta is not None) else ([], [])
            done = _native.set_meta([(dfd, leaf, mode, mtime) for (dfd, leaf), (_, mode, mtime)
                                     in zip(run, changes[at:], strict=False)],
                                    ALLOW_SETID) if run else []
            # A run cut short by an entry for set_meta was prepared in vain past it: the
            # next is one entry, doubling while whole, so that a vector of entries set_meta
            # must do (hard-linked files) costs a run per entry, not the rest of the vector.
            size = 1 if len(done) < len(run) else min(2 * size, RUN_ENTRIES_MAX)
            for rel, one in zip(rels, done, strict=False):
                if one is None:
                    yield None, None
                    continue
                before, after = Seen(*one[0]), Seen(*one[1])
                if before != after:
                    self._note_retimed(rel, after)
                yield before, after
            at += len(done)
            if at < end:  # an entry the native call left, or could not be given
                yield self.set_meta(*changes[at], held)
                at += 1

    def _set_meta(
        self, rel: str, mode: int | None, mtime_ns: int | None, held: HeldDirs | None = None,
    ) -> tuple[os.stat_result | None, os.stat_result | None, bool]:
        """`set_meta`, and whether the entry (if changed) was changed in place."""
        if not rel:
            before = os.fstat(self._fd)
            if mode is not None and stat.S_IMODE(before.st_mode) != stat.S_IMODE(mode):
                os.fchmod(self._fd, stat.S_IMODE(mode))
            if mtime_ns is not None and before.st_mtime_ns != mtime_ns:
                os.utime(self._fd, ns=(mtime_ns, mtime_ns))
            return before, os.fstat(self._fd), False
        with self._parent(rel, held) as (dfd, leaf):
            try:
                fd = os.open(leaf, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
            except FileNotFoundError:
                return None, None, False
            try:
                st = os.fstat(fd)
                kind = stat.S_IFMT(st.st_mode)
                if kind not in (stat.S_IFREG, stat.S_IFDIR, stat.S_IFLNK):
                    raise PathError(path=rel, reason=f"is {_describe(st, dfd, leaf)}, "
                                    "not a regular file, directory or link")
                bits = None
                if mode is not None and kind != stat.S_IFLNK:
                    bits = _file_mode(mode) if kind == stat.S_IFREG else stat.S_IMODE(mode)
                    if bits == stat.S_IMODE(st.st_mode):
                        bits = None
                if mtime_ns is not None and st.st_mtime_ns == mtime_ns:
                    mtime_ns = None
                if bits is None and mtime_ns is None:
                    return st, st, True
                if kind != stat.S_IFDIR and st.st_nlink > 1:
                    return st, self._replace_linked(rel, dfd, leaf, st, bits, mtime_ns), False
                if bits is not None:
                    _chmod_pinned(fd, st, dfd, leaf, bits)
                if mtime_ns is not None:
                    ns = (mtime_ns, mtime_ns)
                    if kind == stat.S_IFLNK:
                        os.utime(leaf, ns=ns, dir_fd=dfd, follow_symlinks=False)
                    else:
                        _utime_pinned(fd, st, dfd, leaf, ns)
                return st, os.fstat(fd), True
            finally:
                os.close(fd)

    def _replace_linked(
        self, rel: str, dfd: int, leaf: str, st: os.stat_result, bits: int | None,
        mtime_ns: int | None,
    ) -> os.stat_result:
        """Put a copy of the multiply-linked file or link ``leaf`` (lstat ``st``) in its
        place, with mode ``bits`` and time ``mtime_ns`` where given."""
        mtime_ns = st.st_mtime_ns if mtime_ns is None else mtime_ns
        if stat.S_ISLNK(st.st_mode):
            target = os.readlink(leaf, dir_fd=dfd)
            return self.symlink(rel, target, Expect.link(target), mtime_ns=mtime_ns)
        expect = Expect.file(st.st_size, st.st_mtime_ns, st.st_ino)
        src = os.open(leaf, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                      dir_fd=dfd)
        try:
            if not os.path.samestat(os.fstat(src), st):
                raise ConflictError(path=repr(rel), expected=str(expect), found="another file")
            with self.create_temp(rel) as temp:
                while True:
                    data = os.read(src, 1 << 20)
                    if not data:
                        break
                    temp.write(data)
                mode = stat.S_IMODE(st.st_mode) if bits is None else bits
                return temp.commit(mode, mtime_ns, expect)
        finally:
            os.close(src)

    def set_times(self, rel: str | bytes, mtime_ns: int) -> os.stat_result | None:
        """Set atime and mtime of ``rel`` itself (see `set_meta`). Returns its lstat from
        just before."""
        return self.set_meta(rel, mtime_ns=mtime_ns)[0]

    def chmod(self, rel: str | bytes, mode: int) -> None:
        """Set the mode of the regular file or directory at ``rel`` (see `set_meta`).
        Links have no mode on Linux: a link there, or a special file, is a PathError;
        nothing there is FileNotFoundError."""
        st = self.lstat(rel)
        if st is not None and stat.S_ISLNK(st.st_mode):
            raise PathError(path=rel, reason="is a symlink, which has no mode")
        before, _ = self.set_meta(rel, mode=mode)
        if before is None:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), rel)

    def clean_temporaries(self) -> int:
        """Remove rdc temporaries that no live writer owns, anywhere in the tree (links not
        followed); return how many. A temporary file is in use while its ``TempFile`` holds
        a lock on it, which the kernel drops when its process dies, however it dies; any
        temporary younger than TEMP_GRACE_SECONDS (by ctime) is also left, and so is a
        partial file (PARTIAL_BYTES or more, younger than PARTIAL_SECONDS) kept for
        resuming. Unreadable directories are skipped."""
        removed = 0
        stack = [""]
        while stack:
            rel_dir = stack.pop()
            try:
                dfd = self._open_dir(rel_dir, rel_dir)
            except (OSError, PathError):
                continue  # gone or replaced meanwhile
            try:
                with os.scandir(dfd) as entries:
                    children = [(e.name, e.is_dir(follow_symlinks=False)) for e in entries]
                for entry, is_dir in children:
                    if is_temporary(entry):
                        gone = _remove_stale(dfd, entry)
                        removed += gone
                        if gone and self.changed is not None:
                            self.changed.add(rel_dir)
                    elif is_dir:
                        stack.append(join(rel_dir, entry))
            except OSError:
                continue
            finally:
                os.close(dfd)
        return removed


class HeldDirs:
    """Descriptors of the directories one run of work touches (a batch's files, a metadata
    vector's entries), each opened beneath the root once and all closed together: a first
    copy writes hundreds of files into a directory, each of which cost an openat2 and a
    close of its own. For one thread at a time.

    A directory held open is the one that was there when it was first reached: a
    directory renamed meanwhile is still written into, wherever in the tree it went (as a
    temporary file's own directory is between its creation and its rename), and one
    removed meanwhile takes no new entries."""

    LIMIT = 64  # descriptors: past this many, all are closed and opened again as needed

    def __init__(self, root: SafeRoot) -> None:
        self._root = root
        self._fds: dict[str, int] = {}

    def run(self, rels: Sequence[str | bytes]) -> tuple[list[str], list[tuple[int, bytes]]]:
        """For a native call over many entries: (path, (directory descriptor, name)) of
        ``rels`` in order, up to the first this cannot give: a path `check_relpath`
        refuses (the root too), a directory that does not open (the caller's one-entry
        path then says why), or one more directory than fit while all are in use."""
        paths: list[str] = []
        items: list[tuple[int, bytes]] = []
        for rel in rels:
            try:
                rel = check_relpath(rel)
                where = parent(rel)
                if items and where not in self._fds and len(self._fds) >= self.LIMIT:
                    break  # (a new one would close those the items use)
                dfd = self.fd(where, rel)
            except (OSError, PathError):
                break
            paths.append(rel)
            items.append((dfd, os.fsencode(leaf_name(rel))))
        return paths, items

    def fd(self, rel_dir: str, rel: str) -> int:
        """The descriptor of directory ``rel_dir`` (``rel``, inside it, names errors)."""
        fd = self._fds.get(rel_dir)
        if fd is None:
            if len(self._fds) >= self.LIMIT:
                self.close()
            fd = self._fds[rel_dir] = self._root._open_dir(rel_dir, rel)
        return fd

    def room(self, count: int) -> None:
        """Make room for ``count`` more directories: the next ``count`` `fd` calls then close
        none (a caller using two at once)."""
        if len(self._fds) + count > self.LIMIT:
            self.close()

    def close(self) -> None:
        fds, self._fds = list(self._fds.values()), {}
        for fd in fds:
            os.close(fd)

    def __enter__(self) -> HeldDirs:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _via_proc(fd: int) -> str:
    """A path that reaches the inode behind descriptor ``fd`` itself (what glibc's fchmodat
    and futimens on an O_PATH descriptor do)."""
    return f"/proc/self/fd/{fd}"


def _chmod_pinned(fd: int, st: os.stat_result, dfd: int, leaf: str, bits: int) -> None:
    """chmod the inode behind O_PATH descriptor ``fd``."""
    try:
        os.chmod(_via_proc(fd), bits)
        return
    except FileNotFoundError:
        pass  # no /proc: open it after all
    with _reopened(fd, st, dfd, leaf) as rfd:
        os.fchmod(rfd, bits)


def _utime_pinned(fd: int, st: os.stat_result, dfd: int, leaf: str, ns: tuple[int, int]) -> None:
    """Set the times of the inode behind O_PATH descriptor ``fd`` (a file or directory)."""
    try:
        os.utime(_via_proc(fd), ns=ns)
        return
    except FileNotFoundError:
        pass
    with _reopened(fd, st, dfd, leaf) as rfd:
        os.utime(rfd, ns=ns)


@contextlib.contextmanager
def _reopened(fd: int, st: os.stat_result, dfd: int, leaf: str) -> Iterator[int]:
    """``leaf`` opened for real, if it is still the inode ``st`` describes."""
    rfd = os.open(leaf, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    try:
        if not os.path.samestat(os.fstat(rfd), st):
            raise FileNotFoundError(errno.ENOENT, "replaced meanwhile", leaf)
        yield rfd
    finally:
        os.close(rfd)


def _remove_stale(dfd: int, entry: str) -> int:
    """Remove temporary ``entry`` in ``dfd`` if stale: 1 if removed, else 0."""
    try:
        st = os.stat(entry, dir_fd=dfd, follow_symlinks=False)
        age = time.time() - st.st_ctime
        if age < (FRESH_SECONDS if stat.S_ISREG(st.st_mode) else TEMP_GRACE_SECONDS):
            return 0
        if stat.S_ISDIR(st.st_mode):
            _rmtree_at(dfd, entry)
            return 1
        if stat.S_ISREG(st.st_mode) and st.st_size >= PARTIAL_BYTES and age < PARTIAL_SECONDS:
            return 0  # a partial file kept for resuming its transfer
        if not stat.S_ISREG(st.st_mode):
            os.unlink(entry, dir_fd=dfd)
            return 1
        try:
            fd = os.open(entry, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         dir_fd=dfd)
        except PermissionError:  # cannot lock it; its age has to do
            os.unlink(entry, dir_fd=dfd)
            return 1
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return 0  # a live TempFile owns it
            if not os.path.samestat(os.fstat(fd), st):
                return 0
            os.unlink(entry, dir_fd=dfd)
            return 1
        finally:
            os.close(fd)
    except OSError:
        return 0  # gone meanwhile, or not removable now: the next clean tries again


def sync_all(root: SafeRoot, temps: list[TempFile]) -> None:
    """Make the data and metadata of ``temps`` durable before any of them is installed:
    one ``syncfs`` of ``root``'s file system where there is one (Linux), which costs about
    one ``fsync`` for the whole batch instead of one per file, else an ``fsync`` each.
    A crash after this and before an install leaves temporaries; after an install, a
    complete new file: never a mix."""
    if sync_filesystem(root):
        return
    for temp in temps:
        os.fsync(temp.fileno())


def install_all(items: Sequence[tuple[TempFile, Expect | None]]
                ) -> list[FileStat | OSError | PathError | ConflictError]:
    """`TempFile.install` of each (temporary, expectation), in order, leaving the fsync of
    their directories to the caller (``sync_dir=False``): the installed file's stat, or
    the error that left its destination as it was. Those whose destination must be empty
    (`Expect.absent`: a first copy's files) are linked into place in one native call
    (`rdc._native.install_new`: the same steps, without the GIL); the rest, and any it
    leaves (something there, no hard links), one by one, which says why."""
    out: list[FileStat | OSError | PathError | ConflictError | None] = [None] * len(items)
    new = [k for k, (temp, expect) in enumerate(items) if _native.install_new is not None
           and expect is not None and expect.kind == "absent" and not temp.closed]
    if new:
        done = _native.install_new([items[k][0].pinned() for k in new])
        for k, st in zip(new, done, strict=True):
            if st is not None:
                out[k] = items[k][0].installed_natively(st)
    for k, (temp, expect) in enumerate(items):
        if out[k] is None:
            try:
                out[k] = temp.install(expect, sync_dir=False)
            except (OSError, PathError, ConflictError) as exc:
                out[k] = exc
    return out  # type: ignore[return-value]


# Files noted installed (`SafeRoot.note_installed`) until a rescan takes them, at most: about
# 300 bytes each (100,000 were 30 MB, a sixth of the server's peak in a first copy of them,
# and no faster to patch in than to list); past this many, a file installed lists its
# directory again at the rescan instead. Django's first copy is 6,759 files.
NOTES_MAX = 8192

# More directories to sync than this: one syncfs of the file system instead (a first copy
# of Django wrote into 3,222; an fsync each cost more than the whole batch's data sync).
SYNCFS_FROM = 32


def close_all(fds: list[int]) -> None:
    """Close each of ``fds`` and empty the list."""
    while fds:
        os.close(fds.pop())


def sync_filesystem(root: SafeRoot) -> bool:
    """``syncfs`` of the file system ``root`` is on: everything written to it, data and
    metadata, durable at once. False where there is no syncfs (the caller fsyncs what it
    wrote, one by one)."""
    return _syncfs is not None and _syncfs(root.fileno()) == 0


def _load_syncfs() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        function = libc.syncfs
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int]
    function.restype = ctypes.c_int
    return function


_syncfs = _load_syncfs()


class TempFile:
    """A new file being written beside its destination (from ``SafeRoot.create_temp``).
    ``commit`` puts it in place; ``abort``, an error in ``write`` or ``commit``, or leaving
    the ``with`` block uncommitted removes it and leaves the destination as it was. A
    process killed meanwhile leaves only the temporary, for ``clean_temporaries``."""

    def __init__(self, dfd: int, rel: str, temp_name: str, fd: int,
                 root: SafeRoot | None = None, st: os.stat_result | None = None) -> None:
        """``root``: the `SafeRoot` it was made in, told when the temporary leaves its
        directory (`SafeRoot.note_installed`): installed, or removed. ``st``: the file's
        fstat, if the caller has it (its inode is what says later that the temporary is
        still ours)."""
        self.path = rel
        self.temp_name = temp_name
        self._dfd = dfd
        self._fd = fd
        self._st = os.fstat(fd) if st is None else st
        self._root = root
        self.keeper: Keeper | None = None  # as SafeRoot.keeper
        self.full = False  # a test's full disk (rdc.local.faults)
        self._written = 0  # bytes appended by `write`
        self._flushed = 0  # of those, how many have had their writeback started

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def fileno(self) -> int:
        self._check_open()
        return self._fd

    def write(self, data: bytes | bytearray | memoryview) -> int:
        """Append all of ``data``; on any error the temporary is removed first."""
        self._check_open()
        view = memoryview(data).cast("B")
        total = view.nbytes
        try:
            if self.full and total:
                raise faults.no_space(self.path)
            while view:
                view = view[os.write(self._fd, view):]
        except BaseException as exc:
            self._fail(exc)
            raise
        self._written += total
        if self._written - self._flushed >= WRITEBACK_STEP and _native.start_writeback:
            _native.start_writeback(self._fd, self._flushed, self._written - self._flushed)
            self._flushed = self._written
        return total

    def commit(
        self, mode: int, mtime_ns: int, expect: Expect | None = None, *,
        replace_dir: bool = False, sync_dir: bool = True,
    ) -> os.stat_result:
        """Give the file ``mode`` (see ALLOW_SETID) and mtime ``mtime_ns``, fsync it, check
        ``expect`` against what is at the destination (else ConflictError), rename it over
        the destination and fsync the directory (unless ``sync_dir`` is False: the caller
        then syncs it later, and a crash before that leaves the old file); return the
        file's final stat. A directory
        at the destination is IsADirectoryError unless ``replace_dir``. On any error the
        temporary is gone and the destination is as it was, except for an error after the
        rename (fsyncing the directory), which leaves the new file in place. The rename is
        made in the directory the temporary was created in, even if that was moved since.

        ``replace_dir`` moves the directory to a temporary name, renames the file in, then
        removes the directory tree: between the two renames the path is empty, and a
        process killed just there leaves neither (both under temporary names)."""
        self.prepare(mode, mtime_ns)
        try:
            os.fsync(self._fd)
        except BaseException as exc:
            self._fail(exc)
            raise
        return self.install(expect, replace_dir=replace_dir, sync_dir=sync_dir)

    def prepare(self, mode: int, mtime_ns: int) -> None:
        """Give the file its final ``mode`` and mtime, not yet durable: the first half of
        `commit`, for callers that make many temporaries durable at once (`sync_all`)
        before they `install` any. On error the temporary is gone."""
        self._check_open()
        try:
            os.fchmod(self._fd, _file_mode(mode))
            os.utime(self._fd, ns=(mtime_ns, mtime_ns))
        except BaseException as exc:
            self._fail(exc)
            raise

    def install(
        self, expect: Expect | None = None, *, replace_dir: bool = False, sync_dir: bool = True
    ) -> os.stat_result:
        """The second half of `commit`: check ``expect`` and rename the (durable) file into
        place; as `commit` says."""
        self._check_open()
        try:
            _install(self._dfd, self.temp_name, leaf_name(self.path), self.path, self._st,
                     expect, replace_dir, sync_dir, self.keeper)
            final = os.fstat(self._fd)
        except BaseException as exc:
            self._fail(exc)
            raise
        self._close(None if replace_dir else final)  # (a directory went: list it again)
        return final

    def pinned(self) -> tuple[int, bytes, bytes, int, int, int]:
        """(directory descriptor, temporary name, destination name, descriptor, inode,
        device): what `rdc._native.install_new` installs it by."""
        self._check_open()
        return (self._dfd, os.fsencode(self.temp_name), os.fsencode(leaf_name(self.path)),
                self._fd, self._st.st_ino, self._st.st_dev)

    def installed_natively(self, seen: tuple[int, int, int, int] | bool) -> FileStat:
        """Note an install `rdc._native.install_new` made (it closed both descriptors), and
        return the file's stat after (``seen``: its `Seen` fields; True where there was no
        memory for them)."""
        self._fd = self._dfd = -1
        after = None if seen is True else Seen(*seen)
        if self._root is not None:
            self._root.note_installed(self.path, after)
        if after is None:
            raise MemoryError(f"{self.path}: installed, but no memory for its stat")
        return after

    def abort(self) -> None:
        """Remove the temporary (if it is still ours) and close; idempotent."""
        if not self.closed:
            self._discard()

    def keep(self) -> None:
        """Close, leaving the temporary where it is (its lock goes with the descriptor):
        an interrupted transfer's partial file, for resuming it (rdc.transfer.resume);
        ``clean_temporaries`` removes it after PARTIAL_SECONDS."""
        if not self.closed:
            self._close()

    def _fail(self, exc: BaseException) -> None:
        if isinstance(exc, OSError):
            exc.filename, exc.filename2 = self.path, None
        self._discard()

    def _discard(self) -> None:
        try:
            _unlink_if(self._dfd, self.temp_name, self._st)
        finally:
            self._close()

    def _close(self, installed: os.stat_result | None = None) -> None:
        """Close both descriptors; the root notes the temporary gone from its directory
        (``installed`` there with this stat, else removed or kept)."""
        if self._root is not None and self._fd >= 0:
            self._root.note_installed(self.path, installed)  # (after the change)
        fd, dfd, self._fd, self._dfd = self._fd, self._dfd, -1, -1
        with contextlib.suppress(OSError):
            os.close(fd)
        with contextlib.suppress(OSError):
            os.close(dfd)

    def _check_open(self) -> None:
        if self.closed:
            raise ValueError(f"temporary for {self.path!r} is already committed or aborted")

    def __enter__(self) -> TempFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.abort()

    def __del__(self) -> None:
        # Nobody can commit it any more: behave as abort. (Most were committed: a first
        # copy's server spent 2.6% of its interpreter time here, in `contextlib`.)
        if getattr(self, "_fd", -1) >= 0:
            with contextlib.suppress(Exception):
                self._discard()
