"""The signature index of a directory: signatures, sketches and their inverted indices."""

from rdc.local.index.db import (
    CANDIDATE_LIMIT,
    CANDIDATE_THRESHOLD,
    IndexDatabase,
    IndexedFile,
    Row,
    default_location,
    row_of,
)
from rdc.local.index.update import (
    Progress,
    Reader,
    RefreshStats,
    refresh,
    refresh_some,
    walk_files,
)

__all__ = [
    "CANDIDATE_LIMIT",
    "CANDIDATE_THRESHOLD",
    "IndexDatabase",
    "IndexedFile",
    "Progress",
    "Reader",
    "RefreshStats",
    "Row",
    "default_location",
    "refresh",
    "refresh_some",
    "row_of",
    "walk_files",
]
