-- Version 1 of a client's local index of one repository (docs/formats.md section 8).
-- A cache: everything here comes from the repository's index objects and packs, or from
-- this client's own backups (the file cache), and is rebuilt when lost.

CREATE TABLE meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
) STRICT;

-- The index objects read so far; their packs and blobs go when they leave the repository.
CREATE TABLE index_object (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE
) STRICT;

CREATE TABLE pack (
    id INTEGER PRIMARY KEY,
    name BLOB NOT NULL UNIQUE,      -- 32-byte pack id
    size INTEGER NOT NULL
) STRICT;

-- Which index objects name a pack (prune writes a new one before deleting the old).
CREATE TABLE pack_index (
    pack INTEGER NOT NULL REFERENCES pack(id) ON DELETE CASCADE,
    index_object INTEGER NOT NULL REFERENCES index_object(id) ON DELETE CASCADE,
    PRIMARY KEY (pack, index_object)
) STRICT, WITHOUT ROWID;
-- Dropping an index object finds its packs through this.
CREATE INDEX pack_index_object ON pack_index(index_object);

-- Every record by storage id; a blob may have copies in several packs.
CREATE TABLE blob (
    sid BLOB NOT NULL,
    pack INTEGER NOT NULL REFERENCES pack(id) ON DELETE CASCADE,
    offset INTEGER NOT NULL,
    length INTEGER NOT NULL,
    size INTEGER NOT NULL,
    kind INTEGER NOT NULL,
    encoding INTEGER NOT NULL,
    base BLOB,
    depth INTEGER NOT NULL,
    sketch BLOB,
    PRIMARY KEY (sid, pack)
) STRICT, WITHOUT ROWID;
-- Deleting a pack deletes its records; restore and prune read a pack's records together.
CREATE INDEX blob_pack ON blob(pack);

-- Super-features of chunk sketches: an exact-match inverted index, one lookup per
-- feature. Rows whose blob has left are skipped by the join and swept after drops.
CREATE TABLE similar (
    feature INTEGER NOT NULL,
    sid BLOB NOT NULL,
    PRIMARY KEY (feature, sid)
) STRICT, WITHOUT ROWID;

-- Which chunk followed which in the files this client read (the first time it saw each):
-- a new chunk after a known one is tried against the known one's successor first, the
-- backup stream's locality (Shilane et al.'s "stream-informed" deltas).
CREATE TABLE follows (
    sid BLOB PRIMARY KEY,
    next BLOB NOT NULL
) STRICT, WITHOUT ROWID;

-- The file cache: per source directory, what a file was when it was last backed up.
CREATE TABLE file (
    source BLOB NOT NULL,
    path BLOB NOT NULL,
    size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    inode INTEGER NOT NULL,
    level INTEGER NOT NULL,
    hashes BLOB NOT NULL,           -- the children of the file's root, 32 bytes each
    lengths BLOB NOT NULL,          -- their lengths, varints
    PRIMARY KEY (source, path)
) STRICT, WITHOUT ROWID;

-- Snapshot records read so far, by object name.
CREATE TABLE snapshot (
    name TEXT PRIMARY KEY,
    record BLOB NOT NULL
) STRICT;
