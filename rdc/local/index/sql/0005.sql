-- Version 5: files found to hold another content than their row said although their stat
-- had not changed (bit rot), with that stat. While a file still has it, a sync by stamp
-- roots gives it its true root (rdc.local.stamproots): the stat says nothing of it.
CREATE TABLE unsure (
    path BLOB PRIMARY KEY,
    size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    inode INTEGER NOT NULL
) STRICT;
