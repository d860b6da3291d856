"""Chunking parameters: protocol constants that both sides of a transfer must share."""

from __future__ import annotations

from dataclasses import dataclass

from rdc._native.limits import WINDOWS

MAX_CHUNK_LIMIT = 1 << 20


@dataclass(frozen=True, slots=True)
class ChunkParams:
    """Winnowing parameters (DESIGN.md section 1).

    ``window``: bytes behind each position that its key depends on (16, 32 or 64: the lead
    hash is a 64-bit gear shifted by 64 / window bits per byte, so it forgets exactly
    ``window`` bytes back). Chunks are between ``min_size + 1`` and ``max_size`` bytes, but
    for the last chunk of a file, which may be shorter.
    """

    window: int = 32
    min_size: int = 4096
    max_size: int = 12288

    def __post_init__(self) -> None:
        if self.window not in WINDOWS:
            raise ValueError(f"window must be one of {WINDOWS}, not {self.window}")
        if not self.window <= self.min_size < self.max_size <= MAX_CHUNK_LIMIT:
            raise ValueError(
                "need window <= min_size < max_size <= 1 MiB, got "
                f"window={self.window} min_size={self.min_size} max_size={self.max_size}"
            )

    @property
    def shift(self) -> int:
        """Bits the gear state moves per byte."""
        return 64 // self.window


DEFAULT_PARAMS = ChunkParams()
