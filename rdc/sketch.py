"""Similarity sketches: 12 traits of 6 bits from min-wise samples of a file's leaf hashes.

Trait ``t`` takes the element of the set that minimises ``h_t`` and keeps 6 bits of a second
function ``g_t`` of it (book 6.2). Two sets of Jaccard similarity J agree on a trait with
probability ``J + (1 - J) / 64``: the b-bit estimator (Li and Koenig, eq. 9 with
C1 = C2 = 2^-6) turns the fraction of agreeing traits back into J.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from rdc import rabin

TRAITS = 12
TRAIT_BITS = 6
TRAIT_VALUES = 1 << TRAIT_BITS
MASK64 = (1 << 64) - 1

_salts = rabin.splitmix64(0x7264_632D_736B_6574)  # b"rdc-sket"
SALT_H = tuple(next(_salts) for _ in range(TRAITS))
SALT_G = tuple(next(_salts) for _ in range(TRAITS))


def mix64(x: int) -> int:
    """splitmix64's finaliser: a bijection of 64-bit integers that scatters every input bit."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


Sketch = bytes  # TRAITS bytes, each a trait value in 0..63


def sketch_of(hashes: Iterable[bytes]) -> Sketch | None:
    """The sketch of a set of hashes (duplicates count once); None for an empty set.

    ``h_t(x) = mix64(a ^ SALT_H[t])`` and ``g_t(x) = mix64(b ^ SALT_G[t]) >> 58`` with ``a``
    and ``b`` the first and second 8 bytes of ``x``, little-endian.
    """
    best = [MASK64 + 1] * TRAITS
    chosen = [0] * TRAITS
    seen = set()
    for digest in hashes:
        if digest in seen:
            continue
        seen.add(digest)
        a = int.from_bytes(digest[:8], "little")
        b = int.from_bytes(digest[8:16], "little")
        for t in range(TRAITS):
            h = mix64(a ^ SALT_H[t])
            if h < best[t]:
                best[t] = h
                chosen[t] = b
    if not seen:
        return None
    return bytes(mix64(chosen[t] ^ SALT_G[t]) >> (64 - TRAIT_BITS) for t in range(TRAITS))


def matching_traits(a: Sketch, b: Sketch) -> int:
    return sum(x == y for x, y in zip(a, b, strict=True))


@dataclass(frozen=True, slots=True)
class Resemblance:
    """Estimated Jaccard similarity of two leaf sets, with one standard error."""

    estimate: float
    stderr: float
    matches: int


def resemblance(a: Sketch, b: Sketch) -> Resemblance:
    """Unbiased b-bit estimate of J from the agreeing traits, clipped to [0, 1]."""
    matches = matching_traits(a, b)
    chance = 1 / TRAIT_VALUES
    p = matches / TRAITS
    estimate = (p - chance) / (1 - chance)
    stderr = math.sqrt(max(p * (1 - p), 1 / TRAITS**2) / TRAITS) / (1 - chance)
    return Resemblance(min(1.0, max(0.0, estimate)), stderr, matches)


def trait_match_probability(jaccard: float) -> float:
    """The book's ``(63 J + 1) / 64``."""
    return jaccard + (1 - jaccard) / TRAIT_VALUES


def buckets(sketch: Sketch) -> list[int]:
    """The 12 inverted-index keys of a sketch: ``t * 64 + trait``."""
    return [t * TRAIT_VALUES + value for t, value in enumerate(sketch)]
