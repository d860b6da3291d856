"""What the chunkers are told: the window sizes they support and the limits of one
chunker (rdc.params.ChunkParams checks and carries the same fields). Cheap to import: the
reference chunker, which builds tables when imported, is not."""

from __future__ import annotations

from typing import NamedTuple

WINDOWS = (16, 32, 64)


class Limits(NamedTuple):
    window: int
    min_size: int
    max_size: int

    @property
    def shift(self) -> int:
        """Bits the gear state moves per byte."""
        return 64 // self.window
