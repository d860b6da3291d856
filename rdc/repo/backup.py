"""`backup`: a snapshot of source trees, storing only what the repository lacks.

Each source is walked (`rdc.local.snapshot.walk`: kinds, modes, times, link targets). A file
whose (size, mtime, inode) match the file cache of its source, and whose blobs are still
indexed, is not read; every other file is read once, chunked and hashed, and its unknown
chunks stored (`BlobWriter`: dedup, then a similarity delta or zstd). Its Merkle tree gives
its root; the tree's inner nodes are stored as node blobs. The walked tree is then sealed
(rdc's directory hashes), its unknown directories stored as dir blobs (top-down, so an
unchanged subtree costs one lookup), the modes and times as one meta blob, and the
snapshot record last.
"""

from __future__ import annotations

import contextlib
import os
import queue
import socket
import stat
import threading
import time
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import BinaryIO

from rdc import _native
from rdc.content.chunking import Chunker, boundaries
from rdc.content.entries import pack_varints, unpack_varints
from rdc.content.tree import Level, Tree, build_tree
from rdc.errors import RdcError, UsageError
from rdc.local.filestat import mtime_ns, stamp
from rdc.local.fs import SafeRoot
from rdc.local.ignore import Excludes
from rdc.local.index import Progress
from rdc.local.paths import PathError, join, parent
from rdc.local.paths import name as leaf_name
from rdc.local.snapshot import Entry, entries_below, fill_roots, seal, walk
from rdc.repo.blobs import Kind
from rdc.repo.cache import CachedFile
from rdc.repo.dirs import HeldDirs
from rdc.repo.errors import RepoError
from rdc.repo.repository import Repository
from rdc.repo.similarity import node_sketch
from rdc.repo.snapshots import Snapshot, newest_first, parent_of
from rdc.repo.trees import DirEntry, FileRef, decode_node, encode_dir, encode_meta, inner_nodes
from rdc.repo.writer import BlobWriter, WriteStats

READ_SIZE = 4 << 20
REFERENCES = 16  # recent snapshots considered as the reference of a backup without parent
RACY_NS = 2_000_000_000  # a file modified this close to the backup is not cached


@dataclass
class BackupResult:
    snapshot: Snapshot
    files: int = 0
    dirs: int = 0
    links: int = 0
    bytes: int = 0
    files_read: int = 0
    bytes_read: int = 0
    files_unchanged: int = 0
    errors: list[tuple[str, str]] = field(default_factory=list)
    stats: WriteStats = field(default_factory=WriteStats)
    seconds: float = 0.0


@dataclass
class _Source:
    path: str  # absolute
    is_dir: bool
    name: str  # its entry in a synthetic root


@dataclass
class _File:
    source: int
    rel: str  # within the source ("" for a file source)
    path: str  # within the snapshot
    st: os.stat_result


def _sources(paths: list[str]) -> list[_Source]:
    out = []
    for text in paths:
        path = os.path.abspath(text)
        try:
            st = os.stat(path)
        except OSError as exc:
            raise UsageError(message=f"cannot back up {text}: {exc.strerror}") from None
        if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
            raise UsageError(message=f"cannot back up {text}: not a directory or a file")
        name = os.path.basename(path.rstrip("/"))
        out.append(_Source(path, stat.S_ISDIR(st.st_mode), name))
    names = [s.name for s in out]
    if len(out) > 1 and ("" in names or len(set(names)) != len(names)):
        raise UsageError(message="sources of one backup need distinct last path components")
    return out


def _without_repository(repo: Repository, sources: list[_Source], excludes: Excludes
                        ) -> Excludes:
    """``excludes``, plus the repository itself where it lies in a source directory (a
    backup of a home directory into ~/backups must not back up its own packs)."""
    root = getattr(repo.store, "root", None)
    if root is None:
        return excludes
    repo_path = os.path.realpath(root)
    extra = []
    for source in sources:
        if not source.is_dir:
            continue
        rel = os.path.relpath(repo_path, os.path.realpath(source.path))
        if rel != "." and not rel.startswith(".."):
            extra.append("/" + "".join("\\" + c if c in "\\*?[]!# " else c for c in rel) + "/")
    return Excludes([*excludes.patterns, *extra]) if extra else excludes


def _gather(sources: list[_Source], excludes: Excludes, started: int
            ) -> tuple[Entry, bool, list[_File], list[tuple[str, str]]]:
    """The snapshot's tree (without file roots), whether its root is synthetic, the files to
    store, and what could not be read."""
    files: list[_File] = []
    errors: list[tuple[str, str]] = []
    single = len(sources) == 1 and sources[0].is_dir
    root = Entry("d", 0o700, started, children={})
    for i, source in enumerate(sources):
        prefix = "" if single else source.name
        if source.is_dir:
            salt = "\n".join(excludes.patterns).encode("utf-8", "surrogateescape")
            walked = walk(source.path, excludes, salt)
            tree = walked.tree
            errors += [(join(prefix, rel), reason) for rel, reason in walked.errors]
            for rel, st in walked.files.items():
                files.append(_File(i, rel, join(prefix, rel), st))
        else:
            st = os.stat(source.path)
            tree = Entry("f", stat.S_IMODE(st.st_mode), mtime_ns(st), st.st_size)
            files.append(_File(i, "", source.name, st))
        if single:
            root = tree
        else:
            root.children[source.name] = tree
    return root, not single, files, errors


def _reference(repo: Repository, snapshots: list[Snapshot], root: Entry) -> Snapshot | None:
    """For a backup without a parent (a tree backed up from a new place, as each release
    unpacked into a directory of its own), the recent snapshot whose root shares the most
    names with ``root`` (the newest of those sharing as many): its directories are the
    delta bases of ours."""
    names = set(root.children)
    best: tuple[int, Snapshot] | None = None
    for snap in newest_first(snapshots)[:REFERENCES]:
        try:
            theirs = {entry.name for entry in repo.load_dir(snap.tree)}
        except (RdcError, ValueError):
            continue
        score = len(names & theirs)
        if score and (best is None or score > best[0]):
            best = (score, snap)
    return best[1] if best else None


def _blocks(f: BinaryIO, first: bytes, second: bytes
            ) -> Iterator[tuple[bytes, list[int], bytes, array]]:
    """A large file's chunks, a few MiB at a time: (bytes, chunk ends in them, their hashes
    and lengths). A thread reads, chunks and hashes the next blocks (all without the
    interpreter lock) while the caller stores these."""
    ready: queue.Queue[tuple | BaseException | None] = queue.Queue(maxsize=2)
    stop = threading.Event()

    def read() -> None:
        try:
            chunker = Chunker()
            pending = bytearray()
            base = 0  # stream offset of pending[0]
            data, more = first, second
            while not stop.is_set():
                cuts = chunker.feed(data) if data else chunker.finish()
                pending += data
                if cuts:
                    ends = [c - base for c in cuts]
                    block = bytes(pending[: ends[-1]])
                    del pending[: ends[-1]]
                    base = cuts[-1]
                    ready.put((block, ends, *_native.hash_chunks(block, ends)))
                if not data:
                    break
                data, more = (more, b"") if more else (f.read(READ_SIZE), b"")
            ready.put(None)
        except BaseException as exc:  # handed to the caller
            ready.put(exc)

    reader = threading.Thread(target=read, name="rdc-read", daemon=True)
    reader.start()
    try:
        while (item := ready.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while reader.is_alive():  # let a reader blocked on a full queue finish
            with contextlib.suppress(queue.Empty):
                ready.get(timeout=0.1)
        reader.join()


class _ParentTree:
    """The parent snapshot's directories by path, read as needed: bases for dir deltas."""

    def __init__(self, repo: Repository, snap: Snapshot | None) -> None:
        self.repo = repo
        self.ids: dict[str, bytes | None] = {"": snap.tree} if snap else {}
        self.read: set[str] = set()

    def sid(self, path: str) -> bytes | None:
        plain = self._id(path)
        return None if plain is None else self.repo.crypto.storage_id(plain)

    def _id(self, path: str) -> bytes | None:
        if path in self.ids or not path:
            return self.ids.get(path)
        parent = path.rpartition("/")[0]
        above = self._id(parent)
        if above is not None and parent not in self.read:
            self.read.add(parent)
            try:
                for entry in self.repo.load_dir(above):
                    if entry.kind == "d":
                        self.ids[join(parent, entry.name)] = entry.content
            except (RepoError, ValueError):
                pass  # no base then; check reports the parent's damage
        return self.ids.setdefault(path, None)


class _Backup:
    def __init__(self, repo: Repository, writer: BlobWriter, result: BackupResult,
                 progress: Callable[[Progress], None] | None) -> None:
        self.repo = repo
        self.writer = writer
        self.sid = repo.crypto.storage_id
        self.result = result
        self.progress = progress

    # ------------------------------------------------------------ files

    def cached(self, source: bytes, item: _File) -> FileRef | None:
        row = self.repo.index.cached_file(source, os.fsencode(item.rel))
        if row is None or (row.size, row.mtime_ns, row.inode) != tuple(stamp(item.st)):
            return None
        try:
            lengths = tuple(unpack_varints(row.lengths, len(row.hashes) // 32))
        except ValueError:
            return None
        ref = FileRef(row.level, row.hashes, lengths)
        children = [self.sid(h) for h in ref.children()]
        if len(self.writer.known(children)) != len(set(children)):
            return None  # pruned since
        return ref

    def store(self, f: BinaryIO) -> Tree:
        """Read a file once, storing its unknown chunks and inner nodes; its tree."""
        first = f.read(READ_SIZE)
        more = f.read(READ_SIZE) if len(first) == READ_SIZE else b""
        hashes = bytearray()
        lengths = array("Q")
        if not more:
            ends = boundaries(first)
            batch_hashes, batch_lengths = _native.hash_chunks(first, ends)
            self.store_chunks(memoryview(first), ends, batch_hashes, None)
            hashes += batch_hashes
            lengths.extend(batch_lengths)
            self.result.bytes_read += len(first)
        else:
            prev = None
            for block, ends, batch_hashes, batch_lengths in _blocks(f, first, more):
                self.result.bytes_read += len(block)
                prev = self.store_chunks(memoryview(block), ends, batch_hashes, prev)
                hashes += batch_hashes
                lengths.extend(batch_lengths)
        tree = build_tree(Level(bytes(hashes), lengths))
        nodes = list(inner_nodes(tree))
        if nodes:
            sids = [self.sid(node_id) for node_id, _ in nodes]
            known = self.writer.known(sids)
            new: dict[bytes, tuple[bytes, bytes, bytes | None]] = {}
            for sid, (_, blob) in zip(sids, nodes, strict=True):
                if sid not in known and sid not in new:
                    new[sid] = (sid, blob, node_sketch(decode_node(blob)[1]))
            if new:
                self.writer.add_nodes(list(new.values()))
        return tree

    def store_chunks(self, view: memoryview, ends: list[int], hashes: bytes,
                     prev: bytes | None) -> bytes | None:
        """Offer a run of a file's chunks (``prev`` the one before them); the last's id."""
        start = 0
        for i, end in enumerate(ends):
            sid = self.sid(hashes[32 * i : 32 * i + 32])
            self.writer.offer(sid, view[start:end], prev)
            prev, start = sid, end
        return prev

    # ------------------------------------------------------------ directories

    def store_dirs(self, root: Entry, refs: dict[str, FileRef], parent: _ParentTree) -> None:
        """Dir blobs of every directory not stored yet, children first; a known directory's
        subtree is known too and not visited."""
        stack: list[tuple[str, Entry, bool]] = [("", root, False)]
        while stack:
            path, entry, expanded = stack.pop()
            sid = self.sid(entry.content)
            if self.writer.has(sid):
                continue
            if not expanded:
                stack.append((path, entry, True))
                stack += [(join(path, name), child, False)
                          for name, child in entry.sorted_children() if child.kind == "d"]
                continue
            entries = []
            for name, child in entry.sorted_children():
                if child.kind == "f":
                    entries.append(DirEntry(name, "f", refs[join(path, name)]))
                elif child.kind == "d":
                    entries.append(DirEntry(name, "d", content=child.content))
                else:
                    entries.append(DirEntry(name, "l", target=child.target))
            self.writer.add_tree(Kind.DIR, sid, encode_dir(entries), parent.sid(path))


def backup(
    repo: Repository,
    sources: list[str],
    *,
    tags: list[str] | None = None,
    excludes: Excludes | None = None,
    host: str | None = None,
    progress: Callable[[Progress], None] | None = None,
) -> BackupResult:
    """Back up ``sources`` (directories or files) into ``repo`` as one snapshot."""
    began = time.monotonic()
    started = time.time_ns()
    host = host or socket.gethostname()
    resolved = _sources(sources)
    excludes = _without_repository(repo, resolved, excludes or Excludes())
    root, synthetic, files, errors = _gather(resolved, excludes, started)
    with repo.lock("shared", "backup") as lock:
        repo.sync_index()
        paths = [os.fsencode(s.path) for s in resolved]
        snapshots = repo.snapshots()
        parent_snap = parent_of(snapshots, host, paths)
        reference = parent_snap or _reference(repo, snapshots, root)
        writer = BlobWriter(repo)
        snap = Snapshot(started, host, paths, sorted(set(tags or [])), b"", b"",
                        root.mode, root.mtime_ns, synthetic,
                        parent_snap.name if parent_snap else None)
        result = BackupResult(snap, errors=errors, stats=writer.stats)
        work = _Backup(repo, writer, result, progress)
        try:
            roots, refs = _store_files(work, resolved, files, started)
            fill_roots(root, roots)  # files that could not be read are in result.errors
            seal(root)
            work.store_dirs(root, refs, _ParentTree(repo, reference))
            meta_plain_id, meta_blob = encode_meta(root)
            meta_sid = repo.crypto.storage_id(meta_plain_id)
            if not writer.has(meta_sid):
                base = repo.crypto.storage_id(reference.meta) if reference else None
                writer.add_tree(Kind.META, meta_sid, meta_blob, base)
            writer.close()
        except BaseException:
            writer.abandon()
            raise
        lock.check()
        for _, entry in entries_below(root):
            result.files += entry.kind == "f"
            result.dirs += entry.kind == "d"
            result.links += entry.kind == "l"
        result.bytes = sum(ref.size for ref in refs.values())
        snap.tree, snap.meta = root.content, meta_plain_id
        result.seconds = time.monotonic() - began
        snap.summary = {"files": result.files, "dirs": result.dirs, "links": result.links,
                        "bytes": result.bytes, "files_read": result.files_read,
                        "bytes_read": result.bytes_read, "errors": len(result.errors),
                        **writer.stats.as_dict()}
        repo.write_snapshot(snap)
        for i, source in enumerate(resolved):
            if source.is_dir:
                repo.index.keep_files(os.fsencode(source.path),
                                      {os.fsencode(f.rel) for f in files if f.source == i})
    return result


def _store_files(work: _Backup, sources: list[_Source], files: list[_File], started: int
                 ) -> tuple[dict[str, bytes], dict[str, FileRef]]:
    """Store (or find in the file cache) every file; their roots and refs by snapshot path.
    Files that cannot be read are left out (and listed in the result's errors)."""
    result = work.result
    roots: dict[str, bytes] = {}
    refs: dict[str, FileRef] = {}
    total_bytes = sum(f.st.st_size for f in files)
    done_bytes = 0
    opened: dict[int, HeldDirs] = {}
    try:
        for n, item in enumerate(files, 1):
            source = sources[item.source]
            key = os.fsencode(source.path)
            ref = work.cached(key, item) if source.is_dir else None
            if ref is not None:
                result.files_unchanged += 1
            else:
                try:
                    ref, after = _read(work, source, item, opened)
                except (OSError, PathError) as exc:
                    reason = exc.strerror if isinstance(exc, OSError) else exc.fields["reason"]
                    result.errors.append((item.path, reason or str(exc)))
                    continue
                result.files_read += 1
                unchanged = stamp(after) == stamp(item.st)
                if source.is_dir and unchanged and mtime_ns(item.st) < started - RACY_NS:
                    work.writer.note_file(key, os.fsencode(item.rel), CachedFile(
                        item.st.st_size, mtime_ns(item.st), item.st.st_ino, ref.level,
                        ref.hashes, pack_varints(ref.lengths)))
            roots[item.path] = ref.root
            refs[item.path] = ref
            done_bytes += item.st.st_size
            if work.progress is not None:
                work.progress(Progress(n, len(files), done_bytes, total_bytes, item.path))
    finally:
        for dirs in opened.values():
            dirs.close()
            dirs.fs.close()
    return roots, refs


def _read(work: _Backup, source: _Source, item: _File, opened: dict[int, HeldDirs]
          ) -> tuple[FileRef, os.stat_result]:
    if source.is_dir:
        dirs = opened.get(item.source)
        if dirs is None:
            dirs = opened[item.source] = HeldDirs(SafeRoot(source.path))
        f = dirs.get(parent(item.rel)).open_read(leaf_name(item.rel))
    else:
        f = open(source.path, "rb")  # noqa: SIM115 - closed below
    with f:
        tree = work.store(f)
        after = os.fstat(f.fileno())
    return FileRef.of_tree(tree), after
