"""The daemon's settings, from the command line and/or a TOML file, and its token list.

Config file (every key optional; the command line adds to or overrides it)::

    listen = "0.0.0.0:8730"
    state_dir = "/var/lib/rdc"
    token_file = "/etc/rdc/tokens"
    tls_cert = "/etc/rdc/cert.pem"
    tls_key = "/etc/rdc/key.pem"
    max_connections = 256                       # in all (default 256)
    max_connections_per_address = 64            # from one client address (default 64)
    scrub_every = "7d"                          # read every share again on this schedule

    [shares]
    docs = "/srv/docs"                          # read-write
    photos = { path = "/srv/photos", readonly = true }

    [shares.mirror]                             # a replica of another server's share
    path = "/srv/mirror"
    versions = "staggered"                      # keep what is replaced: N, staggered[:DAYS], all
    versions_dir = "/srv/.rdc-versions/mirror"  # default: STATE_DIR/versions/mirror
    [shares.mirror.follow]
    url = "rdc://primary.lan:8730/docs"         # the upstream share (and directory)
    token_file = "/etc/rdc/upstream-token"      # its first line
    mode = "receive-only"                       # or two-way, send-only
    tls = true                                  # ca_file = "..." also implies TLS
    bwlimit = "2M"                              # at most this each way

    [repos]                                     # backup repositories (rdc://HOST/NAME)
    backups = "/srv/backups"                    # a directory, made on first use
    offsite = { location = "s3://s3.example:9000/bk/rdc", readonly = true }

Token file: one token per line, optionally followed by the shares it may use, each
``NAME`` (with the share's own mode), ``NAME:ro`` or ``NAME:rw``; without a list the token
may use every share. Repositories are granted the same way, by name (a name is a share's
or a repository's, not both). ``#`` starts a comment.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rdc.errors import UsageError
from rdc.local.versions import Retention
from rdc.transfer.twoway import MODES, RECEIVE_ONLY
from rdc.wire import DEFAULT_PORT
from rdc.wire.address import RemoteURL, parse_url
from rdc.wire.ratelimit import parse_rate
from rdc_server.limits import MAX_CONNECTIONS, MAX_CONNECTIONS_PER_ADDRESS
from rdc_server.repos import Repo, make_repo, parse_repo
from rdc_server.shares import Rights, Share

MIN_TOKEN = 16


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT``, ``[v6]:PORT``, ``HOST`` or ``:PORT``."""
    host, port = text, str(DEFAULT_PORT)
    if text.startswith("["):
        close = text.find("]")
        if close < 0:
            raise UsageError(message=f"bad listen address {text!r}")
        host, rest = text[1:close], text[close + 1 :]
        if rest:
            if not rest.startswith(":"):
                raise UsageError(message=f"bad listen address {text!r}")
            port = rest[1:]
    elif text.count(":") == 1:
        host, port = text.split(":")
    try:
        number = int(port)
    except ValueError:
        raise UsageError(message=f"bad port in {text!r}") from None
    if not 0 <= number <= 65535:
        raise UsageError(message=f"bad port in {text!r}")
    return host or "0.0.0.0", number


def parse_share(text: str, readonly: bool) -> Share:
    """``NAME=PATH``."""
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise UsageError(message=f"a share is NAME=PATH, not {text!r}")
    return make_share(name, path, readonly)


@dataclass(frozen=True)
class Upstream:
    """What a share follows: another server's share (or a directory in it)."""

    url: RemoteURL
    token: str
    mode: str = RECEIVE_ONLY
    tls: bool = False
    ca_file: str | None = None
    rate: int | None = None  # bytes per second each way, None: no limit


FOLLOW_KEYS = {"url", "token_file", "mode", "tls", "ca_file", "bwlimit"}
SHARE_KEYS = {"path", "readonly", "versions", "versions_dir", "follow"}


def parse_upstream(name: str, data: Any) -> Upstream:
    """A share's ``follow`` table."""
    where = f"share {name!r}: follow"
    if not isinstance(data, dict):
        raise UsageError(message=f"{where}: expected a table {{url = ..., token_file = ...}}")
    unknown = set(data) - FOLLOW_KEYS
    if unknown:
        raise UsageError(message=f"{where}: unknown setting {sorted(unknown)[0]!r} "
                         f"(known: {', '.join(sorted(FOLLOW_KEYS))})")
    if not isinstance(data.get("url"), str) or not isinstance(data.get("token_file"), str):
        raise UsageError(message=f"{where}: url and token_file are required")
    url = parse_url(data["url"])
    mode = data.get("mode", RECEIVE_ONLY)
    if mode not in MODES:
        raise UsageError(message=f"{where}: mode must be one of {', '.join(MODES)}, "
                         f"not {mode!r}")
    try:
        with open(data["token_file"], encoding="utf-8") as f:
            token = f.readline().strip()
    except OSError as exc:
        raise UsageError(message=f"{where}: cannot read {data['token_file']}: "
                         f"{exc.strerror}") from None
    if not token:
        raise UsageError(message=f"{where}: token file {data['token_file']} is empty")
    rate = data.get("bwlimit")
    ca_file = data.get("ca_file")
    if ca_file is not None and not isinstance(ca_file, str):
        raise UsageError(message=f"{where}: ca_file must be a path")
    return Upstream(url, token, mode, bool(data.get("tls")) or bool(ca_file), ca_file,
                    None if rate is None else parse_rate(str(rate)))


def make_share(name: str, path: str, readonly: bool) -> Share:
    if "/" in name or name in (".", "..") or len(name.encode()) > 255 or not name.isprintable():
        raise UsageError(message=f"bad share name {name!r}")
    real = os.path.realpath(os.path.expanduser(path))
    if not os.path.isdir(real):
        raise UsageError(message=f"share {name!r}: {path} is not a directory")
    return Share(name, real, readonly)


class Tokens:
    """The accepted tokens and their rights. `check` compares the presented token with every
    configured one in constant time (over digests, so lengths leak nothing either)."""

    def __init__(self, entries: list[tuple[str, Rights]]) -> None:
        self._entries = [(hashlib.sha256(t.encode()).digest(), r) for t, r in entries]

    def __len__(self) -> int:
        return len(self._entries)

    def check(self, presented: str) -> Rights | None:
        digest = hashlib.sha256(presented.encode("utf-8", "surrogatepass")).digest()
        found = None
        for known, rights in self._entries:
            if hmac.compare_digest(known, digest) and found is None:
                found = rights
        return found


def read_tokens(path: str | os.PathLike[str], shares: dict[str, Share] | dict[str, Any]
                ) -> Tokens:
    """The token file; ``shares``: every name a grant may give (shares and repositories)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(message=f"cannot read token file {path}: {exc.strerror}") from None
    entries = []
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        token, grants = words[0], words[1:]
        if len(token) < MIN_TOKEN:
            raise UsageError(message=f"{path}:{number}: tokens must be at least {MIN_TOKEN} "
                             "characters")
        rights: dict[str, str] | None = None
        if grants:
            rights = {}
            for grant in grants:
                name, _, mode = grant.partition(":")
                mode = mode or "rw"
                if name not in shares or mode not in ("ro", "rw"):
                    raise UsageError(message=f"{path}:{number}: bad grant {grant!r}")
                rights[name] = mode
        entries.append((token, Rights(rights)))
    if not entries:
        raise UsageError(message=f"token file {path} holds no token")
    return Tokens(entries)


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    shares: dict[str, Share] = field(default_factory=dict)
    tokens: Tokens | None = None
    state_dir: Path = Path(".")
    tls_cert: str | None = None
    tls_key: str | None = None
    max_connections: int = MAX_CONNECTIONS
    max_connections_per_address: int = MAX_CONNECTIONS_PER_ADDRESS
    upstreams: dict[str, Upstream] = field(default_factory=dict)  # shares that follow one
    scrub_every: float | None = None  # seconds between scrubs of every share (None: never)
    warnings: list[str] = field(default_factory=list)  # logged once the log is set up
    repos: dict[str, Repo] = field(default_factory=dict)


# The keys a config file may hold; any other is reported (a typo would otherwise be
# ignored without a word).
KNOWN_KEYS = {"listen", "state_dir", "token_file", "tls_cert", "tls_key", "max_connections",
              "max_connections_per_address", "shares", "repos",
              "scrub_every"}
KNOWN_SHARE_KEYS = SHARE_KEYS
KNOWN_REPO_KEYS = {"location", "readonly"}


def unknown_keys(data: dict[str, Any], source: str) -> list[str]:
    """A warning per key of the config file that rdc does not know."""
    found = [f"{source}: unknown key {key!r} (ignored)" for key in data if key not in KNOWN_KEYS]
    shares = data.get("shares")
    for name, value in shares.items() if isinstance(shares, dict) else ():
        if isinstance(value, dict):
            found += [f"{source}: unknown key {key!r} in share {name!r} (ignored)"
                      for key in value if key not in KNOWN_SHARE_KEYS]
    repos = data.get("repos")
    for name, value in repos.items() if isinstance(repos, dict) else ():
        if isinstance(value, dict):
            found += [f"{source}: unknown key {key!r} in repository {name!r} (ignored)"
                      for key in value if key not in KNOWN_REPO_KEYS]
    return found


def _share_table(config: ServerConfig, name: str, value: dict[str, Any]) -> Share:
    """``[shares.NAME]`` with its path, mode, versions and what it follows."""
    share = make_share(name, value["path"], bool(value.get("readonly")))
    changes: dict[str, Any] = {}
    if value.get("versions") is not None:
        changes["versions"] = Retention.parse(value["versions"])
    if value.get("versions_dir") is not None:
        if not isinstance(value["versions_dir"], str):
            raise UsageError(message=f"share {name!r}: versions_dir must be a path")
        changes["versions_dir"] = os.path.abspath(os.path.expanduser(value["versions_dir"]))
    if "follow" in value:
        upstream = parse_upstream(name, value["follow"])
        config.upstreams[name] = upstream
        if upstream.mode == RECEIVE_ONLY:  # a mirror: only replication writes to it
            changes.update(readonly=True, replica_of=str(upstream.url))
    return dataclasses.replace(share, **changes)


def load_repos(data: dict[str, Any], args: Any) -> dict[str, Repo]:
    """``[repos]`` of the config file, then ``--repo`` and ``--repo-ro`` (which override)."""
    repos: dict[str, Repo] = {}
    table = data.get("repos", {})
    if not isinstance(table, dict):
        raise UsageError(message="[repos] must be a table")
    for name, value in table.items():
        if isinstance(value, str):
            repos[name] = make_repo(name, value, False)
        elif isinstance(value, dict) and isinstance(value.get("location"), str):
            repos[name] = make_repo(name, value["location"], bool(value.get("readonly")))
        else:
            raise UsageError(message=f"repository {name!r}: expected a location or "
                             "{location = ...}")
    given: set[str] = set()
    for text, readonly in [(t, False) for t in getattr(args, "repo", None) or []] + [
        (t, True) for t in getattr(args, "repo_ro", None) or []
    ]:
        repo = parse_repo(text, readonly)
        if repo.name in given:
            raise UsageError(message=f"repository {repo.name!r} is given twice")
        given.add(repo.name)
        repos[repo.name] = repo
    return repos


def load(args: Any) -> ServerConfig:
    """Settings from parsed arguments (``args.config`` names an optional TOML file)."""
    data: dict[str, Any] = {}
    if args.config:
        try:
            with open(args.config, "rb") as f:
                data = tomllib.load(f)
        except OSError as exc:
            raise UsageError(message=f"cannot read {args.config}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise UsageError(message=f"{args.config}: {exc}") from None
    config = ServerConfig()
    listen = args.listen or data.get("listen")
    if listen:
        config.host, config.port = parse_listen(str(listen))
    shares_data = data.get("shares", {})
    if not isinstance(shares_data, dict):
        raise UsageError(message="[shares] must be a table")
    for name, value in shares_data.items():
        if isinstance(value, str):
            config.shares[name] = make_share(name, value, False)
        elif isinstance(value, dict) and isinstance(value.get("path"), str):
            config.shares[name] = _share_table(config, name, value)
        else:
            raise UsageError(message=f"share {name!r}: expected a path or {{path = ...}}")
    config.warnings = unknown_keys(data, args.config) if args.config else []
    given: set[str] = set()  # on the command line, which overrides the file
    for text, readonly in [(t, False) for t in args.share or []] + [
        (t, True) for t in args.share_ro or []
    ]:
        share = parse_share(text, readonly)
        if share.name in given:
            raise UsageError(message=f"share {share.name!r} is given twice "
                             "(--share and --share-ro names must differ)")
        given.add(share.name)
        config.shares[share.name] = share
        config.upstreams.pop(share.name, None)
    config.repos = load_repos(data, args)
    if not config.shares and not config.repos:
        raise UsageError(message="no shares: give --share NAME=PATH or --repo NAME=LOCATION "
                         "(or a config file)")
    both = sorted(set(config.shares) & set(config.repos))
    if both:
        raise UsageError(message=f"{both[0]!r} names both a share and a repository")
    token_file = args.token_file or data.get("token_file")
    if not token_file:
        raise UsageError(message="a token file is required (--token-file)")
    config.tokens = read_tokens(token_file, {**config.shares, **config.repos})
    state = args.state_dir or data.get("state_dir")
    if not state:
        raise UsageError(message="--state-dir is required (where the signature indexes live)")
    config.state_dir = Path(state).expanduser().resolve()
    for share in config.shares.values():
        if str(config.state_dir).startswith(share.path + os.sep) or str(
            config.state_dir
        ) == share.path:
            raise UsageError(message=f"the state directory must not be inside share "
                             f"{share.name!r}")
        versions = share.versions_dir or str(config.state_dir / "versions" / share.name)
        if versions == share.path or versions.startswith(share.path + os.sep):
            raise UsageError(message=f"the versions of share {share.name!r} must be kept "
                             "outside it")
    config.tls_cert = args.tls_cert or data.get("tls_cert")
    config.tls_key = args.tls_key or data.get("tls_key")
    if bool(config.tls_cert) != bool(config.tls_key):
        raise UsageError(message="TLS needs both --tls-cert and --tls-key")
    for key in ("max_connections", "max_connections_per_address"):
        value = getattr(args, key, None) or data.get(key)
        if value is None:
            continue
        if type(value) is not int or not 1 <= value <= 100_000:
            raise UsageError(message=f"{key} must be an integer from 1 to 100000, not {value!r}")
        setattr(config, key, value)
    scrub = getattr(args, "scrub_every", None) or data.get("scrub_every")
    if scrub is not None:
        from rdc_server.scrub import parse_interval

        config.scrub_every = parse_interval(scrub)
    return config
