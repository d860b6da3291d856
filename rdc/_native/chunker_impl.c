/* Winnowing chunker: see chunker_impl.h for the contract, chunker_ref.py for the spec.
 *
 * Filter path. Every position of a window is rolled once and its lead byte stored in a
 * ring; positions up to p + min_size are never rolled (after a cut the roll restarts from
 * scratch on the window bytes before p + min_size + 1). Rolling is the bulk of the work: a
 * long run is rolled as two halves in one loop, the second started from scratch, so that
 * two independent shift-and-add chains share the core. A cut decision over (lo, hi] takes
 * the minimum stored lead (SIMD), records the 64-lead blocks holding it (SIMD, branch
 * free) and walks those candidates from the right: only they can win, so only they may
 * need ext. Two identical windows have identical keys, so a candidate whose window equals
 * that of a candidate to its right loses, and so does the whole stretch of data repeating
 * with that period: it is skipped at once (zeros, short periods). ext values are cached by
 * position, since consecutive windows overlap, and computed with carry-less multiplies
 * where the CPU has them (chosen at run time). The candidates of the last window that lie
 * past the new lo are kept, so no lead is scanned twice. Storing the leads replaces the
 * book's per-position monotone ring, whose data-dependent branches cost more than the
 * roll itself.
 *
 * Baseline path (filter=0): the full key of every position (sliding Rabin) and a plain
 * rightmost-minimum pass per window; the benchmark's reference point.
 */
#include "chunker_impl.h"
#include "le_bytes.h"

#include <stdlib.h>
#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* PCLMULQDQ is not in baseline x86-64: compiled for it separately, used if the CPU has it. */
#if defined(__x86_64__) && defined(__GNUC__)
#define RDC_CLMUL 1
#include <wmmintrin.h>
#endif

uint64_t rdc_gear[256];
uint64_t rdc_rabin[8][256];
#if RDC_CLMUL
static uint64_t clmul_k[8]; /* clmul_k[t] = x^(64t + 63) mod p, for t = 1..7 */
static int have_clmul;
#endif

#define GEAR_SEED 0x7264632D67656172ULL /* "rdc-gear" */
#define POLY_Q 0xF6E5D788CB1A4257ULL    /* x^64 + q is primitive; see rdc/rabin.py */

static uint64_t splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static uint64_t mul_x(uint64_t a) { return (a >> 1) ^ ((a & 1) ? POLY_Q : 0); }

void rdc_init_tables(void) {
    static int done = 0;
    if (done) return;
    uint64_t s = GEAR_SEED;
    for (int i = 0; i < 256; i++) rdc_gear[i] = splitmix64(&s);
    uint64_t f = POLY_Q; /* x^56 * x^8 = x^64 = q */
    for (int a = 0; a < 8; a++) {
        rdc_rabin[a][0] = 0;
        for (int bit = 0x80; bit; bit >>= 1) {
            rdc_rabin[a][bit] = f;
            f = mul_x(f);
        }
        for (int i = 2; i < 256; i <<= 1)
            for (int j = 1; j < i; j++) rdc_rabin[a][i ^ j] = rdc_rabin[a][i] ^ rdc_rabin[a][j];
    }
#if RDC_CLMUL
    uint64_t x = 1ULL << 63; /* x^0 */
    for (int k = 0; k < 512; k++, x = mul_x(x))
        if (k % 64 == 63 && k > 64) clmul_k[k / 64] = x;
    __builtin_cpu_init();
    have_clmul = __builtin_cpu_supports("pclmul");
#endif
    done = 1;
}

uint8_t rdc_lead(const uint8_t *window, size_t n, unsigned shift) {
    uint64_t h = 0;
    for (size_t i = 0; i < n; i++) h = (h << shift) + rdc_gear[window[i]];
    return (uint8_t)(h >> 56);
}

/* f * x^64 mod p, eight bytes of f at a time (book 3.3). */
static inline uint64_t times_x64(uint64_t f) {
    return rdc_rabin[7][f & 0xff] ^ rdc_rabin[6][(f >> 8) & 0xff] ^
           rdc_rabin[5][(f >> 16) & 0xff] ^ rdc_rabin[4][(f >> 24) & 0xff] ^
           rdc_rabin[3][(f >> 32) & 0xff] ^ rdc_rabin[2][(f >> 40) & 0xff] ^
           rdc_rabin[1][(f >> 48) & 0xff] ^ rdc_rabin[0][f >> 56];
}

#if RDC_CLMUL
/* The same fingerprint of n = 8 * words bytes (2 <= words <= 8) with carry-less multiplies.
 * With D_0 .. D_{words-1} the little-endian words of the window,
 *   ext = (q + D_0) x^(64 words) + D_1 x^(64 (words - 1)) + ... + D_{words-1} x^64  mod p.
 * In the book's bit order PCLMULQDQ of a and b gives a * b * x as 128 bits (lo, hi) =
 * lo * x^64 + hi, so D_{words-1-t} x^(64 t + 64) is clmul(D, x^(64 t + 63) mod p): the
 * terms are independent, where the table method chains one x^64 step per word. Their sum
 * (lo, hi) leaves one step: ext = times_x64(lo) + hi. */
__attribute__((target("pclmul"))) static uint64_t ext_clmul(const uint8_t *window, size_t n) {
    size_t words = n / 8;
    __m128i acc = _mm_cvtsi64_si128((long long)load64le(window + n - 8));
    for (size_t t = 1; t < words; t++) {
        uint64_t d = load64le(window + n - 8 - 8 * t);
        if (t == words - 1) d ^= POLY_Q;
        acc = _mm_xor_si128(acc, _mm_clmulepi64_si128(_mm_cvtsi64_si128((long long)d),
                                                      _mm_cvtsi64_si128((long long)clmul_k[t]),
                                                      0x00));
    }
    uint64_t lo = (uint64_t)_mm_cvtsi128_si64(acc);
    uint64_t hi = (uint64_t)_mm_cvtsi128_si64(_mm_unpackhi_epi64(acc, acc));
    return times_x64(lo) ^ hi;
}
#endif

/* Eight bytes per step: XOR them in, then multiply by x^64. */
uint64_t rdc_ext(const uint8_t *window, size_t n) {
#if RDC_CLMUL
    if (have_clmul && n >= 16 && n <= 64 && n % 8 == 0) return ext_clmul(window, n);
#endif
    uint64_t f = POLY_Q;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) f = times_x64(f ^ load64le(window + i));
    for (; i < n; i++) f = (f >> 8) ^ rdc_rabin[0][(f ^ window[i]) & 0xff];
    return f;
}

typedef unsigned __int128 rdc_key; /* (lead << 64) | ext: compares like the pair */

#define EXT_CACHE 1024

/* Candidates by block: position at + k is one iff bit k of bits is set. */
struct rdc_block {
    uint64_t at, bits;
};

struct rdc_chunker {
    uint32_t window, min_size, max_size, shift;
    int filter, finished;
    uint64_t last_cut;
    uint64_t rolled; /* h (and f) are the state at this position; 0: nothing rolled */
    uint64_t h, f;
    size_t mask;     /* ring size - 1 */
    uint8_t *leads;  /* filter: lead of position j at leads[j & mask] */
    rdc_key *keys;     /* baseline: key of position j at keys[j & mask] */
    /* filter: the positions of minimal lead in the last decided window, (prev_lo, prev_hi],
     * as blocks in increasing order */
    struct rdc_block *blocks;
    size_t nblocks;
    uint64_t prev_lo, prev_hi;
    uint8_t prev_min;
    uint64_t out[256]; /* sliding Rabin: drop a leaving byte and the old leading 1 */
    /* filter: ext by position, direct-mapped. Candidates are sparse (1 position in 256 on
     * random data) and a collision only costs a recomputation, so a small table does: a
     * ring-sized one made every new chunker page in and clear hundreds of KiB, which
     * dominated the cost of chunking small files. */
    struct {
        uint64_t pos, val;
    } ext_cache[EXT_CACHE];
    uint64_t ext_evaluations, positions;
};

uint64_t rdc_chunker_last_cut(const rdc_chunker *c) { return c->last_cut; }
uint64_t rdc_chunker_ext_evaluations(const rdc_chunker *c) { return c->ext_evaluations; }
uint64_t rdc_chunker_positions(const rdc_chunker *c) { return c->positions; }

void rdc_chunker_free(rdc_chunker *c) {
    if (!c) return;
    free(c->leads);
    free(c->keys);
    free(c->blocks);
    free(c);
}

static uint64_t extend(uint64_t f, const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n; i++) f = (f >> 8) ^ rdc_rabin[0][(f ^ s[i]) & 0xff];
    return f;
}

/* Blocks of a window (lo, hi], at most: the window is made of the new parts of the
 * decisions whose candidates it kept, each at least min_size + 1 positions long (hi moves
 * with the cut), but the last, which may be shorter at the end of the stream; the blocks of
 * a new part are one per 64 positions plus a partial one at the end of each of its at most
 * two pieces (the ring wraps). Each block also holds a candidate, so no more than the
 * window has positions. One more for the branch-free writer. */
static size_t max_blocks(uint32_t min_size, uint32_t max_size) {
    size_t n = (size_t)(max_size - min_size), parts = n / ((size_t)min_size + 1) + 3;
    size_t bound = n / 64 + 4 * parts;
    return (bound < n ? bound : n) + 1;
}

int rdc_chunker_new(rdc_chunker **out, uint32_t window, uint32_t min_size, uint32_t max_size,
                    int filter) {
    *out = NULL;
    if (!(window == 16 || window == 32 || window == 64)) return RDC_EPARAM;
    if (!(window <= min_size && min_size < max_size && max_size <= RDC_MAX_CHUNK))
        return RDC_EPARAM;
    rdc_init_tables();
    rdc_chunker *c = calloc(1, sizeof *c);
    if (!c) return RDC_ENOMEM;
    c->window = window;
    c->min_size = min_size;
    c->max_size = max_size;
    c->shift = 64 / window;
    c->filter = filter ? 1 : 0;
    /* The rings hold the positions of one window, (lo, hi], at least. */
    size_t ring = 64;
    while (ring < (size_t)max_size + 64) ring <<= 1;
    c->mask = ring - 1;
    if (c->filter) {
        c->leads = malloc(ring);
        c->blocks = malloc(max_blocks(min_size, max_size) * sizeof(struct rdc_block));
    } else {
        c->keys = malloc(ring * sizeof(rdc_key));
    }
    if (c->filter ? (!c->leads || !c->blocks) : !c->keys) {
        rdc_chunker_free(c);
        return RDC_ENOMEM;
    }
    if (c->filter) memset(c->ext_cache, 0xff, sizeof c->ext_cache);
    uint8_t zeros[65] = {0};
    uint64_t lead_one = extend(POLY_Q, zeros, window + 1) ^ extend(POLY_Q, zeros, window);
    /* out[a] = extend(rabin(a), window zero bytes) ^ lead_one, and the first term is linear
     * in a over GF(2): eight extensions and XORs give the table (256 extensions made up
     * most of the cost of a new chunker, paid once per file). */
    c->out[0] = 0;
    for (int bit = 1; bit < 256; bit <<= 1) {
        uint8_t b = (uint8_t)bit;
        c->out[bit] = extend(extend(0, &b, 1), zeros, window);
    }
    for (int i = 2; i < 256; i <<= 1)
        for (int j = 1; j < i; j++) c->out[i ^ j] = c->out[i] ^ c->out[j];
    for (int a = 0; a < 256; a++) c->out[a] ^= lead_one;
    *out = c;
    return RDC_OK;
}

size_t rdc_chunker_max_cuts(const rdc_chunker *c, uint64_t end) {
    return end > c->last_cut ? (size_t)((end - c->last_cut) / (c->min_size + 1) + 1) : 0;
}

/* ------------------------------------------------------------------ rolling */

#if defined(__GNUC__)
#define ALWAYS_INLINE static inline __attribute__((always_inline))
#else
#define ALWAYS_INLINE static inline
#endif

/* Runs shorter than this are rolled as one stream: the second stream's warm-up (window
 * bytes) would not pay. */
#define SPLIT_MIN 512

/* Leads of n consecutive positions into dst[0..n): src[k] is the byte that makes position
 * k from position k - 1, whose state is *hp, or with `scratch` the gear of the window
 * bytes before src. The gear hash forgets everything older than its window, so the second
 * half can start from scratch too and be rolled in the same loop as the first half: two
 * independent dependency chains, each one shift-and-add per byte. (Rolling two positions
 * per step from one state also halves the chain, but costs more instructions per position,
 * and those are the limit here.) The warm-ups of both halves share a loop as well. */
ALWAYS_INLINE void roll_run(const uint8_t *src, size_t n, uint64_t *hp, int scratch,
                            uint8_t *dst, const unsigned S, size_t w) {
    const uint64_t *gear = rdc_gear;
    uint64_t h = *hp;
    if (n < SPLIT_MIN) {
        if (scratch) {
            h = 0;
            for (const uint8_t *b = src - w; b < src; b++) h = (h << S) + gear[*b];
        }
        for (size_t k = 0; k < n; k++) {
            h = (h << S) + gear[src[k]];
            dst[k] = (uint8_t)(h >> 56);
        }
        *hp = h;
        return;
    }
    size_t half = n / 2;
    const uint8_t *src2 = src + half;
    uint8_t *dst2 = dst + half;
    uint64_t g = 0;
    if (scratch) {
        h = 0;
        for (size_t k = 0; k < w; k++) {
            h = (h << S) + gear[src[k - w]];
            g = (g << S) + gear[src2[k - w]];
        }
    } else {
        for (size_t k = 0; k < w; k++) g = (g << S) + gear[src2[k - w]];
    }
    for (size_t k = 0; k < half; k++) {
        h = (h << S) + gear[src[k]];
        g = (g << S) + gear[src2[k]];
        dst[k] = (uint8_t)(h >> 56);
        dst2[k] = (uint8_t)(g >> 56);
    }
    if (n & 1) {
        g = (g << S) + gear[src2[half]];
        dst2[half] = (uint8_t)(g >> 56);
    }
    *hp = g;
}

/* Leads of positions rolled+1 .. target; byte j-1 makes position j. scratch: the state
 * at `rolled` is not kept (the roll restarts after a cut). */
static void roll_leads(rdc_chunker *c, const uint8_t *data, uint64_t base, uint64_t target,
                       int scratch) {
    uint64_t h = c->h, j = c->rolled;
    size_t ring = c->mask + 1, w = c->window;
    c->positions += target - j;
    while (j < target) {
        size_t at = (size_t)((j + 1) & c->mask);
        size_t run = ring - at;
        if (run > target - j) run = (size_t)(target - j);
        const uint8_t *src = data + (j - base);
        uint8_t *dst = c->leads + at;
        switch (c->shift) {
        case 1: roll_run(src, run, &h, scratch, dst, 1, w); break;
        case 2: roll_run(src, run, &h, scratch, dst, 2, w); break;
        default: roll_run(src, run, &h, scratch, dst, 4, w); break;
        }
        scratch = 0;
        j += run;
    }
    c->h = h;
    c->rolled = j;
}

/* Baseline: the full key (lead, ext) of every position, ext by sliding Rabin, as one
 * 72-bit number per position in a ring. */
static void roll_keys(rdc_chunker *c, const uint8_t *data, uint64_t base, uint64_t target) {
    uint64_t h = c->h, f = c->f;
    unsigned s = c->shift;
    size_t w = c->window, mask = c->mask;
    rdc_key *keys = c->keys;
    c->positions += target - c->rolled;
    c->ext_evaluations += target - c->rolled;
    for (uint64_t j = c->rolled + 1; j <= target; j++) {
        uint8_t in = data[j - 1 - base];
        h = (h << s) + rdc_gear[in];
        f = (f >> 8) ^ rdc_rabin[0][(f ^ in) & 0xff] ^ c->out[data[j - 1 - w - base]];
        keys[j & mask] = ((rdc_key)(h >> 56) << 64) | f;
    }
    c->h = h;
    c->f = f;
    c->rolled = target;
}

/* Baseline: make position `first` the rolled one, from scratch. */
static void restart_keys(rdc_chunker *c, const uint8_t *data, uint64_t base, uint64_t first) {
    const uint8_t *w = data + (first - c->window - base);
    uint64_t h = 0;
    for (size_t i = 0; i < c->window; i++) h = (h << c->shift) + rdc_gear[w[i]];
    c->h = h;
    c->rolled = first;
    c->positions++;
    c->f = rdc_ext(w, c->window);
    c->ext_evaluations++;
    c->keys[first & c->mask] = ((rdc_key)(h >> 56) << 64) | c->f;
}

/* Roll up to target, from scratch at the window's first position when the roll is behind
 * it: positions up to last_cut + min_size are never candidates. */
static void roll_to(rdc_chunker *c, const uint8_t *data, uint64_t base, uint64_t target) {
    uint64_t first = c->last_cut + c->min_size + 1;
    if (target < first || target <= c->rolled) return;
    if (c->filter) {
        int scratch = c->rolled < first;
        if (scratch) c->rolled = first - 1;
        roll_leads(c, data, base, target, scratch);
    } else {
        if (c->rolled < first) restart_keys(c, data, base, first);
        roll_keys(c, data, base, target);
    }
}

/* ------------------------------------------------------------------ decisions */

/* Minimum of a[0..n). */
static uint8_t min_leads(const uint8_t *a, size_t n) {
    uint8_t m = 255;
    size_t i = 0;
#if defined(__SSE2__)
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
        m0 = _mm_min_epu8(_mm_min_epu8(m0, m1), _mm_min_epu8(m2, m3));
        m0 = _mm_min_epu8(m0, _mm_srli_si128(m0, 8));
        m0 = _mm_min_epu8(m0, _mm_srli_si128(m0, 4));
        m0 = _mm_min_epu8(m0, _mm_srli_si128(m0, 2));
        m0 = _mm_min_epu8(m0, _mm_srli_si128(m0, 1));
        return (uint8_t)_mm_cvtsi128_si32(m0);
    }
#endif
    for (; i < n; i++) m = a[i] < m ? a[i] : m;
    return m;
}

#if defined(__SSE2__)
/* Bit k set iff p[k] == v, for the 64 bytes at p. */
static inline uint64_t eq_mask64(const uint8_t *p, __m128i v) {
    uint64_t m0 = (uint32_t)_mm_movemask_epi8(_mm_cmpeq_epi8(_mm_loadu_si128((const __m128i *)p), v));
    uint64_t m1 = (uint32_t)_mm_movemask_epi8(
        _mm_cmpeq_epi8(_mm_loadu_si128((const __m128i *)(p + 16)), v));
    uint64_t m2 = (uint32_t)_mm_movemask_epi8(
        _mm_cmpeq_epi8(_mm_loadu_si128((const __m128i *)(p + 32)), v));
    uint64_t m3 = (uint32_t)_mm_movemask_epi8(
        _mm_cmpeq_epi8(_mm_loadu_si128((const __m128i *)(p + 48)), v));
    return m0 | m1 << 16 | m2 << 32 | m3 << 48;
}
#endif

/* Appends to out[count..] the blocks of the positions at, at + 1, ... whose leads a[0..n)
 * equal v; returns the new count. Matches are rare (one position in 256 on random data):
 * a first pass only asks, 64 leads at a time, whether there is one, and keeps the block
 * without a branch (always written, counted if so); a second pass makes the bit masks of
 * the few blocks kept. */
static size_t find_leads(const uint8_t *a, size_t n, uint64_t at, uint8_t v,
                         struct rdc_block *out, size_t count) {
#if defined(__SSE2__)
    if (n >= 64) {
        __m128i needle = _mm_set1_epi8((char)v);
        size_t start = count, i = 0;
        for (; i + 64 <= n; i += 64) {
            __m128i e = _mm_or_si128(
                _mm_or_si128(
                    _mm_cmpeq_epi8(_mm_loadu_si128((const __m128i *)(a + i)), needle),
                    _mm_cmpeq_epi8(_mm_loadu_si128((const __m128i *)(a + i + 16)), needle)),
                _mm_or_si128(
                    _mm_cmpeq_epi8(_mm_loadu_si128((const __m128i *)(a + i + 32)), needle),
                    _mm_cmpeq_epi8(_mm_loadu_si128((const __m128i *)(a + i + 48)), needle)));
            out[count].at = at + i;
            count += _mm_movemask_epi8(e) != 0;
        }
        for (size_t r = start; r < count; r++)
            out[r].bits = eq_mask64(a + (out[r].at - at), needle);
        if (i < n) { /* a last block overlapping the previous one, overlap masked off */
            size_t t = n - 64;
            out[count].at = at + t;
            out[count].bits = eq_mask64(a + t, needle) & (~(uint64_t)0 << (i - t));
            count += out[count].bits != 0;
        }
        return count;
    }
#endif
    for (size_t i = 0; i < n; i += 64) {
        uint64_t bits = 0;
        for (size_t k = 0; k < 64 && i + k < n; k++) bits |= (uint64_t)(a[i + k] == v) << k;
        out[count].at = at + i;
        out[count].bits = bits;
        count += bits != 0;
    }
    return count;
}

/* Windows of random data differ in their first word: check that before the rest. */
static inline int same_window(const uint8_t *a, const uint8_t *b, size_t w) {
    uint64_t diff = load64le(a) ^ load64le(b);
    if (diff) return 0;
    for (size_t i = 8; i < w; i += 8) diff |= load64le(a + i) ^ load64le(b + i);
    return diff == 0;
}

/* Smallest s >= limit with d[y] == d[y + dist] for all y in [s, end). */
static size_t period_start(const uint8_t *d, size_t end, size_t limit, size_t dist) {
    size_t y = end;
#if defined(__SSE2__)
    while (y >= limit + 16) {
        __m128i a = _mm_loadu_si128((const __m128i *)(d + y - 16));
        __m128i b = _mm_loadu_si128((const __m128i *)(d + y - 16 + dist));
        if ((unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(a, b)) != 0xffff) break;
        y -= 16;
    }
#endif
    while (y > limit && d[y - 1] == d[y - 1 + dist]) y--;
    return y;
}

static inline uint64_t ext_at(rdc_chunker *c, uint64_t j, const uint8_t *window) {
    size_t i = (size_t)(j & (EXT_CACHE - 1));
    if (c->ext_cache[i].pos != j) {
        c->ext_cache[i].val = rdc_ext(window, c->window);
        c->ext_cache[i].pos = j;
        c->ext_evaluations++;
    }
    return c->ext_cache[i].val;
}

/* Minimum lead over positions (from - 1, to], in ring pieces. */
static uint8_t range_min(const rdc_chunker *c, uint64_t from, uint64_t to, uint8_t m) {
    size_t ring = c->mask + 1;
    while (from <= to) {
        size_t at = (size_t)(from & c->mask), run = ring - at;
        if (run > to - from + 1) run = (size_t)(to - from + 1);
        uint8_t r = min_leads(c->leads + at, run);
        m = r < m ? r : m;
        from += run;
    }
    return m;
}

/* Appends the blocks of the positions in [from, to] whose lead is v. */
static size_t range_find(rdc_chunker *c, uint64_t from, uint64_t to, uint8_t v, size_t nb) {
    size_t ring = c->mask + 1;
    while (from <= to) {
        size_t at = (size_t)(from & c->mask), run = ring - at;
        if (run > to - from + 1) run = (size_t)(to - from + 1);
        nb = find_leads(c->leads + at, run, from, v, c->blocks, nb);
        from += run;
    }
    return nb;
}

static inline unsigned top_bit(uint64_t bits) { return 63u - (unsigned)__builtin_clzll(bits); }

/* The positions of minimal lead in (lo, hi] into c->blocks. When the last window's
 * candidates reach past lo, the minimum of the part it shares with this one is its
 * minimum, and its candidates there are this one's: only the new part is scanned, so no
 * lead is looked at twice (the book's ring buffer has the same property). */
static void gather(rdc_chunker *c, uint64_t lo, uint64_t hi) {
    struct rdc_block *blocks = c->blocks;
    size_t nb = 0, keep = c->nblocks;
    uint64_t from = lo + 1;
    uint8_t m = 255;
    if (keep && c->prev_lo < lo && lo < c->prev_hi) {
        /* Keep the blocks from the first one with a candidate past lo. */
        while (keep > 0 && blocks[keep - 1].at + top_bit(blocks[keep - 1].bits) > lo) keep--;
        nb = c->nblocks - keep;
    }
    if (nb) {
        memmove(blocks, blocks + keep, nb * sizeof *blocks);
        if (blocks[0].at <= lo) blocks[0].bits &= ~(uint64_t)0 << (lo + 1 - blocks[0].at);
        m = c->prev_min;
        from = c->prev_hi + 1;
    }
    if (from <= hi) {
        uint8_t fresh = range_min(c, from, hi, 255);
        if (fresh < m) {
            nb = 0;
            m = fresh;
        }
        if (fresh == m) nb = range_find(c, from, hi, m, nb);
    }
    c->nblocks = nb;
    c->prev_min = m;
    c->prev_lo = lo;
    c->prev_hi = hi;
}

/* Rightmost minimal key in (lo, hi], all rolled. Only positions of minimal lead can win:
 * find them (SIMD), then walk them from the right. A candidate whose window equals that of
 * a candidate to its right has the same key and loses the tie, and then so does every
 * candidate in the stretch of data repeating with that period: it is skipped as a whole
 * (this keeps zeros and short periods cheap). The rest compare by ext, cached by position
 * since consecutive windows overlap. */
static uint64_t decide_filter(rdc_chunker *c, const uint8_t *data, uint64_t base, uint64_t lo,
                              uint64_t hi) {
    size_t w = c->window;
    gather(c, lo, hi);
    const struct rdc_block *blocks = c->blocks;
    size_t nb = c->nblocks - 1;
    uint64_t first = lo + 1;
    uint64_t bits = blocks[nb].bits, block = blocks[nb].at;
    unsigned top = top_bit(bits);
    bits &= ~((uint64_t)1 << top);
    uint64_t best = block + top, prev = best;
    uint64_t best_ext = 0;
    int have_best_ext = 0;
    for (;;) {
        while (!bits) {
            if (!nb) return best;
            nb--;
            bits = blocks[nb].bits;
            block = blocks[nb].at;
        }
        top = top_bit(bits);
        bits &= ~((uint64_t)1 << top);
        uint64_t j = block + top;
        const uint8_t *window = data + (j - w - base);
        uint64_t twin = same_window(window, data + (prev - w - base), w)   ? prev
                        : same_window(window, data + (best - w - base), w) ? best
                                                                          : 0;
        if (twin) {
            /* Bytes [s, twin) repeat with period twin - j, so every candidate c in
             * [s + w, j] has the window of c + (twin - j): only those below s + w remain. */
            uint64_t s = base + period_start(data, j - w - base, first - w - base, twin - j);
            uint64_t limit = s + w; /* candidates < limit remain */
            if (limit <= first) return best;
            /* Drop the blocks starting at or past limit, then the bits past it. */
            if (block >= limit) {
                size_t lo_i = 0, hi_i = nb; /* blocks [0, nb) start before block */
                while (lo_i < hi_i) {
                    size_t mid = (lo_i + hi_i) / 2;
                    if (blocks[mid].at < limit)
                        lo_i = mid + 1;
                    else
                        hi_i = mid;
                }
                nb = lo_i;
                if (!nb) return best;
                nb--;
                bits = blocks[nb].bits;
                block = blocks[nb].at;
            }
            if (limit - block < 64) bits &= ((uint64_t)1 << (limit - block)) - 1;
            prev = j;
            continue;
        }
        prev = j;
        if (!have_best_ext) {
            best_ext = ext_at(c, best, data + (best - w - base));
            have_best_ext = 1;
        }
        uint64_t e = ext_at(c, j, window);
        if (e < best_ext) {
            best = j;
            best_ext = e;
        }
    }
}

/* Baseline: rightmost minimal key in (lo, hi] by one pass over the stored keys. (The
 * book's monotone deque gives the same cuts but measured 2.5x slower here: its pops are
 * unpredictable branches on random keys.) */
static uint64_t decide_baseline(const rdc_chunker *c, uint64_t lo, uint64_t hi) {
    rdc_key best = ~(rdc_key)0;
    uint64_t at = lo + 1;
    for (uint64_t j = lo + 1; j <= hi; j++) {
        rdc_key k = c->keys[j & c->mask];
        if (k <= best) {
            best = k;
            at = j;
        }
    }
    return at;
}

int rdc_chunker_scan(rdc_chunker *c, const uint8_t *data, size_t len, uint64_t base, int final,
                     uint64_t *cuts, size_t *ncuts) {
    *ncuts = 0;
    if (c->finished) return RDC_EFINAL;
    if (base > c->last_cut) return RDC_EORDER;
    uint64_t end = base + len;
    while (c->last_cut < end) {
        uint64_t p = c->last_cut, lo = p + c->min_size, hi = p + c->max_size;
        uint64_t cut;
        if (hi > end) {
            if (!final) {
                roll_to(c, data, base, end);
                break;
            }
            hi = end;
        }
        if (hi <= lo) {
            cut = end;
        } else {
            roll_to(c, data, base, hi);
            cut = c->filter ? decide_filter(c, data, base, lo, hi) : decide_baseline(c, lo, hi);
        }
        cuts[(*ncuts)++] = cut;
        c->last_cut = cut;
    }
    if (final) c->finished = 1;
    return RDC_OK;
}
