"""Index objects: the trailers of some packs, collected, so that a client learns what a
repository holds from a few objects instead of a read of every pack."""

from __future__ import annotations

from dataclasses import dataclass

import blake3
import zstandard

from rdc.repo import msg
from rdc.repo.blobs import ID_BYTES, Entry, pack_entries, unpack_entries
from rdc.repo.crypto import Crypto
from rdc.repo.packs import MAGIC

INDEX_AAD = b"rdc index"
MAX_INDEX = 1 << 30


@dataclass(frozen=True)
class PackInfo:
    """A pack as an index object describes it."""

    pack_id: bytes
    size: int
    entries: list[Entry]


def encode_index(packs: list[PackInfo], crypto: Crypto) -> tuple[str, bytes]:
    """(object name, content) of an index object for ``packs``."""
    body = msg.pack([1, [[p.pack_id, p.size, pack_entries(p.entries)] for p in packs]])
    data = crypto.seal(zstandard.ZstdCompressor(level=3).compress(body), INDEX_AAD)
    return f"index/{blake3.blake3(data).hexdigest()}", data


def decode_index(data: bytes, crypto: Crypto) -> list[PackInfo]:
    """The packs of an index object; ValueError or `Unauthentic` if it does not parse."""
    try:
        body = zstandard.ZstdDecompressor().decompress(crypto.open(data, INDEX_AAD),
                                                       max_output_size=MAX_INDEX)
    except zstandard.ZstdError as exc:
        raise ValueError(f"zstd: {exc}") from None
    value = msg.unpack(body)
    if not (isinstance(value, list) and len(value) == 2 and value[0] == 1
            and isinstance(value[1], list)):
        raise ValueError("not an index object of version 1")
    packs = []
    for item in value[1]:
        if not (isinstance(item, list) and len(item) == 3 and isinstance(item[0], bytes)
                and len(item[0]) == ID_BYTES and isinstance(item[1], int)
                and isinstance(item[2], bytes)):
            raise ValueError("malformed pack in an index object")
        packs.append(PackInfo(item[0], item[1], unpack_entries(item[2], len(MAGIC), item[1])))
    return packs
