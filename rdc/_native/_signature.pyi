"""Stub for the C sketch and grouping (rdc/_native/_signature.c); contract in
signature_impl.h, specification in signature_ref.py."""

from array import array

from typing_extensions import Buffer

def sketch(hashes: Buffer) -> bytes | None:
    """The 12 traits of a set of packed 32-byte hashes; None for no hashes."""

def group_cuts(hashes: Buffer, min_entries: int, max_entries: int) -> list[int]:
    """End index of each group of packed hashes."""

def next_level_payloads(
    level: int, hashes: Buffer, lengths: Buffer, min_entries: int, max_entries: int
) -> tuple[bytes, list[int], array]:
    """Node payloads of the groups of one level, their end offsets, their total lengths."""

def salts() -> tuple[list[int], list[int]]:
    """The compiled-in sketch salts (SALT_H, SALT_G)."""

def trait_candidates(
    lists: list[Buffer], max_id: int, threshold: int, limit: int, exclude: int
) -> list[tuple[int, int]]:
    """Ids in at least ``threshold`` of the uint32 id lists, best first (count, then id)."""

def unpack_level(data: Buffer, pos: int, count: int) -> tuple[bytes, array, int]:
    """``count`` entries (32-byte hash, varint length) of a packed tree level at
    ``data[pos:]``: their hashes, their lengths (array('Q')), the position after them."""
