"""The set sketch (rdc._native set_sketch / set_locator / set_roots): the field is what it
claims, a difference within capacity decodes to exactly each side's part of it, a larger
one never decodes silently wrong, and the C module agrees with setsketch_ref bit for bit on
every code path."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rdc import _native
from rdc._native import setsketch_ref

from .conftest import PURE, scaled

try:
    from rdc._native import _setsketch
except ImportError:  # the pure-Python run may have no build
    if not PURE:
        raise
    _setsketch = None

C_PATHS = _setsketch.paths() if _setsketch is not None else []
needs_c = pytest.mark.skipif(PURE or _setsketch is None, reason="compares C with the reference")

WORD = st.integers(0, 2**32 - 1)
ELEMENT = st.integers(1, 2**32 - 1)


def pack(values: list[int]) -> bytes:
    return b"".join(v.to_bytes(4, "little") for v in values)


def xor(a: bytes, b: bytes) -> bytes:
    return bytes(x ^ y for x, y in zip(a, b, strict=True))


# ------------------------------------------------------------------- polynomials over GF(2)
# Python ints as bit vectors (bit i: the coefficient of x^i), independent of the module.


def clmul(a: int, b: int) -> int:
    product = 0
    for i in range(b.bit_length()):
        if b >> i & 1:
            product ^= a << i
    return product


def polymod(a: int, f: int) -> int:
    degree = f.bit_length() - 1
    while a.bit_length() - 1 >= degree:
        a ^= f << (a.bit_length() - 1 - degree)
    return a


def polygcd(a: int, b: int) -> int:
    while b:
        a, b = b, polymod(a, b)
    return a


def x_to_2_to_the(k: int, f: int) -> int:
    """x^(2^k) mod f, by k squarings."""
    r = 0b10
    for _ in range(k):
        r = polymod(clmul(r, r), f)
    return r


def irreducible(f: int) -> bool:
    """Rabin's test for degree 32, whose only prime factor is 2: f divides x^(2^32) - x,
    and x^(2^16) - x shares no factor with f."""
    assert f.bit_length() - 1 == 32
    return x_to_2_to_the(32, f) == 0b10 and polygcd(x_to_2_to_the(16, f) ^ 0b10, f) == 1


def test_modulus_is_irreducible() -> None:
    assert irreducible(setsketch_ref.MODULUS)
    # and the test can fail: (x + 1)^32, x (x^31 + ...), and a product of two degree-16
    # irreducibles (x^16 + x^5 + x^3 + x^2 + 1, x^16 + x^12 + x^3 + x + 1)
    assert not irreducible((1 << 32) | 1)
    assert not irreducible(setsketch_ref.MODULUS ^ 1 ^ 0b10)
    assert not irreducible(clmul(0x1002D, 0x1100B))


# ------------------------------------------------------------------- the field


def multipliers() -> list[tuple[str, Callable[[int, int], int]]]:
    """The reference's multiply and each C path's."""
    out: list[tuple[str, Callable[[int, int], int]]] = [("ref", setsketch_ref.field_mul)]
    for path in C_PATHS:
        out.append((path, lambda a, b, path=path: _setsketch.field_mul(a, b, path=path)))
    return out


@settings(max_examples=300)
@given(WORD, WORD)
def test_field_mul_is_the_carryless_product_mod_f(a: int, b: int) -> None:
    expected = polymod(clmul(a, b), setsketch_ref.MODULUS)
    for name, mul in multipliers():
        assert mul(a, b) == expected, name


def test_field_mul_edges() -> None:
    top = 2**32 - 1
    for a, b in [(0, 0), (0, top), (1, top), (top, top), (2**31, 2), (2**31, 2**31)]:
        expected = polymod(clmul(a, b), setsketch_ref.MODULUS)
        for name, mul in multipliers():
            assert mul(a, b) == mul(b, a) == expected, name
    assert setsketch_ref.field_mul(2**31, 2) == 0x8D  # x^32 = x^7 + x^3 + x^2 + 1


@given(WORD, WORD, WORD)
def test_field_mul_is_associative_and_distributive(a: int, b: int, c: int) -> None:
    for name, mul in multipliers():
        assert mul(mul(a, b), c) == mul(a, mul(b, c)), name
        assert mul(a, b ^ c) == mul(a, b) ^ mul(a, c), name


@given(ELEMENT)
def test_field_inverse(a: int) -> None:
    assert setsketch_ref.field_mul(a, setsketch_ref.field_inverse(a)) == 1


# ------------------------------------------------------------------- reconciliation


@st.composite
def two_sets(draw: st.DrawFn) -> tuple[int, list[int], list[int], set[int], set[int]]:
    """A capacity c, and sets A, B (in some order) whose symmetric difference has at most c
    elements; also A - B and B - A."""
    capacity = draw(st.integers(1, 8))
    differ = draw(st.integers(0, capacity))
    common = draw(st.integers(0, 12))
    values = draw(st.lists(ELEMENT, min_size=common + differ, max_size=common + differ,
                           unique=True))
    a_count = draw(st.integers(0, differ))
    a_only, b_only = values[:a_count], values[a_count:differ]
    a = draw(st.permutations(values[differ:] + a_only))
    b = draw(st.permutations(values[differ:] + b_only))
    return capacity, a, b, set(a_only), set(b_only)


@given(two_sets())
def test_a_difference_within_capacity_decodes_to_each_sides_part(
    case: tuple[int, list[int], list[int], set[int], set[int]],
) -> None:
    capacity, a, b, a_only, b_only = case
    sums = xor(_native.set_sketch(pack(a), capacity), _native.set_sketch(pack(b), capacity))
    locator = _native.set_locator(sums)
    assert locator is not None
    assert len(locator) == 4 * (len(a_only) + len(b_only))
    assert {a[i] for i in _native.set_roots(pack(a), locator)} == a_only
    assert {b[i] for i in _native.set_roots(pack(b), locator)} == b_only
    roots = _native.set_roots(pack(a), locator)
    assert roots == sorted(roots)


def test_too_large_a_difference_never_decodes_silently_wrong() -> None:
    """|D| = c+1..c+5: set_locator says None, or the polynomial it gives does not have its
    L roots among A and B (the sides' cue to fall back). For c >= 3 the split check makes
    None the usual answer; for c = 1 any nonzero sum is a polynomial that splits."""
    rng = random.Random(7)
    decoded = refused = 0
    for _ in range(scaled(50, 3)):
        for capacity in range(1, 9):
            for extra in range(1, 6):
                differ = capacity + extra
                values = rng.sample(range(1, 2**32), 10 + differ)
                cut = rng.randint(0, differ)
                a = values[differ:] + values[:cut]
                b = values[differ:] + values[cut:differ]
                sums = xor(_native.set_sketch(pack(a), capacity),
                           _native.set_sketch(pack(b), capacity))
                locator = _native.set_locator(sums)
                if locator is None:
                    refused += 1
                    continue
                decoded += 1
                found = len(_native.set_roots(pack(a), locator)) + len(
                    _native.set_roots(pack(b), locator))
                assert found != len(locator) // 4, (capacity, differ)
    assert decoded and refused > decoded


def test_empty_and_equal_sets() -> None:
    assert _native.set_sketch(b"", 5) == bytes(20)
    same = pack([3, 1, 4, 159, 26535])
    assert _native.set_locator(xor(_native.set_sketch(same, 3), _native.set_sketch(same, 3))) == b""
    assert _native.set_locator(bytes(4)) == b""
    assert _native.set_roots(same, b"") == []
    assert _native.set_roots(b"", pack([5])) == []


def test_one_element_is_its_own_sum_and_root() -> None:
    assert _native.set_sketch(pack([0xDEADBEEF]), 1) == pack([0xDEADBEEF])
    assert _native.set_locator(pack([0xDEADBEEF])) == pack([0xDEADBEEF])  # P = x - e
    assert _native.set_roots(pack([7, 0xDEADBEEF, 9]), pack([0xDEADBEEF])) == [1]


def test_sketch_format_unchanged() -> None:
    """The sums are on the wire: a change here is a protocol break."""
    rng = random.Random(20240601)
    digest = hashlib.sha256()
    for capacity in (1, 2, 3, 8, 64):
        for count in (0, 1, 2, 5, 40):
            elements = pack([rng.randrange(1, 2**32) for _ in range(count)])
            digest.update(_native.set_sketch(elements, capacity))
    assert digest.hexdigest()[:32] == "31993709baf650a6592761520b64cfa7"


def implementations() -> list[SimpleNamespace]:
    """The reference, and the C module on each of its paths."""
    out = [SimpleNamespace(name="ref", sketch=setsketch_ref.set_sketch,
                           locator=setsketch_ref.set_locator, roots=setsketch_ref.set_roots)]
    for path in C_PATHS:
        out.append(SimpleNamespace(
            name=path,
            sketch=lambda e, c, path=path: _setsketch.set_sketch(e, c, path=path),
            locator=lambda s, path=path: _setsketch.set_locator(s, path=path),
            roots=lambda e, lo, path=path: _setsketch.set_roots(e, lo, path=path)))
    return out


@pytest.mark.parametrize("impl", implementations(), ids=lambda impl: impl.name)
def test_value_errors(impl: SimpleNamespace) -> None:
    with pytest.raises(ValueError):
        impl.sketch(pack([1, 0, 2]), 4)
    with pytest.raises(ValueError):
        impl.sketch(b"\x01\x00\x00\x00\x01", 4)
    for capacity in (0, -1, 65):
        with pytest.raises(ValueError):
            impl.sketch(pack([1]), capacity)
    for sums in (b"", b"\x01\x02\x03", bytes(4 * 65), bytes(9)):
        with pytest.raises(ValueError):
            impl.locator(sums)
    for elements, locator in ((bytes(5), b""), (bytes(8), bytes(3))):
        with pytest.raises(ValueError):
            impl.roots(elements, locator)
    assert len(impl.sketch(pack([1]), 64)) == 256
    assert impl.locator(bytes(4 * 64)) == b""


@needs_c
def test_the_compiled_module_is_what_runs() -> None:
    assert _native.set_sketch is _setsketch.set_sketch
    assert _native.set_locator is _setsketch.set_locator
    assert _native.set_roots is _setsketch.set_roots
    assert _setsketch.default_path() == C_PATHS[-1]
    with pytest.raises(ValueError):
        _setsketch.set_sketch(b"", 1, path="avx9000")


@needs_c
@settings(max_examples=100)
@given(st.lists(ELEMENT, max_size=40), st.integers(1, 64), st.sampled_from(
    [bytes, bytearray, memoryview]))
def test_c_sketch_matches_the_reference(values: list[int], capacity: int, kind: type) -> None:
    expected = setsketch_ref.set_sketch(pack(values), capacity)
    for path in C_PATHS:
        assert _setsketch.set_sketch(kind(pack(values)), capacity, path=path) == expected


@needs_c
@settings(max_examples=100)
@given(st.lists(WORD, min_size=1, max_size=10), st.lists(ELEMENT, max_size=14, unique=True),
       st.integers(1, 10))
def test_c_locator_and_roots_match_the_reference(
    sums: list[int], values: list[int], capacity: int
) -> None:
    """Arbitrary sums (mostly undecodable), and the sums of a real set of up to
    capacity + 4 elements (decodable or not), with roots searched among that set."""
    real = setsketch_ref.set_sketch(pack(values), capacity)
    for candidate in (pack(sums), real):
        expected = setsketch_ref.set_locator(candidate)
        for path in C_PATHS:
            assert _setsketch.set_locator(memoryview(candidate), path=path) == expected
        elements = pack([*values, 1, 2**32 - 1])
        for locator in (expected or b"", pack(sums)):
            found = setsketch_ref.set_roots(elements, locator)
            for path in C_PATHS:
                assert _setsketch.set_roots(bytearray(elements), locator, path=path) == found


@needs_c
def test_c_roots_on_many_elements() -> None:
    """Past the four-at-a-time loop's tail, with roots at every position mod 4."""
    rng = random.Random(3)
    values = rng.sample(range(1, 2**32), 1003)
    targets = [values[i] for i in (0, 1, 2, 3, 998, 1002)]
    locator = _setsketch.set_locator(_setsketch.set_sketch(pack(targets), 8))
    assert locator is not None
    for path in C_PATHS:
        assert _setsketch.set_roots(pack(values), locator, path=path) == [0, 1, 2, 3, 998, 1002]
        assert _setsketch.set_sketch(pack(values), 7, path=path) == setsketch_ref.set_sketch(
            pack(values), 7)
