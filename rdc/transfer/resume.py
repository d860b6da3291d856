"""Resuming an interrupted transfer from what already arrived (docs/protocol.md, "Resuming").

A target writes a file in order into a temporary beside its destination. When a transfer
is interrupted (the peer gone, the connection lost, this process stopped or killed), that
temporary holds a prefix of the new file: it is kept as a *partial* (a temporary of at
least PARTIAL_BYTES that no live writer holds). The next time a file is received at that
path, its partials are seeds like any other: chunked and hashed, their chunks found by
the descent where the new file has them, copied instead of sent, and checked like every
byte of the new file (each leaf against its hash prefix, the whole file against its root),
so a partial that is damaged, hostile or of another version can cost bytes but never
correctness. No message of the protocol changes: this is the target's choice of seeds.

Where partials live: beside the destination, under their temporary name, so that every
rule for temporaries holds (never synced, never named by a peer, never listed). How they
are found again: by the name (``.rdc-tmp-<hex>-<name>``) in the walk that opened the run.
When they go: once a file is committed at their path (whatever its content), when a newer
partial of that path supersedes them, after PARTIAL_SECONDS (`rdc.local.fs`
``clean_temporaries``), and at once on a write error of the disk (a full disk gets its
space back rather than holding a half file). So one path holds at most one partial, and
a partial no run comes back for is gone within a day.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from dataclasses import dataclass, field

import trio

from rdc.content.signature import signature_of_file
from rdc.errors import RemoteError
from rdc.local.fs import PARTIAL_BYTES, TempFile
from rdc.local.paths import PathError, is_temporary, name, parent
from rdc.local.replica import Replica
from rdc.transfer.descent import SeedFile
from rdc.wire.frames import ConnectionClosed

DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
# What interrupts a transfer (and leaves its partial worth keeping), as opposed to what
# makes it fail (a refusal, a disk error, a file that does not check out).
INTERRUPTIONS = (trio.Cancelled, ConnectionClosed, trio.BrokenResourceError,
                 trio.ClosedResourceError, KeyboardInterrupt)


def interrupted(exc: BaseException) -> bool:
    """Whether ``exc`` interrupts a transfer rather than failing it (a connection-level
    error from the peer counts: the connection is gone)."""
    if isinstance(exc, BaseExceptionGroup):
        return all(interrupted(e) for e in exc.exceptions)
    return isinstance(exc, INTERRUPTIONS) or (isinstance(exc, RemoteError)
                                              and exc.code in ("internal", "protocol"))


def _candidates(replica: Replica, path: str) -> list[str]:
    """Temporary names beside ``path`` made for its name, as the run's walk saw them."""
    directory, leaf = parent(path), os.fsencode(name(path))
    out = []
    for rel in replica.temporaries:
        if parent(rel) != directory:
            continue
        temp = name(rel)
        tail = os.fsencode(temp)[len(".rdc-tmp-") + 17:]  # the (maybe cut) name it is for
        if is_temporary(temp) and tail and leaf.startswith(tail):
            out.append(temp)
    return out


@dataclass
class Partials:
    """The partials of one path, opened as seeds while a file is received there."""

    replica: Replica
    path: str
    files: list[tuple[str, int, os.stat_result]] = field(default_factory=list)  # name, fd, st

    @property
    def largest(self) -> int:
        return max((st.st_size for _, _, st in self.files), default=0)

    def seeds(self) -> list[SeedFile]:
        """Each partial as a seed: its tree (read now) and a reader."""
        out = []
        for _, fd, _ in self.files:
            try:
                with os.fdopen(os.dup(fd), "rb") as f:
                    tree = signature_of_file(f).tree
            except OSError:
                continue
            out.append(SeedFile(tree, _reader(fd)))
        return out

    def drop(self) -> None:
        """Remove the partials (if they are still the files opened) and close them."""
        with contextlib.suppress(OSError, PathError), self.replica.fs.subroot(
            parent(self.path)
        ) as directory:
            for temp, _, st in self.files:
                with contextlib.suppress(OSError):
                    now = os.stat(temp, dir_fd=directory.fileno(), follow_symlinks=False)
                    if os.path.samestat(now, st):
                        os.unlink(temp, dir_fd=directory.fileno())
        self.close()

    def close(self) -> None:
        for _, fd, _ in self.files:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.files = []


def _reader(fd: int):
    def read(offset: int, length: int) -> bytes:
        return os.pread(fd, length, offset)

    return read


def open_partials(replica: Replica, path: str, size: int) -> Partials:
    """The partials of ``path`` worth resuming a file of ``size`` bytes from (blocking):
    regular files of at least PARTIAL_BYTES that no live writer holds (its lock), opened.
    None for a file too small to have one."""
    found = Partials(replica, path)
    if size < PARTIAL_BYTES:
        return found
    names = _candidates(replica, path)
    if not names:
        return found
    try:
        directory = replica.fs.subroot(parent(path))
    except (OSError, PathError):
        return found
    with directory:
        for temp in names:
            try:
                fd = os.open(temp, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                             dir_fd=directory.fileno())
            except OSError:
                continue
            st = os.fstat(fd)
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # a live writer holds LOCK_EX
                fcntl.flock(fd, fcntl.LOCK_UN)
            except OSError:
                os.close(fd)
                continue
            if not stat.S_ISREG(st.st_mode) or st.st_size < PARTIAL_BYTES:
                os.close(fd)
                continue
            found.files.append((temp, fd, st))
    return found


def keep_or_drop(temp: TempFile, written: int, partials: Partials, exc: BaseException) -> None:
    """A receive into ``temp`` (``written`` bytes so far) ended with ``exc``: keep the
    temporary as the path's partial if the transfer was interrupted and it holds at least
    as much as the partials it was resumed from (which then go), else remove it (and, on
    a disk error, the old partials too: their space is what the disk lacks)."""
    if interrupted(exc) and written >= max(PARTIAL_BYTES, partials.largest):
        temp.keep()
        partials.drop()
        return
    temp.abort()
    if isinstance(exc, OSError) and exc.errno in DISK_FULL:
        partials.drop()
    else:
        partials.close()
