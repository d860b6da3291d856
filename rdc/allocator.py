"""glibc's allocator, tuned for a process that streams large blocks through many threads.

By default glibc's mmap threshold grows to the largest block freed so far; after that,
blocks of that size (frames, data pieces, 1 MiB read buffers) come from the heaps of the
threads that freed them and stay in the process. A first copy of 100,000 files took a
client to 224 MB that way, 202 MB with the threshold held at 256 KiB. Elsewhere than
glibc, nothing is tuned.
"""

from __future__ import annotations

import contextlib
import ctypes

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_libc = None
with contextlib.suppress(OSError, AttributeError, TypeError):
    # The process's own symbols: libc is among them, and ctypes.util.find_library cost
    # every command 12 ms at start-up (it imports subprocess and runs ldconfig).
    _libc = ctypes.CDLL(None)
    _libc.malloc_trim  # noqa: B018 - glibc only: the attribute lookup is the check


def tune_allocator() -> None:
    """Blocks of 256 KiB or more are mapped and unmapped on their own, and free memory
    at the top of a heap beyond 4 MiB goes back to the system."""
    if _libc is not None:
        _libc.mallopt(_M_MMAP_THRESHOLD, 256 << 10)
        _libc.mallopt(_M_TRIM_THRESHOLD, 4 << 20)


def trim() -> None:
    """Return the free memory at the top of the heap, and free pages inside it."""
    if _libc is not None:
        _libc.malloc_trim(0)
