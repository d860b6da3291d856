"""`restore`: a snapshot, or a path in it, written to a directory as a pull writes a tree.

Directories are made first (owner-writable until the end), then links, then files: every
file is written beside its destination, checked chunk by chunk against the chunk ids (each
record is checked when decoded), and renamed into place with its mode and mtime, so a file
appears whole or not at all; then the directories get their modes and times, deepest
first. Everything goes through `rdc.local.fs.SafeRoot`: names from the repository are
checked and no symlink is followed, so nothing is written outside the destination.

Chunks are read a batch at a time (about BATCH_BYTES), the records each pack holds for the
batch fetched in a few ranged reads (coalesced), the packs in parallel.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from rdc.local.fs import SafeRoot, TempFile
from rdc.local.index import Progress
from rdc.local.paths import PathError, check_relpath, parent
from rdc.local.paths import name as leaf_name
from rdc.repo.blobs import Encoding
from rdc.repo.cache import Location
from rdc.repo.dirs import HeldDirs
from rdc.repo.errors import CorruptRepo, SnapshotNotFound
from rdc.repo.repository import Repository
from rdc.repo.snapshots import Snapshot
from rdc.repo.trees import FileRef, Item, leaves, walk
from rdc.storage import map_parallel

BATCH_BYTES = 32 << 20
GAP = 256 << 10  # records closer than this in a pack are read in one range
WRITERS = 16  # files committed (fsynced, renamed) at once
OPEN_FILES = 128


@dataclass
class RestoreResult:
    files: int = 0
    dirs: int = 0
    links: int = 0
    bytes: int = 0
    errors: list[tuple[str, str]] = field(default_factory=list)
    seconds: float = 0.0


@dataclass
class _File:
    rel: str
    ref: FileRef
    mode: int
    mtime_ns: int
    sids: list[bytes] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    temp: TempFile | None = None
    written: int = 0
    failed: bool = False


def select(items: list[Item], snap: Snapshot, path: str) -> tuple[list[tuple[str, Item]],
                                                                   tuple[int, int] | None]:
    """The items to restore with their paths in the destination, and the mode and mtime the
    destination itself gets (None: left as it is)."""
    if not path:
        root = None if snap.synthetic else (snap.root_mode, snap.root_mtime)
        return [(item.path, item) for item in items], root
    found = next((item for item in items if item.path == path), None)
    if found is None:
        raise SnapshotNotFound(location="", message=f"no {path} in snapshot {snap.short_id}")
    if found.entry.kind != "d":
        return [(found.entry.name, found)], None
    prefix = path + "/"
    return ([(item.path[len(prefix):], item) for item in items if item.path.startswith(prefix)],
            (found.mode, found.mtime_ns))


def restore(
    repo: Repository, spec: str, dst: str,
    progress: Callable[[Progress], None] | None = None,
) -> RestoreResult:
    """Restore ``SNAP[:PATH]`` into the directory ``dst`` (made if missing)."""
    began = time.monotonic()
    snap_spec, _, path = spec.partition(":")
    path = path.strip("/")
    if path:
        try:
            path = check_relpath(path)
        except PathError as exc:
            raise SnapshotNotFound(location=repo.location, message=str(exc)) from None
    with repo.lock("shared", "restore"):
        repo.sync_index()
        snap = repo.find_snapshot(snap_spec)
        try:
            items = list(walk(repo, snap.tree, snap.meta))
        except ValueError as exc:
            raise CorruptRepo(location=repo.location,
                              message=f"snapshot {snap.short_id}: {exc}") from None
        try:
            chosen, root_meta = select(items, snap, path)
        except SnapshotNotFound as exc:
            raise SnapshotNotFound(location=repo.location, message=exc.fields["message"]) from None
        os.makedirs(dst, exist_ok=True)
        result = RestoreResult()
        with SafeRoot(dst) as fs:
            _Restore(repo, fs, result, progress).run(chosen, root_meta)
    result.seconds = time.monotonic() - began
    return result


class _Dirs(HeldDirs):
    def mkdir(self, rel: str) -> None:
        """Make directory ``rel`` (0700 until its mode is set at the end); an existing
        directory is fine, anything else there is FileExistsError. The parent is fsynced
        later, once for all its new entries."""
        holder = self.get(parent(rel))
        name = leaf_name(rel)
        try:
            os.mkdir(name, 0o700, dir_fd=holder.fileno())
        except FileExistsError:
            st = holder.lstat(name)
            if st is None or not stat.S_ISDIR(st.st_mode):
                raise FileExistsError(errno.EEXIST, "something else is there", rel) from None


class _Restore:
    def __init__(self, repo: Repository, fs: SafeRoot, result: RestoreResult,
                 progress: Callable[[Progress], None] | None) -> None:
        self.repo = repo
        self.fs = fs
        self.dirs = _Dirs(fs)
        self.result = result
        self.progress = progress
        self.pool = ThreadPoolExecutor(WRITERS, thread_name_prefix="rdc-restore")
        self.commits: list[tuple[_File, Future[object]]] = []
        self.files_done = 0
        self.bytes_done = 0
        self.files_total = 0
        self.bytes_total = 0

    def fail(self, rel: str, exc: BaseException) -> None:
        if isinstance(exc, OSError):
            reason = exc.strerror or str(exc)
        elif isinstance(exc, PathError):
            reason = exc.fields["reason"]
        else:
            reason = str(exc)
        self.result.errors.append((rel, reason))

    def run(self, chosen: list[tuple[str, Item]], root_meta: tuple[int, int] | None) -> None:
        dirs: list[tuple[str, int, int]] = []
        files: list[_File] = []
        broken: list[str] = []  # directories that could not be made: skip what is below
        for rel, item in chosen:
            if any(rel.startswith(b + "/") for b in broken):
                continue
            kind = item.entry.kind
            try:
                if kind == "d":
                    self.dirs.mkdir(rel)
                    dirs.append((rel, item.mode, item.mtime_ns))
                    self.result.dirs += 1
                elif kind == "l":
                    self.dirs.get(parent(rel)).symlink(leaf_name(rel), item.entry.target,
                                                       mtime_ns=item.mtime_ns)
                    self.result.links += 1
                else:
                    assert item.entry.file is not None
                    files.append(_File(rel, item.entry.file, item.mode, item.mtime_ns))
            except (OSError, PathError) as exc:
                self.fail(rel, exc)
                if kind == "d":
                    broken.append(rel)
        try:
            self.write_files(files)
        finally:
            self.pool.shutdown(wait=True)
            self.dirs.close()
        synced = {parent(f.rel) for f in files if not f.failed} | {parent(d[0]) for d in dirs}
        map_parallel(self.fs.sync_dir, sorted(synced), workers=WRITERS)
        try:
            for rel, mode, mtime in reversed(dirs):
                try:
                    self.dirs.get(parent(rel)).set_meta(leaf_name(rel), mode, mtime)
                except (OSError, PathError) as exc:
                    self.fail(rel, exc)
        finally:
            self.dirs.close()
        if root_meta is not None:
            self.fs.set_meta("", root_meta[0], root_meta[1])

    # ------------------------------------------------------------ files

    def write_files(self, files: list[_File]) -> None:
        sid = self.repo.crypto.storage_id
        for f in files:
            try:
                hashes, lengths = leaves(f.ref, self.repo)
            except ValueError as exc:
                raise CorruptRepo(location=self.repo.location,
                                  message=f"{f.rel}: {exc}") from None
            f.sids = [sid(hashes[i : i + 32]) for i in range(0, len(hashes), 32)]
            f.lengths = lengths
        self.files_total = len(files)
        self.bytes_total = sum(f.ref.size for f in files)
        for batch in _batches(files):
            plains = self.fetch({s for f, first, last in batch for s in f.sids[first:last]})
            for f, first, last in batch:
                self.write(f, first, last, plains)
        for f, future in self.commits:
            self.finish(f, future)

    def fetch(self, sids: set[bytes]) -> dict[bytes, bytes]:
        """The blobs ``sids`` (and the bases they need), read pack by pack."""
        index = self.repo.index
        locations: dict[bytes, Location] = {}
        wanted = set(sids)
        while wanted:
            found = index.locate_many(wanted)
            missing = wanted - set(found)
            if missing:
                raise CorruptRepo(location=self.repo.location,
                                  message=f"chunk {min(missing).hex()[:16]} is not in the index")
            locations.update(found)
            wanted = {loc.entry.base for loc in found.values()
                      if loc.entry.encoding is Encoding.DELTA
                      and loc.entry.base not in locations} - set(locations)  # type: ignore[misc]
        by_pack: dict[bytes, list[Location]] = {}
        for loc in locations.values():
            by_pack.setdefault(loc.pack_id, []).append(loc)
        ranges = [(pack_id, span) for pack_id, locs in by_pack.items()
                  for span in _spans(sorted(locs, key=lambda loc: loc.entry.offset))]
        sealed: dict[bytes, bytes] = {}
        for part in map_parallel(self._read_span, ranges,
                                 workers=self.repo.store.capabilities.connections):
            sealed.update(part)
        plains: dict[bytes, bytes] = {}

        def plain_of(s: bytes) -> bytes:
            got = plains.get(s)
            if got is None:
                got = plains[s] = self.repo.decode(locations[s], sealed[s], plain_of)
            return got

        for loc in sorted(locations.values(), key=lambda loc: loc.entry.depth):
            plain_of(loc.entry.sid)
        return plains

    def _read_span(self, item: tuple[bytes, list[Location]]) -> dict[bytes, bytes]:
        pack_id, locs = item
        start, end = locs[0].entry.offset, locs[-1].entry.end
        data = self.repo.store.get_range(_pack(pack_id), start, end - start)
        return {loc.entry.sid: data[loc.entry.offset - start : loc.entry.end - start]
                for loc in locs}

    def write(self, f: _File, first: int, last: int, plains: dict[bytes, bytes]) -> None:
        if f.failed:
            return
        try:
            if f.temp is None:
                f.temp = self.dirs.get(parent(f.rel)).create_temp(leaf_name(f.rel))
            for s in f.sids[first:last]:
                f.written += f.temp.write(plains[s])
        except (OSError, PathError) as exc:
            self.abort(f, exc)
            return
        if last == len(f.sids):
            while len(self.commits) >= OPEN_FILES:
                self.finish(*self.commits.pop(0))
            temp = f.temp
            self.commits.append((f, self.pool.submit(
                temp.commit, f.mode, f.mtime_ns, sync_dir=False)))

    def abort(self, f: _File, exc: BaseException) -> None:
        f.failed = True
        if f.temp is not None:
            f.temp.abort()
        self.fail(f.rel, exc)

    def finish(self, f: _File, future: Future[object]) -> None:
        try:
            future.result()
        except (OSError, PathError) as exc:
            f.failed = True
            self.fail(f.rel, exc)
            return
        self.result.files += 1
        self.result.bytes += f.written
        self.files_done += 1
        self.bytes_done += f.written
        if self.progress is not None:
            self.progress(Progress(self.files_done, self.files_total, self.bytes_done,
                                   self.bytes_total, f.rel))


def _pack(pack_id: bytes) -> str:
    from rdc.repo.packs import pack_name

    return pack_name(pack_id)


def _batches(files: list[_File]) -> Iterator[list[tuple[_File, int, int]]]:
    """Runs of chunks of about BATCH_BYTES, in file order: (file, first, last) each."""
    batch: list[tuple[_File, int, int]] = []
    size = 0
    for f in files:
        first = 0
        if not f.sids:
            batch.append((f, 0, 0))
        for i, length in enumerate(f.lengths):
            size += length
            if size >= BATCH_BYTES:
                batch.append((f, first, i + 1))
                yield batch
                batch, size, first = [], 0, i + 1
        if first < len(f.sids):
            batch.append((f, first, len(f.sids)))
    if batch:
        yield batch


def _spans(locs: list[Location]) -> Iterator[list[Location]]:
    """Records of one pack (by offset) grouped into ranges with gaps under GAP."""
    span: list[Location] = []
    for loc in locs:
        if span and loc.entry.offset - span[-1].entry.end > GAP:
            yield span
            span = []
        span.append(loc)
    if span:
        yield span
