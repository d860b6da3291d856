"""Storing blobs during a backup: dedup by storage id, similarity deltas, packs assembled in
memory and flushed (packs, then their index object) by a background thread.

Each flush makes everything stored before it findable: its packs are uploaded, then one
index object naming them, and only then does the local index learn of them. Blobs of
unflushed packs are known to this writer alone. Children are stored before their parents,
and both open packs are flushed together, so an indexed tree blob never names an
unindexed blob (docs/formats.md section 8).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from rdc.repo import codec
from rdc.repo.blobs import MAX_DEPTH, Encoding, Entry, Kind
from rdc.repo.cache import CachedFile, LocalIndex, Location
from rdc.repo.indexfile import PackInfo, encode_index
from rdc.repo.packs import PACK_SIZE, PackWriter, pack_name
from rdc.repo.repository import Repository
from rdc.repo.similarity import chunk_sketch, features, rank
from rdc.storage import map_parallel

# Plain chunks kept for use as bases of later chunks of the same backup.
RECENT_BYTES = 32 << 20
# Flushes uploading at once (each holds up to two packs in memory).
FLUSHES_IN_FLIGHT = 2
# Candidates tried as a delta base for one chunk.
TRIALS = 2
# Chunks offered are checked and stored in batches of this many (or bytes): one query for
# which are known and one for the candidates of the new ones.
BATCH_CHUNKS = 512
BATCH_BYTES = 4 << 20
CANDIDATES_PER_FEATURE = 16
WORKERS = 2  # threads sketching and compressing new chunks


@dataclass
class WriteStats:
    """What a backup stored, by level: identical chunks (dedup), zstd, similarity deltas."""

    new_chunks: int = 0
    new_chunk_bytes: int = 0  # raw bytes of chunks not already stored
    zstd_bytes: int = 0  # what they take compressed alone
    stored_chunk_bytes: int = 0  # what they take as stored (deltas where smaller)
    delta_chunks: int = 0
    new_tree_blobs: int = 0
    tree_raw_bytes: int = 0
    stored_tree_bytes: int = 0
    delta_tree_blobs: int = 0
    packs: int = 0
    pack_bytes: int = 0
    index_objects: int = 0
    index_bytes: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class _Flush:
    packs: list[PackWriter]
    files: list[tuple[bytes, bytes, CachedFile]]
    follows: list[tuple[bytes, bytes]]
    sids: set[bytes] = field(default_factory=set)


class BlobWriter:
    """One backup's blob store. Not thread-safe: one thread adds; a background thread
    uploads."""

    def __init__(self, repo: Repository, max_depth: int = MAX_DEPTH) -> None:
        self.repo = repo
        self.crypto = repo.crypto
        self.max_depth = max_depth
        self.stats = WriteStats()
        self.data = PackWriter(self.crypto)
        self.tree = PackWriter(self.crypto)
        # Blobs this writer stored that the local index does not know yet.
        self.unindexed: dict[bytes, tuple[PackWriter, Entry]] = {}
        self._positions: dict[bytes, int] = {}
        self._features: dict[int, list[tuple[bytes, bytes, int]]] = {}
        self._recent: OrderedDict[bytes, bytes] = OrderedDict()
        self._recent_bytes = 0
        self._files: list[tuple[bytes, bytes, CachedFile]] = []
        self._queue: list[tuple[bytes, bytes, bytes | None]] = []  # offered: sid, data, prev
        self._queued: set[bytes] = set()
        self._nodes: list[tuple[bytes, bytes, bytes | None]] = []  # added, not yet stored
        self._nodes_known: set[bytes] = set()
        self._follows: list[tuple[bytes, bytes]] = []  # (chunk, the chunk after it)
        self._next: dict[bytes, bytes] = {}  # the same, of this backup
        self._based: dict[bytes, bytes] = {}  # new chunk -> its base, of this backup
        self._queue_bytes = 0
        self._uploader = ThreadPoolExecutor(1, thread_name_prefix="rdc-flush")
        self._in_flight: list[Future[None]] = []
        self._lock = threading.Lock()
        self._background_index: LocalIndex | None = None
        self._workers: ThreadPoolExecutor | None = None

    # ------------------------------------------------------------ lookups

    def known(self, sids: list[bytes]) -> set[bytes]:
        """Which of ``sids`` are stored (indexed, or stored by this writer)."""
        with self._lock:
            mine = {sid for sid in sids if sid in self.unindexed or sid in self._queued
                    or sid in self._nodes_known}
        rest = [sid for sid in sids if sid not in mine]
        return mine | (self.repo.index.known(rest) if rest else set())

    def has(self, sid: bytes) -> bool:
        return bool(self.known([sid]))

    def _depth(self, sid: bytes) -> int | None:
        with self._lock:
            held = self.unindexed.get(sid)
        if held is not None:
            return held[1].depth
        location = self.repo.index.locate(sid)
        return None if location is None else location.entry.depth

    def plain(self, sid: bytes) -> bytes:
        """A stored blob's content, for use as a base."""
        recent = self._recent.get(sid)
        if recent is not None:
            return recent
        with self._lock:
            held = self.unindexed.get(sid)
        if held is not None:
            pack, entry = held
            return self.repo.decode(Location(b"", entry), pack.record(entry), self.plain)
        return self.repo.load_sid(sid)

    def _remember(self, sid: bytes, plain: bytes) -> None:
        self._recent[sid] = plain
        self._recent_bytes += len(plain)
        while self._recent_bytes > RECENT_BYTES:
            _, old = self._recent.popitem(last=False)
            self._recent_bytes -= len(old)

    # ------------------------------------------------------------ adding

    def _encode(self, plain: bytes, bases: list[bytes],
                alone: tuple[Encoding, bytes] | None = None
                ) -> tuple[Encoding, bytes, bytes | None, int, int]:
        """(encoding, record, base, depth, zstd-alone size) for the best of plain zstd
        (``alone``, if already made) and a delta against each base tried."""
        encoding, record = alone or codec.compress(plain)
        alone_size = len(record)
        best_base, depth = None, 0
        for base in bases:
            base_depth = self._depth(base)
            if base_depth is None or base_depth >= self.max_depth:
                continue
            attempt = codec.delta(plain, self.plain(base))
            if codec.better_delta(record, attempt):
                encoding, record, best_base, depth = Encoding.DELTA, attempt, base, base_depth + 1
        return encoding, record, best_base, depth, alone_size

    def offer(self, sid: bytes, data: bytes | memoryview, prev: bytes | None = None) -> None:
        """A chunk of a file being backed up (``prev`` the chunk before it in the file):
        stored unless it is known. Checked and stored in batches (`drain`), before any tree
        blob is added and at every flush."""
        if prev is not None:
            self._follows.append((prev, sid))
            self._next.setdefault(prev, sid)
        if sid in self._queued:
            return
        self._queue.append((sid, bytes(data), prev))
        self._queued.add(sid)
        self._queue_bytes += len(data)
        if len(self._queue) >= BATCH_CHUNKS or self._queue_bytes >= BATCH_BYTES:
            self.drain()

    def drain(self) -> None:
        """Store what was offered: the chunks first, then the tree nodes that name them."""
        if self._queue:
            self._drain_chunks()
        if self._nodes:
            nodes, self._nodes = self._nodes, []
            keys = [features(sketch, Kind.NODE) if sketch else [] for _, _, sketch in nodes]
            stored = self.repo.index.candidates_by_feature(
                sorted({k for ks in keys for k in ks}), CANDIDATES_PER_FEATURE)
            for (sid, blob, sketch), node_keys in zip(nodes, keys, strict=True):
                self._add(Kind.NODE, sid, blob, sketch, stored, [], node_keys)
            self._nodes_known.clear()  # stored now: `unindexed` has them

    def _drain_chunks(self) -> None:
        """Store the offered chunks that are not known. A new chunk is tried as a delta
        against the chunk that followed its predecessor when that was stored (the stream's
        locality: the old version of an edited region), and against the stored chunks its
        sketch resembles most; it is stored as the smallest of those and zstd alone."""
        queue = self._queue
        self._queue, self._queued, self._queue_bytes = [], set(), 0
        known = self.known([sid for sid, _, _ in queue])
        new = [item for item in queue if item[0] not in known]
        prepared = self._prepare([plain for _, plain, _ in new])
        wanted = sorted({key for _, keys, _ in prepared for key in keys})
        stored = self.repo.index.candidates_by_feature(wanted, CANDIDATES_PER_FEATURE)
        successors = self.repo.index.successors(prev for _, _, prev in new if prev)
        for (sid, plain, prev), (sketch, keys, alone) in zip(new, prepared, strict=True):
            hints = []
            if prev is not None:
                after = successors.get(prev)
                if prev in self._based:  # a new chunk too: go on from where its base was
                    base = self._based[prev]
                    after = self._next.get(base) or self.repo.index.successors([base]).get(base)
                if after is not None and after != sid:
                    hints.append(after)
            self._add(Kind.CHUNK, sid, plain, sketch, stored, hints, keys, alone)

    def _prepare(self, plains: list[bytes]) -> list[tuple[bytes | None, list[int],
                                                          tuple[Encoding, bytes]]]:
        """Sketch, super-features and zstd record of each new chunk, on WORKERS threads:
        the chunker, BLAKE3 and zstd run without the interpreter lock."""
        def prepare(part: list[bytes]) -> list[tuple[bytes | None, list[int],
                                                     tuple[Encoding, bytes]]]:
            out = []
            for plain in part:
                sketch = chunk_sketch(plain)
                out.append((sketch, features(sketch) if sketch else [], codec.compress(plain)))
            return out

        if len(plains) < 2 * WORKERS:
            return prepare(plains)
        if self._workers is None:
            self._workers = ThreadPoolExecutor(WORKERS - 1, thread_name_prefix="rdc-encode")
        step = -(-len(plains) // WORKERS)
        others = [self._workers.submit(prepare, plains[i : i + step])
                  for i in range(step, len(plains), step)]
        mine = prepare(plains[:step])  # this thread takes a share too
        return mine + [item for future in others for item in future.result()]

    def _add(self, kind: Kind, sid: bytes, plain: bytes, sketch: bytes | None,
             stored: dict[int, list[tuple[bytes, bytes, int]]], hints: list[bytes],
             keys: list[int] | None = None, alone: tuple[Encoding, bytes] | None = None
             ) -> Entry:
        """Store one new blob, trying ``hints`` and then its sketch's candidates as bases."""
        bases = list(hints)
        if sketch is not None:
            keys = features(sketch, kind) if keys is None else keys
            found: dict[bytes, tuple[bytes, bytes, int]] = {}
            for key in keys:
                for candidate in (*stored.get(key, ()), *self._features.get(key, ())):
                    found.setdefault(candidate[0], candidate)
            bases += [base for _, base, _ in rank(sketch, list(found.values()), self.max_depth)
                      if base not in bases][: TRIALS]
        encoding, record, base, depth, alone_size = self._encode(plain, bases, alone)
        pack = self.data if kind is Kind.CHUNK else self.tree
        entry = pack.add(kind, sid, encoding, record, len(plain), base, depth, sketch)
        with self._lock:
            self.unindexed[sid] = (pack, entry)
        if sketch is not None:
            for key in keys or ():
                self._features.setdefault(key, []).append((sid, sketch, depth))
        s = self.stats
        if kind is Kind.CHUNK:
            self._remember(sid, plain)
            if base is not None:
                self._based[sid] = base
            s.new_chunks += 1
            s.new_chunk_bytes += len(plain)
            s.zstd_bytes += alone_size
            s.stored_chunk_bytes += entry.length
            s.delta_chunks += encoding is Encoding.DELTA
        else:
            s.new_tree_blobs += 1
            s.tree_raw_bytes += len(plain)
            s.stored_tree_bytes += entry.length
            s.delta_tree_blobs += encoding is Encoding.DELTA
        if pack.size >= PACK_SIZE:
            self.flush()
        return entry

    def add_tree(self, kind: Kind, sid: bytes, plain: bytes, base: bytes | None = None,
                 sketch: bytes | None = None) -> None:
        """Store a node, dir or meta blob not known yet; ``base`` a candidate for a delta
        (the same directory in the reference snapshot), ``sketch`` (of a node) finds more.
        The offered chunks are stored first: a tree blob never goes to a flush before what
        it names."""
        self.drain()
        stored = {}
        if sketch is not None:
            stored = self.repo.index.candidates_by_feature(features(sketch, kind),
                                                           CANDIDATES_PER_FEATURE)
        hints = [base] if base is not None and base != sid else []
        self._add(kind, sid, plain, sketch, stored, hints)

    def add_nodes(self, nodes: list[tuple[bytes, bytes, bytes | None]]) -> None:
        """Store new inner nodes of a file's tree, (storage id, blob, sketch) each, after
        the chunks offered so far (at the next `drain`, with their candidates looked up
        at once)."""
        self._nodes += nodes
        self._nodes_known.update(sid for sid, _, _ in nodes)
    def note_file(self, source: bytes, path: bytes, cached: CachedFile) -> None:
        """A file-cache row, written once everything stored so far is indexed."""
        self._files.append((source, path, cached))

    # ------------------------------------------------------------ flushing

    def flush(self) -> None:
        """Close the open packs and upload them, then their index object, in the
        background (at most FLUSHES_IN_FLIGHT at once)."""
        self.drain()
        packs = [p for p in (self.data, self.tree) if len(p)]
        if not packs and not self._files and not self._follows:
            return
        job = _Flush(packs, self._files, self._follows)
        for pack in packs:
            job.sids.update(e.sid for e in pack.entries)
        self.data, self.tree = PackWriter(self.crypto), PackWriter(self.crypto)
        self._files, self._follows = [], []
        # The local index has these once this flush is done.
        self._features.clear()
        self._next.clear()
        self._based.clear()
        self._recent.clear()
        self._recent_bytes = 0
        while len(self._in_flight) >= FLUSHES_IN_FLIGHT:
            self._in_flight.pop(0).result()
        self._in_flight.append(self._uploader.submit(self._upload, job))

    def _upload(self, job: _Flush) -> None:
        repo = self.repo
        if self._background_index is None:
            self._background_index = LocalIndex(repo.index.location, repo.id)
        index = self._background_index
        infos: list[PackInfo] = []

        def put(pack: PackWriter) -> PackInfo:
            pack_id, data = pack.finish()
            repo.store.put(pack_name(pack_id), data)
            return PackInfo(pack_id, len(data), pack.entries)

        if job.packs:
            infos = map_parallel(put, job.packs, workers=len(job.packs))
            name, data = encode_index(infos, self.crypto)
            repo.store.put(name, data)
            index.add_index(name, infos)
            self.stats.packs += len(infos)
            self.stats.pack_bytes += sum(i.size for i in infos)
            self.stats.index_objects += 1
            self.stats.index_bytes += len(data)
        if job.follows:
            index.add_follows(job.follows)
        if job.files:
            by_source: dict[bytes, list[tuple[bytes, CachedFile]]] = {}
            for source, path, cached in job.files:
                by_source.setdefault(source, []).append((path, cached))
            for source, rows in by_source.items():
                index.put_files(source, rows)
        with self._lock:
            for sid in job.sids:
                self.unindexed.pop(sid, None)

    def close(self) -> None:
        """Flush what is open and wait for every upload (raising the first failure)."""
        try:
            self.flush()
            while self._in_flight:
                self._in_flight.pop(0).result()
        finally:
            self.abandon()

    def abandon(self) -> None:
        """Stop without flushing (uploads under way finish)."""
        self._uploader.shutdown(wait=True)
        if self._workers is not None:
            self._workers.shutdown(wait=True)
        if self._background_index is not None:
            self._background_index.close()
            self._background_index = None

