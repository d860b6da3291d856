/* The x86 paths of the chunker's decisions (chunker_scan.h): SSE2 (16 leads per operation)
 * and AVX2 (32). Each function carries its own target attribute, so this file builds for
 * any x86-64 and chunker_impl.c calls a path only where the CPU has its instructions. */
#include "chunker_scan.h"

#ifdef RDC_CHUNKER_X86

#include <immintrin.h>

#include "le_bytes.h"

#define TARGET_SSE2 __attribute__((target("sse2")))
#define TARGET_AVX2 __attribute__((target("avx2")))
#define TARGET_CLMUL __attribute__((target("sse2,pclmul")))

/* ---------------------------------------------------------------- SSE2 */

TARGET_SSE2 static uint8_t hmin128(__m128i m) {
    m = _mm_min_epu8(m, _mm_srli_si128(m, 8));
    m = _mm_min_epu8(m, _mm_srli_si128(m, 4));
    m = _mm_min_epu8(m, _mm_srli_si128(m, 2));
    m = _mm_min_epu8(m, _mm_srli_si128(m, 1));
    return (uint8_t)_mm_cvtsi128_si32(m);
}

TARGET_SSE2 static uint8_t min_leads_sse2(const uint8_t *a, size_t n) {
    uint8_t m = 255;
    size_t i = 0;
    if (n >= 16) {
        __m128i m0 = _mm_set1_epi8(-1), m1 = m0, m2 = m0, m3 = m0;
        for (; i + 64 <= n; i += 64) {
            m0 = _mm_min_epu8(m0, _mm_loadu_si128((const __m128i *)(a + i)));
            m1 = _mm_min_epu8(m1, _mm_loadu_si128((const __m128i *)(a + i + 16)));
            m2 = _mm_min_epu8(m2, _mm_loadu_si128((const __m128i *)(a + i + 32)));
            m3 = _mm_min_epu8(m3, _mm_loadu_si128((const __m128i *)(a + i + 48)));
        }
        for (; i + 16 <= n; i += 16)
            m0 = _mm_min_epu8(m0, _mm_loadu_si128((const __m128i *)(a + i)));
        /* The last block overlaps the previous ones: harmless for a minimum. */
        m0 = _mm_min_epu8(m0, _mm_loadu_si128((const __m128i *)(a + n - 16)));
        return hmin128(_mm_min_epu8(_mm_min_epu8(m0, m1), _mm_min_epu8(m2, m3)));
    }
    for (; i < n; i++) m = a[i] < m ? a[i] : m;
    return m;
}

/* Bit k set iff p[k] == v, for the 64 bytes at p. */
TARGET_SSE2 static inline uint64_t eq_mask64_sse2(const uint8_t *p, __m128i v) {
    uint64_t m0 = (uint32_t)_mm_movemask_epi8(
        _mm_cmpeq_epi8(_mm_loadu_si128((const __m128i *)p), v));
    uint64_t m1 = (uint32_t)_mm_movemask_epi8(
        _mm_cmpeq_epi8(_mm_loadu_si128((const __m128i *)(p + 16)), v));
    uint64_t m2 = (uint32_t)_mm_movemask_epi8(
        _mm_cmpeq_epi8(_mm_loadu_si128((const __m128i *)(p + 32)), v));
    uint64_t m3 = (uint32_t)_mm_movemask_epi8(
        _mm_cmpeq_epi8(_mm_loadu_si128((const __m128i *)(p + 48)), v));
    return m0 | m1 << 16 | m2 << 32 | m3 << 48;
}

/* Blocks of a short run (n < 64), one bit at a time. */
static size_t find_leads_short(const uint8_t *a, size_t n, uint64_t at, uint8_t v,
                               struct rdc_block *out, size_t count) {
    uint64_t bits = 0;
    for (size_t k = 0; k < n; k++) bits |= (uint64_t)(a[k] == v) << k;
    out[count].at = at;
    out[count].bits = bits;
    return count + (bits != 0);
}

/* Matches are rare (one position in 256 on random data): a first pass only asks, 64 leads
 * at a time, whether there is one, and keeps the block without a branch (always written,
 * counted if so); a second pass makes the bit masks of the few blocks kept. */
TARGET_SSE2 static size_t find_leads_sse2(const uint8_t *a, size_t n, uint64_t at, uint8_t v,
                                          struct rdc_block *out, size_t count) {
    if (n < 64) return find_leads_short(a, n, at, v, out, count);
    __m128i needle = _mm_set1_epi8((char)v);
    size_t start = count, i = 0;
    for (; i + 64 <= n; i += 64) {
        __m128i e = _mm_or_si128(
            _mm_or_si128(_mm_cmpeq_epi8(_mm_loadu_si128((const __m128i *)(a + i)), needle),
                         _mm_cmpeq_epi8(_mm_loadu_si128((const __m128i *)(a + i + 16)), needle)),
            _mm_or_si128(
                _mm_cmpeq_epi8(_mm_loadu_si128((const __m128i *)(a + i + 32)), needle),
                _mm_cmpeq_epi8(_mm_loadu_si128((const __m128i *)(a + i + 48)), needle)));
        out[count].at = at + i;
        count += _mm_movemask_epi8(e) != 0;
    }
    for (size_t r = start; r < count; r++)
        out[r].bits = eq_mask64_sse2(a + (out[r].at - at), needle);
    if (i < n) { /* a last block overlapping the previous one, overlap masked off */
        size_t t = n - 64;
        out[count].at = at + t;
        out[count].bits = eq_mask64_sse2(a + t, needle) & (~(uint64_t)0 << (i - t));
        count += out[count].bits != 0;
    }
    return count;
}

TARGET_SSE2 static size_t period_start_sse2(const uint8_t *d, size_t end, size_t limit,
                                            size_t dist) {
    size_t y = end;
    while (y >= limit + 16) {
        __m128i a = _mm_loadu_si128((const __m128i *)(d + y - 16));
        __m128i b = _mm_loadu_si128((const __m128i *)(d + y - 16 + dist));
        if ((unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(a, b)) != 0xffff) break;
        y -= 16;
    }
    while (y > limit && d[y - 1] == d[y - 1 + dist]) y--;
    return y;
}

const struct rdc_scan_kernel rdc_scan_sse2 = {
    min_leads_sse2, find_leads_sse2, period_start_sse2, rdc_ext_table, rdc_ext_table_many,
};

/* ---------------------------------------------------------------- AVX2 */

TARGET_AVX2 static uint8_t min_leads_avx2(const uint8_t *a, size_t n) {
    if (n < 32) return min_leads_sse2(a, n);
    __m256i m0 = _mm256_set1_epi8(-1), m1 = m0, m2 = m0, m3 = m0;
    size_t i = 0;
    for (; i + 128 <= n; i += 128) {
        m0 = _mm256_min_epu8(m0, _mm256_loadu_si256((const __m256i *)(a + i)));
        m1 = _mm256_min_epu8(m1, _mm256_loadu_si256((const __m256i *)(a + i + 32)));
        m2 = _mm256_min_epu8(m2, _mm256_loadu_si256((const __m256i *)(a + i + 64)));
        m3 = _mm256_min_epu8(m3, _mm256_loadu_si256((const __m256i *)(a + i + 96)));
    }
    for (; i + 32 <= n; i += 32)
        m0 = _mm256_min_epu8(m0, _mm256_loadu_si256((const __m256i *)(a + i)));
    m0 = _mm256_min_epu8(m0, _mm256_loadu_si256((const __m256i *)(a + n - 32)));
    m0 = _mm256_min_epu8(_mm256_min_epu8(m0, m1), _mm256_min_epu8(m2, m3));
    return hmin128(
        _mm_min_epu8(_mm256_castsi256_si128(m0), _mm256_extracti128_si256(m0, 1)));
}

TARGET_AVX2 static inline uint64_t eq_mask64_avx2(const uint8_t *p, __m256i v) {
    uint64_t lo = (uint32_t)_mm256_movemask_epi8(
        _mm256_cmpeq_epi8(_mm256_loadu_si256((const __m256i *)p), v));
    uint64_t hi = (uint32_t)_mm256_movemask_epi8(
        _mm256_cmpeq_epi8(_mm256_loadu_si256((const __m256i *)(p + 32)), v));
    return lo | hi << 32;
}

/* As find_leads_sse2, 128 leads per step of the first pass. */
TARGET_AVX2 static size_t find_leads_avx2(const uint8_t *a, size_t n, uint64_t at, uint8_t v,
                                          struct rdc_block *out, size_t count) {
    if (n < 64) return find_leads_short(a, n, at, v, out, count);
    __m256i needle = _mm256_set1_epi8((char)v);
    size_t start = count, i = 0;
    for (; i + 64 <= n; i += 64) {
        __m256i e = _mm256_or_si256(
            _mm256_cmpeq_epi8(_mm256_loadu_si256((const __m256i *)(a + i)), needle),
            _mm256_cmpeq_epi8(_mm256_loadu_si256((const __m256i *)(a + i + 32)), needle));
        out[count].at = at + i;
        count += !_mm256_testz_si256(e, e);
    }
    for (size_t r = start; r < count; r++)
        out[r].bits = eq_mask64_avx2(a + (out[r].at - at), needle);
    if (i < n) {
        size_t t = n - 64;
        out[count].at = at + t;
        out[count].bits = eq_mask64_avx2(a + t, needle) & (~(uint64_t)0 << (i - t));
        count += out[count].bits != 0;
    }
    return count;
}

TARGET_AVX2 static size_t period_start_avx2(const uint8_t *d, size_t end, size_t limit,
                                            size_t dist) {
    size_t y = end;
    while (y >= limit + 32) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(d + y - 32));
        __m256i b = _mm256_loadu_si256((const __m256i *)(d + y - 32 + dist));
        if ((unsigned)_mm256_movemask_epi8(_mm256_cmpeq_epi8(a, b)) != 0xffffffffu) break;
        y -= 32;
    }
    while (y > limit && d[y - 1] == d[y - 1 + dist]) y--;
    return y;
}

/* floor(x^128 / p) - x^64 in the book's (reflected) bit order: Barrett's constant for
 * reducing a 128-bit product mod p (p = x^64 + q). */
#define BARRETT_MU 0x3EF08D6EA3069C89ULL

TARGET_CLMUL static inline __m128i clmul64(uint64_t a, uint64_t b) {
    return _mm_clmulepi64_si128(_mm_cvtsi64_si128((long long)a), _mm_cvtsi64_si128((long long)b),
                                0x00);
}

/* L * x^64 mod p by Barrett reduction: the quotient is L + floor(L mu' / x^64), the
 * remainder the low 64 coefficients of quotient * q. PCLMULQDQ's result (lo, hi) is the
 * product times x as lo * x^64 + hi (below), so each half read is shifted by one place. */
TARGET_CLMUL static inline uint64_t times_x64_clmul(uint64_t l) {
    uint64_t quotient = l ^ (uint64_t)_mm_cvtsi128_si64(clmul64(l, BARRETT_MU)) << 1;
    __m128i r = clmul64(quotient, RDC_POLY_Q);
    uint64_t lo = (uint64_t)_mm_cvtsi128_si64(r);
    uint64_t hi = (uint64_t)_mm_cvtsi128_si64(_mm_unpackhi_epi64(r, r));
    return hi << 1 | lo >> 63;
}

/* The fingerprint of n = 8 * words bytes (2 <= words <= 8) with carry-less multiplies.
 * With D_0 .. D_{words-1} the little-endian words of the window,
 *   ext = (q + D_0) x^(64 words) + D_1 x^(64 (words - 1)) + ... + D_{words-1} x^64  mod p.
 * In the book's bit order PCLMULQDQ of a and b gives a * b * x as 128 bits (lo, hi) =
 * lo * x^64 + hi, so D_{words-1-t} x^(64 t + 64) is clmul(D, x^(64 t + 63) mod p): the
 * terms are independent, where the table method chains one x^64 step per word. Their sum
 * (lo, hi) leaves one step: ext = lo * x^64 + hi, reduced by two more multiplies. */
TARGET_CLMUL static inline uint64_t ext_clmul(const uint8_t *window, size_t n) {
    size_t words = n / 8;
    __m128i acc = _mm_cvtsi64_si128((long long)load64le(window + n - 8));
    for (size_t t = 1; t < words; t++) {
        uint64_t d = load64le(window + n - 8 - 8 * t);
        if (t == words - 1) d ^= RDC_POLY_Q;
        acc = _mm_xor_si128(acc, clmul64(d, rdc_clmul_k[t]));
    }
    uint64_t lo = (uint64_t)_mm_cvtsi128_si64(acc);
    uint64_t hi = (uint64_t)_mm_cvtsi128_si64(_mm_unpackhi_epi64(acc, acc));
    return times_x64_clmul(lo) ^ hi;
}

TARGET_CLMUL static uint64_t ext_clmul_one(const uint8_t *window, size_t n) {
    return ext_clmul(window, n);
}

TARGET_CLMUL static void ext_clmul_many(const uint8_t *const *windows, size_t count, size_t n,
                                        uint64_t *out) {
    for (size_t i = 0; i < count; i++) out[i] = ext_clmul(windows[i], n);
}

const struct rdc_scan_kernel rdc_scan_avx2 = {
    min_leads_avx2, find_leads_avx2, period_start_avx2, ext_clmul_one, ext_clmul_many,
};

#endif
