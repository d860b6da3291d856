/* One directory's entries with their lstat, in one call: what a walk does per directory.

A walk of 10,000 entries spent about half its time in the Python loop around os.scandir
(a DirEntry and a stat_result object per entry, each attribute read through a descriptor).
Here the kernel calls run with the GIL released, into a plain array (listing_read.h); then
one tuple per entry is built. Specification: listing_ref.py. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "blake3_impl.h"
#include "listing_read.h"
#include "stamp_entry.h"

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


/* ---------------------------------------------------------------- stamp_tree

The stamp of a whole tree (rdc.local.snapshot.stamp) and its file count, walked here
without building it: what a sync that finds nothing changed needs, and no more. Only
for trees the plain walk would take as they are: anything else (an entry that cannot be
read, an rdc temporary, a name that is not UTF-8, a directory too deep, one whose
stamp input exceeds RDC_B3_MAX_CHUNK) answers "unsure", and the caller walks in
Python. Specification: listing_ref.stamp_tree. */

enum { STAMP_OK = 0, STAMP_UNSURE = 1, STAMP_NOMEM = 2 };

typedef struct {
    unsigned char *data;
    size_t len, room;
} buf_t;

typedef struct {
    int max_depth;
    const char *temp_prefix;
    size_t temp_len;
    const char *skip;       /* a name left out wherever it is (the folder marker) */
    size_t skip_len;
    uint64_t files;
    buf_t path;             /* the directory being stamped, relative ("" the top) */
    buf_t dirs;             /* per directory: path length (4 bytes), path, its stamp */
} stamp_ctx;

static int utf8_valid(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c < 0x80) { i++; continue; }
        size_t len;
        uint32_t cp;
        if ((c & 0xE0) == 0xC0) { len = 2; cp = c & 0x1F; }
        else if ((c & 0xF0) == 0xE0) { len = 3; cp = c & 0x0F; }
        else if ((c & 0xF8) == 0xF0) { len = 4; cp = c & 0x07; }
        else return 0;
        if (i + len > n) return 0;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000)
            || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
        i += len;
    }
    return 1;
}

static int by_name(const void *a, const void *b, void *arena) {
    const item_t *x = a, *y = b;
    const char *base = arena;
    size_t n = x->name_len < y->name_len ? x->name_len : y->name_len;
    int c = memcmp(base + x->name_at, base + y->name_at, n);
    if (c) return c;
    return (x->name_len > y->name_len) - (x->name_len < y->name_len);
}

static int64_t clamped_ns(time_t sec, long nsec) {
    const int64_t limit = INT64_MAX / 1000000000 - 1;
    if (sec >= limit) return INT64_MAX;
    if (sec <= -limit) return INT64_MIN;
    return (int64_t)sec * 1000000000LL + nsec;
}

static int buf_put(buf_t *b, const void *p, size_t n) {
    if (b->len + n > b->room) {
        size_t room = b->room ? 2 * b->room : 4096;
        while (room < b->len + n) room *= 2;
        unsigned char *data = realloc(b->data, room);
        if (!data) return -1;
        b->data = data;
        b->room = room;
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
    return 0;
}

/* One entry's head (stamp_entry.h), then its name. */
static int put_entry(buf_t *b, char kind, unsigned mode, int64_t mtime, uint64_t size,
                     uint64_t ino, const char *name, size_t len) {
    unsigned char head[STAMP_HEAD];
    stamp_head(head, kind, mode, (uint64_t)mtime, size, ino, (uint32_t)len);
    if (buf_put(b, head, sizeof head) < 0) return -1;
    return buf_put(b, name, len);
}

static int stamp_dir(int fd, int depth, stamp_ctx *ctx, uint8_t out[32]) {
    listing_t l = {0};
    buf_t b = {0};
    int rc = STAMP_OK;
    int err = read_listing(fd, &l);
    if (err) {
        rc = err == ENOMEM ? STAMP_NOMEM : STAMP_UNSURE;
        goto done;
    }
    qsort_r(l.items, l.count, sizeof(item_t), by_name, l.arena);
    for (size_t i = 0; i < l.count && rc == STAMP_OK; i++) {
        const item_t *it = &l.items[i];
        const char *name = l.arena + it->name_at;
        size_t len = it->name_len;
        if ((len >= ctx->temp_len && memcmp(name, ctx->temp_prefix, ctx->temp_len) == 0)
            || it->err || !utf8_valid((const unsigned char *)name, len)) {
            rc = STAMP_UNSURE;
            break;
        }
        if (len == ctx->skip_len && memcmp(name, ctx->skip, len) == 0) continue;
        int64_t mtime = clamped_ns(it->sec, it->nsec);
        if (S_ISREG(it->mode)) {
            ctx->files++;
            if (put_entry(&b, 'f', it->mode & 07777, mtime, (uint64_t)it->size, it->ino, name,
                          len) < 0) rc = STAMP_NOMEM;
        } else if (S_ISLNK(it->mode)) {
            char target[PATH_MAX + 1];
            char *cname = strndup(name, len);
            if (!cname) { rc = STAMP_NOMEM; break; }
            ssize_t n = readlinkat(fd, cname, target, sizeof target);
            free(cname);
            if (n < 0 || (size_t)n >= sizeof target) { rc = STAMP_UNSURE; break; }
            target[n] = 0;
            if (put_entry(&b, 'l', 0, mtime, 0, it->ino, name, len) < 0
                || buf_put(&b, target, (size_t)n + 1) < 0) rc = STAMP_NOMEM;
        } else if (S_ISDIR(it->mode)) {
            if (depth >= ctx->max_depth) { rc = STAMP_UNSURE; break; }
            char *cname = strndup(name, len);
            if (!cname) { rc = STAMP_NOMEM; break; }
            int child = openat(fd, cname, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            free(cname);
            if (child < 0) { rc = STAMP_UNSURE; break; }
            uint8_t sub[32];
            size_t at = ctx->path.len;
            if ((at && buf_put(&ctx->path, "/", 1) < 0) || buf_put(&ctx->path, name, len) < 0) {
                close(child);
                rc = STAMP_NOMEM;
                break;
            }
            rc = stamp_dir(child, depth + 1, ctx, sub);
            ctx->path.len = at;
            close(child);
            if (rc == STAMP_OK && (put_entry(&b, 'd', it->mode & 07777, mtime, 0, it->ino, name,
                                              len) < 0 || buf_put(&b, sub, 32) < 0))
                rc = STAMP_NOMEM;
        }
        /* other kinds (sockets, devices, FIFOs) are not synced: left out */
    }
    if (rc == STAMP_OK) {
        if (b.len > RDC_B3_MAX_CHUNK) {
            rc = STAMP_UNSURE;
        } else {
            uint64_t end = b.len;
            static const unsigned char empty[1] = {0};
            int h = rdc_b3_hash_chunks(b.len ? b.data : empty, &end, 1, 0, out, -1);
            if (h == RDC_B3_ENOMEM) rc = STAMP_NOMEM;
            else if (h) rc = STAMP_UNSURE;
        }
    }
    if (rc == STAMP_OK) {
        unsigned char head[4];
        put_le(head, ctx->path.len, 4);
        if (buf_put(&ctx->dirs, head, 4) < 0
            || (ctx->path.len && buf_put(&ctx->dirs, ctx->path.data, ctx->path.len) < 0)
            || buf_put(&ctx->dirs, out, 32) < 0) rc = STAMP_NOMEM;
    }
done:
    free(b.data);
    listing_free(&l);
    return rc;
}

static PyObject *py_stamp_tree(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *fdobj;
    int max_depth;
    const char *prefix, *skip;
    Py_ssize_t prefix_len, skip_len;
    if (!PyArg_ParseTuple(args, "Oiy#y#", &fdobj, &max_depth, &prefix, &prefix_len, &skip,
                          &skip_len)) return NULL;
    int fd = PyObject_AsFileDescriptor(fdobj);
    if (fd < 0) return NULL;
    stamp_ctx ctx = {max_depth, prefix, (size_t)prefix_len, skip, (size_t)skip_len, 0,
                     {0}, {0}};
    uint8_t out[32];
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = stamp_dir(fd, 0, &ctx, out);
    Py_END_ALLOW_THREADS
    free(ctx.path.data);
    PyObject *dirs = NULL, *result = NULL;
    if (rc == STAMP_NOMEM) {
        PyErr_NoMemory();
        goto done;
    }
    if (rc != STAMP_OK) {
        result = Py_None;
        Py_INCREF(result);
        goto done;
    }
    dirs = PyDict_New();
    if (!dirs) goto done;
    for (size_t at = 0; at < ctx.dirs.len;) {
        const unsigned char *rec = ctx.dirs.data + at;
        size_t n = (size_t)rec[0] | (size_t)rec[1] << 8 | (size_t)rec[2] << 16
                   | (size_t)rec[3] << 24;
        PyObject *key = PyUnicode_DecodeFSDefaultAndSize((const char *)rec + 4,
                                                         (Py_ssize_t)n);
        PyObject *value = key ? PyBytes_FromStringAndSize((const char *)rec + 4 + n, 32)
                              : NULL;
        int bad = !value || PyDict_SetItem(dirs, key, value) < 0;
        Py_XDECREF(key);
        Py_XDECREF(value);
        if (bad) goto done;
        at += 4 + n + 32;
    }
    result = Py_BuildValue("(y#KO)", (const char *)out, (Py_ssize_t)32,
                           (unsigned long long)ctx.files, dirs);
done:
    Py_XDECREF(dirs);
    free(ctx.dirs.data);
    return result;
}

static PyMethodDef methods[] = {
    {"list_dir", py_list_dir, METH_O,
     "list_dir(fd) -> [(name, mode, size, mtime_ns, inode)]: the entries of directory fd "
     "(not '.' or '..') in the order the kernel lists them, each with its lstat; an entry "
     "whose lstat failed has mode -errno and zeros."},
    {"stamp_tree", py_stamp_tree, METH_VARARGS,
     "stamp_tree(fd, max_depth, temp_prefix, skip) -> (stamp, files, dirs) | None: the stamp "
     "of the tree under directory fd as a plain walk would seal it, its regular files, and "
     "the stamp of each directory by relative path (\"\" the top); None where that walk "
     "would see errors, temporaries or names it decodes otherwise."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_listing", "Directory listing with lstat (see list_dir).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__listing(void) { return PyModule_Create(&module_def); }
