"""A sealed tree kept in the index between processes, so that the next scan starts from it.

A sync of a large tree with few changes used to build the whole tree again in every new
process: a walk that listed and stat'ed every directory in Python, every file's row looked
up, every directory hashed (2.2 s of a client's 1%-edited push of 100,000 files, and the
same again on the server, which opens a share's replica anew for each session). The
stamp walked in C (`rdc._native.stamp_tree`) gives each directory's stamp; with the tree
sealed last at hand, with its own stamps, only the directories whose stamps differ are
listed again (`rdc.local.rescan.patch`), and a tree whose top stamp is unchanged is taken
as it is.

The tree is packed as nested tuples with `marshal` (C speed both ways: 100,000 entries in
about 0.1 s each way), behind a version byte and a BLAKE3 hash of the rest, checked
before anything is unpacked: the index is a cache, and a damaged one is dropped, never
trusted.
"""

from __future__ import annotations

import marshal

import blake3

from rdc.local.snapshot import Entry

VERSION = b"\x01"
_MARSHAL = 4  # the marshal format (stable across the Pythons rdc runs on)


class Damaged(ValueError):
    """A packed tree that does not check out or does not unpack."""


def pack(tree: Entry) -> bytes:
    """``tree`` (sealed, with every directory's stamp in ``seen``) as bytes."""
    body = marshal.dumps(_packed(tree), _MARSHAL)
    return VERSION + blake3.blake3(body).digest() + body


def _packed(d: Entry) -> tuple:
    names, items = [], []
    for name, e in d.children.items():
        names.append(name)
        if e.kind == "f":
            items.append((e.mode, e.mtime_ns, e.size, e.root, e.ino))
        elif e.kind == "l":
            items.append((e.mtime_ns, e.target, e.ino))
        else:
            items.append(_packed(e))
    return (d.mode, d.mtime_ns, d.ino, d.content, d.meta, d.smeta, d.count, d.seen,
            tuple(names), tuple(items))


def unpack(data: bytes) -> Entry:
    """The tree `pack` made; Damaged if ``data`` is not such a tree."""
    if len(data) < 33 or data[:1] != VERSION:
        raise Damaged("not a packed tree of this version")
    body = memoryview(data)[33:]
    if blake3.blake3(body).digest() != data[1:33]:
        raise Damaged("its hash does not match")
    try:
        return _entry(marshal.loads(body))
    except (ValueError, TypeError, EOFError) as exc:
        raise Damaged(str(exc)) from None


def _entry(t: tuple) -> Entry:
    mode, mtime, ino, content, meta, smeta, count, seen, names, items = t
    children: dict[str, Entry] = {}
    for name, item in zip(names, items, strict=True):
        n = len(item)
        if n == 5:
            children[name] = Entry("f", item[0], item[1], item[2], item[3], ino=item[4])
        elif n == 3:
            children[name] = Entry("l", 0, item[0], target=item[1], ino=item[2])
        else:
            children[name] = _entry(item)
    if not seen or not content:
        raise ValueError("a directory without its hashes or stamp")
    return Entry("d", mode, mtime, children=children, content=content, meta=meta,
                 smeta=smeta, count=count, ino=ino, seen=seen)

