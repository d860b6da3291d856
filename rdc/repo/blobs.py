"""Blobs as the index knows them: kinds, record encodings, and the binary *entry* that
describes one record in a pack's trailer and in index objects (docs/formats.md section 8)."""

from __future__ import annotations

import enum

import blake3

from rdc.records import record

ID_BYTES = 32
SKETCH_BYTES = 12
MAX_DEPTH = 8  # deltas a writer chains at most
READ_DEPTH = 64  # deltas a reader follows at most
META_CONTEXT = "rdc 2026-11 repository meta v1"
_SKETCH_FLAG = 0x10


class Kind(enum.IntEnum):
    CHUNK = 0
    NODE = 1
    DIR = 2
    META = 3

    @property
    def in_data_pack(self) -> bool:
        return self is Kind.CHUNK


class Encoding(enum.IntEnum):
    STORED = 0
    ZSTD = 1
    DELTA = 2


@record
class Entry:
    """One record: where it is in its pack and what it holds."""

    kind: Kind
    encoding: Encoding
    sid: bytes  # storage id
    offset: int
    length: int  # of the record
    size: int  # of the blob
    base: bytes | None = None  # deltas: the base's storage id
    depth: int = 0
    sketch: bytes | None = None

    @property
    def end(self) -> int:
        return self.offset + self.length


def meta_id(content: bytes) -> bytes:
    return blake3.blake3(content, derive_key_context=META_CONTEXT).digest()


def _varint(value: int, out: bytearray) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def read_varint(data: bytes | memoryview, pos: int) -> tuple[int, int]:
    """(value, position after it); ValueError if truncated or longer than 63 bits."""
    shift = value = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("truncated or overlong varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def pack_entries(entries: list[Entry]) -> bytes:
    """A varint count, then each entry."""
    out = bytearray()
    _varint(len(entries), out)
    for e in entries:
        flags = int(e.kind) | int(e.encoding) << 2 | (_SKETCH_FLAG if e.sketch else 0)
        out.append(flags)
        out += e.sid
        _varint(e.offset, out)
        _varint(e.length, out)
        _varint(e.size, out)
        if e.encoding is Encoding.DELTA:
            assert e.base is not None
            out += e.base
            out.append(e.depth)
        if e.sketch:
            out += e.sketch
    return bytes(out)


def unpack_entries(data: bytes | memoryview, start: int, limit: int,
                   contiguous: bool = False) -> list[Entry]:
    """Entries packed by `pack_entries`: every record must lie in ``[start, limit)``, and,
    if ``contiguous`` (a pack's trailer), follow the one before it, the first at ``start``.
    ValueError if the data does not parse exactly."""
    view = memoryview(data)
    count, pos = read_varint(view, 0)
    if count > len(view):
        raise ValueError("entry count larger than the data")
    entries = []
    expected = start
    for _ in range(count):
        if pos + 1 + ID_BYTES > len(view):
            raise ValueError("truncated entry")
        flags = view[pos]
        if flags & ~0x1F or (flags >> 2) & 3 == 3:
            raise ValueError(f"unknown entry flags {flags:#x}")
        kind, encoding = Kind(flags & 3), Encoding((flags >> 2) & 3)
        sid = bytes(view[pos + 1 : pos + 1 + ID_BYTES])
        offset, pos = read_varint(view, pos + 1 + ID_BYTES)
        length, pos = read_varint(view, pos)
        size, pos = read_varint(view, pos)
        base, depth = None, 0
        if encoding is Encoding.DELTA:
            if pos + ID_BYTES + 1 > len(view):
                raise ValueError("truncated delta entry")
            base = bytes(view[pos : pos + ID_BYTES])
            depth = view[pos + ID_BYTES]
            pos += ID_BYTES + 1
            if not 1 <= depth <= READ_DEPTH:
                raise ValueError(f"delta depth {depth} out of range")
        sketch = None
        if flags & _SKETCH_FLAG:
            if pos + SKETCH_BYTES > len(view):
                raise ValueError("truncated sketch")
            sketch = bytes(view[pos : pos + SKETCH_BYTES])
            pos += SKETCH_BYTES
        if offset < start or offset + length > limit:
            raise ValueError("record outside its pack")
        if contiguous and offset != expected:
            raise ValueError("records of a pack do not follow each other")
        entries.append(Entry(kind, encoding, sid, offset, length, size, base, depth, sketch))
        expected = offset + length
    if pos != len(view):
        raise ValueError("trailing bytes after the entries")
    return entries
