/* One entry's head in a directory's stamp input, as rdc.local.snapshot._STAMP packs it
 * ("<cHqQQI": kind, mode, mtime, size, inode, name length; its name follows): shared by
 * the stamp walked from the file system (_listing.c) and the stamp of a tree of entries
 * (_entries.c), which must agree byte for byte. */
#ifndef RDC_STAMP_ENTRY_H
#define RDC_STAMP_ENTRY_H

#include <stdint.h>

#define STAMP_HEAD 31

/* The low ``n`` bytes of ``v``, little-endian. */
static inline void put_le(unsigned char *out, uint64_t v, int n) {
    for (int i = 0; i < n; i++) out[i] = (unsigned char)(v >> (8 * i));
}

static inline void stamp_head(unsigned char head[STAMP_HEAD], char kind, unsigned mode,
                              uint64_t mtime, uint64_t size, uint64_t ino, uint32_t len) {
    head[0] = (unsigned char)kind;
    put_le(head + 1, mode, 2);
    put_le(head + 3, mtime, 8);
    put_le(head + 11, size, 8);
    put_le(head + 19, ino, 8);
    put_le(head + 27, len, 4);
}

#endif
