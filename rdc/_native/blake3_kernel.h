/* One SIMD compression kernel; blake3_x86.c includes this once per code path. Each lane of
 * a vector holds one job's state word, so LANES jobs are compressed side by side, block by
 * block; a lane whose job is done keeps its chaining value while the others go on.
 *
 * The includer defines:
 *   KERNEL       the function's name          LANES   jobs side by side
 *   TARGET       its target attribute         VEC     the vector type (LANES x uint32)
 *   V_ADD, V_XOR (a, b)  V_ROR16, V_ROR12, V_ROR8, V_ROR7 (x)  rotations right
 *   V_SET1(u32)  V_LOAD(const uint32_t *p: LANES words)  V_SELECT(mask, new, old)
 *   LOAD_MSG(rows, m)  m[w] lane l = little-endian word w of the 64-byte block rows[l]
 *   LOAD_MSG_LENS(rows, lens, m), optional: the same of the lens[l] bytes at rows[l], zero
 *                padded, without reading past them (no copy into a padded block)
 *   STORE_CV(h, outs)  the 8 words of lane l of h[0..8) to outs[l], little-endian
 */

#define VG(a, b, c, d, x, y)                     \
    do {                                         \
        v[a] = V_ADD(V_ADD(v[a], v[b]), (x));    \
        v[d] = V_ROR16(V_XOR(v[d], v[a]));       \
        v[c] = V_ADD(v[c], v[d]);                \
        v[b] = V_ROR12(V_XOR(v[b], v[c]));       \
        v[a] = V_ADD(V_ADD(v[a], v[b]), (y));    \
        v[d] = V_ROR8(V_XOR(v[d], v[a]));        \
        v[c] = V_ADD(v[c], v[d]);                \
        v[b] = V_ROR7(V_XOR(v[b], v[c]));        \
    } while (0)

/* Compresses message m into the chaining values h under these block lengths and flags;
 * unless all_live, only the lanes set in live_v take the result. */
#define COMPRESS(lens_v, flags_v, live_v, all_live)                                  \
    do {                                                                             \
        VEC v[16];                                                                   \
        for (int i = 0; i < 8; i++) v[i] = h[i];                                     \
        for (int i = 0; i < 4; i++) v[8 + i] = V_SET1(b3_iv[i]);                     \
        v[12] = counter_lo;                                                          \
        v[13] = counter_hi;                                                          \
        v[14] = (lens_v);                                                            \
        v[15] = (flags_v);                                                           \
        _Pragma("GCC unroll 7") for (int r = 0; r < 7; r++) {                        \
            const uint8_t *s = b3_schedule[r];                                       \
            VG(0, 4, 8, 12, m[s[0]], m[s[1]]);                                       \
            VG(1, 5, 9, 13, m[s[2]], m[s[3]]);                                       \
            VG(2, 6, 10, 14, m[s[4]], m[s[5]]);                                      \
            VG(3, 7, 11, 15, m[s[6]], m[s[7]]);                                      \
            VG(0, 5, 10, 15, m[s[8]], m[s[9]]);                                      \
            VG(1, 6, 11, 12, m[s[10]], m[s[11]]);                                    \
            VG(2, 7, 8, 13, m[s[12]], m[s[13]]);                                     \
            VG(3, 4, 9, 14, m[s[14]], m[s[15]]);                                     \
        }                                                                            \
        if (all_live) {                                                              \
            for (int i = 0; i < 8; i++) h[i] = V_XOR(v[i], v[i + 8]);                \
        } else {                                                                     \
            for (int i = 0; i < 8; i++)                                              \
                h[i] = V_SELECT((live_v), V_XOR(v[i], v[i + 8]), h[i]);              \
        }                                                                            \
    } while (0)

#define PREFETCH_AHEAD (4 * B3_BLOCK)

TARGET void KERNEL(const b3_job *jobs, size_t count, const uint32_t key[8]) {
    static const uint8_t idle_block[B3_BLOCK];
#ifndef LOAD_MSG_LENS
    uint8_t pad[LANES][B3_BLOCK];
#endif
    uint8_t idle_out[RDC_B3_OUT_BYTES];
    const uint8_t *rows[LANES];
    uint8_t *outs[LANES];
    uint32_t lo[LANES], hi[LANES], lens[LANES], flags[LANES], live[LANES], first[LANES];
    uint32_t most = 0, least = B3_BLOCKS_PER_CHUNK;
    for (size_t l = 0; l < LANES; l++) {
        int busy = l < count;
        const b3_job *job = busy ? &jobs[l] : NULL;
        lo[l] = busy ? (uint32_t)job->counter : 0;
        hi[l] = busy ? (uint32_t)(job->counter >> 32) : 0;
        flags[l] = busy ? job->flags : 0;
        first[l] = busy ? job->flags | job->start_flags : 0;
        outs[l] = busy ? job->out : idle_out;
        if (busy && job->nblocks > most) most = job->nblocks;
        if (busy && job->nblocks < least) least = job->nblocks;
    }
    const VEC counter_lo = V_LOAD(lo), counter_hi = V_LOAD(hi);
    VEC h[8], m[16];
    for (int i = 0; i < 8; i++) h[i] = V_SET1(key[i]);
    /* Blocks that are full and not last in every lane: the same length everywhere, and the
     * same flags in each lane after the first block. */
    uint32_t b = 0;
    if (count == LANES && least > 1) {
        const VEC full = V_SET1(B3_BLOCK), first_v = V_LOAD(first), rest_v = V_LOAD(flags);
        for (; b + 1 < least; b++) {
            for (size_t l = 0; l < LANES; l++) {
                rows[l] = jobs[l].input + (size_t)B3_BLOCK * b;
                /* Each lane reads its own stream: more than the hardware prefetcher
                 * follows. (A prefetch past the input does not fault.) */
                __builtin_prefetch(rows[l] + PREFETCH_AHEAD);
            }
            LOAD_MSG(rows, m);
            COMPRESS(full, b ? rest_v : first_v, full, 1);
        }
    }
    for (; b < most; b++) {
        int all_live = 1;
        for (size_t l = 0; l < LANES; l++) {
            const b3_job *job = l < count ? &jobs[l] : NULL;
            if (job && b < job->nblocks) {
#ifdef LOAD_MSG_LENS
                rows[l] = job->input + (size_t)B3_BLOCK * b;
#else
                rows[l] = b3_block(job, b, pad[l]);
#endif
                lens[l] = b3_block_len(job, b);
                flags[l] = b3_block_flags(job, b);
                live[l] = ~0u;
            } else {
                rows[l] = idle_block;
                lens[l] = flags[l] = live[l] = 0;
                all_live = 0;
            }
        }
#ifdef LOAD_MSG_LENS
        LOAD_MSG_LENS(rows, lens, m);
#else
        LOAD_MSG(rows, m);
#endif
        COMPRESS(V_LOAD(lens), V_LOAD(flags), V_LOAD(live), all_live);
    }
    STORE_CV(h, outs);
}

#undef VG
#undef COMPRESS
#undef PREFETCH_AHEAD
#undef KERNEL
#undef LANES
#undef TARGET
#undef VEC
#undef V_ADD
#undef V_XOR
#undef V_ROR16
#undef V_ROR12
#undef V_ROR8
#undef V_ROR7
#undef V_SET1
#undef V_LOAD
#undef V_SELECT
#undef LOAD_MSG
#undef LOAD_MSG_LENS
#undef STORE_CV
