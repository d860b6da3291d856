/* Winnowing chunker with an exact lead-byte filter. Plain C: no Python API.
 *
 * The specification is rdc/_native/chunker_ref.py; every function here must give the same
 * cuts for every input and parameter set. Positions are stream offsets j >= window; the key
 * of j is (lead, ext) over the `window` bytes before j; having cut at p, the next cut is the
 * rightmost minimal key in (p + min_size, min(p + max_size, end)].
 *
 * Return codes of the int functions (0 is success):
 *   RDC_ENOMEM  an allocation failed. Free memory, or use a smaller max_size.
 *   RDC_EPARAM  bad parameters. window must be 16, 32 or 64 and
 *               window <= min_size < max_size <= RDC_MAX_CHUNK.
 *   RDC_EORDER  data passed to a scan does not start at or before the last cut. Keep the
 *               bytes from the last cut (rdc_chunker_last_cut) and pass them again.
 *   RDC_EFINAL  a scan after a final scan. A stream ends once; use a new chunker.
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

#define RDC_MAX_CHUNK (1u << 20)

/* Protocol constants, filled by rdc_init_tables (idempotent, not thread-safe on first use:
 * call it once before any other function, as the module init does). */
extern uint64_t rdc_gear[256];        /* splitmix64(GEAR_SEED), 256 outputs */
extern uint64_t rdc_rabin[8][256];    /* the book's bybyte[a][v] = v * x^(8a+8) mod p */
void rdc_init_tables(void);

/* Lead byte and Rabin fingerprint of one window of n bytes, from scratch. */
uint8_t rdc_lead(const uint8_t *window, size_t n, unsigned shift);
uint64_t rdc_ext(const uint8_t *window, size_t n);

typedef struct rdc_chunker rdc_chunker;

/* A chunker for one stream. filter=1: the lead-byte filter (ext only where a lead ties the
 * window minimum); filter=0: the full key at every position (the benchmark's baseline;
 * same cuts). */
int rdc_chunker_new(rdc_chunker **out, uint32_t window, uint32_t min_size,
                    uint32_t max_size, int filter);
void rdc_chunker_free(rdc_chunker *c);

/* Upper bound on the cuts one scan of data ending at `end` can return. */
size_t rdc_chunker_max_cuts(const rdc_chunker *c, uint64_t end);

/* Scan data = stream bytes [base, base + len), base <= last cut. Writes the cuts decided by
 * this data (stream offsets, increasing) to cuts[0..*ncuts), which must hold
 * rdc_chunker_max_cuts(c, base + len) entries. final: the stream ends at base + len. */
int rdc_chunker_scan(rdc_chunker *c, const uint8_t *data, size_t len, uint64_t base,
                     int final, uint64_t *cuts, size_t *ncuts);

uint64_t rdc_chunker_last_cut(const rdc_chunker *c);
/* Statistics: ext evaluations and positions whose lead was computed. */
uint64_t rdc_chunker_ext_evaluations(const rdc_chunker *c);
uint64_t rdc_chunker_positions(const rdc_chunker *c);

#endif
