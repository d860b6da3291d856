/* Winnowing chunker with an exact lead-byte filter. Plain C: no Python API.
 *
 * The specification is rdc/_native/chunker_ref.py; every function here must give the same
 * cuts for every input, parameter set, code path and sparse setting. Positions are stream
 * offsets j >= window; the key of j is (lead, ext) over the `window` bytes before j; having
 * cut at p, the next cut is the rightmost minimal key in (p + min_size, min(p + max_size,
 * end)].
 *
 * Code paths (the instruction-set level of the decisions' scans and of ext): a portable one
 * everywhere; on x86-64 also SSE2 and AVX2 (with PCLMULQDQ), each compiled with a function
 * target attribute and used only where the CPU supports it. A new chunker takes the best
 * one; rdc_chunker_configure picks another (tests, benchmarks).
 *
 * Return codes of the int functions (0 is success):
 *   RDC_ENOMEM  an allocation failed. Free memory, or use a smaller max_size. (Sparse
 *               rolling's records are allocated at its first use; without them the chunker
 *               stores every lead instead, with the same cuts.)
 *   RDC_EPARAM  bad parameters. window must be 16, 32 or 64 and
 *               window <= min_size < max_size <= RDC_MAX_CHUNK; a sparse lead is
 *               RDC_SPARSE_AUTO, RDC_SPARSE_OFF or 0..255.
 *   RDC_EORDER  data passed to a scan does not start at or before the last cut. Keep the
 *               bytes from the last cut (rdc_chunker_last_cut) and pass them again.
 *   RDC_EFINAL  a scan after a final scan. A stream ends once; use a new chunker.
 *   RDC_EPATH   the code path is unknown or this CPU cannot run it. Ask
 *               rdc_chunker_path_available first.
 *   RDC_ESTATE  a configuration after the first scan. Configure a new chunker.
 */
#ifndef RDC_CHUNKER_IMPL_H
#define RDC_CHUNKER_IMPL_H

#include <stddef.h>
#include <stdint.h>

#define RDC_OK 0
#define RDC_ENOMEM (-1)
#define RDC_EPARAM (-2)
#define RDC_EORDER (-3)
#define RDC_EFINAL (-4)
#define RDC_EPATH (-5)
#define RDC_ESTATE (-6)

#define RDC_MAX_CHUNK (1u << 20)

/* Code paths, slowest first. */
enum rdc_chunker_path {
    RDC_CHUNKER_PORTABLE = 0,
    RDC_CHUNKER_SSE2 = 1,
    RDC_CHUNKER_AVX2 = 2,
    RDC_CHUNKER_PATHS = 3,
};

/* Name of a path ("portable", "sse2", "avx2"), or NULL if out of range. */
const char *rdc_chunker_path_name(int path);
/* 1 if this build and this CPU can run the path, else 0. */
int rdc_chunker_path_available(int path);
/* The fastest available path. */
int rdc_chunker_best_path(void);

/* Protocol constants, filled by rdc_init_tables (idempotent, not thread-safe on first use:
 * call it once before any other function, as the module init does). */
extern uint64_t rdc_gear[256];        /* splitmix64(GEAR_SEED), 256 outputs */
extern uint64_t rdc_rabin[8][256];    /* the book's bybyte[a][v] = v * x^(8a+8) mod p */
void rdc_init_tables(void);

/* Lead byte and Rabin fingerprint of one window of n bytes, from scratch; the fingerprint
 * by the best path's method, or by that of an available path. */
uint8_t rdc_lead(const uint8_t *window, size_t n, unsigned shift);
uint64_t rdc_ext(const uint8_t *window, size_t n);
uint64_t rdc_ext_on(int path, const uint8_t *window, size_t n);

typedef struct rdc_chunker rdc_chunker;

/* A chunker for one stream. filter=1: the lead-byte filter (ext only where a lead ties the
 * window minimum); filter=0: the full key at every position (the benchmark's baseline;
 * same cuts). */
int rdc_chunker_new(rdc_chunker **out, uint32_t window, uint32_t min_size,
                    uint32_t max_size, int filter);
void rdc_chunker_free(rdc_chunker *c);
/* The chunker as rdc_chunker_new left it, ready for another stream, its settings kept
 * (rdc_chunker_configure's too): a new chunker per small file (its tables and buffers)
 * was a sixth of signing a 3 KB file. */
void rdc_chunker_reset(rdc_chunker *c);

/* Sparse rolling (filter only): while the windows' minimal lead is at most `sparse_lead`,
 * the roll keeps only the positions whose lead is that small, and compares against a
 * threshold instead of storing every lead; a window with none is rolled again in full.
 * RDC_SPARSE_AUTO: 0 where windows are long enough that one without a lead of 0 is rare
 * (max_size - min_size >= 2048), else off. RDC_SPARSE_OFF: every lead is stored. Other
 * values exist for tests: the cuts never depend on this setting. */
#define RDC_SPARSE_AUTO (-2)
#define RDC_SPARSE_OFF (-1)

/* Choose the code path (path < 0: keep the best) and the sparse setting of a new chunker,
 * before its first scan. Returns 0, RDC_EPATH, RDC_EPARAM or RDC_ESTATE (then nothing
 * changed). */
int rdc_chunker_configure(rdc_chunker *c, int path, int sparse_lead);
int rdc_chunker_path(const rdc_chunker *c);

/* Upper bound on the cuts one scan of data ending at `end` can return. */
size_t rdc_chunker_max_cuts(const rdc_chunker *c, uint64_t end);

/* Scan data = stream bytes [base, base + len), base <= last cut. Writes the cuts decided by
 * this data (stream offsets, increasing) to cuts[0..*ncuts), which must hold
 * rdc_chunker_max_cuts(c, base + len) entries. final: the stream ends at base + len. */
int rdc_chunker_scan(rdc_chunker *c, const uint8_t *data, size_t len, uint64_t base,
                     int final, uint64_t *cuts, size_t *ncuts);

uint64_t rdc_chunker_last_cut(const rdc_chunker *c);

/* Statistics, for tests and benchmarks. */
struct rdc_chunker_stats {
    uint64_t positions;       /* leads computed (a window rolled again counts twice) */
    uint64_t ext_evaluations; /* Rabin fingerprints computed */
    uint64_t sparse_windows;  /* windows decided from the sparse roll */
    uint64_t dense_windows;   /* windows decided from stored leads */
    uint64_t rerolled;        /* sparse windows with no small lead, rolled again in full */
};
void rdc_chunker_stats(const rdc_chunker *c, struct rdc_chunker_stats *out);

#endif
