"""What the client says when reaching a server fails, or a connection is lost: what
happened, and what is most likely wrong (README, "When something goes wrong")."""

from __future__ import annotations

import ssl

import trio

from rdc.errors import ConnectionFailed
from rdc.wire.failures import leaves, os_reason, reason, ssl_error


def connect_failed(address: str, exc: BaseException) -> ConnectionFailed:
    """``trio.open_tcp_stream`` failed: it tried every address the name has, and says
    only "all attempts ... failed"; the reasons are in its cause."""
    if isinstance(exc, trio.TooSlowError):
        return ConnectionFailed(message=f"cannot connect to {address}: timed out (a firewall, "
                                "or the host is down?)")
    causes = [leaf for leaf in leaves(exc.__cause__) if isinstance(leaf, OSError)] if (
        exc.__cause__ is not None) else []
    found = [os_reason(cause) for cause in causes] or [
        os_reason(exc) if isinstance(exc, OSError) else reason(exc)]
    return ConnectionFailed(message=f"cannot connect to {address}: "
                            + "; ".join(dict.fromkeys(found)))


def tls_failed(host: str, exc: BaseException) -> ConnectionFailed:
    """The TLS handshake with the server failed (trio's BrokenResourceError has the
    SSLError as its cause)."""
    if isinstance(exc, trio.TooSlowError):
        why = "timed out"
    else:
        error = ssl_error(exc)
        why = reason(error) if error is not None else reason(exc)
    hint = ""
    if "does not speak TLS" in why:
        hint = ": connect without --tls, or start the server with --tls-cert and --tls-key"
    return ConnectionFailed(message=f"TLS with {host} failed: {why}{hint}")


def handshake_closed(url: str, tls: ssl.SSLContext | None) -> ConnectionFailed:
    """The server closed the connection before it answered ``hello``: without TLS on our
    side, most often a server that expects TLS."""
    hint = " (if it uses TLS, connect with --tls)" if tls is None else ""
    return ConnectionFailed(message=f"{url}: the server closed the connection during the "
                            f"handshake{hint}")


def lost(url: str, exc: BaseException) -> ConnectionFailed:
    """An open connection ended before the work was done."""
    why = reason(exc)
    if why in ("the other side closed the connection", "the connection broke"):
        why = "the server closed it (did it stop or restart?)"
    return ConnectionFailed(message=f"{url}: the connection was lost: {why}")
