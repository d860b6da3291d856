"""This machine's trees: safe file access, paths, stat stamps, walks and directory hashes,
ignore rules, the signature index, the replica of one directory. May import: rdc.content
and below."""
