"""``rdc backup SRC... REPO``: a snapshot of directories (or files) into a repository."""

from __future__ import annotations

import argparse

from rdc.errors import UsageError
from rdc.local.ignore import Excludes
from rdc.local.paths import displayable
from rdc.repo.backup import backup
from rdc_client.cmd_repo import ProgressLine, add_common, emit, open_repo
from rdc_client.progress import human_bytes
from rdc_client.remote_store import RemoteStore


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "backup", help="back up directories into a repository",
        description="Store a snapshot of SRC (directories or files) in REPO, storing only "
        "what the repository lacks: identical chunks once, chunks that resemble stored "
        "ones as deltas. Files unchanged since the last backup of the same source are not "
        "read again.")
    p.add_argument("paths", nargs="+", metavar="SRC... REPO")
    p.add_argument("--tag", action="append", default=[], metavar="TAG",
                   help="a tag for the snapshot (repeatable)")
    p.add_argument("--exclude", action="append", default=[], metavar="PATTERN",
                   help="leave out paths matching PATTERN (gitignore syntax, repeatable)")
    add_common(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if len(args.paths) < 2:
        raise UsageError(message="backup needs SRC... and REPO")
    *sources, args.repo = args.paths
    excludes = Excludes(args.exclude)
    line = ProgressLine("backing up", args.progress)
    with open_repo(args, write=True) as repo:
        try:
            result = backup(repo, sources, tags=args.tag, excludes=excludes, progress=line)
        finally:
            line.close()
        # Over the network: what travelled (after compression), both ways.
        wire = repo.store.wire_bytes() if isinstance(repo.store, RemoteStore) else None
    stats = result.stats
    added = stats.pack_bytes + stats.index_bytes
    if args.json:
        emit({"snapshot": result.snapshot.name, "short_id": result.snapshot.short_id,
              "files": result.files, "dirs": result.dirs, "links": result.links,
              "bytes": result.bytes, "files_read": result.files_read,
              "bytes_read": result.bytes_read, "files_unchanged": result.files_unchanged,
              "added_bytes": added, "stored": stats.as_dict(),
              "errors": [[p, r] for p, r in result.errors], "seconds": result.seconds,
              **({"wire": {"sent": wire[0], "received": wire[1]}} if wire else {})})
    else:
        for path, reason in result.errors:
            print(f"rdc: cannot back up {displayable(path)}: {reason}")
        print(f"snapshot {result.snapshot.short_id} saved: {result.files:,} files, "
              f"{result.dirs:,} directories, {human_bytes(result.bytes)}")
        print(f"read {result.files_read:,} files ({human_bytes(result.bytes_read)}), "
              f"{result.files_unchanged:,} unchanged; {stats.new_chunks:,} new chunks "
              f"({human_bytes(stats.new_chunk_bytes)}, {stats.delta_chunks:,} as deltas); "
              f"added {human_bytes(added)} in {result.seconds:.1f} s")
        if wire:
            print(f"network: {human_bytes(wire[0])} sent, {human_bytes(wire[1])} received")
    return 3 if result.errors else 0
