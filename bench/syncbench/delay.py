"""Added round-trip time for bench/latency.py: every chunk read on one side is delivered
on the other ``rtt/2`` seconds after it was read, in order, with no limit on throughput
(a link's latency, not its bandwidth). Over TCP for rdc (``DelayProxy``); over pipes for
rsync's remote shell (``relay``, used by delaysh.py)."""

from __future__ import annotations

import contextlib
import queue
import socket
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


class DelayProxy:
    """A TCP proxy on 127.0.0.1 (port 0) in front of ``upstream_port`` that adds ``rtt``
    seconds of round-trip time (``rtt/2`` each way), half-closes passed on."""

    def __init__(self, upstream_port: int, rtt: float) -> None:
        self.upstream, self.rtt = upstream_port, rtt
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.upstream))
            except OSError:
                client.close()
                continue
            threading.Thread(target=self._connection, args=(client, server),
                             daemon=True).start()

    def _connection(self, client: socket.socket, server: socket.socket) -> None:
        for s in (client, server):  # no Nagle wait on top of the delay
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        directions = [
            relay(lambda a=a: a.recv(CHUNK), b.sendall,
                  lambda b=b: b.shutdown(socket.SHUT_WR), self.rtt / 2)
            for a, b in ((client, server), (server, client))
        ]
        for d in directions:
            d.join()
        client.close()
        server.close()

    def close(self) -> None:
        self.listener.close()
