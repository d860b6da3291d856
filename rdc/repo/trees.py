"""Snapshot trees in the repository: dir blobs (a directory's entries, with each file as
the children of its Merkle root), node blobs (the inner nodes of large files' trees) and
the meta blob (every entry's mode and mtime), docs/formats.md section 8.

A dir blob's id is rdc's directory content hash (section 5) and a node's its tree node hash
(section 2): the repository stores rdc's own Merkle trees, and every tree blob read is
checked against its id.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Iterator
from typing import Protocol

import blake3

from rdc import _native
from rdc.content.tree import HASH_BYTES, Tree, node_hash
from rdc.local.paths import PathError, check_relpath
from rdc.local.snapshot import Entry, entries_below
from rdc.params import CONTENT_CONTEXT, DEFAULT_GROUPS
from rdc.records import record
from rdc.repo import msg
from rdc.repo.blobs import Kind, meta_id, read_varint

KIND_CODES = {"f": 0, "d": 1, "l": 2}
KIND_NAMES = {code: kind for kind, code in KIND_CODES.items()}
MAX_LEVEL = 64


def encode_values(values: list[int]) -> tuple[list[int], bytes]:
    """``[table, index]``: the distinct values ascending, and one index per value (1 byte
    each for at most 256 distinct values, else 2 bytes big-endian). Times and modes of a
    tree take few distinct values, so the meta blob costs about a byte an entry before
    compression."""
    table = sorted(set(values))
    at = {t: i for i, t in enumerate(table)}
    if len(table) <= 256:
        return table, bytes(at[t] for t in values)
    return table, b"".join(at[t].to_bytes(2, "big") for t in values)


def decode_values(table: list[int], index: bytes) -> list[int]:
    """Inverse of `encode_values`; raises ValueError if the index does not fit the table."""
    width = 1 if len(table) <= 256 else 2
    if len(index) % width:
        raise ValueError("value index has a partial entry")
    out = []
    for i in range(0, len(index), width):
        k = int.from_bytes(index[i : i + width], "big")
        if k >= len(table):
            raise ValueError("value index points past its table")
        out.append(table[k])
    return out


class BlobLoader(Protocol):
    """What reading a tree needs of a repository: a blob by kind and plain id, checked, and
    a dir blob's entries."""

    def load(self, kind: Kind, plain_id: bytes) -> bytes: ...

    def load_dir(self, plain_id: bytes) -> list[DirEntry]: ...


@record
class FileRef:
    """A file's content as a dir blob holds it: the children of its tree's root."""

    level: int
    hashes: bytes
    lengths: tuple[int, ...]

    @property
    def root(self) -> bytes:
        return node_hash(self.level, self.hashes, self.lengths)

    @property
    def size(self) -> int:
        return sum(self.lengths)

    def children(self) -> list[bytes]:
        return [self.hashes[i : i + HASH_BYTES] for i in range(0, len(self.hashes), HASH_BYTES)]

    @classmethod
    def of_tree(cls, tree: Tree) -> FileRef:
        below = tree.levels[-2]
        return cls(len(tree.levels), below.hashes, tuple(below.lengths))


@record
class DirEntry:
    """One entry of a dir blob. ``name`` is fsdecoded (surrogate escapes for non-UTF-8)."""

    name: str
    kind: str  # "f", "d" or "l"
    file: FileRef | None = None
    content: bytes = b""  # directories: content hash (the dir blob's plain id)
    target: str = ""  # links

    def digest(self) -> bytes:
        if self.kind == "f":
            assert self.file is not None
            return self.file.root
        if self.kind == "d":
            return self.content
        return os.fsencode(self.target)


def _varint(n: int, out: bytearray) -> None:
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def content_hash(entries: list[DirEntry]) -> bytes:
    """rdc's directory content hash over entries in name-byte order (docs/formats.md
    section 5; `rdc.local.snapshot.seal` computes the same over a walked tree)."""
    out = bytearray()
    for entry in entries:
        raw = os.fsencode(entry.name)
        _varint(len(raw), out)
        out += raw
        out += entry.kind.encode()
        digest = entry.digest()
        if entry.kind == "l":
            _varint(len(digest), out)
        out += digest
    return blake3.blake3(out, derive_key_context=CONTENT_CONTEXT).digest()


def encode_dir(entries: list[DirEntry]) -> bytes:
    """The dir blob of entries in name-byte order."""
    items: list[list] = []
    for e in entries:
        name = os.fsencode(e.name)
        if e.kind == "f":
            assert e.file is not None
            items.append([name, 0, e.file.level, e.file.hashes, list(e.file.lengths)])
        elif e.kind == "d":
            items.append([name, 1, e.content])
        else:
            items.append([name, 2, os.fsencode(e.target)])
    return msg.pack([1, items])


def decode_dir(data: bytes) -> list[DirEntry]:
    """The entries of a dir blob; ValueError unless every field is well-formed and the
    names are single path components in strictly ascending byte order."""
    value = msg.unpack(data)
    if not (isinstance(value, list) and len(value) == 2 and value[0] == 1
            and isinstance(value[1], list)):
        raise ValueError("not a dir blob of version 1")
    entries = []
    previous = None
    for item in value[1]:
        if not (isinstance(item, list) and len(item) >= 3 and isinstance(item[0], bytes)
                and item[1] in KIND_NAMES):
            raise ValueError("malformed dir entry")
        raw = item[0]
        if b"/" in raw:
            raise ValueError(f"entry name {raw!r} holds a '/'")
        try:
            name = check_relpath(raw)
        except PathError as exc:
            raise ValueError(str(exc)) from None
        if previous is not None and raw <= previous:
            raise ValueError("dir entries out of order or repeated")
        previous = raw
        kind = KIND_NAMES[item[1]]
        if kind == "f":
            if not (len(item) == 5 and isinstance(item[2], int) and 2 <= item[2] <= MAX_LEVEL
                    and isinstance(item[3], bytes) and isinstance(item[4], list)
                    and len(item[3]) == HASH_BYTES * len(item[4])
                    and all(isinstance(n, int) and n >= 0 for n in item[4])):
                raise ValueError(f"malformed file entry {raw!r}")
            if item[2] > 2 and not item[4]:
                raise ValueError(f"file entry {raw!r} above level 2 without children")
            entries.append(DirEntry(name, kind, FileRef(item[2], item[3], tuple(item[4]))))
        elif kind == "d":
            if not (len(item) == 3 and isinstance(item[2], bytes) and len(item[2]) == HASH_BYTES):
                raise ValueError(f"malformed directory entry {raw!r}")
            entries.append(DirEntry(name, kind, content=item[2]))
        else:
            if not (len(item) == 3 and isinstance(item[2], bytes) and item[2]
                    and b"\0" not in item[2]):
                raise ValueError(f"malformed link entry {raw!r}")
            entries.append(DirEntry(name, kind, target=os.fsdecode(item[2])))
    return entries


# ---------------------------------------------------------------- file trees


def encode_node(level: int, hashes: bytes | memoryview, lengths: list[int] | array) -> bytes:
    out = bytearray([level])
    for i, length in enumerate(lengths):
        out += hashes[HASH_BYTES * i : HASH_BYTES * (i + 1)]
        _varint(length, out)
    return bytes(out)


def decode_node(data: bytes) -> tuple[int, bytes, list[int]]:
    """(level, child hashes, child lengths) of a node blob; ValueError if malformed."""
    if not data or not 2 <= data[0] <= MAX_LEVEL:
        raise ValueError("node blob without a plausible level")
    hashes = bytearray()
    lengths = []
    pos = 1
    while pos < len(data):
        if pos + HASH_BYTES > len(data):
            raise ValueError("truncated node entry")
        hashes += data[pos : pos + HASH_BYTES]
        length, pos = read_varint(data, pos + HASH_BYTES)
        lengths.append(length)
    if not lengths:
        raise ValueError("node blob without children")
    return data[0], bytes(hashes), lengths


def inner_nodes(tree: Tree) -> Iterator[tuple[bytes, bytes]]:
    """(plain id, node blob) of every node of a file's tree but its root, top level first,
    so a walk from the root meets each node before its children."""
    groups = DEFAULT_GROUPS
    for k in range(len(tree.levels) - 2, 0, -1):
        below, level = tree.levels[k - 1], tree.levels[k]
        cuts = _native.group_cuts(below.hashes, groups.min_entries, groups.max_entries)
        if len(cuts) != len(level):
            raise AssertionError("tree levels do not match their grouping")
        start = 0
        for j, end in enumerate(cuts):
            yield level.hash(j), encode_node(
                k + 1, below.hashes[HASH_BYTES * start : HASH_BYTES * end],
                below.lengths[start:end])
            start = end


def leaves(ref: FileRef, loader: BlobLoader) -> tuple[bytes, list[int]]:
    """The chunk hashes (packed) and lengths of a file, reading its inner nodes."""
    if ref.level == 2:
        return ref.hashes, list(ref.lengths)
    hashes = bytearray()
    lengths: list[int] = []
    stack = [(ref.level - 1, h, n) for h, n in zip(ref.children(), ref.lengths, strict=True)]
    stack.reverse()
    while stack:
        level, node, length = stack.pop()
        got_level, child_hashes, child_lengths = decode_node(loader.load(Kind.NODE, node))
        if got_level != level or sum(child_lengths) != length:
            raise ValueError(f"node {node.hex()[:16]} does not fit its place in the file")
        if level == 2:
            hashes += child_hashes
            lengths += child_lengths
            continue
        children = [child_hashes[i : i + HASH_BYTES]
                    for i in range(0, len(child_hashes), HASH_BYTES)]
        stack.extend(reversed([(level - 1, h, n)
                               for h, n in zip(children, child_lengths, strict=True)]))
    return bytes(hashes), lengths


# ---------------------------------------------------------------- metadata


def encode_meta(root: Entry) -> tuple[bytes, bytes]:
    """(plain id, meta blob) of a walked tree: every entry's mtime and mode below ``root``
    in depth-first name order."""
    entries = [entry for _, entry in entries_below(root)]
    mtimes, mtime_index = encode_values([e.mtime_ns for e in entries])
    modes, mode_index = encode_values([e.mode for e in entries])
    data = msg.pack([1, mtimes, mtime_index, modes, mode_index])
    return meta_id(data), data


def decode_meta(data: bytes) -> tuple[list[int], list[int]]:
    """(mtimes, modes) of a meta blob; ValueError if malformed."""
    value = msg.unpack(data)
    if not (isinstance(value, list) and len(value) == 5 and value[0] == 1
            and all(isinstance(v, list) for v in (value[1], value[3]))
            and all(isinstance(v, bytes) for v in (value[2], value[4]))
            and all(isinstance(t, int) for t in value[1] + value[3])):
        raise ValueError("not a meta blob of version 1")
    mtimes = decode_values(value[1], value[2])
    modes = decode_values(value[3], value[4])
    if len(mtimes) != len(modes):
        raise ValueError("meta blob with vectors of two lengths")
    return mtimes, modes


# ---------------------------------------------------------------- reading a snapshot


@record
class Item:
    """One entry of a snapshot with its path, mode and mtime."""

    path: str
    entry: DirEntry
    mode: int
    mtime_ns: int


def walk(loader: BlobLoader, tree: bytes, meta: bytes | None) -> Iterator[Item]:
    """Every entry below the dir blob ``tree`` in depth-first name order, with its mode and
    time from the meta blob (zeros if ``meta`` is None). ValueError if they disagree."""
    times: list[int] = []
    modes: list[int] = []
    if meta is not None:
        times, modes = decode_meta(loader.load(Kind.META, meta))
    position = 0
    stack: list[tuple[str, Iterator[DirEntry]]] = [("", iter(loader.load_dir(tree)))]
    while stack:
        prefix, entries = stack[-1]
        entry = next(entries, None)
        if entry is None:
            stack.pop()
            continue
        path = f"{prefix}/{entry.name}" if prefix else entry.name
        if meta is not None:
            if position >= len(times):
                raise ValueError("the meta blob has fewer entries than the tree")
            mode, mtime = modes[position], times[position]
        else:
            mode = mtime = 0
        position += 1
        yield Item(path, entry, mode, mtime)
        if entry.kind == "d":
            stack.append((path, iter(loader.load_dir(entry.content))))
    if meta is not None and position != len(times):
        raise ValueError("the meta blob has more entries than the tree")
