/* A packed tree (rdc/local/sealed.py) back into its Entry objects, in one call.

A process that starts from the tree kept in its index (every push and pull of a large
tree, on both sides, and every session a daemon opens) unpacked it in Python: for 100,000
files 0.11 s, on the path to the first comparison, a third of it the loop that makes an
Entry per file (0.08 s here). Here each record is read by marshal's C reader and each Entry is allocated and
its slots filled directly (Entry is a slotted dataclass; no __init__ runs, and it has no
__post_init__). The specification is `rdc.local.sealed._entry`; the record layout is
`rdc.local.sealed._pack`'s. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <marshal.h>
#include <structmember.h>

#include <string.h>

enum { KIND, MODE, MTIME, SIZE, ROOT, TARGET, CHILDREN, CONTENT, META, SMETA, COUNT, INO, SEEN,
       FIELDS };
static const char *const field_names[FIELDS] = {
    "kind", "mode", "mtime_ns", "size", "root", "target", "children", "content", "meta",
    "smeta", "count", "ino", "seen",
};

typedef struct {
    PyTypeObject *type;
    Py_ssize_t offset[FIELDS];
    PyObject *no_children, *kind_f, *kind_l, *kind_d, *empty_bytes, *empty_str, *zero;
    const char *body;
    Py_ssize_t len, at;
    int depth;
} unpacker_t;

/* Finds each field's slot in the type's members; -1 with TypeError if one is missing. */
static int find_slots(unpacker_t *u) {
    for (int f = 0; f < FIELDS; f++) u->offset[f] = -1;
    for (PyMemberDef *m = u->type->tp_members; m && m->name; m++) {
        for (int f = 0; f < FIELDS; f++) {
            if (strcmp(m->name, field_names[f]) == 0 && m->type == T_OBJECT_EX
                && !(m->flags & READONLY)) {
                u->offset[f] = m->offset;
            }
        }
    }
    for (int f = 0; f < FIELDS; f++) {
        if (u->offset[f] < 0) {
            PyErr_Format(PyExc_TypeError, "entry type has no slot %s", field_names[f]);
            return -1;
        }
    }
    return 0;
}

/* A new Entry with every slot set (each value's reference is stolen; all must be
   non-NULL, and on failure all are released). */
static PyObject *make_entry(unpacker_t *u, PyObject *values[FIELDS]) {
    PyObject *e = u->type->tp_alloc(u->type, 0);
    if (!e) {
        for (int f = 0; f < FIELDS; f++) Py_DECREF(values[f]);
        return NULL;
    }
    for (int f = 0; f < FIELDS; f++) *(PyObject **)((char *)e + u->offset[f]) = values[f];
    return e;
}

static PyObject *new_ref(PyObject *o) {
    Py_INCREF(o);
    return o;
}

static PyObject *next_record(unpacker_t *u) {
    if (u->len - u->at < 5) {
        PyErr_SetString(PyExc_EOFError, "a record runs past the end");
        return NULL;
    }
    const unsigned char *p = (const unsigned char *)u->body + u->at;
    Py_ssize_t n = (Py_ssize_t)((size_t)p[0] | (size_t)p[1] << 8 | (size_t)p[2] << 16
                                | (size_t)p[3] << 24);
    if (n < 1 || n > u->len - u->at - 4) {
        PyErr_SetString(PyExc_EOFError, "a record runs past the end");
        return NULL;
    }
    PyObject *record = PyMarshal_ReadObjectFromString(u->body + u->at + 4, n);
    u->at += 4 + n;
    return record;
}

static PyObject *file_entry(unpacker_t *u, PyObject *item) {
    /* (mode, mtime_ns, size, root, ino) */
    PyObject *v[FIELDS] = {
        new_ref(u->kind_f), new_ref(PyTuple_GET_ITEM(item, 0)),
        new_ref(PyTuple_GET_ITEM(item, 1)), new_ref(PyTuple_GET_ITEM(item, 2)),
        new_ref(PyTuple_GET_ITEM(item, 3)), new_ref(u->empty_str), new_ref(u->no_children),
        new_ref(u->empty_bytes), new_ref(u->empty_bytes), new_ref(u->empty_bytes),
        new_ref(u->zero), new_ref(PyTuple_GET_ITEM(item, 4)), new_ref(u->empty_bytes),
    };
    return make_entry(u, v);
}

static PyObject *link_entry(unpacker_t *u, PyObject *item) {
    /* (mtime_ns, target, ino) */
    PyObject *v[FIELDS] = {
        new_ref(u->kind_l), new_ref(u->zero), new_ref(PyTuple_GET_ITEM(item, 0)),
        new_ref(u->zero), new_ref(u->empty_bytes), new_ref(PyTuple_GET_ITEM(item, 1)),
        new_ref(u->no_children), new_ref(u->empty_bytes), new_ref(u->empty_bytes),
        new_ref(u->empty_bytes), new_ref(u->zero), new_ref(PyTuple_GET_ITEM(item, 2)),
        new_ref(u->empty_bytes),
    };
    return make_entry(u, v);
}

static PyObject *dir_entry(unpacker_t *u);

/* The children of a directory record into ``children``; -1 on error. */
static int fill_children(unpacker_t *u, PyObject *children, PyObject *names, PyObject *items) {
    Py_ssize_t count = PyTuple_GET_SIZE(names);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *name = PyTuple_GET_ITEM(names, i), *item = PyTuple_GET_ITEM(items, i);
        PyObject *child;
        if (item == Py_None) {
            child = dir_entry(u);
        } else if (PyTuple_Check(item) && PyTuple_GET_SIZE(item) == 5) {
            child = file_entry(u, item);
        } else if (PyTuple_Check(item) && PyTuple_GET_SIZE(item) == 3) {
            child = link_entry(u, item);
        } else {
            PyErr_SetString(PyExc_ValueError, "an entry of an unknown form");
            return -1;
        }
        if (!child) return -1;
        int bad = PyDict_SetItem(children, name, child) < 0;
        Py_DECREF(child);
        if (bad) return -1;
    }
    return 0;
}

static PyObject *dir_entry(unpacker_t *u) {
    if (++u->depth > 1000) {  /* the packer's trees are at most MAX_DEPTH deep */
        PyErr_SetString(PyExc_ValueError, "a tree deeper than any walk makes");
        return NULL;
    }
    PyObject *record = next_record(u), *children = NULL, *result = NULL;
    if (!record) goto done;
    if (!PyTuple_Check(record) || PyTuple_GET_SIZE(record) != 10) {
        PyErr_SetString(PyExc_ValueError, "a directory record of the wrong form");
        goto done;
    }
    PyObject *names = PyTuple_GET_ITEM(record, 8), *items = PyTuple_GET_ITEM(record, 9);
    if (!PyTuple_Check(names) || !PyTuple_Check(items)
        || PyTuple_GET_SIZE(names) != PyTuple_GET_SIZE(items)) {
        PyErr_SetString(PyExc_ValueError, "names and items of different lengths");
        goto done;
    }
    PyObject *seen = PyTuple_GET_ITEM(record, 7), *content = PyTuple_GET_ITEM(record, 3);
    children = PyDict_New();
    if (!children || fill_children(u, children, names, items) < 0) goto done;
    int truth_seen = PyObject_IsTrue(seen), truth_content = PyObject_IsTrue(content);
    if (truth_seen < 0 || truth_content < 0) goto done;
    if (!truth_seen || !truth_content) {
        PyErr_SetString(PyExc_ValueError, "a directory without its hashes or stamp");
        goto done;
    }
    /* (mode, mtime_ns, ino, content, meta, smeta, count, seen, names, items) */
    PyObject *v[FIELDS] = {
        new_ref(u->kind_d), new_ref(PyTuple_GET_ITEM(record, 0)),
        new_ref(PyTuple_GET_ITEM(record, 1)), new_ref(u->zero), new_ref(u->empty_bytes),
        new_ref(u->empty_str), new_ref(children), new_ref(content),
        new_ref(PyTuple_GET_ITEM(record, 4)), new_ref(PyTuple_GET_ITEM(record, 5)),
        new_ref(PyTuple_GET_ITEM(record, 6)), new_ref(PyTuple_GET_ITEM(record, 2)),
        new_ref(seen),
    };
    result = make_entry(u, v);
done:
    u->depth--;
    Py_XDECREF(children);
    Py_XDECREF(record);
    return result;
}

static PyObject *py_unpack(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer body;
    PyObject *type, *no_children;
    if (!PyArg_ParseTuple(args, "y*O!O", &body, &PyType_Type, &type, &no_children))
        return NULL;
    unpacker_t u = {.type = (PyTypeObject *)type, .no_children = no_children,
                    .body = body.buf, .len = body.len};
    PyObject *tree = NULL, *result = NULL;
    u.kind_f = PyUnicode_InternFromString("f");
    u.kind_l = PyUnicode_InternFromString("l");
    u.kind_d = PyUnicode_InternFromString("d");
    u.empty_bytes = PyBytes_FromStringAndSize(NULL, 0);
    u.empty_str = PyUnicode_FromStringAndSize(NULL, 0);
    u.zero = PyLong_FromLong(0);
    if (!u.kind_f || !u.kind_l || !u.kind_d || !u.empty_bytes || !u.empty_str || !u.zero)
        goto done;
    if (find_slots(&u) < 0) goto done;
    tree = dir_entry(&u);
    if (tree) result = Py_BuildValue("(On)", tree, u.at);
done:
    Py_XDECREF(tree);
    Py_XDECREF(u.kind_f);
    Py_XDECREF(u.kind_l);
    Py_XDECREF(u.kind_d);
    Py_XDECREF(u.empty_bytes);
    Py_XDECREF(u.empty_str);
    Py_XDECREF(u.zero);
    PyBuffer_Release(&body);
    return result;
}

static PyMethodDef methods[] = {
    {"unpack", py_unpack, METH_VARARGS,
     "unpack(body, entry_type, no_children) -> (tree, consumed): the directory whose record "
     "starts ``body`` (rdc.local.sealed's records) and everything below it, as entries of "
     "``entry_type``, with the bytes its records took; ValueError or EOFError (or what "
     "marshal raises) where the records do not make a tree."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_sealed", "A packed tree back into entries (see unpack).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__sealed(void) { return PyModule_Create(&module_def); }
