/* Internal to chunker_impl.c and chunker_x86.c: the per-path kernels of the chunker's
 * decisions. A path is one set of them for an instruction-set level; all give the same
 * results, and chunker_impl.c picks one per chunker (rdc_chunker_configure).
 */
#ifndef RDC_CHUNKER_SCAN_H
#define RDC_CHUNKER_SCAN_H

#include <stddef.h>
#include <stdint.h>

#include "chunker_impl.h"

/* Candidates by block: position at + k is one iff bit k of bits is set. */
struct rdc_block {
    uint64_t at, bits;
};

struct rdc_scan_kernel {
    /* Minimum of a[0..n), 255 for n == 0. */
    uint8_t (*min_leads)(const uint8_t *a, size_t n);
    /* Appends to out[count..] the blocks of the positions at, at + 1, ... whose leads
     * a[0..n) equal v, in increasing order, and returns the new count. out needs room for
     * n / 64 + 2 more blocks (one is written past the last kept block). */
    size_t (*find_leads)(const uint8_t *a, size_t n, uint64_t at, uint8_t v,
                         struct rdc_block *out, size_t count);
    /* Smallest s >= limit with d[y] == d[y + dist] for all y in [s, end). */
    size_t (*period_start)(const uint8_t *d, size_t end, size_t limit, size_t dist);
    /* The Rabin fingerprint of one window of n bytes, 16 <= n <= 64, n a multiple of 8. */
    uint64_t (*ext)(const uint8_t *window, size_t n);
    /* The same of count windows into out[0..count): independent, so they overlap. */
    void (*ext_many)(const uint8_t *const *windows, size_t count, size_t n, uint64_t *out);
};

#define RDC_POLY_Q 0xF6E5D788CB1A4257ULL /* x^64 + q is primitive; see rdc/rabin.py */

/* x^(64t + 63) mod p for t = 1..7: the carry-less multiply fingerprint's constants, set by
 * rdc_init_tables. */
extern uint64_t rdc_clmul_k[8];

/* f * x^64 mod p, eight bytes of f at a time (book 3.3). */
static inline uint64_t rdc_times_x64(uint64_t f) {
    return rdc_rabin[7][f & 0xff] ^ rdc_rabin[6][(f >> 8) & 0xff] ^
           rdc_rabin[5][(f >> 16) & 0xff] ^ rdc_rabin[4][(f >> 24) & 0xff] ^
           rdc_rabin[3][(f >> 32) & 0xff] ^ rdc_rabin[2][(f >> 40) & 0xff] ^
           rdc_rabin[1][(f >> 48) & 0xff] ^ rdc_rabin[0][f >> 56];
}

/* chunker_scan.c: the table fingerprint (any n), of many windows, and the kernels of an
 * available path. */
uint64_t rdc_ext_table(const uint8_t *window, size_t n);
void rdc_ext_table_many(const uint8_t *const *windows, size_t count, size_t n, uint64_t *out);
const struct rdc_scan_kernel *rdc_scan_kernel_of(int path);

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define RDC_CHUNKER_X86 1
/* chunker_x86.c: SSE2 scanning with the table fingerprint (any x86-64), and AVX2 scanning
 * with the carry-less multiply fingerprint (AVX2 and PCLMULQDQ). */
extern const struct rdc_scan_kernel rdc_scan_sse2, rdc_scan_avx2;
#endif

#endif
