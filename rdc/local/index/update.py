"""Bring an index up to date with a directory, reading only what changed.

A file whose size, mtime and inode match its row is not read again, unless it was modified
so close to its last refresh that a later write could have kept all three ("racy", as in
git). A new path is always read, even where its inode, size and mtime are those of a path
that vanished: that is a rename, or another file on the inode the vanished one freed (ext4
hands a freed inode to the next file made in its directory), and a copy that keeps times
(`cp -a`, `rsync -a`, an unpacked archive) gives two files of one size the same mtime. Taken
for a rename, such a file kept the other's signature and was sent to a peer as that
content (a synced renamed tree, the bench: one file in 6,759). Signatures are computed on
worker threads (the chunker and BLAKE3 release the GIL) and written in batches, each its
own transaction: a refresh killed midway leaves a consistent index that the next refresh
completes.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sqlite3
import stat
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import BinaryIO, Protocol

from rdc import _native
from rdc.content.signature import (
    FileSignature,
    index_rows_of_files,
    signature_of_bytes,
    signature_of_file,
)
from rdc.local.filestat import FileStat, mtime_ns, stamp
from rdc.local.index.db import IndexDatabase, Row, Stamped, row_of, unusable
from rdc.local.paths import PathError, is_temporary
from rdc.records import record

RACY_NS = 2_000_000_000
# A refresh commits its rows every BATCH_FILES files or BATCH_SECONDS: each commit writes
# every page its rows dirtied to the WAL, and the root index takes rows in random order,
# so a page is written again at each commit that touches it (a cold scan of 100,000 files
# committing every 256 spent a sixth of its time in COMMIT: 8.5 s -> 7.3 s at 2,048,
# alternating runs; with schema 4's smaller index, 16,384 was no faster than 2,048). A
# killed refresh loses at most this much work; the next one completes it.
BATCH_SECONDS = 2.0
BATCH_FILES = 2048
INLINE_BYTES = 256 << 10  # files smaller than this are signed on the refreshing thread
BULK_FILES = 64  # small files read and signed in one native call
STAMPS_AT_ONCE = 4096  # rows read at once by `refresh_some`


@dataclass
class RefreshStats:
    files: int = 0
    signed: int = 0
    signed_bytes: int = 0
    deleted: int = 0
    unchanged: int = 0
    errors: list[tuple[str, str]] = field(default_factory=list)
    # With ``checksum``: files whose content differed from their row though their size,
    # mtime and inode did not (bit rot, or an edit that kept the time).
    mismatched: list[str] = field(default_factory=list)


@record
class Progress:
    """A refresh event: how much of the reading is done."""

    files_done: int
    files_total: int
    bytes_done: int
    bytes_total: int
    path: str


def walk_files(
    root: str, exclude: Callable[[str, bool], bool] | None = None
) -> Iterator[tuple[str, os.stat_result]]:
    """Regular files under ``root`` as (relative '/'-path, lstat), not following links.
    ``exclude(relpath, is_dir)`` prunes paths."""
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        try:
            entries = sorted(os.scandir(os.path.join(root, rel_dir)), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                if not (exclude and exclude(rel, True)):
                    stack.append(rel)
            elif stat.S_ISREG(st.st_mode) and not is_temporary(entry.name) and not (
                exclude and exclude(rel, False)
            ):
                yield rel, st


Opener = Callable[[str], BinaryIO]
# A small file read whole: (rel, limit) -> (fstat before, bytes, fstat after), or None if
# it has more than ``limit`` bytes (`rdc.local.fs.SafeRoot.read_whole`).
Reader = Callable[[str, int], tuple[os.stat_result, bytes, os.stat_result] | None]
Signed = tuple[os.stat_result, FileSignature, os.stat_result]


class Rooted(Protocol):
    """A tree entry whose root a refresh can put in place (`rdc.local.snapshot.Entry`)."""

    root: bytes


def _sign(opener: Opener, rel: str) -> Signed:
    with opener(rel) as f:
        before = os.fstat(f.fileno())
        signature = signature_of_file(f)
        after = os.fstat(f.fileno())
    return before, signature, after


def _sign_small(opener: Opener, reader: Reader | None, rel: str) -> Signed:
    """`_sign` for a file likely under INLINE_BYTES: read whole by ``reader`` if there is
    one (no file object: half the cost of a small file's signing), else streamed."""
    read = reader(rel, INLINE_BYTES) if reader is not None else None
    if read is None:
        return _sign(opener, rel)
    before, data, after = read
    return before, signature_of_bytes(data), after


def _same(a: os.stat_result, b: os.stat_result) -> bool:
    return stamp(a) == stamp(b)


def refresh(
    db: IndexDatabase,
    root: str,
    *,
    workers: int = 2,
    exclude: Callable[[str, bool], bool] | None = None,
    progress: Callable[[Progress], None] | None = None,
    files: Mapping[str, FileStat] | None = None,
    opener: Opener | None = None,
    checksum: bool = False,
    reader: Reader | None = None,
    beneath: int | None = None,
) -> RefreshStats:
    """Update ``db`` to describe the regular files under ``root``. ``files``: their lstat
    by relative path, if the caller walked the tree already; ``opener``: how to open one
    (default: by its full path), ``reader``: how to read a small one whole (default:
    opened), and ``beneath``: the root's descriptor, to read many small files natively,
    their directories opened below it (default: one file at a time); ``checksum``: read
    every file again, also those whose stamp matches its row."""
    def by_path(rel: str) -> BinaryIO:
        return open(os.path.join(root, rel), "rb")

    opener = opener or by_path
    try:
        return _refresh(db, root, workers, exclude, progress, files, opener, checksum, reader,
                        beneath)
    except sqlite3.DatabaseError as exc:
        if not unusable(exc):
            raise
        db.rebuild()
        return _refresh(db, root, workers, exclude, progress, files, opener, checksum, reader,
                        beneath)


def _refresh(db, root, workers, exclude, progress, files, opener, checksum=False, reader=None,
             beneath=None) -> RefreshStats:
    stats = RefreshStats()
    racy_from = time.time_ns() - RACY_NS  # a file modified since is racy
    # The index inside the tree (with its -wal and -shm files) is not indexed.
    inside = os.path.relpath(os.path.abspath(db.location), os.path.abspath(root))
    on_disk: dict[str, FileStat] = dict(files.items() if files is not None
                                        else walk_files(root, exclude))
    if not inside.startswith("../"):
        for rel in [rel for rel in on_disk if rel.startswith(inside)]:
            del on_disk[rel]
    stats.files = len(on_disk)

    # The rows stream past and only what differs is kept: a dict of every row was the
    # largest thing a scan of a large tree held (25 MB for 100,000 files).
    described = dict.fromkeys(on_disk, False)
    vanished: list[int] = []  # the ids of rows whose paths are gone
    rows: dict[str, Stamped] = {}  # with ``checksum``: every row, to compare roots after
    touched: list[tuple[int, FileStat]] = []
    for path, row in db.iter_stamps():
        st = on_disk.get(path)
        if st is None:
            vanished.append(row.id)
        elif checksum:
            rows[path] = row
        elif row.describes(st):
            described[path] = True
            if row.mode != st.st_mode:
                touched.append((row.id, st))
    with db.transaction():
        for file_id, st in touched:
            db.touch(file_id, st, False)
        # With ``checksum`` every file is read again, whatever its row says.
        changed = [rel for rel, same in described.items() if not same]
        stats.unchanged = len(on_disk) - len(changed)
        del described
        for file_id in vanished:
            db.delete(file_id)
            stats.deleted += 1
    old_roots = db.roots() if checksum else {}
    _sign_all(db, opener, reader, changed, on_disk, workers, racy_from, stats, progress,
              beneath)
    if checksum:
        for rel in changed:
            old, new = rows.get(rel), db.get(rel)
            if old and new and old.describes(on_disk[rel]) and old_roots.get(rel) != new.root:
                stats.mismatched.append(rel)
    return stats


def refresh_some(
    db: IndexDatabase, files: Mapping[str, FileStat], entries: Sequence[tuple[str, Rooted]],
    gone: list[str], opener: Opener, reader: Reader | None = None,
    beneath: int | None = None,
) -> RefreshStats:
    """Bring the rows of some paths up to date, for a caller that knows what else did not
    change (a rescan): ``files`` are on disk with these lstats, ``gone`` paths (and what
    was below them) are not; a new path is read (as in `refresh`). ``entries``: the paths of
    ``files`` with their tree entries, into which the root of each file found unchanged is
    put, read with its row (the caller then looks up only the roots of those read again:
    reading each row twice was a third of a rescan's index work)."""
    stats = RefreshStats(files=len(files))
    racy_from = time.time_ns() - RACY_NS

    with db.transaction():
        changed = _changed(db, files, entries, stats)
        for path in gone:
            db.delete_tree(path)
    _sign_all(db, opener, reader, changed, files, 1, racy_from, stats, None, beneath)
    return stats


def _racy(st: FileStat, racy_from: int) -> bool:
    """Whether a file of stat ``st`` was modified too recently for its stamp to be trusted
    next time: at ``racy_from`` (RACY_NS before the refresh started) or later. (The C of
    `index_rows_of_files` has the same rule.)"""
    return mtime_ns(st) >= racy_from


def _changed(db: IndexDatabase, files: Mapping[str, FileStat],
             entries: Sequence[tuple[str, Rooted]], stats: RefreshStats) -> list[str]:
    """The paths of ``entries`` whose rows no longer describe their files (to be read
    again); a row that does gets the file's current mode (inside the caller's transaction)
    and gives its root to the entry. The rows are read STAMPS_AT_ONCE paths at a time: all
    of a first copy's 100,000 at once were 40 MB, the server's peak."""
    changed = []
    for at in range(0, len(entries), STAMPS_AT_ONCE):
        some = entries[at : at + STAMPS_AT_ONCE]
        rows = db.stamps_and_roots_of([path for path, _ in some])
        for rel, entry in some:
            st, found = files[rel], rows.get(rel)
            if found is not None and found[0].describes(st):
                row, entry.root = found
                stats.unchanged += 1
                if row.mode != st.st_mode:
                    db.touch(row.id, st, False)
            else:
                changed.append(rel)
    return changed


def _sign_all(db, opener, reader, paths, on_disk, workers, racy_from, stats, progress,
              beneath=None) -> None:
    """Sign ``paths`` and store their rows (racy: written at ``racy_from`` or later, or
    changed while read)."""
    total_bytes = sum(on_disk[p].st_size for p in paths)
    done_bytes = 0
    pending: dict[Future, str] = {}
    # Small files are signed on this thread: their cost is mostly Python, and two threads
    # contending for the GIL cost more than they save (docs/formats.md section 7). Larger
    # ones go to the pool, where the chunker and BLAKE3 run without the GIL. With
    # ``beneath`` and native code, small files go to the pool too, BULK_FILES in one call
    # that reads and signs them all without the GIL (`_Bulk`).
    small = [p for p in reversed(paths) if on_disk[p].st_size < INLINE_BYTES]
    large = [p for p in reversed(paths) if on_disk[p].st_size >= INLINE_BYTES]
    bulk = _Bulk(small, beneath) if beneath is not None and _native.sign_files else None
    batch: list[Row] = []
    last_commit = time.monotonic()
    writer = _Writer(db)

    def flush() -> None:
        nonlocal last_commit
        if batch:
            writer.put(batch.copy())
            batch.clear()
        last_commit = time.monotonic()

    def signed(rel: str, outcome: Callable[[], tuple]) -> None:
        try:
            before, signature, after = outcome()
        except OSError as exc:
            stats.errors.append((rel, exc.strerror or str(exc)))
            return
        except PathError as exc:  # a directory on the way became a symlink meanwhile
            stats.errors.append((rel, exc.fields["reason"]))
            return
        unsure = _racy(before, racy_from) or not _same(before, after)
        recorded(rel, row_of(rel, before, signature, unsure))

    def recorded(rel: str, row: Row) -> None:
        recorded_many([rel], [row])

    def recorded_many(rels: list[str], rows: list[Row]) -> None:
        """Rows of ``rels`` (a bulk group's, or one file's) into the batch, with one
        progress event for them all (one a file was a tenth of a cold scan's refreshing
        thread on 100,000 files)."""
        nonlocal done_bytes
        batch.extend(rows)
        stats.signed += len(rows)
        stats.signed_bytes += sum(row[1] for row in rows)
        if progress and rels:
            done_bytes += sum(on_disk[rel].st_size for rel in rels)
            progress(Progress(stats.signed, len(paths), done_bytes, total_bytes, rels[-1]))

    def one_by_one(rel: str) -> None:
        signed(rel, functools.partial(_sign_small, opener, reader, rel))

    with writer, ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        try:
            while small or large or pending or (bulk and bulk.busy):
                while large and len(pending) < 2 * max(1, workers):
                    rel = large.pop()
                    pending[pool.submit(_sign, opener, rel)] = rel
                if bulk:
                    bulk.submit(pool, racy_from)
                    wait([*pending, *bulk.oldest()], return_when=FIRST_COMPLETED)
                    bulk.take(recorded_many, one_by_one)
                    finished = [future for future in pending if future.done()]
                elif small:
                    one_by_one(small.pop())
                    finished = [future for future in pending if future.done()]
                else:
                    finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    signed(pending.pop(future), future.result)
                if len(batch) >= BATCH_FILES or time.monotonic() - last_commit > BATCH_SECONDS:
                    flush()
        finally:
            if bulk:
                bulk.close()
        flush()


class _Writer:
    """The rows of a refresh stored on a thread of their own, one transaction of them at a
    time, while the refreshing thread goes on: inserting and committing was a third of its
    time on a cold scan of 100,000 files, and SQLite does it without the GIL. `put` waits
    for the transaction before (so at most two batches of rows are held) and raises its
    error; leaving the ``with`` waits for the last one (and raises its error, unless
    another is already on its way out)."""

    def __init__(self, db: IndexDatabase) -> None:
        self._db = db
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="index-writer")
        self._last: Future | None = None

    def put(self, rows: list[Row]) -> None:
        self._wait()
        self._last = self._thread.submit(self._store, rows)

    def _store(self, rows: list[Row]) -> None:
        with self._db.transaction():
            self._db.put_rows(rows)

    def _wait(self) -> None:
        last, self._last = self._last, None
        if last is not None:
            last.result()

    def __enter__(self) -> _Writer:
        return self

    def __exit__(self, kind: object, error: object, trace: object) -> None:
        try:
            if error is None:
                self._wait()  # (its error too: rows not stored are no finished refresh)
            else:
                with contextlib.suppress(Exception):
                    self._wait()
        finally:
            self._thread.shutdown()


class _Bulk:
    """Small files read and signed BULK_FILES at a time on a worker thread
    (`index_rows_of_files`), while this thread records the last group: a cold scan of a
    source tree spent two thirds of its time in Python around each file's read and
    signature. The native call opens each group's directories itself, below the root's
    descriptor (``beneath``), once per run of files in one: opened from Python, with the
    GIL given up and taken back around each, they were a fifth of this thread's time. A
    file the native call leaves (not a regular file of under INLINE_BYTES read cleanly, a
    directory that did not open) is read again the one-file way, which says why."""

    def __init__(self, small: list[str], beneath: int) -> None:
        self._small = small  # (popped from the end)
        self._beneath = beneath
        self._groups: deque[tuple[Future, list[str]]] = deque()

    @property
    def busy(self) -> bool:
        return bool(self._small or self._groups)

    def submit(self, pool: ThreadPoolExecutor, racy_from: int) -> None:
        """Start groups until two are in flight (one signed while the other is recorded);
        their rows are racy from ``racy_from`` (`index_rows_of_files`)."""
        while self._small and len(self._groups) < 2:
            group = [self._small.pop() for _ in range(min(BULK_FILES, len(self._small)))]
            files = [(self._beneath, os.fsencode(rel)) for rel in group]
            future = pool.submit(index_rows_of_files, files, INLINE_BYTES, racy_from,
                                 beneath=True)
            self._groups.append((future, group))

    def oldest(self) -> list[Future]:
        """The future of the group to be recorded next, if any (groups are taken in order)."""
        return [self._groups[0][0]] if self._groups else []

    def take(self, recorded: Callable[[list[str], list[Row]], None],
             one_by_one: Callable[[str], None]) -> None:
        """Record the rows of the groups done, oldest first; the files the native call
        left go the one-file way."""
        while self._groups and self._groups[0][0].done():
            future, group = self._groups.popleft()
            rows = future.result()
            if None not in rows:
                recorded(group, rows)
                continue
            rels, kept, left = [], [], []
            for rel, row in zip(group, rows, strict=True):
                if row is None:
                    left.append(rel)
                else:
                    rels.append(rel)
                    kept.append(row)
            recorded(rels, kept)
            for rel in left:
                one_by_one(rel)

    def close(self) -> None:
        """Wait for the groups in flight (on an error: they use the root's descriptor)."""
        while self._groups:
            future, _ = self._groups.popleft()
            wait([future])

