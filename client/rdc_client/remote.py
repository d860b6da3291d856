"""Reaching a server: ``rdc://`` URLs, the token, TLS, and an open connection."""

from __future__ import annotations

import os
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import trio

from rdc.errors import ConnectionFailed, UsageError
from rdc.wire import messages as m
from rdc.wire.address import RemoteURL, parse_url  # noqa: F401 (where callers find them)
from rdc.wire.connection import Connection, running
from rdc.wire.frames import CountingStream, FrameStream
from rdc.wire.handshake import client_handshake
from rdc.wire.ratelimit import RateLimitedStream
from rdc_client import problems

CONNECT_SECONDS = 15


def read_token(token_file: str | None) -> str:
    """The token from ``--token-file`` (its first line) or ``RDC_TOKEN``."""
    if token_file:
        try:
            with open(token_file, encoding="utf-8") as f:
                token = f.readline().strip()
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise UsageError(message=f"cannot read token file {token_file}: {reason}") from None
        if not token:
            raise UsageError(message=f"token file {token_file} is empty")
        return token
    token = os.environ.get("RDC_TOKEN", "").strip()
    if not token:
        raise UsageError(message="no token: give --token-file FILE or set RDC_TOKEN")
    return token


def tls_context(ca_file: str | None) -> ssl.SSLContext:
    try:
        return ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise UsageError(message=f"cannot load CA file {ca_file}: {exc}") from None


@asynccontextmanager
async def open_connection(
    remote: RemoteURL,
    token: str,
    tls: ssl.SSLContext | None = None,
    compress: bool = True,
    idle_timeout: float = 600.0,
    welcomed: Callable[[m.Welcome], None] | None = None,
    rate: int | None = None,
) -> AsyncIterator[tuple[Connection, CountingStream]]:
    """A handshaken connection, running; yields it and the byte counter under it. Closes
    the connection (after flushing) when the block ends. ``welcomed`` gets the server's
    welcome; ``rate``: at most that many bytes per second each way (``--bwlimit``)."""
    try:
        with trio.fail_after(CONNECT_SECONDS):
            tcp = await trio.open_tcp_stream(remote.host, remote.port)
    except (trio.TooSlowError, OSError) as exc:
        address = f"[{remote.host}]" if ":" in remote.host else remote.host
        raise problems.connect_failed(f"{address}:{remote.port}", exc) from None
    counted = CountingStream(tcp)
    stream: trio.abc.Stream = counted if rate is None else RateLimitedStream(counted, rate)
    try:
        if tls is not None:
            stream = trio.SSLStream(stream, tls, server_hostname=remote.host)
            try:
                with trio.fail_after(CONNECT_SECONDS):
                    await stream.do_handshake()
            except (ssl.SSLError, trio.BrokenResourceError, trio.TooSlowError) as exc:
                # trio reports a failed handshake as a BrokenResourceError without text;
                # the reason (certificate verify failed, wrong version number) is its cause.
                raise problems.tls_failed(remote.host, exc) from None
        frames = FrameStream(stream)
        try:
            with trio.fail_after(CONNECT_SECONDS):
                welcome = await client_handshake(frames, token, compress)
        except trio.TooSlowError:
            raise ConnectionFailed(message=f"{remote}: no answer to the handshake") from None
        except ConnectionFailed:  # closed before the welcome
            raise problems.handshake_closed(str(remote), tls) from None
        except (trio.BrokenResourceError, OSError) as exc:
            raise problems.lost(str(remote), exc) from None
        if welcomed is not None:
            welcomed(welcome)
        async with running(frames, idle_timeout) as connection:
            yield connection, counted
    finally:
        with trio.CancelScope(shield=True):
            await trio.aclose_forcefully(stream)

