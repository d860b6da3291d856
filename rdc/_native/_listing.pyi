"""Stub for the C directory listing (rdc/_native/_listing.c); specification in
listing_ref.py."""

def list_dir(fd: int) -> list[tuple[str, int, int, int, int]]:
    """(name, mode, size, mtime_ns, inode) of each entry; mode is -errno where lstat failed."""
