"""``rdc restore``, ``rdc ls`` and ``rdc diff``: reading snapshots back."""

from __future__ import annotations

import argparse

from rdc.local.paths import displayable
from rdc.repo.listing import diff, items
from rdc.repo.restore import restore
from rdc_client.cmd_repo import ProgressLine, add_common, emit, open_repo, when
from rdc_client.progress import human_bytes


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "restore", help="restore a snapshot into a directory",
        description="Write snapshot SNAP (an id prefix or 'latest'), or PATH inside it, into "
        "DST (made if missing): files, directories, symlinks, modes and mtimes, each file "
        "written whole or not at all. Nothing is written outside DST.")
    p.add_argument("repo", metavar="REPO")
    p.add_argument("snapshot", metavar="SNAP[:PATH]")
    p.add_argument("target", metavar="DST")
    add_common(p)
    p.set_defaults(run=run_restore)

    p = sub.add_parser("ls", help="list the entries of a snapshot")
    p.add_argument("repo", metavar="REPO")
    p.add_argument("snapshot", metavar="SNAP")
    p.add_argument("path", nargs="?", default="", metavar="PATH")
    add_common(p, progress=False)
    p.set_defaults(run=run_ls)

    p = sub.add_parser("diff", help="what changed between two snapshots")
    p.add_argument("repo", metavar="REPO")
    p.add_argument("old", metavar="SNAP1")
    p.add_argument("new", metavar="SNAP2")
    add_common(p, progress=False)
    p.set_defaults(run=run_diff)


def run_restore(args: argparse.Namespace) -> int:
    line = ProgressLine("restoring", args.progress)
    with open_repo(args) as repo:
        try:
            result = restore(repo, args.snapshot, args.target, progress=line)
        finally:
            line.close()
    if args.json:
        emit({"files": result.files, "dirs": result.dirs, "links": result.links,
              "bytes": result.bytes, "errors": [[p, r] for p, r in result.errors],
              "seconds": result.seconds})
    else:
        for path, reason in result.errors:
            print(f"rdc: cannot restore {displayable(path)}: {reason}")
        print(f"restored {result.files:,} files, {result.dirs:,} directories, "
              f"{result.links:,} links, {human_bytes(result.bytes)} in {result.seconds:.1f} s")
    return 3 if result.errors else 0


_KINDS = {"f": "file", "d": "dir", "l": "link"}


def run_ls(args: argparse.Namespace) -> int:
    with open_repo(args) as repo, repo.lock("shared", "ls"):
        repo.sync_index()
        snap = repo.find_snapshot(args.snapshot)
        found = items(repo, snap, args.path)
    if args.json:
        emit({"snapshot": snap.name, "entries": [
            {"path": i.path, "kind": _KINDS[i.entry.kind], "mode": i.mode,
             "mtime_ns": i.mtime_ns, "size": i.entry.file.size if i.entry.file else 0,
             **({"target": i.entry.target} if i.entry.kind == "l" else {})} for i in found]})
        return 0
    for i in found:
        size = i.entry.file.size if i.entry.file else 0
        tail = f" -> {displayable(i.entry.target)}" if i.entry.kind == "l" else ""
        print(f"{i.entry.kind} {i.mode:04o} {size:>12,} {when(i.mtime_ns)}  "
              f"{displayable(i.path)}{'/' if i.entry.kind == 'd' else ''}{tail}")
    return 0


def run_diff(args: argparse.Namespace) -> int:
    with open_repo(args) as repo, repo.lock("shared", "diff"):
        repo.sync_index()
        snaps = repo.snapshots()
        old = repo.find_snapshot(args.old, snaps)
        new = repo.find_snapshot(args.new, snaps)
        changes = diff(items(repo, old), items(repo, new))
    names = {"+": "added", "-": "removed", "M": "changed", "m": "metadata"}
    if args.json:
        out: dict[str, list[str]] = {v: [] for v in names.values()}
        for c in changes:
            out[names[c.kind]].append(c.path)
        emit({"old": old.name, "new": new.name, **out})
        return 0
    for c in changes:
        print(f"{c.kind} {displayable(c.path)}")
    counts = {k: sum(c.kind == k for c in changes) for k in names}
    print(f"{counts['+']} added, {counts['-']} removed, {counts['M']} changed, "
          f"{counts['m']} with other mode or time")
    return 0
