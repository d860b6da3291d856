"""Stub for the C set sketch (rdc/_native/_setsketch.c, which states the contract);
specification in setsketch_ref.py."""

from typing_extensions import Buffer

def set_sketch(elements: Buffer, capacity: int, *, path: str | None = None) -> bytes:
    """The odd power sums s1, s3, ..., s(2 capacity - 1) of the nonzero u32 ``elements``."""

def set_locator(sums: Buffer, *, path: str | None = None) -> bytes | None:
    """l1..lL of the monic polynomial whose roots are the set with odd power sums ``sums``;
    b"" for the empty set, None when it cannot be decoded."""

def set_roots(elements: Buffer, locator: Buffer, *, path: str | None = None) -> list[int]:
    """Ascending indices of the u32 ``elements`` that are roots of the locator's polynomial."""

def field_mul(a: int, b: int, *, path: str | None = None) -> int:
    """a * b in GF(2^32) modulo x^32 + x^7 + x^3 + x^2 + 1."""

def paths() -> list[str]:
    """The code paths this CPU can run, slowest first ("portable", "clmul")."""

def default_path() -> str:
    """The path taken when given none: the fastest."""
