"""A counting proxy: rdc's bytes on the wire per message type, for the breakdown table."""

from __future__ import annotations

import contextlib
import socket
import threading

import msgpack
import zstandard

from rdc.wire.frames import MAX_WINDOW, PLAIN_SIZE

from .proxy import LoopbackProxy


class FrameTally(LoopbackProxy):
    """A TCP proxy in front of the server that reads rdc frames in both directions and adds
    up the bytes on the wire per message type. A (compressed) frame's bytes are shared out
    to its messages in proportion to their uncompressed size."""

    def __init__(self, upstream_port: int) -> None:
        super().__init__(upstream_port)
        self.bytes: dict[tuple[str, str], float] = {}
        self.counts: dict[tuple[str, str], int] = {}
        self.payload = {"C>S": 0, "S>C": 0}  # file bytes inside data / offer messages
        self.items: dict[str, int] = {}  # what listings and ops carried
        self.lock = threading.Lock()
        self.start()

    def serve(self, client: socket.socket, server: socket.socket) -> None:
        done = threading.Barrier(2, action=lambda c=client, s=server: (c.close(), s.close()))
        for a, b, d in ((client, server, "C>S"), (server, client, "S>C")):
            threading.Thread(target=self._pump, args=(a, b, d, done), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, direction: str,
              done: threading.Barrier) -> None:
        buf = bytearray()
        pending = _Pending()  # this direction's zstd stream, as rdc.wire.frames reads it
        reader = zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW).stream_reader(
            pending, read_across_frames=True)
        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
                buf += data
                while len(buf) >= 4:
                    header = int.from_bytes(buf[:4], "big")
                    length = header & 0x7FFFFFFF
                    if len(buf) < 4 + length:
                        break
                    body = bytes(buf[4 : 4 + length])
                    del buf[: 4 + length]
                    if header >> 31:
                        (size,) = PLAIN_SIZE.unpack_from(body)
                        pending.data += body[PLAIN_SIZE.size :]
                        plain = bytearray()
                        while len(plain) < size and (piece := reader.read(size - len(plain))):
                            plain += piece
                        body = bytes(plain)
                    self._count(direction, body, 4 + length)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)
            with contextlib.suppress(threading.BrokenBarrierError):
                done.wait()

    def _count(self, direction: str, body: bytes, wire: int) -> None:
        unpacker = msgpack.Unpacker(raw=False, max_buffer_size=len(body) + 1)
        unpacker.feed(body)
        items = []
        for _ in range(unpacker.read_array_header()):
            before = unpacker.tell()
            message = unpacker.unpack()
            items.append((message, unpacker.tell() - before))
        total = sum(size for _, size in items) or 1
        with self.lock:
            for message, size in items:
                t = message.get("t", "?")
                if t == "want":
                    t = f"want {message.get('k')}"
                elif t == "offer" and "data" in message:
                    t = "offer+data"
                if t in ("data", "offer+data"):
                    pieces = message.get("d") or [message.get("data") or b""]
                    self.payload[direction] += sum(len(p) for p in pieces)
                elif t == "listing":
                    dirs = message.get("dirs") or []
                    self._add("directories listed", len(dirs))
                    self._add("listing entries", sum(len(d[1] or []) for d in dirs))
                elif t == "ops":
                    for op in message.get("ops") or []:
                        self._add(f"ops {op[0]}", 1)
                key = (direction, t)
                self.bytes[key] = self.bytes.get(key, 0.0) + wire * size / total
                self.counts[key] = self.counts.get(key, 0) + 1

    def _add(self, key: str, n: int) -> None:
        self.items[key] = self.items.get(key, 0) + n

    def groups(self) -> dict[str, float]:
        """Wire bytes by role: listings, metadata, offers, tree signatures, literal data."""
        role = {
            "list": "listings", "listing": "listings",
            "mlist": "metadata", "mlisting": "metadata", "mset": "metadata", "ok": "metadata",
            "offer": "offers", "offer+data": "offers (with data <256 B)", "done": "offers",
            "want expand": "signatures", "want subs": "signatures", "want fine": "signatures",
            "lists": "signatures",
            "want fetch": "literal data", "want whole": "literal data", "data": "literal data",
            "ops": "ops", "oks": "ops",
            # small files in batches
            "offers": "offers", "gets": "offers", "verdicts": "verdicts",
            "wants": "signatures", "fetches": "literal data", "results": "results",
            "hello": "handshake/open/finish", "welcome": "handshake/open/finish",
            "open": "handshake/open/finish", "opened": "handshake/open/finish",
            "finish": "handshake/open/finish", "finished": "handshake/open/finish",
        }
        out: dict[str, float] = {}
        for (_, t), n in self.bytes.items():
            g = role.get(t, f"other ({t})")
            out[g] = out.get(g, 0.0) + n
        return out


class _Pending:
    """Compressed bytes not yet decoded (the stream reader's source)."""

    def __init__(self) -> None:
        self.data = bytearray()

    def read(self, n: int = -1) -> bytes:
        n = len(self.data) if n < 0 else n
        out = bytes(self.data[:n])
        del self.data[:n]
        return out
