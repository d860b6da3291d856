"""Stub for the C chunk hashes (rdc/_native/_blake3.c); contract in blake3_impl.h,
specification in blake3_ref.py."""

from array import array
from collections.abc import Sequence

from typing_extensions import Buffer

def hash_chunks(
    data: Buffer,
    ends: Sequence[int],
    start: int = 0,
    path: str | None = None,
    context: str | None = None,
) -> tuple[bytes, array]:
    """Packed BLAKE3 hashes and lengths of the chunks of ``data`` ending at ``ends`` (offsets
    into ``data``), the first starting at ``start``; the GIL is released meanwhile. ``path``
    forces a code path (one of `paths()`); by default the fastest, or $RDC_BLAKE3_PATH.
    With ``context``, BLAKE3's derive-key mode (``blake3(chunk, derive_key_context=...)``)."""

def paths() -> list[str]:
    """The code paths this CPU can run, slowest first: scalar, sse2, sse41, avx2, avx512."""

def default_path() -> str:
    """The code path `hash_chunks` takes when given none."""
