"""``rdc status URL``: how a share's replication is doing, as its server sees it: the
upstream it follows (if it is a replica), and every replica and ``rdc watch`` client
connected to it, each with its state, last successful round, lag, files pending and last
error."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import trio

from rdc.errors import ConnectionFailed, RdcError
from rdc.transfer.oneway import receive_opened, request_open
from rdc.wire import messages as m
from rdc.wire.frames import ConnectionClosed
from rdc_client.options import add_server_options
from rdc_client.remote import RemoteURL, open_connection, parse_url, read_token, tls_context

STATUS_SECONDS = 30


class NoStatus(RdcError):
    """{url}: the server does not report replication status (it runs an older rdc)"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "status",
        help="show a share's replicas and watchers: state, lag, pending files, errors",
        description="Ask the server how replication of a share is doing: the upstream it "
        "follows, its replicas and its watching clients, each with its state, last "
        "successful round, lag, files pending and last error.",
    )
    p.add_argument("url", metavar="rdc://HOST[:PORT]/SHARE[/PATH]")
    p.add_argument("--json", action="store_true", help="print JSON")
    add_server_options(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    remote = parse_url(args.url)
    token = read_token(args.token_file)
    tls = tls_context(args.ca_file) if args.tls or args.ca_file else None
    try:
        health = trio.run(_ask, remote, token, tls, args)
    except ConnectionClosed as exc:
        raise ConnectionFailed(message=f"{remote}: {exc}") from None
    now = time.time()
    if args.json:
        json.dump(as_json(remote, health, now), sys.stdout, indent=2)
        print()
    else:
        print(render(remote, health, now))
    return 0


async def _ask(remote: RemoteURL, token: str, tls: Any, args: argparse.Namespace) -> m.Health:
    async with open_connection(remote, token, tls, compress=not args.no_compress,
                               rate=args.bwlimit) as (connection, _):
        if "health" not in connection.frames.features:
            raise NoStatus(url=str(remote))
        await receive_opened(request_open(connection, remote.share, remote.path, False, []))
        conversation = connection.start(m.Status())
        with trio.fail_after(STATUS_SECONDS):
            health = await conversation.receive(m.Health)
        conversation.close()
        return health


def _seconds(ms: int | None) -> float | None:
    return None if ms is None else ms / 1000


def as_json(remote: RemoteURL, health: m.Health, now: float) -> dict[str, Any]:
    """Ages become seconds, and times (this machine's clock) where they are ages of."""
    peers = []
    for peer in health.peers:
        item: dict[str, Any] = {
            "role": peer.role, "name": peer.name, "peer": peer.peer, "mode": peer.mode,
            "state": peer.state, "lag_seconds": peer.lag_ms / 1000,
            "last_lag_seconds": peer.last_lag_ms / 1000, "pending": peer.pending,
            "error": peer.error, "rounds": peer.rounds, "bytes": peer.bytes,
        }
        for key, ms in (("connected", peer.connected_ms), ("last_ok", peer.ok_ms),
                        ("error_at", peer.error_ms)):
            age = _seconds(ms)
            item[f"{key}_seconds_ago"] = age
            item[key] = None if age is None else _iso(now - age)
        peers.append(item)
    return {"url": str(remote), "share": health.share, "seq": health.seq, "peers": peers}


def _iso(when: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(when))


def _ago(ms: int | None) -> str:
    if ms is None:
        return "never"
    seconds = ms / 1000
    if seconds < 90:
        return f"{seconds:.0f} s ago"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min ago"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.0f} h ago"
    return f"{seconds / 86400:.0f} days ago"


def render(remote: RemoteURL, health: m.Health, now: float) -> str:
    lines = [f"{remote} (share {health.share}, change {health.seq})"]
    if not health.peers:
        lines.append("  no replicas or watchers")
        return "\n".join(lines)
    header = ("ROLE", "NAME", "ADDRESS", "MODE", "STATE", "LAST OK", "LAG", "PENDING",
              "LAST ERROR")
    rows = [header]
    for peer in health.peers:
        lag = f"{peer.lag_ms / 1000:.1f} s" if peer.lag_ms else (
            f"0 ({peer.last_lag_ms / 1000:.2f} s last)" if peer.last_lag_ms else "0")
        error = f"{peer.error} ({_ago(peer.error_ms)})" if peer.error else "-"
        rows.append((peer.role, peer.name or "?", peer.peer or "-", peer.mode or "-",
                     peer.state or "-", _ago(peer.ok_ms), lag, str(peer.pending), error))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        lines.append("  " + "  ".join([*cells, row[-1]]).rstrip())
    return "\n".join(lines)
