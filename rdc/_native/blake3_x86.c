/* The x86 SIMD kernels of blake3_impl.c: SSE2 and SSE4.1 (4 lanes), AVX2 (8 lanes) and
 * AVX-512 (16 lanes). Each function carries its own target attribute, so this file builds
 * for any x86-64 and blake3_impl.c calls a kernel only where the CPU has its instructions.
 * Each kernel is blake3_kernel.h over the path's vector operations and transposes. */
#include "blake3_impl.h"
#include "blake3_lanes.h"

#ifdef RDC_B3_X86

#include <immintrin.h>

/* ---------------------------------------------------------------- 4 lanes, 128-bit */

#define TARGET_SSE2 __attribute__((target("sse2")))
#define TARGET_SSE41 __attribute__((target("sse4.1")))

/* Rows r[0..4) of 4 words become columns: r[i] lane l = word i of row l. */
#define TRANSPOSE4(r)                                          \
    do {                                                       \
        __m128i t0 = _mm_unpacklo_epi32(r[0], r[1]);           \
        __m128i t1 = _mm_unpackhi_epi32(r[0], r[1]);           \
        __m128i t2 = _mm_unpacklo_epi32(r[2], r[3]);           \
        __m128i t3 = _mm_unpackhi_epi32(r[2], r[3]);           \
        r[0] = _mm_unpacklo_epi64(t0, t2);                     \
        r[1] = _mm_unpackhi_epi64(t0, t2);                     \
        r[2] = _mm_unpacklo_epi64(t1, t3);                     \
        r[3] = _mm_unpackhi_epi64(t1, t3);                     \
    } while (0)

#define LOAD_MSG4(rows, m)                                                           \
    do {                                                                             \
        for (int q = 0; q < 4; q++) {                                                \
            for (int l = 0; l < 4; l++)                                              \
                m[4 * q + l] = _mm_loadu_si128((const __m128i *)(rows[l] + 16 * q)); \
            TRANSPOSE4((m + 4 * q));                                                 \
        }                                                                            \
    } while (0)

#define STORE_CV4(h, outs)                                                          \
    do {                                                                            \
        for (int half = 0; half < 2; half++) {                                      \
            __m128i r[4] = {h[4 * half], h[4 * half + 1], h[4 * half + 2],         \
                            h[4 * half + 3]};                                       \
            TRANSPOSE4(r);                                                          \
            for (int l = 0; l < 4; l++)                                             \
                _mm_storeu_si128((__m128i *)(outs[l] + 16 * half), r[l]);           \
        }                                                                           \
    } while (0)

#define ROR_SHIFT128(x, n) _mm_or_si128(_mm_srli_epi32((x), (n)), _mm_slli_epi32((x), 32 - (n)))

#define KERNEL b3_kernel_sse2
#define LANES 4
#define TARGET TARGET_SSE2
#define VEC __m128i
#define V_ADD _mm_add_epi32
#define V_XOR _mm_xor_si128
#define V_ROR16(x) _mm_shufflehi_epi16(_mm_shufflelo_epi16((x), 0xB1), 0xB1)
#define V_ROR12(x) ROR_SHIFT128(x, 12)
#define V_ROR8(x) ROR_SHIFT128(x, 8)
#define V_ROR7(x) ROR_SHIFT128(x, 7)
#define V_SET1(x) _mm_set1_epi32((int)(x))
#define V_LOAD(p) _mm_loadu_si128((const __m128i *)(p))
#define V_SELECT(mask, new, old) \
    _mm_or_si128(_mm_and_si128((mask), (new)), _mm_andnot_si128((mask), (old)))
#define LOAD_MSG LOAD_MSG4
#define STORE_CV STORE_CV4
#include "blake3_kernel.h"

/* Byte shuffles that rotate each 32-bit word right by 16 and by 8 (SSSE3 and up). */
#define ROT16_BYTES 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13
#define ROT8_BYTES 1, 2, 3, 0, 5, 6, 7, 4, 9, 10, 11, 8, 13, 14, 15, 12

#define KERNEL b3_kernel_sse41
#define LANES 4
#define TARGET TARGET_SSE41
#define VEC __m128i
#define V_ADD _mm_add_epi32
#define V_XOR _mm_xor_si128
#define V_ROR16(x) _mm_shuffle_epi8((x), _mm_setr_epi8(ROT16_BYTES))
#define V_ROR12(x) ROR_SHIFT128(x, 12)
#define V_ROR8(x) _mm_shuffle_epi8((x), _mm_setr_epi8(ROT8_BYTES))
#define V_ROR7(x) ROR_SHIFT128(x, 7)
#define V_SET1(x) _mm_set1_epi32((int)(x))
#define V_LOAD(p) _mm_loadu_si128((const __m128i *)(p))
#define V_SELECT(mask, new, old) _mm_blendv_epi8((old), (new), (mask))
#define LOAD_MSG LOAD_MSG4
#define STORE_CV STORE_CV4
#include "blake3_kernel.h"

/* ---------------------------------------------------------------- 8 lanes, AVX2 */

#define TARGET_AVX2 __attribute__((target("avx2")))

/* Rows r[0..8) of 8 words become columns. */
#define TRANSPOSE8(r)                                                        \
    do {                                                                     \
        __m256i t[8], u[8];                                                  \
        for (int i = 0; i < 8; i += 2) {                                     \
            t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);                    \
            t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);                \
        }                                                                    \
        for (int i = 0; i < 8; i += 4) {                                     \
            u[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);                    \
            u[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);                \
            u[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);            \
            u[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);            \
        }                                                                    \
        for (int i = 0; i < 4; i++) {                                        \
            r[i] = _mm256_permute2x128_si256(u[i], u[i + 4], 0x20);          \
            r[i + 4] = _mm256_permute2x128_si256(u[i], u[i + 4], 0x31);      \
        }                                                                    \
    } while (0)

#define LOAD_MSG8(rows, m)                                                              \
    do {                                                                                \
        for (int half = 0; half < 2; half++) {                                          \
            for (int l = 0; l < 8; l++)                                                 \
                m[8 * half + l] = _mm256_loadu_si256((const __m256i *)(rows[l] + 32 * half)); \
            TRANSPOSE8((m + 8 * half));                                                 \
        }                                                                               \
    } while (0)

#define STORE_CV8(h, outs)                                                            \
    do {                                                                              \
        TRANSPOSE8(h);                                                                \
        for (int l = 0; l < 8; l++) _mm256_storeu_si256((__m256i *)outs[l], h[l]);    \
    } while (0)

#define ROR_SHIFT256(x, n) \
    _mm256_or_si256(_mm256_srli_epi32((x), (n)), _mm256_slli_epi32((x), 32 - (n)))

#define KERNEL b3_kernel_avx2
#define LANES 8
#define TARGET TARGET_AVX2
#define VEC __m256i
#define V_ADD _mm256_add_epi32
#define V_XOR _mm256_xor_si256
#define V_ROR16(x) _mm256_shuffle_epi8((x), _mm256_setr_epi8(ROT16_BYTES, ROT16_BYTES))
#define V_ROR12(x) ROR_SHIFT256(x, 12)
#define V_ROR8(x) _mm256_shuffle_epi8((x), _mm256_setr_epi8(ROT8_BYTES, ROT8_BYTES))
#define V_ROR7(x) ROR_SHIFT256(x, 7)
#define V_SET1(x) _mm256_set1_epi32((int)(x))
#define V_LOAD(p) _mm256_loadu_si256((const __m256i *)(p))
#define V_SELECT(mask, new, old) _mm256_blendv_epi8((old), (new), (mask))
#define LOAD_MSG LOAD_MSG8
#define STORE_CV STORE_CV8
#include "blake3_kernel.h"

/* ---------------------------------------------------------------- 16 lanes, AVX-512 */

#define TARGET_AVX512 __attribute__((target("avx512f,avx512bw")))

/* Rows r[0..16) of 16 words become columns: pairs of words, then quads, within each
 * 128-bit quarter; then the quarters, as a 4 x 4 transpose of 128-bit blocks. */
#define TRANSPOSE16(r)                                                                \
    do {                                                                              \
        __m512i t[16], u[16];                                                         \
        for (int i = 0; i < 16; i += 2) {                                             \
            t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);                             \
            t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);                         \
        }                                                                             \
        for (int g = 0; g < 16; g += 4) {                                             \
            u[g] = _mm512_unpacklo_epi64(t[g], t[g + 2]);                             \
            u[g + 1] = _mm512_unpackhi_epi64(t[g], t[g + 2]);                         \
            u[g + 2] = _mm512_unpacklo_epi64(t[g + 1], t[g + 3]);                     \
            u[g + 3] = _mm512_unpackhi_epi64(t[g + 1], t[g + 3]);                     \
        }                                                                             \
        for (int j = 0; j < 4; j++) {                                                 \
            __m512i c0 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0x44);                  \
            __m512i c1 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0xEE);                  \
            __m512i c2 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0x44);             \
            __m512i c3 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0xEE);             \
            r[j] = _mm512_shuffle_i32x4(c0, c2, 0x88);                                \
            r[4 + j] = _mm512_shuffle_i32x4(c0, c2, 0xDD);                            \
            r[8 + j] = _mm512_shuffle_i32x4(c1, c3, 0x88);                            \
            r[12 + j] = _mm512_shuffle_i32x4(c1, c3, 0xDD);                           \
        }                                                                             \
    } while (0)

#define LOAD_MSG16(rows, m)                                                         \
    do {                                                                            \
        for (int l = 0; l < 16; l++) m[l] = _mm512_loadu_si512((const void *)rows[l]); \
        TRANSPOSE16(m);                                                             \
    } while (0)

/* Short last blocks by masked loads: sub-chunks of ~200 bytes end in one, and padding
 * them by copies cost a fifth of the kernel's time. */
#define LOAD_MSG16_LENS(rows, lens, m)                                              \
    do {                                                                            \
        for (int l = 0; l < 16; l++) {                                              \
            __mmask64 k = lens[l] >= B3_BLOCK ? ~(__mmask64)0                        \
                                              : ((__mmask64)1 << lens[l]) - 1;       \
            m[l] = _mm512_maskz_loadu_epi8(k, rows[l]);                             \
        }                                                                           \
        TRANSPOSE16(m);                                                             \
    } while (0)

#define STORE_CV16(h, outs)                                                          \
    do {                                                                             \
        __m512i r[16];                                                               \
        for (int i = 0; i < 16; i++) r[i] = i < 8 ? h[i] : _mm512_setzero_si512();   \
        TRANSPOSE16(r);                                                              \
        for (int l = 0; l < 16; l++)                                                 \
            _mm256_storeu_si256((__m256i *)outs[l], _mm512_castsi512_si256(r[l]));   \
    } while (0)

#define KERNEL b3_kernel_avx512
#define LANES 16
#define TARGET TARGET_AVX512
#define VEC __m512i
#define V_ADD _mm512_add_epi32
#define V_XOR _mm512_xor_si512
#define V_ROR16(x) _mm512_ror_epi32((x), 16)
#define V_ROR12(x) _mm512_ror_epi32((x), 12)
#define V_ROR8(x) _mm512_ror_epi32((x), 8)
#define V_ROR7(x) _mm512_ror_epi32((x), 7)
#define V_SET1(x) _mm512_set1_epi32((int)(x))
#define V_LOAD(p) _mm512_loadu_si512((const void *)(p))
#define V_SELECT(mask, new, old) \
    _mm512_mask_mov_epi32((old), _mm512_test_epi32_mask((mask), (mask)), (new))
#define LOAD_MSG LOAD_MSG16
#define LOAD_MSG_LENS LOAD_MSG16_LENS
#define STORE_CV STORE_CV16
#include "blake3_kernel.h"

#endif
