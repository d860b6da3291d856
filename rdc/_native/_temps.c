/* A batch's temporary files made, written and given their mode and time in one call: the
 * steps of SafeRoot.create_temp, TempFile.write and TempFile.prepare for each file in
 * order, without the GIL and without Python between the system calls.
 *
 * Why: a first copy writes each file of a batch as about a dozen system calls from Python,
 * each letting the GIL go and taking it back while the other threads of the server (the
 * event loop, the next batch) want it too. On 10,000 small files the server made 750,000
 * futex calls and spent more time in the kernel handing the GIL over than writing files.
 *
 * Each file is independent: one that fails leaves no temporary behind and gets its errno,
 * and the others go on. What stays in Python: the directory descriptors (beneath the
 * root), the name check, and everything after (the sync, the installs). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "seen.h"

#define NAME_TRIES 3 /* as SafeRoot.create_temp: a name taken meanwhile is drawn again */

struct temp_job {
    int dfd;
    const char *leaf;
    Py_ssize_t leaf_len;
    Py_buffer data;
    mode_t mode;
    long long mtime_ns;
    /* out */
    int err; /* 0: made, else the errno of the step that failed */
    int fd, own_dfd;
    char name[256];
    struct stat st;
};

/* `prefix`, 16 random hex digits, '-', then the leaf cut to fit `max_name` bytes in all
 * (rdc.local.paths.temporary_name). */
static int draw_name(struct temp_job *job, const char *prefix, size_t prefix_len,
                     size_t max_name) {
    unsigned char random_bytes[8];
    static const char hex[] = "0123456789abcdef";
    if (getrandom(random_bytes, sizeof random_bytes, 0) != (ssize_t)sizeof random_bytes)
        return -1;
    size_t head = prefix_len + 17, room = max_name > head ? max_name - head : 0;
    size_t leaf = (size_t)job->leaf_len < room ? (size_t)job->leaf_len : room;
    memcpy(job->name, prefix, prefix_len);
    for (int i = 0; i < 8; i++) {
        job->name[prefix_len + 2 * i] = hex[random_bytes[i] >> 4];
        job->name[prefix_len + 2 * i + 1] = hex[random_bytes[i] & 15];
    }
    job->name[prefix_len + 16] = '-';
    memcpy(job->name + head, job->leaf, leaf);
    job->name[head + leaf] = '\0';
    return 0;
}

static int write_all(int fd, const char *data, size_t len) {
    while (len) {
        ssize_t done = write(fd, data, len);
        if (done < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        data += done;
        len -= (size_t)done;
    }
    return 0;
}

static void make_one(struct temp_job *job, const char *prefix, size_t prefix_len,
                     size_t max_name) {
    job->fd = job->own_dfd = -1;
    for (int tries = 0; tries < NAME_TRIES && job->fd < 0; tries++) {
        if (draw_name(job, prefix, prefix_len, max_name)) {
            job->err = errno;
            return;
        }
        job->fd = openat(job->dfd, job->name,
                         O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (job->fd < 0 && errno != EEXIST) {
            job->err = errno;
            return;
        }
    }
    if (job->fd < 0) {
        job->err = EEXIST;
        return;
    }
    struct timespec times[2] = {{job->mtime_ns / 1000000000LL, job->mtime_ns % 1000000000LL}};
    if (times[0].tv_nsec < 0) { /* (floor division, as os.utime takes a time before 1970) */
        times[0].tv_sec -= 1;
        times[0].tv_nsec += 1000000000LL;
    }
    times[1] = times[0];
    if (flock(job->fd, LOCK_EX | LOCK_NB) || write_all(job->fd, job->data.buf,
                                                         (size_t)job->data.len)
        || fchmod(job->fd, job->mode) || futimens(job->fd, times) || fstat(job->fd, &job->st)
        || (job->own_dfd = fcntl(job->dfd, F_DUPFD_CLOEXEC, 0)) < 0) {
        job->err = errno;
        unlinkat(job->dfd, job->name, 0);
        close(job->fd);
        job->fd = -1;
    }
}

static PyObject *stat_tuple(const struct stat *st) {
    return Py_BuildValue("(IKKKIILLLL)", (unsigned int)st->st_mode,
                         (unsigned long long)st->st_ino, (unsigned long long)st->st_dev,
                         (unsigned long long)st->st_nlink, (unsigned int)st->st_uid,
                         (unsigned int)st->st_gid, (long long)st->st_size,
                         (long long)st->st_atim.tv_sec, (long long)st->st_mtim.tv_sec,
                         (long long)st->st_ctim.tv_sec);
}

/* The jobs for the items of `arg`, `size` bytes each and zeroed, and in *seq the items as a
 * tuple (names borrowed from them outlive the call); NULL, with an exception, if not. */
static void *job_array(PyObject *arg, size_t size, PyObject **seq, Py_ssize_t *n) {
    *seq = PySequence_Tuple(arg);
    if (!*seq) return NULL;
    *n = PyTuple_GET_SIZE(*seq);
    void *jobs = calloc((size_t)(*n ? *n : 1), size);
    if (!jobs) {
        PyErr_NoMemory();
        Py_CLEAR(*seq);
    }
    return jobs;
}

/* The (mode, size, mtime_ns, inode) of an entry made or installed; True where there was no
 * memory for it (it is there all the same: the caller must not take it for a failure). */
static PyObject *made_stat(const struct stat *st) {
    struct seen after = seen_clamped(st);
    PyObject *one = seen_tuple(&after);
    if (!one) {
        PyErr_Clear();
        one = Py_NewRef(Py_True);
    }
    return one;
}

static PyObject *py_make_temps(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *files;
    const char *prefix;
    Py_ssize_t prefix_len, max_name;
    if (!PyArg_ParseTuple(args, "Oy#n", &files, &prefix, &prefix_len, &max_name)) return NULL;
    if (max_name < prefix_len + 18 || max_name > 255) {
        PyErr_SetString(PyExc_ValueError, "max_name leaves no room for a temporary name");
        return NULL;
    }
    PyObject *seq, *result = NULL;
    Py_ssize_t n, held = 0;
    struct temp_job *jobs = job_array(files, sizeof *jobs, &seq, &n);
    if (!jobs) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) /* (none open yet: an early error closes none) */
        jobs[i].fd = jobs[i].own_dfd = -1;
    for (; held < n; held++) {
        struct temp_job *job = &jobs[held];
        PyObject *name;
        unsigned int mode;
        if (!PyTuple_Check(PyTuple_GET_ITEM(seq, held))
            || !PyArg_ParseTuple(PyTuple_GET_ITEM(seq, held), "iSy*IL", &job->dfd, &name,
                                 &job->data, &mode, &job->mtime_ns)) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError,
                                "each file must be (dir_fd, name, data, mode, mtime_ns)");
            goto done;
        }
        job->mode = (mode_t)mode;
        job->leaf = PyBytes_AS_STRING(name);
        job->leaf_len = PyBytes_GET_SIZE(name);
        if (!one_component(job->leaf, job->leaf_len)) {
            held++;
            PyErr_SetString(PyExc_ValueError, "a name must be one path component");
            goto done;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) make_one(&jobs[i], prefix, (size_t)prefix_len,
                                                (size_t)max_name);
    Py_END_ALLOW_THREADS
    result = PyList_New(n);
    for (Py_ssize_t i = 0; result && i < n; i++) {
        struct temp_job *job = &jobs[i];
        PyObject *one;
        if (job->err) {
            one = PyLong_FromLong(job->err);
        } else {
            PyObject *st = stat_tuple(&job->st);
            one = st ? Py_BuildValue("(iiyN)", job->fd, job->own_dfd, job->name, st) : NULL;
        }
        if (!one) Py_CLEAR(result);
        else PyList_SET_ITEM(result, i, one);
    }
    for (Py_ssize_t i = 0; result && i < n; i++) jobs[i].fd = -1; /* (the caller's now) */
done:
    for (Py_ssize_t i = 0; jobs && i < n; i++) {
        if (!result && jobs[i].fd >= 0) { /* (nothing reached the caller: undo) */
            unlinkat(jobs[i].dfd, jobs[i].name, 0);
            close(jobs[i].fd);
            if (jobs[i].own_dfd >= 0) close(jobs[i].own_dfd);
        }
        if (i < held) PyBuffer_Release(&jobs[i].data);
    }
    free(jobs);
    Py_DECREF(seq);
    return result;
}

/* ---- Temporaries put where nothing is yet (install_new) ---- */

struct install_job {
    int dfd, fd;
    const char *tmp, *leaf;
    unsigned long long ino, dev;
    int done;
    struct stat st; /* out: the installed file's fstat */
};

/* The steps of TempFile.install for Expect.absent: the temporary is still ours, link(2)
 * puts it in place only if nothing is there, then the temporary name goes. Anything else
 * (it was swapped, something is there, no hard links here) is left to Python (done = 0),
 * which says why or renames instead; nothing has changed then. */
static void install_one(struct install_job *job) {
    struct stat now;
    job->done = 0;
    if (fstatat(job->dfd, job->tmp, &now, AT_SYMLINK_NOFOLLOW)
        || (unsigned long long)now.st_ino != job->ino
        || (unsigned long long)now.st_dev != job->dev)
        return;
    if (linkat(job->dfd, job->tmp, job->dfd, job->leaf, 0)) return;
    unlinkat(job->dfd, job->tmp, 0); /* (a name left over is clean_temporaries' to remove) */
    if (fstat(job->fd, &job->st)) memset(&job->st, 0, sizeof job->st);
    close(job->fd);
    close(job->dfd);
    job->done = 1;
}

static PyObject *py_install_new(PyObject *module, PyObject *arg) {
    (void)module;
    PyObject *seq, *result = NULL;
    Py_ssize_t n;
    struct install_job *jobs = job_array(arg, sizeof *jobs, &seq, &n);
    if (!jobs) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        struct install_job *job = &jobs[i];
        PyObject *tmp, *leaf;
        if (!PyTuple_Check(PyTuple_GET_ITEM(seq, i))
            || !PyArg_ParseTuple(PyTuple_GET_ITEM(seq, i), "iSSiKK", &job->dfd, &tmp, &leaf,
                                 &job->fd, &job->ino, &job->dev)) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError,
                                "each must be (dir_fd, temporary, name, fd, inode, device)");
            goto done;
        }
        job->tmp = PyBytes_AS_STRING(tmp);
        job->leaf = PyBytes_AS_STRING(leaf);
        if (!one_component(job->tmp, PyBytes_GET_SIZE(tmp))
            || !one_component(job->leaf, PyBytes_GET_SIZE(leaf))) {
            PyErr_SetString(PyExc_ValueError, "a name must be one path component");
            goto done;
        }
    }
    /* Made before anything is installed: once a job is done (its descriptors closed), its
     * result must reach the caller. */
    if (!(result = PyList_New(n))) goto done;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) install_one(&jobs[i]);
    Py_END_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++)
        PyList_SET_ITEM(result, i, jobs[i].done ? made_stat(&jobs[i].st) : Py_NewRef(Py_None));
done:
    free(jobs);
    Py_DECREF(seq);
    return result;
}

/* ---- Directories made (make_dirs) ---- */

struct dir_job {
    int dfd;
    const char *leaf;
    mode_t mode;
    int err; /* out: 0, or the errno of the step that failed (nothing is left then) */
    struct stat st;
};

/* The steps of fs._mkdir_at without its fsync: made owner-only, then given its mode
 * through a descriptor (never wider than asked, even for an instant). A directory made
 * whose mode cannot be set is removed again: the caller's one-by-one path says why. */
static void make_dir(struct dir_job *job) {
    if (mkdirat(job->dfd, job->leaf, 0700)) {
        job->err = errno;
        return;
    }
    int fd = openat(job->dfd, job->leaf, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 || fchmod(fd, job->mode) || fstat(fd, &job->st)) {
        job->err = errno;
        if (fd >= 0) close(fd);
        unlinkat(job->dfd, job->leaf, AT_REMOVEDIR);
        return;
    }
    close(fd);
}

static PyObject *py_make_dirs(PyObject *module, PyObject *arg) {
    (void)module;
    PyObject *seq, *result = NULL;
    Py_ssize_t n;
    struct dir_job *jobs = job_array(arg, sizeof *jobs, &seq, &n);
    if (!jobs) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        struct dir_job *job = &jobs[i];
        PyObject *leaf;
        unsigned int mode;
        if (!PyTuple_Check(PyTuple_GET_ITEM(seq, i))
            || !PyArg_ParseTuple(PyTuple_GET_ITEM(seq, i), "iSI", &job->dfd, &leaf, &mode)) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "each directory must be (dir_fd, name, mode)");
            goto done;
        }
        job->leaf = PyBytes_AS_STRING(leaf);
        job->mode = (mode_t)(mode & 07777);
        if (!one_component(job->leaf, PyBytes_GET_SIZE(leaf))) {
            PyErr_SetString(PyExc_ValueError, "a name must be one path component");
            goto done;
        }
    }
    /* Made before anything is: once a directory is made, its result must reach the caller. */
    if (!(result = PyList_New(n))) goto done;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) make_dir(&jobs[i]);
    Py_END_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) /* (an errno is a small int: never out of memory) */
        PyList_SET_ITEM(result, i, jobs[i].err ? PyLong_FromLong(jobs[i].err)
                                               : made_stat(&jobs[i].st));
done:
    free(jobs);
    Py_DECREF(seq);
    return result;
}

/* Writeback of a range started now, not at the fsync: a large file's pages go to the disk
 * while the rest of it is still being built, and the commit's sync waits for the tail
 * alone (a 256 MiB rebuild waited about 0.2 s there). Only a hint: where the kernel or the
 * file system does not take it, the fsync does all, as before, and reports any error. */
static PyObject *py_start_writeback(PyObject *module, PyObject *args) {
    (void)module;
    int fd;
    long long offset, length;
    if (!PyArg_ParseTuple(args, "iLL", &fd, &offset, &length)) return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
#ifdef SYNC_FILE_RANGE_WRITE
    rc = sync_file_range(fd, (off_t)offset, (off_t)length, SYNC_FILE_RANGE_WRITE);
#else
    rc = -1;
#endif
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(rc == 0);
}

static PyMethodDef module_methods[] = {
    {"start_writeback", py_start_writeback, METH_VARARGS,
     "start_writeback(fd, offset, length) -> bool: start writing that range of the file to "
     "the disk, without waiting (sync_file_range); False where that was not taken (a hint: "
     "the fsync still does all)."},
    {"make_dirs", py_make_dirs, METH_O,
     "make_dirs(dirs) -> [stat or errno]: each (dir_fd, name, mode) made a directory with "
     "exactly that mode (not yet durable: the caller syncs dir_fd), in order; stat is its "
     "(mode, size, mtime_ns, inode) after (True if there was no memory for it). A directory "
     "that failed (errno) left nothing behind."},
    {"install_new", py_install_new, METH_O,
     "install_new(temps) -> [stat or None]: each (dir_fd, temporary, name, fd, inode, device) "
     "linked into place where nothing is, its temporary name removed, fd and dir_fd closed; "
     "stat is its (mode, size, mtime_ns, inode) after (True if there was no memory for "
     "it). None for one left as it was (not the temporary made, something there, no hard "
     "links): the caller's to install."},
    {"make_temps", py_make_temps, METH_VARARGS,
     "make_temps(files, prefix, max_name) -> [(fd, dir_fd, name, stat) or errno]: for each "
     "(dir_fd, name, data, mode, mtime_ns) of `files`, a new temporary (prefix, random, the "
     "name) in that directory, locked, holding data, with that mode and time; its own "
     "descriptor and a duplicate of dir_fd, both the caller's to close; stat is a 10-tuple "
     "for os.stat_result. A file that failed left nothing behind."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef temps_module = {
    PyModuleDef_HEAD_INIT, "_temps", "A batch's temporary files made in one call.", -1,
    module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__temps(void) { return PyModule_Create(&temps_module); }
