"""Packs: records one after the other, then the sealed trailer that indexes them, then the
trailer's length (docs/formats.md section 8). A pack is named by the BLAKE3 hash of its
bytes, so reading it whole checks it."""

from __future__ import annotations

import struct

import blake3
import zstandard

from rdc.repo.blobs import Encoding, Entry, Kind, pack_entries, unpack_entries
from rdc.repo.crypto import Crypto

MAGIC = b"rdcpack1"
TRAILER_AAD = b"rdc trailer"
LENGTH = struct.Struct("<I")
# Packs close at this size (less the largest record): one PUT on S3.
PACK_SIZE = (16 << 20) - (64 << 10)
MAX_TRAILER = 64 << 20


def record_aad(kind: Kind, sid: bytes) -> bytes:
    return b"rdc blob" + bytes([kind]) + sid


def pack_name(pack_id: bytes) -> str:
    hex_id = pack_id.hex()
    return f"data/{hex_id[:2]}/{hex_id}"


def pack_id_of(name: str) -> bytes:
    """The id in a pack's object name; ValueError if it is not one."""
    parts = name.split("/")
    if len(parts) != 3 or parts[0] != "data" or len(parts[2]) != 64 or parts[1] != parts[2][:2]:
        raise ValueError(f"not a pack name: {name}")
    return bytes.fromhex(parts[2])


class PackWriter:
    """A pack being assembled in memory."""

    def __init__(self, crypto: Crypto) -> None:
        self.crypto = crypto
        self.parts: list[bytes] = [MAGIC]
        self.entries: list[Entry] = []
        self._position: dict[bytes, int] = {}
        self.size = len(MAGIC)

    def __len__(self) -> int:
        return len(self.entries)

    def add(
        self, kind: Kind, sid: bytes, encoding: Encoding, record: bytes, size: int,
        base: bytes | None = None, depth: int = 0, sketch: bytes | None = None,
    ) -> Entry:
        """Append the record of a blob (``record`` before sealing)."""
        sealed = self.crypto.seal(record, record_aad(kind, sid))
        entry = Entry(kind, encoding, sid, self.size, len(sealed), size, base, depth, sketch)
        self._position[sid] = len(self.parts)
        self.parts.append(sealed)
        self.entries.append(entry)
        self.size += len(sealed)
        return entry

    def add_sealed(self, entry: Entry, sealed: bytes) -> Entry:
        """Append a record copied as it is from another pack (records are bound to their
        kind and id, not to a pack)."""
        moved = Entry(entry.kind, entry.encoding, entry.sid, self.size, len(sealed),
                      entry.size, entry.base, entry.depth, entry.sketch)
        self._position[entry.sid] = len(self.parts)
        self.parts.append(sealed)
        self.entries.append(moved)
        self.size += len(sealed)
        return moved

    def record(self, entry: Entry) -> bytes:
        """The sealed record of an entry of this pack (still in memory)."""
        return self.parts[self._position[entry.sid]]

    def finish(self) -> tuple[bytes, bytes]:
        """(pack id, pack bytes)."""
        trailer = self.crypto.seal(
            zstandard.ZstdCompressor(level=3).compress(pack_entries(self.entries)), TRAILER_AAD
        )
        data = b"".join([*self.parts, trailer, LENGTH.pack(len(trailer))])
        return blake3.blake3(data).digest(), data


def parse_trailer(sealed: bytes, crypto: Crypto, limit: int) -> list[Entry]:
    """The entries of a pack from its sealed trailer (records must end by ``limit``, where
    the trailer starts). ValueError or `Unauthentic` if it does not parse."""
    try:
        plain = zstandard.ZstdDecompressor().decompress(crypto.open(sealed, TRAILER_AAD),
                                                        max_output_size=MAX_TRAILER)
    except zstandard.ZstdError as exc:
        raise ValueError(f"trailer: zstd: {exc}") from None
    entries = unpack_entries(plain, len(MAGIC), limit, contiguous=True)
    if entries and entries[-1].end != limit:
        raise ValueError("records do not end where the trailer starts")
    return entries


def parse_pack(data: bytes, crypto: Crypto) -> list[Entry]:
    """The entries of a whole pack; ValueError or `Unauthentic` if it does not parse."""
    if len(data) < len(MAGIC) + LENGTH.size or data[: len(MAGIC)] != MAGIC:
        raise ValueError("not an rdc pack")
    (length,) = LENGTH.unpack_from(data, len(data) - LENGTH.size)
    start = len(data) - LENGTH.size - length
    if not len(MAGIC) <= start:
        raise ValueError("trailer length past the start of the pack")
    return parse_trailer(data[start : len(data) - LENGTH.size], crypto, start)


def tail_span(size: int, tail: bytes) -> tuple[int, int]:
    """Where the trailer of a pack of ``size`` bytes is, from its last bytes ``tail``:
    (offset, length). ValueError if impossible."""
    (length,) = LENGTH.unpack_from(tail, len(tail) - LENGTH.size)
    start = size - LENGTH.size - length
    if start < len(MAGIC) or length > MAX_TRAILER:
        raise ValueError("trailer length out of range")
    return start, length
