"""`map_parallel`, and stores driven from trio through worker threads, as rdc's async code
will use them."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
import trio

from rdc.storage import LocalStore, MemoryStore, map_parallel


def test_results_come_in_the_order_of_the_items() -> None:
    def slow_square(n: int) -> int:
        time.sleep(0.002 * (n % 3))
        return n * n

    assert map_parallel(slow_square, range(20), workers=4) == [n * n for n in range(20)]
    assert map_parallel(slow_square, [], workers=4) == []


def test_no_more_than_workers_run_at_once_and_items_are_taken_lazily() -> None:
    running, peak, taken = 0, 0, 0
    lock = threading.Lock()

    def items() -> Iterator[int]:
        nonlocal taken
        for i in range(30):
            with lock:
                taken += 1
                assert taken - done_count[0] <= 3, "items taken ahead of free workers"
            yield i

    done_count = [0]

    def work(i: int) -> int:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.003)
        with lock:
            running -= 1
            done_count[0] += 1
        return i

    assert map_parallel(work, items(), workers=3) == list(range(30))
    assert peak == 3


def test_the_first_error_stops_new_calls_and_is_raised() -> None:
    started: list[int] = []

    def work(i: int) -> int:
        started.append(i)
        if i == 5:
            raise KeyError("five")
        time.sleep(0.005)
        return i

    with pytest.raises(KeyError, match="five"):
        map_parallel(work, range(1000), workers=2)
    assert len(started) < 20  # not all 1000 started after the failure


def test_workers_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        map_parallel(str, [1], workers=0)


async def test_a_store_from_trio_worker_threads(tmp_path: Path) -> None:
    # The intended use from async code: each blocking call on a worker thread, at most
    # `connections` at a time; or a whole batch through map_parallel in one thread.
    store = LocalStore(tmp_path, create=True)
    limiter = trio.CapacityLimiter(store.capabilities.connections)
    names = [f"data/{i:02d}" for i in range(24)]

    async def put(name: str) -> None:
        await trio.to_thread.run_sync(store.put, name, name.encode() * 1000, limiter=limiter)

    async with trio.open_nursery() as nursery:
        for name in names:
            nursery.start_soon(put, name)
    got = await trio.to_thread.run_sync(partial(map_parallel, store.get, names, workers=4))
    assert got == [n.encode() * 1000 for n in names]
    memory = MemoryStore()
    await trio.to_thread.run_sync(
        partial(map_parallel, lambda n: memory.put(n, b"x"), names, workers=8)
    )
    assert sorted(info.name for info in memory.list("data")) == names
