/* Winnowing chunker: see chunker_impl.h for the contract, chunker_ref.py for the spec.
 *
 * Filter path. Every position's lead byte is rolled once and stored in a ring. A cut
 * decision over (lo, hi] takes the minimum stored lead (SIMD), then walks the positions
 * holding that lead from the right: only those can win, so only they may need ext. Two
 * identical windows have identical keys, so a candidate whose window equals the current
 * best's is skipped without ext (this keeps zeros and short periods cheap). ext values
 * are cached by position, since consecutive windows overlap. Stored leads make rescanning
 * the overlap of consecutive windows a matter of a SIMD pass, not a re-roll: this replaces
 * the book's per-position monotone ring, whose data-dependent branches cost more than the
 * roll itself.
 *
 * Baseline path (filter=0): the full key of every position (sliding Rabin) and a plain
 * rightmost-minimum pass per window; the benchmark's reference point.
 */
#include "chunker_impl.h"

#include <stdlib.h>
#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

uint64_t rdc_gear[256];
uint64_t rdc_rabin[8][256];

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
    done = 1;
}

static inline uint64_t load64le(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

uint8_t rdc_lead(const uint8_t *window, size_t n, unsigned shift) {
    uint64_t h = 0;
    for (size_t i = 0; i < n; i++) h = (h << shift) + rdc_gear[window[i]];
    return (uint8_t)(h >> 56);
}

/* Eight bytes per step (book 3.3): XOR them in, then multiply by x^64 lane by lane. */
uint64_t rdc_ext(const uint8_t *window, size_t n) {
    uint64_t f = POLY_Q;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        f ^= load64le(window + i);
        f = rdc_rabin[7][f & 0xff] ^ rdc_rabin[6][(f >> 8) & 0xff] ^
            rdc_rabin[5][(f >> 16) & 0xff] ^ rdc_rabin[4][(f >> 24) & 0xff] ^
            rdc_rabin[3][(f >> 32) & 0xff] ^ rdc_rabin[2][(f >> 40) & 0xff] ^
            rdc_rabin[1][(f >> 48) & 0xff] ^ rdc_rabin[0][f >> 56];
    }
    for (; i < n; i++) f = (f >> 8) ^ rdc_rabin[0][(f ^ window[i]) & 0xff];
    return f;
}

typedef unsigned __int128 rdc_key; /* (lead << 64) | ext: compares like the pair */

struct rdc_chunker {
    uint32_t window, min_size, max_size, shift;
    int filter, finished;
    uint64_t last_cut;
    uint64_t rolled; /* h (and f) are the state at this position; 0: nothing rolled */
    uint64_t h, f;
    size_t mask;     /* ring size - 1 */
    uint8_t *leads;  /* filter: lead of position j at leads[j & mask] */
    uint64_t *ext_val; /* filter: cached ext by position */
    uint64_t *ext_pos; /* filter: ext_val[i] is valid for position ext_pos[i] */
    rdc_key *keys;     /* baseline: key of position j at keys[j & mask] */
    uint64_t *cand;    /* filter: positions of minimal lead in the last decided window */
    size_t ncand;
    uint64_t prev_hi;  /* filter: the last decided window ended here, minimum lead prev_min */
    uint8_t prev_min;
    uint64_t gear_shifted[256];
    uint64_t out[256]; /* sliding Rabin: drop a leaving byte and the old leading 1 */
    uint64_t ext_evaluations, positions;
};

uint64_t rdc_chunker_last_cut(const rdc_chunker *c) { return c->last_cut; }
uint64_t rdc_chunker_ext_evaluations(const rdc_chunker *c) { return c->ext_evaluations; }
uint64_t rdc_chunker_positions(const rdc_chunker *c) { return c->positions; }

void rdc_chunker_free(rdc_chunker *c) {
    if (!c) return;
    free(c->leads);
    free(c->ext_val);
    free(c->ext_pos);
    free(c->keys);
    free(c->cand);
    free(c);
}

static uint64_t extend(uint64_t f, const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n; i++) f = (f >> 8) ^ rdc_rabin[0][(f ^ s[i]) & 0xff];
    return f;
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
        c->ext_val = malloc(ring * sizeof(uint64_t));
        c->ext_pos = malloc(ring * sizeof(uint64_t));
        c->cand = malloc((size_t)max_size * sizeof(uint64_t));
    } else {
        c->keys = malloc(ring * sizeof(rdc_key));
    }
    if (c->filter ? (!c->leads || !c->ext_val || !c->ext_pos || !c->cand) : !c->keys) {
        rdc_chunker_free(c);
        return RDC_ENOMEM;
    }
    if (c->filter) memset(c->ext_pos, 0xff, ring * sizeof(uint64_t));
    for (int i = 0; i < 256; i++) c->gear_shifted[i] = rdc_gear[i] << c->shift;
    uint8_t zeros[65] = {0};
    uint64_t lead_one = extend(POLY_Q, zeros, window + 1) ^ extend(POLY_Q, zeros, window);
    for (int a = 0; a < 256; a++) {
        uint8_t b = (uint8_t)a;
        c->out[a] = extend(extend(0, &b, 1), zeros, window) ^ lead_one;
    }
    *out = c;
    return RDC_OK;
}

size_t rdc_chunker_max_cuts(const rdc_chunker *c, uint64_t end) {
    return end > c->last_cut ? (size_t)((end - c->last_cut) / (c->min_size + 1) + 1) : 0;
}

/* ------------------------------------------------------------------ rolling */

/* Leads of positions rolled+1 .. target; byte j-1 makes position j. Two positions per
 * step from one state halves the dependency chain (FastCDC 2020). */
#define ROLL_LEADS(S)                                                        \
    do {                                                                     \
        size_t k = 0;                                                        \
        for (; k + 2 <= run; k += 2) {                                       \
            uint8_t b0 = src[k], b1 = src[k + 1];                            \
            uint64_t h1 = (h << (S)) + gear[b0];                             \
            h = (h << (2 * (S))) + (gs[b0] + gear[b1]);                      \
            dst[k] = (uint8_t)(h1 >> 56);                                    \
            dst[k + 1] = (uint8_t)(h >> 56);                                 \
        }                                                                    \
        for (; k < run; k++) {                                               \
            h = (h << (S)) + gear[src[k]];                                   \
            dst[k] = (uint8_t)(h >> 56);                                     \
        }                                                                    \
    } while (0)

static void roll_leads(rdc_chunker *c, const uint8_t *data, uint64_t base, uint64_t target) {
    const uint64_t *gear = rdc_gear, *gs = c->gear_shifted;
    uint64_t h = c->h, j = c->rolled;
    size_t ring = c->mask + 1;
    c->positions += target - j;
    while (j < target) {
        size_t at = (size_t)((j + 1) & c->mask);
        size_t run = ring - at;
        if (run > target - j) run = (size_t)(target - j);
        const uint8_t *src = data + (j - base);
        uint8_t *dst = c->leads + at;
        switch (c->shift) {
        case 1: ROLL_LEADS(1); break;
        case 2: ROLL_LEADS(2); break;
        default: ROLL_LEADS(4); break;
        }
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

/* Make position `first` the rolled one, from scratch, when the roll is behind it. */
static void restart(rdc_chunker *c, const uint8_t *data, uint64_t base, uint64_t first) {
    const uint8_t *w = data + (first - c->window - base);
    uint64_t h = 0;
    for (size_t i = 0; i < c->window; i++) h = (h << c->shift) + rdc_gear[w[i]];
    c->h = h;
    c->rolled = first;
    c->positions++;
    if (c->filter) {
        c->leads[first & c->mask] = (uint8_t)(h >> 56);
    } else {
        c->f = rdc_ext(w, c->window);
        c->ext_evaluations++;
        c->keys[first & c->mask] = ((rdc_key)(h >> 56) << 64) | c->f;
    }
}

static void roll_to(rdc_chunker *c, const uint8_t *data, uint64_t base, uint64_t target) {
    uint64_t first = c->last_cut + c->min_size + 1;
    if (target < first || target <= c->rolled) return;
    if (c->rolled < first) restart(c, data, base, first);
    if (c->filter)
        roll_leads(c, data, base, target);
    else
        roll_keys(c, data, base, target);
}

/* ------------------------------------------------------------------ decisions */

/* Running minimum over the leads a[0..n) of positions first, first+1, ...: *m is the
 * minimum so far and cand[0..*count) the positions (ascending) whose lead equals it. */
static void track_min(const uint8_t *a, size_t n, uint64_t first, uint8_t *m_io, uint64_t *cand,
                      size_t *count_io) {
    uint8_t m = *m_io;
    size_t count = *count_io, i = 0;
#if defined(__SSE2__)
    __m128i mv = _mm_set1_epi8((char)m);
    for (; i + 16 <= n; i += 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(a + i));
        unsigned le = (unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(_mm_min_epu8(v, mv), v));
        if (!le) continue;
        if (le == 0xffff && (unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(v, mv)) == 0xffff) {
            for (unsigned k = 0; k < 16; k++) cand[count + k] = first + i + k;
            count += 16;
            continue;
        }
        do {
            unsigned k = (unsigned)__builtin_ctz(le);
            uint8_t b = a[i + k];
            if (b < m) {
                m = b;
                count = 0;
                mv = _mm_set1_epi8((char)m);
            }
            if (b == m) cand[count++] = first + i + k;
            le &= le - 1;
        } while (le);
    }
#endif
    for (; i < n; i++) {
        if (a[i] < m) {
            m = a[i];
            count = 0;
        }
        if (a[i] == m) cand[count++] = first + i;
    }
    *m_io = m;
    *count_io = count;
}

static inline int same_window(const uint8_t *a, const uint8_t *b, size_t w) {
    uint64_t diff = 0;
    for (size_t i = 0; i < w; i += 8) diff |= load64le(a + i) ^ load64le(b + i);
    return diff == 0;
}

/* Smallest i >= limit with d[i..end) all equal to v (end > limit, d[end - 1] == v). */
static size_t run_start(const uint8_t *d, size_t end, size_t limit, uint8_t v) {
    size_t i = end;
#if defined(__SSE2__)
    __m128i needle = _mm_set1_epi8((char)v);
    while (i >= limit + 16) {
        __m128i x = _mm_loadu_si128((const __m128i *)(d + i - 16));
        if ((unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(x, needle)) != 0xffff) break;
        i -= 16;
    }
#endif
    while (i > limit && d[i - 1] == v) i--;
    return i;
}

static inline uint64_t ext_at(rdc_chunker *c, uint64_t j, const uint8_t *window) {
    size_t i = (size_t)(j & c->mask);
    if (c->ext_pos[i] != j) {
        c->ext_val[i] = rdc_ext(window, c->window);
        c->ext_pos[i] = j;
        c->ext_evaluations++;
    }
    return c->ext_val[i];
}

/* Positions of minimal lead in (lo, hi], ascending, into c->cand; returns their count.
 * The part of the window that the previous decision covered is not rescanned when its
 * candidates reach past lo: then its minimum is the previous one, and so are they. */
static size_t lead_candidates(rdc_chunker *c, uint64_t lo, uint64_t hi) {
    uint8_t m = 255;
    size_t count = 0;
    uint64_t from = lo + 1;
    if (c->prev_hi > lo && c->ncand && c->cand[c->ncand - 1] > lo) {
        size_t keep = c->ncand;
        while (keep > 0 && c->cand[keep - 1] > lo) keep--;
        count = c->ncand - keep;
        memmove(c->cand, c->cand + keep, count * sizeof(uint64_t));
        m = c->prev_min;
        from = c->prev_hi + 1;
    }
    size_t ring = c->mask + 1;
    while (from <= hi) {
        size_t at = (size_t)(from & c->mask);
        size_t run = ring - at;
        if (run > hi - from + 1) run = (size_t)(hi - from + 1);
        track_min(c->leads + at, run, from, &m, c->cand, &count);
        from += run;
    }
    c->prev_min = m;
    c->prev_hi = hi;
    c->ncand = count;
    return count;
}

/* Rightmost minimal key in (lo, hi], all rolled. Only positions of minimal lead can win;
 * walk them from the right, skipping windows equal to the best one (equal keys). */
static uint64_t decide_filter(rdc_chunker *c, const uint8_t *data, uint64_t base, uint64_t lo,
                              uint64_t hi) {
    size_t count = lead_candidates(c, lo, hi);
    const uint64_t *cand = c->cand;
    size_t w = c->window;
    uint64_t best = cand[--count];
    const uint8_t *best_window = data + (best - w - base);
    /* A window of one repeated byte: every window inside the run of that byte equals it. */
    uint8_t v = best_window[0];
    if (run_start(best_window, w, 0, v) == 0) {
        uint64_t first = lo + 1 - w;
        uint64_t start = base + run_start(data, best - base, first - base, v);
        while (count && cand[count - 1] >= start + w) count--;
    }
    uint64_t best_ext = 0;
    int have_best_ext = 0;
    while (count) {
        uint64_t j = cand[--count];
        const uint8_t *window = data + (j - w - base);
        if (same_window(window, best_window, w)) continue; /* equal key: rightmost wins */
        if (!have_best_ext) {
            best_ext = ext_at(c, best, best_window);
            have_best_ext = 1;
        }
        uint64_t e = ext_at(c, j, window);
        if (e < best_ext) {
            best = j;
            best_window = window;
            best_ext = e;
        }
    }
    return best;
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
