"""The folder marker: a small file at the top of every synced directory, ``.rdc-folder``.

A disk that is not mounted leaves an empty directory where its files were, and a sync
from there looks exactly like "the user deleted everything". So a synced directory gets a
marker the first time rdc sees it with something in it, and rdc remembers (outside the
directory) that it did; a directory that had one and lost it is not the directory that
was synced, and nothing is deleted elsewhere on its account (`rdc.transfer.guards`).
Syncthing's ``.stfolder`` is the model.

The marker is never synced: `rdc.local.ignore.Excludes` leaves it out of every tree, at
any depth, on both sides.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

import blake3

from rdc.local.paths import is_temporary
from rdc.records import record

MARKER = ".rdc-folder"
TEXT = (
    b"This directory is synced by rdc. Please do not delete this file.\n"
    b"\n"
    b"rdc put it here the first time it synced this directory, and remembers that it did.\n"
    b"If the file goes missing (the usual cause: the disk that holds this directory is not\n"
    b"mounted, and what you see is the empty mount point), rdc refuses to delete anything\n"
    b"on this directory's account. If this really is the directory you synced, put the\n"
    b"file back (any content will do, for example `touch .rdc-folder`), or run rdc once\n"
    b"with --force.\n"
)


@record
class RootState:
    """What the marker says of a root: ``marked`` (it has one now) and ``lost`` (it had
    one, as rdc remembers, and has not now)."""

    marked: bool
    lost: bool = False


def has_marker(fd: int) -> bool:
    """Whether the directory open as ``fd`` holds a marker (a regular file; a link or
    anything else there does not count)."""
    try:
        st = os.stat(MARKER, dir_fd=fd, follow_symlinks=False)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode)


def has_content(fd: int) -> bool:
    """Whether the directory open as ``fd`` holds anything but a marker and temporaries
    (one look at its first entries, not a walk)."""
    with os.scandir(fd) as entries:
        return any(e.name != MARKER and not is_temporary(e.name) for e in entries)


def place_marker(fd: int) -> bool:
    """Make the marker in the directory open as ``fd`` (never replacing anything there);
    True if there is one now. A directory rdc cannot write is left without (False)."""
    try:
        out = os.open(MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                      | os.O_CLOEXEC, 0o644, dir_fd=fd)
    except FileExistsError:
        return has_marker(fd)
    except OSError:
        return False
    try:
        os.write(out, TEXT)
        os.fsync(out)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(MARKER, dir_fd=fd)
        return False
    finally:
        os.close(out)
    with contextlib.suppress(OSError):
        os.fsync(fd)
    return True


class MarkerBook:
    """Which roots had a marker: one small file per root in ``directory`` (the client's
    state directory, or the server's), keyed by the root's absolute path, since that is
    what stays when the disk behind it goes. Unwritable: nothing is remembered (then only
    an empty root is caught, not one that lost its marker)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)

    def _record(self, root: str) -> Path:
        key = blake3.blake3(os.fsencode(os.path.abspath(root))).hexdigest()[:24]
        return self.directory / key

    def knows(self, root: str) -> bool:
        return self._record(root).exists()

    def remember(self, root: str) -> None:
        record = self._record(root)
        if record.exists():
            return
        with contextlib.suppress(OSError):
            self.directory.mkdir(parents=True, exist_ok=True)
            record.write_bytes(os.fsencode(os.path.abspath(root)) + b"\n")


def client_book() -> MarkerBook:
    """The client's: ``$XDG_STATE_HOME/rdc/roots/`` (default ``~/.local/state``)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state")
    return MarkerBook(Path(base) / "rdc" / "roots")


def settle(fd: int, root: str, book: MarkerBook, *, place: bool = True) -> RootState:
    """The marker state of root ``root`` (open as ``fd``): marked, lost, or neither; with
    ``place``, a root that has content and was never marked gets its marker now (an empty
    one is left alone: it may be a mount point whose disk is not there)."""
    if has_marker(fd):
        book.remember(root)
        return RootState(True)
    if book.knows(root):
        return RootState(False, lost=True)
    try:
        content = has_content(fd)
    except OSError as exc:
        if exc.errno not in (errno.EACCES, errno.EPERM):
            raise
        content = False
    if place and content and place_marker(fd):
        book.remember(root)
        return RootState(True)
    return RootState(False)
