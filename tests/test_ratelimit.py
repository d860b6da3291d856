"""``--bwlimit``: the rate parser and the rate-limited stream, timed by trio's virtual
clock (no wall-clock timing)."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from rdc.errors import UsageError
from rdc.wire.ratelimit import RateLimitedStream, parse_rate


@pytest.mark.parametrize(("text", "rate"), [
    ("100", 102_400), ("100K", 102_400), ("1.5m", 1_572_864), ("2MB", 2_000_000),
    ("512B", 512), ("1G", 1 << 30), ("250KB/s", 250_000), ("0", None), (" 3k ", 3072),
])
def test_rates_parse_like_rsync(text: str, rate: int | None) -> None:
    assert parse_rate(text) == rate


@pytest.mark.parametrize("text", ["", "fast", "-1", "10 parsecs", "0.1B", "1e3"])
def test_bad_rates_are_usage_errors(text: str) -> None:
    with pytest.raises(UsageError, match="rate"):
        parse_rate(text)


async def _transfer(rate: int, size: int, chunk: int, receive_limited: bool) -> float:
    """Virtual seconds to move ``size`` bytes in ``chunk``-byte sends through a stream
    limited on the sending (or the receiving) end."""
    a, b = trio.testing.memory_stream_pair()
    sender = a if receive_limited else RateLimitedStream(a, rate)
    receiver = RateLimitedStream(b, rate) if receive_limited else b
    started = trio.current_time()
    got = 0

    async def send() -> None:
        data = bytes(chunk)
        for start in range(0, size, chunk):
            await sender.send_all(data[: min(chunk, size - start)])

    async with trio.open_nursery() as nursery:
        nursery.start_soon(send)
        while got < size:
            got += len(await receiver.receive_some(65536))
    return trio.current_time() - started


@given(st.sampled_from([64 << 10, 256 << 10, 1 << 20]), st.integers(200_000, 3_000_000),
       st.sampled_from([1000, 65536, 1 << 20]), st.booleans())
def test_the_rate_holds_in_each_direction(rate: int, size: int, chunk: int,
                                          receive_limited: bool) -> None:
    clock = trio.testing.MockClock(autojump_threshold=0)
    seconds = trio.run(_transfer, rate, size, chunk, receive_limited, clock=clock)
    burst = max(4096, rate * 0.05)
    assert (size - burst) / rate <= seconds <= (size + burst) / rate + 0.01
