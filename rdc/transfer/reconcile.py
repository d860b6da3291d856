"""Listing only what differs: the client sends a short fingerprint of each entry it has in
a directory, the server answers with a bitmap of those it has too and the entries it has
that the client did not name (docs/protocol.md, "list" with ``have``).

A push lists the target's directories whose content hash differs from the source's; in a
release pair that is 30 directories of 1,000 entries for 35 changed files, and a full
listing costs about 16 bytes an entry on the wire (name, kind, mode, hash prefix). A pull
lists the source's, naming the target's entries (its own, listed first). A
fingerprint costs 6, the bitmap one bit, and only the entries that differ travel whole.
Between peers that have the feature ``short-fingerprints`` a fingerprint is 3 to 5 bytes,
by how many the directory holds (`fingerprint_bytes`): most directories hold a few entries,
and a false "same" is caught at ``finish`` anyway, at the cost of comparing again.

Between peers with the feature ``listing-sketch``, a directory of many entries goes as a
*set sketch* instead (`rdc.transfer.sides`): the odd power sums of its entries' 32-bit
fingerprints in GF(2^32), 4 bytes for each entry the two sides may differ in
(SKETCH_CAPACITY), whatever the directory holds. A directory listed because one file below
it changed differs in two entries (that file's or subdirectory's old and new), so on a
sparse edit of a large tree 16 bytes stand for hundreds. The server adds its own sums to
them, which gives the sums of the entries that differ; where those are at most
SKETCH_CAPACITY it finds them among its own entries (`answer_sketch`), sends those and its
sums, and the client finds its own the same way and checks the whole (`merge_sketch`).
Where more differ, the client asks for that directory again with fingerprints: a round
trip more for that directory alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from blake3 import blake3

from rdc import _native
from rdc.content.entries import put_varint
from rdc.local.paths import to_wire
from rdc.params import LISTING_CONTEXT
from rdc.wire import messages as m

# The feature both sides must have for listings that name no path where they are the
# directory asked for in their place (each path went twice: in the ``list`` and back).
ASKED_LISTINGS = "asked-listings"
FINGERPRINT = 6  # bytes: a false "same" is one in 2**48 per pair of entries compared
# The feature both sides must have for fingerprints of `fingerprint_bytes`.
SHORT = "short-fingerprints"
# ... whose length keeps a false "same" (an entry that differs taken for one named) under
# one in 2**FALSE_SAME per entry that differs: a sync of 2,000 changed entries compares
# again with whole hashes about once in 500 (a full listing, ~50 bytes an entry), where
# Django's 7,800 entries (most in directories of under 16) cost 23 KB less each time.
FALSE_SAME = 20
HAVE_ENTRIES = 8192  # a directory with more is listed whole (its fingerprints: 48 KiB)
# ... and one with fewer than this: a whole entry costs about 20 bytes, a fingerprint 6
# and the request's field some more, so a directory of one entry (a lone big file, which
# is what changed) costs more with it than without. (From 2: Django 5.0.3->5.0.4 was
# 0.6-0.9 KB smaller than from 4, whose two-entry locale directories gained little.)
HAVE_FROM = 2
HAVE_BUDGET = 1 << 20  # fingerprint bytes in one ``list`` request
# The feature both sides must have for ``sketch`` in a list and ``sums`` in its answer.
SKETCH = "listing-sketch"
# Entries the two sides' directory may differ in for a sketch to be decoded. Measured on
# the 100,000-file 1% edit pulled (1,791 directories listed with fingerprints, 192 KB):
# 1,191 differed in 2 entries, 373 in 4, 227 in more; capacity 4 costs 85 KB there
# fingerprints and fallbacks included (2: 96 KB, 8: 120 KB). Where the directories listed
# differ in many entries most sketches fail: list and listing on the wire, pushes from a
# cold client, fingerprints alone -> sketches: Django 5.0.1->5.0.2 23.8 -> 21.1 KB,
# 5.0.6->5.0.7 5.8 -> 4.3, 5.0.3->5.0.4 6.2 -> 6.8, renamed tree 70.5 -> 74.2, scattered
# edits 50.7 -> 53.5. (A rule that stops sketching once failures outweigh successes lost
# the 100,000-file win: there the directories near the top, listed first, differ in many
# entries and those below in two.)
SKETCH_CAPACITY = 4
# ... sent only for a directory whose fingerprints would take more than this many bytes:
# below it a sketch that fails (and the fingerprints sent after it) costs more than it
# saves (Django's pairs: 17 entries and up).
SKETCH_FROM_BYTES = 48


def fingerprint_bytes(count: int) -> int:
    """The length of each of ``count`` fingerprints of one directory (``short-fingerprints``):
    the fewest bytes, at least 3, at which an entry matches one of them by chance with odds
    under 2**-FALSE_SAME."""
    size = 3
    while size < FINGERPRINT and count > 256**size >> FALSE_SAME:
        size += 1
    return size


def fingerprint_size(have: bytes, short: bool = True) -> int | None:
    """The fingerprint length of one directory's ``have``: FINGERPRINT, or with ``short``
    (``short-fingerprints``) the one length whose count, ``len(have) // size``, calls for
    it (``size * count`` grows with the count, so no two lengths fit); None if none
    does."""
    if not short:
        return None if len(have) % FINGERPRINT else FINGERPRINT
    for size in range(3, FINGERPRINT + 1):
        if len(have) % size == 0 and fingerprint_bytes(len(have) // size) == size:
            return size
    return None


def _hashed(entry: m.Listed, data: bytearray) -> None:
    """Append what an entry's fingerprint hashes: its name, kind and hash prefix (what
    compare looks at)."""
    name = to_wire(entry.name)
    put_varint(len(name), data)
    data += name
    data += entry.kind.encode()
    data += entry.digest


def fingerprint(entry: m.Listed, size: int = FINGERPRINT) -> bytes:
    """Of an entry's name, kind and hash prefix."""
    data = bytearray()
    _hashed(entry, data)
    return blake3(bytes(data), derive_key_context=LISTING_CONTEXT).digest(size)


def fingerprint_list(entries: Sequence[m.Listed], size: int = FINGERPRINT) -> list[bytes]:
    """`fingerprint` of each of ``entries``: with the C extension, all in one call of the
    chunk hashes (BLAKE3's derive-key mode over each entry's bytes), a third of the time of
    one hash object an entry (a 1%-edited push of 100,000 files fingerprints 83,000
    entries on each side, between round trips of the compare)."""
    if _native.PURE_PYTHON:  # (the reference BLAKE3 is Python; the package is not)
        return [fingerprint(e, size) for e in entries]
    data = bytearray()
    ends = []
    for e in entries:
        _hashed(e, data)
        ends.append(len(data))
    hashes, _ = _native.hash_chunks(data, ends, context=LISTING_CONTEXT)
    return [hashes[i : i + size] for i in range(0, len(hashes), 32)]


def fingerprints(entries: Sequence[m.Listed], short: bool = False) -> bytes:
    """The fingerprints of one directory's ``entries``, FINGERPRINT bytes each, or with
    ``short`` (the peer has the feature) `fingerprint_bytes`."""
    size = fingerprint_bytes(len(entries)) if short else FINGERPRINT
    return b"".join(fingerprint_list(entries, size))


def answer(entries: list[m.Listed], have: bytes, size: int = FINGERPRINT
           ) -> tuple[list[m.Listed], bytes]:
    """The server's side: its entries the client did not name, and a bitmap over the
    client's fingerprints of ``size`` bytes (bit ``i % 8`` of byte ``i // 8`` set: this
    side has entry ``i``)."""
    theirs = {have[i : i + size] for i in range(0, len(have), size)}
    mine = fingerprint_list(entries, size)
    unmatched = [e for e, fp in zip(entries, mine, strict=True) if fp not in theirs]
    held = set(mine)
    bitmap = bytearray((len(have) // size + 7) // 8)
    for k, i in enumerate(range(0, len(have), size)):
        if have[i : i + size] in held:
            bitmap[k >> 3] |= 1 << (k & 7)
    return unmatched, bytes(bitmap)


_ZERO, _ONE = bytes(4), (1).to_bytes(4, "little")


def elements(entries: Sequence[m.Listed]) -> bytes:
    """The 32-bit fingerprints of ``entries`` as set elements (little-endian; 0, which no
    sketch can hold, becomes 1: a collision like any other)."""
    return b"".join(fp if fp != _ZERO else _ONE for fp in fingerprint_list(entries, 4))


def distinct(items: bytes) -> bool:
    """No element repeats: a sketch holds a set, and two equal elements would cancel."""
    return len({items[i : i + 4] for i in range(0, len(items), 4)}) * 4 == len(items)


def sketch_bytes(count: int, short: bool) -> int:
    """What ``count`` entries' fingerprints would cost: a sketch goes where that is more
    than SKETCH_FROM_BYTES."""
    return count * (fingerprint_bytes(count) if short else FINGERPRINT)


def _added(a: bytes, b: bytes) -> bytes:
    """Two sketches' sums added (in GF(2^32): exclusive or)."""
    return (int.from_bytes(a, "little") ^ int.from_bytes(b, "little")).to_bytes(
        len(a), "little")


def answer_sketch(entries: list[m.Listed], sums: bytes
                  ) -> tuple[list[m.Listed], bytes] | None:
    """The server's side of a ``sketch``: its entries the client does not have (all its
    entries that differ, where the two sides differ in at most as many as the sketch
    holds; else none, which the client finds too) and its own sums of the same capacity.
    None where two of its entries share a fingerprint: the whole listing goes."""
    mine = elements(entries)
    if not distinct(mine):
        return None
    own = _native.set_sketch(mine, len(sums) // 4)
    locator = _native.set_locator(_added(own, sums))
    if not locator:  # (nothing differs, or too much to say what)
        return [], own
    return [entries[i] for i in _native.set_roots(mine, locator)], own


def merge_sketch(named: Sequence[m.Listed], items: bytes, sums: bytes, theirs: bytes,
                 unmatched: Sequence[m.Listed]) -> dict[str, m.Listed] | None:
    """The client's side: the server's entries by name from the entries this side
    sketched (``named``, their elements ``items``, its sums ``sums``), the server's sums
    ``theirs`` and the entries it sent; None where they do not add up (more entries differ
    than the sketch holds: ask again with fingerprints)."""
    if len(theirs) != len(sums):
        return None
    difference = _added(sums, theirs)
    locator = _native.set_locator(difference)
    if locator is None:
        return None
    gone = _native.set_roots(items, locator) if locator else []
    sent = elements(unmatched)
    found = b"".join(items[4 * i : 4 * i + 4] for i in gone) + sent
    if len(gone) + len(unmatched) != len(locator) // 4 or not distinct(found) or (
            _native.set_sketch(found, len(sums) // 4) != difference):
        return None
    out = {e.name: e for e in named}
    for i in gone:
        del out[named[i].name]
    out.update((e.name, e) for e in unmatched)
    return out


def merge(named: Sequence[m.Listed], unmatched: Iterable[m.Listed], bitmap: bytes
          ) -> dict[str, m.Listed]:
    """The client's side: the server's entries by name, from the entries this side named
    (``named``, in the order of its fingerprints) that the server has, and those it sent."""
    out = {e.name: e for k, e in enumerate(named)
           if k >> 3 < len(bitmap) and bitmap[k >> 3] >> (k & 7) & 1}
    out.update((e.name, e) for e in unmatched)
    return out
