"""rsync's delta algorithm, for counting the literal bytes it would send (tests only).

The receiver cuts its old file into fixed blocks (700 bytes up to 490,000-byte files, about
the square root of the size above, a multiple of 8); the sender slides a window over the
new file and emits a block reference wherever the window equals an old block (weak rolling
checksum, then a byte comparison standing in for the strong one), else one literal byte.
"""

from __future__ import annotations

import math


def block_size(length: int) -> int:
    if length <= 700 * 700:
        return 700
    return min(131072, max(700, math.isqrt(length) // 8 * 8))


def literal_bytes(old: bytes, new: bytes) -> int:
    if not old:
        return len(new)
    size = block_size(len(old))
    blocks: dict[tuple[int, int], list[int]] = {}
    for start in range(0, len(old), size):
        block = old[start : start + size]
        blocks.setdefault(_weak(block), []).append(start)
    literal = 0
    i = 0
    n = len(new)
    window = min(size, n)
    s1, s2 = _sums(new[0:window])
    while i < n:
        window = min(size, n - i)
        key = (s1 & 0xFFFF, s2 & 0xFFFF)
        hit = False
        for start in blocks.get(key, ()):
            block = old[start : start + size]
            if len(block) == window and block == new[i : i + window]:
                hit = True
                break
        if hit:
            i += window
            if i < n:
                s1, s2 = _sums(new[i : i + min(size, n - i)])
            continue
        literal += 1
        out = new[i]
        if i + window < n and window == size:
            incoming = new[i + window]
            s1 = s1 - out + incoming
            s2 = s2 - window * out + s1
        else:  # the window shrinks at the end of the file
            s1 -= out
            s2 -= window * out
        i += 1
    return literal


def _sums(data: bytes) -> tuple[int, int]:
    s1 = s2 = 0
    for k, byte in enumerate(data):
        s1 += byte
        s2 += (len(data) - k) * byte
    return s1, s2


def _weak(data: bytes) -> tuple[int, int]:
    s1, s2 = _sums(data)
    return s1 & 0xFFFF, s2 & 0xFFFF
