"""The daemon as a client: a connection to an upstream server, for a share that follows
one (`rdc_server.follow`). The same steps as ``rdc``'s own (TCP, TLS, the handshake), with
the daemon's settings."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from rdc.errors import ConnectionFailed
from rdc.wire.address import RemoteURL
from rdc.wire.connection import Connection, running
from rdc.wire.frames import CountingStream, FrameStream
from rdc.wire.handshake import client_handshake
from rdc.wire.ratelimit import RateLimitedStream

CONNECT_SECONDS = 15


@asynccontextmanager
async def dial(
    url: RemoteURL, token: str, tls: ssl.SSLContext | None, rate: int | None,
    idle_timeout: float,
) -> AsyncIterator[tuple[Connection, CountingStream]]:
    """A handshaken, running connection to ``url``'s server and the byte counter under
    it; ConnectionFailed if it cannot be made. Cancellation closes it."""
    try:
        with trio.fail_after(CONNECT_SECONDS):
            tcp = await trio.open_tcp_stream(url.host, url.port)
    except trio.TooSlowError:
        raise ConnectionFailed(message=f"cannot connect to {url}: timed out") from None
    except OSError as exc:
        raise ConnectionFailed(message=f"cannot connect to {url.host}:{url.port}: "
                               f"{exc.strerror or exc}") from None
    counted = CountingStream(tcp)
    stream: trio.abc.Stream = counted if rate is None else RateLimitedStream(counted, rate)
    try:
        if tls is not None:
            stream = trio.SSLStream(stream, tls, server_hostname=url.host)
        frames = FrameStream(stream)
        try:
            with trio.fail_after(CONNECT_SECONDS):
                if isinstance(stream, trio.SSLStream):
                    await stream.do_handshake()
                await client_handshake(frames, token, True)
        except trio.TooSlowError:
            raise ConnectionFailed(message=f"{url}: no answer to the handshake") from None
        except (trio.BrokenResourceError, ssl.SSLError, OSError) as exc:
            reason = exc.__cause__ or exc
            raise ConnectionFailed(message=f"{url}: the handshake failed: "
                                   f"{reason or type(reason).__name__}") from None
        async with running(frames, idle_timeout, close_within=5) as connection:
            yield connection, counted
    finally:
        with trio.CancelScope(shield=True):
            await trio.aclose_forcefully(stream)

