/* A directory below a held one, opened without following any symlink and without leaving
 * it: Linux's openat2 (RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS) in one call, else one openat
 * with O_NOFOLLOW per component. What rdc.local.beneath and SafeRoot do in Python, for
 * native loops that open many directories with the GIL released (a cold scan opened each
 * of its directories from Python, a fifth of its refreshing thread). */
#ifndef RDC_BENEATH_H
#define RDC_BENEATH_H

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define RDC_DIR_FLAGS (O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)

#ifndef SYS_openat2
#if defined(__x86_64__) || defined(__aarch64__) || defined(__riscv) || defined(__i386__) \
    || defined(__powerpc64__) || defined(__s390x__) || defined(__arm__)
#define SYS_openat2 437
#endif
#endif

struct rdc_open_how {
    uint64_t flags, mode, resolve;
};

/* 1 while openat2 may be tried (cleared for good when the kernel lacks or forbids it;
 * tests clear it to check the walk). */
static int rdc_openat2_usable = 1;

/* Directory `rel` (`len` bytes, not NUL-terminated, '/'-separated, not empty) below `root`:
 * a new descriptor, or -1 (errno set) if it cannot be reached that way. */
static inline int rdc_open_dir_beneath(int root, const char *rel, size_t len) {
    char path[4096];
    if (len == 0 || len >= sizeof path) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(path, rel, len);
    path[len] = 0;
#ifdef SYS_openat2
    if (rdc_openat2_usable) {
        struct rdc_open_how how = {RDC_DIR_FLAGS, 0, 0x08 | 0x04 | 0x02};
        long fd = syscall(SYS_openat2, root, path, &how, sizeof how);
        if (fd >= 0) return (int)fd;
        if (errno != ENOSYS && errno != EPERM && errno != EINVAL && errno != E2BIG) return -1;
        rdc_openat2_usable = 0;
    }
#endif
    int fd = dup(root);
    char *part = path;
    while (fd >= 0 && part) {
        char *slash = strchr(part, '/');
        if (slash) *slash = 0;
        if (!*part || !strcmp(part, ".") || !strcmp(part, "..")) {
            close(fd);
            errno = EINVAL;
            return -1;
        }
        int next = openat(fd, part, RDC_DIR_FLAGS);
        int err = errno;
        close(fd);
        errno = err;
        fd = next;
        part = slash ? slash + 1 : NULL;
    }
    return fd;
}

#endif
