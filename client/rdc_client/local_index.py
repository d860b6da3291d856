"""Open and refresh the client's signature index of a local directory."""

from __future__ import annotations

import os

from rdc.errors import FileAccessError
from rdc.index import IndexDatabase, RefreshStats, default_location, refresh
from rdc_client.progress import ProgressLine


def indexed(directory: str, progress: bool | None = None) -> tuple[IndexDatabase, RefreshStats]:
    """The refreshed index of ``directory`` (kept in the user's cache directory)."""
    if not os.path.isdir(directory):
        raise FileAccessError(path=directory, reason="not a directory")
    db = IndexDatabase(default_location(directory))
    line = ProgressLine(enabled=progress)
    try:
        stats = refresh(db, directory, progress=line)
    finally:
        line.close()
    return db, stats
