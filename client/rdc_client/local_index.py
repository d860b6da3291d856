"""A local directory with its signature index, scanned: for the local tools."""

from __future__ import annotations

import os

from rdc.errors import FileAccessError
from rdc.local.index import default_location
from rdc.local.replica import Replica
from rdc_client.progress import ProgressLine


def scanned(directory: str, progress: bool | None = None) -> Replica:
    """``directory`` with its index (kept in the user's cache directory) brought up to
    date; close it when done."""
    if not os.path.isdir(directory):
        raise FileAccessError(path=directory, reason="not a directory")
    replica = Replica(directory, default_location(directory))
    line = ProgressLine(enabled=progress)
    try:
        replica.scan(progress=line)
    except BaseException:
        replica.close()
        raise
    finally:
        line.close()
    return replica
