/* Sketch traits and tree grouping over packed hashes; contract in signature_impl.h. */
#include "signature_impl.h"
#include "le_bytes.h"

#include <stdlib.h>
#include <string.h>

const uint64_t rdc_salt_h[RDC_TRAITS] = {
    0xB912FDD3A1F716DFULL, 0x3765B95F0D4C1AB2ULL, 0xA7D48371A112C2F0ULL,
    0x781FE5F0801AB066ULL, 0x1274C0A189990EC7ULL, 0xBAF3F6CA13E091E9ULL,
    0x8A08A689EE6E9FF5ULL, 0xFAB98E03F0FCAF3BULL, 0x25989048B2C3F368ULL,
    0xA4864CD8F09B537DULL, 0x881F730202B18647ULL, 0xF5F9A2275E7B115DULL,
};
const uint64_t rdc_salt_g[RDC_TRAITS] = {
    0xD1ADF4BC3799E583ULL, 0xD3F2D02F0A8F79AFULL, 0xEB5DBBAB2FFF6DB4ULL,
    0xE08DD9B3BE729BF6ULL, 0xF90616BF68A71F9EULL, 0x75C8C15A5D1FE5F7ULL,
    0x62D6BD961359E49AULL, 0xA9C04E82E289CB43ULL, 0x8A2916ACB45134CCULL,
    0x815DC03D220D272BULL, 0x2A0D6C64E9F475EAULL, 0x59D0FCB8D3B7318FULL,
};

static inline uint64_t mix64(uint64_t x) {
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

int rdc_sketch(const uint8_t *hashes, size_t n, uint8_t out[RDC_TRAITS]) {
    if (n == 0) return 0;
    uint64_t best[RDC_TRAITS], chosen[RDC_TRAITS];
    /* The first entry initialises every trait: the reference's sentinel 2^64 loses to any h. */
    uint64_t a = load64le(hashes), b = load64le(hashes + 8);
    for (int t = 0; t < RDC_TRAITS; t++) {
        best[t] = mix64(a ^ rdc_salt_h[t]);
        chosen[t] = b;
    }
    for (size_t i = 1; i < n; i++) {
        const uint8_t *x = hashes + i * RDC_HASH_BYTES;
        a = load64le(x);
        int won = 0;
        uint64_t h[RDC_TRAITS];
        for (int t = 0; t < RDC_TRAITS; t++) {
            h[t] = mix64(a ^ rdc_salt_h[t]);
            won |= h[t] < best[t]; /* strict: the first of equal minima stays */
        }
        if (!won) continue;
        b = load64le(x + 8);
        for (int t = 0; t < RDC_TRAITS; t++) {
            if (h[t] < best[t]) {
                best[t] = h[t];
                chosen[t] = b;
            }
        }
    }
    for (int t = 0; t < RDC_TRAITS; t++)
        out[t] = (uint8_t)(mix64(chosen[t] ^ rdc_salt_g[t]) >> (64 - RDC_TRAIT_BITS));
    return 1;
}

size_t rdc_group_max_cuts(size_t n, uint32_t min_entries) {
    return n / ((size_t)min_entries + 1) + 1;
}

int rdc_group_cuts(const uint8_t *hashes, size_t n, uint32_t min_entries, uint32_t max_entries,
                   uint64_t *cuts, size_t *ncuts) {
    *ncuts = 0;
    if (!(1 <= min_entries && min_entries < max_entries && max_entries <= RDC_MAX_GROUP))
        return RDC_SIG_EPARAM;
    size_t p = 0, count = 0;
    while (p < n) {
        if (n - p <= min_entries) {
            cuts[count++] = n;
            break;
        }
        size_t last = p + max_entries < n ? p + max_entries : n;
        size_t best = 0;
        uint64_t best_key = UINT64_MAX;
        /* 1-based position j holds entry j - 1; ties go right, so the first key always wins
         * against the sentinel (the window is never empty: n - p > min_entries). */
        for (size_t j = p + min_entries + 1; j <= last; j++) {
            uint64_t key = load64le(hashes + (j - 1) * RDC_HASH_BYTES);
            if (key <= best_key) {
                best = j;
                best_key = key;
            }
        }
        cuts[count++] = best;
        p = best;
    }
    *ncuts = count;
    return RDC_SIG_OK;
}

size_t rdc_payload_size(size_t n, size_t ncuts) {
    return ncuts + n * (RDC_HASH_BYTES + 8);
}

void rdc_node_payloads(uint8_t level, const uint8_t *hashes, const uint64_t *lengths,
                       const uint64_t *cuts, size_t ncuts, uint8_t *payload, uint64_t *ends,
                       uint64_t *sums) {
    uint8_t *out = payload;
    size_t start = 0;
    for (size_t g = 0; g < ncuts; g++) {
        uint64_t total = 0;
        *out++ = level;
        for (size_t i = start; i < cuts[g]; i++) {
            memcpy(out, hashes + i * RDC_HASH_BYTES, RDC_HASH_BYTES);
            store64le(out + RDC_HASH_BYTES, lengths[i]);
            out += RDC_HASH_BYTES + 8;
            total += lengths[i];
        }
        ends[g] = (uint64_t)(out - payload);
        sums[g] = total;
        start = cuts[g];
    }
}

typedef struct {
    uint32_t id;
    uint8_t count;
} rdc_hit;

static int hit_order(const void *a, const void *b) {
    const rdc_hit *x = a, *y = b;
    if (x->count != y->count) return x->count > y->count ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

long rdc_trait_candidates(const uint32_t *const *lists, const size_t *lens, size_t nlists,
                          uint32_t max_id, uint32_t threshold, int64_t exclude, size_t limit,
                          uint32_t *out_ids, uint8_t *out_counts) {
    if (threshold < 1) threshold = 1;
    uint8_t *counts = calloc((size_t)max_id + 1, 1);
    if (!counts) return -1;
    size_t total = 0;
    for (size_t i = 0; i < nlists; i++) total += lens[i];
    /* Every id that reaches the threshold is recorded once, when it does. */
    rdc_hit *hits = malloc((total / threshold + 1) * sizeof *hits);
    if (!hits) {
        free(counts);
        return -1;
    }
    size_t nhits = 0;
    for (size_t i = 0; i < nlists; i++) {
        const uint32_t *list = lists[i];
        for (size_t j = 0; j < lens[i]; j++) {
            uint32_t id = list[j];
            if (++counts[id] == threshold && (int64_t)id != exclude) hits[nhits++].id = id;
        }
    }
    for (size_t k = 0; k < nhits; k++) hits[k].count = counts[hits[k].id];
    free(counts);
    qsort(hits, nhits, sizeof *hits, hit_order);
    size_t n = nhits < limit ? nhits : limit;
    for (size_t k = 0; k < n; k++) {
        out_ids[k] = hits[k].id;
        out_counts[k] = hits[k].count;
    }
    free(hits);
    return (long)n;
}

static size_t put_varint(uint64_t value, uint8_t *out) {
    size_t n = 0;
    while (value >= 0x80) {
        out[n++] = (uint8_t)((value & 0x7F) | 0x80);
        value >>= 7;
    }
    out[n++] = (uint8_t)value;
    return n;
}

size_t rdc_packed_max(size_t head_len, size_t nlevels, const size_t *ns) {
    size_t size = head_len + 10;
    for (size_t i = 0; i < nlevels; i++) size += 10 + ns[i] * (RDC_HASH_BYTES + 10);
    return size;
}

size_t rdc_pack_levels(const uint8_t *head, size_t head_len, size_t nlevels,
                       const uint8_t *const *hashes, const uint64_t *const *lengths,
                       const size_t *ns, uint8_t *out) {
    uint8_t *at = out;
    memcpy(at, head, head_len);
    at += head_len;
    at += put_varint(nlevels, at);
    for (size_t i = 0; i < nlevels; i++) {
        at += put_varint(ns[i], at);
        for (size_t j = 0; j < ns[i]; j++) {
            memcpy(at, hashes[i] + j * RDC_HASH_BYTES, RDC_HASH_BYTES);
            at += RDC_HASH_BYTES;
            at += put_varint(lengths[i][j], at);
        }
    }
    return (size_t)(at - out);
}
