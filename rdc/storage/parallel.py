"""Running many store calls at once: object stores are slow per request and fast in
aggregate, so transfers overlap. A blocking helper, usable from one trio worker thread."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def map_parallel(fn: Callable[[T], R], items: Iterable[T], *, workers: int) -> list[R]:
    """`[fn(item) for item in items]`, with up to `workers` calls running at once on
    threads of its own; results in the order of `items`.

    Items are taken from the iterable only as workers free up, so a long generator is not
    drained ahead. The first exception stops new calls, waits for those running (a store
    call cannot be interrupted, and each leaves its object whole or untouched), and is
    raised; the other results are dropped.
    """
    if workers < 1:
        raise ValueError(f"workers must be at least 1, not {workers}")
    results: dict[int, R] = {}
    running: dict[Future[R], int] = {}
    source = iter(enumerate(items))
    failure: BaseException | None = None
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rdc-store") as pool:
        try:
            while True:
                while failure is None and len(running) < workers:
                    nxt = next(source, None)
                    if nxt is None:
                        break
                    running[pool.submit(fn, nxt[1])] = nxt[0]
                if not running:
                    break
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    index = running.pop(future)
                    error = future.exception()
                    if error is None:
                        results[index] = future.result()
                    elif failure is None:
                        failure = error
        except BaseException:
            # KeyboardInterrupt while waiting: let the running calls finish, start no more.
            for future in running:
                future.cancel()
            raise
    if failure is not None:
        raise failure
    return [results[i] for i in range(len(results))]
