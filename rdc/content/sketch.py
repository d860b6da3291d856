"""Similarity sketches: 12 traits of 6 bits from min-wise samples of a file's leaf hashes.

Trait ``t`` takes the element of the set that minimises ``h_t`` and keeps 6 bits of a second
function ``g_t`` of it (book 6.2). Two sets of Jaccard similarity J agree on a trait with
probability ``J + (1 - J) / 64``: the b-bit estimator (Li and Koenig, eq. 9 with
C1 = C2 = 2^-6) turns the fraction of agreeing traits back into J.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from rdc import _native
from rdc._native.constants import TRAIT_BITS, TRAITS
from rdc.records import record

TRAIT_VALUES = 1 << TRAIT_BITS

Sketch = bytes  # TRAITS bytes, each a trait value in 0..63


def sketch_of(hashes: Iterable[bytes]) -> Sketch | None:
    """The sketch of a set of 32-byte hashes (duplicates count once); None for an empty set.

    ``h_t(x) = mix64(a ^ SALT_H[t])`` and ``g_t(x) = mix64(b ^ SALT_G[t]) >> 58`` with ``a``
    and ``b`` the first and second 8 bytes of ``x``, little-endian
    (`rdc._native.signature_ref.sketch` is the specification).
    """
    return _native.sketch(b"".join(hashes))


def matching_traits(a: Sketch, b: Sketch) -> int:
    return sum(x == y for x, y in zip(a, b, strict=True))


@record
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
    """The 12 inverted-index keys of a sketch: ``t * 64 + trait``. A trait out of range
    (a damaged index row: the wire refuses them) has none."""
    return [t * TRAIT_VALUES + value for t, value in enumerate(sketch[:TRAITS])
            if value < TRAIT_VALUES]
