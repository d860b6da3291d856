"""``rdc serve``: listen, authenticate, and serve each connection's conversations.

One trio task per connection; a connection that misbehaves (bad frames, a bad token, a
protocol error) ends alone and the daemon keeps serving the others. SIGINT and SIGTERM
stop it: listeners close, connections are cancelled (a file being received stays a
temporary, removed at the next open of its directory), indexes are closed.
"""

from __future__ import annotations

import errno
import logging
import signal
import socket
import ssl
from typing import Any

import trio

from rdc.allocator import tune_allocator
from rdc.errors import AccessDenied, ProtocolError, RemoteError, UsageError
from rdc.local.marker import MARKER
from rdc.transfer.serving import ServerSession
from rdc.wire.codec import pack
from rdc.wire.connection import Connection, linger, unwrap_group
from rdc.wire.failures import os_reason, reason, ssl_error
from rdc.wire.frames import HEADER, ConnectionClosed, FrameStream, TLSWithoutTLS
from rdc.wire.handshake import server_handshake
from rdc_server.config import ServerConfig
from rdc_server.follow import follow_all
from rdc_server.limits import Limits, give_back_memory, raise_descriptor_limit
from rdc_server.repos import RepoRegistry
from rdc_server.scrub import scrub_forever
from rdc_server.shares import Registry
from rdc_server.storeserving import RepoSession

log = logging.getLogger("rdc.serve")
TLS_HANDSHAKE_SECONDS = 10


def tls_context(config: ServerConfig) -> ssl.SSLContext | None:
    if not config.tls_cert:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(config.tls_cert, config.tls_key)
    return context


class Daemon:
    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.registry = Registry(config.shares, config.state_dir)
        self.tls = tls_context(config)
        self.connections = 0  # ever accepted: numbers them in the log
        self.active = 0  # admitted and not yet ended
        self.limits = Limits(config.max_connections, config.max_connections_per_address)
        self.repos = RepoRegistry(config.repos)

    async def serve(self, *, task_status: trio.TaskStatus[list[Any]] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        """Listen until cancelled; ``task_status.started`` gets the listeners (so tests and
        the log know the bound port)."""
        listeners = await open_listeners(self.config.host, self.config.port)
        for name, share in sorted(self.config.shares.items()):
            log.info("share %s = %s%s", name, share.path, " (read-only)" if share.readonly else "")
            if share.versions is not None:
                log.info("share %s keeps versions in %s (%s)", name,
                         self.registry.versions(name).location, share.versions)
            if await trio.to_thread.run_sync(self.registry.marker_lost, name, True):
                log.warning("share %s: its folder marker %s is missing (is the disk mounted?); "
                            "nothing is deleted elsewhere on its account until it is back",
                            name, MARKER)
        for name, repo in sorted(self.config.repos.items()):
            log.info("repository %s = %s%s", name, repo.location,
                     " (read-only)" if repo.readonly else "")
        try:
            async with trio.open_nursery() as nursery:
                if self.config.upstreams:
                    await nursery.start(follow_all, self.registry, self.config.upstreams,
                                        self.config.state_dir)
                if any(share.versions for share in self.config.shares.values()):
                    nursery.start_soon(self.registry.prune_versions)
                nursery.start_soon(self.registry.board.log_summaries)
                # Logged last: scripts and tests take this line to mean ready, so every
                # share's marker is in place by then.
                for listener in listeners:
                    host, port = listener.socket.getsockname()[:2]
                    log.info("listening on %s:%d%s", host, port, " (TLS)" if self.tls else "")
                task_status.started(listeners)
                if self.config.scrub_every is not None:
                    log.info("scrubbing every share every %g s", self.config.scrub_every)
                    nursery.start_soon(scrub_forever, self.registry, self.config.scrub_every)
                await trio.serve_listeners(self._connection, listeners, handler_nursery=nursery)
        finally:
            self.registry.close()

    async def _connection(self, stream: trio.abc.Stream) -> None:
        self.connections += 1
        number = self.connections
        peer = _peer(stream)
        address = peer.rpartition(":")[0]
        refusal = self.limits.admit(address)
        if refusal is not None:
            log.warning("#%d from %s refused: %s", number, peer, refusal)
            await _refuse(stream, refusal)
            return
        log.info("#%d connection from %s", number, peer)
        state = {"authenticated": False}
        self.active += 1
        try:
            await self._serve_connection(stream, number, peer, address, state)
        finally:
            self.limits.leave(address, state["authenticated"])
            self.active -= 1
            give_back_memory(collect=not self.active)

    async def _serve_connection(
        self, stream: trio.abc.Stream, number: int, peer: str, address: str, state: dict
    ) -> None:
        try:
            if self.tls is not None:
                stream = trio.SSLStream(stream, self.tls, server_side=True)
                with trio.fail_after(TLS_HANDSHAKE_SECONDS):
                    await stream.do_handshake()
            frames = FrameStream(stream)
            assert self.config.tokens is not None
            _, rights = await server_handshake(frames, self.config.tokens.check,
                                               host=socket.gethostname())
            self.limits.authenticated(address)
            state["authenticated"] = True
            session = ServerSession(self.registry.for_client(rights, peer), peer=f"#{number}")
            repos = RepoSession(self.repos.for_client(rights), peer=f"#{number}")
            try:
                await Connection(frames, handler=repos.route(session.handle),
                                 on_end=session.close).run()
            finally:
                session.close()
            log.info("#%d closed", number)
        except AccessDenied:
            log.warning("#%d from %s: authentication failed", number, peer)
        except (ProtocolError, RemoteError) as exc:
            hint = (" (a client with --tls, and this server has no --tls-cert?)"
                    if isinstance(exc, TLSWithoutTLS) else "")
            log.warning("#%d: %s%s", number, exc, hint)
        except trio.TooSlowError:
            log.warning("#%d: handshake timed out", number)
        except (ConnectionClosed, trio.BrokenResourceError, trio.ClosedResourceError,
                ssl.SSLError, OSError) as exc:
            if self.tls is not None and not state["authenticated"] and ssl_error(exc):
                why = reason(exc)
                hint = " (a client without --tls?)" if "not speak TLS" in why else ""
                log.warning("#%d: TLS handshake failed: %s%s", number, why, hint)
            else:
                log.info("#%d ended: %s", number, reason(exc))
        except Exception:  # a bug: log it, keep serving the others
            log.exception("#%d failed", number)
        finally:
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)


async def _refuse(stream: trio.abc.Stream, reason: str) -> None:
    """Tell a connection over a limit why (``error`` ``busy``, unframed by TLS: a TLS
    client sees the connection closed), and close it."""
    try:
        with trio.move_on_after(1):
            message = pack([{"t": "error", "code": "busy", "msg": reason}])
            await stream.send_all(HEADER.pack(len(message)) + message)
        await linger(stream, 1)  # the client's hello is unread: a close would reset
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass
    finally:
        await trio.aclose_forcefully(stream)


def _peer(stream: trio.abc.Stream) -> str:
    try:
        host, port = stream.socket.getpeername()[:2]  # type: ignore[attr-defined]
        return f"{host}:{port}"
    except (AttributeError, OSError):
        return "?"


async def open_listeners(host: str, port: int) -> list[trio.SocketListener]:
    """The listening sockets; UsageError (one line naming the address) if the address
    cannot be had."""
    try:
        return await trio.open_tcp_listeners(port, host=host)
    except OSError as exc:
        hint = _LISTEN_HINTS.get(exc.errno or 0, "")
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        raise UsageError(message=f"cannot listen on {where}: {os_reason(exc)}{hint}") from None


_LISTEN_HINTS = {
    errno.EADDRINUSE: " (another rdc serve or another program has that port: stop it, or "
                      "choose another with --listen HOST:PORT)",
    errno.EACCES: " (ports below 1024 need privileges: choose another with --listen)",
    errno.EADDRNOTAVAIL: " (that host is not an address of this machine)",
}


async def run(config: ServerConfig) -> None:
    """Serve until SIGINT or SIGTERM."""
    tune_allocator()
    raise_descriptor_limit(config.max_connections)
    daemon = Daemon(config)
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals, unwrap_group():
        async with trio.open_nursery() as nursery:
            await nursery.start(daemon.serve)
            async for signum in signals:
                log.info("%s: stopping", signal.Signals(signum).name)
                nursery.cancel_scope.cancel()
                break
