/* Winnowing chunker: see chunker_impl.h for the contract, chunker_ref.py for the spec.
 *
 * Filter path. Positions up to p + min_size are never candidates and never rolled (after a
 * cut the roll restarts from scratch on the window bytes before p + min_size + 1); every
 * other position is rolled once. (A chunker that never rolls sparse rolls ahead instead,
 * every position once: roll_target.) Rolling is the bulk of the work, and it runs in one of two
 * modes, switched per window; neither changes a cut. Its loops run two or three
 * independent gear chains over parts of a run (the later parts started from scratch: the
 * gear hash forgets all but its window), unrolled eight times, and ask for the bytes of
 * the next windows while they roll this one.
 *
 * Sparse mode. On data like random bytes nearly every window of a few thousand positions
 * has a lead of 0 (a position in 256 has one), and then only the positions of lead 0 can
 * win. So the roll compares each gear state with a threshold and records the rare
 * positions below it, a branch almost never taken, where storing every lead cost a store
 * per position. A window whose records hold a lead at or below the threshold is decided
 * from them alone. One without is rolled again in dense mode, which then stays on for a
 * while (longer after each such miss): low-entropy data (zeros, short periods) rarely has
 * a small lead, and a window with very many candidates goes dense too.
 *
 * Dense mode. Every lead is stored in a ring. A decision over (lo, hi] takes the minimum
 * stored lead and the 64-lead blocks holding it (SIMD, branch free, in the code path's
 * kernels: chunker_scan.h). The candidates of the last window that lie past the new lo are
 * kept, so no lead is scanned twice. Storing the leads replaces the book's per-position
 * monotone ring, whose data-dependent branches cost more than the roll itself. A dense
 * window whose minimum is small, with few candidates, switches back to sparse.
 *
 * Either way the candidates (the positions of minimal lead) are compared by ext. A few are
 * all evaluated at once, independent computations the core overlaps, and the rightmost
 * minimum wins. Many (low-entropy data) are walked from the right: two identical windows
 * have identical keys, so a candidate whose window equals that of a candidate to its
 * right loses, and so does the whole stretch of data repeating with that period: it is
 * skipped at once (zeros, short periods). ext values are cached by position, since
 * consecutive windows overlap.
 *
 * Baseline path (filter=0): the full key of every position (sliding Rabin) and a plain
 * rightmost-minimum pass per window; the benchmark's reference point.
 */
#include "chunker_impl.h"
#include "chunker_scan.h"
#include "le_bytes.h"

#include <stdlib.h>
#include <string.h>

uint64_t rdc_gear[256];
uint64_t rdc_rabin[8][256];
static const struct rdc_scan_kernel *best_kernel; /* rdc_ext's fingerprint */

#define GEAR_SEED 0x7264632D67656172ULL /* "rdc-gear" */

static uint64_t splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static uint64_t mul_x(uint64_t a) { return (a >> 1) ^ ((a & 1) ? RDC_POLY_Q : 0); }

void rdc_init_tables(void) {
    static int done = 0;
    if (done) return;
    uint64_t s = GEAR_SEED;
    for (int i = 0; i < 256; i++) rdc_gear[i] = splitmix64(&s);
    uint64_t f = RDC_POLY_Q; /* x^56 * x^8 = x^64 = q */
    for (int a = 0; a < 8; a++) {
        rdc_rabin[a][0] = 0;
        for (int bit = 0x80; bit; bit >>= 1) {
            rdc_rabin[a][bit] = f;
            f = mul_x(f);
        }
        for (int i = 2; i < 256; i <<= 1)
            for (int j = 1; j < i; j++) rdc_rabin[a][i ^ j] = rdc_rabin[a][i] ^ rdc_rabin[a][j];
    }
    uint64_t x = 1ULL << 63; /* x^0 */
    for (int k = 0; k < 512; k++, x = mul_x(x))
        if (k % 64 == 63 && k > 64) rdc_clmul_k[k / 64] = x;
    best_kernel = rdc_scan_kernel_of(rdc_chunker_best_path());
    done = 1;
}

uint8_t rdc_lead(const uint8_t *window, size_t n, unsigned shift) {
    uint64_t h = 0;
    for (size_t i = 0; i < n; i++) h = (h << shift) + rdc_gear[window[i]];
    return (uint8_t)(h >> 56);
}

static uint64_t ext_by(const struct rdc_scan_kernel *kern, const uint8_t *window, size_t n) {
    if (n >= 16 && n <= 64 && n % 8 == 0) return kern->ext(window, n);
    return rdc_ext_table(window, n);
}

uint64_t rdc_ext(const uint8_t *window, size_t n) { return ext_by(best_kernel, window, n); }

uint64_t rdc_ext_on(int path, const uint8_t *window, size_t n) {
    return ext_by(rdc_scan_kernel_of(path), window, n);
}

typedef unsigned __int128 rdc_key; /* (lead << 64) | ext: compares like the pair */

#define EXT_CACHE 1024
/* Candidates evaluated all at once at most; more are walked (see the file comment). A
 * window of the default size has 32 on random data. */
#define BATCH_MAX 96
/* Sparse rolling is automatic for windows of at least this many positions: with a lead of
 * 0 at one position in 256, a window without one is then rarer than 1 in 3,000. */
#define SPARSE_MIN_SPAN 2048
/* Rolling ahead (roll_target) fills at least this much of the ring at a time. */
#define AHEAD_RING 8192
/* After a sparse window misses, dense windows for a while: 1, 3, 7, ... up to this many
 * after misses in a row; eight sparse windows without a miss halve the wait. A miss costs
 * about one window rolled again, a dense window about a sixth more than a sparse one. */
#define PENALTY_MAX 63u
#define PENALTY_DECAY 8u

struct rdc_chunker {
    uint32_t window, min_size, max_size, shift;
    int filter, finished, scanned, path;
    const struct rdc_scan_kernel *kern;
    uint64_t last_cut;
    uint64_t rolled; /* h (and f) are the state at this position; 0: nothing rolled */
    uint64_t h, f;
    size_t mask;     /* ring size - 1 */
    uint8_t *leads;  /* dense: lead of position j at leads[j & mask] */
    rdc_key *keys;   /* baseline: key of position j at keys[j & mask] */
    /* dense: the positions of minimal lead in the last decided window, (prev_lo, prev_hi],
     * as blocks in increasing order (none kept when nblocks is 0) */
    struct rdc_block *blocks;
    size_t nblocks;
    uint64_t prev_lo, prev_hi;
    uint8_t prev_min;
    /* sparse: the rolled positions whose lead is at most sparse_lead (h <= lim), as
     * records (RECORD) in increasing order, live in recs[rec_first .. rec_end) */
    int sparse_lead; /* RDC_SPARSE_OFF, or the threshold */
    int sparse;      /* rolling sparse now */
    uint64_t lim;
    uint64_t *recs;
    size_t rec_first, rec_end;
    /* after a sparse window missed (had to be rolled again, or had very many candidates):
     * dense windows to go before sparse may resume (backoff), the wait after the next miss
     * (penalty), and sparse windows decided since the last miss or decay (streak) */
    unsigned penalty, backoff, streak;
    uint64_t cand[BATCH_MAX];
    uint64_t out[256]; /* sliding Rabin: drop a leaving byte and the old leading 1 */
    /* filter: ext by position, direct-mapped. Candidates are sparse (1 position in 256 on
     * random data) and a collision only costs a recomputation, so a small table does: a
     * ring-sized one made every new chunker page in and clear hundreds of KiB, which
     * dominated the cost of chunking small files. */
    struct {
        uint64_t pos, val;
    } ext_cache[EXT_CACHE];
    struct rdc_chunker_stats stats;
};

uint64_t rdc_chunker_last_cut(const rdc_chunker *c) { return c->last_cut; }
int rdc_chunker_path(const rdc_chunker *c) { return c->path; }
void rdc_chunker_stats(const rdc_chunker *c, struct rdc_chunker_stats *out) { *out = c->stats; }

void rdc_chunker_free(rdc_chunker *c) {
    if (!c) return;
    free(c->leads);
    free(c->keys);
    free(c->blocks);
    free(c->recs);
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
 * window has positions. One more for the branch-free writer. Blocks made from sparse
 * records start at a candidate each and are 64 positions apart: fewer. */
static size_t max_blocks(uint32_t min_size, uint32_t max_size) {
    size_t n = (size_t)(max_size - min_size), parts = n / ((size_t)min_size + 1) + 3;
    size_t bound = n / 64 + 4 * parts;
    return (bound < n ? bound : n) + 1;
}

/* The sparse setting. Room for the records is made at the first sparse roll: a file
 * shorter than min_size never needs it. */
static void set_sparse(rdc_chunker *c, int lead) {
    if (lead == RDC_SPARSE_AUTO)
        lead = c->max_size - c->min_size >= SPARSE_MIN_SPAN ? 0 : RDC_SPARSE_OFF;
    if (!c->filter) lead = RDC_SPARSE_OFF;
    c->sparse_lead = lead;
    c->sparse = lead >= 0;
    c->lim = lead >= 0 ? (uint64_t)lead << 56 | 0x00FFFFFFFFFFFFFFULL : 0;
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
    c->path = rdc_chunker_best_path();
    c->kern = rdc_scan_kernel_of(c->path);
    /* The rings hold the positions of one window, (lo, hi], at least. */
    size_t ring = 64;
    while (ring < (size_t)max_size + 64 || (c->filter && ring < AHEAD_RING)) ring <<= 1;
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
    set_sparse(c, RDC_SPARSE_AUTO);
    if (c->filter) memset(c->ext_cache, 0xff, sizeof c->ext_cache);
    uint8_t zeros[65] = {0};
    uint64_t lead_one = extend(RDC_POLY_Q, zeros, window + 1) ^ extend(RDC_POLY_Q, zeros, window);
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

void rdc_chunker_reset(rdc_chunker *c) {
    c->finished = c->scanned = 0;
    c->last_cut = c->rolled = c->h = c->f = 0;
    c->nblocks = 0;
    c->prev_lo = c->prev_hi = 0;
    c->prev_min = 0;
    c->rec_first = c->rec_end = 0;
    c->penalty = c->backoff = c->streak = 0;
    set_sparse(c, c->sparse_lead);
    if (c->filter) memset(c->ext_cache, 0xff, sizeof c->ext_cache);
    memset(&c->stats, 0, sizeof c->stats);
}

int rdc_chunker_configure(rdc_chunker *c, int path, int sparse_lead) {
    if (c->scanned) return RDC_ESTATE;
    if (!(sparse_lead == RDC_SPARSE_AUTO || (sparse_lead >= RDC_SPARSE_OFF && sparse_lead <= 255)))
        return RDC_EPARAM;
    if (path >= 0) {
        if (!rdc_chunker_path_available(path)) return RDC_EPATH;
        c->path = path;
        c->kern = rdc_scan_kernel_of(path);
    }
    set_sparse(c, sparse_lead);
    return RDC_OK;
}

size_t rdc_chunker_max_cuts(const rdc_chunker *c, uint64_t end) {
    return end > c->last_cut ? (size_t)((end - c->last_cut) / (c->min_size + 1) + 1) : 0;
}

/* ------------------------------------------------------------------ rolling */

#if defined(__GNUC__)
#define ALWAYS_INLINE static inline __attribute__((always_inline))
#define UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define ALWAYS_INLINE static inline
#define UNLIKELY(x) (x)
#endif

/* Runs shorter than this are rolled as one stream: the other streams' warm-ups (window
 * bytes each) would not pay. */
#define SPLIT_MIN 512

/* The gear state of the w bytes before src, from scratch. */
ALWAYS_INLINE uint64_t warm_up(const uint8_t *src, const unsigned S, size_t w) {
    uint64_t h = 0;
    for (const uint8_t *b = src - w; b < src; b++) h = (h << S) + rdc_gear[*b];
    return h;
}

/* Dense: leads of n consecutive positions into dst[0..n): src[k] is the byte that makes
 * position k from position k - 1, whose state is *hp, or with `scratch` the gear of the
 * window bytes before src. The gear hash forgets everything older than its window, so a
 * long run is cut into DENSE_CHAINS parts, the later ones started from scratch too, and
 * rolled in one loop: independent dependency chains, each one shift-and-add per byte.
 * Unrolled eight times, as the sparse loop below. */
#define DENSE_CHAINS 4
ALWAYS_INLINE void roll_run(const uint8_t *src, size_t n, uint64_t *hp, int scratch,
                            uint8_t *dst, const unsigned S, size_t w) {
    const uint64_t *gear = rdc_gear;
    uint64_t h = scratch ? warm_up(src, S, w) : *hp;
    size_t k = 0;
    if (n >= SPLIT_MIN) {
        size_t part = n / DENSE_CHAINS, stop = part - part % 8;
        uint64_t st[DENSE_CHAINS];
        st[0] = h;
        for (size_t i = 1; i < DENSE_CHAINS; i++) st[i] = warm_up(src + i * part, S, w);
        const uint8_t *ahead = src + n;
        for (; k < stop; k += 8, ahead += 32) {
            __builtin_prefetch(ahead);
            _Pragma("GCC unroll 8") for (size_t u = 0; u < 8; u++)
                _Pragma("GCC unroll 4") for (size_t i = 0; i < DENSE_CHAINS; i++) {
                    st[i] = (st[i] << S) + gear[src[i * part + k + u]];
                    dst[i * part + k + u] = (uint8_t)(st[i] >> 56);
                }
        }
        for (size_t i = 0; i + 1 < DENSE_CHAINS; i++)
            for (size_t j = k; j < part; j++) {
                st[i] = (st[i] << S) + gear[src[i * part + j]];
                dst[i * part + j] = (uint8_t)(st[i] >> 56);
            }
        /* The last part continues to the end. */
        h = st[DENSE_CHAINS - 1];
        src += (DENSE_CHAINS - 1) * part;
        dst += (DENSE_CHAINS - 1) * part;
        n -= (DENSE_CHAINS - 1) * part;
    }
    for (; k < n; k++) {
        h = (h << S) + gear[src[k]];
        dst[k] = (uint8_t)(h >> 56);
    }
    *hp = h;
}

/* Dense: leads of positions rolled+1 .. target; byte j-1 makes position j. scratch: the
 * state at `rolled` is not kept (the roll restarts after a cut). */
static void roll_leads(rdc_chunker *c, const uint8_t *data, uint64_t base, uint64_t target,
                       int scratch) {
    uint64_t h = c->h, j = c->rolled;
    size_t ring = c->mask + 1, w = c->window;
    c->stats.positions += target - j;
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

/* A record: the lead in the top byte (it is the top byte of h), the position below. */
#define RECORD(pos, h) (((h) & ~POS_MASK) | (pos))
#define POS_MASK 0x00FFFFFFFFFFFFFFULL
#define REC_POS(r) ((r) & POS_MASK)
#define REC_LEAD(r) ((unsigned)((r) >> 56))

/* Sparse rolling. A run of positions is cut into parts, one per chain (the later ones
 * warmed up from scratch), rolled in one loop unrolled eight times: the loop's own
 * counting, not the chains, was what limited it. Each chain keeps its records in its part
 * of rec (n entries in all); they are joined at the end. Two chains suffice where a step
 * is one LEA (shift 1 or 2); shift 4 (window 16) takes a shift and an add, so three.
 *
 * Each step of the loop (here and in roll_run) also asks for a cache line past the end of
 * the run, half a line further each time (up to twice the run's length ahead; reaching
 * further did not pay): the bytes of the next windows arrive while this one is rolled. The hardware prefetcher follows the two streams and the jumps after cuts late;
 * out of cache, random data ran 10-15% slower without. (A prefetch never faults, so one
 * past the end of the buffer is harmless.) */
#define SPARSE_UNROLL 8

/* Stream i's position at p + u: roll, and record it if its lead is small. */
#define ROLL(x, i, u) x = (x << S) + gear[p[(i) * part + (u)]]
#define CHECK(x, i, u)                                                                     \
    if (UNLIKELY(x <= lim))                                                                \
    rec[(i) * part + count##i++] = RECORD(pos + (i) * part + (size_t)(p - src) + (u), x)
#define STEP2(u)         \
    ROLL(h, 0, u);       \
    ROLL(g, 1, u);       \
    CHECK(h, 0, u);      \
    CHECK(g, 1, u)
#define STEP3(u)         \
    ROLL(h, 0, u);       \
    ROLL(g, 1, u);       \
    ROLL(e, 2, u);       \
    CHECK(h, 0, u);      \
    CHECK(g, 1, u);      \
    CHECK(e, 2, u)
#define UNROLLED(step) \
    step(0);           \
    step(1);           \
    step(2);           \
    step(3);           \
    step(4);           \
    step(5);           \
    step(6);           \
    step(7)

/* One chain over src[0..n) from state h, its records appended at rec[count..]. */
ALWAYS_INLINE size_t sparse_one(const uint8_t *src, size_t n, uint64_t *hp, uint64_t pos,
                                uint64_t lim, uint64_t *rec, size_t count, const unsigned S) {
    const uint64_t *gear = rdc_gear;
    uint64_t h = *hp;
    for (size_t k = 0; k < n; k++) {
        h = (h << S) + gear[src[k]];
        if (UNLIKELY(h <= lim)) rec[count++] = RECORD(pos + k, h);
    }
    *hp = h;
    return count;
}

/* Sparse: records (RECORD) of the positions among n consecutive ones whose gear state is
 * at most lim, into rec[0..n), and their count; src[k] makes position pos + k, as in
 * roll_run. */
ALWAYS_INLINE size_t sparse_run(const uint8_t *src, size_t n, uint64_t *hp, int scratch,
                                uint64_t pos, uint64_t lim, uint64_t *rec, const unsigned S,
                                size_t w) {
    const uint64_t *gear = rdc_gear;
    uint64_t h = scratch ? warm_up(src, S, w) : *hp;
    if (n < SPLIT_MIN) {
        *hp = h;
        return sparse_one(src, n, hp, pos, lim, rec, 0, S);
    }
    const size_t chains = S == 4 ? 3 : 2, part = n / chains;
    const uint8_t *p = src, *stop = src + part - part % SPARSE_UNROLL;
    uint64_t g = warm_up(src + part, S, w), e = chains == 3 ? warm_up(src + 2 * part, S, w) : 0;
    size_t count0 = 0, count1 = 0, count2 = 0;
    const uint8_t *ahead = src + n;
    if (chains == 3) {
        for (; p < stop; p += SPARSE_UNROLL, ahead += 32) {
            __builtin_prefetch(ahead);
            UNROLLED(STEP3);
        }
    } else {
        for (; p < stop; p += SPARSE_UNROLL, ahead += 32) {
            __builtin_prefetch(ahead);
            UNROLLED(STEP2);
        }
    }
    /* The rest of each part; the last part runs to the end of the run. */
    size_t done = (size_t)(p - src);
    count0 = sparse_one(p, part - done, &h, pos + done, lim, rec, count0, S);
    if (chains == 2) {
        count1 = sparse_one(p + part, n - part - done, &g, pos + part + done, lim, rec + part,
                            count1, S);
        memmove(rec + count0, rec + part, count1 * sizeof *rec);
        *hp = g;
        return count0 + count1;
    }
    count1 = sparse_one(p + part, part - done, &g, pos + part + done, lim, rec + part, count1, S);
    count2 = sparse_one(p + 2 * part, n - 2 * part - done, &e, pos + 2 * part + done, lim,
                        rec + 2 * part, count2, S);
    memmove(rec + count0, rec + part, count1 * sizeof *rec);
    memmove(rec + count0 + count1, rec + 2 * part, count2 * sizeof *rec);
    *hp = e;
    return count0 + count1 + count2;
}

#undef ROLL
#undef CHECK
#undef STEP2
#undef STEP3
#undef UNROLLED

/* Sparse: records of positions rolled+1 .. target, after those of earlier positions. */
static void roll_sparse(rdc_chunker *c, const uint8_t *data, uint64_t base, uint64_t target,
                        int scratch) {
    uint64_t h = c->h, j = c->rolled;
    size_t n = (size_t)(target - j), w = c->window, count;
    const uint8_t *src = data + (j - base);
    uint64_t *rec = c->recs + c->rec_end;
    switch (c->shift) {
    case 1: count = sparse_run(src, n, &h, scratch, j + 1, c->lim, rec, 1, w); break;
    case 2: count = sparse_run(src, n, &h, scratch, j + 1, c->lim, rec, 2, w); break;
    default: count = sparse_run(src, n, &h, scratch, j + 1, c->lim, rec, 4, w); break;
    }
    c->rec_end += count;
    c->stats.positions += n;
    c->h = h;
    c->rolled = target;
}

/* Sparse: forget the records of positions before `first` (never candidates again), and
 * move the others to the front, so that a roll has room behind them. */
static void drop_records(rdc_chunker *c, uint64_t first) {
    size_t i = c->rec_first;
    while (i < c->rec_end && REC_POS(c->recs[i]) < first) i++;
    memmove(c->recs, c->recs + i, (c->rec_end - i) * sizeof *c->recs);
    c->rec_end -= i;
    c->rec_first = 0;
}

/* Baseline: the full key (lead, ext) of every position, ext by sliding Rabin, as one
 * 72-bit number per position in a ring. */
static void roll_keys(rdc_chunker *c, const uint8_t *data, uint64_t base, uint64_t target) {
    uint64_t h = c->h, f = c->f;
    unsigned s = c->shift;
    size_t w = c->window, mask = c->mask;
    rdc_key *keys = c->keys;
    c->stats.positions += target - c->rolled;
    c->stats.ext_evaluations += target - c->rolled;
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
    c->stats.positions++;
    c->f = rdc_ext_table(w, c->window);
    c->stats.ext_evaluations++;
    c->keys[first & c->mask] = ((rdc_key)(h >> 56) << 64) | c->f;
}

/* Roll up to target, from scratch at the window's first position when the roll is behind
 * it: positions up to last_cut + min_size are never candidates. */
static void roll_to(rdc_chunker *c, const uint8_t *data, uint64_t base, uint64_t target) {
    uint64_t first = c->last_cut + c->min_size + 1;
    if (target < first || target <= c->rolled) return;
    if (!c->filter) {
        if (c->rolled < first) restart_keys(c, data, base, first);
        roll_keys(c, data, base, target);
        return;
    }
    if (c->sparse && !c->recs) {
        /* Live records lie in [first, rolled] and a roll adds at most target - rolled, with
         * target <= hi: no more than max_size - min_size in all. Without the memory, stay
         * dense: nothing was rolled sparse yet. */
        c->recs = malloc(((size_t)(c->max_size - c->min_size) + 1) * sizeof *c->recs);
        if (!c->recs) {
            c->sparse_lead = RDC_SPARSE_OFF;
            c->sparse = 0;
        }
    }
    int scratch = c->rolled < first;
    if (scratch) c->rolled = first - 1;
    if (c->sparse) {
        drop_records(c, first);
        roll_sparse(c, data, base, target, scratch);
    } else {
        roll_leads(c, data, base, target, scratch);
    }
}

/* How far to roll for a decision over (lo, hi] with data up to end. A chunker that never
 * rolls sparse rolls ahead as far as the ring and the data allow: a lead does not depend
 * on where the last cut was (the gear hash forgets all but its window), and so small
 * chunks (sub-chunks of ~200 bytes) roll in runs long enough to split into chains, without
 * a restart per window. The ring keeps (lo, target]: it holds ring positions. */
static uint64_t roll_target(const rdc_chunker *c, uint64_t lo, uint64_t hi, uint64_t end) {
    if (!c->filter || c->sparse_lead >= 0 || hi <= c->rolled) return hi;
    uint64_t far = lo + c->mask + 1;
    return far < end ? far : end;
}

/* ------------------------------------------------------------------ decisions */

/* Minimum lead over positions (from - 1, to], in ring pieces. */
static uint8_t range_min(const rdc_chunker *c, uint64_t from, uint64_t to, uint8_t m) {
    size_t ring = c->mask + 1;
    while (from <= to) {
        size_t at = (size_t)(from & c->mask), run = ring - at;
        if (run > to - from + 1) run = (size_t)(to - from + 1);
        uint8_t r = c->kern->min_leads(c->leads + at, run);
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
        nb = c->kern->find_leads(c->leads + at, run, from, v, c->blocks, nb);
        from += run;
    }
    return nb;
}

static inline unsigned top_bit(uint64_t bits) { return 63u - (unsigned)__builtin_clzll(bits); }

/* Dense: the positions of minimal lead in (lo, hi] into c->blocks, the minimum into
 * c->prev_min. When the last window's candidates reach past lo, the minimum of the part it
 * shares with this one is its minimum, and its candidates there are this one's: only the
 * new part is scanned, so no lead is looked at twice (the book's ring buffer has the same
 * property). */
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

static inline uint64_t ext_at(rdc_chunker *c, uint64_t j, const uint8_t *window) {
    size_t i = (size_t)(j & (EXT_CACHE - 1));
    if (c->ext_cache[i].pos != j) {
        c->ext_cache[i].val = c->kern->ext(window, c->window);
        c->ext_cache[i].pos = j;
        c->stats.ext_evaluations++;
    }
    return c->ext_cache[i].val;
}

/* The rightmost candidate of minimal ext among cand[0..n) (increasing, n >= 1). Every ext
 * first (those not cached in one kernel call, where the evaluations do not wait on each
 * other or on comparisons), then one pass. */
static uint64_t decide_batch(rdc_chunker *c, const uint8_t *data, uint64_t base,
                             const uint64_t *cand, size_t n) {
    /* A lone minimal lead wins without ext: most windows of sub-chunk size have one. */
    if (n == 1) return cand[0];
    uint64_t e[BATCH_MAX], fresh[BATCH_MAX];
    const uint8_t *todo[BATCH_MAX];
    size_t slot[BATCH_MAX], nt = 0, w = c->window;
    for (size_t i = 0; i < n; i++) {
        size_t at = (size_t)(cand[i] & (EXT_CACHE - 1));
        if (c->ext_cache[at].pos == cand[i]) {
            e[i] = c->ext_cache[at].val;
        } else {
            todo[nt] = data + (cand[i] - w - base);
            slot[nt++] = i;
        }
    }
    if (nt) {
        c->kern->ext_many(todo, nt, w, fresh);
        c->stats.ext_evaluations += nt;
        for (size_t t = 0; t < nt; t++) {
            size_t i = slot[t], at = (size_t)(cand[i] & (EXT_CACHE - 1));
            e[i] = fresh[t];
            c->ext_cache[at].pos = cand[i];
            c->ext_cache[at].val = fresh[t];
        }
    }
    size_t best = n - 1;
    for (size_t i = n - 1; i-- > 0;)
        if (e[i] < e[best]) best = i;
    return cand[best];
}

/* Windows of random data differ in their first word: check that before the rest. */
static inline int same_window(const uint8_t *a, const uint8_t *b, size_t w) {
    uint64_t diff = load64le(a) ^ load64le(b);
    if (diff) return 0;
    for (size_t i = 8; i < w; i += 8) diff |= load64le(a + i) ^ load64le(b + i);
    return diff == 0;
}

/* Whether to evaluate the candidates cand[0..n) all at once: not where the two rightmost
 * share their window, the sign of periodic data, which the walk skips by the period. */
static int batch_suits(const rdc_chunker *c, const uint8_t *data, uint64_t base,
                       const uint64_t *cand, size_t n) {
    size_t w = c->window;
    if (n < 2) return 1;
    return !same_window(data + (cand[n - 1] - w - base), data + (cand[n - 2] - w - base), w);
}

/* The rightmost candidate of minimal ext among blocks[0..nb) (nb >= 1), all in (lo, ...],
 * walked from the right. A candidate whose window equals that of a candidate to its right
 * has the same key and loses the tie, and then so does every candidate in the stretch of
 * data repeating with that period: it is skipped as a whole (this keeps zeros and short
 * periods cheap). The rest compare by ext. */
static uint64_t decide_walk(rdc_chunker *c, const uint8_t *data, uint64_t base, uint64_t lo,
                            const struct rdc_block *blocks, size_t nb) {
    size_t w = c->window;
    uint64_t first = lo + 1;
    nb--;
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
            uint64_t s = base + c->kern->period_start(data, j - w - base, first - w - base,
                                                      twin - j);
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

/* A sparse window that had to be rolled again, or had very many candidates: dense windows
 * from now, for a while that doubles with each such window. */
static void sparse_missed(rdc_chunker *c) {
    c->sparse = 0;
    c->nblocks = 0;
    c->penalty = c->penalty * 2 + 1 > PENALTY_MAX ? PENALTY_MAX : c->penalty * 2 + 1;
    c->backoff = c->penalty;
    c->streak = 0;
}

/* Few candidates among many positions: the sign of data that sparse rolling suits. */
static int few(size_t candidates, uint64_t lo, uint64_t hi) {
    return candidates <= (hi - lo) / 32;
}

/* Dense: decide (lo, hi] from the stored leads, and go sparse if this window suggests. */
static uint64_t decide_dense(rdc_chunker *c, const uint8_t *data, uint64_t base, uint64_t lo,
                             uint64_t hi) {
    gather(c, lo, hi);
    c->stats.dense_windows++;
    const struct rdc_block *blocks = c->blocks;
    size_t nb = c->nblocks, n = 0;
    for (size_t i = 0; i < nb; i++) n += (size_t)__builtin_popcountll(blocks[i].bits);
    size_t k = 0;
    if (n <= BATCH_MAX) {
        for (size_t i = 0; i < nb; i++)
            for (uint64_t bits = blocks[i].bits; bits; bits &= bits - 1)
                c->cand[k++] = blocks[i].at + (unsigned)__builtin_ctzll(bits);
    }
    uint64_t cut = k && batch_suits(c, data, base, c->cand, k)
                       ? decide_batch(c, data, base, c->cand, k)
                       : decide_walk(c, data, base, lo, blocks, nb);
    if (c->backoff) {
        c->backoff--;
    } else if (c->sparse_lead >= 0 && c->prev_min <= c->sparse_lead && few(n, lo, hi)) {
        /* The records of the next window's positions rolled so far do not exist: roll
         * them again. */
        c->sparse = 1;
        c->rolled = 0;
        c->rec_first = c->rec_end = 0;
    }
    return cut;
}

/* Sparse: decide (lo, hi] from the records, if one of them lies in it; 0 if none does. */
static int decide_sparse(rdc_chunker *c, const uint8_t *data, uint64_t base, uint64_t lo,
                         uint64_t hi, uint64_t *cut) {
    const uint64_t *recs = c->recs;
    size_t i = c->rec_first, end = i;
    while (i < c->rec_end && REC_POS(recs[i]) <= lo) i++;
    c->rec_first = i;
    unsigned m = 256;
    size_t n = 0;
    for (end = i; end < c->rec_end && REC_POS(recs[end]) <= hi; end++) {
        unsigned lead = REC_LEAD(recs[end]);
        if (lead < m) {
            m = lead;
            n = 0;
        }
        n += lead == m;
    }
    if (!n) return 0;
    c->stats.sparse_windows++;
    size_t k = 0;
    if (n <= BATCH_MAX) {
        for (size_t r = i; r < end; r++)
            if (REC_LEAD(recs[r]) == m) c->cand[k++] = REC_POS(recs[r]);
    }
    if (k && batch_suits(c, data, base, c->cand, k)) {
        *cut = decide_batch(c, data, base, c->cand, k);
    } else {
        /* Blocks of 64 positions, each from a candidate on. */
        struct rdc_block *blocks = c->blocks;
        size_t nb = 0;
        for (size_t r = i; r < end; r++) {
            if (REC_LEAD(recs[r]) != m) continue;
            uint64_t j = REC_POS(recs[r]);
            if (!nb || j - blocks[nb - 1].at >= 64) {
                blocks[nb].at = j;
                blocks[nb++].bits = 0;
            }
            blocks[nb - 1].bits |= (uint64_t)1 << (j - blocks[nb - 1].at);
        }
        *cut = decide_walk(c, data, base, lo, blocks, nb);
    }
    if (!few(n, lo, hi)) {
        sparse_missed(c);
        c->rolled = 0; /* the next window's leads were not stored */
    } else if (++c->streak == PENALTY_DECAY) {
        c->penalty >>= 1;
        c->streak = 0;
    }
    return 1;
}

/* Rightmost minimal key in (lo, hi], all rolled. */
static uint64_t decide_filter(rdc_chunker *c, const uint8_t *data, uint64_t base, uint64_t lo,
                              uint64_t hi) {
    if (c->sparse) {
        uint64_t cut;
        if (decide_sparse(c, data, base, lo, hi, &cut)) return cut;
        /* No lead of the window is small: roll it again, storing every lead. */
        c->stats.rerolled++;
        sparse_missed(c);
        c->rolled = lo;
        roll_leads(c, data, base, hi, 1);
    }
    return decide_dense(c, data, base, lo, hi);
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
    c->scanned = 1;
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
            roll_to(c, data, base, roll_target(c, lo, hi, end));
            cut = c->filter ? decide_filter(c, data, base, lo, hi) : decide_baseline(c, lo, hi);
        }
        cuts[(*ncuts)++] = cut;
        c->last_cut = cut;
    }
    if (final) c->finished = 1;
    return RDC_OK;
}
