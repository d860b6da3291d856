"""What counts as a bug of the server, seen from outside: its log (tracebacks, internal
errors, failures), a fresh client that cannot get in (a hang), its descriptors and memory
after the connections closed, anything changed outside the share, and floods of memory
that a client can cause with little traffic.

`LogWatch` reads the log as it grows and names the connection (so the input) behind each
suspicious record; `signature` reduces a record to what identifies its bug, so the same
bug found 500 times is one finding.
"""

from __future__ import annotations

import re
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

import msgpack

from rdc.wire.codec import MAX_FRAME, MAX_PIECE
from rdc.wire.frames import HEADER
from rdc.wire.handshake import HELLO_FRAME
from tests.attack.wire import Encoder, hello
from tests.attack.world import RO_TOKEN, World, memory_kib
from tests.e2e_support import RawClient

# A traceback, an internal error, or a line of the server's own saying something failed
# ("#N failed", "conversation N (ops) failed"; a peer's bad token is no bug, and text the
# peer caused, such as msgpack's "Unpack failed", is in the middle of a line).
SUSPICIOUS = re.compile(r"Traceback \(most recent call last\)|internal error|"
                        r"^\S+ \S+ rdc serve: .*(?<!authentication) failed$", re.M)
# A record starts with the log's time stamp, or is a Python warning (watchdog's).
RECORD = re.compile(rb"^(?:\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} |\S+:\d+: \w*Warning: |"
                    rb"Exception in thread )", re.M)
CONNECTION = re.compile(r"#(\d+) connection from ([\d.]+):(\d+)")
NUMBER = re.compile(r"#(\d+)\b")
FRAME_LINE = re.compile(r'File "[^"]*/((?:rdc|rdc_server|rdc_client)/[^"]+)", line (\d+), in (\S+)')
ANY_FRAME = re.compile(r'File "[^"<]*/([^"/]+/[^"/]+)", line (\d+), in (\S+)')
PROBE_SECONDS = 5.0


@dataclass
class Record:
    """One log record: its first line and the lines that follow it (a traceback)."""

    text: str
    number: int | None  # the connection it names (#N), if any

    @property
    def suspicious(self) -> bool:
        return bool(SUSPICIOUS.search(self.text))


EXCEPTION_LINE = re.compile(
    r"^[ |+]*([A-Za-z_][\w.]*(?:Error|error|Exception|Warning|Exit|Interrupt|Group|Denied|"
    r"Failed|Refusal)\b.*)$", re.M)


def signature(text: str) -> str:
    """What identifies a bug in a log record: the exception and the deepest frame of rdc's
    code (else of any code) in its traceback, or the message with its numbers and quoted
    values blanked."""
    frames = FRAME_LINE.findall(text) or ANY_FRAME.findall(text)
    exceptions = [e for e in EXCEPTION_LINE.findall(text) if not e.startswith("ExceptionGroup")]
    if frames and exceptions:
        where = "{}:{} in {}".format(*frames[-1])
        return f"{_blank(exceptions[-1].strip())} at {where}"
    lines = [line for line in text.strip().splitlines() if line.strip()]
    message = lines[0] if lines else text
    message = message.split(" rdc serve: ", 1)[-1]
    return _blank(NUMBER.sub("#N", message))


def _blank(text: str) -> str:
    text = re.sub(r"characters? in position \d+(-\d+)?", "characters in position N", text)
    text = re.sub(r"'[^' ]*'|\"[^\" ]*\"", "'…'", text)
    text = re.sub(r"\b\d[\d_]*\b", "N", text)
    return text[:300]


class LogWatch:
    """The server's log, read as it grows, in bounded pieces: a client may make the server
    write gigabytes of it (deep tracebacks), and that must not sink the harness."""

    CHUNK = 16 << 20  # bytes read at a time
    KEEP = 8 << 10  # of a longer record, its first and last KEEP bytes are kept

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.tail = b""  # the record in progress
        self.read = 0  # bytes read in all
        self.peers: dict[int, str] = {}  # connection number -> address

    def rotate(self, limit: int = 64 << 20) -> None:
        """Empty the log once it is over ``limit`` bytes and read. Call it while the server
        is quiet: it appends (O_APPEND), so it goes on at the new end, but what it wrote
        after the last `poll` is lost."""
        if self.offset > limit:
            with open(self.path, "r+b") as f:
                f.truncate(0)
            self.offset = 0

    def poll(self, final: bool = False) -> list[Record]:
        """The records completed since the last call (all of them with ``final``)."""
        records: list[Record] = []
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            while data := f.read(self.CHUNK):
                self.offset += len(data)
                self.read += len(data)
                records += self._records(self.tail + data, final=False)
        if final and self.tail:
            records += self._records(self.tail, final=True)
        return records

    def _records(self, data: bytes, final: bool) -> list[Record]:
        starts = [m.start() for m in RECORD.finditer(data)]
        cut = len(data) if final or not starts else starts[-1]
        self.tail = data[cut:] if starts else data
        if len(self.tail) > 4 * self.KEEP:
            self.tail = self.tail[: self.KEEP] + b"\n[...]\n" + self.tail[-self.KEEP :]
        records = []
        for a, b in zip(starts, [*starts[1:], len(data)], strict=True):
            if a >= cut:
                break
            raw = data[a:b]
            if len(raw) > 2 * self.KEEP:
                raw = raw[: self.KEEP] + b"\n[...]\n" + raw[-self.KEEP :]
            text = raw.decode(errors="replace")
            found = CONNECTION.search(text)
            if found:
                self.peers[int(found.group(1))] = found.group(2)
            number = NUMBER.search(text.split(" rdc serve: ", 1)[-1])
            records.append(Record(text, int(number.group(1)) if number else None))
        return records


def suspicious(records: list[Record]) -> list[Record]:
    """The suspicious records; one without a connection number (the session's own
    traceback of a failed conversation) is joined to the next suspicious one that has."""
    out: list[Record] = []
    orphan: Record | None = None
    for record in records:
        if not record.suspicious:
            continue
        if record.number is None:
            orphan = Record(orphan.text + record.text, None) if orphan else record
            continue
        if orphan is not None:
            record = Record(orphan.text + record.text, record.number)
            orphan = None
        out.append(record)
    if orphan is not None:
        out.append(orphan)
    return out


# ---------------------------------------------------------------- probes


def probe(port: int, timeout: float = PROBE_SECONDS) -> str:
    """"" if a fresh, valid client completes the handshake and an open within
    ``timeout`` seconds, else what went wrong."""
    start = time.monotonic()
    client = None
    try:
        client = RawClient(port, timeout=timeout)
        welcome = client.hello()
        if welcome.get("t") != "welcome":
            return f"hello answered with {welcome!r:.200}"
        client.open("s")
        return ""
    except (OSError, AssertionError) as exc:
        return f"after {time.monotonic() - start:.1f} s: {type(exc).__name__}: {exc}"[:400]
    finally:
        if client is not None:
            client.close()


@dataclass
class Flood:
    """What one flood did to the server's memory (KiB)."""

    name: str
    wire_bytes: int
    before: int
    peak: int
    after: int  # a few seconds after the flooding connections closed
    detail: str = ""
    notes: list[str] = field(default_factory=list)


def _sample(pid: int, seconds: float, peak: int) -> int:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        peak = max(peak, memory_kib(pid)[0])
        time.sleep(0.05)
    return peak


def flood_before_login(world: World, connections: int = 160, addresses: int = 8) -> Flood:
    """Unauthenticated connections from several addresses, each holding what it may
    before the handshake: all but the last byte of the largest first frame allowed (and
    every fourth announcing a MAX_FRAME one instead, which must be cut before its body is
    read), then waiting. More than the caps on such connections allow: what may peers
    without a token make the server hold?"""
    assert world.daemon is not None
    pid = world.daemon.pid
    before = memory_kib(pid)[0]
    socks = []
    sent = 0
    for n in range(connections):
        size = MAX_FRAME if n % 4 == 3 else HELLO_FRAME
        data = HEADER.pack(size) + b"\x91" + b"\0" * (size - 2)
        try:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((f"127.0.{200 + n % addresses}.1", 0))
            sock.settimeout(2)
            sock.connect(("127.0.0.1", world.port))
            socks.append(sock)
            sock.sendall(data)
            sent += len(data)
        except OSError:  # cut or refused (busy): what the caps are for
            pass
    peak = _sample(pid, 1.0, before)
    refused = sum(_refused(sock) for sock in socks)
    for sock in socks:
        sock.close()
    after = _sample(pid, 1.5, 0)
    return Flood("before login", sent, before, peak, after,
                 f"{connections} connections from {addresses} addresses, {refused} cut or "
                 f"told busy; each with all but a byte of a {HELLO_FRAME >> 10} KiB frame, "
                 f"or a {MAX_FRAME >> 20} MiB one")


def _refused(sock: socket.socket) -> bool:
    """Whether the server closed ``sock`` (with or without a word), without waiting."""
    sock.setblocking(False)
    try:
        while sock.recv(65536):
            pass
        return True
    except BlockingIOError:
        return False
    except OSError:
        return True


class _Speaker:
    """A connection of the harness's own that speaks the protocol, compressed."""

    def __init__(self, port: int, token: str) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.encoder = Encoder()
        self.sent = 0
        self.send(hello(token, "flood/0"), squeeze=False)

    def send(self, *messages: dict, squeeze: bool = True) -> None:
        data = self.encoder.frame(msgpack.packb(list(messages), use_bin_type=True), squeeze)
        self.sock.sendall(data)
        self.sent += len(data)

    def close(self) -> None:
        self.sock.close()


def _open_message(share: str = "s", write: bool = False) -> dict:
    return {"t": "open", "id": 1, "share": share, "path": b"", "write": write,
            "create": False, "excludes": []}


def flood_watch(world: World, messages: int = 48) -> Flood:
    """With a read-only token: one watch conversation (which takes no input) sent large
    messages that compress to almost nothing."""
    assert world.daemon is not None
    pid = world.daemon.pid
    before = memory_kib(pid)[0]
    speaker = _Speaker(world.port, RO_TOKEN)
    detail = ""
    try:
        speaker.send(_open_message())
        time.sleep(0.3)
        speaker.send({"t": "watch", "id": 2, "seq": 0})
        piece = b"\0" * min(MAX_PIECE, (MAX_FRAME - 4096) // 4)  # 4 MiB a message
        for _ in range(messages):
            speaker.send({"t": "lists", "id": 2, "lists": [[0, piece, piece]] * 2})
    except OSError as exc:
        detail = f"the server cut the flood: {exc}"
    peak = _sample(pid, 1.0, before)
    speaker.close()
    after = _sample(pid, 1.5, 0)
    return Flood("watch", speaker.sent, before, peak, after,
                 detail or f"{messages} lists messages of 4 MiB to one watch, read-only token")


def flood_unread(world: World, conversations: int = 200) -> Flood:
    """With a read-only token: many ``get`` conversations of the largest file, each sent a
    3 MiB ``data`` message (compressed to almost nothing) while its handler is still
    signing the file, so that the input waits unread: the reader must stop reading once
    the unread input of all conversations is over its bound."""
    assert world.daemon is not None
    pid = world.daemon.pid
    before = memory_kib(pid)[0]
    speaker = _Speaker(world.port, RO_TOKEN)
    detail = ""
    piece = b"\0" * MAX_PIECE
    try:
        speaker.send(_open_message())
        time.sleep(0.3)
        for n in range(conversations):
            speaker.send({"t": "get", "id": 2 + n, "path": b"data/blob.bin"},
                         {"t": "data", "id": 2 + n, "d": [piece] * 3, "end": False})
    except OSError as exc:
        detail = f"the server cut the flood: {exc}"
    peak = _sample(pid, 1.0, before)
    speaker.close()
    after = _sample(pid, 1.5, 0)
    return Flood("unread input", speaker.sent, before, peak, after,
                 detail or f"{conversations} gets, each sent 3 MiB of data it does not read "
                 "yet, read-only token")


FLOODS = (flood_before_login, flood_watch, flood_unread)
