-- Version 3: the tree sealed last, packed (rdc/local/sealed.py), with the fingerprint of
-- the walk it was sealed for and the salt of its exclude patterns: the next scan starts
-- from it and lists again only the directories whose stamps changed. At most one row.
CREATE TABLE sealed (
    one INTEGER PRIMARY KEY CHECK (one = 1),
    fingerprint BLOB NOT NULL,
    salt BLOB NOT NULL,
    tree BLOB NOT NULL
) STRICT;
