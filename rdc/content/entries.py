"""Entry lists as they travel: hash prefixes and lengths, packed.

A list of n entries is two byte strings: the n hash prefixes of ``prefix`` bytes each,
concatenated, and the n lengths as LEB128 varints. Wire entries carry a prefix of the hash,
not all 32 bytes: a target matches them only against its seeds (thousands of entries, so an
8-byte prefix leaves about one false match in 10^15 lookups), and the root in the offer
(all 32 bytes, or 16 in a batch's offer) checks the rebuilt file end to end.
docs/formats.md section 3 has the figures.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

from rdc.params import WIRE_PREFIX


def put_varint(value: int, out: bytearray) -> None:
    """Append ``value`` (>= 0) to ``out`` as an LEB128 varint."""
    if value < 0:
        raise ValueError("varints are not negative")
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def read_varint(data: bytes | memoryview, pos: int) -> tuple[int, int]:
    """The varint at ``pos`` of ``data`` and the position after it; ValueError if it is
    cut short or longer than 64 bits."""
    shift = result = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("truncated or overlong varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def pack_varints(values: Sequence[int]) -> bytes:
    out = bytearray()
    for value in values:
        put_varint(value, out)
    return bytes(out)


def unpack_varints(data: bytes, count: int, limit: int = 1 << 62) -> array:
    """``count`` varints from ``data``, each at most ``limit``; the data must hold exactly
    them (it came from a peer)."""
    values = array("Q")
    value = shift = 0
    for byte in data:
        value |= (byte & 0x7F) << shift
        if byte & 0x80:
            shift += 7
            if shift > 63:
                raise ValueError("overlong varint")
            continue
        if value > limit:
            raise ValueError("length over the limit")
        values.append(value)
        value = shift = 0
    if shift or len(values) != count:
        raise ValueError("varint list does not hold the announced count")
    return values


def prefixes(hashes: bytes, prefix: int = WIRE_PREFIX, size: int = 32) -> bytes:
    """The first ``prefix`` bytes of each ``size``-byte hash in ``hashes``."""
    if prefix == size:
        return hashes
    return b"".join(hashes[i : i + prefix] for i in range(0, len(hashes), size))
