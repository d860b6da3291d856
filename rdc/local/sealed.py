"""A sealed tree kept in the index between processes, so that the next scan starts from it.

A sync of a large tree with few changes used to build the whole tree again in every new
process: a walk that listed and stat'ed every directory in Python, every file's row looked
up, every directory hashed (2.2 s of a client's 1%-edited push of 100,000 files, and the
same again on the server, which opens a share's replica anew for each session). The
stamp walked in C (`rdc._native.stamp_tree`) gives each directory's stamp; with the tree
sealed last at hand, with its own stamps, only the directories whose stamps differ are
listed again (`rdc.local.rescan.patch`), and a tree whose top stamp is unchanged is taken
as it is.

The tree is packed one directory at a time, each a `marshal` record behind its length (4
bytes, little-endian), in depth-first order, so that neither end holds more than the
packed bytes and one directory's tuples besides the tree (one record of the whole tree was
30 MB of tuples for 100,000 files, on top of the tree, at a server's peak). The length
lets each record be read by `marshal.loads` from a slice: `marshal.load` from a stream
calls the stream's ``readinto`` for every field, which was two thirds of unpacking (20,000
files: 0.105 -> 0.035 s; version 2 had no lengths). The records go behind a version byte
and a BLAKE3 hash of them, checked before anything is unpacked: the index is a cache, and
a damaged one is dropped, never trusted (a tree of an older version too: the next scan
walks in full once). `_entry` is the specification of unpacking; the C extension does the
same without the Python loop (`rdc._native._entries`: 100,000 files 0.11 -> 0.08 s, the
rest is marshal's reading and the objects themselves).
"""

from __future__ import annotations

import io
import marshal

import blake3

from rdc import _native
from rdc.local.snapshot import NO_CHILDREN, Entry

VERSION = b"\x03"
_MARSHAL = 4  # the marshal format (stable across the Pythons rdc runs on)


class Damaged(ValueError):
    """A packed tree that does not check out or does not unpack."""


def pack(tree: Entry) -> bytes:
    """``tree`` (sealed, with every directory's stamp in ``seen``) as bytes."""
    out = io.BytesIO()
    out.write(VERSION + bytes(32))  # the hash goes in its place: no second copy of a
    _pack(tree, out)                # body of 10 MB or so (at a first copy's peak)
    view = out.getbuffer()
    view[1:33] = blake3.blake3(view[33:]).digest()
    view.release()
    return out.getvalue()


def _pack(d: Entry, out: io.BytesIO) -> None:
    """Directory ``d``'s record (a subdirectory's item is None), then each subdirectory's,
    in the order of its names."""
    names, items, below = [], [], []
    for name, e in d.children.items():
        names.append(name)
        if e.kind == "f":
            items.append((e.mode, e.mtime_ns, e.size, e.root, e.ino))
        elif e.kind == "l":
            items.append((e.mtime_ns, e.target, e.ino))
        else:
            items.append(None)
            below.append(e)
    record = marshal.dumps((d.mode, d.mtime_ns, d.ino, d.content, d.meta, d.smeta, d.count,
                            d.seen, tuple(names), tuple(items)), _MARSHAL)
    out.write(len(record).to_bytes(4, "little"))
    out.write(record)
    for e in below:
        _pack(e, out)


def unpack(data: bytes) -> Entry:
    """The tree `pack` made; Damaged if ``data`` is not such a tree."""
    if len(data) < 33 or data[:1] != VERSION:
        raise Damaged("not a packed tree of this version")
    body = memoryview(data)[33:]
    if blake3.blake3(body).digest() != data[1:33]:
        raise Damaged("its hash does not match")
    try:
        if _native.unpack_sealed is not None:
            tree, at = _native.unpack_sealed(body, Entry, NO_CHILDREN)
        else:
            records = _Records(body)
            tree, at = _entry(records), records.at
    except (ValueError, TypeError, EOFError, IndexError) as exc:
        raise Damaged(str(exc) or type(exc).__name__) from None
    if at != len(body):
        raise Damaged("bytes after the tree")
    return tree


class _Records:
    """The length-prefixed records of a packed tree, one at a time."""

    def __init__(self, body: memoryview) -> None:
        self.body, self.at = body, 0

    def next(self) -> tuple:
        end = self.at + 4 + int.from_bytes(self.body[self.at : self.at + 4], "little")
        if end > len(self.body) or end < self.at + 5:
            raise EOFError("a record runs past the end")
        record = marshal.loads(self.body[self.at + 4 : end])
        self.at = end
        return record


# The types of a directory record's fields, and of a file's and a link's item: a body its
# hash vouches for but no packer made (a bug of rdc's, or marshal's back-references
# making a field a tuple that holds itself) is refused, not made an entry of odd values.
_DIRECTORY = (int, int, int, bytes, bytes, bytes, int, bytes, tuple, tuple)
_FILE = (int, int, int, bytes, int)
_LINK = (int, str, int)
# Directories deeper than this are refused (the walk makes at most MAX_DEPTH levels; Python
# recursion stays well within its limit). The C unpacking has the same bound.
DEPTH_LIMIT = 512


def _typed(values: object, types: tuple[type, ...]) -> bool:
    return (type(values) is tuple and len(values) == len(types)
            and all(type(v) is t for v, t in zip(values, types, strict=True)))


def _entry(records: _Records, depth: int = 1) -> Entry:
    if depth > DEPTH_LIMIT:
        raise ValueError("a tree deeper than any walk makes")
    record = records.next()
    if not _typed(record, _DIRECTORY):
        raise ValueError("a directory record of the wrong form")
    mode, mtime, ino, content, meta, smeta, count, seen, names, items = record
    if len(names) != len(items):
        raise ValueError("names and items of different lengths")
    children: dict[str, Entry] = {}
    for name, item in zip(names, items, strict=True):  # (positional: a third quicker)
        if type(name) is not str:
            raise ValueError("a name that is not a string")
        if item is None:
            children[name] = _entry(records, depth + 1)
        elif _typed(item, _FILE):
            mode_, mtime_, size, root, ino_ = item
            children[name] = Entry("f", mode_, mtime_, size, root, "", NO_CHILDREN, b"", b"",
                                   b"", 0, ino_)
        elif _typed(item, _LINK):
            mtime_, target, ino_ = item
            children[name] = Entry("l", 0, mtime_, 0, b"", target, NO_CHILDREN, b"", b"",
                                   b"", 0, ino_)
        else:
            raise ValueError("an entry of an unknown form")
    if not seen or not content:
        raise ValueError("a directory without its hashes or stamp")
    return Entry("d", mode, mtime, children=children, content=content, meta=meta,
                 smeta=smeta, count=count, ino=ino, seen=seen)
