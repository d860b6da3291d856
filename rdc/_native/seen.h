/* What the native file calls keep of a stat, and how they check a name: shared by _sign
 * (sign_files), _meta (set_meta) and _temps (make_temps, install_new). Include after
 * Python.h. */
#ifndef RDC_SEEN_H
#define RDC_SEEN_H

#include <stdint.h>
#include <string.h>
#include <sys/stat.h>

/* rdc.local.filestat.Seen: mode, size, mtime in nanoseconds, inode. */
struct seen {
    long long mode, size, mtime_ns;
    unsigned long long ino;
};

/* 1 if st's mtime fits signed 64-bit nanoseconds (as rdc records times), filling *out. */
static inline int seen_of(const struct stat *st, struct seen *out) {
    __int128 ns = (__int128)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
    if (ns > INT64_MAX || ns < INT64_MIN) return 0;
    *out = (struct seen){.mode = st->st_mode, .size = st->st_size, .mtime_ns = (long long)ns,
                         .ino = st->st_ino};
    return 1;
}

/* st as a `struct seen`, its time clamped to signed 64-bit nanoseconds as
 * rdc.local.filestat.mtime_ns does (for a file rdc has already changed: refusing it, as
 * seen_of does, would lose what was done). */
static inline struct seen seen_clamped(const struct stat *st) {
    __int128 ns = (__int128)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
    return (struct seen){.mode = st->st_mode, .size = st->st_size,
                         .mtime_ns = ns > INT64_MAX ? INT64_MAX
                             : ns < INT64_MIN ? INT64_MIN : (long long)ns,
                         .ino = st->st_ino};
}

static inline PyObject *seen_tuple(const struct seen *s) {
    return Py_BuildValue("(LLLK)", s->mode, s->size, s->mtime_ns, s->ino);
}

/* Whether name (of len bytes) is one entry of a directory: not empty, no '/' or NUL, not
 * "." or "..". */
static inline int one_component(const char *name, Py_ssize_t len) {
    return len > 0 && strlen(name) == (size_t)len && !strchr(name, '/') && strcmp(name, ".")
        && strcmp(name, "..");
}

#endif
