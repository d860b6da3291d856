"""The specification of the C directory listing (`_listing.list_dir`), and the pure-Python
implementation: one directory's entries with what ``lstat`` says of each."""

from __future__ import annotations

import errno
import os

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
