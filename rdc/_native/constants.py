"""The constants the native code and its references are built on, and what a chunker is
told (rdc.params.ChunkParams checks and carries the same fields). Cheap to import: the
reference modules, which build tables when imported, are not."""

from __future__ import annotations

from typing import NamedTuple

WINDOWS = (16, 32, 64)  # the window sizes the chunkers support
# The gear table of the lead hash is splitmix64 from this seed (`chunker_ref.GEAR`).
GEAR_SEED = 0x7264_632D_6765_6172  # b"rdc-gear"
# x^64 + POLY_Q is primitive: the field of the Rabin fingerprints (`rabin`).
POLY_Q = 0xF6E5D788CB1A4257
# Sketches: TRAITS traits of TRAIT_BITS bits, salts from splitmix64 of SKETCH_SEED.
TRAITS = 12
TRAIT_BITS = 6
SKETCH_SEED = 0x7264_632D_736B_6574  # b"rdc-sket"


MAX_CHUNK_LIMIT = 1 << 20


def check_limits(window: int, min_size: int, max_size: int) -> None:
    """ValueError unless a chunker can be told these: a supported window and
    ``window <= min_size < max_size <= 1 MiB``."""
    if window not in WINDOWS:
        raise ValueError(f"window must be one of {WINDOWS}, not {window}")
    if not window <= min_size < max_size <= MAX_CHUNK_LIMIT:
        raise ValueError(
            "need window <= min_size < max_size <= 1 MiB, got "
            f"window={window} min_size={min_size} max_size={max_size}"
        )


class Limits(NamedTuple):
    window: int
    min_size: int
    max_size: int

    @property
    def shift(self) -> int:
        """Bits the gear state moves per byte."""
        return 64 // self.window
