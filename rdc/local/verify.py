"""Files read again against their index: bit rot found, and the index made to say what is
really there.

The index trusts a file whose size, mtime and inode did not change (that is what makes a
sync with nothing to do cheap). A file whose bytes changed without any of those changing
(a flipped bit on the disk, an editor that restores the time) is then served and compared
by a signature it no longer has. `recheck` reads one such file again; `verify_tree` reads
every file (``rdc verify``, the server's scrub). Both store what they read, so that the
index describes what is there: the next push from a good copy then repairs the file, and
a pull gets what is really there rather than failing on it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

from rdc.content.signature import signature_of_file
from rdc.local.filestat import stamp
from rdc.local.ignore import Excludes
from rdc.local.paths import PathError
from rdc.local.replica import Replica
from rdc.records import record

CHANGED = "content changed without an mtime change"


@record
class Finding:
    """A file whose content differs from its index though its size, mtime and inode are
    what the index recorded: ``indexed`` the root the index had, ``found`` the root of
    what is there."""

    path: str
    indexed: bytes
    found: bytes


@dataclass
class Report:
    """What `verify_tree` read: files and bytes, the mismatches, what it could not read."""

    files: int = 0
    bytes: int = 0
    findings: list[Finding] = field(default_factory=list)
    errors: list[tuple[str, str]] = field(default_factory=list)


def recheck(replica: Replica, path: str) -> Finding | None:
    """Read the file at ``path`` again (not trusting its index) and store its signature;
    the mismatch if its content is not what the index said although nothing else about
    it changed. Raises OSError or PathError if it cannot be read."""
    with replica.lock:
        row = replica.db.get(path)
    with replica.fs.open_read(path) as f:
        before = os.fstat(f.fileno())
        signature = signature_of_file(f)
        after = os.fstat(f.fileno())
    moved = stamp(before) != stamp(after)
    replica.record(path, before, signature, racy=True if moved else None)
    if row is None or moved or not row.describes(before) or row.root == signature.root:
        return None
    with replica.lock:
        replica.db.note_unsure(path, before)  # (stat no longer vouches for this file:
        # a sync by stamp roots reads it, rdc.local.stamproots)
        replica.db.cache_hashes(None, ())  # sealed with the old content
    return Finding(path, row.root, signature.root)


def verify_tree(
    replica: Replica,
    excludes: Excludes | None = None,
    found: Callable[[Finding], None] | None = None,
) -> Report:
    """Read every file of the replica again and compare it with its index (blocking);
    ``found`` is called for each mismatch as it is found. Files new or changed since they
    were indexed are indexed now, without being mismatches."""
    report = Report()
    walked = replica.walk(excludes)
    report.errors += walked.errors
    for path in sorted(walked.files):
        try:
            finding = recheck(replica, path)
        except (OSError, PathError) as exc:
            report.errors.append((path, getattr(exc, "strerror", None) or str(exc)))
            continue
        report.files += 1
        report.bytes += walked.files[path].st_size
        if finding is not None:
            report.findings.append(finding)
            if found is not None:
                found(finding)
    return report
