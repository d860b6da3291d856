/* Python glue for chunker_impl.c: argument checks, buffers, the GIL. No algorithm here. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

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
    default: PyErr_Format(PyExc_SystemError, "rdc chunker error %d", code); break;
    }
    return -1;
}

static int Scanner_init(ScannerObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"window", "min_size", "max_size", "filter", NULL};
    unsigned int window, min_size, max_size;
    int filter = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "III|p", kwlist, &window, &min_size, &max_size,
                                     &filter))
        return -1;
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "Scanner is in use");
        return -1;
    }
    rdc_chunker *c;
    int rc = rdc_chunker_new(&c, window, min_size, max_size, filter);
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

#define SCANNER_STAT(name, fn)                                                     \
    static PyObject *Scanner_get_##name(ScannerObject *self, void *closure) {      \
        (void)closure;                                                             \
        return PyLong_FromUnsignedLongLong(self->chunker ? fn(self->chunker) : 0); \
    }
SCANNER_STAT(last_cut, rdc_chunker_last_cut)
SCANNER_STAT(ext_evaluations, rdc_chunker_ext_evaluations)
SCANNER_STAT(positions, rdc_chunker_positions)

static PyGetSetDef Scanner_getset[] = {
    {"last_cut", (getter)Scanner_get_last_cut, NULL, "stream offset of the last cut", NULL},
    {"ext_evaluations", (getter)Scanner_get_ext_evaluations, NULL,
     "positions at which the Rabin key was evaluated", NULL},
    {"positions", (getter)Scanner_get_positions, NULL, "positions whose lead was computed",
     NULL},
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

static PyObject *py_ext(PyObject *module, PyObject *arg) {
    (void)module;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    uint64_t f = rdc_ext(view.buf, (size_t)view.len);
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

static PyMethodDef module_methods[] = {
    {"lead", py_lead, METH_VARARGS, "lead(window, shift) -> lead byte of one window"},
    {"ext", py_ext, METH_O, "ext(window) -> Rabin fingerprint of one window"},
    {"gear_table", py_gear_table, METH_NOARGS, "the 256 gear constants"},
    {NULL},
};

static struct PyModuleDef chunker_module = {
    PyModuleDef_HEAD_INIT, "_chunker", "Winnowing chunker, C fast path.", -1, module_methods,
};

PyMODINIT_FUNC PyInit__chunker(void) {
    rdc_init_tables();
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
