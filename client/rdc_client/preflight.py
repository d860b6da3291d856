"""Checks made before a command changes anything: that LOCAL is a directory (or can be
made one), and that the directories rdc keeps its own state in can be written. A sync
that changed the server and only then failed to save what it did would leave the next
sync to guess; one clear line before the first change costs nothing."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from rdc.errors import FileAccessError, FileWriteError

# Where to point a user whose state or cache directory cannot be written.
KEPT = {"XDG_CACHE_HOME": "its signature index", "XDG_STATE_HOME": "what each sync did"}


def existing_directory(path: str) -> None:
    """``path`` (LOCAL of a push) must be a directory."""
    if os.path.isdir(path):
        return
    if not os.path.lexists(path):
        raise FileAccessError(path=path, reason="no such directory")
    raise FileAccessError(path=path, reason="not a directory")


def missing_directories(path: str) -> list[str]:
    """``path`` and its ancestors that do not exist, outermost first."""
    missing = []
    path = os.path.abspath(path)
    while not os.path.lexists(path):
        missing.append(path)
        path = os.path.dirname(path)
    return missing[::-1]


def make_directory(path: str) -> list[str]:
    """``path`` (LOCAL of a pull or sync) as a directory, made with its missing parents;
    the directories made, outermost first (so a failed run can remove them again)."""
    made = missing_directories(path)
    if os.path.lexists(path) and not os.path.isdir(path):
        raise FileWriteError(path=path, reason="it exists and is not a directory")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        where = exc.filename or path
        raise FileWriteError(path=where, reason=exc.strerror or str(exc)) from None
    return made


def remove_made(directories: list[str]) -> None:
    """Remove directories `make_directory` made, innermost first, while they are empty."""
    for path in reversed(directories):
        try:
            os.rmdir(path)
        except OSError:  # not empty (something arrived in it), or gone: keep the rest
            return


def writable(directory: Path, variable: str) -> None:
    """``directory`` (where rdc keeps a cache or state, named by ``variable``) exists or
    can be made, and a file can be created in it; else FileWriteError naming it."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _unwritable(exc.filename or directory, exc, variable) from None
    try:
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as exc:
        raise _unwritable(directory, exc, variable) from None


def _unwritable(path: str | Path, exc: OSError, variable: str) -> FileWriteError:
    return FileWriteError(path=path, reason=f"{exc.strerror or exc}; rdc keeps "
                          f"{KEPT[variable]} there (set {variable} to a writable directory)")
