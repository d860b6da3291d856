"""What rdc keeps of a file's ``stat``: times as signed 64-bit nanoseconds, and the stamp
(size, mtime, inode) that says a file is unchanged since it was read.

Every time that enters rdc from the disk goes through `mtime_ns`. A file system can hold
times that 64 bits of nanoseconds cannot (ext4 goes to the year 2446, ``touch -d
2300-01-01`` works), but the index (SQLite INTEGER), the directory hashes and the wire all
carry signed 64-bit values, so such a time is clamped to the nearest one they can: a file
dated 2300 syncs as dated 2262-04-11, the latest time rdc can express, and the clamped time
is what both sides compare, so the trees still end in step.
"""

from __future__ import annotations

import os
from typing import NamedTuple

NS_MIN = -(1 << 63)
NS_MAX = (1 << 63) - 1


def clamp_ns(ns: int) -> int:
    """``ns`` within the signed 64-bit range."""
    return NS_MIN if ns < NS_MIN else NS_MAX if ns > NS_MAX else ns


class Seen(NamedTuple):
    """What a walk keeps of a file's lstat, by the same names: all that the index's
    checks read (a whole ``os.stat_result`` is about 700 bytes; a walk of 100,000 files
    kept 70 MB of them)."""

    st_mode: int
    st_size: int
    st_mtime_ns: int
    st_ino: int


FileStat = os.stat_result | Seen


def seen(st: FileStat) -> Seen:
    return Seen(st.st_mode, st.st_size, st.st_mtime_ns, st.st_ino)


def mtime_ns(st: FileStat) -> int:
    """The modification time of ``st`` as rdc records and sends it."""
    return clamp_ns(st.st_mtime_ns)


class Stamp(NamedTuple):
    """Size, mtime and inode: if all three are as recorded, the content is taken to be as
    recorded (the index's racy rule covers a write within the same clock tick)."""

    size: int
    mtime_ns: int
    inode: int


def stamp(st: FileStat) -> Stamp:
    return Stamp(st.st_size, mtime_ns(st), st.st_ino)
