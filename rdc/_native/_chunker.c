/* Python glue for chunker_impl.c: argument checks, buffers, the GIL. No algorithm here. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdlib.h>
#include <string.h>

#include "chunker_impl.h"

typedef struct {
    PyObject_HEAD
    rdc_chunker *chunker;
    int busy; /* a scan is running with the GIL released */
} ScannerObject;

static int raise_code(int code) {
    switch (code) {
    case RDC_ENOMEM: PyErr_NoMemory(); break;
    case RDC_EPARAM:
        PyErr_SetString(PyExc_ValueError,
                        "need window in (16, 32, 64) and window <= min_size < max_size <= 1 MiB");
        break;
    case RDC_EORDER:
        PyErr_SetString(PyExc_ValueError, "data must start at or before the last cut");
        break;
    case RDC_EFINAL: PyErr_SetString(PyExc_ValueError, "scan after the final scan"); break;
    case RDC_EPATH: PyErr_SetString(PyExc_ValueError, "not a code path this CPU can run"); break;
    default: PyErr_Format(PyExc_SystemError, "rdc chunker error %d", code); break;
    }
    return -1;
}

/* The path new scanners take when given none: RDC_CHUNKER_PATH, else the best. */
static int default_path = -1;

static int path_by_name(const char *name) {
    for (int p = 0; p < RDC_CHUNKER_PATHS; p++)
        if (strcmp(name, rdc_chunker_path_name(p)) == 0) return p;
    return -1;
}

/* The path named by a `path=` argument, or -1 with ValueError set. */
static int requested_path(const char *name) {
    int path = path_by_name(name);
    if (path < 0 || !rdc_chunker_path_available(path)) {
        PyErr_Format(PyExc_ValueError, "path=%s: not a code path this CPU can run (see paths())",
                     name);
        return -1;
    }
    return path;
}

static int Scanner_init(ScannerObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"window", "min_size", "max_size", "filter", "path", "sparse_lead",
                             NULL};
    unsigned int window, min_size, max_size;
    int filter = 1;
    const char *path_name = NULL;
    PyObject *sparse_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "III|p$zO", kwlist, &window, &min_size,
                                     &max_size, &filter, &path_name, &sparse_obj))
        return -1;
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "Scanner is in use");
        return -1;
    }
    int path = path_name ? requested_path(path_name) : default_path;
    if (path_name && path < 0) return -1;
    int sparse_lead = RDC_SPARSE_AUTO;
    if (sparse_obj != Py_None) {
        long v = PyLong_AsLong(sparse_obj);
        if (v == -1 && PyErr_Occurred()) return -1;
        if (v < -1 || v > 255) {
            PyErr_SetString(PyExc_ValueError, "sparse_lead must be None, -1 (off) or 0..255");
            return -1;
        }
        sparse_lead = (int)v;
    }
    rdc_chunker *c;
    int rc = rdc_chunker_new(&c, window, min_size, max_size, filter);
    if (rc == RDC_OK) {
        rc = rdc_chunker_configure(c, path, sparse_lead);
        if (rc != RDC_OK) rdc_chunker_free(c);
    }
    if (rc != RDC_OK) return raise_code(rc);
    rdc_chunker_free(self->chunker);
    self->chunker = c;
    return 0;
}

static void Scanner_dealloc(ScannerObject *self) {
    rdc_chunker_free(self->chunker);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Scanner_scan(ScannerObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"data", "base", "final", NULL};
    Py_buffer view;
    unsigned long long base;
    int final;
    if (!self->chunker) {
        PyErr_SetString(PyExc_ValueError, "Scanner not initialised");
        return NULL;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "y*Kp", kwlist, &view, &base, &final))
        return NULL;
    if (self->busy) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_RuntimeError, "Scanner is in use by another thread");
        return NULL;
    }
    size_t cap = rdc_chunker_max_cuts(self->chunker, base + (uint64_t)view.len);
    uint64_t *cuts = PyMem_RawMalloc((cap ? cap : 1) * sizeof(uint64_t));
    if (!cuts) {
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    size_t ncuts = 0;
    int rc;
    self->busy = 1;
    Py_BEGIN_ALLOW_THREADS
    rc = rdc_chunker_scan(self->chunker, view.buf, (size_t)view.len, base, final, cuts, &ncuts);
    Py_END_ALLOW_THREADS
    self->busy = 0;
    PyBuffer_Release(&view);
    PyObject *result = NULL;
    if (rc != RDC_OK) {
        raise_code(rc);
    } else if ((result = PyList_New((Py_ssize_t)ncuts))) {
        for (size_t i = 0; i < ncuts; i++) {
            PyObject *v = PyLong_FromUnsignedLongLong(cuts[i]);
            if (!v) {
                Py_CLEAR(result);
                break;
            }
            PyList_SET_ITEM(result, (Py_ssize_t)i, v);
        }
    }
    PyMem_RawFree(cuts);
    return result;
}

static PyObject *Scanner_get_last_cut(ScannerObject *self, void *closure) {
    (void)closure;
    return PyLong_FromUnsignedLongLong(self->chunker ? rdc_chunker_last_cut(self->chunker) : 0);
}

static PyObject *Scanner_get_path(ScannerObject *self, void *closure) {
    (void)closure;
    if (!self->chunker) Py_RETURN_NONE;
    return PyUnicode_FromString(rdc_chunker_path_name(rdc_chunker_path(self->chunker)));
}

#define SCANNER_STAT(name)                                                   \
    static PyObject *Scanner_get_##name(ScannerObject *self, void *closure) { \
        (void)closure;                                                       \
        struct rdc_chunker_stats stats = {0};                                \
        if (self->chunker) rdc_chunker_stats(self->chunker, &stats);         \
        return PyLong_FromUnsignedLongLong(stats.name);                      \
    }
SCANNER_STAT(ext_evaluations)
SCANNER_STAT(positions)
SCANNER_STAT(sparse_windows)
SCANNER_STAT(dense_windows)
SCANNER_STAT(rerolled)

static PyGetSetDef Scanner_getset[] = {
    {"last_cut", (getter)Scanner_get_last_cut, NULL, "stream offset of the last cut", NULL},
    {"path", (getter)Scanner_get_path, NULL, "the code path this scanner runs", NULL},
    {"ext_evaluations", (getter)Scanner_get_ext_evaluations, NULL,
     "positions at which the Rabin key was evaluated", NULL},
    {"positions", (getter)Scanner_get_positions, NULL,
     "leads computed (a window rolled again counts twice)", NULL},
    {"sparse_windows", (getter)Scanner_get_sparse_windows, NULL,
     "windows decided from the sparse roll", NULL},
    {"dense_windows", (getter)Scanner_get_dense_windows, NULL,
     "windows decided from stored leads", NULL},
    {"rerolled", (getter)Scanner_get_rerolled, NULL,
     "sparse windows without a small lead, rolled again in full", NULL},
    {NULL},
};

static PyMethodDef Scanner_methods[] = {
    {"scan", (PyCFunction)(void (*)(void))Scanner_scan, METH_VARARGS | METH_KEYWORDS,
     "scan(data, base, final) -> list of new cut offsets"},
    {NULL},
};

static PyTypeObject ScannerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "rdc._native._chunker.Scanner",
    .tp_basicsize = sizeof(ScannerObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Resumable winnowing scanner over one stream (see chunker_impl.h).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Scanner_init,
    .tp_dealloc = (destructor)Scanner_dealloc,
    .tp_methods = Scanner_methods,
    .tp_getset = Scanner_getset,
};

static PyObject *py_lead(PyObject *module, PyObject *args) {
    (void)module;
    Py_buffer view;
    unsigned int shift;
    if (!PyArg_ParseTuple(args, "y*I", &view, &shift)) return NULL;
    uint8_t lead = rdc_lead(view.buf, (size_t)view.len, shift);
    PyBuffer_Release(&view);
    return PyLong_FromLong(lead);
}

static PyObject *py_ext(PyObject *module, PyObject *args, PyObject *kwds) {
    (void)module;
    static char *kwlist[] = {"window", "path", NULL};
    Py_buffer view;
    const char *path_name = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "y*|$z", kwlist, &view, &path_name)) return NULL;
    int path = path_name          ? requested_path(path_name)
               : default_path >= 0 ? default_path
                                   : rdc_chunker_best_path();
    if (path < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    uint64_t f = rdc_ext_on(path, view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLongLong(f);
}

static PyObject *py_gear_table(PyObject *module, PyObject *unused) {
    (void)module;
    (void)unused;
    PyObject *t = PyTuple_New(256);
    for (int i = 0; t && i < 256; i++) {
        PyObject *v = PyLong_FromUnsignedLongLong(rdc_gear[i]);
        if (!v) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, i, v);
    }
    return t;
}

static PyObject *py_paths(PyObject *module, PyObject *unused) {
    (void)module;
    (void)unused;
    PyObject *list = PyList_New(0);
    for (int p = 0; list && p < RDC_CHUNKER_PATHS; p++) {
        if (!rdc_chunker_path_available(p)) continue;
        PyObject *name = PyUnicode_FromString(rdc_chunker_path_name(p));
        if (!name || PyList_Append(list, name) < 0) Py_CLEAR(list);
        Py_XDECREF(name);
    }
    return list;
}

static PyObject *py_default_path(PyObject *module, PyObject *unused) {
    (void)module;
    (void)unused;
    return PyUnicode_FromString(
        rdc_chunker_path_name(default_path < 0 ? rdc_chunker_best_path() : default_path));
}

static PyMethodDef module_methods[] = {
    {"lead", py_lead, METH_VARARGS, "lead(window, shift) -> lead byte of one window"},
    {"ext", (PyCFunction)(void (*)(void))py_ext, METH_VARARGS | METH_KEYWORDS,
     "ext(window, *, path=None) -> Rabin fingerprint of one window, by a code path's method "
     "(default_path() for None)"},
    {"gear_table", py_gear_table, METH_NOARGS, "the 256 gear constants"},
    {"paths", py_paths, METH_NOARGS, "paths() -> the code paths this CPU can run, slowest first"},
    {"default_path", py_default_path, METH_NOARGS,
     "default_path() -> the code path a Scanner takes when given none"},
    {NULL},
};

static struct PyModuleDef chunker_module = {
    PyModuleDef_HEAD_INIT, "_chunker", "Winnowing chunker, C fast path.", -1, module_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__chunker(void) {
    rdc_init_tables();
    /* RDC_CHUNKER_PATH=portable|sse2|avx2 forces a code path (for tests and benchmarks). */
    const char *forced = getenv("RDC_CHUNKER_PATH");
    if (forced && *forced) {
        default_path = path_by_name(forced);
        if (default_path < 0 || !rdc_chunker_path_available(default_path)) {
            PyErr_Format(PyExc_ImportError,
                         "RDC_CHUNKER_PATH=%s: not a code path this CPU can run", forced);
            return NULL;
        }
    }
    if (PyType_Ready(&ScannerType) < 0) return NULL;
    PyObject *m = PyModule_Create(&chunker_module);
    if (!m) return NULL;
    Py_INCREF(&ScannerType);
    if (PyModule_AddObject(m, "Scanner", (PyObject *)&ScannerType) < 0) {
        Py_DECREF(&ScannerType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
