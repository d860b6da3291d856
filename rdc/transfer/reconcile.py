"""Listing only what differs: the client sends a short fingerprint of each entry it has in
a directory, the server answers with a bitmap of those it has too and the entries it has
that the client did not name (docs/protocol.md, "list" with ``have``).

A push lists the target's directories whose content hash differs from the source's; in a
release pair that is 30 directories of 1,000 entries for 35 changed files, and a full
listing costs about 16 bytes an entry on the wire (name, kind, mode, hash prefix). A
fingerprint costs 6, the bitmap one bit, and only the entries that differ travel whole.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from blake3 import blake3

from rdc.content.entries import put_varint
from rdc.local.paths import to_wire
from rdc.params import LISTING_CONTEXT
from rdc.wire import messages as m

FINGERPRINT = 6  # bytes: a false "same" is one in 2**48 per pair of entries compared
HAVE_ENTRIES = 8192  # a directory with more is listed whole (its fingerprints: 48 KiB)
# ... and one with fewer than this: a whole entry costs about 20 bytes, a fingerprint 6
# and the request's field some more, so a directory of one entry (a lone big file, which
# is what changed) costs more with it than without. (From 2: Django 5.0.3->5.0.4 was
# 0.6-0.9 KB smaller than from 4, whose two-entry locale directories gained little.)
HAVE_FROM = 2
HAVE_BUDGET = 1 << 20  # fingerprint bytes in one ``list`` request


def fingerprint(entry: m.Listed) -> bytes:
    """Of an entry's name, kind and hash prefix (what compare looks at)."""
    name = to_wire(entry.name)
    data = bytearray()
    put_varint(len(name), data)
    data += name
    data += entry.kind.encode()
    data += entry.digest
    return blake3(bytes(data), derive_key_context=LISTING_CONTEXT).digest(FINGERPRINT)


def fingerprints(entries: Iterable[m.Listed]) -> bytes:
    return b"".join(fingerprint(e) for e in entries)


def answer(entries: list[m.Listed], have: bytes) -> tuple[list[m.Listed], bytes]:
    """The server's side: its entries the client did not name, and a bitmap over the
    client's fingerprints (bit ``i % 8`` of byte ``i // 8`` set: this side has entry
    ``i``)."""
    theirs = {have[i : i + FINGERPRINT] for i in range(0, len(have), FINGERPRINT)}
    mine = [fingerprint(e) for e in entries]
    unmatched = [e for e, fp in zip(entries, mine, strict=True) if fp not in theirs]
    held = set(mine)
    bitmap = bytearray((len(have) // FINGERPRINT + 7) // 8)
    for k, i in enumerate(range(0, len(have), FINGERPRINT)):
        if have[i : i + FINGERPRINT] in held:
            bitmap[k >> 3] |= 1 << (k & 7)
    return unmatched, bytes(bitmap)


def merge(named: Sequence[m.Listed], unmatched: Iterable[m.Listed], bitmap: bytes
          ) -> dict[str, m.Listed]:
    """The client's side: the server's entries by name, from the entries this side named
    (``named``, in the order of its fingerprints) that the server has, and those it sent."""
    out = {e.name: e for k, e in enumerate(named)
           if k >> 3 < len(bitmap) and bitmap[k >> 3] >> (k & 7) & 1}
    out.update((e.name, e) for e in unmatched)
    return out
