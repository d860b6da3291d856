/* One directory read with every entry's lstat, the kernel calls made without the GIL: what
 * a walk does per directory. Shared by the plain listing (_listing.c: a tuple per entry)
 * and the listing that makes a walk's entries at once (_entries.c). Callers hold the
 * Python headers and _GNU_SOURCE (fdopendir, fstatat). */
#ifndef RDC_LISTING_READ_H
#define RDC_LISTING_READ_H

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

static inline void listing_free(listing_t *l) {
    free(l->items);
    free(l->arena);
}

/* Appends one entry; -1 when memory ran out. */
static inline int listing_add(listing_t *l, const char *name, size_t len) {
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
static inline int read_listing(int fd, listing_t *l) {
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
static inline PyObject *time_ns(time_t sec, long nsec) {
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


/* (name, st_mode, size, mtime_ns, inode) of one entry, or (name, -errno, 0, 0, 0): the
 * tuple of listing_ref.list_dir. */
static inline PyObject *item_tuple(const listing_t *l, const item_t *it) {
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

#endif
