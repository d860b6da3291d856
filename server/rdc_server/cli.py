"""``rdc serve``: the daemon's command line (registered by the ``rdc`` command)."""

from __future__ import annotations

import argparse
import logging
import ssl

import trio

from rdc.errors import UsageError
from rdc_server import config as server_config
from rdc_server import logs
from rdc_server.daemon import run, tls_context

log = logging.getLogger("rdc.serve")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="export directories (shares) to rdc clients",
        description="Run the rdc daemon: export named directories (shares) over TCP, "
        "optionally TLS, to clients that present a token. Stop with Ctrl-C or SIGTERM.",
    )
    p.add_argument("--listen", metavar="HOST:PORT",
                   help=f"address to listen on (default 127.0.0.1:{server_config.DEFAULT_PORT})")
    p.add_argument("--share", action="append", metavar="NAME=PATH",
                   help="export PATH as share NAME, read-write (repeatable)")
    p.add_argument("--share-ro", action="append", metavar="NAME=PATH",
                   help="export PATH as share NAME, read-only (repeatable)")
    p.add_argument("--repo", action="append", metavar="NAME=LOCATION",
                   help="export a backup repository (a directory or s3:// URL) as "
                   "rdc://HOST/NAME, read-write (repeatable)")
    p.add_argument("--repo-ro", action="append", metavar="NAME=LOCATION",
                   help="export a backup repository read-only (repeatable)")
    p.add_argument("--token-file", metavar="FILE",
                   help="accepted tokens, one per line, optionally with the shares each may use")
    p.add_argument("--state-dir", metavar="DIR",
                   help="where the signature indexes live (outside every share)")
    p.add_argument("--tls-cert", metavar="PEM", help="certificate chain for TLS")
    p.add_argument("--tls-key", metavar="PEM", help="private key for TLS")
    p.add_argument("--max-connections", type=int, metavar="N",
                   help="connections served at once, in all (default 256)")
    p.add_argument("--max-connections-per-address", type=int, metavar="N",
                   help="connections served at once from one address (default 64)")
    p.add_argument("--scrub-every", metavar="DURATION",
                   help="read every share again on this schedule (30m, 12h, 7d, ...) and log "
                   "files whose content no longer matches the index (bit rot)")
    p.add_argument("--config", metavar="TOML", help="read settings from a TOML file")
    p.add_argument("-v", "--verbose", action="store_true", help="log every request")
    p.set_defaults(run=main)


def main(args: argparse.Namespace) -> int:
    config = server_config.load(args)
    logs.setup(args.verbose)
    for warning in config.warnings:
        log.warning("warning: %s", warning)
    try:
        tls_context(config)
    except (OSError, ssl.SSLError) as exc:
        raise UsageError(message=f"cannot load the TLS certificate or key: {exc}") from None
    try:
        config.state_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(message=f"cannot create {config.state_dir}: {exc.strerror}") from None
    trio.run(run, config)
    return 0
