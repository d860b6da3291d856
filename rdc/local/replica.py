"""One synced directory on this machine: its files (through `rdc.local.fs.SafeRoot`, so no
operation escapes it), its signature index, and the tree that both sides compare.

Methods are blocking; the transfer code calls them on worker threads. The index connection
is shared by those threads under a lock.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO, Generic, TypeVar

from rdc._native import stamp_tree
from rdc.content.check import matches
from rdc.content.signature import (
    FileSignature,
    signature_of_bytes,
    signature_of_file,
    signatures_and_contents_of_files,
    tree_of_bytes,
)
from rdc.content.tree import Tree, TreeFormatError, unpack_tree
from rdc.local import sealed
from rdc.local.commits import Gathered, GroupCommit
from rdc.local.filestat import FileStat, Seen, Stamp, mtime_ns, stamp
from rdc.local.fs import (
    SYNCFS_FROM,
    ConflictError,
    Expect,
    HeldDirs,
    SafeRoot,
    TempFile,
    install_all,
    sync_filesystem,
)
from rdc.local.ignore import Excludes
from rdc.local.index import (
    IndexDatabase,
    IndexedFile,
    Progress,
    Reader,
    RefreshStats,
    Row,
    refresh,
    refresh_some,
    row_of,
)
from rdc.local.marker import MARKER
from rdc.local.paths import TEMP_PREFIX, PathError, check_relpath, parent
from rdc.local.rescan import Made, Patch, Unsure, patch
from rdc.local.snapshot import (
    MAX_DEPTH,
    Entry,
    Walk,
    all_rooted,
    clear_roots,
    drop_rootless,
    fingerprint,
    fingerprint_of,
    iter_files,
    lookup,
    seal,
    set_roots,
    walk,
)
from rdc.local.stamproots import restamp, stamp_root, stamped, still_unsure

RACY_NS = 2_000_000_000
HOLDERS = 4  # local copies of a content tried before it is asked of the source
ROOTS_AT_ONCE = 4096  # index rows whose roots a rescan reads at once
RootHashes = tuple[bytes, bytes, bytes]  # content, meta, sync meta of the root
# What `Replica.sign_small` gives: the signature, the stat before the read, the content (if
# small enough) and whether the content is not what the file's index row says.
Signed = tuple[FileSignature, FileStat, bytes | None, bool]
Retimed = tuple[str, FileStat, FileStat]  # path, lstat before and after
# A move or removal for the index: path, where it moved ("": removed), the id of the row
# it keeps there, and its stat.
Changed = tuple[str, str, int | None, os.stat_result | None]
_T = TypeVar("_T")


class _Later(Generic[_T]):
    """Index writes that a thread keeps, inside `together`, to store at its end in one
    transaction (``store``: what stores a list of them)."""

    def __init__(self, store: Callable[[list[_T]], None]) -> None:
        self.store = store
        self._kept = threading.local()

    @contextlib.contextmanager
    def together(self) -> Iterator[None]:
        self._kept.items = []
        try:
            yield
        finally:
            items, self._kept.items = self._kept.items, None
            self.store(items)

    def now(self) -> None:
        """Store now what this thread kept so far."""
        items = getattr(self._kept, "items", None)
        if items:
            self.store(items)
            items.clear()

    def add(self, item: _T) -> None:
        """Keep ``item`` for the end if this thread is inside `together`, else store it."""
        items = getattr(self._kept, "items", None)
        if items is not None:
            items.append(item)
        else:
            self.store([item])


class Replica:
    """A directory tree with its index. ``tree`` is the last `scan`."""

    def __init__(
        self,
        root: str | SafeRoot,
        index_location: str | os.PathLike[str],
        excludes: Excludes | None = None,
    ) -> None:
        """``root``: a directory path (the user's choice, symlinks there followed), or a
        `SafeRoot` already reached safely, which the replica then owns. Either way the
        directory is held by its descriptor: no path string is resolved again."""
        self.fs = root if isinstance(root, SafeRoot) else SafeRoot(os.path.realpath(root))
        self.root = self.fs.path  # for messages and the index's own location check
        try:
            self.db = IndexDatabase(Path(index_location))
        except BaseException:
            self.fs.close()
            raise
        self.excludes = excludes or Excludes()
        self.lock = threading.Lock()
        self.tree: Entry | None = None
        # The tree kept in the index that the last scan started from, before its changes
        # were patched in or, where much had changed, before the full scan it gave way to
        # (a push compares against it where the target still holds it:
        # `rdc.transfer.compare.known_listings`); None when none was kept.
        self.base: Entry | None = None
        self.errors: list[tuple[str, str]] = []  # what the last scan could not read
        self.temporaries: list[str] = []  # rdc temporaries the last scan saw
        self._unsynced: set[str] = set()  # directories renamed into, not yet fsynced
        # (its own lock: an install waited on `lock` while a batch's index commit ran a
        # checkpoint, 2.6 s of a first copy's 100,000 installs)
        self._unsynced_lock = threading.Lock()
        self._salt: bytes | None = None  # the exclude patterns ``tree`` was made with
        self._fingerprint: bytes | None = None  # of ``tree`` as sealed, if it had no errors
        self.fs.changed = set()  # what `rescan` lists again
        self.fs.replaced = set()
        self._commits = GroupCommit(self)
        self._rows: Gathered[list[Row], None] = Gathered(self._put_rows)  # (`_store`)
        self._records = _Later(self._store)  # for the end of `recording_together`
        self._changes = _Later(self._store_changes)  # for the end of `changing_together`
        self._kept: bytes | None = None  # the fingerprint of the tree kept in the index
        self._held_before: int | None = None  # the largest file id at `warm`
        # Directories whose time batches in flight keep (`keep_dir_times`): the time
        # before the first of them wrote there, and how many are writing.
        self._dir_times: dict[str, list[int]] = {}
        self._dir_times_lock = threading.Lock()

    def close(self) -> None:
        try:
            self._keep_sealed()
        finally:
            self.db.close()
            self.fs.close()

    def _keep_sealed(self) -> None:
        """Keep the tree sealed last in the index, for the next process's scan to start
        from (rdc.local.sealed): once, at the end, not at every rescan of a session. Only a
        tree whose hashes the index still holds for its fingerprint (no racy file, no
        later seal by another process). The index is a cache: a failure here loses
        nothing but the head start."""
        sealed_for, tree = self._fingerprint, self.tree
        if sealed_for is None or tree is None or self._kept == sealed_for:
            return
        with contextlib.suppress(sqlite3.Error, OSError):
            with self.lock:
                if self.db.cached_hashes(sealed_for) != (tree.content, tree.meta, tree.smeta):
                    return
            fingerprint(tree, self._salt or b"")  # (every directory's stamp, for the next
            packed = sealed.pack(tree)            # scan to compare)
            with self.lock, self.db.transaction():
                self.db.keep_tree(sealed_for, self._salt or b"", packed)
            self._kept = sealed_for

    # ------------------------------------------------------------ the tree

    def walk(self, excludes: Excludes | None = None) -> Walk:
        excludes = excludes or self.excludes
        return walk(self.fs.fileno(), excludes, _salt(excludes))

    def quick(self, excludes: Excludes | None = None) -> tuple[RootHashes | None, Walk]:
        """One walk, and the root hashes it implies if the tree is exactly as stat saw it
        when it was last sealed: a sync with nothing changed needs no more than this. The
        walk can be handed to `scan` when more is needed."""
        excludes = excludes or self.excludes
        stamped = self._stamped(excludes)
        if stamped is not None:
            return stamped
        walked = self.walk(excludes)
        self.temporaries = walked.temporaries
        cached = None
        if not walked.errors:
            with self.lock:
                cached = self.db.cached_hashes(walked.fingerprint)
        return cached, walked

    def _stamped(self, excludes: Excludes) -> tuple[RootHashes | None, Walk] | None:
        """`quick` without building the tree, from its stamp walked in C: when the stamp
        shows it exactly as last sealed, the sealed hashes and a deferred walk (4 times
        faster on 100,000 files; a sync with nothing to do needs no more); when the index
        keeps a sealed tree to start from, no hashes and a deferred walk with each
        directory's stamp (`scan` lists again only the directories that changed). None
        where the Python walk must decide: patterns to apply, anything `stamp_tree` is
        unsure of, or no sealed tree to start from."""
        if excludes.patterns:
            return None
        salt = _salt(excludes)
        with self.lock:  # a cold index has nothing a stamp could match: walk once, not twice
            if not self.db.holds_hashes() and not self._kept_any(salt):
                return None
        fd = self.fs.fileno()
        top = os.fstat(fd)
        seen = stamp_tree(fd, MAX_DEPTH, TEMP_PREFIX.encode(), MARKER.encode())
        if seen is None:
            return None
        stamped, files, dirs = seen
        mode, mtime = stat.S_IMODE(top.st_mode), mtime_ns(top)
        found = fingerprint_of(mode, mtime, top.st_ino, stamped, salt)
        with self.lock:
            cached = self.db.cached_hashes(found)
            if cached is None and not self._kept_any(salt):
                return None
        self.temporaries = []
        return cached, Walk.deferred(found, (mode, mtime), files, lambda: self.walk(excludes),
                                     dirs)

    def scan(
        self,
        excludes: Excludes | None = None,
        progress: Callable[[Progress], None] | None = None,
        walked: Walk | None = None,
        checksum: bool = False,
    ) -> Entry:
        """Walk the directory (unless ``walked`` is given), bring the index up to date
        (reading only changed files; every file with ``checksum``), and return the sealed
        tree (``excludes`` default to the replica's own). What could not be read is left
        out of the tree and listed in ``errors``."""
        excludes = excludes or self.excludes
        self.base = None
        self.fs.take_changes()  # the walk sees them all
        self.fs.take_replaced()
        self.fs.take_retimed()
        self.fs.take_made()
        walked = walked or self.walk(excludes)
        if (self.tree is not None and not walked.errors and not checksum
                and walked.fingerprint == self._fingerprint):
            # Exactly as last sealed (a daemon's next session after its own writes): the
            # index needs no refresh, the tree no new hashes.
            self.temporaries = walked.temporaries
            return self.tree
        if not checksum and not walked.errors:
            kept = self._from_kept(walked, excludes)
            if kept is not None:
                return kept
        tree, errors = walked.tree, list(walked.errors)
        with self.lock:  # (the roots streamed into the tree: a dict was 16 MB for 100,000)
            sealed = None if checksum or walked.errors else self.db.cached_hashes(
                walked.fingerprint)
            if sealed is not None:
                set_roots(tree, self.db.iter_roots())
            if sealed is not None and all_rooted(tree):
                # Exactly the walk last sealed, with no racy file (a new process, or a
                # daemon's replica opened again): every row still describes its file.
                self.stats = RefreshStats(files=len(walked.files),
                                          unchanged=len(walked.files))
            else:
                if sealed is not None:
                    clear_roots(tree)
                sealed = None
                with self._reader() as reader:
                    self.stats = refresh(self.db, self.root, exclude=excludes,
                                         progress=progress, files=walked.files,
                                         opener=self.fs.open_read, checksum=checksum,
                                         reader=reader, beneath=self.fs.fileno())
                set_roots(tree, self.db.iter_roots())
        reasons = dict(self.stats.errors)
        for path in drop_rootless(tree):
            errors.append((path, reasons.get(path, "changed or vanished while scanned")))
        seal(tree)
        if sealed is not None and (tree.content, tree.meta, tree.smeta) != sealed:
            with self.lock:  # cannot be, but if it were: forget the hashes, check in full
                self.db.cache_hashes(None, ())
            return self.scan(excludes, progress, None, checksum)
        self.tree = tree
        self.errors = errors
        self.temporaries = walked.temporaries
        self._salt = _salt(excludes)
        self._fingerprint = self._sealed(walked.fingerprint if not errors else None, tree)
        return tree

    def _from_kept(self, walked: Walk, excludes: Excludes) -> Entry | None:
        """The tree, from the one sealed last and kept in the index (rdc.local.sealed): as
        it is when the walk's fingerprint is the one it was sealed for; else, given the
        stamps of the walk's directories, with those whose stamps differ listed again
        (`rdc.local.rescan.patch`) and their files' rows brought up to date. None when
        there is none to start from, when much changed, or when anything does not add up
        (the caller scans in full)."""
        salt = _salt(excludes)
        kept = self._kept_for(walked, salt)
        if kept is None:
            return None
        kept_for, old = kept
        if kept_for == walked.fingerprint:
            with self.lock:
                hashes = self.db.cached_hashes(kept_for)
            if hashes != (old.content, old.meta, old.smeta):
                return None
            tree, self._kept = old, kept_for
            self.stats = RefreshStats(files=walked.file_count, unchanged=walked.file_count)
        else:
            assert walked.dirs is not None
            patched = self._patched(old, walked.dirs, walked.file_count, excludes)
            if patched is None or fingerprint(patched, salt) != walked.fingerprint:
                # A full scan, as much changed (or changed while it was listed); what the
                # target held after the last push is still ``old``. (The bench's renamed
                # tree, 1,352 of Django's files renamed or moved, changed more than half
                # of its 3,222 directories' stamps; asking the server for their listings
                # was 71 of the push's 176 KB.)
                self.base = old
                return None
            tree = patched
        self.tree, self.errors, self.temporaries, self._salt = tree, [], [], salt
        self.base = old
        self._fingerprint = (walked.fingerprint if tree is old
                             else self._sealed(walked.fingerprint, tree))
        return tree

    def _kept_for(self, walked: Walk, salt: bytes, stamps: bool = False
                  ) -> tuple[bytes, Entry] | None:
        """The tree the index keeps (of content roots, or of ``stamps`` roots) and the
        fingerprint it was kept for, if one is and ``walked`` can start from it: sealed for
        that walk, or a stamp walk that knows each directory's stamp. A damaged one goes."""
        with self.lock:
            kept = self.db.kept_tree(salt, stamps)
        if kept is None or (kept[0] != walked.fingerprint and walked.dirs is None):
            return None
        try:
            return kept[0], sealed.unpack(kept[1])
        except sealed.Damaged:
            with self.lock:
                self.db.forget_tree(stamps)
            return None

    def _kept_any(self, salt: bytes) -> bool:
        """Whether the index keeps a tree to start a walk from, of content roots or of
        stamp roots (the caller holds the lock)."""
        return (self.db.kept_fingerprint(salt) is not None
                or self.db.kept_fingerprint(salt, stamps=True) is not None)

    def _patched(self, old: Entry, dirs: dict[str, bytes], file_count: int,
                 excludes: Excludes) -> Entry | None:
        """``old`` with the directories whose stamps are not those in ``dirs`` listed
        again, their files' rows brought up to date and the tree sealed; None if more than
        half the directories changed (a full scan costs less) or anything is unsure."""
        found = self._relisted(old, dirs, excludes)
        if found is None:
            return None
        refreshed = self._filled(found)
        if refreshed is None:
            return None
        self.stats = RefreshStats(
            files=file_count, signed=refreshed.signed, signed_bytes=refreshed.signed_bytes,
            unchanged=file_count - refreshed.signed)
        return found.tree

    def _relisted(self, old: Entry, dirs: dict[str, bytes], excludes: Excludes
                  ) -> Patch | None:
        """``old`` with the directories whose stamps are not those in ``dirs`` listed again
        (a file listed with the stat it had keeps its entry, root and all), the roots of
        the others still to give; None if more than half the directories changed or a
        listing is unsure."""
        touched = _touched(old, dirs)
        if touched is None:
            return None
        try:
            return patch(self.fs, old, touched, excludes, reuse=True)
        except (Unsure, OSError, PathError):
            return None

    @contextlib.contextmanager
    def _reader(self) -> Iterator[Reader]:
        """How an index refresh reads small files whole (on one thread): each directory
        opened once for all of its files."""
        with HeldDirs(self.fs) as held:
            yield functools.partial(self.fs.read_whole, held=held)

    def _filled(self, found: Patch) -> RefreshStats | None:
        """A patched tree's listed files brought up to date in the index (`refresh_some`),
        their roots put in place and the tree sealed; None if a file could not be read or
        has no row after (the caller scans in full)."""
        with self.lock, self._reader() as reader:
            refreshed = refresh_some(self.db, found.files, found.entries, found.gone,
                                     self.fs.open_read, reader=reader,
                                     beneath=self.fs.fileno())
            rooted = self._rooted([item for item in found.entries if not item[1].root])
        if refreshed.errors or not rooted:
            return None
        seal(found.tree)
        return refreshed

    def _rooted(self, entries: Sequence[tuple[str, Entry]]) -> bool:
        """Give each listed file's entry its root from the index, ROOTS_AT_ONCE at a time;
        False if one has no row. (All at once, the roots of a first copy's 100,000 files,
        their paths encoded and decoded again, were 27 MB of the server's 149 MB peak.)"""
        for at in range(0, len(entries), ROOTS_AT_ONCE):
            some = entries[at : at + ROOTS_AT_ONCE]
            roots = self.db.roots_of([path for path, _ in some])
            if len(roots) != len(some):
                return False
            for path, entry in some:
                entry.root = roots[path]
        return True

    def rescan(self, excludes: Excludes | None = None) -> Entry:
        """The tree after this replica's own writes since the last `scan` or `rescan`,
        listing again only the directories they touched and patching in the modes and
        times it set (`rdc.local.rescan`); a full scan
        when there is no sealed tree to start from, the last one had errors or other
        excludes, or a directory cannot be listed now."""
        excludes = excludes or self.excludes
        salt = _salt(excludes)
        self.base = None  # (what this side held before its own writes: no longer)
        touched = self.fs.take_changes()
        replaced = self.fs.take_replaced()
        retimed = self.fs.take_retimed()
        made = Made(*self.fs.take_made())
        old = self.tree
        if old is None or self.errors or salt != self._salt:
            return self.scan(excludes)
        if not touched and not retimed and not made.grown and not made.dirs:
            return old
        try:
            found = patch(self.fs, old, touched, excludes, replaced, retimed,
                          reuse=self._fingerprint is not None, made=made)
        except (Unsure, OSError, PathError):
            return self.scan(excludes)
        if self._filled(found) is None:
            return self.scan(excludes)
        tree = found.tree
        self.tree = tree
        self._fingerprint = self._sealed(fingerprint(tree, salt), tree)
        return tree

    def _sealed(self, fingerprint: bytes | None, tree: Entry) -> bytes | None:
        """Cache ``tree``'s hashes for a walk with ``fingerprint``; the fingerprint if the
        index took it (not when a file was racy: the next scan must read it again)."""
        with self.lock:
            self.db.cache_hashes(fingerprint, (tree.content, tree.meta, tree.smeta))
            taken = fingerprint is not None and self.db.cached_hashes(fingerprint) is not None
        return fingerprint if taken else None

    def current_root(self, path: str, read: bool = False) -> bytes | None:
        """The root of the file at ``path`` if the index knows it for sure (the file is
        unchanged since it was indexed), else None; with ``read``, a file whose row is
        missing or of another stamp is read (and indexed) first."""
        st = self.fs.lstat(path)
        if st is None:
            return None
        with self.lock:
            row = self.db.get(path)
        if read:
            row = self.row_as_it_is(path, st, row)
        return row.root if row is not None and row.describes(st) else None

    # ------------------------------------------------------------ stamp roots

    def is_cold(self, excludes: Excludes | None = None) -> bool:
        """Whether the index knows nothing a walk could match (no sealed tree kept, no
        root hashes cached): a scan would read every file."""
        salt = _salt(excludes or self.excludes)
        with self.lock:
            return not self.db.holds_hashes() and self.db.kept_fingerprint(salt) is None

    def stamped(self, tree: Entry, limit: int, in_place: bool = False) -> Entry:
        """A copy of ``tree`` with stamp roots (`rdc.local.stamproots`: the true roots of
        files modified at ``limit`` or later), sealed; ``in_place``: ``tree`` itself, a
        walk's that is not used otherwise."""
        with self.lock:
            unsure = self.db.unsure()
        return stamped(tree, self.index_paths, limit, unsure, in_place)

    def kept_stamps(self, walked: Walk, limit: int, excludes: Excludes | None = None
                    ) -> Entry | None:
        """The tree of stamp roots kept after this side's last sync by them (`keep_stamps`),
        brought to what ``walked`` (a stamp walk's) saw: as it is where its fingerprint is
        the one it was kept for; else with the directories whose stamps differ listed again
        and their files given stamp roots, nothing read but racy files (a cold side's walk
        of 100,000 files, stamped, was 0.8 s of Python). None where there is none, much
        changed, a file it holds is now unsure, or anything does not add up: the caller
        stamps the walk's tree. (``excludes``: the walk's, by default the replica's.)"""
        excludes = excludes or self.excludes
        salt = _salt(excludes)
        kept = self._kept_for(walked, salt, stamps=True)
        if kept is None:
            return None
        kept_for, old = kept
        with self.lock:
            unsure = self.db.unsure()
        if any(entry is not None and entry.kind == "f" and still_unsure(unsure, path, entry)
               for path in unsure for entry in [lookup(old, path)]):
            return None  # (its root must now be its true root)
        if kept_for == walked.fingerprint:
            return old
        assert walked.dirs is not None
        found = self._relisted(old, walked.dirs, excludes)
        if found is None:
            return None
        self._stamp_listed(found, limit, unsure)
        if fingerprint(found.tree, salt) != walked.fingerprint:
            return None  # (changed while it was listed)
        return found.tree

    def keep_stamps(self, tree: Entry, limit: int, excludes: Excludes | None = None) -> None:
        """Keep ``tree``, this side's tree of stamp roots as a sync by them left it (with
        all of this side's files: nothing unreadable left out), for the next one to start
        from (`kept_stamps`): only one whose every root is a stamp
        root (no file modified at ``limit`` or later, none unsure: their true roots are
        not what stat alone would give them later); else the one kept goes. Only a cold
        index keeps one (a warm one compares content roots). The index is a cache: a
        failure here loses nothing but the head start."""
        excludes = excludes or self.excludes
        salt = _salt(excludes)
        with contextlib.suppress(sqlite3.Error, OSError):
            if not self.is_cold(excludes):
                return
            with self.lock:
                unsure = self.db.unsure()
                kept = self.db.kept_fingerprint(salt, stamps=True)
            clean = not any(
                entry.mtime_ns >= limit or still_unsure(unsure, path, entry)
                for _, _, entry, path in iter_files(tree))
            found = fingerprint(tree, salt) if clean else None
            if found is not None and found == kept:
                return
            packed = sealed.pack(tree) if found is not None else b""
            with self.lock, self.db.transaction():
                if found is None:
                    self.db.forget_tree(stamps=True)
                else:
                    self.db.keep_tree(found, salt, packed, stamps=True)

    def restamp(self, old: Entry, limit: int, excludes: Excludes | None = None) -> Entry:
        """`rescan` for a tree of stamp roots: ``old`` after this replica's writes since
        it was made, the files listed again given stamp roots, nothing read but racy
        files. The replica's own tree no longer describes the disk: it is dropped (the
        next `rescan` scans). Raises `Unsure`, OSError or PathError where a directory
        cannot be listed (the caller walks again)."""
        excludes = excludes or self.excludes
        touched = self.fs.take_changes()
        replaced = self.fs.take_replaced()
        retimed = self.fs.take_retimed()
        made = Made(*self.fs.take_made())
        self.tree = self.base = None
        self._fingerprint = None
        # A file whose time rdc set keeps no root: its directory is listed again.
        touched |= {parent(path) for path, st in retimed.items() if not stat.S_ISDIR(st.st_mode)}
        retimed = {path: st for path, st in retimed.items() if stat.S_ISDIR(st.st_mode)}
        if not touched and not retimed and not made.grown and not made.dirs:
            return old
        found = patch(self.fs, old, touched, excludes, replaced, retimed, made=made)
        with self.lock:
            unsure = self.db.unsure()
        self._stamp_listed(found, limit, unsure)
        return found.tree

    def _stamp_listed(self, found: Patch, limit: int, unsure: dict[str, Stamp]) -> None:
        """Give the files a patch listed again their stamp roots (racy and unsure ones
        their true roots) and seal its tree."""
        restamp([(entry, path) for path, entry in found.entries], self.index_paths, limit,
                unsure)
        seal(found.tree)

    def index_paths(self, paths: Sequence[str]) -> dict[str, bytes]:
        """The true roots of those of ``paths`` that are regular files: from the index
        where it vouches for them, else read now (and indexed). A side synced by stamp
        roots reads a file only when the sync needs what it holds."""
        files: dict[str, os.stat_result] = {}
        for path in paths:
            try:
                st = self.fs.lstat(path)
            except (OSError, PathError):
                continue
            if st is not None and stat.S_ISREG(st.st_mode):
                files[path] = st
        if not files:
            return {}
        entries = [(path, Entry("f", 0, 0)) for path in files]
        with self.lock, self._reader() as reader:
            refresh_some(self.db, files, entries, [], self.fs.open_read, reader=reader,
                         beneath=self.fs.fileno())
            read = self.db.roots_of([path for path, entry in entries if not entry.root])
        out = {path: entry.root for path, entry in entries if entry.root}
        out.update(read)
        return out

    def row_as_it_is(self, path: str, st: os.stat_result, row: IndexedFile | None
                     ) -> IndexedFile | None:
        """``row`` (the index row of the file at ``path``, of lstat ``st``), or, where it
        is missing or of another stamp, the row made by reading the file now
        (`index_paths`): a side synced by stamp roots reads a file when a transfer needs
        what it holds."""
        if not stat.S_ISREG(st.st_mode) or (row is not None and row.stamp == stamp(st)):
            return row
        self.index_paths([path])
        with self.lock:
            return self.db.get(path)

    # ------------------------------------------------------------ reading (source side)

    def sign(self, path: str) -> tuple[FileSignature, os.stat_result, BinaryIO]:
        """The signature of the file at ``path`` and the file, opened: the stored signature
        if the file is unchanged since it was indexed, else read now (and stored)."""
        f = self.fs.open_read(path)
        try:
            st = os.fstat(f.fileno())
            with self.lock:
                row = self.db.get(path)
            stored = self._stored(row, st)
            if stored is not None:
                return stored, st, f
            signature = signature_of_file(f)
            f.seek(0)
            self._signed(path, st, signature, os.fstat(f.fileno()))
            return signature, st, f
        except BaseException:
            f.close()
            raise

    def sign_small(self, path: str, row: IndexedFile | None, limit: int,
                   held: HeldDirs | None = None
                   ) -> Signed:
        """`sign` for a file that is likely small, given its index row (None: it has
        none): its signature, stat, content if it has at most ``limit`` bytes, and whether
        it is suspect: its row describes it (size, time, inode) but the bytes read are not
        the content the row says (bit rot, or a change that kept the stamp; the caller
        reads it again with `rdc.local.verify.recheck`). A file read whole is signed from
        the bytes read, whatever its row says: one native call costs less than reading and
        checking its stored tree, and they are what the signature describes, whatever
        happens to the file meanwhile. ``held``: the caller's directory descriptors
        (`rdc.local.fs.HeldDirs`)."""
        read = self.fs.read_whole(path, limit, held)
        if read is not None:
            st, data, after = read
            if row is not None and row.describes(st):  # (its sketch is the row's)
                signature = FileSignature(tree_of_bytes(data), row.sketch)
                return signature, st, data, signature.root != row.root
            signature = signature_of_bytes(data)
            self._signed(path, st, signature, after)
            return signature, st, data, False
        with self.fs.open_read(path) as f:  # more than ``limit`` bytes
            st = os.fstat(f.fileno())
            stored = self._stored(row, st)
            if stored is not None:
                # A file its row says has at most ``limit`` bytes is checked against it.
                small = stored.size <= limit
                data = f.read(limit + 1) if small else None
                if data is not None and len(data) > limit:
                    data = None
                return stored, st, data, small and (data is None or not matches(stored.tree,
                                                                                 data))
            data = f.read(limit + 1)
            if len(data) <= limit:
                signature = signature_of_bytes(data)
            else:
                f.seek(0)
                signature, data = signature_of_file(f), None
            self._signed(path, st, signature, os.fstat(f.fileno()))
            return signature, st, data, False

    def sign_small_many(self, paths: Sequence[str], rows: dict[str, IndexedFile], limit: int
                        ) -> list[Signed | None]:
        """`sign_small` of each of ``paths`` (``rows``: their index rows) that is a regular
        file of at most ``limit`` bytes read cleanly, their reads and signatures in one
        native call without the GIL, which opens their directories below the root itself;
        None in the place of any other (and of all without native code): `sign_small` then
        reads it alone, and says why."""
        out: list[Signed | None] = [None] * len(paths)
        root = self.fs.fileno()
        at, items = [], []
        for k, path in enumerate(paths):
            try:  # (a peer's path: one refused goes alone, and `sign_small` says why)
                items.append((root, os.fsencode(check_relpath(path))))
            except PathError:
                continue
            at.append(k)
        done = signatures_and_contents_of_files(items, limit, beneath=True)
        if done is None:  # no native code
            return out
        for k, one in zip(at, done, strict=True):
            if one is not None:
                out[k] = self._signed_read(paths[k], rows.get(paths[k]), *one)
        return out

    def _signed_read(self, path: str, row: IndexedFile | None, before: tuple,
                     signature: FileSignature, after: tuple, data: bytes) -> Signed:
        """What `sign_small` makes of a file it read whole, given what the read gave."""
        st = Seen(*before)
        if row is not None and row.describes(st):  # (its sketch is the row's)
            signature = FileSignature(signature.tree, row.sketch)
            return signature, st, data, signature.root != row.root
        self._signed(path, st, signature, Seen(*after))
        return signature, st, data, False

    def _stored(self, row: IndexedFile | None, st: os.stat_result) -> FileSignature | None:
        """The stored signature of the file ``row`` indexed, if it is still that file (and
        the row still in the index: another thread may have replaced it since it was read,
        and a new row can take a deleted row's id, so the tree must have the row's root)."""
        if row is None or not row.describes(st):
            return None
        with self.lock:
            try:
                tree = self.db.tree(row.id)
            except TreeFormatError:
                return None
        return FileSignature(tree, row.sketch) if tree.root == row.root else None

    def _signed(self, path: str, st: os.stat_result, signature: FileSignature,
                after: os.stat_result) -> None:
        """Store a signature just made from the file at ``path`` (``st`` before the read,
        ``after`` it), or keep it for the end of `recording_together`."""
        # (stable while read: racy only if modified too recently, as `_store` decides)
        self._records.add((path, st, signature, True if _changed(st, after) else None))

    def expect_version(self, path: str, prefix: bytes,
                       row: IndexedFile | bool | None = True,
                       held: HeldDirs | None = None) -> Expect:
        """A check, for a later commit or removal, that the file at ``path`` is still the
        version whose root starts with ``prefix`` (as a listing showed it): ConflictError
        now if it is not, else an expectation of its current stat. ``row``: the path's
        index row if the caller has it (a batch looks them up at once), or None.
        ``held``: the caller's directory descriptors (`rdc.local.fs.HeldDirs`)."""
        st = self.fs.lstat(path, held)
        if st is None:
            raise ConflictError(path=path, expected="a file", found="nothing")
        if prefix and stat.S_ISREG(st.st_mode) and stamp_root(
                st.st_size, mtime_ns(st)).startswith(prefix):
            return Expect.from_stat(st)  # listed by its stamp root: as listed, unread
        if row is True:
            with self.lock:
                row = self.db.get(path)
        assert not isinstance(row, bool)
        if row is not None and stat.S_ISREG(st.st_mode) and row.describes(st):
            root = row.root  # the index vouches for it: the file need not be opened
        else:
            try:
                signature, st, f = self.sign(path)
            except FileNotFoundError:
                raise ConflictError(path=path, expected="a file", found="nothing") from None
            f.close()
            root = signature.root
        if not root.startswith(prefix):
            raise ConflictError(path=path, expected="the version listed", found="another")
        return Expect.from_stat(st)

    # ------------------------------------------------------------ seeds (target side)

    def holders(self, root: bytes, limit: int = HOLDERS) -> list[str]:
        """Paths whose indexed content has this root (a few: the first that still has it
        is copied, and one nearly always does)."""
        with self.lock:
            return [f.path for f in self.db.with_root(root, limit)]

    def holders_of(self, roots: list[bytes], limit: int = HOLDERS) -> dict[bytes, list[str]]:
        """`holders` of many roots at once (a batch's)."""
        with self.lock:
            return self.db.with_roots(roots, limit)

    def warm(self) -> None:
        """A transfer into this replica starts: load what its first seed query would (the
        trait lists: 0.2 s for 100,000 files, under the lock every writer waits on), ahead
        of it, and note the files held now (`resembled`)."""
        with self.lock:
            self.db.seed_threshold()
            self._held_before = self.db.max_id()

    def indexed(self, paths: list[str]) -> dict[str, IndexedFile]:
        """The index rows of those of ``paths`` that have one (whether the files still
        match them is the caller's to check, with `IndexedFile.describes`)."""
        with self.lock:
            return self.db.get_many(paths)

    def seed_trees(self, path: str | None, sketch: bytes | None) -> list[tuple[str, Tree]]:
        """(path, tree) of the file at ``path`` if indexed, then of the files whose
        sketches resemble ``sketch``, best first. A stored tree that does not check out is
        skipped."""
        return self.seed_trees_many([(path, sketch)])[0]

    def seed_trees_many(self, wanted: Sequence[tuple[str | None, bytes | None]]
                        ) -> list[list[tuple[str, Tree]]]:
        """`seed_trees` of each (path, sketch): a batch's seeds in a few queries and one
        hold of the lock (one look-up per file held it 1,000 times in a push of 1,000
        edits, while the batches' other threads waited for it), each tree unpacked once."""
        with self.lock:
            same = self.db.get_many([path for path, _ in wanted if path is not None])
            ids: list[list[int]] = []  # each file's seeds, best first
            asked: list[tuple[int, bytes, int | None]] = []  # (file, sketch, id left out)
            for k, (path, sketch) in enumerate(wanted):
                row = same.get(path) if path is not None else None
                ids.append([] if row is None else [row.id])
                if sketch is not None:
                    asked.append((k, sketch, None if row is None else row.id))
            found = self.db.seed_candidates([(sketch, exclude) for _, sketch, exclude in asked])
            for (k, _, _), candidates in zip(asked, found, strict=True):
                ids[k] += [file_id for file_id, _ in candidates]
            stored = self.db.packed_trees(list({i for chosen in ids for i in chosen}))
        trees: dict[int, Tree | None] = {}
        for file_id, (_, blob) in stored.items():
            try:
                trees[file_id] = unpack_tree(blob, self.db.params.groups)
            except TreeFormatError:
                trees[file_id] = None
        return [[(stored[i][0], tree) for i in chosen
                 if i in stored and (tree := trees[i]) is not None] for chosen in ids]

    def resembled(self, sketch: bytes, traits: int) -> bool:
        """Whether a file indexed when the last transfer into this replica started
        (`warm`; any file, if none did) shares at least ``traits`` of 12 traits with
        ``sketch``. Files written since came from the same kind of source, most from the
        same transfer, where the compression stream sees what they share; looking among
        them cost a first copy of 100,000 files a tenth of the target's CPU, for nothing
        (of Django's 6,759 files, 6 looked near-identical and sent the same bytes)."""
        with self.lock:
            return bool(self.db.candidates(sketch, traits, 1, upto=self._held_before))

    def reader(self, path: str) -> Callable[[int, int], bytes] | None:
        """(offset, length) -> bytes of the file at ``path``, opened once; None if it
        cannot be opened. The descriptor closes when the reader is garbage."""
        try:
            f = self.fs.open_read(path)
        except (OSError, PathError):
            return None
        fd = f.fileno()

        def read(offset: int, length: int, _keep: BinaryIO = f) -> bytes:
            return os.pread(fd, length, offset)

        return read

    # ------------------------------------------------------------ the index after writes

    def record(
        self, path: str, st: os.stat_result, signature: FileSignature, racy: bool | None = None
    ) -> None:
        """Store the signature of a file just written or read."""
        self._store([(path, st, signature, racy)])

    def recording_together(self) -> contextlib.AbstractContextManager[None]:
        """What `sign` signs on this thread inside is stored at the end, in one
        transaction: a batch's files signed one by one cost one commit, not one each
        (about 60 us a file of SQLite's time). Before anything inside records or looks up
        one of those files otherwise (`recheck`), `store_recorded`: their rows are not
        there yet."""
        return self._records.together()

    def store_recorded(self) -> None:
        """Store now what `recording_together` kept so far on this thread."""
        self._records.now()

    def record_many(
        self, files: list[tuple[str, FileStat, FileSignature]], racy: bool | None = None
    ) -> None:
        """Store the signatures of files just written or read, in one transaction."""
        self._store([(path, st, signature, racy) for path, st, signature in files])

    def _store(self, files: list[tuple[str, FileStat, FileSignature, bool | None]]
               ) -> None:
        """Store rows, in one transaction with those other threads store meanwhile: a
        first copy's batch writers each stored their rows in a transaction of their own,
        queued on the lock for each other's commits, and each commit wrote a page of the
        root index for nearly every row. The rows are made before, outside the lock."""
        if not files:
            return
        now = time.time_ns()
        self._rows.join([
            row_of(path, st, signature, mtime_ns(st) >= now - RACY_NS if racy is None else racy)
            for path, st, signature, racy in files])

    def _put_rows(self, groups: list[list[Row]]) -> list[None]:
        with self.lock, self.db.transaction():
            self.db.put_rows([row for rows in groups for row in rows])
        return [None] * len(groups)

    def commit(
        self, temp: TempFile, path: str, mode: int, mtime_ns: int, expect: Expect | None
    ) -> os.stat_result:
        """Commit a temporary over ``path``, leaving the fsync of its directory to
        `sync_dirs` (once per directory, not once per file). Its signature is not known
        here, so the path's index row goes: a new file of the same size and mtime that got
        the old one's freed inode number would otherwise pass for it (a stamp is size,
        mtime and inode), and keep its root."""
        st = temp.commit(mode, mtime_ns, expect, sync_dir=False)
        self._installed(path)
        with self.lock, self.db.transaction():
            self.db.delete_tree(path)
        return st

    def commit_received(
        self, temp: TempFile, path: str, mode: int, mtime_ns: int, expect: Expect | None,
        signature: FileSignature,
    ) -> os.stat_result:
        """Commit a received file and record its signature, made durable together with the
        others being committed on other threads (`rdc.local.commits`); the fsync of its
        directory is left to `sync_dirs`, as `commit` does."""
        return self._commits.commit(temp, path, mode, mtime_ns, expect, signature)

    def install(self, temp: TempFile, path: str, expect: Expect | None) -> os.stat_result:
        """Install a temporary that `TempFile.prepare` and `rdc.local.fs.sync_all` made
        durable, leaving the fsync of its directory to `sync_dirs` as `commit` does."""
        st = temp.install(expect, sync_dir=False)
        self._installed(path)
        return st

    def install_all(self, items: Sequence[tuple[TempFile, Expect | None]]
                    ) -> list[FileStat | OSError | PathError | ConflictError]:
        """`install` of each (temporary, expectation): `rdc.local.fs.install_all`."""
        out = install_all(items)
        for (temp, _), st in zip(items, out, strict=True):
            if not isinstance(st, BaseException):
                self._installed(temp.path)
        return out

    def _installed(self, path: str) -> None:
        with self._unsynced_lock:
            self._unsynced.add(path.rpartition("/")[0])

    def move(self, path: str, destination: str, expect: Expect | None = None,
             row: IndexedFile | bool | None = True, held: HeldDirs | None = None) -> None:
        """`SafeRoot.rename`, leaving the fsync of both directories to `sync_dirs` as
        `commit` does. A file whose index row was current keeps it at its new path (its
        content did not change: nothing is read again); anything else's rows go. ``row``:
        the path's index row if the caller has it, looked up again unless it describes
        what moved (the caller's check may have signed the file again). Inside
        `changing_together`, the index learns of the move at the end. ``held``: as for
        `expect_version`."""
        st = self.fs.rename(path, destination, expect, sync=False, held=held)
        with self._unsynced_lock:
            self._unsynced.update((path.rpartition("/")[0], destination.rpartition("/")[0]))
        if isinstance(row, bool) or row is None or not row.describes(st):
            row = self.indexed([path]).get(path)  # (the check may have signed it again)
        kept = (row.id if row is not None and stat.S_ISREG(st.st_mode) and row.describes(st)
                else None)
        self._changes.add((path, destination, kept, st))

    def changing_together(self) -> contextlib.AbstractContextManager[None]:
        """What `move` and `forget` change in the index on this thread inside is stored at
        the end, in one transaction (989 moves of a renamed tree took one each, three holds
        of the index lock a move, while the batches' threads held it too). Before anything
        inside looks up the row of a path they changed, `store_changes`."""
        return self._changes.together()

    def store_changes(self) -> None:
        """Store now what `changing_together` kept so far on this thread."""
        self._changes.now()

    def _store_changes(self, changes: list[Changed]) -> None:
        """Each (path, where it moved or "", the id of the row it keeps there, its stat)."""
        if not changes:
            return
        with self.lock, self.db.transaction():
            for path, destination, file_id, st in changes:
                if destination:
                    self.db.delete_tree(destination)
                if file_id is not None and st is not None:
                    self.db.move(file_id, destination, st, False)
                else:
                    self.db.delete_tree(path)

    def mkdir(self, path: str, mode: int, *, exist_ok: bool = True) -> bool:
        """`SafeRoot.mkdir`, leaving the fsync of the parent to `sync_dirs` as `commit`
        does: a crash before it may lose the new directory with what was put in it, which
        was not yet reported durable."""
        made = self.fs.mkdir(path, mode, exist_ok=exist_ok, sync=False)
        if made:
            with self._unsynced_lock:
                self._unsynced.add(path.rpartition("/")[0])
        return made

    def mkdir_many(self, dirs: Sequence[tuple[str, int]]) -> list[bool]:
        """`mkdir` of each (path, mode) where nothing is, as many as it can in native runs
        (`SafeRoot.make_dirs`); True for each made. The others are the caller's to make one
        by one."""
        with HeldDirs(self.fs) as held:
            made = self.fs.make_dirs(dirs, held)
        with self._unsynced_lock:
            self._unsynced.update(path.rpartition("/")[0]
                                  for (path, _), done in zip(dirs, made, strict=True) if done)
        return made

    def sync_dirs(self) -> None:
        """Make the renames of `commit` and the directories of `mkdir` durable. Until then
        a crash may leave the old version of a file, never a mix."""
        with self._unsynced_lock:
            dirs, self._unsynced = self._unsynced, set()
        if len(dirs) > SYNCFS_FROM and sync_filesystem(self.fs):
            return
        for rel in sorted(dirs):
            try:
                self.fs.sync_dir(rel)
            except (OSError, PathError):
                continue  # moved, removed or replaced since: nothing of ours to sync there

    def set_meta(
        self, path: str, mode: int | None = None, mtime_ns: int | None = None,
        retimed: list[Retimed] | None = None, held: HeldDirs | None = None,
    ) -> None:
        """Set the mode and mtime of the entry at ``path`` (`SafeRoot.set_meta`: a file with
        other hard links is replaced by a copy). A file whose index row was current stays
        current (its new stamp recorded), so the next scan does not read it again. With
        ``retimed`` that record is left to `record_times`: one transaction for a batch.
        ``held``: the caller's directory descriptors (`rdc.local.fs.HeldDirs`)."""
        before, after = self.fs.set_meta(path, mode, mtime_ns, held)
        if _restamped(before, after):
            if retimed is not None:
                retimed.append((path, before, after))
            else:
                self.record_times([(path, before, after)])

    def set_meta_many(
        self, changes: Sequence[tuple[str, int | None, int | None]], retimed: list[Retimed],
        held: HeldDirs,
    ) -> Iterator[None]:
        """`set_meta` of each (path, mode, mtime_ns), in order, most in one native call
        (`SafeRoot.set_meta_many`); yields once as each is done. What to record is left
        in ``retimed``, for `record_times`."""
        for (path, _, _), (before, after) in zip(changes, self.fs.set_meta_many(changes, held),
                                                 strict=False):
            if _restamped(before, after):
                retimed.append((path, before, after))
            yield

    def keep_dir_times(self, dirs: HeldDirs, paths: Sequence[str]) -> list[str]:
        """Note the time of each directory below the top holding one of ``paths``, before
        this batch writes there, for `put_dir_times_back` (a directory another batch is
        writing in keeps the time noted before that one's writes). The directories noted;
        one that cannot be opened is left out."""
        noted: dict[str, None] = {}
        for path in paths:
            where = parent(path)
            if not where or where in noted:
                continue
            with self._dir_times_lock:
                held = self._dir_times.get(where)
                if held is not None:
                    held[1] += 1
                else:
                    try:
                        held = [os.fstat(dirs.fd(where, path)).st_mtime_ns, 1]
                    except (OSError, PathError):
                        continue
                    self._dir_times[where] = held
            noted[where] = None
        return list(noted)

    def put_dir_times_back(self, noted: Sequence[str], write: bool = True) -> None:
        """Set the directories `keep_dir_times` noted back to their times then (each one's
        last batch in flight leaves it at that), and forget them (``write`` false: only
        forget, the batch failed)."""
        with self._dir_times_lock:
            times = [(where, self._dir_times[where][0]) for where in noted]
            for where in noted:
                held = self._dir_times[where]
                held[1] -= 1
                if not held[1]:
                    del self._dir_times[where]
        if write:
            self.set_dir_times(times)

    def set_dir_times(self, times: Sequence[tuple[str, int]]) -> None:
        """Set the modification time of each directory (path, mtime_ns) of ``times``, its
        mode left as it is (`set_meta_many`; a directory has no index row to restamp)."""
        if not times:
            return
        retimed: list[Retimed] = []
        with HeldDirs(self.fs) as held, contextlib.suppress(OSError, PathError):
            # (one gone or swapped meanwhile stops the rest: the metadata walk sets them)
            for _ in self.set_meta_many([(path, None, t) for path, t in times], retimed, held):
                pass

    def record_times(self, retimed: list[Retimed]) -> None:
        """Record the stamps `set_meta` made, for rows that described the file before."""
        if not retimed:
            return
        with self.lock, self.db.transaction():
            self.db.restamp_many(retimed)

    def forget(self, path: str) -> None:
        """Drop ``path`` and everything below it from the index (inside
        `changing_together`, at its end)."""
        self._changes.add((path, "", None, None))


def _restamped(before: FileStat | None, after: FileStat | None) -> bool:
    """Whether setting metadata moved a regular file's stamp (its row to be restamped)."""
    return (before is not None and after is not None and stat.S_ISREG(before.st_mode)
            and _changed(before, after))


def _changed(a: FileStat, b: FileStat) -> bool:
    return stamp(a) != stamp(b)


def _touched(old: Entry, dirs: dict[str, bytes]) -> set[str] | None:
    """The directories of ``old`` whose stamps are not those a stamp walk saw (``dirs``);
    None if more than half of them changed or left (listing them all again costs more
    than a walk)."""
    touched = set()
    matched = 0
    stack = [("", old)]
    while stack:
        path, entry = stack.pop()
        now = dirs.get(path)
        if now is None:
            continue  # gone: its parent's listing changed too
        matched += 1
        if now != entry.seen:
            touched.add(path)
        stack += [(f"{path}/{name}" if path else name, child)
                  for name, child in entry.children.items() if child.kind == "d"]
    if 2 * (len(touched) + len(dirs) - matched) > len(dirs):
        return None
    return touched


def _salt(excludes: Excludes) -> bytes:
    """What a walk's fingerprint is salted with: the exclude patterns."""
    return "\n".join(excludes.patterns).encode("utf-8", "surrogateescape")
