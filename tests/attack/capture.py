"""Real sessions to mutate: the real ``rdc`` client runs push, pull, sync and watch against
the real ``rdc serve`` through a recording TCP proxy, in the same run as the fuzzer, so the
captures follow the protocol as it is then.

`capture_sessions` also leaves the share as the fuzzer's template: the state after the
first push, against which the second push's descent replays as it was captured.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rdc.content.signature import signature_of_bytes
from tests.attack.inputs import Frame, Session, Trigger
from tests.attack.wire import Decoder, unpack
from tests.attack.world import World
from tests.e2e_support import RDC, RUN_SECONDS, RawClient

Event = tuple[str, bytes]  # ("C" client to server, or "S"), bytes as the proxy read them


class RecordingProxy:
    """Listens on 127.0.0.1; each accepted connection is forwarded to the server and
    recorded, both directions, in the order the proxy read them."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.recordings: list[list[Event]] = []
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._closed = False
        self._start(self._accept)

    def _start(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.upstream))
            events: list[Event] = []
            with self._lock:
                self.recordings.append(events)
            self._start(self._pump, client, server, "C", events)
            self._start(self._pump, server, client, "S", events)

    def _pump(self, src: socket.socket, dst: socket.socket, direction: str,
              events: list[Event]) -> None:
        try:
            while data := src.recv(65536):
                with self._lock:
                    events.append((direction, data))
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
                with contextlib.suppress(OSError):
                    sock.shutdown(how)

    def close(self) -> None:
        self._closed = True
        self.listener.close()
        for thread in self._threads[1:]:
            thread.join(5)

    def take(self) -> list[list[Event]]:
        """The recordings so far (and forget them)."""
        with self._lock:
            out, self.recordings = self.recordings, []
        return out


def decode(events: list[Event], name: str) -> Session | None:
    """The client's frames of one recorded connection, each with the last server message
    that arrived before its first byte did, if any arrived since the frame before (what
    the client was answering)."""
    client = Decoder()
    server = Decoder()
    seen: list[Trigger] = []
    frames: list[Frame] = []
    marks: list[int] = []
    mark = 0  # server messages seen when the client frame in progress began
    for direction, data in events:
        if direction == "S":
            for _, body in server.feed(data):
                seen += [(m.get("id"), m.get("t")) for m in unpack(body)
                         if isinstance(m, dict)]
            continue
        now = len(seen)
        if not client.buffer:
            mark = now
        done = client.feed(data)
        for i, (squeezed, body) in enumerate(done):
            at = mark if i == 0 else now
            fresh = at > (marks[-1] if marks else 0)
            frames.append(Frame(unpack(body), squeezed, seen[at - 1] if fresh else None))
            marks.append(at)
        if done:
            mark = now
    if not frames:
        return None
    return Session(name, frames, len(seen))


class Capture:
    """Runs real clients through the proxy and keeps their sessions."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.proxy = RecordingProxy(world.port)
        self.sessions: list[Session] = []
        self.local = world.tmp / "local"
        self.local.mkdir(exist_ok=True)

    def url(self, path: str = "", share: str = "s") -> str:
        return self.world.url(path, share, port=self.proxy.port)

    def keep(self, name: str) -> None:
        for n, events in enumerate(self.proxy.take()):
            session = decode(events, f"{name}#{n}")
            if session is not None:
                self.sessions.append(session)

    def rdc(self, name: str, *args: str, token: str = "rw-token", ok: tuple = (0,)) -> None:
        done = subprocess.run(
            [*RDC, *args, "--token-file", str(self.world.tmp / token)],
            stdin=subprocess.DEVNULL, capture_output=True, env=self.world.env,
            timeout=RUN_SECONDS,
        )
        if done.returncode not in ok:
            raise RuntimeError(f"capture {name}: rdc {' '.join(args)} -> {done.returncode}\n"
                               f"{done.stderr.decode(errors='replace')}")
        self.keep(name)

    def watch(self, local: Path, path: str) -> None:
        """``rdc watch`` through the proxy: one change on each side, then Ctrl-C."""
        local.mkdir()
        (local / "first.txt").write_text("first\n")
        process = subprocess.Popen(
            [*RDC, "watch", str(local), self.url(path), "--token-file",
             str(self.world.tmp / "rw-token")],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=self.world.env,
        )
        remote = self.world.share / path
        try:
            wait(lambda: (remote / "first.txt").exists(), "watch's first round")
            (local / "second.txt").write_text("from the client\n")
            wait(lambda: (remote / "second.txt").exists(), "watch to push a change")
            (remote / "third.txt").write_text("from the server's disk\n")
            wait(lambda: (local / "third.txt").exists(), "watch to pull a change")
        finally:
            process.send_signal(signal.SIGINT)
            try:
                process.communicate(timeout=RUN_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                process.communicate()
        self.keep("watch")

    def close(self) -> None:
        self.proxy.close()


def wait(condition: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"capture: timed out waiting for {what}")
        time.sleep(0.02)


@dataclass
class Captured:
    sessions: list[Session]
    contents: dict[bytes, bytes]  # files the clients could offer, by Merkle root


def contents_of(root: Path, into: dict[bytes, bytes]) -> None:
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            path = os.path.join(dirpath, name)
            if os.path.isfile(path) and not os.path.islink(path):
                data = Path(path).read_bytes()
                into[signature_of_bytes(data).root] = data


def capture_sessions(world: World) -> Captured:
    """Push, push again (a delta), pull, pull again, two-way sync, watch and a read-only
    pull, each through the recording proxy; the share is left as the template (after the
    first push), which the second push's descent needs to replay as captured."""
    capture = Capture(world)
    contents: dict[bytes, bytes] = {}
    try:
        project = capture.local / "project"
        shutil.copytree(world.share / "src", project / "src")
        shutil.copytree(world.share / "docs", project / "docs")
        (project / "data").mkdir()
        shutil.copyfile(world.share / "data" / "blob.bin", project / "data" / "blob.bin")
        capture.rdc("push", "push", str(project), capture.url("work"))
        contents_of(project, contents)
        world.save_template()
        capture.rdc("pull", "pull", capture.url(), str(capture.local / "pulled"))
        edit_project(project)
        contents_of(project, contents)
        capture.rdc("push-delta", "push", str(project), capture.url("work"), "--delete")
        edit_share(world.share)
        capture.rdc("pull-delta", "pull", capture.url(), str(capture.local / "pulled"),
                    "--delete")
        two = capture.local / "two"
        shutil.copytree(world.share / "docs", two)
        capture.rdc("sync", "sync", str(two), capture.url("two"))
        (two / "note-01.md").write_text("changed on the client\n")
        (world.share / "two" / "note-02.md").write_text("changed on the server\n")
        (two / "note-03.md").write_text("changed here\n")
        (world.share / "two" / "note-03.md").write_text("and there\n")
        os.rename(two / "note-04.md", two / "moved.md")
        capture.rdc("sync-again", "sync", str(two), capture.url("two"))
        capture.watch(capture.local / "watched", "watched")
        capture.rdc("pull-ro", "pull", capture.url(share="r"), str(capture.local / "ro"),
                    token="ro-token")
    finally:
        capture.close()
    contents_of(two, contents)
    contents_of(capture.local / "watched", contents)
    world.reset_share()
    warm_up(world)
    return Captured(capture.sessions, contents)


def warm_up(world: World) -> None:
    """Watch every share once, so that the server's per-share watchers (an inotify
    descriptor and a pipe each, kept for its lifetime) are part of the baseline."""
    for share in ("s", "r"):
        client = RawClient(world.port, timeout=10)
        try:
            client.hello()
            client.open(share)
            client.request("watch", seq=0)
            client.answer(client.request("list", paths=[b""], hb=8))
        finally:
            client.close()


def edit_project(project: Path) -> None:
    """Edits a second push carries as a delta: scattered bytes in a binary, a line in a
    source, a rename, a new file, a deletion, a mode."""
    blob = project / "data" / "blob.bin"
    data = bytearray(blob.read_bytes())
    for at in range(1000, len(data), max(1, len(data) // 5)):
        data[at : at + 8] = b"EDITED!!"
    blob.write_bytes(bytes(data))
    source = project / "src" / "rdc" / "paths.py"
    source.write_text(source.read_text().replace("MAX_NAME = 255", "MAX_NAME = 255  # edited"))
    os.rename(project / "docs" / "note-05.md", project / "docs" / "renamed.md")
    (project / "docs" / "new.md").write_text("a new note\n")
    (project / "docs" / "note-06.md").unlink()
    os.chmod(project / "src" / "rdc" / "fs.py", 0o600)


def edit_share(share: Path) -> None:
    """Edits on the server's disk that a second pull carries as a delta."""
    blob = share / "data" / "blob.bin"
    data = bytearray(blob.read_bytes())
    data[5000:5010] = b"0123456789"
    blob.write_bytes(bytes(data))
    (share / "docs" / "note-07.md").write_text("rewritten on the server\n")
