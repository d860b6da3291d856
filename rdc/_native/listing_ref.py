"""The specification of the C directory listing (`_listing.list_dir`, `_listing.stamp_tree`),
and the pure-Python implementation: one directory's entries with what ``lstat`` says of
each; the stamp of a whole tree."""

from __future__ import annotations

import errno
import os
import stat
import struct

import blake3

Item = tuple[str, int, int, int, int]  # name, st_mode (or -errno), size, mtime_ns, inode


def list_dir(fd: int) -> list[Item]:
    """The entries of directory ``fd`` (the caller's; neither closed nor moved), without
    "." and "..", in the order the kernel lists them: (name as ``os.fsdecode`` gives it,
    st_mode, st_size, st_mtime_ns, st_ino) of its lstat, or (name, -errno, 0, 0, 0) when the
    lstat failed (gone meanwhile, unreadable). OSError if the directory cannot be read."""
    out: list[Item] = []
    with os.scandir(fd) as entries:
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError as exc:
                out.append((entry.name, -(exc.errno or errno.EIO), 0, 0, 0))
                continue
            out.append((entry.name, st.st_mode, st.st_size, st.st_mtime_ns, st.st_ino))
    return out


# One entry of a directory's stamp input (kind, mode, mtime, size, inode, name length),
# and how a walk opens a directory below another: shared with rdc.local.snapshot, whose
# stamp and walk these are.
STAMP_ENTRY = struct.Struct("<cHqQQI")
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_STAMPED = 1 << 20  # bytes hashed for one directory's stamp, at most
_NS_MIN, _NS_MAX = -(1 << 63), (1 << 63) - 1


def stamp_tree(fd: int, max_depth: int, temp_prefix: bytes, skip: bytes
               ) -> tuple[bytes, int, dict[str, bytes]] | None:
    """The `rdc.local.snapshot.stamp` of the tree under directory ``fd`` (the caller's),
    its number of regular files, and the stamp of each of its directories by relative
    path ("" the top: what a scan compares with the tree it sealed last, to list again
    only the directories that changed), computed without building the tree; entries named
    ``skip`` are left out, as are kinds that are not synced. None ("unsure": the caller
    walks the tree itself) if any entry cannot be read (lstat, listing, opening a
    directory, a link's target), a name starts with ``temp_prefix`` or is not UTF-8 (a
    walk decodes those its own way), a directory lies more than ``max_depth`` levels
    below ``fd``, or a directory's stamp input exceeds MAX_STAMPED bytes. Names sort by
    their bytes, which for UTF-8 is the order of the walk's strings."""
    files = 0
    dirs: dict[str, bytes] = {}

    def stamp_dir(dfd: int, depth: int, rel: str) -> bytes | None:
        nonlocal files
        parts: list[bytes] = []
        pack = STAMP_ENTRY.pack
        for name, mode, size, mtime, ino in sorted(list_dir(dfd), key=lambda i: os.fsencode(i[0])):
            raw = os.fsencode(name)
            if raw.startswith(temp_prefix) or mode < 0:
                return None
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError:
                return None
            if raw == skip:
                continue
            mtime = min(max(mtime, _NS_MIN), _NS_MAX)
            if stat.S_ISREG(mode):
                files += 1
                parts += [pack(b"f", stat.S_IMODE(mode), mtime, size, ino, len(raw)), raw]
            elif stat.S_ISLNK(mode):
                try:
                    target = os.readlink(raw, dir_fd=dfd)
                except OSError:
                    return None
                parts += [pack(b"l", 0, mtime, 0, ino, len(raw)), raw, target + b"\0"]
            elif stat.S_ISDIR(mode):
                if depth >= max_depth:
                    return None
                try:
                    child = os.open(raw, DIR_FLAGS, dir_fd=dfd)
                except OSError:
                    return None
                try:
                    sub = stamp_dir(child, depth + 1, f"{rel}/{name}" if rel else name)
                finally:
                    os.close(child)
                if sub is None:
                    return None
                parts += [pack(b"d", stat.S_IMODE(mode), mtime, 0, ino, len(raw)), raw,
                          sub]
        data = b"".join(parts)
        if len(data) > MAX_STAMPED:
            return None
        dirs[rel] = blake3.blake3(data).digest()
        return dirs[rel]

    try:
        out = stamp_dir(fd, 0, "")
    except OSError:
        return None
    return None if out is None else (out, files, dirs)
