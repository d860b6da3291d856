"""The address of a remote directory, ``rdc://HOST[:PORT]/SHARE[/PATH]`` (docs/protocol.md
section 1): what ``rdc`` commands take and what a server's replica follows."""

from __future__ import annotations

from urllib.parse import unquote, urlsplit

from rdc.errors import UsageError
from rdc.local.paths import PathError, check_relpath
from rdc.records import record
from rdc.wire import DEFAULT_PORT


@record
class RemoteURL:
    host: str
    port: int
    share: str
    path: str  # inside the share, "" for its root

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        tail = f"/{self.path}" if self.path else ""
        return f"rdc://{host}:{self.port}/{self.share}{tail}"


def parse_url(text: str) -> RemoteURL:
    """``rdc://HOST[:PORT]/SHARE[/PATH]``."""
    if not text.startswith("rdc://"):
        raise UsageError(message=f"not an rdc:// URL: {text!r}")
    parts = urlsplit(text)
    if parts.query or parts.fragment or parts.username or parts.password:
        raise UsageError(message=f"an rdc URL has no user, query or fragment: {text!r}")
    try:
        port = parts.port or DEFAULT_PORT
    except ValueError:
        raise UsageError(message=f"bad port in {text!r}") from None
    if not parts.hostname:
        raise UsageError(message=f"no host in {text!r}")
    segments = [unquote(s) for s in parts.path.split("/") if s]
    if not segments:
        raise UsageError(message=f"no share in {text!r} (rdc://HOST:PORT/SHARE[/PATH])")
    path = "/".join(segments[1:])
    if path:
        try:
            path = check_relpath(path)
        except PathError as exc:
            raise UsageError(message=str(exc)) from None
    return RemoteURL(parts.hostname, port, segments[0], path)


