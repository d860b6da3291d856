"""A file's signature: its Merkle tree over chunk hashes, and its similarity sketch.

Chunk data is hashed as it is read, in bounded memory, on all cores (`rdc.content.leaves`). A file
of fewer than `SKETCH_MIN_LEAVES` chunks is sketched over its sub-chunks instead of its
chunks, so that a small file that was moved and edited still resembles its old self.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterator, Sequence
from typing import BinaryIO

import blake3

from rdc import _native
from rdc.content.chunking import boundaries
from rdc.content.leaves import (
    READ_SIZE,
    SEGMENT_SIZE,
    Buffer,
    Segment,
    hash_chunks,
    leaf_level,
    positional,
    segments_of_buffer,
    segments_of_file,
)
from rdc.content.sketch import Sketch
from rdc.content.tree import HASH_BYTES, PACKED_HEAD, Level, Tree, build_tree
from rdc.params import (
    DEFAULT_SIGNATURE,
    NODE_CONTEXT,
    SKETCH_MIN_LEAVES,
    SUB_PARAMS,
    ChunkParams,
    SignatureParams,
)
from rdc.records import record


@record
class FileSignature:
    tree: Tree
    sketch: Sketch | None

    @property
    def root(self) -> bytes:
        return self.tree.root

    @property
    def size(self) -> int:
        return self.tree.size


def chunk_hash(data: bytes | memoryview) -> bytes:
    return blake3.blake3(data).digest()


def sub_chunks(data: bytes | memoryview, params: ChunkParams = SUB_PARAMS) -> Level:
    """Entries of the sub-chunks of one chunk (or of a small file)."""
    return Level(*hash_chunks(data, boundaries(data, params)))


def sketch_for(leaves: Level, small_data: bytes | None, params: SignatureParams) -> Sketch | None:
    """Sketch over the leaves, or over the sub-chunks when the file has few leaves (then
    ``small_data`` holds its whole content)."""
    if len(leaves) < SKETCH_MIN_LEAVES and small_data is not None:
        return _native.sketch(sub_chunks(small_data, params.sub_chunks).hashes)
    return _native.sketch(leaves.hashes)


def _small_limit(params: SignatureParams) -> int:
    """Files up to this size may have fewer than `SKETCH_MIN_LEAVES` leaves."""
    return SKETCH_MIN_LEAVES * params.chunks.max_size


def _signature(segments: Iterator[Segment], params: SignatureParams) -> FileSignature:
    leaves, content = leaf_level(segments, params.chunks, _small_limit(params))
    return FileSignature(build_tree(leaves, params.groups), sketch_for(leaves, content, params))


def _signed_at_once(data: Buffer, params: SignatureParams, sketch: bool
                    ) -> tuple[Tree, Sketch | None]:
    """The tree and (with ``sketch``) the sketch of one segment's worth of bytes, in one
    native call: the same levels and traits as the steps above (`_native.sign_buffer`)."""
    assert _native.sign_buffer is not None
    levels, traits = _native.sign_buffer(data, *_native_params(params), sketch)
    return _tree(levels), traits


def _native_params(params: SignatureParams) -> tuple:
    """The signing parameters as the native calls take them, after the data."""
    c, s, g = params.chunks, params.sub_chunks, params.groups
    return ((c.window, c.min_size, c.max_size), (s.window, s.min_size, s.max_size),
            (g.min_entries, g.max_entries), SKETCH_MIN_LEAVES, _CONTEXT)


def _tree(levels: list[tuple[bytes, array]]) -> Tree:
    return Tree(tuple(Level(hashes, lengths) for hashes, lengths in levels))


# (mode, size, mtime_ns, inode) of a file: the fields rdc.local.filestat.Seen names.
StatFields = tuple[int, int, int, int]


# What an index records of a file (rdc.local.index.db.Row): (path, size, mtime_ns, inode,
# mode, root, sketch, packed tree, racy).
IndexRow = tuple[bytes, int, int, int, int, bytes, Sketch | None, bytes, int]


def index_rows_of_files(
    files: Sequence[tuple[int, bytes]], limit: int, racy_from: int,
    params: SignatureParams = DEFAULT_SIGNATURE, beneath: bool = False,
) -> list[IndexRow | None] | None:
    """Each (directory descriptor, path) of ``files`` (its path from the index's root, the
    last component its name in that directory) opened (no link followed), read whole and
    signed in one native call without the GIL, as the row the index stores of it: racy if
    its mtime is ``racy_from`` or later or its stat moved while it was read. None for a
    file that is not a regular file of at most ``limit`` bytes read cleanly (the caller's
    one-file path reads it and reports why). None in all if there is no native code (read
    them one at a time). The tree is packed (`rdc.content.tree.pack_tree`) with no object
    made for its levels, and the row with none made for its stat (a cold scan spent a fifth
    of its Python time making the levels, and then a third of what was left making rows).
    With ``beneath``, each descriptor is the root's instead, and the call opens the path's
    directory below it (no link followed), once per run of files in one."""
    if _native.sign_files is None:
        return None
    assert limit <= SEGMENT_SIZE  # (one segment: the tree of `signature_of_bytes`)
    return _native.sign_files(files, limit, PACKED_HEAD, *_native_params(params),
                              racy_from=racy_from, beneath=beneath)


def signatures_and_contents_of_files(
    files: Sequence[tuple[int, bytes]], limit: int, params: SignatureParams = DEFAULT_SIGNATURE,
    beneath: bool = False,
) -> list[tuple[StatFields, FileSignature, StatFields, bytes] | None] | None:
    """`index_rows_of_files` for a source that sends what it reads (each a name in its
    directory, or with ``beneath`` a path below the root's descriptor): each file's stat
    fields before and after the read and its signature as `signature_of_bytes` makes it,
    with the bytes read, in one native call without the GIL (a first copy's client spent
    a sixth of its Python time reading and signing its small files one call at a time).
    None in all if there is no native code."""
    if _native.sign_files is None:
        return None
    assert limit <= SEGMENT_SIZE
    out: list[tuple[StatFields, FileSignature, StatFields, bytes] | None] = []
    for one in _native.sign_files(files, limit, PACKED_HEAD, *_native_params(params),
                                  keep=True, beneath=beneath):
        if one is None:
            out.append(None)
            continue
        before, (levels, sketch), after, data = one
        out.append((before, FileSignature(_tree(levels), sketch), after, data))
    return out


_CONTEXT = NODE_CONTEXT.encode()


def signature_of_file(
    f: BinaryIO,
    params: SignatureParams = DEFAULT_SIGNATURE,
    read_size: int = READ_SIZE,
    segment_size: int = SEGMENT_SIZE,
) -> FileSignature:
    """Signature of an open binary file, read once from its current position in bounded
    memory; large files are chunked and hashed on all cores (`rdc.content.leaves`), and a
    regular file of at most ``read_size`` bytes is read whole and signed in one native
    call (most files of a tree: their signing cost a third as much)."""
    limit = min(read_size, segment_size)
    if _native.sign_buffer is not None and (at := positional(f)) is not None:
        _, start, size = at
        if size <= limit:
            data = f.read(limit + 1)
            if len(data) <= limit:
                return signature_of_bytes(data, params, segment_size)
            f.seek(start)  # it grew meanwhile: streamed after all
    segments = segments_of_file(f, segment_size, read_size, _small_limit(params))
    return _signature(segments, params)


def signature_of_path(path: str, params: SignatureParams = DEFAULT_SIGNATURE) -> FileSignature:
    with open(path, "rb") as f:
        return signature_of_file(f, params)


def signature_of_bytes(
    data: bytes, params: SignatureParams = DEFAULT_SIGNATURE, segment_size: int = SEGMENT_SIZE
) -> FileSignature:
    if _native.sign_buffer is not None and len(data) <= segment_size:
        return FileSignature(*_signed_at_once(data, params, True))
    return _signature(segments_of_buffer(data, segment_size), params)


def tree_of_bytes(
    data: bytes, params: SignatureParams = DEFAULT_SIGNATURE, segment_size: int = SEGMENT_SIZE
) -> Tree:
    """The tree alone, without the sketch (a second pass over a small file's sub-chunks):
    what a target checks received content with, taking the sketch the source offered."""
    if _native.sign_buffer is not None and len(data) <= segment_size:
        return _signed_at_once(data, params, False)[0]
    leaves, _ = leaf_level(segments_of_buffer(data, segment_size), params.chunks)
    return build_tree(leaves, params.groups)


def leaf_set(tree: Tree) -> set[bytes]:
    leaves = tree.leaves
    return {leaves.hashes[i : i + HASH_BYTES] for i in range(0, len(leaves.hashes), HASH_BYTES)}


def sketch_elements(tree: Tree, read_all: Callable[[], bytes]) -> set[bytes]:
    """The set a file's sketch samples: its leaf hashes, or, for a file of few leaves, the
    hashes of its sub-chunks (``read_all`` gives its content)."""
    if len(tree.leaves) >= SKETCH_MIN_LEAVES:
        return leaf_set(tree)
    subs = sub_chunks(read_all())
    return {subs.hash(i) for i in range(len(subs))}


def jaccard(a: set[bytes], b: set[bytes]) -> float:
    union = len(a | b)
    return len(a & b) / union if union else 1.0
