/* The refinement encoder: a literal range as ops against the old blocks it replaces.

The source slides over the new bytes one position at a time, hashing a block at each
(rsync's search within one small region). In Python that was a CRC call, a slice and a
bytes object per byte: a quarter of a version sync's client CPU. Same algorithm here, with
the GIL released. Specification: refine_ref.py (which has the rule for when a short hash
is trusted); format: rdc/content/refine.py. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint32_t crc_table[256];

static void crc_init(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[n] = c;
    }
}

/* zlib's crc32 of len bytes, cut to the low 8 * hash_bytes bits. */
static inline uint32_t block_key(const uint8_t *p, size_t len, uint32_t mask) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < len; i++) c = crc_table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return (c ^ 0xFFFFFFFFu) & mask;
}

typedef struct {
    size_t literal_from, literal_to; /* the literal before the run, in new */
    size_t first, blocks;
} run_t;

typedef struct {
    /* inputs */
    const uint8_t *new_;
    size_t n;
    const uint32_t *keys;
    size_t count, grid, old_length, block;
    int extra;
    uint32_t mask;
    /* the first block of each key: open addressing, size a power of two */
    int64_t *slots_k;
    uint32_t *slots_key;
    size_t slot_mask;
    /* outputs */
    run_t *runs;
    size_t nruns, cap;
    size_t literal_from;
} job_t;

static int64_t block_at(const job_t *j, int64_t x) {
    if (x < 0) return -1;
    size_t u = (size_t)x;
    if (u % j->block == 0 && u / j->block < j->grid) return (int64_t)(u / j->block);
    if (j->extra && u == j->old_length - j->block) return (int64_t)j->grid;
    return -1;
}

static size_t start_of(const job_t *j, size_t k) {
    return k < j->grid ? k * j->block : j->old_length - j->block;
}

static size_t slot_of(const job_t *j, uint32_t key) {
    return (size_t)((key * 0x9E3779B1u) >> 7) & j->slot_mask;
}

static int64_t where(const job_t *j, uint32_t key) {
    for (size_t s = slot_of(j, key);; s = (s + 1) & j->slot_mask) {
        if (j->slots_k[s] < 0) return -1;
        if (j->slots_key[s] == key) return j->slots_k[s];
    }
}

/* The search; 0, or -1 when memory ran out. */
static int search(job_t *j) {
    for (size_t k = 0; k < j->count; k++) { /* the first block of each key */
        size_t s = slot_of(j, j->keys[k]);
        while (j->slots_k[s] >= 0 && j->slots_key[s] != j->keys[k]) s = (s + 1) & j->slot_mask;
        if (j->slots_k[s] < 0) {
            j->slots_k[s] = (int64_t)k;
            j->slots_key[s] = j->keys[k];
        }
    }
    const size_t b = j->block, n = j->n;
    int64_t left = 0, right = (int64_t)n - (int64_t)j->old_length;
    size_t pos = 0;
    j->literal_from = 0;
    while (n >= b && pos <= n - b) {
        uint32_t key = block_key(j->new_ + pos, b, j->mask);
        int64_t k = block_at(j, (int64_t)pos - left);
        if (k < 0 || j->keys[k] != key) {
            k = block_at(j, (int64_t)pos - right);
            if (k < 0 || j->keys[k] != key) {
                k = where(j, key);
                if (k < 0 || (size_t)k + 1 >= j->count || pos + 2 * b > n ||
                    j->keys[k + 1] != block_key(j->new_ + pos + b, b, j->mask)) {
                    pos += 1;
                    continue;
                }
            }
        }
        run_t *last = j->nruns ? &j->runs[j->nruns - 1] : NULL;
        if (last && pos == j->literal_from && (size_t)k == last->first + last->blocks) {
            last->blocks += 1;
        } else {
            if (j->nruns == j->cap) {
                size_t cap = j->cap ? 2 * j->cap : 16;
                run_t *runs = realloc(j->runs, cap * sizeof(run_t));
                if (!runs) return -1;
                j->runs = runs;
                j->cap = cap;
            }
            j->runs[j->nruns++] = (run_t){j->literal_from, pos, (size_t)k, 1};
        }
        left = (int64_t)pos - (int64_t)start_of(j, (size_t)k);
        pos += b;
        j->literal_from = pos;
    }
    return 0;
}

static uint8_t *put_varint(uint8_t *out, size_t value) {
    while (value >= 0x80) {
        *out++ = (uint8_t)((value & 0x7F) | 0x80);
        value >>= 7;
    }
    *out++ = (uint8_t)value;
    return out;
}

static PyObject *ops_of(const job_t *j) {
    size_t bound = j->n + 10 * (3 * j->nruns + 2);
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)bound);
    if (!out) return NULL;
    uint8_t *w = (uint8_t *)PyBytes_AS_STRING(out), *start = w;
    for (size_t r = 0; r < j->nruns; r++) {
        const run_t *run = &j->runs[r];
        size_t len = run->literal_to - run->literal_from;
        w = put_varint(w, len);
        memcpy(w, j->new_ + run->literal_from, len);
        w += len;
        w = put_varint(w, run->blocks);
        w = put_varint(w, run->first);
    }
    size_t tail = j->n - j->literal_from;
    w = put_varint(w, tail);
    memcpy(w, j->new_ + j->literal_from, tail);
    w += tail;
    w = put_varint(w, 0);
    if (_PyBytes_Resize(&out, (Py_ssize_t)(w - start)) < 0) return NULL;
    return out;
}

static PyObject *py_encode(PyObject *module, PyObject *args) {
    (void)module;
    Py_buffer new_, hashes;
    Py_ssize_t old_length, block, hash_bytes, limit;
    if (!PyArg_ParseTuple(args, "y*y*nnnn:encode", &new_, &hashes, &old_length, &block,
                          &hash_bytes, &limit))
        return NULL;
    PyObject *result = NULL;
    job_t j = {0};
    if (block < 1 || hash_bytes < 1 || hash_bytes > 4 || old_length < 0) {
        PyErr_SetString(PyExc_ValueError, "need block >= 1, 1 <= hash_bytes <= 4, old_length >= 0");
        goto done;
    }
    j.block = (size_t)block;
    j.old_length = (size_t)old_length;
    j.grid = j.old_length >= j.block ? (j.old_length - j.block) / j.block + 1 : 0;
    j.extra = j.old_length % j.block && j.old_length >= j.block;
    j.count = j.grid + (size_t)j.extra;
    if (old_length > limit || (size_t)hashes.len != j.count * (size_t)hash_bytes) {
        PyErr_Format(PyExc_ValueError, "%zd bytes of block hashes for %zd old bytes",
                     hashes.len, old_length);
        goto done;
    }
    j.mask = hash_bytes == 4 ? 0xFFFFFFFFu : (1u << (8 * hash_bytes)) - 1;
    j.new_ = new_.buf;
    j.n = (size_t)new_.len;
    uint32_t *keys = PyMem_RawMalloc((j.count ? j.count : 1) * sizeof(uint32_t));
    size_t slots = 16;
    while (slots < 2 * j.count) slots *= 2;
    j.slots_k = PyMem_RawMalloc(slots * sizeof(int64_t));
    j.slots_key = PyMem_RawMalloc(slots * sizeof(uint32_t));
    j.keys = keys;
    j.slot_mask = slots - 1;
    if (!keys || !j.slots_k || !j.slots_key) {
        PyErr_NoMemory();
        goto free_all;
    }
    const uint8_t *h = hashes.buf;
    for (size_t k = 0; k < j.count; k++) {
        uint32_t v = 0;
        for (Py_ssize_t i = 0; i < hash_bytes; i++) v |= (uint32_t)h[k * hash_bytes + i] << (8 * i);
        keys[k] = v;
    }
    for (size_t s = 0; s < slots; s++) j.slots_k[s] = -1;
    int failed;
    Py_BEGIN_ALLOW_THREADS
    failed = search(&j);
    Py_END_ALLOW_THREADS
    if (failed)
        PyErr_NoMemory();
    else
        result = ops_of(&j);
free_all:
    PyMem_RawFree(keys);
    PyMem_RawFree(j.slots_k);
    PyMem_RawFree(j.slots_key);
    free(j.runs);
done:
    PyBuffer_Release(&new_);
    PyBuffer_Release(&hashes);
    return result;
}

static PyMethodDef methods[] = {
    {"encode", py_encode, METH_VARARGS,
     "encode(new, hashes, old_length, block, hash_bytes, limit) -> ops (refine_ref.encode)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_refine", "The refinement encoder (see encode).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__refine(void) {
    crc_init();
    return PyModule_Create(&module_def);
}
