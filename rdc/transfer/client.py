"""The client's side of push and pull: open, compare, transfer, metadata, finish.

Both directions share the shape; what differs is who applies the changes (the server, by
``ops`` and offers, in a push; this side, with the same functions, in a pull).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from rdc.errors import Refusal, RemoteError
from rdc.local.index import Progress
from rdc.local.paths import PathError, to_wire
from rdc.local.replica import Replica
from rdc.local.snapshot import Entry, Walk, iter_entries
from rdc.transfer import metadata
from rdc.transfer.compare import Changes, Comparison
from rdc.transfer.descent import SourceFile
from rdc.transfer.ops import apply_ops
from rdc.transfer.source import offer_fields, serve_wants
from rdc.transfer.target import receive_file
from rdc.wire.codec import MAX_ITEMS
from rdc.wire.connection import Connection, Conversation, unwrap_group

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
    """What a push or pull did. Socket byte counts are filled in by the caller."""

    files_total: int = 0
    files_transferred: int = 0
    literal_bytes: int = 0
    matched_bytes: int = 0
    copied_files: int = 0
    dirs_created: int = 0
    links: int = 0
    deleted: int = 0
    metadata: int = 0  # entries whose mode or time was set
    times: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)
    changes: Changes | None = None
    in_step: bool = False  # both trees equal at the end (content and times)
    seq: int = 0  # the share's change sequence number after this run's writes
    conflicts: list[tuple[str, str]] = field(default_factory=list)  # (path, conflict copy)
    warnings: list[str] = field(default_factory=list)
    bytes_sent: int = 0
    bytes_received: int = 0
    seconds: float = 0.0

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


def request_open(
    connection: Connection, share: str, path: str, write: bool, create: bool, excludes: list[str]
) -> Conversation:
    """Send ``open``; the server starts scanning its tree, which the client can overlap with
    its own scan before it waits for the answer (`opened`)."""
    return connection.start(
        "open", share=share, path=to_wire(path), write=write, create=create, excludes=excludes
    )


async def opened(conversation: Conversation) -> dict[str, Any]:
    try:
        return await conversation.receive("opened")
    finally:
        conversation.close()


class ScanAbandoned(Exception):
    """Raised from a scan's progress callback to stop the scan at the next file."""


async def scan_while_opening(
    replica: Replica,
    opening: Conversation,
    progress: Callable[[Progress], None] | None = None,
    walked: Walk | None = None,
) -> tuple[dict[str, Any], Entry]:
    """The server's answer to ``open`` and the local tree, scanned meanwhile: the two scans
    are independent, and in series a cold push paid for both (Django, 6.8k files: 1 s of
    4.9). A refused open stops the local scan at its next file."""
    stop = threading.Event()

    def report(event: Progress) -> None:
        if stop.is_set():
            raise ScanAbandoned
        if progress is not None:
            progress(event)

    tree: Entry | None = None

    async def scan() -> None:
        nonlocal tree
        with contextlib.suppress(ScanAbandoned):  # the open was refused
            tree = await trio.to_thread.run_sync(replica.scan, None, report, walked)

    with unwrap_group():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(scan)
            try:
                answer = await opened(opening)
            except BaseException:
                stop.set()
                raise
    assert tree is not None
    return answer, tree


def local_top(tree: Entry) -> tuple[int, int]:
    """The mode and mtime of the directory ``tree`` was scanned from."""
    return tree.mode, tree.mtime_ns


def remote_top(opened: dict[str, Any], push: bool) -> tuple[int, int] | None:
    """The opened directory's own mode and time on the server (``opened`` or ``finished``),
    if this sync keeps them in step: a push leaves a share's top directory alone."""
    theirs = opened.get("top")
    if theirs is None or (push and opened.get("fixed")):
        return None
    return tuple(theirs)


def top_differs(opened: dict[str, Any], mine: tuple[int, int], push: bool) -> bool:
    theirs = remote_top(opened, push)
    return theirs is not None and theirs != mine


def top_differences(tree: Entry, theirs: Any) -> list[tuple[str, str]]:
    """A dry run's line for the opened directory itself ("" is its path)."""
    mode, mtime = theirs
    what = metadata.what(tree.mode != mode, tree.mtime_ns != mtime)
    return [("", what)] if what else []


def _top_op(top: tuple[int, int], path: str | bytes = b"") -> list:
    """The op that sets the opened directory's mode and time (a wire path by default; ""
    for the local side)."""
    return ["meta", path, list(top), None]


def count_files(tree: Entry) -> int:
    return sum(1 for _, e in iter_entries(tree) if e.kind == "f")


class _Progress:
    def __init__(self, options: Options, changes: Changes) -> None:
        self.report = options.progress
        self.files_total = len(changes.files)
        self.bytes_total = sum(changes.sizes.values())
        self.files_done = 0
        self.bytes_done = 0

    def file_done(self, path: str, size: int) -> None:
        self.files_done += 1
        self.bytes_done += size
        if self.report:
            self.report(Event(self.files_done, self.files_total, self.bytes_done,
                              self.bytes_total, path))


# ---------------------------------------------------------------- push


async def push(
    connection: Connection, replica: Replica, tree: Entry, opened: dict, options: Options
) -> Stats:
    """Bring the opened remote directory to the content of ``tree`` (scanned from
    ``replica``)."""
    started = time.monotonic()
    stats = Stats(files_total=count_files(tree))
    stats.failed += [(path, f"cannot read: {reason}") for path, reason in replica.errors]
    theirs = remote_top(opened, push=True)
    top = local_top(tree) if theirs is not None else None
    if tree.content == opened["content"] and tree.meta == opened["meta"]:
        if top is None or top == theirs:
            stats.in_step = not replica.errors
            return stats
        if options.dry_run:
            stats.changes = Changes(meta=top_differences(tree, theirs))
            return stats
        stats.in_step = all(await _ops(connection, [_top_op(top)], stats)) and not replica.errors
        return stats
    for hb in (8, 32):
        changes = await Comparison(tree, push=True, hb=hb).run(connection, opened["content"])
        stats.changes = changes
        if options.dry_run:
            changes.meta = metadata.differences(*await metadata.walk(connection, tree))
            if top is not None:
                changes.meta += top_differences(tree, theirs)
            return stats
        await _push_changes(connection, replica, changes, options, stats)
        extra = [_top_op(top)] if top is not None else []
        _count_ops(stats, "meta", await metadata.push(connection, tree, extra))
        finished = await _finish(connection)
        stats.in_step = finished["content"] == tree.content and finished["meta"] == tree.meta
        if top is not None and remote_top(finished, push=True) != top:
            stats.in_step = False
        if stats.in_step or stats.failed or finished["content"] == tree.content:
            break
        opened = finished  # a hash prefix matched by accident: compare in full
    stats.seconds = time.monotonic() - started
    return stats


async def _ops(connection: Connection, ops: list[list], stats: Stats) -> list[bool]:
    """Send ops in order (batches of MAX_ITEMS); True per op that succeeded."""
    ok: list[bool] = []
    for start in range(0, len(ops), MAX_ITEMS):
        batch = ops[start : start + MAX_ITEMS]
        conversation = connection.start("ops", ops=batch)
        message = await conversation.receive("oks")
        conversation.close()
        for op, result in zip(batch, message["results"], strict=False):
            if result is not None:
                stats.failed.append((os.fsdecode(op[1]), f"{result[0]}: {result[1]}"))
            ok.append(result is None)
    return ok


async def _push_changes(
    connection: Connection, replica: Replica, changes: Changes, options: Options, stats: Stats
) -> None:
    prelude = [["rm", to_wire(p), None, e] for p, e in changes.replace]
    prelude += [["mkdir", to_wire(p), mode, None] for p, mode in changes.mkdirs]
    results = await _ops(connection, prelude, stats)
    stats.dirs_created += sum(results[len(changes.replace):])
    progress = _Progress(options, changes)
    limiter = trio.CapacityLimiter(options.concurrency)

    async def send_file(path: str, expect: bytes | None) -> None:
        async with limiter:
            await _push_file(connection, replica, path, expect, stats)
        progress.file_done(path, changes.sizes.get(path, 0))

    async with trio.open_nursery() as nursery:
        for path, expect in changes.files:
            nursery.start_soon(send_file, path, expect)
        links = [["link", to_wire(p), target, e] for p, target, e in changes.links]
        stats.links += sum(await _ops(connection, links, stats))
    if options.delete and replica.errors:
        stats.warnings.append("some files could not be read: nothing was deleted")
    elif options.delete:
        removals = [["rm", to_wire(p), None, e] for p, e in changes.removals]
        stats.deleted += sum(await _ops(connection, removals, stats))


async def _push_file(
    connection: Connection, replica: Replica, path: str, expect: bytes | None, stats: Stats
) -> None:
    try:
        signature, st, f = await trio.to_thread.run_sync(replica.sign, path)
    except OSError as exc:
        stats.failed.append((path, exc.strerror or str(exc)))
        return
    except PathError as exc:  # a directory on the way became a symlink since the scan
        stats.failed.append((path, str(exc)))
        return
    with f:
        fd = f.fileno()

        def read(offset: int, length: int) -> bytes:
            return os.pread(fd, length, offset)

        try:
            fields = offer_fields(signature, st, read, older_version_likely=expect is not None)
        except Refusal as exc:
            stats.failed.append((path, str(exc)))
            return
        conversation = connection.start("offer", path=to_wire(path), expect=expect, **fields)
        try:
            if "data" in fields:
                done = await conversation.receive("done")
            else:
                done = await serve_wants(conversation, SourceFile(signature.tree, read))
        except Refusal as exc:  # the file changed under us, or the server refused
            stats.failed.append((path, str(exc)))
            if not isinstance(exc, RemoteError):
                conversation.send("error", code=exc.code, msg=str(exc))
            return
        finally:
            conversation.close()
    _count(stats, path, done)


def _count_ops(stats: Stats, what: str, results: list) -> None:
    for result in results:
        if result is not None:
            stats.failed.append((what, f"{result[0]}: {result[1]}"))


def _count(stats: Stats, path: str, done: dict[str, Any]) -> None:
    if not done["ok"]:
        stats.failed.append((path, f"{done['code']}: {done['msg']}"))
        return
    if done["how"] in ("copy", "whole", "delta"):
        stats.files_transferred += 1
    if done["how"] == "copy":
        stats.copied_files += 1
    stats.literal_bytes += done["literal"]
    stats.matched_bytes += done["matched"]


# ---------------------------------------------------------------- metadata


async def _finish(connection: Connection) -> dict[str, Any]:
    conversation = connection.start("finish")
    try:
        return await conversation.receive("finished")
    finally:
        conversation.close()


# ---------------------------------------------------------------- pull


async def pull(
    connection: Connection, replica: Replica, tree: Entry, opened: dict, options: Options
) -> Stats:
    """Bring the local directory (``replica``, scanned as ``tree``) to the content of the
    opened remote directory."""
    started = time.monotonic()
    stats = Stats()
    top = remote_top(opened, push=False)
    if tree.content == opened["content"] and tree.meta == opened["meta"]:
        stats.files_total = count_files(tree)
        if top is None or top == local_top(tree):
            stats.in_step = True
        elif options.dry_run:
            stats.changes = Changes(meta=top_differences(tree, top))
        else:
            stats.in_step = all(await _local_ops(replica, [_top_op(top, "")], stats))
        return stats
    for hb in (8, 32):
        changes = await Comparison(tree, push=False, hb=hb).run(connection, opened["content"])
        stats.changes = changes
        if options.dry_run:
            changes.meta = metadata.differences(*await metadata.walk(connection, tree))
            if top is not None:
                changes.meta += top_differences(tree, top)
            return stats
        try:
            await _pull_changes(connection, replica, changes, options, stats,
                                opened.get("unreadable", 0))
        finally:
            await trio.to_thread.run_sync(replica.sync_dirs)
        tree = await trio.to_thread.run_sync(replica.scan)
        _count_ops(stats, "meta", await metadata.pull(connection, replica, tree))
        if top is not None:
            await _local_ops(replica, [_top_op(top, "")], stats)  # last: writes above move it
        tree = await trio.to_thread.run_sync(replica.scan)
        stats.in_step = tree.content == opened["content"] and tree.meta == opened["meta"]
        if top is not None and local_top(tree) != top:
            stats.in_step = False
        if stats.in_step or stats.failed or tree.content == opened["content"]:
            break
    stats.files_total = count_files(tree)
    stats.seconds = time.monotonic() - started
    return stats


async def _local_ops(replica: Replica, ops: list, stats: Stats) -> list[bool]:
    results = await trio.to_thread.run_sync(apply_ops, replica, ops, replica.excludes, True)
    for op, result in zip(ops, results, strict=True):
        if result is not None:
            stats.failed.append((op[1], f"{result[0]}: {result[1]}"))
    return [r is None for r in results]


async def _pull_changes(
    connection: Connection, replica: Replica, changes: Changes, options: Options, stats: Stats,
    unreadable: int = 0,
) -> None:
    prelude = [("rm", p, None, e) for p, e in changes.replace]
    prelude += [("mkdir", p, mode, None) for p, mode in changes.mkdirs]
    results = await _local_ops(replica, prelude, stats)
    stats.dirs_created += sum(results[len(changes.replace):])
    progress = _Progress(options, changes)
    limiter = trio.CapacityLimiter(options.concurrency)

    async def get_file(path: str, expect: bytes | None) -> None:
        async with limiter:
            size = await _pull_file(connection, replica, path, expect, stats)
        progress.file_done(path, size)

    async with trio.open_nursery() as nursery:
        for path, expect in changes.files:
            nursery.start_soon(get_file, path, expect)
    links = [("link", p, target, e) for p, target, e in changes.links]
    stats.links += sum(await _local_ops(replica, links, stats))
    if options.delete and unreadable:
        stats.warnings.append(f"the server could not read {unreadable} entries: nothing was "
                              "deleted here")
    elif options.delete:
        removals = [("rm", p, None, e) for p, e in changes.removals]
        stats.deleted += sum(await _local_ops(replica, removals, stats))


async def _pull_file(
    connection: Connection, replica: Replica, path: str, expect: bytes | None, stats: Stats
) -> int:
    conversation = connection.start("get", path=to_wire(path), expect=expect)
    try:
        offer = await conversation.receive("offer")
        outcome = await receive_file(conversation, replica, path, offer, expect)
    except Refusal as exc:
        stats.failed.append((path, str(exc)))
        return 0
    finally:
        conversation.close()
    _count(stats, path, {"ok": True, "how": outcome.how, "literal": outcome.literal,
                         "matched": outcome.matched})
    return offer["size"]
