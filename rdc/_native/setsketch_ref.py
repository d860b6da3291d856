"""The specification of the C set sketch (`_setsketch`), and the pure-Python implementation:
set reconciliation by BCH syndromes over GF(2^32) (PinSketch, as in minisketch).

Each side of a sync holds a set of nonzero 32-bit fingerprints. A side sends `set_sketch`,
the odd power sums of its set; the other XORs them with its own, which in characteristic 2
gives the power sums of the symmetric difference D (an element in both sets cancels).
`set_locator` turns those sums into the polynomial P whose roots are exactly D, when D has
at most `capacity` elements; each side then finds its own part of D with `set_roots`, by
testing its own elements. No general root finding is needed, since every root of P is an
element one side holds.

Field: GF(2^32) in the polynomial basis modulo x^32 + x^7 + x^3 + x^2 + 1 (`MODULUS`,
irreducible; tests/test_setsketch.py checks). Elements and sums travel as concatenated
little-endian u32s.
"""

from __future__ import annotations

MODULUS = 0x1_0000_008D
MAX_CAPACITY = 64  # sums per sketch: also bounds the work a peer's sums can cost


def field_mul(a: int, b: int, *, path: str | None = None) -> int:
    """The product of two field elements: carry-less multiply, then the remainder modulo
    `MODULUS`. ``path`` names a C code path and is ignored here."""
    del path
    product = 0
    while b:
        if b & 1:
            product ^= a
        a <<= 1
        b >>= 1
    for bit in range(62, 31, -1):
        if product >> bit & 1:
            product ^= MODULUS << (bit - 32)
    return product


def field_inverse(a: int) -> int:
    """a^-1 = a^(2^32 - 2), for nonzero a (the multiplicative group has order 2^32 - 1)."""
    result, power = 1, a
    for _ in range(31):  # 2^32 - 2 = 2 + 4 + ... + 2^31
        power = field_mul(power, power)
        result = field_mul(result, power)
    return result


def _words(data: bytes | bytearray | memoryview, what: str) -> list[int]:
    data = bytes(data)
    if len(data) % 4:
        raise ValueError(f"{what} must be a multiple of 4 bytes")
    return [int.from_bytes(data[i : i + 4], "little") for i in range(0, len(data), 4)]


def _pack(words: list[int]) -> bytes:
    return b"".join(w.to_bytes(4, "little") for w in words)


def set_sketch(elements: bytes | bytearray | memoryview, capacity: int, *,
               path: str | None = None) -> bytes:
    """The odd power sums s1, s3, ..., s(2 capacity - 1) of the set ``elements`` (s_k: the
    XOR of e^k over the elements), 4 bytes each. The even sums are not sent: s_2k = s_k^2 in
    characteristic 2. ValueError for a zero element (0 is no root a locator can name) or a
    capacity outside 1..`MAX_CAPACITY`."""
    del path
    values = _words(elements, "elements")
    if not 1 <= capacity <= MAX_CAPACITY:
        raise ValueError(f"capacity must be in 1..{MAX_CAPACITY}")
    if 0 in values:
        raise ValueError("elements must be nonzero")
    sums = [0] * capacity
    for e in values:
        square, power = field_mul(e, e), e
        for k in range(capacity):
            sums[k] ^= power
            power = field_mul(power, square)
    return _pack(sums)


def _berlekamp_massey(syndromes: list[int]) -> tuple[list[int], int]:
    """The shortest LFSR generating S1..SN: Lambda's coefficients (Lambda[0] = 1, length
    N + 1, zero above the degree) and its length L."""
    n_total = len(syndromes)
    connection = [1] + [0] * n_total  # C(x), the current Lambda
    previous = [1] + [0] * n_total  # B(x), Lambda before the last length change
    length, shift, last_discrepancy = 0, 1, 1
    for n in range(n_total):
        discrepancy = syndromes[n]
        for i in range(1, length + 1):
            discrepancy ^= field_mul(connection[i], syndromes[n - i])
        if discrepancy == 0:
            shift += 1
            continue
        scale = field_mul(discrepancy, field_inverse(last_discrepancy))
        before = connection[:]
        # x^shift B(x) has degree at most n + 1 <= N (Massey 1969), so nothing is cut here.
        for i in range(n_total + 1 - shift):
            connection[i + shift] ^= field_mul(scale, previous[i])
        if 2 * length <= n:
            length, previous, last_discrepancy, shift = n + 1 - length, before, discrepancy, 1
        else:
            shift += 1
    return connection, length


def _splits(locator: list[int]) -> bool:
    """Whether the monic P = x^L + l1 x^(L-1) + ... + lL has L distinct roots in GF(2^32):
    exactly when x^(2^32) = x mod P, as x^(2^32) - x is the product of x - a over the whole
    field. 32 squarings mod P, each L field squarings (the Frobenius map squares
    coefficients) and a reduction of L^2 products."""
    degree = len(locator)
    x = [0] * degree  # x mod P, coefficients from x^0
    if degree == 1:
        x[0] = locator[0]
    else:
        x[1] = 1
    residue = x[:]
    for _ in range(32):
        wide = [0] * (2 * degree - 1)
        for i, c in enumerate(residue):
            wide[2 * i] = field_mul(c, c)
        for d in range(2 * degree - 2, degree - 1, -1):  # x^d = x^(d-L) x^L, x^L = sum l_j x^(L-j)
            top = wide[d]
            if top:
                for j, lj in enumerate(locator, 1):
                    wide[d - j] ^= field_mul(top, lj)
        residue = wide[:degree]
    return residue == x


def set_locator(sums: bytes | bytearray | memoryview, *, path: str | None = None) -> bytes | None:
    """The roots' polynomial of the set D whose odd power sums are ``sums`` (normally the XOR
    of two sketches): l1, ..., lL of the monic P = x^L + l1 x^(L-1) + ... + lL, 4 bytes
    each, whose roots are exactly D when |D| <= c = len(sums) / 4. b"" when D is empty.

    Berlekamp-Massey over S1..S2c (the even sums are squares of earlier ones) gives the
    error locator Lambda(x) = 1 + l1 x + ... + lL x^L, whose roots are D's inverses; P is
    Lambda reversed. None when D cannot be decoded: L > c, lL = 0 (0 would be a root), or
    P lacks L distinct roots in the field (checked, so too large a D is almost always
    caught here rather than as roots the sides do not hold). ValueError when ``sums`` is
    empty, not whole words, or more than `MAX_CAPACITY` words."""
    del path
    odd = _words(sums, "sums")
    capacity = len(odd)
    if not 1 <= capacity <= MAX_CAPACITY:
        raise ValueError(f"sums must hold 1..{MAX_CAPACITY} words")
    syndromes = [0] * (2 * capacity)  # syndromes[k - 1] = S_k
    for k in range(1, 2 * capacity + 1):
        syndromes[k - 1] = odd[k // 2] if k % 2 else field_mul(syndromes[k // 2 - 1],
                                                                syndromes[k // 2 - 1])
    connection, length = _berlekamp_massey(syndromes)
    if length == 0:
        return b""
    locator = connection[1 : length + 1]
    if length > capacity or locator[-1] == 0 or not _splits(locator):
        return None
    return _pack(locator)


def set_roots(elements: bytes | bytearray | memoryview, locator: bytes | bytearray | memoryview,
              *, path: str | None = None) -> list[int]:
    """Indices, ascending, of the 4-byte ``elements`` that are roots of the monic P whose
    lower coefficients are ``locator`` (from `set_locator`; b"": P = 1, no roots). P(e) by
    Horner's rule. ValueError when either is not whole words."""
    del path
    values = _words(elements, "elements")
    coefficients = _words(locator, "locator")
    found = []
    for index, e in enumerate(values):
        value = 1
        for c in coefficients:
            value = field_mul(value, e) ^ c
        if value == 0:
            found.append(index)
    return found
