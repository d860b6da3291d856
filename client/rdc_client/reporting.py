"""What push, pull, sync and watch print, and where.

- stdout: the list of what was done (``-v``; a dry run's plan) and the summary
  (``--stats``); with ``--json`` or ``--stats-json -`` stdout carries only that JSON, and
  the rest goes to stderr.
- stderr: errors (always), warnings and conflict notes (not with ``-q``), progress.
- ``--json``: events (`rdc_client.events`), ``--stats-json FILE``: the summary.

The list names only what was done: a deletion that was held back, or a file that failed,
is not listed (its error is).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

from rdc.errors import UsageError
from rdc.transfer.stats import Options, Stats
from rdc_client.events import EventStream, JsonProgress
from rdc_client.progress import ProgressLine, TransferBar, human_bytes

if TYPE_CHECKING:
    from rdc.transfer.twoway import Actions


def check(args: argparse.Namespace) -> None:
    """Refuse report options that contradict each other."""
    if args.quiet and (args.verbose or args.progress or args.stats):
        raise UsageError(message="-q leaves out what -v, --progress and --stats print: "
                         "give one or the other")
    if args.json and args.stats_json == "-":
        raise UsageError(message="--json and --stats-json - both write to stdout: give one")


class Report:
    """One command's output, set up from its arguments."""

    def __init__(self, args: argparse.Namespace, command: str) -> None:
        self.args = args
        self.command = command
        self.events = EventStream() if args.json else None
        machine = args.json or args.stats_json == "-"
        self.out: TextIO = sys.stderr if machine else sys.stdout
        self.rounds = 0

    # ------------------------------------------------------------ while it runs

    def scan_line(self) -> ProgressLine:
        """The display of signing the local tree (with ``--progress``, not in JSON)."""
        return ProgressLine(enabled=self.args.progress and self.events is None)

    def transfer_display(self, after: ProgressLine | None = None) -> TransferBar | JsonProgress:
        if self.events is not None and self.args.progress:
            return JsonProgress(self.events)
        return TransferBar(enabled=self.args.progress and self.events is None, after=after)

    def options(self, **kwargs: Any) -> Options:
        """Options with this report's progress display and file events."""
        kwargs.setdefault("progress", self.transfer_display())
        files = self.events.file if self.events is not None else None
        return Options(files=files, **kwargs)

    def status(self, state: str, text: str, **fields: Any) -> None:
        """A watch's state (connected, retrying), as a line on stderr and an event."""
        if not self.args.quiet:
            print(f"rdc {self.command}: {text}", file=sys.stderr)
        if self.events is not None:
            self.events.emit("status", state=state, message=text, **fields)

    # ------------------------------------------------------------ at the end

    def one_way(self, stats: Stats, push: bool, exit_code: int) -> None:
        """A push's or pull's list (``-v``, dry run), errors and summary."""
        args = self.args
        changes = stats.changes
        where = "remote" if push else "local"
        removed = {path for kind, path, _ in stats.applied if kind == "rm"}
        if changes is not None and (args.verbose or args.dry_run):
            lines = _one_way_lines(stats, push, args.delete, args.dry_run, removed)
            for line in lines:
                print(line, file=self.out)
        if self.events is not None and not args.dry_run:
            for path in dict.fromkeys(p for plan in stats.plans() for p, _ in plan.removals):
                if path in removed:
                    self.events.emit("delete", path=path, where=where)
        extras = changes is not None and any(
            path not in removed for path, _ in changes.removals)
        self._end(stats, exit_code, explained=extras)

    def two_way(self, stats: Stats, actions: Actions, exit_code: int, watch: bool = False
                ) -> None:
        """A sync round's list, conflicts, errors and summary; a watch leaves out rounds
        that did nothing."""
        args = self.args
        if watch and not (actions or stats.failed or stats.warnings or stats.refused):
            return
        self.rounds += 1
        done = {(path, where) for kind, path, where in stats.applied if kind == "rm"}
        if args.verbose or args.dry_run:
            for line in _two_way_lines(stats, actions, args.dry_run):
                print(line, file=self.out)
        if self.events is not None and not args.dry_run:
            for where, items in (("local", actions.local_rms), ("remote", actions.remote_rms)):
                for path, _ in items:
                    if (path, where) in done:
                        self.events.emit("delete", path=path, where=where)
        for path, copy in stats.conflicts:
            if not args.quiet:
                print(f"conflict: {path} changed on both sides; the older version is now "
                      f"{copy}", file=sys.stderr)
            if self.events is not None:
                self.events.emit("conflict", path=path, copy=copy)
        self._end(stats, exit_code, explained=watch)  # a watch goes again at once

    def _end(self, stats: Stats, exit_code: int, explained: bool) -> None:
        """Errors, warnings, the summary (text, file, event). ``explained``: the trees are
        expected to differ at the end (the receiver keeps extra entries)."""
        args = self.args
        warnings = list(stats.warnings)
        explained = explained or bool(stats.refused)  # deletions held back: they differ
        if not stats.in_step and not args.dry_run and (stats.failed or not explained):
            warnings.append("the trees differ at the end"
                            + ("" if stats.failed else
                               " (something changed during the run: run it again)"))
        for path, error in stats.failed:
            print(f"rdc: {path}: {error_text(path, error)}", file=sys.stderr)
            if self.events is not None:
                self.events.emit("error", path=path, message=error)
        for warning in warnings:
            if not args.quiet:
                print(f"rdc: warning: {warning}", file=sys.stderr)
            if self.events is not None:
                self.events.emit("warning", message=warning)
        for why in stats.refused:  # a deletion guard (exit 7): said even with -q
            print(f"rdc: {'would refuse' if args.dry_run else 'refused'} to delete: {why}",
                  file=sys.stderr)
            if self.events is not None:
                self.events.emit("refused", message=why)
        summary = stats.as_json()
        summary["warnings"] = warnings
        if args.stats:
            print(summary_text(stats, args.dry_run), file=self.out)
        if args.stats_json:
            self._write_json(summary)
        if self.events is not None:
            extra = {"round": self.rounds} if self.command == "watch" else {}
            self.events.emit("summary", command=self.command, dry_run=bool(args.dry_run),
                             exit_code=exit_code, **extra, **summary)

    def _write_json(self, summary: dict[str, Any]) -> None:
        text = json.dumps(summary, indent=2) + "\n"
        if self.args.stats_json == "-":
            sys.stdout.write(text)
            sys.stdout.flush()
            return
        try:
            with open(self.args.stats_json, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as exc:
            raise UsageError(
                message=f"cannot write {self.args.stats_json}: {exc.strerror}") from None


def error_text(path: str, error: str) -> str:
    """An error of ``path`` without its path said twice (``io: PATH: Permission denied``
    is ``io: Permission denied`` after ``PATH:``)."""
    code, sep, rest = error.partition(": ")
    if sep and rest.startswith(f"{path}: "):
        return f"{code}: {rest[len(path) + 2:]}"
    return error


def _one_way_lines(stats: Stats, push: bool, delete: bool, dry_run: bool,
                   removed: set[str]) -> list[str]:
    """The lines of ``-v`` (what was done, by every plan carried out) or of a dry run
    (what would be); the entries kept (no ``--delete``) as the last comparison found
    them."""
    changes = stats.changes
    assert changes is not None
    plans = stats.plans()
    verb = "would " if dry_run else ""
    ops = {(kind, path) for kind, path, _ in stats.applied}
    lines: dict[str, None] = {}  # in order, each once

    def each(items: str) -> list[tuple]:
        return [item for plan in plans for item in getattr(plan, items)]

    for path, _ in each("replace"):
        if dry_run or path in removed:
            lines[f"{verb}replace {path}"] = None
    for path, _ in each("mkdirs"):
        if dry_run or ("mkdir", path) in ops:
            lines[f"{verb}create {path}/"] = None
    for path, _ in each("files"):
        if dry_run or path in stats.moved:
            lines[f"{verb}send {path}" if push else f"{verb}fetch {path}"] = None
    for path, target, _ in each("links"):
        if dry_run or ("link", path) in ops:
            lines[f"{verb}link {path} -> {os.fsdecode(target)}"] = None
    for path, what in changes.meta:
        if "mode" in what:
            lines[f"{verb}chmod {path or '.'}"] = None
        if "time" in what:
            lines[f"{verb}touch {path or '.'}"] = None
    if delete:
        for path, _ in each("removals"):
            if dry_run or path in removed:
                lines[f"{verb}delete {path}"] = None
    else:
        for path, _ in changes.removals:
            lines[f"extra {path} (kept; --delete removes it)"] = None
    return list(lines)


def _two_way_lines(stats: Stats, actions: Actions, dry_run: bool) -> list[str]:
    """The lines of a sync round's ``-v`` (what was done, in the order it was done, on
    which side: ``here`` or ``there``) or of its dry run (what would be)."""
    verb = "would " if dry_run else ""
    done = {(kind, path, where) for kind, path, where in stats.applied}
    lines: list[str] = []

    def each(kind: str, label: str, local: list, remote: list,
             text: Callable[[Any], str] = str) -> None:
        """``label`` each item of the two lists (its path first) that was done."""
        for where, side, items in (("local", "here", local), ("remote", "there", remote)):
            for item in items:
                path = item if isinstance(item, str) else item[0]
                if dry_run or (kind, path, where) in done:
                    lines.append(f"{verb}{label} {side} {text(item)}")

    a = actions
    each("mv", "move", a.local_moves, a.remote_moves, lambda i: f"{i[0]} -> {i[1]}")
    each("rm", "replace", a.local_replace, a.remote_replace, lambda i: i[0])
    each("mkdir", "create", a.local_mkdirs, a.remote_mkdirs, lambda i: f"{i[0]}/")
    for label, items in (("send", a.pushes), ("fetch", a.gets)):
        lines += [f"{verb}{label} {path}" for path, _ in items
                  if dry_run or path in stats.moved]
    each("link", "link", a.local_links, a.remote_links,
         lambda i: f"{i[0]} -> {os.fsdecode(i[1])}")
    each("rm", "delete", a.local_rms, a.remote_rms, lambda i: i[0])
    each("rmdir", "delete", a.local_rmdirs, a.remote_rmdirs, lambda i: f"{i}/")
    each("meta", "set mode and time", a.local_meta, a.remote_meta, lambda i: i[0])
    return lines


def summary_text(stats: Stats, dry_run: bool = False) -> str:
    """``--stats``: the file counters (they add up to the total), data, wire, and the
    other changes and errors where there were any."""
    moved = (f"{stats.files_to_transfer:,} to transfer" if dry_run else
             f"{stats.files_transferred:,} transferred ({stats.copied_files:,} copied locally)")
    lines = [
        f"files: {stats.files_total:,} total, {moved}, {stats.files_unchanged:,} unchanged, "
        f"{stats.files_failed:,} failed",
        f"data: {human_bytes(stats.literal_bytes)} literal, "
        f"{human_bytes(stats.matched_bytes)} matched",
        f"wire: {human_bytes(stats.bytes_sent)} sent, "
        f"{human_bytes(stats.bytes_received)} received in {stats.seconds:.2f} s",
    ]
    other = [f"{n:,} {one if n == 1 else many}" for n, one, many in (
        (stats.dirs_created, "directory created", "directories created"),
        (stats.links, "link made", "links made"),
        (stats.deleted, "deleted", "deleted")) if n]
    if other:
        lines.append("other: " + ", ".join(other))
    if stats.failed:
        lines.append(f"errors: {len(stats.failed):,}")
    if stats.by_stamps:
        lines.append("compared by size and time (no index yet): files that matched were "
                     "not read; --checksum reads them")
    return "\n".join(lines)
