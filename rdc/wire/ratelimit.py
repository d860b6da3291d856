"""``--bwlimit``: a stream that carries at most a given number of bytes per second in each
direction (rsync's flag, its units), by a token bucket per direction.

Sending waits before each piece until the bucket holds its bytes; receiving reads a piece
and then waits for the bytes it took, so a fast peer meets TCP's back-pressure, not a
growing buffer here. Pieces are at most BURST_SECONDS of the rate (and at least MIN_PIECE
bytes), so the rate holds over any stretch longer than that.
"""

from __future__ import annotations

import re

import trio

from rdc.errors import UsageError

BURST_SECONDS = 0.05
MIN_PIECE = 4096
_UNITS = {"": 1024, "b": 1, "k": 1024, "kib": 1024, "kb": 1000, "m": 1 << 20, "mib": 1 << 20,
          "mb": 1_000_000, "g": 1 << 30, "gib": 1 << 30, "gb": 1_000_000_000}
_RATE = re.compile(r"(?P<number>\d+(?:\.\d*)?|\.\d+)\s*(?P<unit>[a-z]*)(?:/s)?")


def parse_rate(text: str) -> int | None:
    """Bytes per second from ``RATE``: a number of KiB/s, or with a unit (``B``, ``K``,
    ``M``, ``G``: powers of 1024; ``KB``, ``MB``, ``GB``: of 1000); None for 0 (no
    limit)."""
    found = _RATE.fullmatch(text.strip().lower())
    if found is None or found["unit"] not in _UNITS:
        raise UsageError(message=f"bad rate {text!r}: expected a number of KiB/s, or one with "
                         "a unit (500K, 2M, 1.5MB)")
    rate = int(float(found["number"]) * _UNITS[found["unit"]])
    if rate == 0 and float(found["number"]) > 0:
        raise UsageError(message=f"rate {text!r} is below one byte per second")
    return rate or None


class TokenBucket:
    """``rate`` bytes per second, up to ``burst`` saved up while idle."""

    def __init__(self, rate: float, burst: float) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.stamp: float | None = None

    async def take(self, n: int) -> None:
        """Spend ``n`` bytes, waiting until the bucket has paid for them."""
        now = trio.current_time()
        if self.stamp is not None:
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        self.tokens -= n
        if self.tokens < 0:
            await trio.sleep(-self.tokens / self.rate)


class RateLimitedStream(trio.abc.Stream):
    """``inner`` at most ``rate`` bytes per second each way."""

    def __init__(self, inner: trio.abc.Stream, rate: int) -> None:
        self.inner = inner
        self.piece = max(MIN_PIECE, int(rate * BURST_SECONDS))
        self._out = TokenBucket(rate, self.piece)
        self._in = TokenBucket(rate, self.piece)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data).cast("B")
        for start in range(0, len(view), self.piece):
            part = view[start : start + self.piece]
            await self._out.take(len(part))
            await self.inner.send_all(part)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        limit = self.piece if max_bytes is None else min(max_bytes, self.piece)
        data = await self.inner.receive_some(limit)
        if data:
            await self._in.take(len(data))
        return data

    async def aclose(self) -> None:
        await self.inner.aclose()

    @property
    def socket(self) -> object:
        """The socket under it, where there is one (for the daemon's peer address)."""
        return self.inner.socket  # type: ignore[attr-defined]
