"""Records: a blob stored as it is, as a zstd frame, or as a zstd frame made with a base
blob as its dictionary (a similarity delta, as ``zstd --patch-from`` does)."""

from __future__ import annotations

import threading

import zstandard

from rdc.repo.blobs import Encoding

LEVEL = 3
# A delta replaces plain compression only if it saves this fraction and these bytes: a
# delta costs reading its base at restore.
DELTA_GAIN = 0.9
DELTA_MIN_SAVING = 32

_local = threading.local()


def _compressor() -> zstandard.ZstdCompressor:
    c = getattr(_local, "c", None)
    if c is None:
        c = _local.c = zstandard.ZstdCompressor(level=LEVEL, write_checksum=False)
    return c


def _decompressor() -> zstandard.ZstdDecompressor:
    d = getattr(_local, "d", None)
    if d is None:
        d = _local.d = zstandard.ZstdDecompressor()
    return d


def _dictionary(base: bytes) -> zstandard.ZstdCompressionDict:
    return zstandard.ZstdCompressionDict(base, dict_type=zstandard.DICT_TYPE_RAWCONTENT)


def compress(plain: bytes | memoryview) -> tuple[Encoding, bytes]:
    """zstd, or the blob as it is where zstd does not make it smaller."""
    frame = _compressor().compress(plain)
    if len(frame) < len(plain):
        return Encoding.ZSTD, frame
    return Encoding.STORED, bytes(plain)


def delta(plain: bytes | memoryview, base: bytes) -> bytes:
    """``plain`` as a zstd frame with ``base`` as its dictionary."""
    compressor = zstandard.ZstdCompressor(level=LEVEL, dict_data=_dictionary(base),
                                          write_checksum=False, write_dict_id=False)
    return compressor.compress(plain)


def better_delta(plain_record: bytes, delta_record: bytes) -> bool:
    """Whether a delta is worth its base: clearly smaller than the plain record."""
    return (len(delta_record) <= DELTA_GAIN * len(plain_record)
            and len(plain_record) - len(delta_record) >= DELTA_MIN_SAVING)


def decode(encoding: Encoding, record: bytes, size: int, base: bytes | None = None) -> bytes:
    """The blob of ``size`` bytes a record holds; ValueError if it does not decode to
    exactly that many bytes."""
    if encoding is Encoding.STORED:
        plain = bytes(record)
    else:
        try:
            # The frame says how large it is, and the decoder believes it: check first,
            # so a hostile record cannot make us allocate what it likes.
            if zstandard.frame_content_size(record) != size:
                raise ValueError(f"frame does not hold {size} bytes")
            if encoding is Encoding.DELTA:
                if base is None:
                    raise ValueError("a delta needs its base")
                decompressor = zstandard.ZstdDecompressor(dict_data=_dictionary(base))
            else:
                decompressor = _decompressor()
            plain = decompressor.decompress(record, max_output_size=size)
        except zstandard.ZstdError as exc:
            raise ValueError(f"zstd: {exc}") from None
    if len(plain) != size:
        raise ValueError(f"decodes to {len(plain)} bytes, not {size}")
    return plain
