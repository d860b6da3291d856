"""The signature index: one SQLite database (WAL) per synced root, kept outside the data.

It is a cache. A database that is corrupt, has another schema or other signature
parameters is deleted and rebuilt (by the next open or refresh). Errors that are not the
database's fault (locked by another process for too long, disk full) are raised instead:
deleting the index would not cure them.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import sys
import time
from collections.abc import Iterator, Sequence
from importlib import resources
from pathlib import Path
from typing import NamedTuple

import blake3

from rdc.content.signature import FileSignature, IndexRow
from rdc.content.tree import Tree, TreeFormatError, pack_tree, unpack_tree
from rdc.local import faults
from rdc.local.filestat import FileStat, Stamp, mtime_ns, stamp
from rdc.local.index.traits import TraitLists, seed_threshold
from rdc.params import DEFAULT_SIGNATURE, SignatureParams, describe

SCHEMA_VERSION = 6
# Candidate defaults: 4 matching traits of 12 keep chance matches rare among 10,000 files
# while finding near-duplicates (J >= 0.5); docs/formats.md section 4.
CANDIDATE_THRESHOLD = 4
CANDIDATE_LIMIT = 5
# Seconds to wait for another connection's write lock before giving up with an error.
BUSY_TIMEOUT = 30.0
# The WAL is copied back into the database (a checkpoint, with two fsyncs) once it holds
# this many pages, not SQLite's 1,000: the root index takes rows in random order, so a
# commit writes about a page a row (docs/formats.md section 7).
WAL_PAGES = 8192


def params_tag(params: SignatureParams) -> str:
    """What the stored signatures depend on; other values make the index stale."""
    return describe(params)


def default_location(root: str | os.PathLike[str]) -> Path:
    """The client's index for ``root``: in the user's cache directory, keyed by the root's
    absolute path."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    key = blake3.blake3(os.fsencode(os.path.abspath(root))).hexdigest()[:24]
    return Path(base) / "rdc" / "index" / f"{key}.sqlite3"


class IndexedFile(NamedTuple):
    """One row. A tuple, not a dataclass: a scan of a large tree builds one per file, and a
    frozen dataclass costs four times as much to make (1.0 against 0.26 us)."""

    id: int
    path: str
    size: int
    mtime_ns: int
    inode: int
    mode: int
    root: bytes
    sketch: bytes | None
    racy: bool

    @property
    def stamp(self) -> Stamp:
        return Stamp(self.size, self.mtime_ns, self.inode)

    def describes(self, st: FileStat) -> bool:
        """Whether this row still describes the file ``st`` was read from: same stamp, and
        not written so recently that a later write could have kept the stamp."""
        return not self.racy and self.stamp == stamp(st)


class Stamped(NamedTuple):
    """The columns of a row that a refresh compares with a file's lstat: all of them but
    the root, sketch and tree, which a scan of an unchanged tree does not need."""

    id: int
    size: int
    mtime_ns: int
    inode: int
    mode: int
    racy: int

    def describes(self, st: FileStat) -> bool:
        """As `IndexedFile.describes`."""
        return not self.racy and (self.size, self.mtime_ns, self.inode) == (
            st.st_size, mtime_ns(st), st.st_ino)


# A file's row as written (`IndexDatabase.put_rows`; native scans make it whole,
# `rdc.content.signature.index_rows_of_files`).
Row = IndexRow


def row_of(path: str, st: FileStat, signature: FileSignature, racy: bool) -> Row:
    """The row of the file at ``path``, stat ``st``, signed as ``signature``."""
    return (os.fsencode(path), st.st_size, mtime_ns(st), st.st_ino, st.st_mode,
            signature.root, signature.sketch, pack_tree(signature.tree), int(racy))


_STAMPED = "path, id, size, mtime_ns, inode, mode, racy"  # a path, then a `Stamped`

# ``os.fsdecode`` of bytes, without its dispatch on the argument's type (a large tree's
# rows each decode a path).
_ENCODING, _ERRORS = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()


ROOT_BYTES = 32  # a whole content root
# Files are found by root through an index of its first ROOT_KEY bytes (schema 4): a query
# names the index's expression exactly, or SQLite does not use it.
ROOT_KEY = 8
_BY_ROOT = f"substr(file.root, 1, {ROOT_KEY})"  # (as sql/0004.sql makes it)


def _next_prefix(prefix: bytes) -> bytes:
    """A byte string above every root that starts with ``prefix`` and below every other
    root above them: the least such, or past all roots for a prefix of only 0xff."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return b"\xff" * (ROOT_BYTES + 1)
    return stripped[:-1] + bytes([stripped[-1] + 1])


def _kept_table(stamps: bool) -> str:
    """Where a kept tree of content roots, or of stamp roots, is (schema 3, 6)."""
    return "stamp_sealed" if stamps else "sealed"


def _fsdecode(raw: bytes) -> str:
    return raw.decode(_ENCODING, _ERRORS)


class UnusableIndex(sqlite3.DatabaseError):
    """The index was made by another rdc or with other parameters: rebuild it."""


# Error codes that say nothing about the database itself: another process holds the lock,
# the disk is full, a file cannot be opened or read. Deleting the index would not help, and
# would pull it from under whoever else is using it.
_TRANSIENT = {
    sqlite3.SQLITE_PERM, sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_NOMEM,
    sqlite3.SQLITE_READONLY, sqlite3.SQLITE_INTERRUPT, sqlite3.SQLITE_IOERR,
    sqlite3.SQLITE_FULL, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_PROTOCOL,
    sqlite3.SQLITE_AUTH,
}


def unusable(exc: sqlite3.DatabaseError) -> bool:
    """Whether ``exc`` means the index itself is bad (corrupt, foreign, another schema), so
    that deleting and rebuilding it is the cure."""
    if isinstance(exc, UnusableIndex):
        return True
    code = getattr(exc, "sqlite_errorcode", None)
    return code is None or code & 0xFF not in _TRANSIENT


@contextlib.contextmanager
def _write_transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """``BEGIN IMMEDIATE``: the write lock from the start, so what is read inside holds."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        if conn.in_transaction:  # (SQLite rolls back by itself on some errors: a full disk)
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _statements(sql: str) -> Iterator[str]:
    """The statements of a schema file, one at a time (``executescript`` would commit the
    transaction they must run in)."""
    pending = ""
    for line in sql.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            yield pending
            pending = ""
    if pending.strip() and not pending.lstrip().startswith("--"):
        yield pending


def _migrations() -> list[tuple[int, str]]:
    sql_dir = resources.files("rdc.local.index") / "sql"
    out = []
    for entry in sql_dir.iterdir():
        if entry.name.endswith(".sql"):
            out.append((int(entry.name.split(".")[0]), entry.read_text()))
    return sorted(out)


_INSERT = ("INSERT INTO file (path, size, mtime_ns, inode, mode, root, sketch, tree, racy) "
           "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)")
# ... and where the trait lists are not in memory (nothing to take a replaced row's traits
# out of): a row already at the path is deleted by the insert itself, not looked up first
# by a statement of its own (a twentieth of a cold scan's time, on an index with no rows).
_REPLACE = _INSERT.replace("INSERT", "INSERT OR REPLACE", 1)


class IndexDatabase:
    """Connection and queries. Paths are relative, '/'-separated ``str`` (surrogate-escaped
    like ``os.fsdecode``), stored as the bytes on disk."""

    def __init__(
        self,
        location: str | os.PathLike[str],
        params: SignatureParams = DEFAULT_SIGNATURE,
        busy_timeout: float | None = None,
    ) -> None:
        self.location = Path(location)
        self.params = params
        self._traits: TraitLists | None = None  # the trait table in memory, once asked
        self._traits_version = -1
        self.busy_timeout = BUSY_TIMEOUT if busy_timeout is None else busy_timeout
        self.location.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.conn = self._open()
        except sqlite3.DatabaseError as exc:
            if not unusable(exc):
                raise
            self._discard()
            self.conn = self._open()

    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.location, timeout=self.busy_timeout, isolation_level=None,
            check_same_thread=False,
        )
        try:
            self._use_wal(conn)
            if faults.INDEX_PAGES:  # a test's full state directory
                conn.execute(f"PRAGMA max_page_count={faults.INDEX_PAGES:d}")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute(f"PRAGMA wal_autocheckpoint={WAL_PAGES:d}")
            conn.execute("PRAGMA foreign_keys=ON")
            # Another process (or thread) may be creating this index right now: the version
            # is read, and the schema made, inside one write transaction.
            with _write_transaction(conn):
                self._prepare(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _use_wal(self, conn: sqlite3.Connection) -> None:
        """Switch a new database to WAL. Two connections switching at once would deadlock on
        their read locks, so SQLite fails one at once instead of waiting: that one retries."""
        deadline = time.monotonic() + self.busy_timeout
        pause = 0.001
        while True:
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as exc:
                if exc.sqlite_errorcode != sqlite3.SQLITE_BUSY or time.monotonic() > deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, 0.05)

    def _prepare(self, conn: sqlite3.Connection) -> None:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise UnusableIndex(f"index schema {version} is newer than this rdc")
        for number, sql in _migrations():
            if number > version:
                for statement in _statements(sql):
                    conn.execute(statement)
                conn.execute(f"PRAGMA user_version={number}")
        tag = params_tag(self.params)
        stored = conn.execute("SELECT value FROM meta WHERE key='params'").fetchone()
        if stored is None:
            conn.execute("INSERT INTO meta VALUES ('params', ?)", (tag,))
        elif stored[0] != tag:
            raise UnusableIndex("index built with other signature parameters")

    def _discard(self) -> None:
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{self.location}{suffix}")

    def rebuild(self) -> None:
        """Start from an empty index (after a database error)."""
        self._traits = None
        self.conn.close()
        self._discard()
        self.conn = self._open()

    def close(self) -> None:
        self.conn.close()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """A write transaction; if it rolls back, the trait lists in memory (which the
        writes inside kept in step) are dropped with it."""
        try:
            with _write_transaction(self.conn) as conn:
                yield conn
        except BaseException:
            self._traits = None
            raise

    # ------------------------------------------------------------ reads

    _COLUMNS = "id, path, size, mtime_ns, inode, mode, root, sketch, racy"

    @staticmethod
    def _row(row: tuple) -> IndexedFile:
        return IndexedFile(row[0], _fsdecode(row[1]), *row[2:8], bool(row[8]))

    def files(self) -> Iterator[IndexedFile]:
        for row in self.conn.execute(f"SELECT {self._COLUMNS} FROM file ORDER BY path"):
            yield self._row(row)

    def iter_stamps(self) -> Iterator[tuple[str, Stamped]]:
        """Every row's path and `Stamped` columns (what a refresh compares), by path."""
        make = Stamped._make
        for row in self.conn.execute(f"SELECT {_STAMPED} FROM file ORDER BY path"):
            yield _fsdecode(row[0]), make(row[1:])

    def get(self, path: str) -> IndexedFile | None:
        row = self.conn.execute(
            f"SELECT {self._COLUMNS} FROM file WHERE path = ?", (os.fsencode(path),)
        ).fetchone()
        return self._row(row) if row else None

    def get_many(self, paths: list[str]) -> dict[str, IndexedFile]:
        """The rows of those of ``paths`` that have one, by path (a few queries for many
        paths)."""
        return {row.path: row for row in map(self._row, self._by_paths(self._COLUMNS, paths))}

    def stamps_and_roots_of(self, paths: list[str]) -> dict[str, tuple[Stamped, bytes]]:
        """The `Stamped` columns and the root of those of ``paths`` that have a row, by
        path (one read of the rows where a rescan needs both)."""
        make = Stamped._make
        return {_fsdecode(row[0]): (make(row[1:-1]), row[-1])
                for row in self._by_paths(_STAMPED + ", root", paths)}

    def roots_of(self, paths: list[str]) -> dict[str, bytes]:
        """The roots of those of ``paths`` that have a row."""
        return {_fsdecode(path): root for path, root in self._by_paths("path, root", paths)}

    def _by_paths(self, columns: str, paths: list[str]) -> Iterator[tuple]:
        return self._where_in(columns, "path", [os.fsencode(p) for p in paths])

    def _where_in(self, columns: str, key: str, values: list) -> Iterator[tuple]:
        """``columns`` of the rows whose ``key`` is one of ``values``, 500 at a query."""
        for i in range(0, len(values), 500):
            chunk = values[i : i + 500]
            marks = ",".join("?" * len(chunk))
            yield from self.conn.execute(
                f"SELECT {columns} FROM file WHERE {key} IN ({marks})", chunk)

    def by_id(self, file_id: int) -> IndexedFile | None:
        row = self.conn.execute(
            f"SELECT {self._COLUMNS} FROM file WHERE id = ?", (file_id,)
        ).fetchone()
        return self._row(row) if row else None

    def unsure(self) -> dict[str, Stamp]:
        """The files found with another content than their stat said (bit rot), with that
        stat: while a file still has it, its stat does not vouch for its content."""
        return {_fsdecode(path): Stamp(size, mtime, inode) for path, size, mtime, inode
                in self.conn.execute("SELECT path, size, mtime_ns, inode FROM unsure")}

    def note_unsure(self, path: str, st: FileStat) -> None:
        """Note a file whose content changed under this stat (`unsure`)."""
        with self.transaction():
            self.conn.execute("INSERT OR REPLACE INTO unsure VALUES (?, ?, ?, ?)",
                              (os.fsencode(path), *stamp(st)))

    def with_root(self, root: bytes, limit: int = -1) -> list[IndexedFile]:
        """Files with this content root, by path; at most ``limit`` (-1: all). Asked once
        per received file, and the empty file's root alone can have hundreds."""
        rows = self.conn.execute(
            f"SELECT {self._COLUMNS} FROM file WHERE {_BY_ROOT} = ? AND root = ? "
            "ORDER BY path LIMIT ?",
            (root[:ROOT_KEY], root, limit),
        )
        return [self._row(r) for r in rows]

    def with_roots(self, roots: list[bytes], limit: int = -1) -> dict[bytes, list[str]]:
        """`with_root` of many roots: paths by root, at most ``limit`` each (-1: all). A
        root shorter than a whole one is a prefix (a batch's offer may name a root so):
        its paths are those of the roots that start with it, under the prefix."""
        out: dict[bytes, list[str]] = {}
        distinct = list(dict.fromkeys(roots))
        wanted = [root for root in distinct if len(root) == ROOT_BYTES]
        self._with_prefixes([root for root in distinct if root and len(root) != ROOT_BYTES],
                            limit, out)
        for i in range(0, len(wanted), 500):
            chunk = wanted[i : i + 500]
            marks = ",".join("?" * len(chunk))
            for path, root in self.conn.execute(
                f"SELECT path, root FROM file WHERE {_BY_ROOT} IN ({marks}) "
                f"AND root IN ({marks}) ORDER BY path",
                [root[:ROOT_KEY] for root in chunk] + chunk,
            ):
                found = out.setdefault(root, [])
                if limit < 0 or len(found) < limit:
                    found.append(_fsdecode(path))
        return out

    def _with_prefixes(self, prefixes: list[bytes], limit: int,
                       out: dict[bytes, list[str]]) -> None:
        """Paths by prefix into ``out`` (at most ``limit`` each) of the roots that start
        with each of ``prefixes``: one range of the root index per prefix, many in one
        statement."""
        for i in range(0, len(prefixes), 250):
            chunk = prefixes[i : i + 250]
            # The index holds the keys' first ROOT_KEY bytes: the range of those, then
            # the range of whole roots within it.
            ranges = [value for prefix in chunk
                      for low, high in [(prefix, _next_prefix(prefix))]
                      for value in (low, high, low[:ROOT_KEY], high[:ROOT_KEY])]
            rows = self.conn.execute(
                "WITH wanted(low, high, key_low, key_high) AS (VALUES "
                + ",".join(["(?, ?, ?, ?)"] * len(chunk))
                + f") SELECT wanted.low, file.path FROM wanted JOIN file ON {_BY_ROOT} "
                f">= wanted.key_low AND {_BY_ROOT} <= wanted.key_high AND file.root >= "
                "wanted.low AND file.root < wanted.high ORDER BY file.path", ranges)
            for prefix, path in rows:
                found = out.setdefault(prefix, [])
                if limit < 0 or len(found) < limit:
                    found.append(_fsdecode(path))

    def packed_trees(self, ids: list[int]) -> dict[int, tuple[str, bytes]]:
        """The path and packed tree of those of ``ids`` still in the index, by id (a few
        queries for many ids; `tree` unpacks and checks one)."""
        return {file_id: (_fsdecode(path), blob)
                for file_id, path, blob in self._where_in("id, path, tree", "id", ids)}

    def tree(self, file_id: int) -> Tree:
        """The stored tree, checked: TreeFormatError if it does not add up, or if the row
        is gone. Another connection to this index may delete it between two statements:
        the daemon keeps a replaced directory's old replica for its current users while a
        new one serves the same path, and both write this file (a fuzzed rm and mkdir of
        an opened directory made a seed's row vanish: a TypeError, an internal error)."""
        row = self.conn.execute("SELECT tree FROM file WHERE id = ?", (file_id,)).fetchone()
        if row is None:
            raise TreeFormatError(f"file {file_id} is no longer in the index")
        return unpack_tree(row[0], self.params.groups)

    def candidates(
        self,
        sketch: bytes,
        threshold: int = CANDIDATE_THRESHOLD,
        limit: int = CANDIDATE_LIMIT,
        exclude: int | None = None,
        upto: int | None = None,
    ) -> list[tuple[int, int]]:
        """Files sharing at least ``threshold`` traits with ``sketch``, best first:
        ``(file id, matching traits)``; only those of id at most ``upto``, if given."""
        if upto is not None and upto <= 0:
            return []
        return self._trait_lists().candidates(sketch, threshold, limit, exclude, upto)

    def max_id(self) -> int:
        """The largest file id (0 for none): every file indexed later has a larger one."""
        return self.conn.execute("SELECT MAX(id) FROM file").fetchone()[0] or 0

    def seed_threshold(self) -> int:
        """The common traits a seed candidate needs: CANDIDATE_THRESHOLD, more in a large
        index (`traits.seed_threshold`)."""
        return seed_threshold(self._trait_lists().files, CANDIDATE_THRESHOLD)

    def seed_candidates(self, wanted: list[tuple[bytes, int | None]],
                        limit: int = CANDIDATE_LIMIT) -> list[list[tuple[int, int]]]:
        """`candidates` at the `seed_threshold` of each (sketch, id to leave out), the
        lists and the threshold looked up once for all."""
        lists = self._trait_lists()
        threshold = seed_threshold(lists.files, CANDIDATE_THRESHOLD)
        return [lists.candidates(sketch, threshold, limit, exclude) for sketch, exclude in wanted]

    def _trait_lists(self) -> TraitLists:
        """The trait lists in memory: loaded on first use, and again after another
        connection committed (SQLite's ``data_version`` changes only for those)."""
        version = self.conn.execute("PRAGMA data_version").fetchone()[0]
        if self._traits is None or version != self._traits_version:
            self._traits = TraitLists.load(self.conn)
            self._traits_version = version
        return self._traits

    def _forget_traits(self, rows: list[tuple[int, bytes | None]]) -> None:
        """Rows (id, sketch) about to be deleted: out of the lists too."""
        if self._traits is not None:
            for file_id, sketch in rows:
                if sketch is not None:
                    self._traits.remove(file_id, sketch)

    def roots(self) -> dict[str, bytes]:
        """Every file's root by path."""
        return dict(self.iter_roots())

    def iter_roots(self) -> Iterator[tuple[str, bytes]]:
        """Every file's (path, root), as read (in no order)."""
        for path, root in self.conn.execute("SELECT path, root FROM file"):
            yield _fsdecode(path), root

    def cached_hashes(self, fingerprint: bytes) -> tuple[bytes, bytes, bytes] | None:
        """The root hashes sealed for a walk with this fingerprint, if they are still the
        last ones and no file was racy then."""
        row = self.conn.execute("SELECT value FROM meta WHERE key = 'tree'").fetchone()
        if row is None:
            return None
        stored, *hashes = row[0].split()
        if stored != fingerprint.hex() or len(hashes) != 3:
            return None
        return tuple(bytes.fromhex(h) for h in hashes)  # type: ignore[return-value]

    def holds_hashes(self) -> bool:
        """Whether root hashes of some sealed walk are cached (`cached_hashes`)."""
        return self.conn.execute("SELECT 1 FROM meta WHERE key = 'tree'").fetchone() is not None

    def cache_hashes(self, fingerprint: bytes | None, hashes: tuple[bytes, ...]) -> None:
        """Remember the root hashes of a sealed walk; none (``fingerprint`` None, or a racy
        file whose content stat cannot vouch for) forgets them, and the kept tree."""
        racy = self.conn.execute("SELECT 1 FROM file WHERE racy = 1 LIMIT 1").fetchone()
        if fingerprint is None or racy:
            self.conn.execute("DELETE FROM meta WHERE key = 'tree'")
            self.conn.execute("DELETE FROM sealed")
            return
        value = " ".join([fingerprint.hex(), *(h.hex() for h in hashes)])
        self.conn.execute("INSERT OR REPLACE INTO meta VALUES ('tree', ?)", (value,))

    def keep_tree(self, fingerprint: bytes, salt: bytes, packed: bytes,
                  stamps: bool = False) -> None:
        """Keep the packed tree sealed for the walk with ``fingerprint`` (rdc.local.sealed):
        written into its place, not bound as a value (which SQLite copies: for 100,000
        files, 9 MB more at a first copy's peak). ``stamps``: a tree of stamp roots, kept
        apart."""
        table = _kept_table(stamps)
        self.conn.execute(f"INSERT OR REPLACE INTO {table} VALUES (1, ?, ?, zeroblob(?))",
                          (fingerprint, salt, len(packed)))
        with self.conn.blobopen(table, "tree", 1) as blob:
            blob.write(packed)

    def kept_tree(self, salt: bytes, stamps: bool = False) -> tuple[bytes, bytes] | None:
        """The fingerprint and packed tree kept for a walk with these exclude patterns."""
        row = self.conn.execute(f"SELECT fingerprint, tree FROM {_kept_table(stamps)} "
                                "WHERE salt = ?", (salt,)).fetchone()
        return (row[0], row[1]) if row else None

    def kept_fingerprint(self, salt: bytes, stamps: bool = False) -> bytes | None:
        """The fingerprint of the tree kept for these exclude patterns, if one is."""
        row = self.conn.execute(f"SELECT fingerprint FROM {_kept_table(stamps)} "
                                "WHERE salt = ?", (salt,)).fetchone()
        return row[0] if row else None

    def forget_tree(self, stamps: bool = False) -> None:
        self.conn.execute(f"DELETE FROM {_kept_table(stamps)}")

    def count(self) -> int:
        return self.conn.execute("SELECT COUNT(*) FROM file").fetchone()[0]

    # ------------------------------------------------------------ writes (in a transaction)

    def put_rows(self, rows: Sequence[Row]) -> None:
        """A row for each file, a few statements for them all (two statements a file were a
        tenth of a first copy's index work); of a path given twice, the last. A path's old
        row is replaced; where the trait lists are loaded, old rows go first, 500 paths a
        statement, to take their traits out (a scan's refresh needs no lists, and looking
        up and deleting each row first was a fifth of its writes)."""
        last = {row[0]: row for row in rows}
        fresh = list(last.values())
        if self._traits is None:  # a path's old row is replaced as the new one goes in
            self.conn.executemany(_REPLACE, fresh)
            return
        encoded = list(last)
        # Old rows go with their traits in the same statement (RETURNING).
        for i in range(0, len(encoded), 500):
            some = encoded[i : i + 500]
            gone = self.conn.execute(f"DELETE FROM file WHERE path IN "
                                     f"({','.join('?' * len(some))}) RETURNING id, sketch", some)
            self._forget_traits(gone.fetchall())
        # A new row's id is one past the largest (SQLite's rule, which the lists' id order
        # rests on too: `TraitLists.remove`), so a batch's ids follow on from it, and no
        # second look-up of every path is needed for its traits.
        first = self.conn.execute("SELECT coalesce(max(id), 0) + 1 FROM file").fetchone()[0]
        self.conn.executemany(_INSERT, fresh)
        sketched = [(first + k, row[6]) for k, row in enumerate(fresh) if row[6] is not None]
        self._traits.add_many([file_id for file_id, _ in sketched],
                              [sketch for _, sketch in sketched])

    def move(self, file_id: int, path: str, st: FileStat, racy: bool) -> None:
        """A file rdc renamed itself (a move op) keeps its signature: it knows the content
        did not change, where a scan cannot tell a rename from a new file on a reused inode
        (`rdc.local.index.update`)."""
        self._forget_traits(list(self.conn.execute(
            "SELECT id, sketch FROM file WHERE path = ? AND id != ?", (os.fsencode(path), file_id)
        )))
        self.conn.execute(
            "DELETE FROM file WHERE path = ? AND id != ?", (os.fsencode(path), file_id)
        )
        self.conn.execute(
            "UPDATE file SET path = ?, mtime_ns = ?, mode = ?, racy = ? WHERE id = ?",
            (os.fsencode(path), mtime_ns(st), st.st_mode, int(racy), file_id),
        )

    def touch(self, file_id: int, st: FileStat, racy: bool) -> None:
        self.conn.execute(
            "UPDATE file SET mode = ?, racy = ? WHERE id = ?", (st.st_mode, int(racy), file_id)
        )

    def restamp(self, file_id: int, st: os.stat_result) -> None:
        """rdc itself changed this file's metadata (or replaced it by a copy of itself);
        its content is what the row says."""
        self.conn.execute(
            "UPDATE file SET mtime_ns = ?, inode = ?, mode = ? WHERE id = ?",
            (mtime_ns(st), st.st_ino, st.st_mode, file_id),
        )

    def restamp_many(self, changed: list[tuple[str, FileStat, FileStat]]) -> None:
        """`restamp` of each (path, lstat before, lstat after) whose row described the file
        before (`IndexedFile.describes`), in one statement: rdc changed its metadata."""
        self.conn.executemany(
            "UPDATE file SET mtime_ns = ?, inode = ?, mode = ? "
            "WHERE path = ? AND racy = 0 AND size = ? AND mtime_ns = ? AND inode = ?",
            [(mtime_ns(after), after.st_ino, after.st_mode, os.fsencode(path),
              before.st_size, mtime_ns(before), before.st_ino)
             for path, before, after in changed],
        )

    def delete(self, file_id: int) -> None:
        self._forget_traits(list(self.conn.execute(
            "SELECT id, sketch FROM file WHERE id = ?", (file_id,))))
        self.conn.execute("DELETE FROM file WHERE id = ?", (file_id,))

    def delete_tree(self, path: str) -> None:
        """Forget ``path`` and every path below it ('/' sorts just before '0')."""
        encoded = os.fsencode(path)
        where = "path = ? OR (path >= ? AND path < ?)"
        bounds = (encoded, encoded + b"/", encoded + b"0")
        self._forget_traits(list(self.conn.execute(
            f"SELECT id, sketch FROM file WHERE {where}", bounds)))
        self.conn.execute(f"DELETE FROM file WHERE {where}", bounds)
