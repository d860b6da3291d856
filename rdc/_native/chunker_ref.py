"""Winnowing chunker, pure-Python reference: the specification the C code must match.

Positions are stream offsets ``j >= window``; the window of position ``j`` is the bytes
``data[j - window : j]`` and a cut "at ``j``" ends a chunk just after that window. Each
position has a key ``(lead(j), ext(j))`` compared as a pair:

- ``lead``: the top byte of a 64-bit gear hash, ``h = (h << shift) + GEAR[byte]`` with
  ``shift = 64 // window``, so ``h`` depends on exactly the last ``window`` bytes;
- ``ext``: the Rabin fingerprint of the window over GF(2^64) (`rdc._native.rabin`).

Having cut at ``p`` (start: 0), the next cut is the rightmost position of minimal key in
``(p + min_size, min(p + max_size, end)]``. When at most ``min_size`` bytes remain, the end
of the data is the last cut. This module computes every key at every position of each
window; the C fast path computes ``ext`` only where it can matter and must agree exactly.
"""

from __future__ import annotations

from collections.abc import Iterator

from rdc._native import rabin
from rdc._native.constants import GEAR_SEED, WINDOWS, Limits, check_limits


def _gear_table() -> tuple[int, ...]:
    values = rabin.splitmix64(GEAR_SEED)
    return tuple(next(values) for _ in range(256))


GEAR: tuple[int, ...] = _gear_table()
MASK64 = rabin.MASK64
_TABLE = rabin.byte_tables()[0]
_OUT = {w: rabin.sliding_out_table(w) for w in WINDOWS}


def lead(window: bytes | memoryview, shift: int) -> int:
    """The lead byte of one window, from scratch."""
    h = 0
    for byte in window:
        h = ((h << shift) + GEAR[byte]) & MASK64
    return h >> 56


def ext(window: bytes | memoryview) -> int:
    """The extended key of one window, from scratch."""
    return rabin.fingerprint(window)


def window_keys(
    data: bytes | bytearray | memoryview, first: int, last: int, params: Limits
) -> Iterator[tuple[int, tuple[int, int]]]:
    """``(j, key(j))`` for positions ``first..last`` of ``data`` (buffer offsets, ``first >=
    window``).

    Rolling, O(1) per position, and equal to `lead` and `ext` of each window (tested): the
    gear forgets bytes on its own; the Rabin fingerprint slides by dropping its leaving
    byte (book 3.3).
    """
    w, shift = params.window, params.shift
    gear, table, out = GEAR, _TABLE, _OUT[w]
    h = 0
    for byte in data[first - w : first]:
        h = ((h << shift) + gear[byte]) & MASK64
    f = ext(data[first - w : first])
    yield first, (h >> 56, f)
    for j in range(first + 1, last + 1):
        incoming = data[j - 1]
        h = ((h << shift) + gear[incoming]) & MASK64
        f = (f >> 8) ^ table[(f ^ incoming) & 0xFF] ^ out[data[j - w - 1]]
        yield j, (h >> 56, f)


def next_cut(data: bytes | bytearray | memoryview, p: int, end: int, params: Limits) -> int:
    """The cut after ``p`` given all data up to ``end`` (buffer offsets)."""
    if end - p <= params.min_size:
        return end
    best, best_key = -1, (256, 0)
    last = min(p + params.max_size, end)
    for j, key in window_keys(data, p + params.min_size + 1, last, params):
        if key <= best_key:  # ties go right
            best, best_key = j, key
    return best


class ReferenceScanner:
    """Resumable scanner with the same contract as the C ``Scanner``.

    ``scan(data, base, final)``: ``data`` holds stream bytes ``[base, base + len(data))``
    and must start at or before the last cut. Returns the new cuts (stream offsets) that are
    decided by this data; with ``final``, the end of the data is the end of the stream.
    """

    def __init__(self, window: int, min_size: int, max_size: int, filter: bool = True) -> None:
        del filter  # the reference always evaluates every key
        check_limits(window, min_size, max_size)
        self.params = Limits(window, min_size, max_size)
        self.last_cut = 0
        self.finished = False
        self.positions = 0
        self.ext_evaluations = 0

    def scan(self, data: bytes | bytearray | memoryview, base: int, final: bool) -> list[int]:
        if self.finished:
            raise ValueError("scan after the final scan")
        if base > self.last_cut:
            raise ValueError("data must start at or before the last cut")
        view = memoryview(data).cast("B")
        end = base + len(view)
        cuts: list[int] = []
        while self.last_cut < end:
            p = self.last_cut - base
            if not final and end - self.last_cut < self.params.max_size:
                break
            cut = next_cut(view, p, len(view), self.params)
            window_end = min(p + self.params.max_size, len(view))
            self.positions += max(window_end - p - self.params.min_size, 0)
            self.ext_evaluations = self.positions
            self.last_cut = cut + base
            cuts.append(self.last_cut)
        self.finished = final
        return cuts
