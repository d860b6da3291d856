/* BLAKE3 (plain hash and derive-key modes, 32-byte output) of many chunks at once. Plain C: no Python API.
 *
 * The specification is rdc/_native/blake3_ref.py (blake3-py, one call per chunk): every
 * function here must give the same hashes for every input. Written from the BLAKE3 paper:
 * a chunk of rdc (up to 1 MiB) is cut into BLAKE3 chunks of 1 KiB, each compressed block
 * by block from the IV, and their chaining values are merged pairwise, level by level, into
 * the root. Chunks are independent, so the compressions of many chunks' BLAKE3 chunks (and
 * then of their parent nodes) run side by side in SIMD lanes.
 *
 * Code paths: a portable scalar one everywhere; on x86-64 also SSE2 and SSE4.1 (4 lanes),
 * AVX2 (8 lanes) and AVX-512 (16 lanes), each compiled with a function target attribute and
 * used only where the CPU (and OS) supports it. All paths give the same bytes.
 *
 * Return codes of the int functions (0 is success):
 *   RDC_B3_ENOMEM    an allocation failed (a call needs about 100 KiB). Free memory.
 *   RDC_B3_EORDER    an end offset is before the start of its chunk (ends must be
 *                    non-decreasing, the first at least `start`). Pass sorted cuts.
 *   RDC_B3_ETOOLONG  a chunk is longer than RDC_B3_MAX_CHUNK bytes. Cut it smaller, or hash
 *                    it with blake3 itself.
 *   RDC_B3_EPATH     the requested code path is unknown or the CPU does not support it. Ask
 *                    rdc_b3_path_available first.
 */
#ifndef RDC_BLAKE3_IMPL_H
#define RDC_BLAKE3_IMPL_H

#include <stddef.h>
#include <stdint.h>

#define RDC_B3_OUT_BYTES 32
#define RDC_B3_MAX_CHUNK (1u << 20)

#define RDC_B3_OK 0
#define RDC_B3_ENOMEM (-1)
#define RDC_B3_EORDER (-2)
#define RDC_B3_ETOOLONG (-3)
#define RDC_B3_EPATH (-4)

/* Code paths, slowest first. */
enum rdc_b3_path {
    RDC_B3_SCALAR = 0,
    RDC_B3_SSE2 = 1,
    RDC_B3_SSE41 = 2,
    RDC_B3_AVX2 = 3,
    RDC_B3_AVX512 = 4,
    RDC_B3_PATHS = 5,
};

/* Name of a path ("scalar", "sse2", "sse41", "avx2", "avx512"), or NULL if out of range. */
const char *rdc_b3_path_name(int path);

/* 1 if this build and this CPU can run the path, else 0. Thread-safe. */
int rdc_b3_path_available(int path);

/* The fastest available path. Thread-safe. */
int rdc_b3_best_path(void);

/* The hashes of the n chunks of `data` that end at ends[0..n) (offsets into data, the first
 * chunk starting at `start`, each next one at the previous end): 32 bytes each, written to
 * out[32 * i]. The caller guarantees that data holds ends[n - 1] bytes. Uses `path`, or
 * the best one for path < 0. Returns 0, RDC_B3_EORDER, RDC_B3_ETOOLONG, RDC_B3_EPATH or
 * RDC_B3_ENOMEM (then out is partly written). Thread-safe; touches no global state. */
int rdc_b3_hash_chunks(const uint8_t *data, const uint64_t *ends, size_t n, uint64_t start,
                       uint8_t *out, int path);

/* The same in BLAKE3's keyed or derive-key modes: every job starts from chaining value
 * `key` (little-endian words) and `mode` (0, or the paper's flag DERIVE_KEY_MATERIAL, 64,
 * or DERIVE_KEY_CONTEXT, 32) is set on every compression. Plain hashing is key = IV, mode
 * 0. Same return codes. */
int rdc_b3_hash_chunks_keyed(const uint8_t *data, const uint64_t *ends, size_t n,
                             uint64_t start, uint8_t *out, int path, const uint32_t key[8],
                             uint32_t mode);

/* The context key of BLAKE3's derive-key mode for a context string of len bytes (at most
 * RDC_B3_MAX_CHUNK): hash the material with it and mode DERIVE_KEY_MATERIAL to get
 * blake3(material, derive_key_context=context). Returns 0 or RDC_B3_ETOOLONG/ENOMEM. */
int rdc_b3_derive_context_key(const uint8_t *context, size_t len, uint32_t key[8]);

#endif
