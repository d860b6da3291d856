/* Python glue for blake3_impl.c: argument checks, buffers, the GIL. No algorithm here. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdlib.h>
#include <string.h>

#include "blake3_impl.h"

static PyObject *array_type; /* array.array */
static int default_path = -1; /* -1: the best; set by RDC_BLAKE3_PATH at import */

static int path_by_name(const char *name) {
    for (int p = 0; p < RDC_B3_PATHS; p++)
        if (strcmp(name, rdc_b3_path_name(p)) == 0) return p;
    return -1;
}

static PyObject *py_hash_chunks(PyObject *module, PyObject *args, PyObject *kwds) {
    (void)module;
    static char *kwlist[] = {"data", "ends", "start", "path", "context", NULL};
    Py_buffer view;
    PyObject *ends_obj;
    unsigned long long start = 0;
    const char *path_name = NULL, *context = NULL;
    Py_ssize_t context_len = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "y*O|Kzz#", kwlist, &view, &ends_obj, &start,
                                     &path_name, &context, &context_len))
        return NULL;
    PyObject *result = NULL, *hashes = NULL, *lengths = NULL, *seq = NULL;
    uint64_t *ends = NULL;
    int path = default_path;
    if (path_name && (path = path_by_name(path_name)) < 0) {
        PyErr_Format(PyExc_ValueError, "unknown BLAKE3 code path %s", path_name);
        goto done;
    }
    if (!(seq = PySequence_Fast(ends_obj, "ends must be a sequence of offsets"))) goto done;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    /* ends, then the chunk lengths, in one allocation */
    if (!(ends = PyMem_RawMalloc(2 * (size_t)(n ? n : 1) * sizeof(uint64_t)))) {
        PyErr_NoMemory();
        goto done;
    }
    uint64_t *sizes = ends + n, prev = start;
    for (Py_ssize_t i = 0; i < n; i++) {
        ends[i] = PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(seq, i));
        if (ends[i] == (uint64_t)-1 && PyErr_Occurred()) goto done;
        if (ends[i] < prev || ends[i] > (uint64_t)view.len) {
            PyErr_SetString(PyExc_ValueError,
                            "ends must be non-decreasing, from start, within the data");
            goto done;
        }
        sizes[i] = ends[i] - prev;
        prev = ends[i];
    }
    if (!(hashes = PyBytes_FromStringAndSize(NULL, n * RDC_B3_OUT_BYTES))) goto done;
    int rc;
    uint32_t key[8];
    Py_BEGIN_ALLOW_THREADS
    if (!context)
        rc = rdc_b3_hash_chunks(view.buf, ends, (size_t)n, start,
                                (uint8_t *)PyBytes_AS_STRING(hashes), path);
    else if ((rc = rdc_b3_derive_context_key((const uint8_t *)context, (size_t)context_len,
                                             key)) == RDC_B3_OK)
        rc = rdc_b3_hash_chunks_keyed(view.buf, ends, (size_t)n, start,
                                      (uint8_t *)PyBytes_AS_STRING(hashes), path, key,
                                      64 /* DERIVE_KEY_MATERIAL */);
    Py_END_ALLOW_THREADS
    switch (rc) {
    case RDC_B3_OK: break;
    case RDC_B3_ENOMEM: PyErr_NoMemory(); goto done;
    case RDC_B3_ETOOLONG:
        PyErr_SetString(PyExc_ValueError, "a chunk is longer than 1 MiB");
        goto done;
    case RDC_B3_EPATH:
        PyErr_Format(PyExc_ValueError, "BLAKE3 code path %s is not available on this CPU",
                     rdc_b3_path_name(path));
        goto done;
    default: PyErr_Format(PyExc_SystemError, "rdc blake3 error %d", rc); goto done;
    }
    lengths = PyObject_CallFunction(array_type, "sy#", "Q", (const char *)sizes,
                                    (Py_ssize_t)(n * sizeof(uint64_t)));
    if (lengths) result = PyTuple_Pack(2, hashes, lengths);
done:
    Py_XDECREF(seq);
    Py_XDECREF(hashes);
    Py_XDECREF(lengths);
    PyMem_RawFree(ends);
    PyBuffer_Release(&view);
    return result;
}

static PyObject *py_paths(PyObject *module, PyObject *unused) {
    (void)module;
    (void)unused;
    PyObject *list = PyList_New(0);
    for (int p = 0; list && p < RDC_B3_PATHS; p++) {
        if (!rdc_b3_path_available(p)) continue;
        PyObject *name = PyUnicode_FromString(rdc_b3_path_name(p));
        if (!name || PyList_Append(list, name) < 0) Py_CLEAR(list);
        Py_XDECREF(name);
    }
    return list;
}

static PyObject *py_default_path(PyObject *module, PyObject *unused) {
    (void)module;
    (void)unused;
    return PyUnicode_FromString(rdc_b3_path_name(default_path < 0 ? rdc_b3_best_path()
                                                                   : default_path));
}

static PyMethodDef module_methods[] = {
    {"hash_chunks", (PyCFunction)(void (*)(void))py_hash_chunks, METH_VARARGS | METH_KEYWORDS,
     "hash_chunks(data, ends, start=0, path=None, context=None) -> (packed hashes, "
     "array('Q') of lengths)"},
    {"paths", py_paths, METH_NOARGS, "paths() -> the code paths this CPU can run, slowest first"},
    {"default_path", py_default_path, METH_NOARGS,
     "default_path() -> the code path hash_chunks uses when given none"},
    {NULL},
};

static struct PyModuleDef blake3_module = {
    PyModuleDef_HEAD_INIT, "_blake3", "BLAKE3 of many chunks at once, C fast path.", -1,
    module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__blake3(void) {
    /* RDC_BLAKE3_PATH=scalar|sse2|sse41|avx2|avx512 forces a code path (for tests). */
    const char *forced = getenv("RDC_BLAKE3_PATH");
    if (forced && *forced) {
        default_path = path_by_name(forced);
        if (default_path < 0 || !rdc_b3_path_available(default_path)) {
            PyErr_Format(PyExc_ImportError,
                         "RDC_BLAKE3_PATH=%s: not a code path this CPU can run", forced);
            return NULL;
        }
    }
    PyObject *array_module = PyImport_ImportModule("array");
    if (!array_module) return NULL;
    array_type = PyObject_GetAttrString(array_module, "array");
    Py_DECREF(array_module);
    if (!array_type) return NULL;
    return PyModule_Create(&blake3_module);
}
