"""Repository commands: ``rdc init``, ``snapshots``, ``forget``, ``prune``, ``check``, and
what every repository command shares (the passphrase, progress, opening REPO)."""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
import time
from datetime import datetime
from typing import Any, TextIO

from rdc.errors import UsageError
from rdc.local.index import Progress
from rdc.local.paths import displayable
from rdc.repo.check import check
from rdc.repo.errors import PassphraseNeeded
from rdc.repo.policy import Policy, keep
from rdc.repo.prune import prune
from rdc.repo.repository import Repository
from rdc.repo.snapshots import Snapshot, newest_first
from rdc.storage import StoreAccessDenied
from rdc_client.options import add_server_options
from rdc_client.progress import human_bytes
from rdc_client.remote import read_token, tls_context
from rdc_client.remote_store import RemoteStore, open_remote_store

# ---------------------------------------------------------------- shared


def add_common(p: argparse.ArgumentParser, progress: bool = True) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object")
    if progress:
        p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                       help="show progress on stderr (default: when stderr is a terminal)")
    p.add_argument("--password-file", metavar="FILE",
                   help="the passphrase of an encrypted repository (its first line); else "
                   "$RDC_PASSWORD, $RDC_PASSWORD_FILE, or a prompt on a terminal")
    group = p.add_argument_group("a repository behind rdc serve (REPO is rdc://HOST[:PORT]/NAME)")
    add_server_options(group)  # type: ignore[arg-type]


def read_passphrase(args: argparse.Namespace, location: str, confirm: bool = False) -> bytes:
    """The passphrase from --password-file, RDC_PASSWORD, RDC_PASSWORD_FILE or a prompt."""
    path = getattr(args, "password_file", None) or os.environ.get("RDC_PASSWORD_FILE")
    if path:
        try:
            with open(path, "rb") as f:
                line = f.readline().rstrip(b"\r\n")
        except OSError as exc:
            raise UsageError(message=f"cannot read {path}: {exc.strerror}") from None
        if not line:
            raise UsageError(message=f"{path}: the first line is empty")
        return line
    text = os.environ.get("RDC_PASSWORD")
    if text:
        return os.fsencode(text)
    if sys.stdin.isatty() and sys.stderr.isatty():
        first = getpass.getpass(f"passphrase for {location}: ")
        if confirm and getpass.getpass("the same again: ") != first:
            raise UsageError(message="the passphrases differ")
        if not first:
            raise UsageError(message="an empty passphrase")
        return os.fsencode(first)
    raise PassphraseNeeded(location=location)


def remote_store(args: argparse.Namespace) -> RemoteStore | None:
    """For an ``rdc://`` REPO, its store through the server (connected now), else None."""
    if not args.repo.startswith("rdc://"):
        return None
    tls = tls_context(args.ca_file) if args.tls or args.ca_file else None
    return open_remote_store(args.repo, read_token(args.token_file), tls,
                             compress=not args.no_compress)


def open_repo(args: argparse.Namespace, init: bytes | bool | None = False,
              write: bool = False) -> Repository:
    """The repository REPO names; with ``init`` (False: open), made with that passphrase
    (None: unencrypted). A command that will ``write`` learns at once, not after its work,
    that the server grants its token reading only."""
    store = remote_store(args)
    try:
        if store is not None and (write or init is not False) and not store.writable:
            raise StoreAccessDenied(location=store.location, message=(
                "the server grants this token reading only (restore, ls, diff, snapshots, "
                "check)"))
        if init is not False:
            return Repository.init(args.repo, init, store=store)  # type: ignore[arg-type]
        return Repository.open(args.repo, lambda: read_passphrase(args, args.repo), store=store)
    except BaseException:
        if store is not None:
            store.close()
        raise


class ProgressLine:
    """``VERB files/total, bytes/total, rate``, redrawn at most every ``interval`` seconds."""

    def __init__(self, verb: str, enabled: bool | None, stream: TextIO | None = None,
                 interval: float = 0.2) -> None:
        self.verb = verb
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.interval = interval
        self.started = time.monotonic()
        self.last = 0.0
        self.width = 0

    def __call__(self, event: Progress) -> None:
        now = time.monotonic()
        if not self.enabled or (now - self.last < self.interval
                                and event.files_done != event.files_total):
            return
        self.last = now
        rate = event.bytes_done / max(now - self.started, 1e-6)
        text = (f"{self.verb} {event.files_done:,}/{event.files_total:,} files, "
                f"{human_bytes(event.bytes_done)} of {human_bytes(event.bytes_total)}, "
                f"{human_bytes(rate)}/s")
        self.stream.write("\r" + text.ljust(self.width))
        self.width = len(text)
        self.stream.flush()

    def say(self, text: str) -> None:
        if self.enabled:
            self.close()
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self.enabled and self.width:
            self.stream.write("\r" + " " * self.width + "\r")
            self.stream.flush()
            self.width = 0


def when(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9).strftime("%Y-%m-%d %H:%M:%S")


def snapshot_json(snap: Snapshot) -> dict[str, Any]:
    return {"id": snap.name, "short_id": snap.short_id, "time": when(snap.time),
            "time_ns": snap.time, "host": snap.host, "paths": snap.path_text,
            "tags": snap.tags, "parent": snap.parent, "summary": snap.summary}


def emit(value: Any) -> None:
    print(json.dumps(value))


# ---------------------------------------------------------------- commands


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("init", help="make a backup repository",
                       description="Make a backup repository in a directory, an S3 bucket "
                       "(s3://HOST[:PORT]/BUCKET[/PREFIX], s3+https://...), or one that rdc "
                       "serve exports (rdc://HOST[:PORT]/NAME).")
    p.add_argument("repo", metavar="REPO")
    p.add_argument("--encrypt", action="store_true",
                   help="encrypt everything with a key sealed by a passphrase")
    add_common(p, progress=False)
    p.set_defaults(run=run_init)

    p = sub.add_parser("snapshots", help="list the snapshots of a repository")
    p.add_argument("repo", metavar="REPO")
    add_common(p, progress=False)
    p.set_defaults(run=run_snapshots)

    p = sub.add_parser("forget", help="remove snapshots a keep policy does not name",
                       description="Keep the snapshots a policy names, per host and set of "
                       "paths, and remove the others (their data stays until prune).")
    p.add_argument("repo", metavar="REPO")
    for rule, what in (("last", "the newest N snapshots"),
                       ("daily", "the newest snapshot of each of the last N days"),
                       ("weekly", "the newest snapshot of each of the last N ISO weeks"),
                       ("monthly", "the newest snapshot of each of the last N months")):
        p.add_argument(f"--keep-{rule}", type=int, default=0, metavar="N", help=f"keep {what}")
    p.add_argument("--prune", action="store_true", help="prune afterwards")
    p.add_argument("-n", "--dry-run", action="store_true", help="say what would go, remove nothing")
    add_common(p)
    p.set_defaults(run=run_forget)

    p = sub.add_parser("prune", help="reclaim the space of data no snapshot uses")
    p.add_argument("repo", metavar="REPO")
    add_common(p)
    p.set_defaults(run=run_prune)

    p = sub.add_parser("check", help="check that a repository is whole")
    p.add_argument("repo", metavar="REPO")
    p.add_argument("--read-data", action="store_true",
                   help="also read every pack and check every record")
    add_common(p)
    p.set_defaults(run=run_check)


def run_init(args: argparse.Namespace) -> int:
    passphrase = read_passphrase(args, args.repo, confirm=True) if args.encrypt else None
    with open_repo(args, init=passphrase) as repo:
        if args.json:
            emit({"repository": repo.location, "id": repo.id, "encrypted": args.encrypt})
        else:
            kind = "encrypted repository" if args.encrypt else "repository"
            print(f"made {kind} {repo.id} at {repo.location}")
    return 0


def run_snapshots(args: argparse.Namespace) -> int:
    with open_repo(args) as repo:
        snaps = list(reversed(newest_first(repo.snapshots())))
    if args.json:
        emit([snapshot_json(s) for s in snaps])
        return 0
    if not snaps:
        print("no snapshots")
        return 0
    print(f"{'ID':8}  {'TIME':19}  {'HOST':12}  {'FILES':>8}  {'SIZE':>9}  PATHS")
    for s in snaps:
        tags = f"  [{', '.join(s.tags)}]" if s.tags else ""
        print(f"{s.short_id}  {when(s.time)}  {s.host[:12]:12}  "
              f"{s.summary.get('files', 0):>8,}  {human_bytes(s.summary.get('bytes', 0)):>9}  "
              f"{displayable(', '.join(s.path_text))}{tags}")
    return 0


def run_forget(args: argparse.Namespace) -> int:
    try:
        policy = Policy(args.keep_last, args.keep_daily, args.keep_weekly, args.keep_monthly)
    except ValueError as exc:
        raise UsageError(message=str(exc)) from None
    if policy.empty:
        raise UsageError(message="forget needs a --keep-last, --keep-daily, --keep-weekly or "
                         "--keep-monthly of at least 1 (it would forget everything)")
    line = ProgressLine("pruning", args.progress)
    with open_repo(args, write=not args.dry_run) as repo, repo.lock("exclusive", "forget"):
        snaps = repo.snapshots()
        kept = keep(snaps, policy)
        removed = [s for s in newest_first(snaps) if s.name not in kept]
        if not args.dry_run:
            for s in removed:
                repo.delete_snapshot(s.name)
        pruned = None
        if args.prune and not args.dry_run:
            pruned = prune(repo, line.say, locked=True).as_dict()
    line.close()
    if args.json:
        emit({"kept": [s.short_id for s in newest_first(snaps) if s.name in kept],
              "removed": [s.short_id for s in removed], "dry_run": args.dry_run,
              "prune": pruned})
        return 0
    verb = "would remove" if args.dry_run else "removed"
    for s in removed:
        print(f"{verb} {s.short_id}  {when(s.time)}  {s.host}  "
              f"{displayable(', '.join(s.path_text))}")
    print(f"kept {len(kept)} snapshots, {verb} {len(removed)}")
    if pruned is not None:
        _print_prune(pruned)
    return 0


def _print_prune(r: dict[str, int]) -> None:
    print(f"prune: {r['packs_deleted']} packs deleted, {r['packs_repacked']} repacked into "
          f"{r['packs_written']}, {r['unindexed_deleted']} unindexed removed; "
          f"{human_bytes(r['bytes_deleted'] - r['bytes_written'])} freed")


def run_prune(args: argparse.Namespace) -> int:
    line = ProgressLine("pruning", args.progress)
    with open_repo(args, write=True) as repo:
        result = prune(repo, line.say).as_dict()
    line.close()
    if args.json:
        emit(result)
    else:
        _print_prune(result)
    return 0


def run_check(args: argparse.Namespace) -> int:
    line = ProgressLine("checking", args.progress)
    with open_repo(args) as repo:
        result = check(repo, args.read_data, line.say)
    line.close()
    if args.json:
        emit({"ok": not result.errors, "errors": result.errors, "notes": result.notes,
              "snapshots": result.snapshots, "packs": result.packs, "blobs": result.blobs,
              "packs_read": result.packs_read, "bytes_read": result.bytes_read})
    else:
        for error in result.errors:
            print(f"error: {error}")
        for note in result.notes:
            print(f"note: {note}")
        read = f", {result.packs_read} packs read" if args.read_data else ""
        state = "no errors" if not result.errors else f"{len(result.errors)} errors"
        print(f"{result.snapshots} snapshots, {result.packs} packs, {result.blobs} blobs"
              f"{read}: {state}")
    return 1 if result.errors else 0
