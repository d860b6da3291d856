"""Added round-trip time for bench/latency.py: every chunk read on one side is delivered
on the other ``rtt/2`` seconds after it was read, in order, with no limit on throughput
(a link's latency, not its bandwidth). Over pipes for rsync's remote shell (delaysh.py,
which imports this file alone: standard library only); over TCP for rdc
(`syncbench.proxy.DelayProxy`)."""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable

CHUNK = 1 << 16


def relay(read: Callable[[], bytes], write: Callable[[bytes], object],
          end: Callable[[], object], delay: float) -> threading.Thread:
    """Start moving what ``read`` returns to ``write``, each chunk ``delay`` seconds after
    it was read; at end of input (b"" or an error), ``end`` once everything read was
    written (a half-close). A reader thread stamps chunks into a queue, a writer thread
    sleeps until each one is due: many chunks are in flight at once. Returns the writer
    thread (joined: the direction is done)."""
    chunks: queue.SimpleQueue[tuple[float, bytes]] = queue.SimpleQueue()

    def reader() -> None:
        try:
            while data := read():
                chunks.put((time.monotonic() + delay, data))
        except OSError:
            pass
        finally:
            chunks.put((time.monotonic() + delay, b""))

    def writer() -> None:
        broken = False
        while True:
            due, data = chunks.get()
            if not data:
                break
            if broken:
                continue  # the other side is gone: drain until the reader stops
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            try:
                write(data)
            except OSError:
                broken = True
        with contextlib.suppress(OSError):
            end()

    threading.Thread(target=reader, daemon=True).start()
    out = threading.Thread(target=writer, daemon=True)
    out.start()
    return out
