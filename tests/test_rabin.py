"""The Rabin fingerprint over GF(2^64) and its fixed primitive polynomial."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from rdc._native import chunker_ref, rabin


def reverse64(value: int) -> int:
    return int(f"{value:064b}"[::-1], 2)


def poly_mulmod(a: int, b: int, modulus: int) -> int:
    """Normal bit order (bit i is x^i): an independent check of the book-order code."""
    result = 0
    while b:
        if b & 1:
            result ^= a
        b >>= 1
        a <<= 1
        if a >> 64 & 1:
            a ^= modulus
    return result


def poly_pow_x(exponent: int, modulus: int) -> int:
    result, base = 1, 2
    while exponent:
        if exponent & 1:
            result = poly_mulmod(result, base, modulus)
        base = poly_mulmod(base, base, modulus)
        exponent >>= 1
    return result


def test_fixed_polynomial_is_primitive_by_the_books_test() -> None:
    assert rabin.is_primitive(rabin.POLY_Q)


def test_fixed_polynomial_is_primitive_independently() -> None:
    modulus = (1 << 64) | reverse64(rabin.POLY_Q)
    order = (1 << 64) - 1
    assert poly_pow_x(order, modulus) == 1
    assert all(poly_pow_x(order // f, modulus) != 1 for f in rabin.FACTORS_2_64_MINUS_1)


def test_factors_multiply_to_the_group_order() -> None:
    product = 1
    for f in rabin.FACTORS_2_64_MINUS_1:
        product *= f
    assert product == (1 << 64) - 1


def test_fixed_polynomial_is_the_first_primitive_candidate_of_its_seed() -> None:
    assert rabin.find_primitive(rabin.RABIN_SEED) == rabin.POLY_Q


def test_primitivity_test_agrees_with_independent_arithmetic() -> None:
    known = reverse64(0b11011)  # x^64 + x^4 + x^3 + x + 1, a known primitive trinomial family
    assert rabin.is_primitive(known)
    candidates = rabin.candidate_polynomials(12345)
    for _ in range(60):
        q = next(candidates)
        modulus = (1 << 64) | reverse64(q)
        order = (1 << 64) - 1
        independent = poly_pow_x(order, modulus) == 1 and all(
            poly_pow_x(order // f, modulus) != 1 for f in rabin.FACTORS_2_64_MINUS_1
        )
        assert rabin.is_primitive(q) == independent
    # x^64 + 1 = (x + 1)^64 is reducible
    assert not rabin.is_primitive(rabin.ONE)


def test_mul_is_polynomial_multiplication_mod_p() -> None:
    rng = random.Random(3)
    modulus = (1 << 64) | reverse64(rabin.POLY_Q)
    for _ in range(50):
        a, b = rng.getrandbits(64), rng.getrandbits(64)
        expected = poly_mulmod(reverse64(a), reverse64(b), modulus)
        assert reverse64(rabin.mul(a, b, rabin.POLY_Q)) == expected


@given(st.binary(max_size=64), st.binary(max_size=64))
def test_fingerprint_of_a_concatenation_extends(a: bytes, b: bytes) -> None:
    assert rabin.extend(rabin.fingerprint(a), b) == rabin.fingerprint(a + b)


@given(st.binary(min_size=1, max_size=40))
def test_eight_byte_tables_agree_with_byte_at_a_time(data: bytes) -> None:
    tables = rabin.byte_tables()
    f = rabin.POLY_Q
    i = 0
    while i + 8 <= len(data):
        f ^= int.from_bytes(data[i : i + 8], "little")
        g = 0
        for lane in range(8):
            g ^= tables[7 - lane][(f >> (8 * lane)) & 0xFF]
        f = g
        i += 8
    assert rabin.extend(f, data[i:]) == rabin.fingerprint(data)


def test_leading_one_separates_runs_of_zeros() -> None:
    prints = {rabin.fingerprint(bytes(n)) for n in range(200)}
    assert len(prints) == 200


@given(st.binary(min_size=80, max_size=200), st.sampled_from([16, 32, 64]))
def test_sliding_window_equals_fingerprint_of_each_window(data: bytes, window: int) -> None:
    out = rabin.sliding_out_table(window)
    table = rabin.byte_tables()[0]
    f = rabin.fingerprint(data[:window])
    for j in range(window + 1, len(data) + 1):
        f = (f >> 8) ^ table[(f ^ data[j - 1]) & 0xFF] ^ out[data[j - 1 - window]]
        assert f == rabin.fingerprint(data[j - window : j])


def test_gear_table_is_the_documented_recipe() -> None:
    values = rabin.splitmix64(chunker_ref.GEAR_SEED)
    recipe = tuple(next(values) for _ in range(256))
    assert recipe == chunker_ref.GEAR
    assert len(set(chunker_ref.GEAR)) == 256
