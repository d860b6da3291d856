/* One directory's entries with their lstat, in one call: what a walk does per directory.

A walk of 10,000 entries spent about half its time in the Python loop around os.scandir
(a DirEntry and a stat_result object per entry, each attribute read through a descriptor).
Here the kernel calls run with the GIL released, into a plain array; then one tuple per
entry is built. Specification: listing_ref.py. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    size_t name_at;   /* offset of the name in the arena */
    size_t name_len;
    int err;          /* errno of the lstat, 0 if it worked */
    mode_t mode;
    off_t size;
    time_t sec;
    long nsec;
    ino_t ino;
} item_t;

typedef struct {
    item_t *items;
    size_t count, cap;
    char *arena;
    size_t used, room;
} listing_t;

static void listing_free(listing_t *l) {
    free(l->items);
    free(l->arena);
}

/* Appends one entry; -1 when memory ran out. */
static int listing_add(listing_t *l, const char *name, size_t len) {
    if (l->count == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        item_t *items = realloc(l->items, cap * sizeof(item_t));
        if (!items) return -1;
        l->items = items;
        l->cap = cap;
    }
    if (l->used + len > l->room) {
        size_t room = l->room ? 2 * l->room : 4096;
        while (room < l->used + len) room *= 2;
        char *arena = realloc(l->arena, room);
        if (!arena) return -1;
        l->arena = arena;
        l->room = room;
    }
    memcpy(l->arena + l->used, name, len);
    item_t *it = &l->items[l->count++];
    memset(it, 0, sizeof(*it));
    it->name_at = l->used;
    it->name_len = len;
    l->used += len;
    return 0;
}

/* Reads directory fd (not closed; its offset, shared with the dup read here, is left at
the start) into l: 0, or an errno. */
static int read_listing(int fd, listing_t *l) {
    int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (own < 0) return errno;
    DIR *dir = fdopendir(own);
    if (!dir) {
        int err = errno;
        close(own);
        return err;
    }
    rewinddir(dir); /* a dup shares the offset of fd, which an earlier reader moved */
    int dfd = dirfd(dir);
    int err = 0;
    for (;;) {
        errno = 0;
        struct dirent *d = readdir(dir);
        if (!d) {
            err = errno;
            break;
        }
        const char *name = d->d_name;
        if (name[0] == '.' && (name[1] == 0 || (name[1] == '.' && name[2] == 0))) continue;
        if (listing_add(l, name, strlen(name)) < 0) {
            err = ENOMEM;
            break;
        }
        item_t *it = &l->items[l->count - 1];
        struct stat st;
        if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
            it->err = errno ? errno : EIO;
            continue;
        }
        it->mode = st.st_mode;
        it->size = st.st_size;
        it->sec = st.st_mtim.tv_sec;
        it->nsec = st.st_mtim.tv_nsec;
        it->ino = st.st_ino;
    }
    rewinddir(dir); /* the offset is shared: leave it where os.scandir leaves it */
    closedir(dir);
    return err;
}

/* sec * 10**9 + nsec as a Python int, exact for any time the file system holds. */
static PyObject *time_ns(time_t sec, long nsec) {
    const int64_t limit = INT64_MAX / 1000000000 - 1;
    if (sec > -limit && sec < limit) return PyLong_FromLongLong((long long)sec * 1000000000LL + nsec);
    PyObject *s = PyLong_FromLongLong((long long)sec);
    PyObject *billion = PyLong_FromLong(1000000000L);
    PyObject *n = PyLong_FromLong(nsec);
    PyObject *out = NULL;
    if (s && billion && n) {
        PyObject *scaled = PyNumber_Multiply(s, billion);
        if (scaled) {
            out = PyNumber_Add(scaled, n);
            Py_DECREF(scaled);
        }
    }
    Py_XDECREF(s);
    Py_XDECREF(billion);
    Py_XDECREF(n);
    return out;
}

static PyObject *item_tuple(const listing_t *l, const item_t *it) {
    PyObject *name = PyUnicode_DecodeFSDefaultAndSize(l->arena + it->name_at,
                                                      (Py_ssize_t)it->name_len);
    if (!name) return NULL;
    if (it->err) return Py_BuildValue("(Niiii)", name, -it->err, 0, 0, 0);
    PyObject *mtime = time_ns(it->sec, it->nsec);
    if (!mtime) {
        Py_DECREF(name);
        return NULL;
    }
    return Py_BuildValue("(NkLNK)", name, (unsigned long)it->mode, (long long)it->size,
                         mtime, (unsigned long long)it->ino);
}

static PyObject *py_list_dir(PyObject *module, PyObject *arg) {
    (void)module;
    int fd = PyObject_AsFileDescriptor(arg);
    if (fd < 0) return NULL;
    listing_t l = {0};
    int err;
    Py_BEGIN_ALLOW_THREADS
    err = read_listing(fd, &l);
    Py_END_ALLOW_THREADS
    if (err) {
        listing_free(&l);
        if (err == ENOMEM) return PyErr_NoMemory();
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    PyObject *out = PyList_New((Py_ssize_t)l.count);
    if (!out) {
        listing_free(&l);
        return NULL;
    }
    for (size_t i = 0; i < l.count; i++) {
        PyObject *t = item_tuple(&l, &l.items[i]);
        if (!t) {
            Py_DECREF(out);
            listing_free(&l);
            return NULL;
        }
        PyList_SET_ITEM(out, (Py_ssize_t)i, t);
    }
    listing_free(&l);
    return out;
}

static PyMethodDef methods[] = {
    {"list_dir", py_list_dir, METH_O,
     "list_dir(fd) -> [(name, mode, size, mtime_ns, inode)]: the entries of directory fd "
     "(not '.' or '..') in the order the kernel lists them, each with its lstat; an entry "
     "whose lstat failed has mode -errno and zeros."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_listing", "Directory listing with lstat (see list_dir).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__listing(void) { return PyModule_Create(&module_def); }
