"""A directory tree as both sides compare it: entries with their kinds, modes, times and
content roots, and per directory two Merkle hashes (docs/formats.md section 5).

The *content hash* of a directory covers its entries' names, kinds and contents (a file's
root, a link's target, a subdirectory's content hash); the *meta hash* covers their
permission bits and modification times; the *sync meta hash* the same without directory
times, which two-way sync leaves alone (adding a file moves its directory's time on each
side by itself, and would look like a change that is none). Two trees are compared top-down
by content hash, so an unchanged subtree costs one hash; metadata travels separately, after
the content is in step. (Modes are metadata, not content, because whole releases flip them: Django's
sdists alternate between 0644 and 0664 files, which would otherwise list every directory.)
"""

from __future__ import annotations

import operator
import os
import stat
import struct
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from stat import S_IMODE, S_ISDIR, S_ISLNK, S_ISREG

import blake3

from rdc import _native
from rdc._native import list_dir
from rdc._native.listing_ref import DIR_FLAGS, STAMP_ENTRY
from rdc.content.entries import put_varint
from rdc.local.filestat import Seen, clamp_ns, mtime_ns
from rdc.local.marker import MARKER
from rdc.local.paths import TEMP_PREFIX, is_temporary
from rdc.params import CONTENT_CONTEXT, META_CONTEXT, SYNC_META_CONTEXT

KIND_CODE = {"f": b"f", "d": b"d", "l": b"l"}


_name = operator.itemgetter(0)


class _NoChildren(Mapping[str, "Entry"]):
    """The children of a file or link: none, and none can be added (a hashable constant,
    as a dataclass default must be)."""

    def __getitem__(self, name: str) -> Entry:
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0

    __hash__ = object.__hash__


NO_CHILDREN: dict[str, Entry] = _NoChildren()  # type: ignore[assignment]


@dataclass(slots=True)
class Entry:
    """One file, link or directory. ``root`` is a file's Merkle root; ``target`` a link's
    target; ``children`` a directory's entries by name."""

    kind: str
    mode: int
    mtime_ns: int
    size: int = 0
    root: bytes = b""
    target: str = ""
    # A directory is made with its own dict (``children={}``); files and links share one
    # that cannot be written to (a dict each was 6 MB of a 100,000-file tree).
    children: dict[str, Entry] = NO_CHILDREN
    content: bytes = b""  # directories: content hash, once `seal` ran
    meta: bytes = b""  # directories: meta hash
    smeta: bytes = b""  # directories: sync meta hash (no directory times)
    count: int = 0  # directories: entries in the subtree, not counting itself
    ino: int = 0  # the inode stat saw (for `stamp`)
    seen: bytes = b""  # directories: `stamp` of the subtree, once computed

    def digest(self) -> bytes:
        """What a listing says of this entry's content: root, content hash, or link target."""
        if self.kind == "f":
            return self.root
        if self.kind == "d":
            return self.content
        return os.fsencode(self.target)

    def sorted_children(self) -> list[tuple[str, Entry]]:
        """Children in name-byte order (the canonical order of hashes and vectors). ASCII
        names sort the same as str, without encoding each (half the cost; every pass over
        a tree sorts every directory)."""
        if all(name.isascii() for name in self.children):
            return sorted(self.children.items(), key=_name)
        return sorted(self.children.items(), key=lambda item: os.fsencode(item[0]))


_MODE_TIME = struct.Struct("<Hq")  # an entry's mode and time in the meta hashes' input


def seal(directory: Entry) -> None:
    """Compute content, meta and sync meta hashes (and subtree counts) of ``directory`` and
    every directory below it that has none yet, bottom-up (a rescan reuses the sealed
    subtrees it did not list again): natively (`rdc._native._entries`), as `_seal`."""
    if _native.seal_entries is not None:
        _native.seal_entries(directory, _CONTEXTS, _hash_big)
    else:
        _seal(directory)


_CONTEXTS = (CONTENT_CONTEXT, META_CONTEXT, SYNC_META_CONTEXT)


def _hash_big(data: bytes, which: int) -> bytes:
    """The hash of a seal's (``which`` 0-2: `_CONTEXTS`) or a stamp's (3) input that is
    over the native hash's 1 MiB (a directory of about 20,000 entries)."""
    if which == 3:
        return blake3.blake3(data).digest()
    return blake3.blake3(data, derive_key_context=_CONTEXTS[which]).digest()


def _seal(directory: Entry) -> None:
    """`seal` in Python: its specification. Each entry's bytes go in with as few calls as
    possible (a rescan after 1,000 edits among 100,000 files seals a quarter of the tree
    again, on each side)."""
    content = bytearray()
    meta = bytearray()
    smeta = bytearray()
    count = 0
    children = directory.children
    plain = all(name.isascii() for name in children)  # (then str order is byte order)
    pack = _MODE_TIME.pack
    for name, entry in (sorted(children.items(), key=_name) if plain
                        else directory.sorted_children()):
        raw = name.encode() if plain else os.fsencode(name)
        if len(raw) < 0x80:
            content.append(len(raw))
        else:
            put_varint(len(raw), content)
        content += raw
        mode_time = pack(entry.mode, entry.mtime_ns)
        meta += mode_time
        kind = entry.kind
        if kind == "f":
            content += b"f"
            content += entry.root
            smeta += mode_time
        elif kind == "d":
            if not entry.content:
                _seal(entry)
            count += entry.count
            content += b"d"
            content += entry.content
            meta += entry.meta
            smeta += mode_time[:2]  # (no directory times)
            smeta += entry.smeta
        else:
            target = entry.digest()
            content += KIND_CODE[kind]
            put_varint(len(target), content)
            content += target
            smeta += mode_time
        count += 1
    directory.content = blake3.blake3(content, derive_key_context=CONTENT_CONTEXT).digest()
    directory.meta = blake3.blake3(meta, derive_key_context=META_CONTEXT).digest()
    directory.smeta = blake3.blake3(smeta, derive_key_context=SYNC_META_CONTEXT).digest()
    directory.count = count


def _empty_content() -> bytes:
    empty = Entry("d", 0, 0, children={})
    seal(empty)
    return empty.content


EMPTY_CONTENT = _empty_content()  # the content hash of an empty directory

_STAMP = STAMP_ENTRY  # kind, mode, mtime, size, inode, name length


def stamp(directory: Entry) -> bytes:
    """A fingerprint of the subtree as stat saw it: every entry's name, kind, mode, mtime,
    size, inode and link target, as a hash of hashes (a directory's covers its entries and
    its subdirectories' stamps), kept in ``seen``. Equal stamps mean that, as far as stat
    can tell, nothing changed; a rescan recomputes only the directories it listed again.
    Natively (`rdc._native._entries`), as `_stamp`."""
    if directory.seen:
        return directory.seen
    if _native.stamp_entries is not None:
        return _native.stamp_entries(directory, _hash_big)
    return _stamp(directory)


def _stamp(directory: Entry) -> bytes:
    """`stamp` in Python: its specification."""
    if directory.seen:
        return directory.seen
    parts: list[bytes] = []  # hashed in one call, not one update call per entry
    pack = _STAMP.pack
    children = directory.children
    for name in sorted(children):
        entry = children[name]
        raw = os.fsencode(name)
        parts.append(pack(KIND_CODE[entry.kind], entry.mode, entry.mtime_ns, entry.size,
                          entry.ino, len(raw)))
        parts.append(raw)
        if entry.kind == "d":
            parts.append(_stamp(entry))
        elif entry.kind == "l":
            parts.append(os.fsencode(entry.target) + b"\0")
    directory.seen = blake3.blake3(b"".join(parts)).digest()
    return directory.seen


def fingerprint(tree: Entry, salt: bytes) -> bytes:
    """What the index keys its cached root hashes on: the tree's `stamp` under ``salt``
    (the exclude patterns), and the root directory's own mode and time."""
    return fingerprint_of(tree.mode, tree.mtime_ns, tree.ino, stamp(tree), salt)


def fingerprint_of(mode: int, mtime_ns: int, ino: int, stamped: bytes, salt: bytes) -> bytes:
    """`fingerprint` of a tree whose top has this mode, time and inode and whose `stamp`
    is ``stamped``."""
    top = _STAMP.pack(b"d", mode, mtime_ns, 0, ino, 0)
    return blake3.blake3(salt + b"\0" + top + stamped).digest()


def lookup(root: Entry, path: str) -> Entry | None:
    """The entry at ``path`` ('/'-separated, "" for ``root`` itself)."""
    entry: Entry | None = root
    if not path:
        return entry
    for part in path.split("/"):
        if entry is None or entry.kind != "d":
            return None
        entry = entry.children.get(part)
    return entry


def entries_below(directory: Entry, prefix: str = "") -> list[tuple[str, Entry]]:
    """Every entry below ``directory`` in depth-first name order: an entry, then, for a
    directory, its subtree. This is the order of a whole-subtree metadata vector. (A
    list: nested generators resumed a frame per level for every entry.)"""
    out: list[tuple[str, Entry]] = []
    _below(directory, prefix, out)
    return out


def _below(directory: Entry, prefix: str, out: list[tuple[str, Entry]]) -> None:
    for name, entry in directory.sorted_children():
        path = f"{prefix}/{name}" if prefix else name
        out.append((path, entry))
        if entry.kind == "d":
            _below(entry, path, out)


# ---------------------------------------------------------------- building from disk

Exclude = Callable[[str, bool], bool]


# Directory levels below a walk's root. Deeper ones are left out, with an error: a peer can
# make a tree 2,048 levels deep within the path limit, and seal, stamp, rescans and the
# passes over a tree recurse once or twice per level, within Python's limit of 1,000.
MAX_DEPTH = 256
# (what `Scan.list` hands the native listing)
_TEMP_RAW, _MARKER_RAW = TEMP_PREFIX.encode(), os.fsencode(MARKER)


class Walk:
    """What one walk of a tree saw. ``fingerprint`` (`fingerprint`) covers every entry's
    path, kind, mode, mtime, size, inode and link target (and ``salt``, the exclude
    patterns): if it equals that of an earlier walk whose tree was sealed, the sealed
    hashes still hold, as far as stat can tell (the index's racy rule covers what it
    cannot).

    A *deferred* walk (`Walk.deferred`) knows only the fingerprint, the top directory's
    mode and time and the number of files, from a stamp computed without building the
    tree (`rdc._native.stamp_tree`): a sync that finds nothing changed needs no more. Its
    ``tree`` and ``files`` are walked when first asked for, and its fingerprint is then
    that walk's (the tree may have changed in between). ``dirs``: the stamp of each
    directory, by path, that the stamp saw (a scan starting from the tree sealed last lists
    again only those that differ); None for a walk made here."""

    def __init__(self, tree: Entry, files: dict[str, Seen], errors: list[tuple[str, str]],
                 fingerprint: bytes, temporaries: list[str]) -> None:
        self._tree: Entry | None = tree
        self._files: dict[str, Seen] | None = files
        self.errors = errors
        self.fingerprint = fingerprint
        self.temporaries = temporaries  # rdc temporaries seen (left out of everything else)
        self.top = (tree.mode, tree.mtime_ns)  # the top directory's own mode and time
        self.file_count = len(files)
        self.dirs: dict[str, bytes] | None = None
        self._load: Callable[[], Walk] | None = None

    @classmethod
    def deferred(cls, fingerprint: bytes, top: tuple[int, int], file_count: int,
                 load: Callable[[], Walk], dirs: dict[str, bytes] | None = None) -> Walk:
        walked = cls.__new__(cls)
        walked._tree = walked._files = None
        walked.dirs = dirs
        walked.errors, walked.temporaries = [], []
        walked.fingerprint, walked.top, walked.file_count = fingerprint, top, file_count
        walked._load = load
        walked._loading = threading.Lock()  # one walk, whichever thread asks first
        return walked

    @property
    def pending(self) -> bool:
        """A deferred walk not walked yet."""
        return self._tree is None

    @property
    def tree(self) -> Entry:
        if self._tree is None:
            self._walk()
        assert self._tree is not None
        return self._tree

    @property
    def files(self) -> dict[str, Seen]:
        if self._tree is None:
            self._walk()
        assert self._files is not None
        return self._files

    def _walk(self) -> None:
        assert self._load is not None
        with self._loading:
            if self._tree is None:
                self._take(self._load())

    def _take(self, done: Walk) -> None:
        self._files = done.files
        self.errors, self.fingerprint, self.temporaries = done.errors, done.fingerprint, \
            done.temporaries
        self.top, self.file_count = done.top, done.file_count
        self.dirs = None  # (the stamps of what the first look saw, not of this walk)
        self._tree = done.tree  # last: other threads take a tree as "walked, all of it"


def walk(root: str | int, exclude: Exclude | None = None, salt: bytes = b"") -> Walk:
    """The tree under ``root`` (a path, or a descriptor of the directory, which stays the
    caller's) without file roots (the index supplies those), the lstat of every regular
    file by relative path, and what could not be read: (path, reason).

    Directories are opened one component at a time from the one above (no path length
    limit, no symlink followed, no path string resolved again), depth first, holding one
    descriptor per level; every descriptor is closed whatever happens. A directory that
    cannot be opened or listed, or that was replaced by something else meanwhile, is left
    out of the tree, like an excluded one, so that nothing below it is deleted elsewhere
    on its account. Kinds that are not synced (sockets, devices, FIFOs) are skipped."""
    if isinstance(root, int):
        top_fd = os.dup(root)
    else:
        top_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    scan = Scan(exclude)
    stack: list[tuple[int, str, Entry, list]] = []  # one open directory per level
    try:
        top = os.fstat(top_fd)
        tree = Entry("d", stat.S_IMODE(top.st_mode), mtime_ns(top), ino=top.st_ino,
                     children={})
        stack.append((top_fd, "", tree, scan.list(top_fd, "", tree) or []))
        while stack:
            fd, rel_dir, node, pending = stack[-1]
            if not pending:
                stack.pop()
                if fd != top_fd:
                    os.close(fd)
                continue
            name, raw, child = pending.pop()
            rel = f"{rel_dir}/{name}" if rel_dir else name
            try:
                child_fd = os.open(raw, DIR_FLAGS, dir_fd=fd)
            except OSError as exc:  # gone, unreadable, or swapped for a link meanwhile
                scan.errors.append((rel, exc.strerror or str(exc)))
                continue
            try:
                grandchildren = scan.list(child_fd, rel, child)
            except BaseException:
                os.close(child_fd)
                raise
            if grandchildren is None:
                os.close(child_fd)
                continue
            node.children[name] = child  # listed: now it is part of the tree
            stack.append((child_fd, rel, child, grandchildren))
    finally:
        for fd, *_ in stack:
            if fd != top_fd:
                os.close(fd)
        os.close(top_fd)
    return Walk(tree, scan.files, scan.errors, fingerprint(tree, salt), scan.temporaries)


class Scan:
    """What a walk (or a rescan) collects, and the listing of one directory."""

    def __init__(self, exclude: Exclude | None) -> None:
        # Excludes without patterns (the usual case) leave out the folder marker alone
        # (temporaries are set aside first anyway): a name test here, not a call per entry.
        trivial = getattr(exclude, "patterns", None) == []
        self.exclude = None if trivial else exclude
        self.skip = MARKER if trivial else None
        self.files: dict[str, Seen] = {}
        # (name, path, entry) of the regular files of the directory listed last: a rescan
        # goes on with the same path strings (a second copy was 10 MB of a server's peak
        # after a first copy of 100,000 files).
        self.listed: list[tuple[str, str, Entry]] = []
        self.errors: list[tuple[str, str]] = []
        self.temporaries: list[str] = []

    def leaves_out(self, rel: str, is_dir: bool) -> bool:
        """Whether a listing here would leave out the entry at ``rel`` (a temporary, the
        folder marker, an excluded path)."""
        name = rel.rpartition("/")[2]
        return (name == self.skip or (name.startswith(TEMP_PREFIX) and is_temporary(name))
                or bool(self.exclude and self.exclude(rel, is_dir)))

    def list(self, fd: int, rel_dir: str, node: Entry, kept: Mapping[str, Entry] | None = None
             ) -> list[tuple[str, bytes, Entry]] | None:
        """Put the files and links of directory ``fd`` into ``node``; return its
        subdirectories to enter as (name, name on disk, entry), or None (and an error) if
        it cannot be listed. A regular file that ``kept`` (the directory's entries as last
        sealed, when stat vouches for their roots) holds with a root and the same mode,
        time, size and inode is that entry, shared, and is neither in ``files`` nor in
        ``listed``: a rescan of a directory with one edited file among 100 made 99 entries
        again to compare them with the old ones (a fifth of a 1%-edited push of 100,000
        files, on each side). Without excludes or ``kept``, the regular files and
        directories are made natively (`_native.list_entries`: half of a cold walk was this
        loop), and the loop below sees only the rest (links, errors, temporaries...)."""
        self.listed = listed = []
        exclude, skip = self.exclude, self.skip
        children = node.children
        prefix = rel_dir + "/" if rel_dir else ""
        try:
            if _native.list_entries is not None and kept is None and exclude is None:
                subdirs, items = _native.list_entries(
                    fd, prefix, children, self.files, listed, Entry, Seen, NO_CHILDREN,
                    prefix.count("/") >= MAX_DEPTH, _MARKER_RAW if skip else None,
                    _TEMP_RAW)
            else:
                subdirs, items = [], list_dir(fd)
        except OSError as exc:
            self.errors.append((rel_dir, exc.strerror or str(exc)))
            return None
        for name, mode, size, mtime, ino in items:
            rel = prefix + name
            if name.startswith(TEMP_PREFIX) and is_temporary(name):
                self.temporaries.append(rel)
                continue
            if name == skip:
                continue
            if mode < 0:
                self.errors.append((rel, os.strerror(-mode)))
                continue
            if S_ISDIR(mode):
                if exclude and exclude(rel, True):
                    continue
                if rel.count("/") >= MAX_DEPTH:
                    self.errors.append((rel, f"more than {MAX_DEPTH} levels deep"))
                    continue
                subdirs.append((name, os.fsencode(name),
                                Entry("d", S_IMODE(mode), clamp_ns(mtime), ino=ino,
                                      children={})))
                continue
            if S_ISREG(mode):
                if kept is not None:
                    was = kept.get(name)
                    if (was is not None and was.kind == "f" and was.root and was.ino == ino
                            and was.size == size and was.mtime_ns == clamp_ns(mtime)
                            and was.mode == S_IMODE(mode)):
                        children[name] = was  # (the same path: it passed the excludes)
                        continue
                if exclude and exclude(rel, False):
                    continue
                children[name] = entry = Entry("f", S_IMODE(mode), clamp_ns(mtime), size,
                                               ino=ino)
                self.files[rel] = Seen(mode, size, mtime, ino)
                listed.append((name, rel, entry))
            elif S_ISLNK(mode):
                if exclude and exclude(rel, False):
                    continue
                try:
                    target = os.fsdecode(os.readlink(name, dir_fd=fd))
                except OSError as exc:
                    self.errors.append((rel, exc.strerror or str(exc)))
                    continue
                children[name] = Entry("l", 0, clamp_ns(mtime), target=target, ino=ino)
        subdirs.reverse()  # popped from the end: entered in listing order
        return subdirs


def fill_roots(tree: Entry, roots: dict[str, bytes]) -> list[str]:
    """Put each file's root in place; files without one (unreadable) are dropped from the
    tree, and their paths returned."""
    set_roots(tree, roots.items())
    return drop_rootless(tree)


def set_roots(tree: Entry, roots: Iterable[tuple[str, bytes]]) -> None:
    """Put the root of each (path, root) that names a file of ``tree`` in place, in any
    order; other paths are ignored. (A scan streams them from its index: a dict of them
    was 16 MB of a 100,000-file scan's peak.) Paths that come by directory (the index's
    rows in the order they were written: a walk's) look their directory up once per run
    of its files, not once per file."""
    folder: str | None = None
    node: Entry | None = None
    for path, root in roots:
        parent_path, _, name = path.rpartition("/")
        if parent_path != folder:
            folder, node = parent_path, lookup(tree, parent_path)
        # (a file's or link's children are the empty NO_CHILDREN)
        entry = node.children.get(name) if node is not None else None
        if entry is not None and entry.kind == "f":
            entry.root = root


def iter_files(tree: Entry) -> Iterator[tuple[Entry, str, Entry, str]]:
    """(directory, name, entry, path) of each file, in no order: one pass over the
    directories' own dicts, not `entries_below`, whose sorting of every directory cost
    a third of a large tree's scan."""
    stack = [("", tree)]
    while stack:
        prefix, directory = stack.pop()
        for name, entry in directory.children.items():
            if entry.kind == "f":
                yield directory, name, entry, prefix + name
            elif entry.kind == "d":
                stack.append((f"{prefix}{name}/", entry))


def all_rooted(tree: Entry) -> bool:
    return all(entry.root for _, _, entry, _ in iter_files(tree))


def clear_roots(tree: Entry) -> None:
    for _, _, entry, _ in iter_files(tree):
        entry.root = b""


def drop_rootless(tree: Entry) -> list[str]:
    """Drop the files without a root (unreadable) from the tree; their paths, sorted."""
    missing = [(directory, name, path) for directory, name, entry, path in iter_files(tree)
               if not entry.root]
    for directory, name, _ in missing:
        del directory.children[name]
    return sorted(path for _, _, path in missing)


# ---------------------------------------------------------------- metadata vectors


_TIME_MODE = struct.Struct("<qq")


def files_meta(directory: Entry) -> bytes:
    """A hash of the modification times and modes of a directory's entries other than its
    subdirectories, in name order (an ``mlist`` with ``split``: docs/protocol.md): equal on
    both sides where their vectors are, but for a chance of 2^-8 per hash byte."""
    return blake3.blake3(b"".join(
        _TIME_MODE.pack(entry.mtime_ns, entry.mode)
        for _, entry in directory.sorted_children() if entry.kind != "d")).digest()


def meta_of(directory: Entry, whole: bool) -> tuple[list[int], list[int]]:
    """Modification times and modes of a directory's entries in name order, or of its whole
    subtree in depth-first name order."""
    if whole:
        entries = [entry for _, entry in entries_below(directory)]
    else:
        entries = [entry for _, entry in directory.sorted_children()]
    return [e.mtime_ns for e in entries], [e.mode for e in entries]
