-- Version 1 of the signature index: one database per synced root (DESIGN.md section 5).
-- The index is a cache: every value here can be recomputed from the files.

CREATE TABLE meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
) STRICT;

CREATE TABLE file (
    id INTEGER PRIMARY KEY,
    path BLOB NOT NULL UNIQUE,      -- relative to the root, '/'-separated, as on disk (bytes)
    size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    inode INTEGER NOT NULL,
    mode INTEGER NOT NULL,
    root BLOB NOT NULL,             -- 32-byte Merkle root of the content
    sketch BLOB,                    -- 12 traits, one byte each; NULL for an empty file
    tree BLOB NOT NULL,             -- packed tree, docs/formats.md section 2
    racy INTEGER NOT NULL DEFAULT 0 -- modified too recently to trust size+mtime next time
) STRICT;

-- "Have it": a file with this content anywhere under the root is copied, not sent.
CREATE INDEX file_root ON file(root);
-- Renames: a vanished path whose inode reappears under a new name keeps its signature.
CREATE INDEX file_inode ON file(inode);

-- The 12 inverted indices of the sketches, as one table keyed by trait * 64 + value.
-- WITHOUT ROWID clusters each bucket's files together, so a query reads 12 short ranges.
CREATE TABLE trait (
    bucket INTEGER NOT NULL,
    file_id INTEGER NOT NULL REFERENCES file(id) ON DELETE CASCADE,
    PRIMARY KEY (bucket, file_id)
) STRICT, WITHOUT ROWID;

-- Deleting a file deletes its traits; this index makes that cascade cheap.
CREATE INDEX trait_file ON trait(file_id);
