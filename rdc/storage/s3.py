"""`S3Store`: a store in an S3 bucket (AWS or any S3-compatible service), through obstore.

obstore (Rust's object_store) does the HTTP: it releases the GIL for the whole request, so
worker threads transfer in parallel without slowing rdc's own Python threads, and it
retries what is transient (5xx including 503 SlowDown, 429, refused, reset and timed-out
connections, and a GET body cut short, resumed by range) with exponential backoff and
jitter, bounded by `RETRIES` and `RETRY_SECONDS`. This module turns its exceptions into the
contract's errors and adds what object_store leaves out: the open-time check, bucket
creation, and the probe for conditional writes.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import obstore
from obstore.exceptions import (
    AlreadyExistsError,
    BaseError,
    NotFoundError,
    PermissionDeniedError,
    PreconditionError,
    UnauthenticatedError,
)
from obstore.store import S3Store as _ObjectStore

from rdc.storage.base import Capabilities, ObjectInfo, Store, is_name
from rdc.storage.errors import (
    ObjectExists,
    ObjectNotFound,
    StoreAccessDenied,
    StoreError,
    StoreMissing,
    StoreUnavailable,
)
from rdc.storage.s3config import S3Credentials, S3Location, find_credentials, parse_s3_url

# Single PUT up to this size; above it, a multipart upload of PART_SIZE parts, PARTS_AT_ONCE
# of them in flight (AWS: parts of 5 MiB to 5 GiB, at most 10,000).
MULTIPART_THRESHOLD = 16 << 20
PART_SIZE = 8 << 20
PARTS_AT_ONCE = 4
# Retries of one request, with "decorrelated jitter": each delay is drawn between
# BACKOFF_FIRST and BACKOFF_BASE times the last one, at most BACKOFF_MAX (so delays grow
# about 1.5x a step on average: a factor of 2 would hardly grow). Given up after RETRIES
# retries or RETRY_SECONDS from the first attempt, whichever comes first: about 20 s to
# a minute, enough to ride out a restarting server or a short outage.
RETRIES = 10
RETRY_SECONDS = 60.0
BACKOFF_FIRST, BACKOFF_BASE, BACKOFF_MAX = 0.2, 3, 15.0
# A connection must open within CONNECT_SECONDS; a response may stall for READ_SECONDS;
# one request (a part, a GET) may take REQUEST_SECONDS in all.
CONNECT_SECONDS = 10.0
READ_SECONDS = 60.0
REQUEST_SECONDS = 600.0
# The open-time check and the conditional-write probe give up fast: a wrong endpoint
# should say so in seconds, not after a minute of retries.
QUICK_RETRIES = 2
# Not a valid object name (upper case), so it never meets a caller's object.
PROBE_NAME = "PROBE-exclusive-create-{}"

_STATUS = re.compile(r"status code: (\d{3})")
_CODE = re.compile(r"<Code>([^<]*)</Code>")
_MESSAGE = re.compile(r"<Message>([^<]*)</Message>")
_OS_MESSAGE = re.compile(r'message: "([^"]+)"')
_RETRIES = re.compile(r"after (\d+) retries")
_HTTP_KIND = re.compile(r"HttpError \{\s*kind: (\w+)")
# object_store's HttpErrorKind, when no OS error says more.
_KIND_TEXT = {
    "Connect": "cannot connect",
    "Timeout": "timed out",
    "Interrupted": "the connection was closed midway",
    "Request": "the request could not be sent",
    "Decode": "the response was garbled",
}
_NOT_FOUND = (NotFoundError, FileNotFoundError)
_DENIED_CODES = {
    "InvalidAccessKeyId": "the access key is unknown to the server",
    "SignatureDoesNotMatch": "the secret key does not match the access key",
    "ExpiredToken": "the session token has expired",
    "InvalidToken": "the session token is not valid",
}


class S3Store(Store):
    """Objects in `BUCKET` under `PREFIX/`, at an S3 endpoint.

    Opening checks the bucket with one listing request, so a wrong endpoint, bucket or
    credential fails here with a one-line error: `StoreUnavailable`, `StoreMissing` (with
    `create`, a missing bucket is made instead) or `StoreAccessDenied`. Conditional
    creation (If-None-Match) is probed the first time `capabilities` is read.
    """

    def __init__(
        self,
        location: S3Location | str,
        *,
        credentials: S3Credentials | None = None,
        create: bool = False,
        multipart_threshold: int = MULTIPART_THRESHOLD,
        part_size: int = PART_SIZE,
        retries: int = RETRIES,
        retry_seconds: float = RETRY_SECONDS,
        first_backoff: float = BACKOFF_FIRST,
    ) -> None:
        self.where = parse_s3_url(location) if isinstance(location, str) else location
        self.location = self.where.url
        self.credentials = credentials or find_credentials(self.location)
        self.multipart_threshold = multipart_threshold
        self.part_size = part_size
        self._first_backoff = first_backoff
        self._store = self._object_store(self.where.prefix, retries, retry_seconds)
        self._quick = self._object_store(self.where.prefix, min(retries, QUICK_RETRIES), 5.0)
        self._capabilities: Capabilities | None = None
        self._probe_lock = threading.Lock()
        self._check(create)

    def _object_store(self, prefix: str, retries: int, retry_seconds: float) -> _ObjectStore:
        return _ObjectStore(
            self.where.bucket,
            prefix=prefix or None,
            **self._connection(),
            client_options={
                "allow_http": self.where.endpoint.startswith("http:"),
                "connect_timeout": timedelta(seconds=CONNECT_SECONDS),
                "read_timeout": timedelta(seconds=READ_SECONDS),
                "timeout": timedelta(seconds=REQUEST_SECONDS),
            },
            retry_config={
                "max_retries": retries,
                "retry_timeout": timedelta(seconds=retry_seconds),
                "backoff": {
                    "init_backoff": timedelta(seconds=self._first_backoff),
                    "max_backoff": timedelta(seconds=BACKOFF_MAX),
                    "base": BACKOFF_BASE,
                },
            },
        )

    def _connection(self) -> dict[str, Any]:
        """Endpoint and credentials, every one given, so that obstore takes nothing from
        its own reading of the environment."""
        creds = self.credentials
        settings: dict[str, Any] = {
            "endpoint": self.where.endpoint,
            "region": creds.region,
            "access_key_id": creds.access_key_id,
            "secret_access_key": creds.secret_access_key,
            "virtual_hosted_style_request": False,
        }
        if creds.session_token:
            settings["token"] = creds.session_token
        return settings

    # ------------------------------------------------------------ opening

    def _check(self, create: bool) -> None:
        """One cheap request that fails the way a wrong URL or credential would."""
        try:
            obstore.list_with_delimiter(self._quick, None)
        except (BaseError, FileNotFoundError) as exc:
            error = self._error(exc, "", "list")
            if not (create and isinstance(error, StoreMissing)):
                raise error from None
            self._create_bucket()

    def _create_bucket(self) -> None:
        """Make the bucket: object_store has no call for it, so a presigned CreateBucket
        request (`PUT /BUCKET/`) goes through urllib."""
        bare = _ObjectStore(
            self.where.bucket,
            **self._connection(),
            client_options={"allow_http": self.where.endpoint.startswith("http:")},
        )
        url = obstore.sign(bare, "PUT", "", timedelta(minutes=5))
        body = b""
        if self.credentials.region != "us-east-1":
            body = (
                "<CreateBucketConfiguration><LocationConstraint>"
                f"{self.credentials.region}</LocationConstraint></CreateBucketConfiguration>"
            ).encode()
        request = urllib.request.Request(url, data=body, method="PUT")
        try:
            with urllib.request.urlopen(request, timeout=CONNECT_SECONDS + READ_SECONDS):
                pass
        except urllib.error.HTTPError as exc:
            text = exc.read().decode("utf-8", "replace")
            if "BucketAlreadyOwnedByYou" in text:
                return
            raise self._error(_HttpFailure(f"status code: {exc.code} {text}"), "",
                              f"create bucket {self.where.bucket}") from None
        except OSError as exc:
            raise StoreUnavailable(
                location=self.location, message=str(getattr(exc, "reason", exc))
            ) from None

    @property
    def capabilities(self) -> Capabilities:
        with self._probe_lock:
            if self._capabilities is None:
                self._capabilities = Capabilities(
                    exclusive_create=self._probe_exclusive_create(), connections=8
                )
            return self._capabilities

    def _probe_exclusive_create(self) -> bool:
        """Whether the server honours If-None-Match: * (AWS since 2024, SeaweedFS, MinIO;
        not every S3 clone): create an object twice; the second must be refused."""
        probe = PROBE_NAME.format(secrets.token_hex(8))
        try:
            obstore.put(self._quick, probe, b"", mode="create", use_multipart=False)
            try:
                obstore.put(self._quick, probe, b"", mode="create", use_multipart=False)
            except (AlreadyExistsError, PreconditionError):
                return True
            except BaseError:
                return False  # e.g. 501 Not Implemented for the header
            return False  # the header was ignored: a second create overwrote the first
        except BaseError as exc:
            if _status(str(exc)) in (400, 501):
                return False
            raise self._error(exc, probe, "probe") from None
        finally:
            with contextlib.suppress(BaseError, FileNotFoundError):
                obstore.delete(self._quick, probe)

    # ------------------------------------------------------------ errors

    def _call(self, doing: str, name: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (BaseError, FileNotFoundError) as exc:
            raise self._error(exc, name, doing) from None

    def _error(self, exc: Exception, name: str, doing: str) -> StoreError:
        """The contract's error for an obstore exception met while `doing` `name`."""
        text = str(exc)
        status = _status(text)
        code = _first(_CODE, text)
        detail = ": ".join(x for x in (code, _first(_MESSAGE, text)) if x)
        if code == "NoSuchBucket":
            return StoreMissing(location=self.location, message=f"no bucket {self.where.bucket}")
        if isinstance(exc, _NOT_FOUND) or status == 404:
            return ObjectNotFound(location=self.location, name=name)
        if isinstance(exc, (AlreadyExistsError, PreconditionError)):
            return ObjectExists(location=self.location, name=name)
        if isinstance(exc, (PermissionDeniedError, UnauthenticatedError)) or status in (401, 403):
            reason = _DENIED_CODES.get(code or "", detail or f"HTTP {status}")
            return StoreAccessDenied(
                location=self.location,
                message=f"{reason} (access key {self.credentials.access_key_id} from "
                f"{self.credentials.source})",
            )
        retried = _first(_RETRIES, text)
        tries = f" (tried {int(retried) + 1} times)" if retried else ""
        what = f"{doing} {name}".strip()
        if status is None:
            transport = _transport_failure(text)
            if transport:
                return StoreUnavailable(location=self.location, message=f"{transport}{tries}")
            first_line = text.split("\n", 1)[0]
            return StoreError(location=self.location, message=f"{what}: {first_line}")
        if status >= 500 or status in (408, 429):
            reason = detail or f"HTTP {status}"
            return StoreUnavailable(location=self.location, message=f"{reason}{tries}")
        return StoreError(location=self.location, message=f"{what}: HTTP {status} {detail}")

    # ------------------------------------------------------------ the contract

    def _put(self, name: str, data: memoryview, exclusive: bool) -> None:
        if exclusive:
            self._call("create", name, obstore.put, self._store, name, data,
                       mode="create", use_multipart=False)
            return
        self._call("put", name, obstore.put, self._store, name, data,
                   use_multipart=len(data) > self.multipart_threshold,
                   chunk_size=self.part_size, max_concurrency=PARTS_AT_ONCE)

    def _put_file(self, name: str, path: str) -> None:
        size = os.stat(path).st_size  # a missing file is the caller's OSError, as documented
        self._call("put", name, obstore.put, self._store, name, Path(path),
                   use_multipart=size > self.multipart_threshold,
                   chunk_size=self.part_size, max_concurrency=PARTS_AT_ONCE)

    def _get(self, name: str) -> bytes:
        return bytes(self._call("get", name, lambda: obstore.get(self._store, name).bytes()))

    def _get_range(self, name: str, offset: int, length: int) -> bytes:
        try:
            data = obstore.get_range(self._store, name, start=offset, length=length)
        except (BaseError, FileNotFoundError) as exc:
            if _status(str(exc)) == 416:
                return b""  # starts at or past the end: the contract's ShortObject
            raise self._error(exc, name, "get") from None
        return bytes(data)

    def _stat(self, name: str) -> ObjectInfo:
        meta = self._call("stat", name, obstore.head, self._store, name)
        return ObjectInfo(name, int(meta["size"]))

    def _list(self, prefix: str) -> Iterator[ObjectInfo]:
        # object_store lists by directory (it appends the '/'), as the contract does.
        pages = self._call("list", prefix, obstore.list, self._store, prefix or None,
                           chunk_size=1000)
        while True:
            page = self._call("list", prefix, next, pages, None)
            if page is None:
                return
            for meta in page:
                if is_name(meta["path"]):  # skip probes and foreign keys
                    yield ObjectInfo(meta["path"], int(meta["size"]))

    def _delete(self, name: str) -> None:
        try:
            obstore.delete(self._store, name)
        except (BaseError, FileNotFoundError) as exc:
            error = self._error(exc, name, "delete")
            if not isinstance(error, ObjectNotFound):
                raise error from None


class _HttpFailure(Exception):
    """A failed request made without obstore, in the shape of obstore's message."""


def _first(pattern: re.Pattern[str], text: str) -> str | None:
    match = pattern.search(text)
    return match.group(1) if match else None


def _status(text: str) -> int | None:
    found = _first(_STATUS, text)
    return int(found) if found else None


def _transport_failure(text: str) -> str | None:
    """What went wrong below HTTP, from object_store's error text ("Connection refused",
    "timed out", ...), or None if the failure was not the connection's."""
    kind = _first(_HTTP_KIND, text)
    if kind is None:
        return None
    return _first(_OS_MESSAGE, text) or _KIND_TEXT.get(kind, f"HTTP {kind.lower()} error")
