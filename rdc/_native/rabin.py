"""Rabin fingerprints over GF(2^64), as in the book (sections 2.2 and 3.3).

A polynomial of degree below 64 is held in a 64-bit integer in the book's bit order: the
coefficient of x^63 in the least significant bit and that of x^0 in the most significant.
Appending a byte then multiplies by x^8, a right shift plus one table look-up, and a string's
bytes read little-endian line up with the polynomial's high-degree end.

The field is GF(2)[x] / (x^64 + q) with ``q`` below a fixed primitive polynomial: a protocol
constant, because window keys (and so every chunk boundary) depend on it.
"""

from __future__ import annotations

from collections.abc import Iterable

from rdc._native.constants import POLY_Q

MASK64 = (1 << 64) - 1
ONE = 1 << 63  # the polynomial 1
X = 1 << 62  # the polynomial x

# Prime factors of 2^64 - 1 (book 3.3): x is a generator iff x^((2^64-1)/f) != 1 for each.
FACTORS_2_64_MINUS_1 = (3, 5, 17, 257, 641, 65537, 6700417)

# x^64 + POLY_Q is primitive (proved by tests/test_rabin.py with the book's method). It is the
# first primitive candidate drawn by `candidate_polynomials(RABIN_SEED)`.
RABIN_SEED = 0x7264_632D_7261_6269  # b"rdc-rabi"


def splitmix64(seed: int) -> Iterable[int]:
    """The splitmix64 generator: a documented, dependency-free source of protocol constants."""
    state = seed & MASK64
    while True:
        state = (state + 0x9E3779B97F4A7C15) & MASK64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        yield z ^ (z >> 31)


def candidate_polynomials(seed: int) -> Iterable[int]:
    """Random degree-64 candidates with a unit term (the MSB in book order), as the book
    suggests: a polynomial without one is divisible by x and cannot be primitive."""
    for value in splitmix64(seed):
        yield value | ONE


def mul_x(a: int, q: int) -> int:
    """a * x mod (x^64 + q)."""
    return (a >> 1) ^ (q if a & 1 else 0)


def mul(a: int, b: int, q: int) -> int:
    """a * b mod (x^64 + q), school-book: one bit of b (from x^0 upwards) per step."""
    result = 0
    while b:
        if b & ONE:
            result ^= a
        a = mul_x(a, q)
        b = (b << 1) & MASK64
    return result


def x_pow(power: int, q: int) -> int:
    """x^power mod (x^64 + q), by squaring (book 3.3, ``pow``)."""
    if power < 64:
        return ONE >> power
    half = x_pow(power >> 1, q)
    square = mul(half, half, q)
    return mul_x(square, q) if power & 1 else square


def is_primitive(q: int) -> bool:
    """Whether x^64 + q is primitive, by the book's test.

    x^(2^64) == x says the order of x divides 2^64 - 1; no maximal proper divisor
    (2^64 - 1) / f giving 1 says the order is 2^64 - 1 itself.
    """
    if not q & ONE:
        return False
    a = X
    for _ in range(64):
        a = mul(a, a, q)
    if a != X:
        return False
    order = MASK64
    return all(x_pow(order // f, q) != ONE for f in FACTORS_2_64_MINUS_1)


def find_primitive(seed: int) -> int:
    """The first primitive candidate from `candidate_polynomials(seed)`."""
    for q in candidate_polynomials(seed):
        if is_primitive(q):
            return q
    raise AssertionError("unreachable: the generator is infinite")


def byte_tables(q: int = POLY_Q) -> list[list[int]]:
    """The book's ``bybyte[8][256]``: ``tables[a][v] = v * x^(8a + 8) mod p``, where ``v``
    is a byte in the low (high-degree) end of a polynomial."""
    tables = [[0] * 256 for _ in range(8)]
    f = q  # x^64 mod p: what 0x80 (x^56) becomes after eight shifts
    for a in range(8):
        bit = 0x80
        while bit:
            tables[a][bit] = f
            f = mul_x(f, q)
            bit >>= 1
        for i in (2, 4, 8, 16, 32, 64, 128):
            for j in range(1, i):
                tables[a][i ^ j] = tables[a][i] ^ tables[a][j]
    return tables


_TABLE0 = byte_tables()[0]


def extend(f: int, data: bytes | bytearray | memoryview) -> int:
    """Append ``data`` to a string whose fingerprint is ``f`` (book ``Extend``)."""
    table = _TABLE0
    for byte in data:
        f = (f >> 8) ^ table[(f ^ byte) & 0xFF]
    return f


def fingerprint(data: bytes | bytearray | memoryview) -> int:
    """Rabin fingerprint of ``data``: a leading 1, the data, 64 zero bits, mod p.

    The leading 1 (``Empty == q`` in the book) keeps runs of zeros of different lengths
    apart.
    """
    return extend(POLY_Q, data)


def sliding_out_table(window: int) -> list[int]:
    """Per leaving byte ``a``, what to XOR in after `extend` by one byte so that a
    fingerprint of ``a + s`` (``len(s) == window - 1``) becomes that of ``s + c``.

    ``F(s + c) = extend(F(a + s), c) ^ a * x^(8 window) ^ F(0^(window+1)) ^ F(0^window)``:
    the old leading byte and the old leading 1 go, a new leading 1 comes in.
    """
    lead_one = fingerprint(bytes(window + 1)) ^ fingerprint(bytes(window))
    return [extend(0, bytes([a]) + bytes(window)) ^ lead_one for a in range(256)]
