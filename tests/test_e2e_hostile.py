"""End to end: a hostile client, speaking the framing by hand, against the real daemon.

Whatever it sends (frames over the limit, malformed msgpack, unknown or out-of-order
messages, bad paths), only its own connection ends (or, for a bad path, only that
conversation: docs/protocol.md, "Paths" and section 4); another client is served
throughout, and nothing is written outside the share.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zstandard

from rdc.content.signature import signature_of_bytes
from rdc.params import FORMAT
from rdc.wire import messages as m

from .e2e_support import (
    E2E,
    HEADER,
    MAX_FRAME,
    RUN_SECONDS,
    TOKEN,
    Node,
    RawClient,
    Server,
    assert_same_tree,
    snapshot,
    write,
)


@dataclass
class World:
    e2e: E2E
    server: Server
    share: Path
    outside: Path
    baseline: dict[bytes, Node]  # of tmp, outside the share and the server's files

    def bystander(self) -> RawClient:
        """A well-behaved client, connected and opened before the hostile one acts."""
        client = RawClient(self.server.port, timeout=10)
        assert client.hello()["t"] == "welcome"
        client.open("s", write=True)
        return client

    def check(self, bystander: RawClient) -> None:
        """The daemon still serves the bystander, and nothing outside the share changed."""
        conversation = bystander.request("list", paths=[b""], hb=8)
        (listing,) = bystander.answer(conversation)
        assert listing["t"] == "listing", listing
        names = {entry[0] for entry in listing["dirs"][0][1]}
        assert {b"file.txt", b"dir", b"evil"} <= names
        assert self.server.running
        assert self.outside_now() == self.baseline
        bystander.close()

    def outside_now(self) -> dict[bytes, Node]:
        skip = {b"share", b"state", b"cache", b"tokens"}
        return snapshot(self.e2e.tmp, lambda rel: rel.split(b"/")[0] in skip
                        or rel.startswith(b"serve-") or rel.startswith(b"stats-"))


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("hostile")
    e2e = E2E(tmp)
    outside = tmp / "outside"
    outside.mkdir()
    write(outside / "secret.txt", b"outside the share\n")
    share = tmp / "share"
    (share / "dir").mkdir(parents=True)
    write(share / "file.txt", b"inside the share\n" * 40)
    os.symlink(outside, share / "evil")  # placed inside the share, points out of it
    server = e2e.serve({"s": share})
    try:
        yield World(e2e, server, share, outside, {})
    finally:
        e2e.close()


@pytest.fixture
def w(world: World) -> World:
    world.baseline = world.outside_now()
    return world


def closes_with_protocol_error(client: RawClient) -> None:
    """The server ends the connection, after an ``error`` (no id) with code ``protocol``
    if it says anything."""
    messages = client.until_closed()
    errors = [m for m in messages if m.get("t") == "error"]
    assert errors, f"closed without an error message: {messages!r}"
    assert errors[-1]["code"] == "protocol", errors
    assert errors[-1].get("id") is None, errors
    client.close()


def handshaken(w: World) -> RawClient:
    client = RawClient(w.server.port, timeout=5)
    assert client.hello()["t"] == "welcome"
    return client


def opened(w: World, write: bool = True) -> RawClient:
    client = handshaken(w)
    client.open("s", write=write)
    return client


# ---------------------------------------------------------------- framing


FRAMING = {
    "header over the limit": HEADER.pack(MAX_FRAME + 1),
    "compressed header over the limit": HEADER.pack((1 << 31) | (MAX_FRAME + 1)),
    "largest header": HEADER.pack((1 << 32) - 1),
    "empty frame": HEADER.pack(0),
    "malformed msgpack": HEADER.pack(3) + b"\x91\xc1\x00",
    "truncated msgpack": HEADER.pack(3) + b"\x91\x82\xa1",
    "trailing bytes": HEADER.pack(3) + b"\x90\x90\x90",
    "body not an array": HEADER.pack(1) + b"\x80",
    "empty array": HEADER.pack(1) + b"\x90",
    "message not a map": HEADER.pack(2) + b"\x91\x01",
    "ext type": (lambda b: HEADER.pack(len(b)) + b)(
        msgpack.packb([{"t": "list", "id": 9, "x": msgpack.ExtType(1, b"x")}])),
    "bad zstd": HEADER.pack((1 << 31) | 12) + HEADER.pack(100) + b"\x28\xb5\x2f\xfd" + b"\xff" * 4,
    "compressed without its size": HEADER.pack((1 << 31) | 2) + b"\x00\x01",
    "zstd bomb": (lambda b: HEADER.pack((1 << 31) | (len(b) + 4)) + HEADER.pack(1000) + b)(
        (lambda c: c.compress(bytes(64 << 20)) + c.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK))(
            zstandard.ZstdCompressor().compressobj())),
    "zstd bomb over the frame limit": (
        lambda b: HEADER.pack((1 << 31) | (len(b) + 4)) + HEADER.pack(MAX_FRAME + 1) + b)(
        (lambda c: c.compress(bytes(64 << 20)) + c.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK))(
            zstandard.ZstdCompressor().compressobj())),
}


@pytest.mark.parametrize("when", ["before hello", "after open"])
@pytest.mark.parametrize("case", sorted(FRAMING))
def test_bad_framing_ends_only_that_connection(w: World, case: str, when: str) -> None:
    bystander = w.bystander()
    client = opened(w) if when == "after open" else RawClient(w.server.port, timeout=5)
    client.send_raw(FRAMING[case])
    closes_with_protocol_error(client)
    w.check(bystander)


BAD_MESSAGES: dict[str, list[dict[str, Any]]] = {
    "unknown type": [{"t": "gimme", "id": 50}],
    "unknown type without id": [{"t": "gimme"}],
    "no type": [{"id": 50, "paths": [b""]}],
    "request without id": [{"t": "list", "paths": [b""], "hb": 8}],
    "a reply as request": [{"t": "want", "id": 50, "k": "whole"}],
    "data as request": [{"t": "data", "id": 50, "d": [b"x"], "end": True}],
    "second open": [{"t": "open", "id": 50, "share": "s", "path": b"", "write": False,
                     "create": False, "excludes": []}],
    "hello again": [{"t": "hello", "proto": [2, 2], "token": TOKEN}],
    "mistyped field": [{"t": "list", "id": 50, "paths": b"", "hb": 8}],
    "value over a limit": [{"t": "list", "id": 50, "paths": [b""], "hb": 9}],
    "missing field": [{"t": "get", "id": 50}],
    "id over 32 bits": [{"t": "list", "id": 1 << 40, "paths": [b""], "hb": 8}],
    "unknown op": [{"t": "ops", "id": 50, "ops": [["chown", b"file.txt", 0, None]]}],
}


@pytest.mark.parametrize("case", sorted(BAD_MESSAGES))
def test_bad_messages_after_open_end_only_that_connection(w: World, case: str) -> None:
    bystander = w.bystander()
    client = opened(w)
    client.send(*BAD_MESSAGES[case])
    closes_with_protocol_error(client)
    w.check(bystander)


BEFORE_OPEN: dict[str, list[dict[str, Any]]] = {
    "list before open": [{"t": "list", "id": 1, "paths": [b""], "hb": 8}],
    "offer before open": [{"t": "offer", "id": 1, "path": b"x", "size": 1, "root": b"r" * 32,
                           "depth": 2, "sketch": None, "mode": 0o644, "mtime": 0,
                           "data": b"x"}],
    "ops before open": [{"t": "ops", "id": 1, "ops": [["mkdir", b"new", 0o755, None]]}],
    "finish before open": [{"t": "finish", "id": 1}],
}


@pytest.mark.parametrize("case", sorted(BEFORE_OPEN))
def test_requests_before_open_end_only_that_connection(w: World, case: str) -> None:
    bystander = w.bystander()
    client = handshaken(w)
    client.send(*BEFORE_OPEN[case])
    closes_with_protocol_error(client)
    assert not (w.share / "new").exists() and not (w.share / "x").exists()
    w.check(bystander)


BEFORE_HELLO: dict[str, list[dict[str, Any]]] = {
    "open first": [{"t": "open", "id": 1, "share": "s", "path": b"", "write": True,
                    "create": True, "excludes": []}],
    "ops first": [{"t": "ops", "id": 1, "ops": [["mkdir", b"new", 0o755, None]]}],
    "unknown first": [{"t": "gimme"}],
    "hello twice in a frame": [{"t": "hello", "proto": [2, 2], "token": TOKEN}] * 2,
    "hello without proto": [{"t": "hello", "token": TOKEN}],
}


@pytest.mark.parametrize("case", sorted(BEFORE_HELLO))
def test_messages_before_the_handshake_end_only_that_connection(w: World, case: str) -> None:
    bystander = w.bystander()
    client = RawClient(w.server.port, timeout=5)
    client.send(*BEFORE_HELLO[case])
    closes_with_protocol_error(client)
    assert not (w.share / "new").exists()
    w.check(bystander)


def test_a_wrong_token_gets_auth_and_nothing_else(w: World) -> None:
    bystander = w.bystander()
    client = RawClient(w.server.port, timeout=5)
    client.send({"t": "hello", "proto": [2, 2], "agent": "x", "features": [],
                 "token": "not-the-token-at-all"})
    messages = client.until_closed()
    assert [(m["t"], m["code"]) for m in messages] == [("error", "auth")], messages
    assert "s" not in messages[0]["msg"] and "rdc/" not in messages[0]["msg"]
    w.check(bystander)


def test_a_silent_client_does_not_block_others(w: World) -> None:
    """A connection that never says hello holds nothing up (and is closed after 10 s,
    which this test does not wait for)."""
    silent = RawClient(w.server.port, timeout=5)
    half = RawClient(w.server.port, timeout=5)
    half.send_raw(HEADER.pack(100) + b"\x91")  # a frame begun, never finished
    bystander = w.bystander()
    w.check(bystander)
    silent.close()
    half.close()


# ---------------------------------------------------------------- bad paths

SPELLED = {  # refused by their spelling alone
    "dot-dot": b"../x",
    "dot-dot inside": b"dir/../../x",
    "absolute": os.fsencode(Path("/tmp") / "rdc-e2e-absolute-x"),
    "NUL": b"dir/x\x00y",
    "empty component": b"dir//x",
    "dot": b"./x",
    "rdc temporary": b".rdc-tmp-0123456789abcdef-x",
    "too long": b"a/" * 2100 + b"x",
}
THROUGH_LINK = {  # well spelled, but through the link evil -> outside
    "through a symlink": b"evil/x",
    "through a symlink to an existing file": b"evil/secret.txt",
}
BAD_PATHS = {**SPELLED, **THROUGH_LINK}
OPS = {
    "mkdir": lambda p: ["mkdir", p, 0o755, None],
    "link": lambda p: ["link", p, b"/etc/passwd", None],
    "rm": lambda p: ["rm", p, None, None],
    "meta": lambda p: ["meta", p, [0o777, 0], None],
}


def offer_for(path: bytes, data: bytes = b"planted\n") -> dict[str, Any]:
    signature = signature_of_bytes(data)
    return {"path": path, "size": len(data), "root": signature.root,
            "depth": len(signature.tree.levels), "sketch": signature.sketch, "mode": 0o644,
            "mtime": 1_000_000_000_000_000_000, "data": data}


def request_with(kind: str, path: bytes) -> dict[str, Any]:
    """A request whose one flaw is ``path``."""
    if kind == "offer":
        return {"t": "offer", **offer_for(path)}
    if kind == "get":
        return {"t": "get", "path": path}
    if kind in ("list", "mlist"):
        return {"t": kind, "paths": [b"", path], "hb": 8}
    if kind == "mset":
        return {"t": "mset", "dirs": [[path, b"\0" * 8, True, [[0], b"\0"], [[0], b"\0"]]]}
    op = kind.partition(" ")[2]
    return {"t": "ops", "ops": [OPS[op](path), ["mkdir", b"dir/ok", 0o755, None]]}


REQUESTS = ["offer", "get", "list", "mlist", "mset", *(f"ops {op}" for op in sorted(OPS))]


def outcome(client: RawClient, kind: str, path: bytes) -> str:
    """Send the request; how the server took it: ``conversation`` (that request refused
    as ``path``, or answered without touching anything: a nil listing, a skipped times
    vector, the op alone refused), then checked that the connection goes on; or
    ``connection`` (error protocol, then closed)."""
    message = request_with(kind, path)
    conversation = client.request(message.pop("t"), **message)
    answer = client.answer(conversation)
    last = answer[-1]
    if last["t"] == "error" and last.get("id") is None:
        assert last["code"] == "protocol", answer
        client.until_closed()
        return "connection"
    assert last.get("id") == conversation, answer
    if last["t"] in ("error", "done"):
        assert last["code"] == "path" and last.get("ok") is not True, answer
    elif last["t"] in ("listing", "mlisting"):
        if kind == "list":  # a path that names nothing listable: nil, nothing of it
            assert [d[1] is None for d in last["dirs"]] == [False, True], answer
        else:
            assert [d[0] for d in last["dirs"]] == [b""], answer
    elif last["t"] == "ok":
        assert (last["applied"], last["skipped"]) == (0, 1), answer
    else:
        assert last["t"] == "oks", answer
        bad, good = last["results"]
        assert bad is not None and bad[0] == "path", answer
        assert good is None, answer  # the next op of the same request still ran
    again = client.request("list", paths=[b""], hb=8)
    assert client.answer(again)[-1]["t"] == "listing"
    return "conversation"


def nothing_planted(w: World) -> None:
    assert not (w.e2e.tmp / "x").exists()
    assert not Path("/tmp/rdc-e2e-absolute-x").exists()
    assert sorted(os.listdir(w.share)) == [".rdc-folder", "dir", "evil", "file.txt"]
    assert (w.share / "file.txt").read_bytes() == b"inside the share\n" * 40
    for leftover in os.listdir(w.share / "dir"):  # the good op of an ops request
        assert leftover == "ok"
        os.rmdir(w.share / "dir" / leftover)


@pytest.mark.parametrize("kind", REQUESTS)
@pytest.mark.parametrize("case", sorted(BAD_PATHS))
def test_a_bad_path_writes_nothing_and_ends_at_most_its_connection(
    w: World, case: str, kind: str
) -> None:
    bystander = w.bystander()
    client = opened(w, write=kind not in ("get", "list", "mlist"))
    how = outcome(client, kind, BAD_PATHS[case])
    if case in THROUGH_LINK:  # docs/protocol.md: refused as path, the connection goes on
        assert how == "conversation"
    client.close()
    nothing_planted(w)
    w.check(bystander)


@pytest.mark.parametrize("kind", ["offer", "get", "list", "ops mkdir"])
def test_a_badly_spelled_path_ends_its_connection_only(w: World, kind: str) -> None:
    """docs/protocol.md, Paths: a path no rdc would send (.., absolute, NUL, empty or .
    component, a temporary's name, over the limits) is a protocol error."""
    bystander = w.bystander()
    for path in SPELLED.values():
        client = opened(w, write=kind != "get")
        try:
            assert outcome(client, kind, path) == "connection", path
        finally:
            client.close()
            nothing_planted(w)
    w.check(bystander)


@pytest.mark.parametrize("path", [b"evil", b"evil/sub", b"file.txt", *SPELLED.values()])
def test_open_of_a_bad_path_is_refused_and_creates_nothing(w: World, path: bytes) -> None:
    bystander = w.bystander()
    client = handshaken(w)
    conversation = client.request("open", share="s", path=path, write=True, create=True,
                                  excludes=[])
    answer = client.answer(conversation)
    assert answer[-1]["t"] == "error", answer
    if path in SPELLED.values():  # a protocol error (docs/protocol.md, Paths)
        assert answer[-1]["code"] == "protocol", answer
    else:
        assert answer[-1]["code"] == "path" and answer[-1]["id"] == conversation, answer
    client.close()
    nothing_planted(w)
    w.check(bystander)


def test_the_daemon_still_serves_real_clients(w: World) -> None:
    dst = w.e2e.tmp / "dst"
    w.e2e.pull(w.server.url("s"), dst).ok()
    assert_same_tree(w.share, dst)


# ---------------------------------------------------------------- a server that dies


def fake_server(script: Callable[[socket.socket], None]) -> tuple[int, threading.Thread]:
    """A one-connection server on 127.0.0.1 that runs ``script`` on its connection."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(RUN_SECONDS)

    def serve() -> None:
        with listener:
            connection, _ = listener.accept()
            with connection:
                connection.settimeout(RUN_SECONDS)
                script(connection)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener.getsockname()[1], thread


def frame(*messages: dict[str, Any]) -> bytes:
    body = msgpack.packb(list(messages), use_bin_type=True)
    return HEADER.pack(len(body)) + body


@pytest.mark.parametrize("cut", ["mid-frame", "mid-header", "between frames"])
def test_a_server_that_dies_mid_transfer_is_a_lost_connection(e2e: E2E, cut: str) -> None:
    """However the stream ends, the client says the connection was lost (exit 5), not
    that the peer broke the protocol (6)."""

    def script(connection: socket.socket) -> None:
        connection.recv(65536)  # hello
        connection.sendall(frame({"t": "welcome", "proto": 2, "agent": "fake",
                                  "features": [], "format": FORMAT}))
        connection.recv(65536)  # open
        opened = frame({"t": "opened", "id": 1, "content": b"\1" * 32, "meta": b"\2" * 32,
                        "writable": False, "seq": 1})
        if cut == "mid-frame":
            opened = opened[: len(opened) // 2]
        elif cut == "mid-header":
            opened = opened[:2]
        else:
            opened = b""
        connection.sendall(opened)

    port, thread = fake_server(script)
    result = e2e.pull(f"rdc://127.0.0.1:{port}/s", e2e.tmp / "dst")
    thread.join(RUN_SECONDS)
    assert result.returncode == 5, result
    assert "Traceback" not in result.stderr, result


def test_a_client_cannot_set_the_mode_or_time_of_a_share_itself(w: World) -> None:
    """The top directory of a share is the administrator's: `meta` on the empty path is
    refused there, and only there (inside the share it sets the opened directory's)."""
    before = os.lstat(w.share)
    client = opened(w)
    try:
        conversation = client.request("ops", ops=[["meta", b"", [0o777, 0], None],
                                                  ["mkdir", b"dir/ok", 0o755, None]])
        last = client.answer(conversation)[-1]
        assert last["t"] == "oks", last
        bad, good = last["results"]
        assert bad is not None and bad[0] == "path" and good is None, last
    finally:
        client.close()
    after = os.lstat(w.share)
    assert after.st_mode == before.st_mode
    assert after.st_mtime_ns != 0
    os.rmdir(w.share / "dir" / "ok")


def test_a_client_with_other_format_parameters_is_told_what_differs(w: World) -> None:
    """A client built with another chunk size would fail every multi-chunk file at the
    root check; it is refused at the handshake instead, with the difference named."""
    client = RawClient(w.server.port, timeout=5)
    other = FORMAT.replace("chunks=32/4096/12288", "chunks=32/2048/8192")
    assert other != FORMAT
    answer = client.hello(format=other)
    assert answer["t"] == "error" and answer["code"] == "version", answer
    assert "chunks 32/4096/12288 here, 32/2048/8192 there" in answer["msg"]
    client.close()


@pytest.mark.parametrize("leaves", ["closing", "answering nonsense"])
def test_a_client_that_leaves_a_delta_midway_leaves_no_descriptor(e2e: E2E,
                                                                  leaves: str) -> None:
    """An offer of a changed file, whose old version the server opens as a seed; the
    client closes the connection at the first want, or answers it with lists that do not
    parse. The seed was held until the next full garbage collection: while any other
    connection lasts (the daemon collects when the last one ends), so a client could pile
    them up."""
    share = e2e.tmp / "share"
    share.mkdir()
    old = random.Random(10).randbytes(300_000)
    write(share / "blob.bin", old)
    server = e2e.serve({"s": share})
    new = old[:1000] + b"changed" + old[1000:]
    signature = signature_of_bytes(new)
    bystander = RawClient(server.port, timeout=10)  # the daemon collects when none is left
    assert bystander.hello()["t"] == "welcome"
    client = RawClient(server.port, timeout=10)
    assert client.hello()["t"] == "welcome"
    client.open("s", write=True)
    client.send(m.encode(m.Offer(size=len(new), root=signature.root,
                                 depth=len(signature.tree.levels), sketch=signature.sketch,
                                 mode=0o644, mtime_ns=10**18, path="blob.bin"), 2))
    answer = client.receive()
    assert answer and answer[0]["t"] == "want", answer

    def seeds_held() -> list[str]:
        fds = f"/proc/{server.process.pid}/fd"
        targets = []
        for fd in os.listdir(fds):
            with contextlib.suppress(FileNotFoundError):  # closed since the listing
                targets.append(os.readlink(f"{fds}/{fd}"))
        return [target for target in targets if target.endswith("blob.bin")]

    assert seeds_held(), (answer, server.log())  # opened before the want was sent
    if leaves == "answering nonsense":
        client.send({"t": "lists", "id": 2, "lists": [[b"\0" * 32]]})
        client.until_closed()
    client.close()
    deadline = time.monotonic() + 10
    while seeds_held() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not seeds_held(), server.log()
    bystander.close()
