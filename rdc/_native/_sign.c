/* A small file's signature in one call: chunk cuts, chunk hashes, every tree level and the
 * sketch, from the pieces the other modules wrap one at a time (chunker_impl, blake3_impl,
 * signature_impl). Python glue and the composition only: every step's algorithm is its
 * module's, and rdc.content.signature is the specification this must equal.
 *
 * Why: signing a 6 KB file step by step from Python cost about 28 us, BLAKE3 of it 3 us; a
 * first copy of 100,000 files signs each on the sending side and builds each tree again on
 * the receiving side. sign_files goes further for an index refresh: it opens, reads and
 * signs a list of small files without the GIL, so one thread does that while the other
 * records the previous list (a cold scan of Django spent 2/3 of its time in Python around
 * reading and signing each file). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "beneath.h"
#include "blake3_impl.h"
#include "chunker_impl.h"
#include "seen.h"
#include "signature_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_LEVELS 64
#define DERIVE_KEY_MATERIAL 64

static PyObject *array_type; /* array.array */

struct level {
    uint8_t *hashes;   /* 32 * n */
    uint64_t *lengths; /* n */
    size_t n;
};

struct signed_buffer {
    struct level levels[MAX_LEVELS];
    size_t nlevels;
    uint8_t sketch[RDC_TRAITS];
    int has_sketch;
};

static void release(struct signed_buffer *s) {
    for (size_t i = 0; i < s->nlevels; i++) {
        free(s->levels[i].hashes);
        free(s->levels[i].lengths);
    }
    s->nlevels = 0;
}

/* Cut data[0..len) with the given winnowing parameters; *ends is malloc'ed (at least one
 * slot). ``*kept``: the chunker of an earlier cut with these parameters, reset and used
 * again (NULL: one is made and left there; the caller frees it). Returns an RDC_ code. */
static int cut(const uint8_t *data, size_t len, const uint32_t p[3], uint64_t **ends,
               size_t *n, rdc_chunker **kept) {
    if (*kept) {
        rdc_chunker_reset(*kept);
    } else {
        int rc = rdc_chunker_new(kept, p[0], p[1], p[2], 1);
        if (rc != RDC_OK) return rc;
    }
    rdc_chunker *c = *kept;
    size_t cap = rdc_chunker_max_cuts(c, len);
    *ends = malloc((cap ? cap : 1) * sizeof(uint64_t));
    if (!*ends) return RDC_ENOMEM;
    int rc = rdc_chunker_scan(c, data, len, 0, 1, *ends, n);
    if (rc != RDC_OK) {
        free(*ends);
        *ends = NULL;
    }
    return rc;
}

/* The hashes (malloc'ed, 32 per piece) and, if lengths is not NULL, the lengths (malloc'ed)
 * of the pieces of data ending at ends[0..n). */
static int hash_pieces(const uint8_t *data, const uint64_t *ends, size_t n, uint8_t **hashes,
                       uint64_t **lengths) {
    *hashes = malloc((n ? n : 1) * RDC_HASH_BYTES);
    if (!*hashes) return RDC_B3_ENOMEM;
    int rc = rdc_b3_hash_chunks(data, ends, n, 0, *hashes, -1);
    if (rc == RDC_B3_OK && lengths) {
        if (!(*lengths = malloc((n ? n : 1) * sizeof(uint64_t)))) {
            rc = RDC_B3_ENOMEM;
        } else {
            uint64_t prev = 0;
            for (size_t i = 0; i < n; i++) {
                (*lengths)[i] = ends[i] - prev;
                prev = ends[i];
            }
        }
    }
    if (rc != RDC_B3_OK) {
        free(*hashes);
        *hashes = NULL;
    }
    return rc;
}

/* The level above `below`, numbered `number` (2 = above the leaves). */
static int next_level(const struct level *below, uint8_t number, const uint32_t group[2],
                      const uint32_t key[8], struct level *out) {
    uint64_t *cuts = malloc(rdc_group_max_cuts(below->n, group[0]) * sizeof(uint64_t) + 8);
    if (!cuts) return -1;
    size_t ncuts;
    if (rdc_group_cuts(below->hashes, below->n, group[0], group[1], cuts, &ncuts) != RDC_SIG_OK) {
        free(cuts);
        return -2;
    }
    uint8_t *payload = malloc(rdc_payload_size(below->n, ncuts) + 1);
    uint64_t *ends = malloc((ncuts + 1) * sizeof(uint64_t));
    out->lengths = malloc((ncuts + 1) * sizeof(uint64_t));
    out->hashes = malloc((ncuts + 1) * RDC_HASH_BYTES);
    out->n = ncuts;
    int rc = -1;
    if (payload && ends && out->lengths && out->hashes) {
        rdc_node_payloads(number, below->hashes, below->lengths, cuts, ncuts, payload, ends,
                          out->lengths);
        rc = rdc_b3_hash_chunks_keyed(payload, ends, ncuts, 0, out->hashes, -1, key,
                                      DERIVE_KEY_MATERIAL) == RDC_B3_OK ? 0 : -1;
    }
    free(cuts);
    free(payload);
    free(ends);
    if (rc) {
        free(out->lengths);
        free(out->hashes);
        out->lengths = NULL;
        out->hashes = NULL;
    }
    return rc;
}

struct request {
    const uint8_t *data;
    size_t len;
    uint32_t chunks[3], subs[3], group[2];
    size_t sketch_min_leaves, content_limit;
    int want_sketch;
    uint32_t key[8];
    /* The chunkers of the chunks and of the sub-chunks, made at the first file and reset
     * for each next one (`request_done` frees them). */
    rdc_chunker *cutters[2];
};

static void request_done(struct request *r) {
    for (int i = 0; i < 2; i++) {
        rdc_chunker_free(r->cutters[i]);
        r->cutters[i] = NULL;
    }
}

/* Everything, without the GIL. 0, or -1 for no memory, -2 for bad parameters. */
static int sign(struct request *r, struct signed_buffer *s) {
    uint64_t *ends = NULL;
    size_t n = 0;
    int rc = cut(r->data, r->len, r->chunks, &ends, &n, &r->cutters[0]);
    if (rc != RDC_OK) return rc == RDC_ENOMEM ? -1 : -2;
    struct level *leaves = &s->levels[0];
    rc = hash_pieces(r->data, ends, n, &leaves->hashes, &leaves->lengths);
    free(ends);
    if (rc != RDC_B3_OK) return rc == RDC_B3_ENOMEM ? -1 : -2;
    leaves->n = n;
    s->nlevels = 1;
    if (n == 0) { /* the root of nothing: the node of level 2 over no children */
        struct level *root = &s->levels[1];
        uint8_t payload = 2;
        uint64_t end = 1;
        root->hashes = malloc(RDC_HASH_BYTES);
        root->lengths = calloc(1, sizeof(uint64_t));
        root->n = 1;
        s->nlevels = 2;
        if (!root->hashes || !root->lengths) return -1;
        if (rdc_b3_hash_chunks_keyed(&payload, &end, 1, 0, root->hashes, -1, r->key,
                                     DERIVE_KEY_MATERIAL) != RDC_B3_OK)
            return -1;
    } else {
        do {
            if (s->nlevels == MAX_LEVELS) return -2;
            rc = next_level(&s->levels[s->nlevels - 1], (uint8_t)(s->nlevels + 1), r->group,
                            r->key, &s->levels[s->nlevels]);
            if (rc) return rc;
            s->nlevels++;
        } while (s->levels[s->nlevels - 1].n != 1);
    }
    s->has_sketch = 0;
    if (!r->want_sketch) return 0;
    if (n < r->sketch_min_leaves && r->len <= r->content_limit) { /* over the sub-chunks */
        uint64_t *sub_ends = NULL;
        size_t nsub = 0;
        uint8_t *sub_hashes = NULL;
        rc = cut(r->data, r->len, r->subs, &sub_ends, &nsub, &r->cutters[1]);
        if (rc != RDC_OK) return rc == RDC_ENOMEM ? -1 : -2;
        rc = hash_pieces(r->data, sub_ends, nsub, &sub_hashes, NULL);
        free(sub_ends);
        if (rc != RDC_B3_OK) return -1;
        s->has_sketch = rdc_sketch(sub_hashes, nsub, s->sketch);
        free(sub_hashes);
    } else {
        s->has_sketch = rdc_sketch(leaves->hashes, n, s->sketch);
    }
    return 0;
}

/* (levels, sketch) as Python objects: each level (hashes, lengths), the leaves first. */
static PyObject *signed_result(const struct signed_buffer *s) {
    PyObject *levels = PyList_New((Py_ssize_t)s->nlevels);
    if (!levels) return NULL;
    for (size_t i = 0; i < s->nlevels; i++) {
        const struct level *l = &s->levels[i];
        PyObject *hashes = PyBytes_FromStringAndSize((const char *)l->hashes,
                                                     (Py_ssize_t)(l->n * RDC_HASH_BYTES));
        PyObject *lengths = PyObject_CallFunction(array_type, "sy#", "Q",
                                                  (const char *)l->lengths,
                                                  (Py_ssize_t)(l->n * sizeof(uint64_t)));
        PyObject *pair = hashes && lengths ? PyTuple_Pack(2, hashes, lengths) : NULL;
        Py_XDECREF(hashes);
        Py_XDECREF(lengths);
        if (!pair) {
            Py_DECREF(levels);
            return NULL;
        }
        PyList_SET_ITEM(levels, (Py_ssize_t)i, pair);
    }
    PyObject *sketch = s->has_sketch
        ? PyBytes_FromStringAndSize((const char *)s->sketch, RDC_TRAITS) : Py_NewRef(Py_None);
    PyObject *result = sketch ? PyTuple_Pack(2, levels, sketch) : NULL;
    Py_XDECREF(sketch);
    Py_DECREF(levels);
    return result;
}

/* The index row of a file read and signed (rdc.local.index.db.Row): (path, size, mtime_ns,
 * inode, mode, root, sketch, packed tree, racy), the tree packed as
 * rdc.content.tree.pack_tree does with `head`, without the objects of each level. */
static PyObject *row_result(PyObject *path, const struct seen *before, const struct seen *after,
                            long long racy_from, const struct signed_buffer *s,
                            const Py_buffer *head) {
    const uint8_t *hashes[MAX_LEVELS];
    const uint64_t *lengths[MAX_LEVELS];
    size_t ns[MAX_LEVELS];
    for (size_t i = 0; i < s->nlevels; i++) {
        hashes[i] = s->levels[i].hashes;
        lengths[i] = s->levels[i].lengths;
        ns[i] = s->levels[i].n;
    }
    uint8_t *buf = malloc(rdc_packed_max((size_t)head->len, s->nlevels, ns));
    if (!buf) return PyErr_NoMemory();
    size_t size = rdc_pack_levels(head->buf, (size_t)head->len, s->nlevels, hashes, lengths,
                                  ns, buf);
    PyObject *blob = PyBytes_FromStringAndSize((const char *)buf, (Py_ssize_t)size);
    free(buf);
    const struct level *top = &s->levels[s->nlevels - 1];
    PyObject *root = PyBytes_FromStringAndSize((const char *)top->hashes, RDC_HASH_BYTES);
    PyObject *sketch = s->has_sketch
        ? PyBytes_FromStringAndSize((const char *)s->sketch, RDC_TRAITS) : Py_NewRef(Py_None);
    /* Racy (read again by the next refresh): written too recently for its stamp to be
     * trusted, or its stamp moved while it was read. */
    int racy = before->mtime_ns >= racy_from || before->size != after->size
        || before->mtime_ns != after->mtime_ns || before->ino != after->ino;
    PyObject *result = blob && root && sketch
        ? Py_BuildValue("(OLLKLOOOi)", path, before->size, before->mtime_ns, before->ino,
                        before->mode, root, sketch, blob, racy)
        : NULL;
    Py_XDECREF(blob);
    Py_XDECREF(root);
    Py_XDECREF(sketch);
    return result;
}

/* The request of a call's parsed signing parameters (data not set): 0, or -1 with a
 * ValueError set for parameters no signature can be made with. */
static int request_of(struct request *r, const unsigned int chunks[3],
                      const unsigned int subs[3], const unsigned int group[2],
                      Py_ssize_t min_leaves, const char *context, Py_ssize_t context_len,
                      int want_sketch) {
    if (min_leaves < 0 || !(1 <= group[0] && group[0] < group[1] && group[1] <= RDC_MAX_GROUP)) {
        PyErr_SetString(PyExc_ValueError, "bad group or sketch parameters");
        return -1;
    }
    *r = (struct request){.chunks = {chunks[0], chunks[1], chunks[2]},
                          .subs = {subs[0], subs[1], subs[2]}, .group = {group[0], group[1]},
                          .sketch_min_leaves = (size_t)min_leaves,
                          .content_limit = (size_t)min_leaves * chunks[2],
                          .want_sketch = want_sketch};
    if (rdc_b3_derive_context_key((const uint8_t *)context, (size_t)context_len, r->key)
        != RDC_B3_OK) {
        PyErr_SetString(PyExc_ValueError, "bad node context");
        return -1;
    }
    return 0;
}

static PyObject *py_sign(PyObject *module, PyObject *args, PyObject *kwds) {
    (void)module;
    static char *kwlist[] = {"data", "chunks", "subs", "groups", "sketch_min_leaves",
                             "context", "sketch", NULL};
    struct request r = {0};
    Py_buffer view;
    const char *context;
    Py_ssize_t context_len;
    unsigned int c[3], sub[3], g[2];
    Py_ssize_t min_leaves;
    int want_sketch = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "y*(III)(III)(II)ns#|p", kwlist, &view, &c[0],
                                     &c[1], &c[2], &sub[0], &sub[1], &sub[2], &g[0], &g[1],
                                     &min_leaves, &context, &context_len, &want_sketch))
        return NULL;
    PyObject *result = NULL;
    struct signed_buffer s = {0};
    if (request_of(&r, c, sub, g, min_leaves, context, context_len, want_sketch)) goto done;
    r.data = view.buf;
    r.len = (size_t)view.len;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = sign(&r, &s);
    Py_END_ALLOW_THREADS
    if (rc == -1) {
        PyErr_NoMemory();
        goto done;
    }
    if (rc) {
        PyErr_SetString(PyExc_ValueError, "bad chunk parameters");
        goto done;
    }
    result = signed_result(&s);
done:
    release(&s);
    request_done(&r);
    PyBuffer_Release(&view);
    return result;
}

/* ---- Many small files read and signed in one call (sign_files) ---- */

struct file_job {
    int dfd;
    PyObject *path; /* as given (borrowed from the call's tuple) */
    const char *leaf; /* its last component: the name in dfd */
    int ok; /* 1: signed; 0: left to the caller's one-file path (it gives the precise error) */
    struct seen before, after;
    struct signed_buffer s;
    uint8_t *data; /* with `keep`: the bytes read (len of them), the job's own */
    size_t len;
};

/* One file read and signed: the steps of SafeRoot.read_whole (lstat, open without
 * following a link and without blocking on a FIFO swapped in, fstat before and after).
 * Read into buf (limit + 1 bytes), or with `keep` into a buffer of the job's own, of the
 * size fstat gave (a file that grew meanwhile is left). Anything but a regular file of at
 * most `limit` bytes read without error is left to the caller (ok = 0). Returns -1 only
 * for no memory. */
static int sign_one(struct file_job *job, uint8_t *buf, size_t limit, struct request *r,
                    int keep) {
    struct stat st;
    job->ok = 0;
    if (fstatat(job->dfd, job->leaf, &st, AT_SYMLINK_NOFOLLOW) || !S_ISREG(st.st_mode)) return 0;
    int fd = openat(job->dfd, job->leaf, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return 0;
    size_t total = 0, cap = limit;
    int good = !fstat(fd, &st) && S_ISREG(st.st_mode) && seen_of(&st, &job->before)
        && (size_t)st.st_size <= limit;
    if (good && keep) {
        cap = (size_t)st.st_size;
        if (!(buf = job->data = malloc(cap + 1))) {
            close(fd);
            return -1;
        }
    }
    while (good && total <= cap) {
        ssize_t got = read(fd, buf + total, cap + 1 - total);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
            good = got == 0;
            break;
        }
        total += (size_t)got;
        /* The size fstat gave, read: no read for the end (a change meanwhile shows in the
         * stat after, and the row is racy: `row_result`). */
        if (total == (size_t)job->before.size) break;
    }
    good = good && total <= cap && !fstat(fd, &st) && S_ISREG(st.st_mode)
        && seen_of(&st, &job->after);
    close(fd);
    if (!good) {
        free(job->data);
        job->data = NULL;
        return 0;
    }
    job->len = total;
    r->data = buf;
    r->len = total;
    int rc = sign(r, &job->s);
    if (rc == -1) return -1;
    job->ok = rc == 0;
    return 0;
}

static PyObject *py_sign_files(PyObject *module, PyObject *args, PyObject *kwds) {
    (void)module;
    static char *kwlist[] = {"files", "limit", "head", "chunks", "subs", "groups",
                             "sketch_min_leaves", "context", "sketch", "keep", "racy_from",
                             "beneath", NULL};
    PyObject *files;
    Py_ssize_t limit, min_leaves;
    const char *context;
    Py_ssize_t context_len;
    unsigned int c[3], sub[3], g[2];
    int want_sketch = 1, keep = 0, beneath = 0;
    long long racy_from = LLONG_MAX;
    Py_buffer head;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "Ony*(III)(III)(II)ns#|ppLp", kwlist, &files,
                                     &limit, &head, &c[0], &c[1], &c[2], &sub[0], &sub[1],
                                     &sub[2], &g[0], &g[1], &min_leaves, &context,
                                     &context_len, &want_sketch, &keep, &racy_from, &beneath))
        return NULL;
    struct request r = {0};
    if (limit < 0) {
        PyErr_SetString(PyExc_ValueError, "bad limit");
        PyBuffer_Release(&head);
        return NULL;
    }
    if (request_of(&r, c, sub, g, min_leaves, context, context_len, want_sketch)) {
        PyBuffer_Release(&head);
        return NULL;
    }
    /* A tuple of tuples: nothing another thread does to the caller's list while the GIL
     * is out can free a name borrowed below. */
    PyObject *seq = PySequence_Tuple(files);
    if (!seq) {
        PyBuffer_Release(&head);
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(seq);
    struct file_job *jobs = calloc((size_t)(n ? n : 1), sizeof *jobs);
    uint8_t *buf = keep ? NULL : malloc((size_t)limit + 1);
    PyObject *result = NULL;
    if (!jobs || (!keep && !buf)) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyTuple_GET_ITEM(seq, i);
        if (!PyTuple_Check(item) || !PyArg_ParseTuple(item, "iS", &jobs[i].dfd, &jobs[i].path)) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "each file must be (dir_fd, path)");
            goto done;
        }
        const char *path = PyBytes_AS_STRING(jobs[i].path);
        Py_ssize_t len = PyBytes_GET_SIZE(jobs[i].path);
        const char *leaf = path + len;
        while (leaf > path && leaf[-1] != '/') leaf--;
        jobs[i].leaf = leaf;
        if (!one_component(jobs[i].leaf, len - (jobs[i].leaf - path))) {
            PyErr_SetString(PyExc_ValueError, "a path must end in a file's name");
            goto done;
        }
    }
    int rc = 0;
    Py_BEGIN_ALLOW_THREADS
    /* With `beneath`, each file's directory is opened here, below the descriptor given
     * (once per run of files in it), and a file whose directory cannot be reached so is
     * left to the caller. */
    int held = -1;
    const char *held_dir = NULL;
    size_t held_len = 0;
    for (Py_ssize_t i = 0; i < n && rc == 0; i++) {
        if (beneath && jobs[i].leaf != PyBytes_AS_STRING(jobs[i].path)) {
            const char *path = PyBytes_AS_STRING(jobs[i].path);
            size_t len = (size_t)(jobs[i].leaf - path) - 1; /* (without its last '/') */
            if (!(held_dir && held_len == len && memcmp(held_dir, path, len) == 0)) {
                if (held >= 0) close(held);
                held = rdc_open_dir_beneath(jobs[i].dfd, path, len);
                held_dir = path;
                held_len = len;
            }
            if (held < 0) continue; /* (ok stays 0) */
            jobs[i].dfd = held;
        }
        rc = sign_one(&jobs[i], buf, (size_t)limit, &r, keep);
    }
    if (held >= 0) close(held);
    Py_END_ALLOW_THREADS
    if (rc == -1) {
        PyErr_NoMemory();
        goto done;
    }
    result = PyList_New(n);
    for (Py_ssize_t i = 0; result && i < n; i++) {
        PyObject *one = Py_NewRef(Py_None);
        if (jobs[i].ok) {
            Py_DECREF(one);
            if (keep) {
                PyObject *before = seen_tuple(&jobs[i].before);
                PyObject *after = seen_tuple(&jobs[i].after);
                PyObject *sig = signed_result(&jobs[i].s);
                PyObject *data = PyBytes_FromStringAndSize((const char *)jobs[i].data,
                                                           (Py_ssize_t)jobs[i].len);
                one = before && after && sig && data ? PyTuple_Pack(4, before, sig, after, data)
                                                     : NULL;
                Py_XDECREF(before);
                Py_XDECREF(after);
                Py_XDECREF(sig);
                Py_XDECREF(data);
            } else {
                one = row_result(jobs[i].path, &jobs[i].before, &jobs[i].after, racy_from,
                                 &jobs[i].s, &head);
            }
        }
        if (!one) Py_CLEAR(result);
        else PyList_SET_ITEM(result, i, one);
    }
done:
    for (Py_ssize_t i = 0; jobs && i < n; i++) {
        release(&jobs[i].s);
        free(jobs[i].data);
    }
    free(jobs);
    free(buf);
    request_done(&r);
    Py_DECREF(seq);
    PyBuffer_Release(&head);
    return result;
}

static PyObject *py_use_openat2(PyObject *module, PyObject *arg) {
    (void)module;
    int on = PyObject_IsTrue(arg);
    if (on < 0) return NULL;
    rdc_openat2_usable = on;
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"use_openat2", py_use_openat2, METH_O,
     "use_openat2(on): whether sign_files(beneath=True) may try openat2 (tests turn it off "
     "to check the walk one component at a time)."},
    {"sign", (PyCFunction)(void (*)(void))py_sign, METH_VARARGS | METH_KEYWORDS,
     "sign(data, chunks, subs, groups, sketch_min_leaves, context, sketch=True) -> "
     "(levels, sketch): each level (hashes, lengths), the leaves first, the root last."},
    {"sign_files", (PyCFunction)(void (*)(void))py_sign_files, METH_VARARGS | METH_KEYWORDS,
     "sign_files(files, limit, head, chunks, subs, groups, sketch_min_leaves, context, "
     "sketch=True, keep=False) -> [(before, (root, packed tree, sketch), after) or None]: "
     "each (dir_fd, name) of `files` read and signed, its tree packed after `head`; before "
     "and after are (mode, size, mtime_ns, inode); None where the file is not a regular "
     "file of at most `limit` bytes read cleanly. With keep: [(before, (levels, sketch), "
     "after, data) or None], the levels as sign gives them and the bytes read. With "
     "beneath: each (root_fd, path), its directory opened below root_fd here (no link "
     "followed), None for a file whose directory cannot be."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef sign_module = {
    PyModuleDef_HEAD_INIT, "_sign",
    "A small buffer's signature in one call, and many small files' in another.", -1,
    module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__sign(void) {
    rdc_init_tables();
    PyObject *array_module = PyImport_ImportModule("array");
    if (!array_module) return NULL;
    array_type = PyObject_GetAttrString(array_module, "array");
    Py_DECREF(array_module);
    if (!array_type) return NULL;
    return PyModule_Create(&sign_module);
}
