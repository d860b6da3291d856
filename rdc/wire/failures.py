"""Why a connection failed, in words a user can act on.

trio and ssl often raise with no text of their own (a broken stream, a failed TLS
handshake): the reason is in the exception's cause, an ``OSError``'s errno or an
``SSLError``'s reason. Both ends use these to say what went wrong, never an empty line.
"""

from __future__ import annotations

import errno
import re
import socket
import ssl

import trio

from rdc.wire.frames import ConnectionClosed

# What an errno of a failed connect or a lost connection most likely means.
_ERRNO_HINTS = {
    errno.ECONNREFUSED: "connection refused: nothing listens on that port "
                        "(is rdc serve running there, on that port?)",
    errno.ETIMEDOUT: "timed out (a firewall, or the host is down?)",
    errno.EHOSTUNREACH: "no route to the host (is it up, is the address right?)",
    errno.ENETUNREACH: "the network is unreachable",
    errno.ECONNRESET: "the connection was reset by the other side (did it stop?)",
    errno.EPIPE: "the other side closed the connection",
    errno.EADDRNOTAVAIL: "the address is not available on this machine",
}


def leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups, or ``exc`` itself."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in leaves(inner)]
    return [exc]


def chain(exc: BaseException | None) -> list[BaseException]:
    """``exc``, its cause (or the exception it was raised while handling), and theirs,
    each once."""
    out: list[BaseException] = []
    while exc is not None and exc not in out:
        out.append(exc)
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    return out


def ssl_error(exc: BaseException) -> ssl.SSLError | None:
    for link in chain(exc):
        if isinstance(link, ssl.SSLError):
            return link
    return None


def os_reason(exc: OSError) -> str:
    """An OSError in words: what its errno means here, else its own text."""
    if isinstance(exc, socket.gaierror):
        return f"host name not found ({exc.strerror or exc})"
    if exc.errno in _ERRNO_HINTS:
        return _ERRNO_HINTS[exc.errno]
    return exc.strerror or str(exc) or type(exc).__name__


def reason(exc: BaseException) -> str:
    """The best explanation along ``exc``'s chain: an SSL error's reason, else an
    OSError's meaning (a reset, a refusal), else the first text there is; else what its
    type says."""
    links = chain(exc)
    for link in links:
        if isinstance(link, BaseExceptionGroup):
            inner = [reason(leaf) for leaf in leaves(link)]
            return "; ".join(dict.fromkeys(inner))
    for kind, explain in ((ssl.SSLError, tls_reason), (OSError, os_reason)):
        for link in links:
            if isinstance(link, kind):
                return explain(link)  # type: ignore[arg-type]
    for link in links:
        text = str(link)
        if text:
            return text
    if isinstance(exc, ConnectionClosed):
        return "the other side closed the connection"
    if isinstance(exc, trio.BrokenResourceError | trio.ClosedResourceError):
        return "the connection broke"
    return type(exc).__name__


def tls_reason(exc: ssl.SSLError) -> str:
    """An SSLError in words, with what most likely causes it."""
    what = (getattr(exc, "reason", None) or "").upper()
    if isinstance(exc, ssl.SSLCertVerificationError):
        detail = "certificate verify failed" + (
            f": {exc.verify_message}" if exc.verify_message else "")
        if "HOSTNAME" in detail.upper() or "IP ADDRESS" in detail.upper():
            return f"the server's certificate is not for this host name ({detail})"
        return (f"the server's certificate is not trusted ({detail}): give the CA that "
                "signed it with --ca-file PEM")
    if what in ("WRONG_VERSION_NUMBER", "HTTP_REQUEST", "UNKNOWN_PROTOCOL",
                "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG"):
        return f"the other side does not speak TLS ({openssl_text(exc)})"
    if what == "UNEXPECTED_EOF_WHILE_READING":
        return ("the other side gave up (does it trust this side's certificate?) "
                f"({openssl_text(exc)})")
    return openssl_text(exc)


def openssl_text(exc: ssl.SSLError) -> str:
    """OpenSSL's own words (``[SSL: CODE] text``, which a search finds), without the
    source line of Python's ssl module."""
    text = exc.args[1] if len(exc.args) > 1 and isinstance(exc.args[1], str) else str(exc)
    return re.sub(r"\s*\(_ssl\.c:\d+\)$", "", text)
