/* The chunker's code paths (chunker_scan.h): the portable kernels, the table fingerprint,
 * and which paths this CPU can run. The x86 kernels are in chunker_x86.c. */
#include "chunker_scan.h"

#include "le_bytes.h"

uint64_t rdc_clmul_k[8];

/* Eight bytes per step: XOR them in, then multiply by x^64. */
uint64_t rdc_ext_table(const uint8_t *window, size_t n) {
    uint64_t f = RDC_POLY_Q;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) f = rdc_times_x64(f ^ load64le(window + i));
    for (; i < n; i++) f = (f >> 8) ^ rdc_rabin[0][(f ^ window[i]) & 0xff];
    return f;
}

void rdc_ext_table_many(const uint8_t *const *windows, size_t count, size_t n, uint64_t *out) {
    for (size_t i = 0; i < count; i++) out[i] = rdc_ext_table(windows[i], n);
}

static uint8_t min_leads_portable(const uint8_t *a, size_t n) {
    uint8_t m = 255;
    for (size_t i = 0; i < n; i++) m = a[i] < m ? a[i] : m;
    return m;
}

#define LOW7 0x7F7F7F7F7F7F7F7FULL
#define HIGH1 0x8080808080808080ULL

/* The high bit of each byte of x that is zero, the others clear (exact: no borrows). */
static inline uint64_t zero_bytes(uint64_t x) { return ~(((x & LOW7) + LOW7) | x) & HIGH1; }

/* Bit k set iff byte k of the word at p equals the byte repeated in vv. */
static inline uint64_t eq_bits8(const uint8_t *p, uint64_t vv) {
    return (zero_bytes(load64le(p) ^ vv) >> 7) * 0x0102040810204080ULL >> 56;
}

/* Eight leads per word (SWAR); a block of 64 without a match is skipped after one test. */
static size_t find_leads_portable(const uint8_t *a, size_t n, uint64_t at, uint8_t v,
                                  struct rdc_block *out, size_t count) {
    uint64_t vv = v * 0x0101010101010101ULL;
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        uint64_t any = 0;
        for (size_t k = 0; k < 64; k += 8) any |= zero_bytes(load64le(a + i + k) ^ vv);
        if (!any) continue;
        uint64_t bits = 0;
        for (size_t k = 0; k < 64; k += 8) bits |= eq_bits8(a + i + k, vv) << k;
        out[count].at = at + i;
        out[count++].bits = bits;
    }
    if (i < n) {
        uint64_t bits = 0;
        for (size_t k = 0; i + k < n; k++) bits |= (uint64_t)(a[i + k] == v) << k;
        out[count].at = at + i;
        out[count].bits = bits;
        count += bits != 0;
    }
    return count;
}

static size_t period_start_portable(const uint8_t *d, size_t end, size_t limit, size_t dist) {
    size_t y = end;
    while (y >= limit + 8 && load64le(d + y - 8) == load64le(d + y - 8 + dist)) y -= 8;
    while (y > limit && d[y - 1] == d[y - 1 + dist]) y--;
    return y;
}

static const struct rdc_scan_kernel rdc_scan_portable = {
    min_leads_portable, find_leads_portable, period_start_portable, rdc_ext_table,
    rdc_ext_table_many,
};

static const char *const path_names[RDC_CHUNKER_PATHS] = {"portable", "sse2", "avx2"};

const char *rdc_chunker_path_name(int path) {
    return path >= 0 && path < RDC_CHUNKER_PATHS ? path_names[path] : NULL;
}

int rdc_chunker_path_available(int path) {
    switch (path) {
    case RDC_CHUNKER_PORTABLE: return 1;
#ifdef RDC_CHUNKER_X86
    case RDC_CHUNKER_SSE2: __builtin_cpu_init(); return __builtin_cpu_supports("sse2");
    case RDC_CHUNKER_AVX2:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("pclmul");
#endif
    default: return 0;
    }
}

int rdc_chunker_best_path(void) {
    int path = RDC_CHUNKER_PATHS - 1;
    while (path > RDC_CHUNKER_PORTABLE && !rdc_chunker_path_available(path)) path--;
    return path;
}

/* The kernels of an available path. */
const struct rdc_scan_kernel *rdc_scan_kernel_of(int path) {
    switch (path) {
#ifdef RDC_CHUNKER_X86
    case RDC_CHUNKER_SSE2: return &rdc_scan_sse2;
    case RDC_CHUNKER_AVX2: return &rdc_scan_avx2;
#endif
    default: return &rdc_scan_portable;
    }
}
