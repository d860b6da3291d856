"""Faults that tests inject through the environment, so that what rdc does on a full disk
is tested without filling one (no tmpfs or loop device without root; RLIMIT_FSIZE gives
EFBIG, not ENOSPC). Both are read once, at import, and cost nothing when unset.

- ``RDC_TEST_FULL=DIR``: writing a new file anywhere under ``DIR`` fails with ENOSPC,
  as the kernel would say it (the bytes are not written).
- ``RDC_TEST_INDEX_PAGES=N``: every signature index is capped at ``N`` pages (SQLite's
  ``max_page_count``; at least its current size), so that growing it fails the way a
  full disk makes it fail: SQLITE_FULL, "database or disk is full".
"""

from __future__ import annotations

import errno
import os

_FULL = os.environ.get("RDC_TEST_FULL")
FULL_DIR = os.path.realpath(_FULL) if _FULL else None
INDEX_PAGES = int(os.environ.get("RDC_TEST_INDEX_PAGES") or 0) or None


def full(path: str) -> bool:
    """Whether new files under ``path`` (absolute) are to fail as on a full disk."""
    return FULL_DIR is not None and (path == FULL_DIR or path.startswith(FULL_DIR + os.sep))


def no_space(path: str) -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
