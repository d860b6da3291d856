"""Versions: what a sync replaces or deletes, kept in a store outside the synced tree, with
a retention policy, to be listed and brought back (``rdc versions``).

The store mirrors the tree's directories; a version of ``dir/report.txt`` kept at 19:30:11
UTC on 22 November 2026 is ``STORE/dir/report~20261122-193011.txt`` (``-2``, ``-3`` after
the time for more in the same second), with the file's own mode and mtime. It lives
outside the synced tree so that it is never scanned, hashed, synced or versioned again,
never makes a mirror differ from its source, and is not lost with the tree (``rm -rf``,
or a deletion synced from the other side). A version is a hard link to the replaced inode
(which the sync no longer uses: new content always goes to a new file), so keeping one
costs no copy; where the store is on another file system it is a copy.

`VersionStore.keeper` is the hook `rdc.local.fs.SafeRoot` calls just before it replaces or
removes an entry: regular files are kept (every file of a removed directory too), links
and directories themselves are not.
"""

from __future__ import annotations

import calendar
import contextlib
import errno
import json
import math
import os
import re
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import blake3

from rdc.errors import UsageError
from rdc.local.fs import Keeper, SafeRoot
from rdc.local.paths import is_temporary
from rdc.records import record

MARKER = ".rdc-versions"  # in the store's top directory: which tree it belongs to
FORMAT = 1
STAMP = "%Y%m%d-%H%M%S"
_VERSION = re.compile(r"(?P<stem>.*)~(?P<stamp>\d{8}-\d{6})(?:-(?P<n>\d+))?", re.DOTALL)
MAX_NAME = 255
DAY = 86400.0
# Staggered retention (as Syncthing's): up to an age, at most one version per step.
STAGGER_STEPS = ((3600.0, 30.0), (DAY, 3600.0), (30 * DAY, DAY), (math.inf, 7 * DAY))
STAGGER_MAX_DAYS = 365
PRUNE_SECONDS = 3600.0  # a long-running sync prunes every file's versions this often


class VersionKeepError(OSError):
    """A version could not be kept: the change that would have lost the file fails."""


@record
class Retention:
    """How many versions of a file are kept: ``keep`` the newest N, ``staggered`` (at most
    one per 30 s for the first hour, per hour for the first day, per day for the first 30
    days, then per week, none older than ``max_days``), or ``all``."""

    kind: str
    count: int = 0
    max_days: float = STAGGER_MAX_DAYS

    @classmethod
    def parse(cls, text: str | int) -> Retention:
        """``N`` or ``keep:N``, ``staggered`` or ``staggered:DAYS``, ``all``."""
        word = str(text).strip().lower()
        kind, _, arg = word.partition(":")
        if kind.isdigit() and not arg:
            kind, arg = "keep", kind
        try:
            if kind == "keep" and int(arg) >= 1:
                return cls("keep", count=int(arg))
            if kind == "staggered" and (not arg or float(arg) > 0):
                return cls("staggered", max_days=float(arg) if arg else STAGGER_MAX_DAYS)
            if kind == "all" and not arg:
                return cls("all")
        except ValueError:
            pass
        raise UsageError(message=f"bad versions policy {text!r}: expected N (keep the newest "
                         "N of each file), staggered[:DAYS] or all")

    def __str__(self) -> str:
        if self.kind == "keep":
            return f"keep the newest {self.count}"
        if self.kind == "staggered":
            return f"staggered, up to {self.max_days:g} days"
        return "keep all"

    def doomed(self, stamps: list[float], now: float) -> set[int]:
        """Indexes into ``stamps`` (times versions were kept, in the order they were kept:
        of two equal times the later index is the newer) of the versions to remove."""
        newest_first = sorted(range(len(stamps)), key=lambda i: (stamps[i], i), reverse=True)
        if self.kind == "keep":
            return set(newest_first[self.count:])
        if self.kind != "staggered":
            return set()
        out: set[int] = set()
        last: float | None = None  # the time of the last version kept (a newer one)
        for i in newest_first:
            age = now - stamps[i]
            too_old = age > self.max_days * DAY
            too_close = last is not None and last - stamps[i] < stagger_step(age)
            if too_old or too_close:
                out.add(i)
            else:
                last = stamps[i]
        return out


def stagger_step(age: float) -> float:
    """The least time between two kept versions where the older is ``age`` seconds old."""
    for up_to, step in STAGGER_STEPS:
        if age <= up_to:
            return step
    return STAGGER_STEPS[-1][1]


@record
class Version:
    """One kept version: the path it had in the tree, when it was kept (seconds since the
    epoch), and where it is in the store."""

    path: str
    kept: float
    n: int  # the count within the second it was kept
    location: Path
    size: int
    mtime_ns: int
    mode: int

    @property
    def label(self) -> str:
        """The version's name in the store (its time, and a count within that second)."""
        return self.location.name


def version_name(name: str, when: float, n: int = 1) -> str:
    """``report~20261122-193011.txt`` for ``report.txt`` (``-N`` from the second on)."""
    stem, ext = os.path.splitext(name)
    stamp = time.strftime(STAMP, time.gmtime(when)) + (f"-{n}" if n > 1 else "")
    out = f"{stem}~{stamp}{ext}"
    excess = len(os.fsencode(out)) - MAX_NAME
    if excess > 0:  # a name near the limit: its stem is shortened, kept apart by a hash
        tag = blake3.blake3(os.fsencode(name)).hexdigest()[:12]
        cut = os.fsdecode(os.fsencode(stem)[: max(1, len(os.fsencode(stem)) - excess - 13)])
        out = f"{cut}-{tag}~{stamp}{ext}"
    return out


def parse_version_name(name: str) -> tuple[str, float, int] | None:
    """(the original name, when kept, count) of a store file name; None if it is none."""
    stem, ext = os.path.splitext(name)
    found = _VERSION.fullmatch(stem)
    if found is None:
        return None
    try:
        when = calendar.timegm(time.strptime(found["stamp"], STAMP))
    except (ValueError, OverflowError):
        return None
    return found["stem"] + ext, float(when), int(found["n"] or 1)


def default_location(local_root: str) -> Path:
    """``$XDG_STATE_HOME/rdc/versions/<name>-<key>`` (default ``~/.local/state``), keyed by
    the synced directory's absolute path, beside the sync bases."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state"
    )
    absolute = os.path.abspath(local_root)
    key = blake3.blake3(os.fsencode(absolute)).hexdigest()[:16]
    name = re.sub(r"[^A-Za-z0-9._-]", "_", os.path.basename(absolute))[:40] or "root"
    return Path(base) / "rdc" / "versions" / f"{name}-{key}"


class VersionStore:
    """The versions of one synced tree (``root``, named in the store's marker) in directory
    ``location``, pruned by ``retention`` (None: never pruned)."""

    def __init__(self, location: str | os.PathLike[str], root: str,
                 retention: Retention | None = None) -> None:
        """UsageError if ``location`` is inside ``root`` (or is it)."""
        self.location = Path(location)
        self.root = root
        self.retention = retention
        self.copies = 0  # versions that had to be copied (the store is on another device)
        self._pruned = -math.inf  # when `prune_due` last pruned everything
        real, top = os.path.realpath(self.location), os.path.realpath(root)
        if real == top or real.startswith(top.rstrip(os.sep) + os.sep):
            raise UsageError(message=f"versions are kept outside the synced tree, not in "
                             f"{location} (inside {root})")

    @classmethod
    def existing(cls, location: str | os.PathLike[str]) -> VersionStore:
        """A store that was made before (``rdc versions``); UsageError if there is none."""
        path = Path(location)
        try:
            marker = json.loads((path / MARKER).read_text(encoding="utf-8"))
            root = marker["root"]
        except (OSError, ValueError, KeyError, TypeError):
            raise UsageError(message=f"no versions kept in {path}") from None
        return cls(path, str(root))

    def _prepare(self) -> None:
        if not (self.location / MARKER).exists():
            self.location.mkdir(parents=True, exist_ok=True, mode=0o700)
            marker = {"format": FORMAT, "root": self.root}
            (self.location / MARKER).write_text(json.dumps(marker) + "\n", encoding="utf-8")

    # ------------------------------------------------------------ keeping

    def keeper(self, prefix: str = "", only: Callable[[str], bool] | None = None) -> Keeper:
        """The hook for ``SafeRoot.keeper`` of the tree's directory ``prefix`` (a server's
        opened directory inside its share); with ``only``, just the paths it accepts
        (relative to the root, as are all paths here)."""

        def keep(dfd: int, leaf: str, rel: str, st: os.stat_result) -> None:
            path = f"{prefix}/{rel}" if prefix else rel
            wanted = only or (lambda _: True)
            try:
                when = time.time()
                if stat.S_ISREG(st.st_mode) and wanted(path):
                    self._prepare()
                    self._keep_file(dfd, leaf, path, st, when)
                elif stat.S_ISDIR(st.st_mode):
                    self._keep_tree(dfd, leaf, path, when, wanted)
            except VersionKeepError:
                raise
            except OSError as exc:
                raise VersionKeepError(
                    exc.errno or errno.EIO,
                    f"cannot keep a version of {path} in {self.location}: "
                    f"{exc.strerror or exc}",
                ) from None

        return keep

    def _keep_file(self, dfd: int, leaf: str, path: str, st: os.stat_result,
                   when: float, prune: bool = True) -> None:
        directory, _, name = path.rpartition("/")
        target_dir = self.location / directory
        target_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        # After the versions of this second: pruning may have freed a smaller count.
        second = float(int(when))
        taken = [found.n for found in self._in_directory(directory)
                 if found.path == path and found.kept == second]
        first = max(taken, default=0) + 1
        for n in range(first, first + 1000):
            target = target_dir / version_name(name, when, n)
            try:
                os.link(leaf, target, src_dir_fd=dfd, follow_symlinks=False)
                break
            except FileExistsError:
                continue
            except OSError as exc:
                if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
                    raise
                if _copy_at(dfd, leaf, target, st):
                    self.copies += 1
                    break
        else:
            raise FileExistsError(errno.EEXIST, "no free version name", path)
        if prune:
            self.prune(path, when)

    def _keep_tree(self, dfd: int, leaf: str, path: str, when: float,
                   wanted: Callable[[str], bool]) -> None:
        """Keep every regular file under the directory ``leaf`` of ``dfd`` that is
        ``wanted``."""
        fd = os.open(leaf, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                     dir_fd=dfd)
        kept = False
        try:
            with os.scandir(fd) as entries:
                names = [e.name for e in entries]
            for name in names:
                if is_temporary(name):
                    continue
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if stat.S_ISREG(st.st_mode) and wanted(f"{path}/{name}"):
                    self._prepare()
                    self._keep_file(fd, name, f"{path}/{name}", st, when, prune=False)
                    kept = True
                elif stat.S_ISDIR(st.st_mode):
                    self._keep_tree(fd, name, f"{path}/{name}", when, wanted)
        finally:
            os.close(fd)
        if kept:
            self.prune_directory(path, when)

    # ------------------------------------------------------------ reading

    def versions(self, path: str = "") -> list[Version]:
        """Every version of the file ``path``, or of every file under directory ``path``
        ("" for all), oldest first per path."""
        if not path or (self.location / path).is_dir():
            found = list(self._walk(path))
            if path:  # a directory, and maybe also a file once: its versions too
                found += [v for v in self._in_directory(path.rpartition("/")[0])
                          if v.path == path]
        else:
            found = [v for v in self._in_directory(path.rpartition("/")[0]) if v.path == path]
        found.sort(key=lambda v: (v.path, v.kept, v.n))
        return found

    def _in_directory(self, directory: str) -> Iterator[Version]:
        """The versions kept in the store's ``directory`` itself (not below it)."""
        top = self.location / directory
        try:
            with os.scandir(top) as entries:
                names = [e.name for e in entries if not e.is_dir(follow_symlinks=False)]
        except (FileNotFoundError, NotADirectoryError):
            return
        for name in names:
            if (directory or name != MARKER) and (version := self._version(directory, name)):
                yield version

    def _walk(self, directory: str) -> Iterator[Version]:
        for dirpath, _, filenames in os.walk(self.location / directory):
            rel_dir = os.path.relpath(dirpath, self.location)
            rel_dir = "" if rel_dir == "." else rel_dir.replace(os.sep, "/")
            for name in filenames:
                if (rel_dir or name != MARKER) and (version := self._version(rel_dir, name)):
                    yield version

    def _version(self, directory: str, name: str) -> Version | None:
        parsed = parse_version_name(name)
        if parsed is None:
            return None
        original, kept, n = parsed
        location = self.location / directory / name
        try:
            st = location.lstat()
        except FileNotFoundError:
            return None
        if not stat.S_ISREG(st.st_mode):
            return None
        return Version(f"{directory}/{original}" if directory else original, kept, n,
                       location, st.st_size, st.st_mtime_ns, stat.S_IMODE(st.st_mode))

    # ------------------------------------------------------------ retention

    def prune(self, path: str, now: float | None = None) -> int:
        """Remove the versions of file ``path`` that the retention policy no longer keeps;
        how many."""
        versions = [v for v in self._in_directory(path.rpartition("/")[0]) if v.path == path]
        return self._prune_groups({path: versions}, now)

    def prune_directory(self, directory: str, now: float | None = None) -> int:
        """`prune` for every file of the store's ``directory`` (not below it)."""
        groups: dict[str, list[Version]] = {}
        for version in self._in_directory(directory):
            groups.setdefault(version.path, []).append(version)
        return self._prune_groups(groups, now)

    def prune_all(self, now: float | None = None) -> int:
        """`prune` for every file: staggered versions thin out as they age, new ones or
        not."""
        groups: dict[str, list[Version]] = {}
        for version in self._walk(""):
            groups.setdefault(version.path, []).append(version)
        return self._prune_groups(groups, now)

    def prune_due(self, now: float | None = None) -> int:
        """`prune_all`, at most once per PRUNE_SECONDS (a watch calls it after each
        round)."""
        now = time.time() if now is None else now
        if self.retention is None or now - self._pruned < PRUNE_SECONDS:
            return 0
        self._pruned = now
        return self.prune_all(now)

    def _prune_groups(self, groups: dict[str, list[Version]], now: float | None) -> int:
        if self.retention is None:
            return 0
        now = time.time() if now is None else now
        removed = 0
        for versions in groups.values():
            versions.sort(key=lambda found: (found.kept, found.n))
            for i in self.retention.doomed([v.kept for v in versions], now):
                with contextlib.suppress(FileNotFoundError):
                    versions[i].location.unlink()
                    removed += 1
        return removed


def _copy_at(dfd: int, leaf: str, target: Path, st: os.stat_result) -> bool:
    """Copy the file ``leaf`` of ``dfd`` to ``target`` (new), with its mode and times;
    False if ``target`` appeared meanwhile."""
    src = os.open(leaf, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
    try:
        try:
            dst = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            return False
        try:
            while piece := os.read(src, 1 << 20):
                view = memoryview(piece)
                while view:
                    view = view[os.write(dst, view):]
            os.fchmod(dst, stat.S_IMODE(st.st_mode))
            os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
        except BaseException:
            os.close(dst)
            with contextlib.suppress(OSError):
                os.unlink(target)
            raise
        os.close(dst)
        return True
    finally:
        os.close(src)


def restore(version: Version, root: SafeRoot, path: str) -> os.stat_result:
    """Put a copy of ``version`` at ``path`` in the tree ``root`` (missing directories
    made), with its mode and mtime, atomically; what is at ``path`` now goes through the
    root's keeper first, as any replaced file does. The version stays in the store."""
    parent = path.rpartition("/")[0]
    if parent:
        root.makedirs(parent, 0o755)
    with open(version.location, "rb") as src, root.create_temp(path) as temp:
        while piece := src.read(1 << 20):
            temp.write(piece)
        return temp.commit(version.mode, version.mtime_ns)


def restore_to(version: Version, destination: str) -> None:
    """Copy ``version`` to a new file ``destination`` outside any tree (FileExistsError if
    something is there), with its mode and mtime."""
    with open(version.location, "rb") as src:
        fd = os.open(destination, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            with open(fd, "wb", closefd=False) as dst:
                while piece := src.read(1 << 20):
                    dst.write(piece)
            os.fchmod(fd, version.mode)
            os.utime(fd, ns=(version.mtime_ns, version.mtime_ns))
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(destination)
            raise
        os.close(fd)
