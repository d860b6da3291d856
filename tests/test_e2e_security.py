"""End to end: the holes an attack run found in the daemon (issue 10), each closed. A
hostile client speaks the framing itself (`RawClient`) against the real ``rdc serve``;
nothing outside the share may be read, listed, created or changed, one message must not
deny service to others, and memory and descriptors stay bounded."""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import threading
import time
from pathlib import Path

import msgpack
import pytest

from .conftest import scaled
from .e2e_support import (
    E2E,
    HEADER,
    TOKEN,
    RawClient,
    Server,
    snapshot,
    wait_for,
    write,
)

NS_MAX = (1 << 63) - 1  # the latest time rdc can express
AFTER_2262 = 10_413_792_000_000_000_000  # 2300-01-01, beyond signed 64-bit nanoseconds
T1 = 1_700_000_000_000_000_000


def put(path: Path | bytes, data: bytes) -> None:
    """``write``, making the parent directories first."""
    os.makedirs(os.path.dirname(os.fsencode(path)), exist_ok=True)
    write(path, data)


def handshaken(server: Server, timeout: float = 5) -> RawClient:
    client = RawClient(server.port, timeout=timeout)
    assert client.hello()["t"] == "welcome"
    return client


def opened(server: Server, path: bytes = b"", write: bool = True) -> RawClient:
    client = handshaken(server)
    client.open("s", path, write=write)
    return client


def ops(client: RawClient, *items: list) -> list:
    conversation = client.request("ops", ops=list(items))
    (answer,) = client.answer(conversation)
    assert answer["t"] == "oks", answer
    return answer["results"]


def closed_with(client: RawClient, code: str) -> None:
    messages = client.until_closed()
    errors = [m for m in messages if m.get("t") == "error"]
    assert errors and errors[-1]["code"] == code, messages
    client.close()


def listed_names(client: RawClient, path: bytes = b"") -> set[bytes]:
    conversation = client.request("list", paths=[path], hb=8)
    (listing,) = client.answer(conversation)
    assert listing["t"] == "listing", listing
    entries = listing["dirs"][0][1] or []
    return {entry[0] for entry in entries}


def fd_count(server: Server) -> int:
    return len(os.listdir(f"/proc/{server.process.pid}/fd"))


def rss(server: Server) -> int:
    with open(f"/proc/{server.process.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) << 10
    raise AssertionError("no VmRSS")


@pytest.fixture
def outside(e2e: E2E) -> Path:
    """A directory beside the share whose content no client may reach."""
    out = e2e.tmp / "outside"
    (out / "private").mkdir(parents=True)
    write(out / "secret.txt", b"outside the share: never sent\n")
    return out


# ---------------------------------------------------------------- item 1: the share escape


def test_an_opened_directory_swapped_for_a_symlink_is_not_followed(
    e2e: E2E, outside: Path
) -> None:
    """The opened directory is held by its descriptor: after another connection replaced
    it with a symlink to the outside, the first connection still sees (and writes) only
    the directory it opened, and a new open of that path is refused."""
    share = e2e.tmp / "share"
    put(share / "d" / "inside.txt", b"in the share\n")
    server = e2e.serve({"s": share})
    before = snapshot(outside)
    first = opened(server, b"d")
    assert listed_names(first) == {b"inside.txt"}

    swapper = opened(server)
    link_target = os.fsencode(outside)
    assert ops(swapper, ["rm", b"d", None, None], ["link", b"d", link_target, None]) == [
        None, None]
    assert os.path.islink(share / "d")
    swapper.close()  # its writes are announced: the first connection scans again

    seen: list[set[bytes]] = []
    wait_for(lambda: seen.append(listed_names(first)) or seen[-1] != {b"inside.txt"}, 10,
             "the first connection to rescan")
    assert seen[-1] == set()  # the (now unlinked) directory it opened, not the outside
    conversation = first.request("get", path=b"secret.txt")
    replies = first.answer(conversation)
    assert replies[-1]["t"] == "error" and replies[-1]["code"] in ("vanished", "path"), replies
    assert ops(first, ["mkdir", b"made", 0o755, None])[0] is not None  # not outside either

    late = handshaken(server)
    conversation = late.request("open", share="s", path=b"d", write=True, create=False,
                                excludes=[])
    (refused,) = late.answer(conversation)
    assert refused["t"] == "error" and refused["code"] == "path", refused
    assert snapshot(outside) == before
    for client in (first, late):
        client.close()
    assert "Traceback" not in server.log()


# ---------------------------------------------------------------- item 2: values out of range


def test_times_beyond_2262_on_the_servers_disk_do_not_break_opens(e2e: E2E) -> None:
    share = e2e.tmp / "share"
    put(share / "d" / "future.txt", b"from the future\n")
    os.utime(share / "d" / "future.txt", ns=(AFTER_2262, AFTER_2262))
    os.utime(share / "d", ns=(AFTER_2262, AFTER_2262))
    server = e2e.serve({"s": share})
    copy = e2e.tmp / "copy"
    e2e.pull(server.url("s"), copy).ok()
    assert os.stat(copy / "d" / "future.txt").st_mtime_ns == NS_MAX  # the latest rdc has
    assert (copy / "d" / "future.txt").read_bytes() == b"from the future\n"
    for _ in range(3):  # every later open still works
        client = opened(server)
        assert b"d" in listed_names(client)
        client.close()
    assert "Traceback" not in server.log() and "internal error" not in server.log()


def test_a_local_file_dated_after_2262_is_pushed(e2e: E2E) -> None:
    src, share = e2e.tmp / "src", e2e.tmp / "share"
    put(src / "future.txt", b"pushed from the future\n")
    os.utime(src / "future.txt", ns=(AFTER_2262, AFTER_2262))
    share.mkdir()
    server = e2e.serve({"s": share})
    result = e2e.push(src, server.url("s")).ok()
    assert "Traceback" not in result.stderr
    assert os.stat(share / "future.txt").st_mtime_ns == NS_MAX
    assert e2e.push(src, server.url("s"), "--stats").ok()  # and then it is in step


def test_an_out_of_range_time_in_ops_ends_that_connection_only(e2e: E2E) -> None:
    """A time no 64-bit nanosecond count can hold is outside its field's limit: a protocol
    error for that connection (docs/protocol.md section 1), nothing applied, and the daemon
    serves every other connection, and every later open, as before."""
    share = e2e.tmp / "share"
    put(share / "f.txt", b"x\n")
    (share / "d").mkdir()
    before = os.stat(share / "d").st_mtime_ns
    server = e2e.serve({"s": share})
    bystander = opened(server)
    for value in ((1 << 64) - 1, 1 << 63):
        client = opened(server)
        client.request("ops", ops=[["meta", b"d", [0o755, value], None]])
        closed_with(client, "protocol")
        assert listed_names(bystander) == {b"f.txt", b"d"}
    assert os.stat(share / "d").st_mtime_ns == before
    other = opened(server)
    assert listed_names(other) == {b"f.txt", b"d"}
    for c in (bystander, other):
        c.close()
    assert "Traceback" not in server.log()


# ---------------------------------------------------------------- item 3: memory floods


def test_input_to_a_watch_conversation_ends_the_connection_at_once(e2e: E2E) -> None:
    """A watch takes no input after its request: a flood of large messages sent to it is
    a protocol error at the first, not gigabytes queued."""
    share = e2e.tmp / "share"
    share.mkdir()
    server = e2e.serve({"s": share})
    baseline = rss(server)
    client = RawClient(server.port, timeout=10)
    assert client.hello(TOKEN)["t"] == "welcome"
    client.open("s", write=False)
    watch = client.request("watch", seq=0)
    piece = b"\x01" * ((1 << 20) - 64)  # valid: each within the 1 MiB piece limit
    flood = msgpack.packb([{"t": "lists", "id": watch, "lists": [[0, piece, b""]] * 3}],
                          use_bin_type=True)
    sent = 0
    try:
        for _ in range(40):  # 120 MiB if the server kept reading it all
            client.send_body(flood)
            sent += 1
    except OSError:
        pass  # the server closed the connection: what it should do
    closed_with(client, "protocol")
    assert rss(server) < baseline + (64 << 20)
    fresh = handshaken(server)  # and it serves others
    fresh.close()


def test_a_large_first_frame_is_refused_before_the_token(e2e: E2E) -> None:
    """Before the handshake a frame may not be larger than a hello needs: the header
    alone ends the connection; the server does not wait for (or buffer) its body."""
    share = e2e.tmp / "share"
    share.mkdir()
    server = e2e.serve({"s": share})
    client = RawClient(server.port, timeout=5)
    started = time.monotonic()
    client.send_raw(HEADER.pack(1 << 20))
    closed_with(client, "protocol")
    assert time.monotonic() - started < 4


def test_connections_over_the_limits_are_refused_with_busy(e2e: E2E) -> None:
    share = e2e.tmp / "share"
    share.mkdir()
    server = e2e.serve({"s": share}, None, "--max-connections-per-address", "3")
    clients = [handshaken(server) for _ in range(3)]
    extra = RawClient(server.port, timeout=5)
    closed_with(extra, "busy")
    clients.pop().close()
    wait_for(lambda: _admitted(server), 10, "a place once a connection closed")
    for c in clients:
        c.close()


def _admitted(server: Server) -> bool:
    client = RawClient(server.port, timeout=5)
    try:
        return client.hello()["t"] == "welcome"
    except (AssertionError, OSError):
        return False
    finally:
        client.close()


def test_unauthenticated_connections_are_capped(e2e: E2E) -> None:
    share = e2e.tmp / "share"
    share.mkdir()
    server = e2e.serve({"s": share})
    silent = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(16)]
    try:
        wait_for(lambda: server.log().count("connection from") >= 16, 10, "16 connections")
        refused = RawClient(server.port, timeout=5)
        closed_with(refused, "busy")
    finally:
        for sock in silent:
            sock.close()
    wait_for(lambda: _admitted(server), 15, "logins again once the silent ones left")


# ---------------------------------------------------------------- item 4: hard links


def test_metadata_changes_never_reach_an_inode_linked_outside(e2e: E2E, outside: Path) -> None:
    share, src = e2e.tmp / "share", e2e.tmp / "src"
    put(outside / "linked.txt", b"same content\n")
    os.chmod(outside / "linked.txt", 0o600)
    os.utime(outside / "linked.txt", ns=(T1, T1))
    share.mkdir()
    os.link(outside / "linked.txt", share / "linked.txt")
    put(src / "linked.txt", b"same content\n")
    os.chmod(src / "linked.txt", 0o666)
    os.utime(src / "linked.txt", ns=(T1 + 5, T1 + 5))
    before = snapshot(outside)
    server = e2e.serve({"s": share})
    e2e.push(src, server.url("s")).ok()
    st = os.stat(share / "linked.txt")
    assert (stat.S_IMODE(st.st_mode), st.st_mtime_ns) == (0o666, T1 + 5)
    assert snapshot(outside) == before
    assert os.stat(outside / "linked.txt").st_nlink == 1  # the share has its own copy now

    os.link(outside / "linked.txt", share / "again.txt")
    client = opened(server)
    assert ops(client, ["meta", b"again.txt", [0o644, T1 + 9], None]) == [None]
    client.close()
    assert snapshot(outside) == before


def test_a_pull_never_changes_a_local_file_linked_elsewhere(e2e: E2E, outside: Path) -> None:
    share, dst = e2e.tmp / "share", e2e.tmp / "dst"
    put(share / "f.txt", b"shared\n")
    os.chmod(share / "f.txt", 0o640)
    put(outside / "f.txt", b"shared\n")
    os.chmod(outside / "f.txt", 0o600)
    dst.mkdir()
    os.link(outside / "f.txt", dst / "f.txt")
    before = snapshot(outside)
    server = e2e.serve({"s": share})
    e2e.pull(server.url("s"), dst).ok()
    assert stat.S_IMODE(os.stat(dst / "f.txt").st_mode) == 0o640
    assert snapshot(outside) == before


# ---------------------------------------------------------------- item 5: smaller holes


def test_an_open_without_write_cannot_write(e2e: E2E) -> None:
    share = e2e.tmp / "share"
    share.mkdir()
    server = e2e.serve({"s": share})
    client = opened(server, write=False)  # a read-write token, but opened to read
    conversation = client.request("ops", ops=[["mkdir", b"x", 0o755, None]])
    (refused,) = client.answer(conversation)
    assert refused["t"] == "error" and refused["code"] == "readonly", refused
    assert not (share / "x").exists()
    client.close()


@pytest.mark.parametrize("conversation", [0, 1])
def test_conversation_ids_must_be_new(e2e: E2E, conversation: int) -> None:
    """Id 0 is not an id, and an id already used cannot start another request: both are
    protocol errors, not silently dropped requests."""
    share = e2e.tmp / "share"
    share.mkdir()
    server = e2e.serve({"s": share})
    client = opened(server)  # the open used id 1
    client.send({"t": "list", "id": conversation, "paths": [b""], "hb": 8})
    closed_with(client, "protocol")


def test_an_error_naming_a_file_that_is_not_utf8_reaches_the_client(e2e: E2E) -> None:
    share = e2e.tmp / "share"
    name = b"caf\xe9"
    os.makedirs(os.fsencode(share) + b"/" + name)
    put(os.fsencode(share) + b"/" + name + b"/inside", b"x")
    server = e2e.serve({"s": share})
    client = opened(server)
    (result,) = ops(client, ["rmdir", name, None, None])  # not empty: an io error
    assert result[0] == "io" and "caf\\xe9" in result[1], result
    assert listed_names(client) == {name}  # the connection goes on
    client.close()


def test_directories_swapped_for_symlinks_during_pushes_are_skipped(
    e2e: E2E, outside: Path
) -> None:
    """While pushes run, directories of the source keep turning into symlinks to the
    outside and back. Whatever a scan or a read meets is skipped or sent as what it is
    (a link): a push never fails as a whole, never follows the link, never leaves a
    traceback."""
    src, share = e2e.tmp / "src", e2e.tmp / "share"
    for n in range(30):
        put(src / f"d{n}" / "f.txt", f"file {n}\n".encode() * 200)
    share.mkdir()
    server = e2e.serve({"s": share})
    stop = threading.Event()

    def flip() -> None:
        rounds = 0
        while not stop.is_set():
            rounds += 1
            for n in range(0, 30, 3):
                d = src / f"d{n}"
                with contextlib.suppress(OSError):
                    if d.is_symlink():
                        # changed content: the next scan must read it, through `d`
                        put(src / f"keep{n}" / "f.txt", f"round {rounds}\n".encode() * 300)
                        d.unlink()
                        os.rename(src / f"keep{n}", d)
                    else:
                        os.rename(d, src / f"keep{n}")
                        os.symlink(outside, d)

    flipper = threading.Thread(target=flip)
    flipper.start()
    try:
        for _ in range(8):
            result = e2e.push(src, server.url("s"))
            assert result.returncode in (0, 3) and "Traceback" not in result.stderr, result
    finally:
        stop.set()
        flipper.join(10)
    assert not any(p.name == "secret.txt" for p in share.rglob("*"))
    assert "Traceback" not in server.log() and "internal error" not in server.log()


def test_batches_a_peer_never_answers_hold_little_memory(e2e: E2E) -> None:
    """A read-only peer names 256 files of 60 KB in each of 16 ``gets`` and never sends
    the verdicts: the server reads at most a batch's worth of each (1.06 MiB, not 15 MB),
    serves 8 of them at once (the others wait their turn), and still serves others."""
    import random

    from rdc.transfer.serving import BATCHES_AT_ONCE

    share = e2e.tmp / "share"
    rng = random.Random(3)
    names = [f"f{i:03}".encode() for i in range(256)]
    for name in names:  # (the pure-Python chunker is slow: there, only the count counts)
        put(share / "big" / os.fsdecode(name), rng.randbytes(scaled(60_000, 3_000)))
    server = e2e.serve({"s": share})
    client = RawClient(server.port, timeout=60)
    assert client.hello()["t"] == "welcome"
    client.open("s", write=False)
    assert len(listed_names(client, b"big")) == 256  # (the open signed them all)
    baseline = rss(server)
    files = [[b"big/" + name, None] for name in names]
    asked = [client.request("gets", files=files) for _ in range(16)]
    offered = set()
    client.sock.settimeout(scaled(3, 10))  # after the last answer, this long for more
    with contextlib.suppress(TimeoutError, socket.timeout):
        while len(offered) < len(asked):
            batch = client.receive()
            assert batch is not None, "the server closed the connection"
            offered |= {message["id"] for message in batch if message["t"] == "offers"}
    assert len(offered) == BATCHES_AT_ONCE
    assert rss(server) < baseline + (48 << 20)  # 8 x 15 MB if each held its files
    handshaken(server).close()  # others are served meanwhile
    client.close()
