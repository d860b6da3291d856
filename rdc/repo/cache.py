"""The local index of a repository: one SQLite database per repository and client, in the
user's cache directory. It holds what the repository's index objects say (by storage id),
the super-feature index of chunk sketches, the file cache of each backed-up source, and
the snapshot records read so far. It is a cache: a database that is corrupt, another
schema's or another repository's is deleted and rebuilt from the repository.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator
from importlib import resources
from pathlib import Path

from rdc.records import record
from rdc.repo.blobs import Encoding, Entry, Kind
from rdc.repo.indexfile import PackInfo
from rdc.repo.similarity import features

SCHEMA_VERSION = 1
BUSY_TIMEOUT = 60.0
CACHE_KIB = 64 << 10
_BATCH = 500  # variables per IN (...) query

# Error codes that are not the database's fault: deleting it would not help.
_TRANSIENT = {
    sqlite3.SQLITE_PERM, sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_NOMEM,
    sqlite3.SQLITE_READONLY, sqlite3.SQLITE_INTERRUPT, sqlite3.SQLITE_IOERR,
    sqlite3.SQLITE_FULL, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_PROTOCOL,
}


def default_location(repo_id: str) -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "rdc" / "repo" / f"{repo_id}.sqlite3"


@record
class Location:
    """Where a blob's record is."""

    pack_id: bytes
    entry: Entry


@record
class CachedFile:
    size: int
    mtime_ns: int
    inode: int
    level: int
    hashes: bytes
    lengths: bytes


class _Foreign(sqlite3.DatabaseError):
    """The database belongs to another schema or repository."""


def _unusable(exc: sqlite3.DatabaseError) -> bool:
    if isinstance(exc, _Foreign):
        return True
    code = getattr(exc, "sqlite_errorcode", None)
    return code is None or code & 0xFF not in _TRANSIENT


def _chunks(items: list, size: int = _BATCH) -> Iterator[list]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


_ENTRY = "b.sid, b.offset, b.length, b.size, b.kind, b.encoding, b.base, b.depth, b.sketch"


def _entry(row: tuple) -> Entry:
    sid, offset, length, size, kind, encoding, base, depth, sketch = row
    return Entry(Kind(kind), Encoding(encoding), sid, offset, length, size, base, depth, sketch)


class LocalIndex:
    """Connection and queries; safe to share between threads (one lock in SQLite)."""

    def __init__(self, location: str | os.PathLike[str], repo_id: str) -> None:
        self.location = Path(location)
        self.repo_id = repo_id
        self.location.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.conn = self._open()
        except sqlite3.DatabaseError as exc:
            if not _unusable(exc):
                raise
            self._discard()
            self.conn = self._open()

    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.location, timeout=BUSY_TIMEOUT, isolation_level=None,
                               check_same_thread=False)
        try:
            self._wal(conn)
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA foreign_keys=ON")
            # Records arrive in random id order: a larger page cache keeps the B-trees'
            # inner pages in memory while a large backup is indexed.
            conn.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
            with _write(conn):
                self._prepare(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    @staticmethod
    def _wal(conn: sqlite3.Connection) -> None:
        deadline = time.monotonic() + BUSY_TIMEOUT
        while True:
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as exc:
                if exc.sqlite_errorcode != sqlite3.SQLITE_BUSY or time.monotonic() > deadline:
                    raise
            time.sleep(0.01)

    def _prepare(self, conn: sqlite3.Connection) -> None:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise _Foreign("local index of a newer rdc")
        if version < 1:
            sql = (resources.files("rdc.repo") / "sql" / "0001.sql").read_text()
            pending = ""
            for line in sql.splitlines(keepends=True):
                pending += line
                if sqlite3.complete_statement(pending):
                    conn.execute(pending)
                    pending = ""
            conn.execute("PRAGMA user_version=1")
            conn.execute("INSERT INTO meta VALUES ('repo', ?)", (self.repo_id,))
        stored = conn.execute("SELECT value FROM meta WHERE key = 'repo'").fetchone()
        if stored is None or stored[0] != self.repo_id:
            raise _Foreign("local index of another repository")

    def _discard(self) -> None:
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{self.location}{suffix}")

    def rebuild(self) -> None:
        self.conn.close()
        self._discard()
        self.conn = self._open()

    def close(self) -> None:
        self.conn.close()

    def transaction(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        return _write(self.conn)

    # ------------------------------------------------------------ index objects

    def index_objects(self) -> set[str]:
        return {name for (name,) in self.conn.execute("SELECT name FROM index_object")}

    def add_index(self, name: str, packs: list[PackInfo]) -> None:
        """Record what index object ``name`` says (once: a second call is a no-op)."""
        with self.transaction() as conn:
            cursor = conn.execute("INSERT OR IGNORE INTO index_object (name) VALUES (?)",
                                  (name,))
            if not cursor.rowcount:
                return
            index_id = cursor.lastrowid
            for pack in packs:
                conn.execute("INSERT OR IGNORE INTO pack (name, size) VALUES (?, ?)",
                             (pack.pack_id, pack.size))
                (pack_row,) = conn.execute("SELECT id FROM pack WHERE name = ?",
                                           (pack.pack_id,)).fetchone()
                conn.execute("INSERT INTO pack_index VALUES (?, ?)", (pack_row, index_id))
                conn.executemany(
                    "INSERT OR IGNORE INTO blob VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [(e.sid, pack_row, e.offset, e.length, e.size, int(e.kind),
                      int(e.encoding), e.base, e.depth, e.sketch) for e in pack.entries],
                )
                conn.executemany(
                    "INSERT OR IGNORE INTO similar VALUES (?, ?)",
                    [(f, e.sid) for e in pack.entries if e.sketch
                     for f in features(e.sketch, e.kind)],
                )

    def forget_index(self) -> None:
        """Forget every index object read (the file cache and snapshot records stay)."""
        with self.transaction() as conn:
            conn.execute("DELETE FROM index_object")
            conn.execute("DELETE FROM pack")
            conn.execute("DELETE FROM similar")

    def drop_indexes(self, names: Iterable[str]) -> None:
        """Forget index objects that left the repository, and the packs only they named."""
        names = list(names)
        if not names:
            return
        with self.transaction() as conn:
            for name in names:
                conn.execute("DELETE FROM index_object WHERE name = ?", (name,))
            conn.execute("DELETE FROM pack WHERE id NOT IN (SELECT pack FROM pack_index)")
            conn.execute("DELETE FROM similar WHERE sid NOT IN (SELECT sid FROM blob)")

    # ------------------------------------------------------------ lookups

    def locate(self, sid: bytes) -> Location | None:
        """The least deep copy of a blob."""
        row = self.conn.execute(
            f"SELECT p.name, {_ENTRY} FROM blob b JOIN pack p ON p.id = b.pack "
            "WHERE b.sid = ? ORDER BY b.depth, p.id LIMIT 1", (sid,)).fetchone()
        return Location(row[0], _entry(row[1:])) if row else None

    def locate_many(self, sids: Iterable[bytes]) -> dict[bytes, Location]:
        found: dict[bytes, Location] = {}
        for batch in _chunks(list(set(sids))):
            rows = self.conn.execute(
                f"SELECT p.name, {_ENTRY} FROM blob b JOIN pack p ON p.id = b.pack "
                f"WHERE b.sid IN ({','.join('?' * len(batch))}) "
                "ORDER BY b.depth DESC, p.id DESC", batch)
            for row in rows:  # least deep (then the pack known longest) last: it wins
                found[row[1]] = Location(row[0], _entry(row[1:]))
        return found

    def known(self, sids: Iterable[bytes]) -> set[bytes]:
        found: set[bytes] = set()
        for batch in _chunks(list(sids)):
            rows = self.conn.execute(
                f"SELECT DISTINCT sid FROM blob WHERE sid IN ({','.join('?' * len(batch))})",
                batch)
            found.update(sid for (sid,) in rows)
        return found

    def candidates_by_feature(self, keys: list[int], per_feature: int
                              ) -> dict[int, list[tuple[bytes, bytes, int]]]:
        """Chunks having each super-feature (at most ``per_feature`` of each): (storage id,
        sketch, least depth)."""
        found: dict[int, list[tuple[bytes, bytes, int]]] = {}
        for batch in _chunks(keys):
            rows = self.conn.execute(
                "SELECT s.feature, b.sid, b.sketch, MIN(b.depth) FROM similar s "
                "JOIN blob b ON b.sid = s.sid WHERE b.sketch IS NOT NULL AND s.feature IN "
                f"({','.join('?' * len(batch))}) GROUP BY s.feature, b.sid", batch)
            for feature, sid, sketch, depth in rows:
                bucket = found.setdefault(feature, [])
                if len(bucket) < per_feature:
                    bucket.append((sid, sketch, depth))
        return found

    def packs(self) -> dict[bytes, int]:
        """Every indexed pack: id -> size."""
        return dict(self.conn.execute("SELECT name, size FROM pack"))

    def pack_size(self, pack_id: bytes) -> int | None:
        row = self.conn.execute("SELECT size FROM pack WHERE name = ?", (pack_id,)).fetchone()
        return row[0] if row else None

    def entries(self, pack_id: bytes) -> list[Entry]:
        rows = self.conn.execute(
            f"SELECT {_ENTRY} FROM blob b JOIN pack p ON p.id = b.pack WHERE p.name = ? "
            "ORDER BY b.offset", (pack_id,))
        return [_entry(row) for row in rows]

    def blob_count(self) -> int:
        return self.conn.execute("SELECT COUNT(DISTINCT sid) FROM blob").fetchone()[0]

    # ------------------------------------------------------------ stream locality

    def successors(self, sids: Iterable[bytes]) -> dict[bytes, bytes]:
        """The chunk that followed each of ``sids`` where this client first stored it."""
        found: dict[bytes, bytes] = {}
        for batch in _chunks(list(set(sids))):
            found.update(self.conn.execute(
                f"SELECT sid, next FROM follows WHERE sid IN ({','.join('?' * len(batch))})",
                batch))
        return found

    def add_follows(self, pairs: list[tuple[bytes, bytes]]) -> None:
        with self.transaction() as conn:
            conn.executemany("INSERT OR IGNORE INTO follows VALUES (?, ?)", pairs)

    # ------------------------------------------------------------ the file cache

    def cached_file(self, source: bytes, path: bytes) -> CachedFile | None:
        row = self.conn.execute(
            "SELECT size, mtime_ns, inode, level, hashes, lengths FROM file "
            "WHERE source = ? AND path = ?", (source, path)).fetchone()
        return CachedFile(*row) if row else None

    def put_files(self, source: bytes, files: list[tuple[bytes, CachedFile]]) -> None:
        with self.transaction() as conn:
            conn.executemany(
                "INSERT OR REPLACE INTO file VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(source, path, f.size, f.mtime_ns, f.inode, f.level, f.hashes, f.lengths)
                 for path, f in files])

    def keep_files(self, source: bytes, paths: set[bytes]) -> None:
        """Forget the cached files of ``source`` that are not in ``paths``."""
        stored = [p for (p,) in self.conn.execute("SELECT path FROM file WHERE source = ?",
                                                  (source,))]
        gone = [p for p in stored if p not in paths]
        with self.transaction() as conn:
            conn.executemany("DELETE FROM file WHERE source = ? AND path = ?",
                             [(source, p) for p in gone])

    # ------------------------------------------------------------ snapshot records

    def snapshot_records(self) -> dict[str, bytes]:
        return dict(self.conn.execute("SELECT name, record FROM snapshot"))

    def put_snapshots(self, records: dict[str, bytes]) -> None:
        with self.transaction() as conn:
            conn.executemany("INSERT OR REPLACE INTO snapshot VALUES (?, ?)", records.items())

    def drop_snapshots(self, names: Iterable[str]) -> None:
        with self.transaction() as conn:
            conn.executemany("DELETE FROM snapshot WHERE name = ?", [(n,) for n in names])


@contextlib.contextmanager
def _write(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
