/* Python glue for signature_impl.c: argument checks, buffers, the GIL. No algorithm here. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "signature_impl.h"

#include <string.h>

/* Inputs of at least this many entries are processed with the GIL released. */
#define RELEASE_GIL_ENTRIES 2048

static PyObject *array_type; /* array.array */

static int get_hashes(PyObject *obj, Py_buffer *view, size_t *n) {
    if (PyObject_GetBuffer(obj, view, PyBUF_SIMPLE) < 0) return -1;
    if (view->len % RDC_HASH_BYTES) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_ValueError, "packed hashes must be a multiple of 32 bytes");
        return -1;
    }
    *n = (size_t)view->len / RDC_HASH_BYTES;
    return 0;
}

static PyObject *raise_params(void) {
    PyErr_SetString(PyExc_ValueError, "need 1 <= min_entries < max_entries <= 4096");
    return NULL;
}

static PyObject *py_sketch(PyObject *module, PyObject *arg) {
    (void)module;
    Py_buffer view;
    size_t n;
    if (get_hashes(arg, &view, &n) < 0) return NULL;
    uint8_t out[RDC_TRAITS];
    int have;
    if (n >= RELEASE_GIL_ENTRIES) {
        Py_BEGIN_ALLOW_THREADS
        have = rdc_sketch(view.buf, n, out);
        Py_END_ALLOW_THREADS
    } else {
        have = rdc_sketch(view.buf, n, out);
    }
    PyBuffer_Release(&view);
    if (!have) Py_RETURN_NONE;
    return PyBytes_FromStringAndSize((const char *)out, RDC_TRAITS);
}

/* Group cuts of the buffer in view; returns a PyMem_RawMalloc'ed array or NULL (error set). */
static uint64_t *cuts_of(Py_buffer *view, size_t n, unsigned int lo, unsigned int hi,
                         size_t *ncuts) {
    if (!(1 <= lo && lo < hi && hi <= RDC_MAX_GROUP)) {
        raise_params();
        return NULL;
    }
    uint64_t *cuts = PyMem_RawMalloc(rdc_group_max_cuts(n, lo) * sizeof(uint64_t));
    if (!cuts) {
        PyErr_NoMemory();
        return NULL;
    }
    int rc;
    if (n >= RELEASE_GIL_ENTRIES) {
        Py_BEGIN_ALLOW_THREADS
        rc = rdc_group_cuts(view->buf, n, lo, hi, cuts, ncuts);
        Py_END_ALLOW_THREADS
    } else {
        rc = rdc_group_cuts(view->buf, n, lo, hi, cuts, ncuts);
    }
    if (rc != RDC_SIG_OK) {
        PyMem_RawFree(cuts);
        raise_params();
        return NULL;
    }
    return cuts;
}

static PyObject *list_of(const uint64_t *values, size_t n) {
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list && i < n; i++) {
        PyObject *v = PyLong_FromUnsignedLongLong(values[i]);
        if (!v) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, v);
    }
    return list;
}

static PyObject *py_group_cuts(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *obj;
    unsigned int lo, hi;
    if (!PyArg_ParseTuple(args, "OII", &obj, &lo, &hi)) return NULL;
    Py_buffer view;
    size_t n, ncuts;
    if (get_hashes(obj, &view, &n) < 0) return NULL;
    uint64_t *cuts = cuts_of(&view, n, lo, hi, &ncuts);
    PyBuffer_Release(&view);
    if (!cuts) return NULL;
    PyObject *result = list_of(cuts, ncuts);
    PyMem_RawFree(cuts);
    return result;
}

static PyObject *py_next_level_payloads(PyObject *module, PyObject *args) {
    (void)module;
    unsigned char level;
    PyObject *hashes_obj;
    Py_buffer lengths;
    unsigned int lo, hi;
    if (!PyArg_ParseTuple(args, "bOy*II", &level, &hashes_obj, &lengths, &lo, &hi)) return NULL;
    Py_buffer view;
    size_t n, ncuts = 0;
    if (get_hashes(hashes_obj, &view, &n) < 0) {
        PyBuffer_Release(&lengths);
        return NULL;
    }
    PyObject *payload = NULL, *ends = NULL, *sums = NULL, *result = NULL;
    uint64_t *cuts = NULL, *scratch = NULL;
    if ((size_t)lengths.len != n * sizeof(uint64_t)) {
        PyErr_SetString(PyExc_ValueError, "need one length (array('Q')) per hash");
        goto done;
    }
    if (!(cuts = cuts_of(&view, n, lo, hi, &ncuts))) goto done;
    payload = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)rdc_payload_size(n, ncuts));
    scratch = PyMem_RawMalloc((2 * ncuts + 1) * sizeof(uint64_t));
    if (!payload || !scratch) {
        if (payload) PyErr_NoMemory();
        goto done;
    }
    uint64_t *end_offsets = scratch, *totals = scratch + ncuts;
    uint8_t *out = (uint8_t *)PyBytes_AS_STRING(payload);
    if (n >= RELEASE_GIL_ENTRIES) {
        Py_BEGIN_ALLOW_THREADS
        rdc_node_payloads(level, view.buf, lengths.buf, cuts, ncuts, out, end_offsets, totals);
        Py_END_ALLOW_THREADS
    } else {
        rdc_node_payloads(level, view.buf, lengths.buf, cuts, ncuts, out, end_offsets, totals);
    }
    if (!(ends = list_of(end_offsets, ncuts))) goto done;
    sums = PyObject_CallFunction(array_type, "sy#", "Q", (const char *)totals,
                                 (Py_ssize_t)(ncuts * sizeof(uint64_t)));
    if (!sums) goto done;
    result = PyTuple_Pack(3, payload, ends, sums);
done:
    Py_XDECREF(payload);
    Py_XDECREF(ends);
    Py_XDECREF(sums);
    PyMem_RawFree(cuts);
    PyMem_RawFree(scratch);
    PyBuffer_Release(&view);
    PyBuffer_Release(&lengths);
    return result;
}

static PyObject *py_salts(PyObject *module, PyObject *unused) {
    (void)module;
    (void)unused;
    PyObject *h = list_of(rdc_salt_h, RDC_TRAITS);
    PyObject *g = list_of(rdc_salt_g, RDC_TRAITS);
    PyObject *result = (h && g) ? PyTuple_Pack(2, h, g) : NULL;
    Py_XDECREF(h);
    Py_XDECREF(g);
    return result;
}

/* trait_candidates(lists, max_id, threshold, limit, exclude) -> [(id, count)]: lists is a
 * sequence of buffers of uint32 file ids (array('I')). */
static PyObject *py_trait_candidates(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *seq;
    unsigned long max_id, threshold;
    Py_ssize_t limit;
    long long exclude;
    if (!PyArg_ParseTuple(args, "OkknL", &seq, &max_id, &threshold, &limit, &exclude))
        return NULL;
    if (max_id > UINT32_MAX || limit < 0) {
        PyErr_SetString(PyExc_ValueError, "max_id must fit 32 bits and limit be >= 0");
        return NULL;
    }
    PyObject *fast = PySequence_Fast(seq, "lists must be a sequence of id buffers");
    if (!fast) return NULL;
    Py_ssize_t nlists = PySequence_Fast_GET_SIZE(fast);
    Py_buffer *views = PyMem_Calloc((size_t)nlists + 1, sizeof *views);
    const uint32_t **lists = PyMem_Calloc((size_t)nlists + 1, sizeof *lists);
    size_t *lens = PyMem_Calloc((size_t)nlists + 1, sizeof *lens);
    uint32_t *ids = PyMem_Calloc((size_t)limit + 1, sizeof *ids);
    uint8_t *counts = PyMem_Calloc((size_t)limit + 1, 1);
    PyObject *result = NULL;
    Py_ssize_t got = 0;
    if (!views || !lists || !lens || !ids || !counts) {
        PyErr_NoMemory();
        goto done;
    }
    for (; got < nlists; got++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(fast, got), &views[got],
                               PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
            goto done;
        if (views[got].itemsize != 4 || (views[got].format && strcmp(views[got].format, "I"))) {
            PyErr_SetString(PyExc_TypeError, "each list must be a buffer of uint32 ('I')");
            got++;
            goto done;
        }
        lists[got] = views[got].buf;
        lens[got] = (size_t)views[got].len / 4;
        for (size_t j = 0; j < lens[got]; j++) {
            if (lists[got][j] > max_id) {
                PyErr_SetString(PyExc_ValueError, "an id over max_id");
                got++;
                goto done;
            }
        }
    }
    long n;
    Py_BEGIN_ALLOW_THREADS
    n = rdc_trait_candidates(lists, lens, (size_t)nlists, (uint32_t)max_id,
                             (uint32_t)threshold, exclude, (size_t)limit, ids, counts);
    Py_END_ALLOW_THREADS
    if (n < 0) {
        PyErr_NoMemory();
        goto done;
    }
    result = PyList_New(n);
    for (long k = 0; result && k < n; k++) {
        PyObject *pair = Py_BuildValue("(kk)", (unsigned long)ids[k], (unsigned long)counts[k]);
        if (!pair) {
            Py_CLEAR(result);
            break;
        }
        PyList_SET_ITEM(result, k, pair);
    }
done:
    for (Py_ssize_t i = 0; views && i < got; i++) PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    PyMem_Free(lists);
    PyMem_Free(lens);
    PyMem_Free(ids);
    PyMem_Free(counts);
    Py_DECREF(fast);
    return result;
}

/* trait_buckets(ids, sketches): the ids (uint32, ascending) sorted into the 768 trait
 * buckets t * 64 + value by their sketches (12 bytes each; a value over 63 has none), as
 * 768 bytes objects of uint32s, each in the ids' order. */
static PyObject *py_trait_buckets(PyObject *module, PyObject *args) {
    (void)module;
    Py_buffer ids, sketches;
    if (!PyArg_ParseTuple(args, "y*y*", &ids, &sketches)) return NULL;
    PyObject *result = NULL;
    uint32_t *out = NULL;
    size_t n = (size_t)ids.len / 4;
    size_t counts[RDC_TRAITS * 64] = {0}, starts[RDC_TRAITS * 64];
    if (ids.len % 4 || (size_t)sketches.len != n * RDC_TRAITS) {
        PyErr_SetString(PyExc_ValueError, "need 4 bytes of id and 12 of sketch per file");
        goto done;
    }
    const uint8_t *sk = sketches.buf;
    const uint8_t *id_bytes = ids.buf;
    for (size_t i = 0; i < n * RDC_TRAITS; i++)
        if (sk[i] < 64) counts[(i % RDC_TRAITS) * 64 + sk[i]]++;
    size_t total = 0;
    for (size_t b = 0; b < RDC_TRAITS * 64; b++) {
        starts[b] = total;
        total += counts[b];
    }
    if (!(out = PyMem_RawMalloc((total ? total : 1) * sizeof *out))) {
        PyErr_NoMemory();
        goto done;
    }
    size_t at[RDC_TRAITS * 64];
    memcpy(at, starts, sizeof at);
    for (size_t i = 0; i < n; i++) {
        uint32_t id;
        memcpy(&id, id_bytes + 4 * i, 4);
        for (size_t t = 0; t < RDC_TRAITS; t++) {
            uint8_t v = sk[i * RDC_TRAITS + t];
            if (v < 64) out[at[t * 64 + v]++] = id;
        }
    }
    result = PyList_New(RDC_TRAITS * 64);
    for (size_t b = 0; result && b < RDC_TRAITS * 64; b++) {
        PyObject *chunk = PyBytes_FromStringAndSize((const char *)(out + starts[b]),
                                                    (Py_ssize_t)(counts[b] * sizeof *out));
        if (!chunk) {
            Py_CLEAR(result);
            break;
        }
        PyList_SET_ITEM(result, (Py_ssize_t)b, chunk);
    }
done:
    PyMem_RawFree(out);
    PyBuffer_Release(&ids);
    PyBuffer_Release(&sketches);
    return result;
}

/* One level of a tree being packed: its hashes and lengths, held while the tree is packed. */
typedef struct {
    Py_buffer hashes, lengths;
} held_level;

static PyObject *py_pack_tree(PyObject *module, PyObject *args) {
    (void)module;
    Py_buffer head;
    PyObject *levels_obj;
    if (!PyArg_ParseTuple(args, "y*O", &head, &levels_obj)) return NULL;
    PyObject *levels = PySequence_Fast(levels_obj, "levels must be a sequence");
    PyObject *result = NULL;
    held_level *held = NULL;
    const uint8_t **hashes = NULL;
    const uint64_t **lengths = NULL;
    size_t *ns = NULL;
    Py_ssize_t count = 0, taken = 0;
    if (!levels) goto done;
    count = PySequence_Fast_GET_SIZE(levels);
    size_t slots = count ? (size_t)count : 1;
    held = PyMem_Calloc(slots, sizeof *held);
    hashes = PyMem_Calloc(slots, sizeof *hashes);
    lengths = PyMem_Calloc(slots, sizeof *lengths);
    ns = PyMem_Calloc(slots, sizeof *ns);
    if (!held || !hashes || !lengths || !ns) {
        PyErr_NoMemory();
        goto done;
    }
    for (; taken < count; taken++) {
        PyObject *level = PySequence_Fast_GET_ITEM(levels, taken);
        PyObject *h = PyObject_GetAttrString(level, "hashes");
        PyObject *l = h ? PyObject_GetAttrString(level, "lengths") : NULL;
        int bad = !l || get_hashes(h, &held[taken].hashes, &ns[taken]) < 0;
        if (!bad && PyObject_GetBuffer(l, &held[taken].lengths, PyBUF_SIMPLE) < 0) {
            PyBuffer_Release(&held[taken].hashes);
            bad = 1;
        }
        Py_XDECREF(h);
        Py_XDECREF(l);
        if (bad) goto done;
        hashes[taken] = held[taken].hashes.buf;
        lengths[taken] = held[taken].lengths.buf;
        if ((size_t)held[taken].lengths.len != ns[taken] * sizeof(uint64_t)) {
            taken++;
            PyErr_SetString(PyExc_ValueError, "need one length (array('Q')) per hash");
            goto done;
        }
    }
    uint8_t *buf = PyMem_Malloc(rdc_packed_max((size_t)head.len, (size_t)count, ns));
    if (!buf) {
        PyErr_NoMemory();
        goto done;
    }
    size_t size = rdc_pack_levels(head.buf, (size_t)head.len, (size_t)count, hashes, lengths,
                                  ns, buf);
    result = PyBytes_FromStringAndSize((const char *)buf, (Py_ssize_t)size);
    PyMem_Free(buf);
done:
    for (Py_ssize_t i = 0; i < taken; i++) {
        PyBuffer_Release(&held[i].hashes);
        PyBuffer_Release(&held[i].lengths);
    }
    PyMem_Free(held);
    PyMem_Free(hashes);
    PyMem_Free(lengths);
    PyMem_Free(ns);
    Py_XDECREF(levels);
    PyBuffer_Release(&head);
    return result;
}

/* A count or position argument as a Py_ssize_t; one past the range clips (and is then
 * refused by the caller's range check) rather than raising OverflowError. */
static int ssize_arg(PyObject *obj, Py_ssize_t *out) {
    *out = PyNumber_AsSsize_t(obj, NULL);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* unpack_level(data, pos, count) -> (hashes, lengths, end): count entries (32-byte hash,
 * varint length) of a packed tree level from data[pos:], as rdc.content.tree's Python
 * loop reads them: the varints as read_varint does (at most 10 bytes), a length over 64
 * bits an OverflowError as array('Q') gives there, anything cut short a ValueError. */
static PyObject *py_unpack_level(PyObject *module, PyObject *args) {
    (void)module;
    Py_buffer data;
    PyObject *pos_obj, *count_obj;
    if (!PyArg_ParseTuple(args, "y*OO", &data, &pos_obj, &count_obj)) return NULL;
    PyObject *hashes = NULL, *lengths = NULL, *result = NULL;
    uint64_t *values = NULL;
    Py_ssize_t pos, count;
    if (ssize_arg(pos_obj, &pos) < 0 || ssize_arg(count_obj, &count) < 0) goto done;
    if (pos < 0 || pos > data.len || count < 0 ||
        count > (data.len - pos) / (RDC_HASH_BYTES + 1)) {
        PyErr_Format(PyExc_ValueError,
                     "level of %zd entries at %zd does not fit %zd bytes of data", count, pos,
                     data.len);
        goto done;
    }
    hashes = PyBytes_FromStringAndSize(NULL, count * RDC_HASH_BYTES);
    values = PyMem_Malloc((count ? (size_t)count : 1) * sizeof *values);
    if (!hashes || !values) {
        if (hashes) PyErr_NoMemory();
        goto done;
    }
    const uint8_t *in = data.buf;
    uint8_t *out = (uint8_t *)PyBytes_AS_STRING(hashes);
    size_t at = (size_t)pos, len = (size_t)data.len;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (len - at < RDC_HASH_BYTES) goto cut_short;
        memcpy(out + (size_t)i * RDC_HASH_BYTES, in + at, RDC_HASH_BYTES);
        at += RDC_HASH_BYTES;
        uint64_t value = 0;
        for (unsigned int shift = 0;; shift += 7) {
            if (at >= len) goto cut_short;
            if (shift > 63) {
                PyErr_Format(PyExc_ValueError, "overlong varint (over 10 bytes) at %zu", at);
                goto done;
            }
            uint8_t byte = in[at++];
            value |= (uint64_t)(byte & 0x7F) << shift;
            if (byte < 0x80) {
                if (shift == 63 && byte > 1) {
                    PyErr_Format(PyExc_OverflowError, "varint over 64 bits ending at %zu", at);
                    goto done;
                }
                break;
            }
        }
        values[i] = value;
    }
    lengths = PyObject_CallFunction(array_type, "sy#", "Q", (const char *)values,
                                    (Py_ssize_t)((size_t)count * sizeof *values));
    if (!lengths) goto done;
    result = Py_BuildValue("(OOn)", hashes, lengths, (Py_ssize_t)at);
    goto done;
cut_short:
    PyErr_Format(PyExc_ValueError, "level of %zd entries at %zd cut short at byte %zu", count,
                 pos, at);
done:
    Py_XDECREF(hashes);
    Py_XDECREF(lengths);
    PyMem_Free(values);
    PyBuffer_Release(&data);
    return result;
}

static PyMethodDef module_methods[] = {
    {"sketch", py_sketch, METH_O, "sketch(hashes) -> 12 trait bytes, or None for no hashes"},
    {"group_cuts", py_group_cuts, METH_VARARGS,
     "group_cuts(hashes, min_entries, max_entries) -> end index of each group"},
    {"next_level_payloads", py_next_level_payloads, METH_VARARGS,
     "next_level_payloads(level, hashes, lengths, min_entries, max_entries) -> "
     "(payloads, end offsets, array('Q') of group lengths)"},
    {"pack_tree", py_pack_tree, METH_VARARGS,
     "pack_tree(head, levels) -> head, then the levels (each with .hashes and .lengths) "
     "packed as docs/formats.md section 2 says"},
    {"unpack_level", py_unpack_level, METH_VARARGS,
     "unpack_level(data, pos, count) -> (hashes, array('Q') of lengths, end position): "
     "count entries (32-byte hash, varint length) of a packed tree level at data[pos:]"},
    {"salts", py_salts, METH_NOARGS, "salts() -> (SALT_H, SALT_G) as compiled in"},
    {"trait_candidates", py_trait_candidates, METH_VARARGS,
     "trait_candidates(lists, max_id, threshold, limit, exclude) -> [(id, count)], best "
     "first"},
    {"trait_buckets", py_trait_buckets, METH_VARARGS,
     "trait_buckets(ids, sketches) -> 768 bytes of uint32 ids, by bucket t * 64 + value"},
    {NULL},
};

static struct PyModuleDef signature_module = {
    PyModuleDef_HEAD_INIT, "_signature", "Sketch traits and tree grouping, C fast path.", -1,
    module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__signature(void) {
    PyObject *array_module = PyImport_ImportModule("array");
    if (!array_module) return NULL;
    array_type = PyObject_GetAttrString(array_module, "array");
    Py_DECREF(array_module);
    if (!array_type) return NULL;
    return PyModule_Create(&signature_module);
}
