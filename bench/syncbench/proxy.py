"""TCP proxies on 127.0.0.1 in front of a local server, for the benches' taps on rdc's
connection: `DelayProxy` (added round-trip time), and `syncbench.tally.FrameTally`."""

from __future__ import annotations

import socket
import threading

from .delay import CHUNK, relay


class LoopbackProxy:
    """Listens on 127.0.0.1 (port 0: ``port`` says which); each connection accepted is
    joined to a new one to ``upstream_port`` and both go to `serve`, on the accepting
    thread (it starts its own). A client whose upstream connection fails is closed.
    `close` stops accepting."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream = upstream_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]

    def start(self) -> None:
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
            self.serve(client, server)

    def serve(self, client: socket.socket, server: socket.socket) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.listener.close()


class DelayProxy(LoopbackProxy):
    """A TCP proxy on 127.0.0.1 (port 0) in front of ``upstream_port`` that adds ``rtt``
    seconds of round-trip time (``rtt/2`` each way), half-closes passed on."""

    def __init__(self, upstream_port: int, rtt: float) -> None:
        super().__init__(upstream_port)
        self.rtt = rtt
        self.start()

    def serve(self, client: socket.socket, server: socket.socket) -> None:
        threading.Thread(target=self._connection, args=(client, server), daemon=True).start()

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
