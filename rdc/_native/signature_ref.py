"""Sketch traits and tree grouping, pure-Python reference: the specification that
``signature_impl.c`` must match bit for bit.

Both work on packed hashes: ``32 * n`` bytes, one BLAKE3 digest per entry.

Sketch (DESIGN.md section 3): trait ``t`` takes the entry that minimises
``h_t(x) = mix64(a ^ SALT_H[t])`` and keeps ``g_t(x) = mix64(b ^ SALT_G[t]) >> 58``, with
``a`` and ``b`` the first and second 8 bytes of ``x``, little-endian. The set is what
counts: duplicates count once (for a minimum that is automatic), and an empty set has no
sketch. ``h_t`` is a bijection of ``a``, so only entries with equal ``a`` can tie; the first
of them wins.

Groups (DESIGN.md section 2): the key of an entry is ``a``; having cut at ``p``, the
next cut follows the rightmost minimal key in ``(p + min_entries, min(p + max_entries,
n)]`` (1-based positions); when at most ``min_entries`` remain, they end the last group.
A node of level ``L`` hashes the payload ``L`` (one byte), then per child its 32-byte hash
and its length as 8 bytes little-endian.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

from rdc._native import rabin
from rdc._native.constants import SKETCH_SEED, TRAIT_BITS, TRAITS

HASH_BYTES = 32
MASK64 = (1 << 64) - 1
MAX_GROUP = 4096

_salts = rabin.splitmix64(SKETCH_SEED)
SALT_H = tuple(next(_salts) for _ in range(TRAITS))
SALT_G = tuple(next(_salts) for _ in range(TRAITS))


def mix64(x: int) -> int:
    """splitmix64's finaliser: a bijection of 64-bit integers that scatters every input bit."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def _check(hashes: bytes | bytearray | memoryview) -> memoryview:
    view = memoryview(hashes).cast("B")
    if len(view) % HASH_BYTES:
        raise ValueError("packed hashes must be a multiple of 32 bytes")
    return view


def sketch(hashes: bytes | bytearray | memoryview) -> bytes | None:
    """The 12 trait values (one byte each, 0..63) of a set of packed hashes; None if empty."""
    view = _check(hashes)
    best = [MASK64 + 1] * TRAITS
    chosen = [0] * TRAITS
    seen = set()
    for i in range(0, len(view), HASH_BYTES):
        digest = bytes(view[i : i + HASH_BYTES])
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


def cuts_of_keys(keys: Sequence[int], min_entries: int, max_entries: int) -> list[int]:
    """End indices of the groups of a key sequence (the rule in the module docstring)."""
    if not 1 <= min_entries < max_entries <= MAX_GROUP:
        raise ValueError(f"need 1 <= min_entries < max_entries <= {MAX_GROUP}")
    n = len(keys)
    cuts: list[int] = []
    p = 0
    while p < n:
        if n - p <= min_entries:
            cuts.append(n)
            break
        best, best_key = -1, 1 << 64
        for j in range(p + min_entries + 1, min(p + max_entries, n) + 1):
            if keys[j - 1] <= best_key:
                best, best_key = j, keys[j - 1]
        cuts.append(best)
        p = best
    return cuts


def keys_of(hashes: bytes | bytearray | memoryview) -> list[int]:
    """Group keys of packed hashes: the first 8 bytes of each, little-endian."""
    view = _check(hashes)
    return [
        int.from_bytes(view[i : i + 8], "little") for i in range(0, len(view), HASH_BYTES)
    ]


def group_cuts(
    hashes: bytes | bytearray | memoryview, min_entries: int, max_entries: int
) -> list[int]:
    """End indices of the groups of packed hashes."""
    return cuts_of_keys(keys_of(hashes), min_entries, max_entries)


def next_level_payloads(
    level: int,
    hashes: bytes | bytearray | memoryview,
    lengths: array,
    min_entries: int,
    max_entries: int,
) -> tuple[bytes, list[int], array]:
    """The groups of one level as the payloads of their nodes at ``level``: all payloads
    concatenated, the end offset of each, and each group's total length. The caller hashes
    each payload (one BLAKE3 call per node)."""
    view = _check(hashes)
    if len(lengths) * HASH_BYTES != len(view):
        raise ValueError("need one length per hash")
    payload = bytearray()
    ends: list[int] = []
    sums = array("Q")
    start = 0
    for end in group_cuts(view, min_entries, max_entries):
        payload.append(level)
        for i in range(start, end):
            payload += view[HASH_BYTES * i : HASH_BYTES * (i + 1)]
            payload += lengths[i].to_bytes(8, "little")
        ends.append(len(payload))
        sums.append(sum(lengths[start:end]))
        start = end
    return bytes(payload), ends, sums


def trait_candidates(
    lists: Sequence[Sequence[int]], max_id: int, threshold: int, limit: int, exclude: int
) -> list[tuple[int, int]]:
    """The ids that occur in at least ``threshold`` of ``lists`` (each id at most once per
    list, every id at most ``max_id``), best first: by count descending, then id
    ascending; ``exclude`` (-1 for none) left out; at most ``limit`` of them."""
    counts: dict[int, int] = {}
    for ids in lists:
        for file_id in ids:
            if file_id > max_id:
                raise ValueError("an id over max_id")
            counts[file_id] = counts.get(file_id, 0) + 1
    hits = [(file_id, n) for file_id, n in counts.items()
            if n >= max(threshold, 1) and file_id != exclude]
    hits.sort(key=lambda hit: (-hit[1], hit[0]))
    return hits[:limit]


def trait_buckets(ids: bytes | bytearray | memoryview, sketches: bytes) -> list[bytes]:
    """The ids (uint32, native order, ascending) sorted into the 768 trait buckets
    ``t * 64 + value`` by their 12-byte sketches (a value over 63 has none): per bucket
    the bytes of its uint32 ids, in the ids' order."""
    id_array = array("I")
    id_array.frombytes(bytes(ids))
    if len(sketches) != TRAITS * len(id_array):
        raise ValueError("need 4 bytes of id and 12 of sketch per file")
    out = [array("I") for _ in range(TRAITS * 64)]
    for i, file_id in enumerate(id_array):
        for t in range(TRAITS):
            value = sketches[i * TRAITS + t]
            if value < 64:
                out[t * 64 + value].append(file_id)
    return [bucket.tobytes() for bucket in out]
