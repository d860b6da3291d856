"""Memory, tuned for a process that streams large blocks through many threads and holds
trees of many small objects: glibc's allocator and Python's cyclic collector.

By default glibc's mmap threshold grows to the largest block freed so far; after that,
blocks of that size (frames, data pieces, 1 MiB read buffers) come from the heaps of the
threads that freed them and stay in the process. A first copy of 100,000 files took a
client to 224 MB that way, 202 MB with the threshold held at 256 KiB. Elsewhere than
glibc, nothing is tuned.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_libc = None
with contextlib.suppress(OSError, AttributeError, TypeError):
    # The process's own symbols: libc is among them, and ctypes.util.find_library cost
    # every command 12 ms at start-up (it imports subprocess and runs ldconfig).
    _libc = ctypes.CDLL(None)
    _libc.malloc_trim  # noqa: B018 - glibc only: the attribute lookup is the check


# Blocks from this size up are mapped and unmapped on their own (a buffer reused in a loop
# is best kept under it: each mapped one is faulted in afresh, page by page).
MMAP_THRESHOLD = 256 << 10


def tune_allocator() -> None:
    """Blocks of MMAP_THRESHOLD or more are mapped and unmapped on their own, and free
    memory at the top of a heap beyond 4 MiB goes back to the system."""
    if _libc is not None:
        _libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        _libc.mallopt(_M_TRIM_THRESHOLD, 4 << 20)


# Allocations between two young collections of the cyclic collector (700 by default). A
# scan holds about two objects a file to its end, none in a cycle, and at the default the
# collector went over them again and again: a cold scan of 100,000 files, 6.8 -> 6.1 s.
YOUNG = 50_000


def tune_collector() -> None:
    """What start-up made (modules, classes) stays out of every collection (`gc.freeze`),
    and the young generation is collected every YOUNG allocations."""
    gc.freeze()
    gc.set_threshold(YOUNG, *gc.get_threshold()[1:])


def trim() -> None:
    """Return the free memory at the top of the heap, and free pages inside it."""
    if _libc is not None:
        _libc.malloc_trim(0)
