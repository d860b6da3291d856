"""Chunk hashes, pure-Python reference: the specification that ``blake3_impl.c`` must match
bit for bit. It is blake3 itself (blake3-py), one call per chunk.

The C version hashes many chunks in one call without the GIL; both accept the same input
and raise ValueError for the same mistakes.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

import blake3

Buffer = bytes | bytearray | memoryview

MAX_CHUNK = 1 << 20  # rdc's chunks never exceed it (rdc.params.MAX_CHUNK_LIMIT)


def hash_chunks(
    data: Buffer,
    ends: Sequence[int],
    start: int = 0,
    path: str | None = None,
    context: str | None = None,
) -> tuple[bytes, array]:
    """Packed BLAKE3 hashes (32 bytes each) and lengths of the chunks of ``data`` that end
    at ``ends`` (offsets into ``data``, non-decreasing), the first starting at ``start``;
    with ``context``, in BLAKE3's derive-key mode under that context string. ``path`` names
    a C code path and is ignored here."""
    del path
    view = memoryview(data).cast("B")
    if context is None:
        b3 = blake3.blake3
    else:

        def b3(piece: memoryview) -> blake3.blake3:
            return blake3.blake3(piece, derive_key_context=context)

    out = []
    lengths = array("Q")
    s = start
    for e in ends:
        if not s <= e <= len(view):
            raise ValueError("ends must be non-decreasing, from start, within the data")
        if e - s > MAX_CHUNK:
            raise ValueError("a chunk is longer than 1 MiB")
        out.append(b3(view[s:e]).digest())
        lengths.append(e - s)
        s = e
    return b"".join(out), lengths
