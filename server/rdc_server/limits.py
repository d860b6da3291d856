"""What one daemon lets its peers hold: connections (in all, per address, and before the
token checked out), and the memory a finished connection used.

Each connection's own memory is bounded by the session layer (frames of at most 4 MiB,
16 KiB before authentication; unread input and queued output of a few MiB each); these
caps bound how many there are, so that the total is bounded too.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import resource
from collections import Counter

from rdc.allocator import trim

log = logging.getLogger("rdc.serve")

MAX_CONNECTIONS = 256
MAX_CONNECTIONS_PER_ADDRESS = 64
# Connections still in their handshake (TLS and hello, at most 10 s each): all of them,
# and from one address.
MAX_UNAUTHENTICATED = 64
MAX_UNAUTHENTICATED_PER_ADDRESS = 16
# Descriptors one served connection may hold: its socket and opened directory, three per
# file in flight (rdc.transfer.serving.FILES_AT_ONCE = 64) and some; plus what the whole
# daemon holds: batch writes (4 at once, two per file of 256) and indexes.
DESCRIPTORS_PER_CONNECTION = 200
DESCRIPTORS_SHARED = 4 * 2 * 256 + 256


class Limits:
    """Counts of open connections; `admit` says why a new one is refused, if it is."""

    def __init__(
        self, total: int = MAX_CONNECTIONS, per_address: int = MAX_CONNECTIONS_PER_ADDRESS
    ) -> None:
        self.total = total
        self.per_address = per_address
        self.open: Counter[str] = Counter()
        self.unauthenticated: Counter[str] = Counter()

    def admit(self, address: str) -> str | None:
        """Count a new connection from ``address`` in, or say why not."""
        if self.open.total() >= self.total:
            return f"too many connections (at most {self.total}); try again later"
        if self.open[address] >= self.per_address:
            return f"too many connections from {address} (at most {self.per_address})"
        if self.unauthenticated.total() >= MAX_UNAUTHENTICATED or (
            self.unauthenticated[address] >= MAX_UNAUTHENTICATED_PER_ADDRESS
        ):
            return "too many connections still logging in; try again later"
        self.open[address] += 1
        self.unauthenticated[address] += 1
        return None

    def authenticated(self, address: str) -> None:
        """A connection from ``address`` finished its handshake."""
        self._drop(self.unauthenticated, address)

    def leave(self, address: str, authenticated: bool) -> None:
        """A connection from ``address`` ended."""
        self._drop(self.open, address)
        if not authenticated:
            self._drop(self.unauthenticated, address)

    @staticmethod
    def _drop(counter: Counter[str], address: str) -> None:
        counter[address] -= 1
        if counter[address] <= 0:
            del counter[address]


# ---------------------------------------------------------------- memory


def give_back_memory(collect: bool) -> None:
    """Return the free memory at the top of the heap, and free pages inside it, to the
    system (a connection just ended). ``collect``: free unreachable cycles first (the
    last connection ended): an idle daemon allocates too little to trigger a full
    collection, and a session's tree (100,000 entries: 150 MB) stayed in memory held by a
    cycle through a finished coroutine's frame."""
    if collect:
        gc.collect()
    trim()


def raise_descriptor_limit(max_connections: int) -> int:
    """Raise the soft limit on open descriptors to the hard one (many systems start
    daemons at 1,024, which four batch writes alone would use up) and warn if it is still
    below what ``max_connections`` connections may hold. Returns the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = 1 << 20
    if soft != resource.RLIM_INFINITY and soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    needed = max_connections * DESCRIPTORS_PER_CONNECTION + DESCRIPTORS_SHARED
    if soft != resource.RLIM_INFINITY and soft < needed:
        log.warning("open descriptors are limited to %d; %d connections may need up to %d: "
                    "raise the limit (ulimit -n, LimitNOFILE=) or lower --max-connections",
                    soft, max_connections, needed)
    return soft
