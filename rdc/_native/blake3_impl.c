/* BLAKE3 of many chunks: the portable compression, the choice of code path, and the plan
 * that turns chunks into batches of kernel jobs. Contract in blake3_impl.h. */
#include "blake3_impl.h"

#include <stdlib.h>
#include <string.h>

#include "blake3_lanes.h"

/* ---------------------------------------------------------------- scalar compression */

static inline uint32_t ror32(uint32_t x, unsigned n) { return (x >> n) | (x << (32 - n)); }

static inline uint32_t load_le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline void store_le32(uint8_t *p, uint32_t x) {
    p[0] = (uint8_t)x;
    p[1] = (uint8_t)(x >> 8);
    p[2] = (uint8_t)(x >> 16);
    p[3] = (uint8_t)(x >> 24);
}

/* The quarter-round: mixes column or diagonal (a, b, c, d) with message words x and y. */
#define G(v, a, b, c, d, x, y)                   \
    do {                                         \
        v[a] = v[a] + v[b] + (x);                \
        v[d] = ror32(v[d] ^ v[a], 16);           \
        v[c] = v[c] + v[d];                      \
        v[b] = ror32(v[b] ^ v[c], 12);           \
        v[a] = v[a] + v[b] + (y);                \
        v[d] = ror32(v[d] ^ v[a], 8);            \
        v[c] = v[c] + v[d];                      \
        v[b] = ror32(v[b] ^ v[c], 7);            \
    } while (0)

/* cv = the first half of the compression of block under cv (the chaining value). */
static void compress(uint32_t cv[8], const uint8_t block[B3_BLOCK], uint64_t counter,
                     uint32_t block_len, uint32_t flags) {
    uint32_t m[16], v[16];
    for (int i = 0; i < 16; i++) m[i] = load_le32(block + 4 * i);
    for (int i = 0; i < 8; i++) v[i] = cv[i];
    for (int i = 0; i < 4; i++) v[8 + i] = b3_iv[i];
    v[12] = (uint32_t)counter;
    v[13] = (uint32_t)(counter >> 32);
    v[14] = block_len;
    v[15] = flags;
    for (int r = 0; r < 7; r++) {
        const uint8_t *s = b3_schedule[r];
        G(v, 0, 4, 8, 12, m[s[0]], m[s[1]]);
        G(v, 1, 5, 9, 13, m[s[2]], m[s[3]]);
        G(v, 2, 6, 10, 14, m[s[4]], m[s[5]]);
        G(v, 3, 7, 11, 15, m[s[6]], m[s[7]]);
        G(v, 0, 5, 10, 15, m[s[8]], m[s[9]]);
        G(v, 1, 6, 11, 12, m[s[10]], m[s[11]]);
        G(v, 2, 7, 8, 13, m[s[12]], m[s[13]]);
        G(v, 3, 4, 9, 14, m[s[14]], m[s[15]]);
    }
    for (int i = 0; i < 8; i++) cv[i] = v[i] ^ v[i + 8];
}

static void kernel_scalar(const b3_job *jobs, size_t count, const uint32_t key[8]) {
    uint8_t pad[B3_BLOCK];
    for (size_t j = 0; j < count; j++) {
        const b3_job *job = &jobs[j];
        uint32_t cv[8];
        memcpy(cv, key, sizeof cv);
        for (uint32_t b = 0; b < job->nblocks; b++)
            compress(cv, b3_block(job, b, pad), job->counter, b3_block_len(job, b),
                     b3_block_flags(job, b));
        for (int i = 0; i < 8; i++) store_le32(job->out + 4 * i, cv[i]);
    }
}

/* ---------------------------------------------------------------- code paths */

static const char *const path_names[RDC_B3_PATHS] = {"scalar", "sse2", "sse41", "avx2",
                                                     "avx512"};

const char *rdc_b3_path_name(int path) {
    return path >= 0 && path < RDC_B3_PATHS ? path_names[path] : NULL;
}

int rdc_b3_path_available(int path) {
    switch (path) {
    case RDC_B3_SCALAR: return 1;
#ifdef RDC_B3_X86
    case RDC_B3_SSE2: __builtin_cpu_init(); return __builtin_cpu_supports("sse2");
    case RDC_B3_SSE41: __builtin_cpu_init(); return __builtin_cpu_supports("sse4.1");
    case RDC_B3_AVX2: __builtin_cpu_init(); return __builtin_cpu_supports("avx2");
    case RDC_B3_AVX512:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
#endif
    default: return 0;
    }
}

int rdc_b3_best_path(void) {
    int path = RDC_B3_PATHS - 1;
    while (path > RDC_B3_SCALAR && !rdc_b3_path_available(path)) path--;
    return path;
}

typedef struct {
    b3_kernel run;
    size_t lanes;
} kernel_choice;

static kernel_choice kernel_of(int path) {
    switch (path) {
#ifdef RDC_B3_X86
    case RDC_B3_SSE2: return (kernel_choice){b3_kernel_sse2, 4};
    case RDC_B3_SSE41: return (kernel_choice){b3_kernel_sse41, 4};
    case RDC_B3_AVX2: return (kernel_choice){b3_kernel_avx2, 8};
    case RDC_B3_AVX512: return (kernel_choice){b3_kernel_avx512, 16};
#endif
    default: return (kernel_choice){kernel_scalar, 1};
    }
}

/* ---------------------------------------------------------------- batches of chunks */

/* A batch holds whole chunks whose BLAKE3 chunks number at most BATCH_NODES (a chunk of
 * RDC_B3_MAX_CHUNK bytes has exactly that many), so its working set stays in cache. */
#define BATCH_NODES (RDC_B3_MAX_CHUNK / B3_CHUNK)

typedef struct {
    uint8_t *out;  /* the chunk's hash */
    uint32_t base; /* index of its first node in cvs */
    uint32_t live; /* its nodes at the current level */
} member;

typedef struct {
    kernel_choice kernel;
    /* For a last run of jobs that leaves most of the kernel's lanes empty: the narrowest of
     * the narrower kernels at or below the path that holds them (a small file's lone
     * BLAKE3 chunk ran 16 steps of the 16-lane kernel with one lane busy). */
    kernel_choice narrow[2];
    const uint32_t *key; /* the starting chaining value of every job */
    uint32_t mode;       /* flags on every compression: 0, or a derive-key flag */
    b3_job *jobs, *sorted;
    member *members;
    uint8_t (*cvs)[RDC_B3_OUT_BYTES];
} workspace;

/* Room for batches of up to `nodes` BLAKE3 chunks, in one allocation (free ws->jobs). */
static int workspace_init(workspace *ws, size_t nodes) {
    size_t job_bytes = nodes * sizeof(b3_job), member_bytes = nodes * sizeof(member);
    uint8_t *mem = malloc(2 * job_bytes + member_bytes + nodes * RDC_B3_OUT_BYTES);
    if (!mem) return RDC_B3_ENOMEM;
    ws->jobs = (b3_job *)mem;
    ws->sorted = (b3_job *)(mem + job_bytes);
    ws->members = (member *)(mem + 2 * job_bytes);
    ws->cvs = (uint8_t(*)[RDC_B3_OUT_BYTES])(mem + 2 * job_bytes + member_bytes);
    return RDC_B3_OK;
}

static void run_jobs(const workspace *ws, const b3_job *jobs, size_t n) {
    size_t lanes = ws->kernel.lanes;
    for (size_t i = 0; i < n; i += lanes) {
        size_t count = n - i < lanes ? n - i : lanes;
        b3_kernel run = ws->kernel.run;
        for (int k = 1; k >= 0; k--)
            if (ws->narrow[k].run && count <= ws->narrow[k].lanes) run = ws->narrow[k].run;
        run(jobs + i, count, ws->key);
    }
}

/* The BLAKE3-chunk jobs of chunk [s, e) of data; returns their number. */
static uint32_t chunk_jobs(const uint8_t *data, uint64_t s, uint64_t e, uint8_t *out,
                           uint8_t (*cvs)[RDC_B3_OUT_BYTES], b3_job *jobs, uint32_t mode) {
    uint64_t len = e - s;
    uint32_t count = len ? (uint32_t)((len + B3_CHUNK - 1) / B3_CHUNK) : 1;
    for (uint32_t j = 0; j < count; j++) {
        uint64_t piece = len - (uint64_t)j * B3_CHUNK;
        if (piece > B3_CHUNK) piece = B3_CHUNK;
        uint32_t nblocks = piece ? (uint32_t)((piece + B3_BLOCK - 1) / B3_BLOCK) : 1;
        jobs[j] = (b3_job){
            .input = data + s + (uint64_t)j * B3_CHUNK,
            .out = count == 1 ? out : cvs[j],
            .counter = j,
            .nblocks = nblocks,
            .last_len = (uint32_t)(piece - (uint64_t)B3_BLOCK * (nblocks - 1)),
            .flags = mode,
            .start_flags = B3_CHUNK_START,
            .end_flags = B3_CHUNK_END | (count == 1 ? B3_ROOT : 0),
        };
    }
    return count;
}

/* Hashes the batch's jobs, then merges each chunk's nodes pairwise, level by level, an odd
 * last node moving up unchanged: the shape of the BLAKE3 tree (a left subtree always holds
 * the largest power of two of chunks that leaves some for the right). */
static void run_batch(workspace *ws, size_t njobs, size_t nmembers) {
    /* Longest jobs first, so that lanes run jobs of the same length side by side. */
    size_t at[B3_BLOCKS_PER_CHUNK + 1] = {0};
    for (size_t i = 0; i < njobs; i++) at[ws->jobs[i].nblocks - 1]++;
    size_t next = 0;
    for (int k = B3_BLOCKS_PER_CHUNK - 1; k >= 0; k--) {
        size_t c = at[k];
        at[k] = next;
        next += c;
    }
    for (size_t i = 0; i < njobs; i++) ws->sorted[at[ws->jobs[i].nblocks - 1]++] = ws->jobs[i];
    run_jobs(ws, ws->sorted, njobs);

    for (;;) {
        size_t n = 0;
        for (size_t m = 0; m < nmembers; m++) {
            member *mb = &ws->members[m];
            if (mb->live < 2) continue;
            int root = mb->live == 2;
            for (uint32_t k = 0; k < mb->live / 2; k++)
                ws->jobs[n++] = (b3_job){
                    .input = ws->cvs[mb->base + 2 * k],
                    .out = root ? mb->out : ws->cvs[mb->base + k],
                    .counter = 0,
                    .nblocks = 1,
                    .last_len = B3_BLOCK,
                    .flags = ws->mode | B3_PARENT | (root ? B3_ROOT : 0),
                };
        }
        if (!n) return;
        /* A parent is written over a node that no later job reads; a kernel reads all its
         * lanes' blocks before it writes. */
        run_jobs(ws, ws->jobs, n);
        for (size_t m = 0; m < nmembers; m++) {
            member *mb = &ws->members[m];
            if (mb->live < 2) continue;
            if (mb->live % 2)
                memcpy(ws->cvs[mb->base + mb->live / 2], ws->cvs[mb->base + mb->live - 1],
                       RDC_B3_OUT_BYTES);
            mb->live = (mb->live + 1) / 2;
        }
    }
}

int rdc_b3_hash_chunks(const uint8_t *data, const uint64_t *ends, size_t n, uint64_t start,
                       uint8_t *out, int path) {
    return rdc_b3_hash_chunks_keyed(data, ends, n, start, out, path, b3_iv, 0);
}

int rdc_b3_derive_context_key(const uint8_t *context, size_t len, uint32_t key[8]) {
    uint64_t end = len;
    uint8_t out[RDC_B3_OUT_BYTES];
    int rc = rdc_b3_hash_chunks_keyed(context, &end, 1, 0, out, RDC_B3_SCALAR, b3_iv,
                                      B3_DERIVE_KEY_CONTEXT);
    if (rc == RDC_B3_OK)
        for (int i = 0; i < 8; i++) key[i] = load_le32(out + 4 * i);
    return rc;
}

int rdc_b3_hash_chunks_keyed(const uint8_t *data, const uint64_t *ends, size_t n,
                             uint64_t start, uint8_t *out, int path, const uint32_t key[8],
                             uint32_t mode) {
    int chosen = path < 0; /* (a path asked for by name runs its own kernel alone) */
    if (path < 0) path = rdc_b3_best_path();
    if (!rdc_b3_path_available(path)) return RDC_B3_EPATH;
    uint64_t s = start;
    size_t total = 0; /* BLAKE3 chunks, up to a batch's worth */
    for (size_t i = 0; i < n; i++) {
        if (ends[i] < s) return RDC_B3_EORDER;
        if (ends[i] - s > RDC_B3_MAX_CHUNK) return RDC_B3_ETOOLONG;
        if (total < BATCH_NODES)
            total += ends[i] > s ? (size_t)((ends[i] - s + B3_CHUNK - 1) / B3_CHUNK) : 1;
        s = ends[i];
    }
    if (!n) return RDC_B3_OK;
    workspace ws;
    if (workspace_init(&ws, total < BATCH_NODES ? total : BATCH_NODES) != RDC_B3_OK)
        return RDC_B3_ENOMEM;
    ws.kernel = kernel_of(path);
    ws.narrow[0] = ws.narrow[1] = (kernel_choice){NULL, 0};
#ifdef RDC_B3_X86
    if (chosen && path == RDC_B3_AVX512) ws.narrow[1] = kernel_of(RDC_B3_AVX2);
    if (chosen && path >= RDC_B3_AVX2) ws.narrow[0] = kernel_of(RDC_B3_SSE41);
#endif
    ws.key = key;
    ws.mode = mode;
    size_t njobs = 0, nmembers = 0;
    s = start;
    for (size_t i = 0; i < n; i++) {
        uint64_t len = ends[i] - s;
        size_t nodes = len ? (size_t)((len + B3_CHUNK - 1) / B3_CHUNK) : 1;
        if (njobs + nodes > BATCH_NODES) {
            run_batch(&ws, njobs, nmembers);
            njobs = nmembers = 0;
        }
        uint32_t count = chunk_jobs(data, s, ends[i], out + (size_t)RDC_B3_OUT_BYTES * i,
                                    ws.cvs + njobs, ws.jobs + njobs, mode);
        ws.members[nmembers++] = (member){out + (size_t)RDC_B3_OUT_BYTES * i,
                                           (uint32_t)njobs, count};
        njobs += count;
        s = ends[i];
    }
    run_batch(&ws, njobs, nmembers);
    free(ws.jobs);
    return RDC_B3_OK;
}
