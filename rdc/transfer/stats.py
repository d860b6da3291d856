"""What a sync is asked to do (`Options`) and what it did (`Stats`), with the progress
events it reports along the way."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rdc.local.snapshot import Entry, iter_entries
from rdc.transfer.compare import Changes
from rdc.wire import messages as m

CONCURRENT_FILES = 32


@dataclass(frozen=True, slots=True)
class Event:
    """Progress of a transfer: files and bytes done of those planned."""

    files_done: int
    files_total: int
    bytes_done: int
    bytes_total: int
    path: str = ""


@dataclass
class Options:
    delete: bool = False
    dry_run: bool = False
    concurrency: int = CONCURRENT_FILES
    progress: Callable[[Event], None] | None = None


@dataclass
class Stats:
    """What a push, pull or sync round did. Socket byte counts are filled in by the
    caller."""

    files_total: int = 0
    files_transferred: int = 0
    literal_bytes: int = 0
    matched_bytes: int = 0
    copied_files: int = 0
    dirs_created: int = 0
    links: int = 0
    deleted: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)
    changes: Changes | None = None  # what the comparison found (for -v and dry runs)
    in_step: bool = False  # both trees equal at the end (content and times)
    seq: int = 0  # the share's change sequence number after this run's writes
    conflicts: list[tuple[str, str]] = field(default_factory=list)  # (path, conflict copy)
    warnings: list[str] = field(default_factory=list)
    bytes_sent: int = 0
    bytes_received: int = 0
    seconds: float = 0.0

    def file_done(self, path: str, done: m.Done) -> None:
        """Count one file's outcome (the target's ``done``)."""
        if not done.ok:
            self.failed.append((path, f"{done.code}: {done.msg}"))
            return
        if done.how in ("copy", "whole", "delta"):
            self.files_transferred += 1
        if done.how == "copy":
            self.copied_files += 1
        self.literal_bytes += done.literal
        self.matched_bytes += done.matched

    def ops_done(self, ops: list[m.Op], results: list[m.Failure | None]) -> list[bool]:
        """Record the failures among ``results`` (one per op); True per op that
        succeeded."""
        for op, result in zip(ops, results, strict=True):
            if result is not None:
                self.failed.append((op.path, f"{result.code}: {result.msg}"))
        return [result is None for result in results]

    def as_json(self) -> dict[str, Any]:
        return {
            "bytes_sent": self.bytes_sent,
            "bytes_received": self.bytes_received,
            "literal_bytes": self.literal_bytes,
            "matched_bytes": self.matched_bytes,
            "files_total": self.files_total,
            "files_transferred": self.files_transferred,
            "files_copied_locally": self.copied_files,
            "dirs_created": self.dirs_created,
            "links": self.links,
            "deleted": self.deleted,
            "errors": [{"path": p, "error": e} for p, e in self.failed],
            "conflicts": [{"path": p, "copy": c} for p, c in self.conflicts],
            "warnings": self.warnings,
            "in_step": self.in_step,
            "seconds": round(self.seconds, 3),
        }


class Progress:
    """Files and bytes done of those planned, reported to ``options.progress``."""

    def __init__(self, options: Options, files_total: int, bytes_total: int) -> None:
        self.report = options.progress
        self.files_total = files_total
        self.bytes_total = bytes_total
        self.files_done = 0
        self.bytes_done = 0

    def file_done(self, path: str, size: int) -> None:
        self.files_done += 1
        self.bytes_done += size
        if self.report:
            self.report(Event(self.files_done, self.files_total, self.bytes_done,
                              self.bytes_total, path))


def count_files(tree: Entry) -> int:
    return sum(1 for _, e in iter_entries(tree) if e.kind == "f")
