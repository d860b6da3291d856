"""End-to-end test support: the real ``rdc serve`` process, the real ``rdc`` command, trees
compared entry by entry, and a hand-rolled client for the wire.

Every wait is bounded: processes get timeouts, readiness and other conditions are polled
against a deadline (`wait_for`), never slept for blindly.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import re
import signal
import socket
import stat
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import blake3
import msgpack
import pytest

from rdc.params import FORMAT

TOKEN = "e2e-token-0123456789abcdef"
OTHER_TOKEN = "e2e-token-ffffffffffffffff"
RUN_SECONDS = 60  # one rdc command, at most
START_SECONDS = 20  # rdc serve until it logs "listening on"
STOP_SECONDS = 10  # rdc serve after SIGTERM/SIGINT
RDC = [sys.executable, "-m", "rdc_client"]
LISTENING = re.compile(r"listening on (\S+):(\d+)")
TEMP = re.compile(rb"^\.rdc-tmp-[0-9a-f]{16}-")


def wait_for(
    condition: Callable[[], Any], timeout: float, what: str, interval: float = 0.01
) -> Any:
    """Poll ``condition`` until it returns something truthy (returned), or fail the test
    after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


# ---------------------------------------------------------------- processes


def command_env(tmp: Path) -> dict[str, str]:
    """The environment of every rdc process: the client's index under ``tmp``, a UTF-8
    locale as users have it (en_US.UTF-8 and the like give Python a strict stdout; C.UTF-8
    alone would not), and RDC_PUREPYTHON passed through from the test run."""
    env = dict(os.environ)
    env["XDG_CACHE_HOME"] = str(tmp / "cache")
    env["XDG_STATE_HOME"] = str(tmp / "state-home")  # sync bases, remembered folder markers
    env["LC_ALL"] = "C.UTF-8"
    env["PYTHONIOENCODING"] = "utf-8:strict"
    env.pop("RDC_TOKEN", None)
    env.pop("PYTHONUTF8", None)
    return env


@dataclass
class Result:
    """One finished ``rdc`` command."""

    args: list[str]
    returncode: int
    stdout: str
    stderr: str
    stats: dict[str, Any] | None = None
    raw_stdout: bytes = b""

    def __str__(self) -> str:
        return (f"rdc {' '.join(self.args)} -> {self.returncode}\n"
                f"--- stdout\n{self.stdout}--- stderr\n{self.stderr}")

    def ok(self) -> Result:
        assert self.returncode == 0, str(self)
        assert "Traceback" not in self.stderr, str(self)
        return self


class Server:
    """One ``rdc serve`` process, its log in a file (read with `log`)."""

    def __init__(
        self, args: list[str], env: dict[str, str], log_path: Path, prefix: list[str]
    ) -> None:
        self.args = args
        self.log_path = log_path
        self.host = "127.0.0.1"
        self.port = 0
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [*prefix, *RDC, "serve", *args], stdin=subprocess.DEVNULL, stdout=self._log,
            stderr=self._log, env=env,
        )
        try:
            found = wait_for(self._listening, START_SECONDS, "rdc serve to listen")
        except BaseException:  # (pytest.fail raises a BaseException)
            self.process.kill()
            self.process.wait(STOP_SECONDS)
            self._log.close()
            raise
        self.host, self.port = found.group(1), int(found.group(2))

    def _listening(self) -> re.Match[str] | None:
        found = LISTENING.search(self.log())
        if found is None and self.process.poll() is not None:
            pytest.fail(f"rdc serve exited with {self.process.returncode}:\n{self.log()}")
        return found

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def url(self, share: str, path: str = "") -> str:
        return f"rdc://{self.host}:{self.port}/{share}" + (f"/{path}" if path else "")

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def stop(self, signum: int = signal.SIGTERM, timeout: float = STOP_SECONDS) -> int:
        """Send ``signum`` and wait for the exit; its status."""
        if self.running:
            self.process.send_signal(signum)
        try:
            status = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(STOP_SECONDS)
            pytest.fail(f"rdc serve did not exit within {timeout} s of signal {signum}")
        self._log.close()
        return status

    def kill(self) -> None:
        self.stop(signal.SIGKILL)


class E2E:
    """A test's world: a temporary directory, the token file, servers and commands."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.env = command_env(tmp)
        self.token_file = tmp / "tokens"
        self.token_file.write_text(f"{TOKEN}\n")
        self.servers: list[Server] = []
        self._runs = 0
        self.prefix: list[str] = []  # put before every rdc command line
        self.started: list[subprocess.Popen[bytes]] = []

    def unprivileged(self) -> None:
        """Run the rdc processes from now on as an ordinary user would: bound by permission
        bits. As root, that is root without the capabilities that override them."""
        if os.geteuid() != 0:
            return
        self.prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner",
                       "--"]
        try:
            probe = subprocess.run([*self.prefix, "true"], capture_output=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            probe = None
        if probe is None or probe.returncode != 0:
            pytest.skip("cannot drop the capabilities that override permission bits")

    def serve(
        self,
        shares: dict[str, Path] | None = None,
        ro: dict[str, Path] | None = None,
        *extra: str,
        token_file: Path | None = None,
        state: Path | None = None,
    ) -> Server:
        args = ["--listen", "127.0.0.1:0", "--token-file", str(token_file or self.token_file),
                "--state-dir", str(state or self.tmp / "state")]
        for name, path in (shares or {}).items():
            args += ["--share", f"{name}={path}"]
        for name, path in (ro or {}).items():
            args += ["--share-ro", f"{name}={path}"]
        n = len(self.servers)
        server = Server([*args, *extra], self.env, self.tmp / f"serve-{n}.log", self.prefix)
        self.servers.append(server)
        return server

    def rdc(self, *args: str, timeout: float = RUN_SECONDS) -> Result:
        """Run ``rdc ARGS`` to its end."""
        try:
            done = subprocess.run(
                [*self.prefix, *RDC, *args], stdin=subprocess.DEVNULL, capture_output=True,
                env=self.env, timeout=timeout,
            )
        except subprocess.TimeoutExpired as exc:
            pytest.fail(f"rdc {' '.join(args)} still running after {timeout} s: "
                        f"{exc.stderr!r}")
        return Result(list(args), done.returncode, done.stdout.decode(errors="replace"),
                      done.stderr.decode(errors="replace"), raw_stdout=done.stdout)

    def _transfer(self, verb: str, a: str, b: str, extra: tuple[str, ...]) -> Result:
        self._runs += 1
        stats_path = self.tmp / f"stats-{self._runs}.json"
        result = self.rdc(verb, a, b, "--token-file", str(self.token_file),
                          "--stats-json", str(stats_path), *extra)
        if stats_path.exists():
            result.stats = json.loads(stats_path.read_text())
        return result

    def push(self, local: Path, url: str, *extra: str) -> Result:
        return self._transfer("push", str(local), url, extra)

    def pull(self, url: str, local: Path, *extra: str) -> Result:
        return self._transfer("pull", url, str(local), extra)

    def start(self, verb: str, a: str, b: str, *extra: str) -> subprocess.Popen[bytes]:
        """``rdc push|pull`` started, not waited for (the caller reaps it; `close` kills it
        if the test did not get that far)."""
        process = subprocess.Popen(
            [*self.prefix, *RDC, verb, a, b, "--token-file", str(self.token_file), *extra],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=self.env,
        )
        self.started.append(process)
        return process

    def close(self) -> None:
        for process in self.started:
            if process.poll() is None:
                process.kill()
            process.communicate(timeout=STOP_SECONDS)
        for server in self.servers:
            if server.running:
                server.kill()
            print(f"==== {server.log_path.name}\n{server.log()}")


@pytest.fixture
def e2e(tmp_path: Path) -> Iterator[E2E]:
    world = E2E(tmp_path)
    try:
        yield world
    finally:
        world.close()


# ---------------------------------------------------------------- trees


@dataclass(frozen=True, slots=True)
class Node:
    """What a sync must carry over for one entry (the tree's root itself excluded)."""

    kind: str  # "f", "d", "l", or "?" for anything else
    mode: int  # permission bits; 0 for links
    mtime_ns: int
    digest: bytes = b""  # sha256 of a file's content; a link's target

    def __repr__(self) -> str:
        return (f"{self.kind} {self.mode:04o} {self.mtime_ns} "
                f"{self.digest[:8].hex() if self.kind == 'f' else self.digest!r}")


def file_hash(path: Path | bytes | str, dir_fd: int | None = None) -> bytes:
    h = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dir_fd)
    with open(fd, "rb") as f:
        while piece := f.read(1 << 20):
            h.update(piece)
    return h.digest()


MARKER = b".rdc-folder"  # rdc.local.marker.MARKER: each side's own, never synced


def snapshot(root: Path, skip: Callable[[bytes], bool] | None = None) -> dict[bytes, Node]:
    """Every entry below ``root`` by relative path (bytes), with lstat: kind, permission
    bits, mtime_ns, content hash or link target. Links are not followed; directories are
    opened relative to their parents, so paths longer than PATH_MAX are seen too. Folder
    markers are left out: each side has its own."""
    out: dict[bytes, Node] = {}
    stack = [(b"", os.open(root, os.O_RDONLY | os.O_DIRECTORY))]
    try:
        _walk(stack, out, skip)
    finally:
        for _, fd in stack:
            os.close(fd)
    return out


def _walk(
    stack: list[tuple[bytes, int]], out: dict[bytes, Node],
    skip: Callable[[bytes], bool] | None,
) -> None:
    while stack:
        rel_dir, fd = stack.pop()
        try:
            with os.scandir(fd) as entries:
                names = [entry.name for entry in entries]
            for name in map(os.fsencode, names):
                rel = rel_dir + b"/" + name if rel_dir else name
                if name == MARKER or (skip is not None and skip(rel)):
                    continue
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                mode = st.st_mode
                if stat.S_ISDIR(mode):
                    out[rel] = Node("d", stat.S_IMODE(mode), st.st_mtime_ns)
                    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
                    stack.append((rel, os.open(name, flags, dir_fd=fd)))
                elif stat.S_ISREG(mode):
                    out[rel] = Node("f", stat.S_IMODE(mode), st.st_mtime_ns,
                                    file_hash(name, dir_fd=fd))
                elif stat.S_ISLNK(mode):
                    out[rel] = Node("l", 0, st.st_mtime_ns, os.readlink(name, dir_fd=fd))
                else:
                    out[rel] = Node("?", stat.S_IMODE(mode), st.st_mtime_ns)
        finally:
            os.close(fd)


def tree_diff(a: dict[bytes, Node], b: dict[bytes, Node]) -> list[str]:
    lines = []
    for rel in sorted(set(a) | set(b)):
        x, y = a.get(rel), b.get(rel)
        if x != y:
            lines.append(f"{rel!r}: {x!r} != {y!r}")
    return lines


def assert_same_tree(
    a: Path, b: Path, skip: Callable[[bytes], bool] | None = None
) -> dict[bytes, Node]:
    """Both trees hold the same entries with the same kinds, permission bits, mtimes (ns),
    contents and link targets."""
    left = snapshot(a, skip)
    right = snapshot(b, skip)
    diff = tree_diff(left, right)
    assert not diff, f"{a} and {b} differ:\n" + "\n".join(diff[:50])
    return left


def temporaries(root: Path) -> list[bytes]:
    """rdc temporaries anywhere under ``root``."""
    found = []
    for dirpath, dirnames, filenames in os.walk(os.fsencode(root)):
        for name in dirnames + filenames:
            if TEMP.match(name):
                found.append(os.path.join(dirpath, name))
    return found


def write(path: Path | bytes, data: bytes, mode: int | None = None) -> None:
    with open(path, "wb") as f:
        f.write(data)
    if mode is not None:
        os.chmod(path, mode)


def stamp_times(root: Path, seed: int) -> None:
    """Give every entry below ``root`` (links included) its own modification time with
    nanoseconds that no file system rounds to by accident."""
    rng = random.Random(seed)
    for rel in sorted(snapshot(root), key=len, reverse=True):
        ns = rng.randrange(1_000_000_000, 1_700_000_000) * 10**9 + rng.randrange(1, 10**9)
        os.utime(os.path.join(os.fsencode(root), rel), ns=(ns, ns), follow_symlinks=False)


def random_file(path: Path | bytes, size: int, seed: int, piece: int = 8 << 20) -> None:
    """``size`` random bytes from ``seed``, streamed to disk: BLAKE3's output stream keyed
    by the seed (ten times as fast as random.randbytes, which a 256 MiB file notices)."""
    stream = blake3.blake3(f"rdc e2e random {seed}".encode())
    with open(path, "wb") as f:
        for offset in range(0, size, piece):
            f.write(stream.digest(length=min(piece, size - offset), seek=offset))


def edited_copy(src: Path, dst: Path, edits: list[tuple[int, int, bytes]]) -> None:
    """``dst`` = ``src`` with ``edits`` applied, streamed: each edit (sorted by offset)
    removes ``remove`` bytes at ``offset`` of ``src`` and puts ``insert`` there."""
    with open(src, "rb") as i, open(dst, "wb") as o:
        position = 0
        for offset, remove, insert in sorted(edits):
            left = offset - position
            while left:
                piece = i.read(min(left, 8 << 20))
                assert piece, "an edit past the end of the file"
                o.write(piece)
                left -= len(piece)
            o.write(insert)
            i.seek(remove, os.SEEK_CUR)
            position = offset + remove
        while piece := i.read(8 << 20):
            o.write(piece)


def wait_until_stale(root: Path, timeout: float = 15.0) -> None:
    """Wait until every rdc temporary under ``root`` is old enough for ``clean_temporaries``
    to treat it as stale if no live process holds it (rdc.local.fs: FRESH_SECONDS for a regular
    file, TEMP_GRACE_SECONDS for anything else)."""
    from rdc.local.fs import FRESH_SECONDS, TEMP_GRACE_SECONDS

    def stale() -> bool:
        now = time.time()
        for path in temporaries(root):
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            grace = FRESH_SECONDS if stat.S_ISREG(st.st_mode) else TEMP_GRACE_SECONDS
            if now - st.st_ctime <= grace + 0.05:
                return False
        return True

    wait_for(stale, timeout, f"the temporaries under {root} to age", interval=0.05)


# ---------------------------------------------------------------- the wire by hand

HEADER = struct.Struct(">I")
MAX_FRAME = 4 * 1024 * 1024


@dataclass
class RawClient:
    """A client that speaks the framing itself, for sending what ``rdc`` never would."""

    port: int
    host: str = "127.0.0.1"
    timeout: float = 10.0
    sock: socket.socket = field(init=False)
    next_id: int = 1
    _buffer: bytes = b""

    def __post_init__(self) -> None:
        self.sock = socket.create_connection((self.host, self.port), timeout=self.timeout)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_body(self, body: bytes) -> None:
        self.send_raw(HEADER.pack(len(body)) + body)

    def send(self, *messages: dict[str, Any]) -> None:
        self.send_body(msgpack.packb(list(messages), use_bin_type=True))

    def _read(self, n: int) -> bool:
        while len(self._buffer) < n:
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                data = b""
            if not data:
                return False
            self._buffer += data
        return True

    def receive(self) -> list[dict[str, Any]] | None:
        """The messages of the next frame; None at the end of the stream. Compressed
        frames are not expected (this client never asks for zstd)."""
        if not self._read(4):
            return None
        (header,) = HEADER.unpack(self._buffer[:4])
        assert not header & (1 << 31), "a compressed frame, though zstd was not offered"
        if not self._read(4 + header):
            raise AssertionError("the stream ended inside a frame")
        body, self._buffer = self._buffer[4 : 4 + header], self._buffer[4 + header :]
        return msgpack.unpackb(body, raw=False)

    def until_closed(self) -> list[dict[str, Any]]:
        """Every message until the server closes the connection (within the timeout)."""
        out: list[dict[str, Any]] = []
        while (batch := self.receive()) is not None:
            out.extend(batch)
        return out

    def hello(self, token: str = TOKEN, format: str = FORMAT) -> dict[str, Any]:
        self.send({"t": "hello", "proto": [2, 2], "agent": "e2e/0", "features": [],
                   "token": token, "format": format})
        batch = self.receive()
        assert batch is not None, "the server closed the connection after hello"
        return batch[0]

    def request(self, t: str, **fields: Any) -> int:
        conversation = self.next_id
        self.next_id += 1
        self.send({"t": t, "id": conversation, **fields})
        return conversation

    def answer(self, conversation: int) -> list[dict[str, Any]]:
        """Messages of ``conversation`` up to and including its final one (or an error)."""
        out: list[dict[str, Any]] = []
        while True:
            batch = self.receive()
            assert batch is not None, f"connection closed; so far {out!r}"
            for message in batch:
                if message.get("id") in (conversation, None):
                    out.append(message)
                    if message["t"] == "error" or not message.get("more", False):
                        return out

    def open(self, share: str, path: bytes = b"", write: bool = False) -> dict[str, Any]:
        conversation = self.request("open", share=share, path=path, write=write,
                                    create=False, excludes=[])
        (opened,) = self.answer(conversation)
        assert opened["t"] == "opened", opened
        return opened
