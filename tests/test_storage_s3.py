"""The storage contract on `S3Store` against a real SeaweedFS, and the S3 edges: clear
errors for a wrong endpoint, bucket or credential, retries of throttling and server errors
(against a scripted HTTP server), bucket creation."""

from __future__ import annotations

import http.server
import os
import threading
import time
from collections.abc import Iterator

import pytest

from rdc.storage import (
    ObjectNotFound,
    Store,
    StoreAccessDenied,
    StoreError,
    StoreMissing,
    StoreUnavailable,
    open_store,
)
from rdc.storage.s3 import S3Store
from rdc.storage.s3config import S3Credentials

from .seaweedfs import ACCESS_KEY, CREDENTIALS, SECRET_KEY, SeaweedFS, credentials_env
from .storage_contract import StoreContract, listed

# The session fixture `seaweedfs`, registered once for every module that names it.
pytest_plugins = ["tests.seaweedfs_plugin"]


@pytest.fixture
def bucket(seaweedfs: SeaweedFS) -> str:
    """The URL of the session server's bucket."""
    return seaweedfs.url()


def fresh_prefix(bucket: str) -> str:
    return f"{bucket}/t{os.urandom(6).hex()}"


class TestS3Store(StoreContract):
    # A SeaweedFS conditional PUT that loses a race answers 412 after up to a second per
    # other racer (it waits on a lock); AWS answers at once. Fewer racers keep this short.
    race_rounds, racers = 3, 4

    @pytest.fixture
    def store(self, bucket: str) -> Store:
        return S3Store(fresh_prefix(bucket), credentials=CREDENTIALS)


# ---------------------------------------------------------------- against SeaweedFS


def test_open_store_takes_credentials_from_the_environment(
    bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in credentials_env().items():
        monkeypatch.setenv(key, value)
    store = open_store(fresh_prefix(bucket))
    assert isinstance(store, S3Store)
    store.put("config", b"c")
    assert store.get("config") == b"c"


def test_a_prefix_confines_the_store(bucket: str) -> None:
    outer = S3Store(fresh_prefix(bucket), credentials=CREDENTIALS)
    inner = S3Store(f"{outer.location}/inner", credentials=CREDENTIALS)
    inner.put("x", b"1")
    outer.put("y", b"2")
    assert listed(outer) == {"inner/x": 1, "y": 1}
    assert listed(inner) == {"x": 1}
    with pytest.raises(ObjectNotFound):
        inner.get("y")


def test_wrong_bucket_is_store_missing_and_create_makes_it(seaweedfs: SeaweedFS) -> None:
    name = f"rdc-new-{os.urandom(4).hex()}"
    with pytest.raises(StoreMissing) as caught:
        S3Store(seaweedfs.url(name), credentials=CREDENTIALS)
    assert str(caught.value) == f"{seaweedfs.url(name)}: no bucket {name}"
    assert caught.value.exit_code == 1
    store = S3Store(seaweedfs.url(name, "repo"), credentials=CREDENTIALS, create=True)
    store.put("config", b"made")
    again = S3Store(seaweedfs.url(name, "repo"), credentials=CREDENTIALS, create=True)
    assert again.get("config") == b"made"


@pytest.mark.parametrize(
    ("key", "secret", "reason"),
    [
        (ACCESS_KEY, "wrong-secret", "the secret key does not match the access key"),
        ("unknown-key", SECRET_KEY, "the access key is unknown to the server"),
    ],
)
def test_wrong_credentials_are_access_denied(
    bucket: str, key: str, secret: str, reason: str
) -> None:
    with pytest.raises(StoreAccessDenied) as caught:
        S3Store(bucket, credentials=S3Credentials(key, secret, source="the test"))
    assert str(caught.value) == (
        f"{bucket}: access denied: {reason} (access key {key} from the test)"
    )
    assert caught.value.exit_code == 4
    assert secret not in str(caught.value)


def test_seaweedfs_honours_conditional_create(bucket: str) -> None:
    # The probe behind `capabilities` leaves nothing behind.
    store = S3Store(fresh_prefix(bucket), credentials=CREDENTIALS)
    assert store.capabilities.exclusive_create
    assert listed(store) == {}


def test_keys_that_are_not_object_names_are_not_listed(bucket: str) -> None:
    prefix = fresh_prefix(bucket)
    foreign = S3Store(prefix.rsplit("/", 1)[0], credentials=CREDENTIALS)
    import obstore  # a key no Store can write, put there by another tool

    obstore.put(foreign._store, f"{prefix.rsplit('/', 1)[1]}/Not A Name", b"x")
    store = S3Store(prefix, credentials=CREDENTIALS)
    store.put("ok", b"1")
    assert listed(store) == {"ok": 1}


# ---------------------------------------------------------------- no server, wrong server


def test_nothing_listening_is_store_unavailable_quickly() -> None:
    import socket

    with socket.socket() as s:  # a port that refuses connections
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        began = time.monotonic()
        with pytest.raises(StoreUnavailable) as caught:
            S3Store(f"s3://127.0.0.1:{port}/bucket", credentials=CREDENTIALS)
    assert time.monotonic() - began < 10
    assert str(caught.value).startswith(
        f"s3://127.0.0.1:{port}/bucket: cannot reach the store: Connection refused"
    )
    assert caught.value.exit_code == 5


class ScriptedS3(http.server.ThreadingHTTPServer):
    """An HTTP server on 127.0.0.1 that answers requests from a script of (status, S3
    error code) pairs, then with 200 and `body`; it records each request's method."""

    daemon_threads = True

    def __init__(self, body: bytes = b"payload") -> None:
        super().__init__(("127.0.0.1", 0), _ScriptedHandler)
        self.script: list[tuple[int, str]] = []
        self.requests: list[str] = []
        self.body = body
        threading.Thread(target=self.serve_forever, args=(0.05,), daemon=True).start()

    def url(self) -> str:
        return f"s3://127.0.0.1:{self.server_address[1]}/bucket/prefix"


class _ScriptedHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ScriptedS3

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self.server.requests.append(self.command)
        if self.server.script:
            status, code = self.server.script.pop(0)
            body = (f"<?xml version='1.0'?><Error><Code>{code}</Code>"
                    f"<Message>scripted {code}</Message></Error>").encode()
        elif "list-type" in self.path:
            status, body = 200, (b"<?xml version='1.0'?><ListBucketResult><Name>bucket</Name>"
                                 b"<KeyCount>0</KeyCount><IsTruncated>false</IsTruncated>"
                                 b"</ListBucketResult>")
        else:
            status, body = 200, self.server.body
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("ETag", '"e"')
        self.send_header("Last-Modified", "Mon, 23 Nov 2026 10:00:00 GMT")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_PUT = do_HEAD = do_POST = do_DELETE = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def scripted() -> Iterator[ScriptedS3]:
    server = ScriptedS3()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def quick_store(server: ScriptedS3, retries: int = 4) -> S3Store:
    store = S3Store(server.url(), credentials=CREDENTIALS, retries=retries, retry_seconds=20,
                    first_backoff=0.01)
    server.requests.clear()
    return store


@pytest.mark.parametrize(
    ("status", "code"),
    [(503, "SlowDown"), (429, "TooManyRequests"), (500, "InternalError"),
     (502, "BadGateway")],
)
def test_transient_errors_are_retried(scripted: ScriptedS3, status: int, code: str) -> None:
    store = quick_store(scripted)
    scripted.script = [(status, code)] * 3
    assert store.get("x") == b"payload"
    assert scripted.requests == ["GET"] * 4
    scripted.script = [(status, code)] * 2
    store.put("x", b"data")
    assert scripted.requests[4:] == ["PUT"] * 3


def test_retries_are_bounded(scripted: ScriptedS3) -> None:
    store = quick_store(scripted, retries=2)
    scripted.script = [(503, "SlowDown")] * 10
    with pytest.raises(StoreUnavailable) as caught:
        store.get("x")
    assert scripted.requests == ["GET"] * 3
    assert str(caught.value) == (
        f"{scripted.url()}: cannot reach the store: SlowDown: scripted SlowDown (tried 3 times)"
    )


@pytest.mark.parametrize(
    ("status", "code", "error"),
    [(403, "AccessDenied", StoreAccessDenied), (400, "InvalidRequest", StoreError),
     (404, "NoSuchKey", ObjectNotFound), (404, "NoSuchBucket", StoreMissing)],
)
def test_permanent_errors_are_not_retried(
    scripted: ScriptedS3, status: int, code: str, error: type[StoreError]
) -> None:
    store = quick_store(scripted)
    scripted.script = [(status, code)]
    with pytest.raises(error) as caught:
        store.get("x")
    assert type(caught.value) is error
    assert scripted.requests == ["GET"]
    assert "Traceback" not in str(caught.value) and "\n" not in str(caught.value)


def test_a_server_without_conditional_writes_is_detected(scripted: ScriptedS3) -> None:
    # This server ignores If-None-Match (every PUT succeeds): exclusive puts are refused.
    store = quick_store(scripted)
    assert not store.capabilities.exclusive_create
    assert scripted.requests[:2] == ["PUT", "PUT"]
    with pytest.raises(NotImplementedError):
        store.put("locks/l", b"", exclusive=True)
