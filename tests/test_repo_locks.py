"""Repository locks: shared locks coexist, the exclusive lock excludes every other, stale
locks (a dead holder on this host, or not refreshed for too long) are removed, and a
holder whose lock was removed stops."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rdc.repo import locks, msg
from rdc.repo.errors import RepoLocked
from rdc.repo.locks import Lock
from rdc.storage import LocalStore, MemoryStore, Store


@pytest.fixture(params=["memory", "local"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    return MemoryStore() if request.param == "memory" else LocalStore(tmp_path, create=True)


def held(store: Store) -> list[str]:
    return sorted(info.name for info in store.list("locks"))


def test_shared_locks_coexist_and_exclude_the_exclusive_one(store: Store) -> None:
    with Lock(store, "shared", "backup"), Lock(store, "shared", "backup"):
        assert len(held(store)) == 2
        with pytest.raises(RepoLocked) as caught:
            Lock(store, "exclusive", "prune").acquire()
        assert "locked by backup (pid" in str(caught.value)
        assert len(held(store)) == 2  # the loser withdrew its own lock
    assert held(store) == []


def test_the_exclusive_lock_excludes_everything(store: Store) -> None:
    with Lock(store, "exclusive", "prune"):
        for kind in ("shared", "exclusive"):
            with pytest.raises(RepoLocked) as caught:
                Lock(store, kind, "backup").acquire()
            assert "locked exclusively by prune" in str(caught.value)
    with Lock(store, "exclusive", "prune"):
        pass


def _plant(store: Store, name: str, kind: str, host: str, pid: int, refreshed: int) -> None:
    store.put(name, msg.pack({"kind": kind, "host": host, "pid": pid, "command": "backup",
                              "time": refreshed, "refreshed": refreshed}))


def test_a_lock_of_a_dead_process_on_this_host_is_stale(store: Store) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=30)
    lock = Lock(store, "exclusive", "prune")
    _plant(store, "locks/" + "a" * 32, "shared", lock.host, dead.pid, time.time_ns())
    with lock:
        assert held(store) == [lock.name]  # the stale one was removed


def test_a_lock_not_refreshed_for_long_is_stale_and_a_fresh_one_is_not(store: Store) -> None:
    old = time.time_ns() - (locks.STALE_SECONDS + 60) * 10**9
    _plant(store, "locks/" + "b" * 32, "shared", "elsewhere", 1, old)
    with Lock(store, "exclusive", "prune"):
        pass
    _plant(store, "locks/" + "c" * 32, "shared", "elsewhere", 1, time.time_ns())
    with pytest.raises(RepoLocked):
        Lock(store, "exclusive", "prune").acquire()


def test_a_holder_refreshes_its_lock_and_notices_when_it_is_taken_away(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(locks, "REFRESH_SECONDS", 0.05)
    lock = Lock(store, "shared", "backup").acquire()
    try:
        first = locks.read_lock(store, lock.name)
        assert first is not None
        deadline = time.monotonic() + 10
        while (now := locks.read_lock(store, lock.name)) is not None and \
                now.refreshed == first.refreshed:
            assert time.monotonic() < deadline, "the lock was not refreshed"
            time.sleep(0.01)
        store.delete(lock.name)  # as another process would, judging it stale
        while not lock.lost:
            assert time.monotonic() < deadline, "the loss went unnoticed"
            time.sleep(0.01)
        with pytest.raises(RepoLocked):
            lock.check()
    finally:
        lock.release()


def test_an_unreadable_lock_object_does_not_block(store: Store) -> None:
    store.put("locks/" + "d" * 32, b"not msgpack \xc1")
    with Lock(store, "exclusive", "prune"):
        assert os.getpid() > 0
