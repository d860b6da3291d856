/* Internal to blake3_impl.c and blake3_x86.c: the unit of work of the compression kernels.
 *
 * A job is a run of 1 to 16 blocks compressed in order from the key (the IV in plain hash
 * mode, the context key in derive-key mode): a BLAKE3 chunk, or a
 * parent node (one block: two child chaining values). A kernel runs up to its lane count of
 * jobs side by side, one job per lane, and writes each job's final chaining value (which,
 * with ROOT among the flags of its last block, is the hash) to its `out`.
 */
#ifndef RDC_BLAKE3_LANES_H
#define RDC_BLAKE3_LANES_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define B3_BLOCK 64
#define B3_CHUNK 1024
#define B3_BLOCKS_PER_CHUNK 16

/* Domain flags of a compression (the BLAKE3 paper, table 3). */
#define B3_CHUNK_START 1u
#define B3_CHUNK_END 2u
#define B3_PARENT 4u
#define B3_ROOT 8u
#define B3_DERIVE_KEY_CONTEXT 32u
#define B3_DERIVE_KEY_MATERIAL 64u

typedef struct {
    const uint8_t *input; /* 64 * (nblocks - 1) + last_len readable bytes */
    uint8_t *out;         /* 32 bytes: the chaining value, little-endian words */
    uint64_t counter;     /* the chunk index (0 for a parent) */
    uint32_t nblocks;     /* 1..16 */
    uint32_t last_len;    /* bytes in the last block, 0..64; the rest is zero padding */
    uint32_t flags;       /* on every block */
    uint32_t start_flags; /* added on the first block */
    uint32_t end_flags;   /* added on the last block */
} b3_job;

/* Runs jobs[0..count), count <= the kernel's lanes, each from chaining value `key`. */
typedef void (*b3_kernel)(const b3_job *jobs, size_t count, const uint32_t key[8]);

/* In this header, not in one file, so that the kernels see the constants and unroll the
 * rounds over them. */
static const uint32_t b3_iv[8] = {
    0x6A09E667u, 0xBB67AE85u, 0x3C6EF372u, 0xA54FF53Au,
    0x510E527Fu, 0x9B05688Cu, 0x1F83D9ABu, 0x5BE0CD19u,
};

/* Message word order of each of the 7 rounds: the identity, then each row the previous
 * one permuted by the paper's permutation (2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14,
 * 15, 8). */
static const uint8_t b3_schedule[7][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8},
    {3, 4, 10, 12, 13, 2, 7, 14, 6, 5, 9, 0, 11, 15, 8, 1},
    {10, 7, 12, 9, 14, 3, 13, 15, 4, 0, 11, 2, 5, 8, 1, 6},
    {12, 13, 9, 11, 15, 10, 14, 8, 7, 2, 5, 3, 0, 1, 6, 4},
    {9, 14, 11, 5, 8, 12, 15, 1, 13, 3, 0, 10, 2, 6, 4, 7},
    {11, 15, 5, 0, 1, 9, 8, 6, 14, 10, 2, 12, 3, 4, 7, 13},
};

/* Pointer to the job's block b, zero-padded into pad when it is a short last block. */
static inline const uint8_t *b3_block(const b3_job *job, uint32_t b, uint8_t pad[B3_BLOCK]) {
    const uint8_t *p = job->input + (size_t)B3_BLOCK * b;
    if (b + 1 == job->nblocks && job->last_len < B3_BLOCK) {
        /* Not a byte loop: small chunks (sub-chunks of ~200 bytes) pad one block in four,
         * and the loop cost a third of their kernel time. */
        memcpy(pad, p, job->last_len);
        memset(pad + job->last_len, 0, B3_BLOCK - job->last_len);
        return pad;
    }
    return p;
}

static inline uint32_t b3_block_flags(const b3_job *job, uint32_t b) {
    uint32_t f = job->flags;
    if (b == 0) f |= job->start_flags;
    if (b + 1 == job->nblocks) f |= job->end_flags;
    return f;
}

static inline uint32_t b3_block_len(const b3_job *job, uint32_t b) {
    return b + 1 == job->nblocks ? job->last_len : B3_BLOCK;
}

#if defined(__x86_64__) || defined(__i386__)
#define RDC_B3_X86 1
/* blake3_x86.c: 4, 4, 8 and 16 lanes. */
void b3_kernel_sse2(const b3_job *jobs, size_t count, const uint32_t key[8]);
void b3_kernel_sse41(const b3_job *jobs, size_t count, const uint32_t key[8]);
void b3_kernel_avx2(const b3_job *jobs, size_t count, const uint32_t key[8]);
void b3_kernel_avx512(const b3_job *jobs, size_t count, const uint32_t key[8]);
#endif

#endif
