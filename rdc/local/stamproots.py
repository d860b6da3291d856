"""Stamp roots: rsync's quick check, made hierarchical (docs/protocol.md, "stamps").

A side whose index does not know its files (a first sync of trees copied by other means, a
lost cache) would read every file to learn its root, where rsync ``-a`` compares sizes and
times and reads nothing it need not. Between peers that agree on it, such a sync gives
every file a *stamp root* in place of its content root: a keyed hash of its size and
modification time. Directories are sealed over those as usual, so a subtree whose files
have the same names, sizes and times on both sides has the same content hash on both and
is never looked into; a file whose stamp differs is listed, read when it is offered, and
sent or found already there like any changed file. A file modified less than RACY_NS
before the walk keeps its true root (read now): a later write could keep its stamp.

Stamp roots are never stored in the index's rows, nor kept or cached as the tree's
hashes: a later sync that reads compares true roots. A cold side keeps its last tree of
them apart (`Replica.keep_stamps`), as a cache of what stat gives, for its next sync by
stamps to start from.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Iterable, Mapping

import blake3

from rdc.local.filestat import Stamp
from rdc.local.index.update import RACY_NS
from rdc.local.snapshot import Entry, iter_files, seal
from rdc.params import STAMP_ROOT_CONTEXT

_KEY = blake3.blake3(b"", derive_key_context=STAMP_ROOT_CONTEXT).digest()
_STAMP = struct.Struct("<Qq")

TrueRoots = Callable[[list[str]], dict[str, bytes]]


def stamp_root(size: int, mtime_ns: int) -> bytes:
    """The stamp root of a file of ``size`` bytes modified at ``mtime_ns``: 32 bytes that
    no content root equals (a keyed hash of another input)."""
    return blake3.blake3(_STAMP.pack(size, mtime_ns), key=_KEY).digest()


def racy_from() -> int:
    """Files modified at this time or later keep their true roots."""
    return time.time_ns() - RACY_NS


def stamped(tree: Entry, true_roots: TrueRoots, limit: int,
            unsure: Mapping[str, Stamp] | None = None, in_place: bool = False) -> Entry:
    """A copy of ``tree`` (a walk's, or a sealed one: it is not changed) with stamp roots,
    sealed; with ``in_place``, ``tree`` itself, a walk's (unsealed, without roots: a
    walk of 100,000 files is not copied again). The files modified at ``limit`` or later
    keep their true roots: from ``true_roots`` (paths -> roots of those it could read);
    one it could not read keeps its stamp root (offered, it fails to be read, and is
    reported then). Both sides of a sync use the same ``limit`` (the client's
    `racy_from`), so that a file with the same time on both gets the same kind of root.
    So do the ``unsure`` files that still have the stat they had when their content was
    found changed under it (bit rot: the index's `unsure`): the true root sets such a file
    apart from the other side's good copy, which is then sent or fetched as by content
    roots."""
    if not in_place:
        tree = _unsealed_copy(tree)
    assert not tree.content, "a sealed tree is stamped as a copy"
    restamp(((entry, path) for _, _, entry, path in iter_files(tree)), true_roots, limit,
            unsure)
    seal(tree)
    return tree


def _unsealed_copy(tree: Entry) -> Entry:
    """``tree``'s entries, stats and link targets, without roots or directory hashes."""
    top = Entry("d", tree.mode, tree.mtime_ns, ino=tree.ino, children={})
    stack = [(tree, top)]
    while stack:
        old, new = stack.pop()
        children = new.children
        for name, entry in old.children.items():
            if entry.kind == "f":
                children[name] = Entry("f", entry.mode, entry.mtime_ns, entry.size,
                                       ino=entry.ino)
            elif entry.kind == "d":
                children[name] = Entry("d", entry.mode, entry.mtime_ns, ino=entry.ino,
                                       children={})
                stack.append((entry, children[name]))
            else:
                children[name] = Entry("l", entry.mode, entry.mtime_ns, target=entry.target,
                                       ino=entry.ino)
    return top


def restamp(files: Iterable[tuple[Entry, str]], true_roots: TrueRoots, limit: int,
            unsure: Mapping[str, Stamp] | None = None) -> None:
    """Give each (entry, path) without a root its stamp root, or its true root where it
    was modified at ``limit`` or later or is ``unsure`` (as `stamped`)."""
    racy = []
    for entry, path in files:
        if entry.root:
            continue
        if entry.mtime_ns >= limit or (unsure and still_unsure(unsure, path, entry)):
            racy.append((entry, path))
        else:
            entry.root = stamp_root(entry.size, entry.mtime_ns)
    if not racy:
        return
    roots = true_roots([path for _, path in racy])
    for entry, path in racy:
        entry.root = roots.get(path) or stamp_root(entry.size, entry.mtime_ns)


def still_unsure(unsure: Mapping[str, Stamp], path: str, entry: Entry) -> bool:
    """Whether the file ``entry`` at ``path`` still has the stat its content was found
    changed under."""
    noted = unsure.get(path)
    return noted is not None and noted == (entry.size, entry.mtime_ns, entry.ino)
