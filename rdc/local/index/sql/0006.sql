-- Version 6: the tree of stamp roots (rdc.local.stamproots) of the last sync by them, as
-- `sealed` keeps a tree of content roots: a side synced by stamps starts its next walk
-- from it (rdc.local.replica, `Replica.kept_stamps`) instead of walking its whole tree
-- again. Only a tree with no racy file and no unsure one. At most one row.
CREATE TABLE stamp_sealed (
    one INTEGER PRIMARY KEY CHECK (one = 1),
    fingerprint BLOB NOT NULL,
    salt BLOB NOT NULL,
    tree BLOB NOT NULL
) STRICT;
