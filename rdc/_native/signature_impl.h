/* Sketch traits and tree grouping over packed hashes. Plain C: no Python API.
 *
 * The specification is rdc/_native/signature_ref.py; every function here must give the same
 * result for every input. Packed hashes are n entries of RDC_HASH_BYTES bytes (BLAKE3
 * digests); little-endian reads of their first and second 8 bytes give `a` and `b`.
 *
 * Return codes of the int functions (0 is success):
 *   RDC_SIG_EPARAM  bad group parameters: need 1 <= min_entries < max_entries <= 4096
 *                   (rdc.tree.GroupParams checks the same).
 */
#ifndef RDC_SIGNATURE_IMPL_H
#define RDC_SIGNATURE_IMPL_H

#include <stddef.h>
#include <stdint.h>

#define RDC_HASH_BYTES 32
#define RDC_TRAITS 12
#define RDC_TRAIT_BITS 6
#define RDC_SKETCH_SEED 0x7264632D736B6574ULL /* "rdc-sket" */
#define RDC_MAX_GROUP 4096

#define RDC_SIG_OK 0
#define RDC_SIG_EPARAM (-2)

/* Protocol constants: the first 12 outputs of splitmix64(RDC_SKETCH_SEED) salt h_t, the next
 * 12 salt g_t. Constant tables, safe to read from any thread. */
extern const uint64_t rdc_salt_h[RDC_TRAITS];
extern const uint64_t rdc_salt_g[RDC_TRAITS];

/* The sketch of the set of n packed hashes: out[t] = trait t in 0..63. Returns 0 and leaves
 * out untouched when n == 0 (an empty set has no sketch), 1 otherwise. */
int rdc_sketch(const uint8_t *hashes, size_t n, uint8_t out[RDC_TRAITS]);

/* Upper bound on the groups of n entries: cuts must have room for this many. */
size_t rdc_group_max_cuts(size_t n, uint32_t min_entries);

/* End indices (1-based positions, increasing, the last == n) of the groups of n packed
 * hashes, written to cuts[0..*ncuts). No groups when n == 0. */
int rdc_group_cuts(const uint8_t *hashes, size_t n, uint32_t min_entries, uint32_t max_entries,
                   uint64_t *cuts, size_t *ncuts);

/* Bytes of the payloads of the nodes over n entries cut into ncuts groups. */
size_t rdc_payload_size(size_t n, size_t ncuts);

/* Node payloads for groups ending at cuts[0..ncuts) (as rdc_group_cuts gives them): per
 * group the byte `level`, then per child its hash and its length as 8 bytes little-endian.
 * Writes all payloads back to back to payload (rdc_payload_size bytes), the end offset of
 * each to ends[g] and its children's total length to sums[g]. */
void rdc_node_payloads(uint8_t level, const uint8_t *hashes, const uint64_t *lengths,
                       const uint64_t *cuts, size_t ncuts, uint8_t *payload, uint64_t *ends,
                       uint64_t *sums);

/* A packed tree (docs/formats.md section 2): `head` (magic and version), the level count,
 * then per level its entry count and entries (32-byte hash, length), counts and lengths as
 * LEB128 varints. rdc_packed_max is the most bytes it takes; rdc_pack_levels writes it to
 * out and returns the bytes written. Level i has ns[i] entries: hashes[i], lengths[i]. */
size_t rdc_packed_max(size_t head_len, size_t nlevels, const size_t *ns);
size_t rdc_pack_levels(const uint8_t *head, size_t head_len, size_t nlevels,
                       const uint8_t *const *hashes, const uint64_t *const *lengths,
                       const size_t *ns, uint8_t *out);

/* Similarity candidates: the file ids that occur in at least `threshold` of the lists
 * lists[0..nlists) (each lens[i] ids, every id <= max_id, no id twice in one list), best
 * first: by count descending, then id ascending; `exclude` is left out. Writes at most
 * `limit` ids and their counts to out_ids, out_counts and returns how many, or -1 if the
 * counting buffer (max_id + 1 bytes) cannot be allocated. */
long rdc_trait_candidates(const uint32_t *const *lists, const size_t *lens, size_t nlists,
                          uint32_t max_id, uint32_t threshold, int64_t exclude, size_t limit,
                          uint32_t *out_ids, uint8_t *out_counts);

#endif
