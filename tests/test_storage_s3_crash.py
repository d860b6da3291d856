"""The S3 store killed (SIGKILL) in the middle of large writes and restarted on the same
data directory: each object is absent, old or whole, never partial, and the store works
again. Each write goes through its own throttling proxy, which makes "the middle" certain:
the kill comes when part, not all, of every object has crossed.

These tests kill the session's SeaweedFS and leave it running again (restarted within
the test, or by the `restarted` fixture if the test failed half-way)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from rdc.storage import ObjectNotFound, StoreUnavailable
from rdc.storage.s3 import MULTIPART_THRESHOLD, S3Store

from .seaweedfs import CREDENTIALS, SeaweedFS, SlowProxy
from .storage_contract import blob, listed

# The session fixture `seaweedfs`, registered once for every module that names it.
pytest_plugins = ["tests.seaweedfs_plugin"]

RATE = 16 << 20  # bytes per second per connection through a proxy while a put is caught
PUT_SECONDS = 120.0  # a put, retries across the restart included, ends within this
SINGLE_SIZE = MULTIPART_THRESHOLD - 4096  # one PUT request
MULTIPART_SIZE = MULTIPART_THRESHOLD + (8 << 20)  # three parts, sent at once


@pytest.fixture
def restarted(seaweedfs: SeaweedFS) -> Iterator[SeaweedFS]:
    """The session's server, running again after the test whatever happened in it."""
    try:
        yield seaweedfs
    finally:
        if seaweedfs.process is None:
            seaweedfs.start()


@dataclass
class CaughtPut:
    """One put through its own SlowProxy, to be caught in the middle."""

    server: SeaweedFS
    prefix: str
    name: str
    data: bytes
    options: dict[str, object] = field(default_factory=dict)
    proxy: SlowProxy = field(init=False)
    store: S3Store = field(init=False)
    outcome: list[BaseException | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.proxy = SlowProxy(("127.0.0.1", self.server.ports["s3"]))
        self.store = S3Store(
            f"s3://127.0.0.1:{self.proxy.port}/{self.server.bucket}/{self.prefix}",
            credentials=CREDENTIALS, **self.options,  # type: ignore[arg-type]
        )
        self.thread = threading.Thread(target=self._put, daemon=True)

    def _put(self) -> None:
        try:
            self.store.put(self.name, self.data)
        except BaseException as exc:
            self.outcome.append(exc)
        else:
            self.outcome.append(None)

    @property
    def midway(self) -> bool:
        return self.proxy.forwarded >= len(self.data) * 0.4

    def error(self) -> BaseException | None:
        self.thread.join(PUT_SECONDS)
        assert not self.thread.is_alive(), f"the put did not end within {PUT_SECONDS} s"
        self.proxy.close()
        return self.outcome[0]


def kill_during(server: SeaweedFS, puts: list[CaughtPut]) -> None:
    """Start the puts, SIGKILL the server once 40% of every object has crossed its proxy
    (and none has crossed whole), then restart the server on the same data directory."""
    for put in puts:
        put.proxy.rate = RATE
        # (Without a hold, a loaded machine let the three parts of the multipart upload
        # cross whole while the single PUT was not yet at 40%.)
        put.proxy.hold_from = int(len(put.data) * 0.6)
        put.thread.start()
    deadline = time.monotonic() + 60
    while not all(put.midway for put in puts):
        for put in puts:
            assert put.thread.is_alive(), f"a put ended before the kill: {put.outcome}"
        assert time.monotonic() < deadline, "the puts did not get going"
        time.sleep(0.005)
    server.kill()
    try:
        for put in puts:
            assert put.proxy.forwarded < len(put.data), "a whole object crossed before the kill"
    finally:
        for put in puts:
            put.proxy.rate = put.proxy.hold_from = None
        server.start()


def test_puts_killed_midway_leave_the_old_object_or_none(restarted: SeaweedFS) -> None:
    # Without retries, a single PUT and a multipart upload both fail when the store dies,
    # with the one-line error of a lost store; after the restart the single PUT's name
    # still holds its old object, whole, and the parts of the multipart upload are no
    # object at all.
    single = CaughtPut(restarted, "crash-single", "data/pack", blob(SINGLE_SIZE, 11),
                       {"retries": 0})
    multipart = CaughtPut(restarted, "crash-multipart", "data/big", blob(MULTIPART_SIZE, 12),
                          {"retries": 0})
    old = blob(5000, 10)
    single.store.put("data/pack", old)
    kill_during(restarted, [single, multipart])
    for put in (single, multipart):
        error = put.error()
        assert isinstance(error, StoreUnavailable), error
        assert error.exit_code == 5
    store = S3Store(restarted.url(prefix="crash-single"), credentials=CREDENTIALS)
    assert store.get("data/pack") == old
    assert store.stat("data/pack").size == len(old)
    assert listed(store) == {"data/pack": len(old)}
    store = S3Store(restarted.url(prefix="crash-multipart"), credentials=CREDENTIALS)
    with pytest.raises(ObjectNotFound):
        store.stat("data/big")
    assert listed(store) == {}
    # The store works again: the same puts now complete.
    store.put("data/big", multipart.data)
    assert store.get("data/big") == multipart.data


def test_a_multipart_put_rides_out_the_restart_with_retries(restarted: SeaweedFS) -> None:
    # With a retry budget longer than the restart, the put carries on across it (the
    # failed parts are sent again) and completes: the object is whole.
    put = CaughtPut(restarted, "crash-retried", "data/big", blob(MULTIPART_SIZE, 13),
                    {"retries": 30, "retry_seconds": 90})
    kill_during(restarted, [put])
    assert put.error() is None
    store = S3Store(restarted.url(prefix="crash-retried"), credentials=CREDENTIALS)
    assert store.get("data/big") == put.data
    assert listed(store) == {"data/big": MULTIPART_SIZE}
