"""Playing an `Input` against the server: each planned frame is sent after the server message
it waits for (or a timeout), the server's frames are decoded as they come (zstd history
included) and searched for the canary's secrets, and, if asked, the server's wants of a
known offer are answered from the file's real content (`rdc.descent.SourceFile`).

Each connection comes from its own loopback address (127.x.y.z, from the input's index), so
the server's log line ``connection from ADDRESS`` names the input that made it.
"""

from __future__ import annotations

import contextlib
import random
import selectors
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import msgpack

from rdc.content.signature import FileSignature, signature_of_bytes
from rdc.transfer.descent import SourceFile
from rdc.wire.codec import MAX_PIECE
from tests.attack.inputs import OPENED_CONTENT, Input, Planned, Trigger
from tests.attack.values import mutate_value, patch_bad_strs
from tests.attack.wire import BadStream, Decoder, Encoder, unpack

# The server's message that ends a conversation of each request (``more`` false), where
# one does (the client ends ``get`` and ``gets`` itself, ``watch`` never ends; ``offers``
# ends with ``verdicts`` when nothing is written, see `_ends`).
FINAL = {"open": "opened", "list": "listing", "mlist": "mlisting", "offer": "done",
         "offers": "results", "ops": "oks", "mset": "ok", "finish": "finished"}
WRITTEN = ("copy", "done", "send")  # verdicts after which the server writes the file
WAIT = 2.0  # seconds a frame waits for its trigger at most
QUIET = 0.15  # ... or until the server said nothing for this long (a trigger that a
# mutation made impossible, such as an answer to a changed id, must not cost WAIT)
END_WAIT = 2.0  # after the last frame, seconds to wait for open conversations to end
# ... and for a request with id 0 the server owes an answer: a share scanned by ten
# connections at once beside another fuzzing server took longer than END_WAIT (seed 7,
# inputs 736,941-737,081: answered when played again, alone or as the same batch).
OWED_WAIT = 10.0
LIMIT = 20.0  # seconds one connection may take in all


def address(index: int, connection: int = 0) -> str:
    """The loopback address input ``index`` connects from (127.0.0.0/24 is left to the
    harness's own clients)."""
    k = (index * 2 + connection) % (224 << 16)
    return f"127.{16 + (k >> 16)}.{(k >> 8) & 255}.{k & 255}"


@dataclass
class Outcome:
    """What one input got from the server."""

    sent: int = 0
    received: int = 0
    messages: int = 0
    leaks: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # connection-level error messages
    violations: list[str] = field(default_factory=list)  # answers the protocol forbids
    bad_stream: str = ""
    waited_out: int = 0  # frames sent after their trigger timed out
    seconds: float = 0.0

    def add(self, other: Outcome) -> None:
        self.sent += other.sent
        self.received += other.received
        self.messages += other.messages
        self.leaks += other.leaks
        self.violations += other.violations
        self.errors += other.errors
        self.bad_stream = self.bad_stream or other.bad_stream
        self.waited_out += other.waited_out


class Sources:
    """Files a pushing client could offer, by root: what the responder answers from."""

    def __init__(self, contents: dict[bytes, bytes]) -> None:
        self.contents = contents
        self._files: dict[bytes, SourceFile] = {}
        self._lock = threading.Lock()

    def file(self, root: Any) -> SourceFile | None:
        if not isinstance(root, bytes) or root not in self.contents:
            return None
        with self._lock:
            if root not in self._files:
                data = self.contents[root]
                signature: FileSignature = signature_of_bytes(data)

                def read(offset: int, length: int, data: bytes = data) -> bytes:
                    return data[offset : offset + length]

                self._files[root] = SourceFile(signature.tree, read)
            return self._files[root]


class Player:
    """Plays inputs against the server at ``port`` on 127.0.0.1."""

    def __init__(self, port: int, leaks: list[bytes], sources: Sources) -> None:
        self.port = port
        self.leaks = leaks
        self.sources = sources

    def play(self, inp: Input) -> Outcome:
        start = time.monotonic()
        outcomes = [Outcome() for _ in inp.connections]
        threads = []
        for n, frames in enumerate(inp.connections[1:], start=1):
            thread = threading.Thread(target=self._one, args=(inp, n, frames, outcomes[n]),
                                      daemon=True)
            thread.start()
            threads.append(thread)
        self._one(inp, 0, inp.connections[0], outcomes[0])
        for thread in threads:
            thread.join(LIMIT + 5)
        total = outcomes[0]
        for other in outcomes[1:]:
            total.add(other)
        total.seconds = time.monotonic() - start
        return total

    def _one(self, inp: Input, n: int, frames: list[Planned], outcome: Outcome) -> None:
        try:
            _Connection(self, inp, n, frames, outcome).run()
        except BadStream as exc:
            outcome.bad_stream = str(exc)


class _Connection:
    def __init__(self, player: Player, inp: Input, n: int, frames: list[Planned],
                 outcome: Outcome) -> None:
        self.player = player
        self.inp = inp
        self.outcome = outcome
        self.queue = deque(frames)
        self.urgent: deque[Planned] = deque()  # the responder's frames go first
        self.encoder = Encoder()
        self.decoder = Decoder()
        self.granted = False  # the welcome said zstd: the responder compresses
        self.opened_content = OPENED_CONTENT  # what the server's opened said
        self.address = address(inp.index, n)
        self.started: dict[int, str] = {}
        self.read_only_open: int | None = None  # an open sent without write: true
        self.read_only = False  # ... and the server opened it
        self.answered: set[int] = set()  # conversations the server said anything in
        self.ended: set[int] = set()
        self.seen: set[Trigger] = set()
        self.offers: dict[int, SourceFile] = {}
        self.batches: dict[int, list[Any]] = {}  # offers conversations: the roots offered
        self.closed = False  # the server closed its side
        self.failed = False  # the server said error without an id
        self.stop_sending = False
        self.frames_sent = 0
        self.active = 0.0  # when a byte last arrived or a frame was last sent
        self.rng = random.Random(f"rdc-fuzz/{inp.seed}/{inp.index}/answers/{n}")

    # ------------------------------------------------------------ the loop

    def run(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind((self.address, 0))
            sock.settimeout(5)
            try:
                sock.connect(("127.0.0.1", self.player.port))
            except OSError as exc:
                self.outcome.errors.append(f"connect: {exc}")
                return
            sock.setblocking(False)
            self._loop(sock)
            self.unanswered()
        finally:
            with contextlib.suppress(OSError):
                sock.close()

    def _loop(self, sock: socket.socket) -> None:
        selector = selectors.DefaultSelector()
        selector.register(sock, selectors.EVENT_READ)
        out = bytearray()
        writing = False
        now = time.monotonic()
        deadline = now + LIMIT
        waiting_since: float | None = None
        ending_since: float | None = None
        self.active = now
        while now < deadline:
            if not out and not self.stop_sending:
                frame = self._next(now, waiting_since)
                if frame is not None:
                    out += self._encode(frame)
                    waiting_since = None
                    self.active = now
                elif self.queue and waiting_since is None:
                    waiting_since = now
            if not out and not self.urgent and (not self.queue or self.stop_sending):
                ending_since = ending_since or now
                calm = min(now - ending_since, now - self.active)
                quiet = calm > QUIET and not self._owed()  # a busy server may be slow
                wait = OWED_WAIT if self._owed() else END_WAIT
                if ((self._all_ended() or quiet) and calm >= self.inp.hold) \
                        or now - ending_since > wait + self.inp.hold:
                    return
            want = selectors.EVENT_READ | (selectors.EVENT_WRITE if out else 0)
            if writing != bool(out):
                selector.modify(sock, want)
                writing = bool(out)
            for _, mask in selector.select(0.05):
                if mask & selectors.EVENT_READ and not self._read(sock):
                    self.closed = True  # the server is done with us: so are we
                    return
                if mask & selectors.EVENT_WRITE and out:
                    try:
                        sent = sock.send(out)
                    except BlockingIOError:
                        sent = 0
                    except OSError:
                        return
                    self.outcome.sent += sent
                    del out[:sent]
            now = time.monotonic()

    def _next(self, now: float, waiting_since: float | None) -> Planned | None:
        if self.urgent:
            return self.urgent.popleft()
        if not self.queue:
            return None
        trigger = self.queue[0].trigger
        if trigger is None or self._satisfied(trigger):
            return self.queue.popleft()
        if waiting_since is not None and (now - waiting_since > WAIT or min(
                now - waiting_since, now - self.active) > QUIET):
            self.outcome.waited_out += 1
            return self.queue.popleft()
        return None

    def _satisfied(self, trigger: Trigger) -> bool:
        conversation = trigger[0]
        return (tuple(trigger) in self.seen or self.closed or self.failed
                or (conversation is not None and conversation in self.ended))

    def _owed(self) -> bool:
        """A request with id 0 not answered yet: the server must answer it or close, so
        silence is not the end (`unanswered` would call it a violation)."""
        return self.started.get(0) in FINAL and 0 not in self.answered and not (
            self.closed or self.failed)

    def _all_ended(self) -> bool:
        return all(i in self.ended for i, t in self.started.items() if t in FINAL)

    # ------------------------------------------------------------ sending

    def _encode(self, frame: Planned) -> bytes:
        messages = frame.messages
        for message in messages if isinstance(messages, list) else ():
            if isinstance(message, dict) and isinstance(message.get("id"), int):
                t, conversation = message.get("t"), message["id"]
                if t in FINAL or t in ("get", "gets", "watch"):
                    self.started.setdefault(conversation, t)
                if t == "open" and message.get("write") is not True:
                    self.read_only_open = conversation
                if t == "offer" and self.inp.respond:
                    source = self.player.sources.file(message.get("root"))
                    if source is not None:
                        self.offers[conversation] = source
                if t == "offers" and self.inp.respond and isinstance(message.get("files"), list):
                    self.batches[conversation] = [
                        f[2] if isinstance(f, list) and len(f) > 2 else None
                        for f in message["files"]]
        if frame.raw is not None:
            body = frame.raw
        else:
            try:
                body = patch_bad_strs(msgpack.packb(messages, use_bin_type=True))
                if OPENED_CONTENT in body:
                    body = body.replace(OPENED_CONTENT, self.opened_content[:8])
            except (OverflowError, TypeError, ValueError) as exc:
                body = repr(exc).encode()  # not msgpack: the server must refuse it
        data = self.encoder.frame(body, frame.squeeze, breakage=frame.breakage)
        self.frames_sent += 1
        if frame.breakage is not None and frame.breakage.kind == "truncate":
            self.stop_sending = True
        return data

    # ------------------------------------------------------------ receiving

    def _read(self, sock: socket.socket) -> bool:
        try:
            data = sock.recv(1 << 20)
        except BlockingIOError:
            return True
        except OSError:
            return False
        if not data:
            return False
        self.outcome.received += len(data)
        self.active = time.monotonic()
        for _, body in self.decoder.feed(data):
            self._body(body)
        return True

    def _body(self, body: bytes) -> None:
        if any(leak in body for leak in self.player.leaks):
            self._leaks(body)
        messages = unpack(body)
        if not isinstance(messages, list):
            raise BadStream("a server frame that is not an array")
        for message in messages:
            if not isinstance(message, dict):
                raise BadStream(f"a server message that is not a map: {message!r:.80}")
            self.outcome.messages += 1
            conversation, t = message.get("id"), message.get("t")
            self.seen.add((conversation, t))
            self.answered.add(conversation)  # type: ignore[arg-type]
            self._check(conversation, t, message)
            if t == "opened" and isinstance(message.get("content"), bytes):
                self.opened_content = message["content"]
            if t == "welcome":
                self.granted = "zstd" in (message.get("features") or [])
            if t == "error":
                if conversation is None:
                    self.failed = True
                    self.outcome.errors.append(f"{message.get('code')}: {message.get('msg')}")
                else:
                    self.ended.add(conversation)
            elif conversation in self.started and _ends(self.started[conversation], message):
                self.ended.add(conversation)
            if t == "want" and conversation in self.offers:
                self._answer(conversation, message)
            if t == "verdicts" and conversation in self.batches:
                self._send_batch(conversation, message)

    def _check(self, conversation: Any, t: Any, message: dict[str, Any]) -> None:
        """docs/protocol.md section 3: after an open without ``write``, requests that write
        are refused (``readonly``); what the server wrote for one is a violation."""
        if t == "opened" and conversation == self.read_only_open:
            self.read_only = True
        writes = {"oks": "ops", "ok": "mset", "done": "offer", "verdicts": "offers",
                  "results": "offers"}
        if self.read_only and t in writes and self.started.get(conversation) == writes[t] \
                and _writes(message):
            self.outcome.violations.append(
                f"a {writes[t]} answered with {t} after an open without write: "
                f"{message!r:.200}")

    def unanswered(self) -> None:
        """A request with id 0 that the server neither answered nor closed the
        connection for (it must do one or the other)."""
        if self._owed():
            self.outcome.violations.append(f"a {self.started[0]} with id 0 never answered")

    def _leaks(self, body: bytes) -> None:
        """Which secrets are in server data, not in its echo of what this client sent."""
        for message in unpack(body):
            if not isinstance(message, dict):
                continue
            data = msgpack.packb(_without_echo(message), use_bin_type=True)
            for leak in self.player.leaks:
                if leak in data:
                    self.outcome.leaks.append(
                        f"{leak[:40]!r} in a {message.get('t')!r} message: {message!r:.300}")

    # ------------------------------------------------------------ answering wants

    def _answer(self, conversation: int, want: dict[str, Any]) -> None:
        source = self.offers[conversation]
        try:
            replies = _replies(source, want)
        except Exception as exc:  # a want that does not fit: the client says so
            replies = [{"t": "error", "code": "protocol", "msg": f"bad want: {exc}"[:200]}]
        for reply in replies:
            reply["id"] = conversation
            if self.rng.random() < self.inp.respond_mutation:
                key = self.rng.choice([k for k in reply if k != "t"])
                reply[key] = mutate_value(self.rng, reply[key], key, [])
        self.urgent.append(Planned(replies, squeeze=self.granted))

    def _send_batch(self, conversation: int, message: dict[str, Any]) -> None:
        """The content of each file of an ``offers`` batch the server asked to be sent,
        as a pushing client sends it (from the files' real content)."""
        roots = self.batches.pop(conversation)
        verdicts = message.get("verdicts")
        if not isinstance(verdicts, list) or len(verdicts) != len(roots):
            return
        wanted = [root for root, verdict in zip(roots, verdicts, strict=True)
                  if verdict == "send"]
        if not wanted:
            return
        contents = self.player.sources.contents
        if not all(isinstance(root, bytes) and root in contents for root in wanted):
            replies = [{"t": "error", "code": "vanished", "msg": "not a file this client has"}]
        else:
            replies = _batch_data([contents[root] for root in wanted])
        for reply in replies:
            reply["id"] = conversation
            if self.rng.random() < self.inp.respond_mutation:
                key = self.rng.choice([k for k in reply if k != "t"])
                reply[key] = mutate_value(self.rng, reply[key], key, [])
        self.urgent.append(Planned(replies, squeeze=self.granted))


def _ends(request: str, message: dict[str, Any]) -> bool:
    """Whether ``message`` from the server ends a conversation started by ``request``."""
    t = message.get("t")
    if request == "offers" and t == "verdicts":  # nothing to write: no results follow
        verdicts = message.get("verdicts")
        return isinstance(verdicts, list) and not any(v in WRITTEN for v in verdicts
                                                      if isinstance(v, str))
    return FINAL.get(request) == t and not message.get("more")


def _writes(message: dict[str, Any]) -> bool:
    """Whether the server's answer says it wrote (or goes on to write): any ``oks`` or
    ``ok``, a successful ``done`` (``have`` included: protocol 2 sets the offer's mode and
    time then), a verdict other than a failure, a file written in ``results``."""
    t = message.get("t")
    if t == "done":
        return message.get("ok") is True
    if t == "verdicts":
        return any(isinstance(v, str) for v in message.get("verdicts") or [])
    if t == "results":
        return any(r is None for r in message.get("results") or [])
    return True


def _batch_data(contents: list[bytes]) -> list[dict[str, Any]]:
    """``data`` messages with one piece per file, about 1 MiB each, the last one ``end``."""
    out: list[dict[str, Any]] = []
    pieces: list[bytes] = []
    size = 0
    for n, data in enumerate(contents):
        pieces.append(data)
        size += len(data)
        if size >= MAX_PIECE or n == len(contents) - 1:
            out.append({"t": "data", "d": pieces, "end": n == len(contents) - 1})
            pieces, size = [], 0
    return out


def _replies(source: SourceFile, want: dict[str, Any]) -> list[dict[str, Any]]:
    kind = want.get("k")
    if kind == "expand":
        lists = [source.children(level, i) for level, i in want["nodes"]]
    elif kind == "subs":
        lists = [source.subs(leaf) for leaf in want["leaves"]]
    elif kind == "fine":
        lists = [source.fines(leaf, mid) for leaf, mid in want["mids"]]
    elif kind == "fetch":
        pieces = [source.item(item) for item in want["items"]]
        return [{"t": "data", "d": pieces, "end": True}]
    else:
        size = source.tree.size
        pieces = [source.read(at, min(MAX_PIECE, size - at)) for at in range(0, size, MAX_PIECE)]
        return [{"t": "data", "d": [p], "end": i == len(pieces) - 1}
                for i, p in enumerate(pieces)] or [{"t": "data", "d": [], "end": True}]
    return [{"t": "lists", "lists": [[e.first, e.prefixes, e.lengths] for e in lists]}]


def _without_echo(message: dict[str, Any]) -> dict[str, Any]:
    """A server message without what repeats the client's own words: error texts (of
    the message, or of a file of a batch: ``offers`` and ``verdicts`` carry a [code,
    text] pair in a file's place), the paths of a listing, link targets (the client may
    have made the link)."""
    out = {k: v for k, v in message.items() if k not in ("msg", "results")}
    for key in ("files", "verdicts"):  # a file offered is a longer array, never a pair
        items = out.get(key)
        if isinstance(items, list) and message.get("t") in ("offers", "verdicts"):
            out[key] = [item[:1] if isinstance(item, list) and len(item) == 2 else item
                        for item in items]
    dirs = out.get("dirs")
    if isinstance(dirs, list):
        kept = []
        for item in dirs:
            if not isinstance(item, list) or not item:
                continue
            entries = item[1] if len(item) > 1 else None
            if isinstance(entries, list) and message.get("t") == "listing":
                entries = [e[:3] + e[4:] if isinstance(e, list) and len(e) > 3 and e[1] == "l"
                           else e for e in entries]
                kept.append([entries])
            else:
                kept.append(item[1:])
        out["dirs"] = kept
    return out

