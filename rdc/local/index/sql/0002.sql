-- Version 2: the trait lists live in memory only (rdc/local/index/traits.py), loaded from
-- the sketch column. The trait table cost 12 rows in two B-trees per file written, and
-- loading it read 12 rows per file where the sketch column holds the same 12 bytes in one.
DROP INDEX trait_file;
DROP TABLE trait;
