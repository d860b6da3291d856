"""`LocalStore`: a store in a local directory, one file per object.

Object `a/b/c` is the file `ROOT/a/b/c`. A put writes a temporary file (`.tmp-*`, outside
the name space) in the object's directory, fsyncs it, renames it over the object (or, for
an exclusive put, hard-links it, which fails if the name is taken) and fsyncs the
directory; new directories are fsynced into their parents. So a crash leaves the old
object or the new one, plus at most a temporary that listings skip. Symlinks inside the
root are followed, so a directory may live on another disk.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator

from rdc.storage.base import SEGMENT, Capabilities, ObjectInfo, Store
from rdc.storage.errors import (
    ObjectExists,
    ObjectNotFound,
    StoreAccessDenied,
    StoreError,
    StoreMissing,
)

TEMP_PREFIX = ".tmp-"
# errno values that mean "there is no object of that name" on a read: missing, or a
# directory (of other objects) where the name points, or a file where a directory is.
_ABSENT = {errno.ENOENT, errno.EISDIR, errno.ENOTDIR}
_DENIED = {errno.EACCES, errno.EPERM, errno.EROFS}


class LocalStore(Store):
    """Objects as files under `root`, which must exist unless `create` (then it is made,
    mode 0700, like every directory the store makes; files are 0600)."""

    def __init__(self, root: str | os.PathLike[str], *, create: bool = False) -> None:
        self.root = os.path.abspath(os.fspath(root))
        self.location = self.root
        if create:
            try:
                self._make_dirs(self.root)
            except OSError as exc:
                raise self._failure(exc, ".", "create") from None
        elif not os.path.isdir(self.root):
            what = "not a directory" if os.path.exists(self.root) else "no such directory"
            raise StoreMissing(location=self.location, message=what)

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(exclusive_create=True, connections=4)

    def _path(self, name: str) -> str:
        return os.path.join(self.root, *name.split("/"))

    def _failure(self, exc: OSError, name: str, doing: str) -> StoreError:
        """The StoreError for an OSError met while `doing` something to object `name`."""
        reason = exc.strerror or str(exc)
        if exc.errno in _DENIED:
            return StoreAccessDenied(location=self.location, message=f"{doing} {name}: {reason}")
        return StoreError(location=self.location, message=f"cannot {doing} {name}: {reason}")

    # ------------------------------------------------------------ writes

    def _make_dirs(self, path: str) -> None:
        """Make `path` and its missing parents, each fsynced into its parent."""
        if os.path.isdir(path):
            return
        parent = os.path.dirname(path)
        if parent != path:
            self._make_dirs(parent)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            if not os.path.isdir(path):
                raise
            return  # made meanwhile by a concurrent put
        _fsync_dir(parent)

    def _put(self, name: str, data: memoryview, exclusive: bool) -> None:
        def write(tmp: str) -> None:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())

        self._write(name, write, exclusive)

    def _put_file(self, name: str, path: str) -> None:
        if not os.path.isfile(path):
            raise FileNotFoundError(errno.ENOENT, "not a regular file", path)

        def write(tmp: str) -> None:
            shutil.copyfile(path, tmp)  # copy_file_range/sendfile where the kernel has them
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

        self._write(name, write, False)

    def _write(self, name: str, write: Callable[[str], None], exclusive: bool) -> None:
        path = self._path(name)
        directory = os.path.dirname(path)
        try:
            self._make_dirs(directory)
            fd, tmp = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=directory)
        except OSError as exc:
            if exc.errno in (errno.ENOTDIR, errno.EEXIST):
                raise StoreError(
                    location=self.location,
                    message=f"cannot store {name}: a part of its path is an object",
                ) from None
            raise self._failure(exc, name, "store") from None
        os.close(fd)
        renamed = False
        try:
            write(tmp)
            if exclusive:
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    if os.path.isdir(path):
                        raise
                    raise ObjectExists(location=self.location, name=name) from None
            else:
                os.replace(tmp, path)
                renamed = True
            _fsync_dir(directory)
        except OSError as exc:
            if exc.errno == errno.EISDIR or (exc.errno == errno.EEXIST and os.path.isdir(path)):
                raise StoreError(
                    location=self.location,
                    message=f"cannot store {name}: it is a directory of other objects",
                ) from None
            raise self._failure(exc, name, "store") from None
        finally:
            if not renamed:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)

    def _delete(self, name: str) -> None:
        path = self._path(name)
        try:
            os.unlink(path)
        except OSError as exc:
            if exc.errno in _ABSENT or (exc.errno == errno.EPERM and os.path.isdir(path)):
                return
            raise self._failure(exc, name, "delete") from None
        _fsync_dir(os.path.dirname(path))

    # ------------------------------------------------------------ reads

    def _open(self, name: str) -> int:
        try:
            # O_NONBLOCK: a FIFO planted under the root must not hang the read.
            fd = os.open(self._path(name), os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno in _ABSENT:
                raise ObjectNotFound(location=self.location, name=name) from None
            raise self._failure(exc, name, "read") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise ObjectNotFound(location=self.location, name=name)
        return fd

    def _read(self, name: str, offset: int, length: int | None) -> bytes:
        fd = self._open(name)
        try:
            if length is None:
                length = max(os.fstat(fd).st_size - offset, 0)
            parts = []
            while length > 0:
                part = os.pread(fd, length, offset)
                if not part:
                    break
                parts.append(part)
                offset += len(part)
                length -= len(part)
            return b"".join(parts)
        except OSError as exc:
            raise self._failure(exc, name, "read") from None
        finally:
            os.close(fd)

    def _get(self, name: str) -> bytes:
        return self._read(name, 0, None)

    def _get_range(self, name: str, offset: int, length: int) -> bytes:
        return self._read(name, offset, length)

    def _stat(self, name: str) -> ObjectInfo:
        try:
            st = os.stat(self._path(name))
        except OSError as exc:
            if exc.errno in _ABSENT:
                raise ObjectNotFound(location=self.location, name=name) from None
            raise self._failure(exc, name, "stat") from None
        if not stat.S_ISREG(st.st_mode):
            raise ObjectNotFound(location=self.location, name=name)
        return ObjectInfo(name, st.st_size)

    def _list(self, prefix: str) -> Iterator[ObjectInfo]:
        # A generator: the walk runs as the caller iterates, directory by directory.
        pending = [prefix]
        while pending:
            directory = pending.pop()
            try:
                with os.scandir(self._path(directory) if directory else self.root) as it:
                    entries = list(it)
            except OSError as exc:
                if exc.errno in _ABSENT:
                    continue  # no such prefix, or removed during the walk
                raise self._failure(exc, directory or ".", "list") from None
            for entry in entries:
                if not SEGMENT.fullmatch(entry.name):
                    continue  # temporaries and foreign files are not objects
                name = f"{directory}/{entry.name}" if directory else entry.name
                try:
                    if entry.is_dir():
                        pending.append(name)
                    elif entry.is_file():
                        yield ObjectInfo(name, entry.stat().st_size)
                except FileNotFoundError:
                    continue  # deleted during the walk


def _fsync_dir(path: str) -> None:
    """Make a rename, link or new entry in directory `path` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
