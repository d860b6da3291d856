"""``rdc versions list DIR [PATH]`` and ``rdc versions restore DIR PATH``: the versions
that syncs kept of the files they replaced or deleted in DIR (``rdc sync|watch
--versions``, a receive-only mirror, or a server share's ``versions`` setting), and
bringing one back."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from rdc.errors import FileAccessError, UsageError
from rdc.local.fs import SafeRoot
from rdc.local.paths import PathError, check_relpath
from rdc.local.versions import MARKER, Version, VersionStore, default_location, restore, restore_to
from rdc_client.progress import human_bytes


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "versions",
        help="list or restore the versions kept of replaced and deleted files",
        description="The versions rdc kept of files a sync replaced or deleted in DIR (the "
        "synced directory; or the store itself, for a server's share: "
        "STATE_DIR/versions/SHARE).",
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="list the versions (of PATH, a file or a "
                                 "directory, or of everything)")
    listing.add_argument("dir", metavar="DIR")
    listing.add_argument("path", metavar="PATH", nargs="?", default="")
    listing.add_argument("--json", action="store_true", help="print JSON")
    back = actions.add_parser("restore", help="put a version of PATH back (the newest, or "
                              "--at), keeping what is there now as a version")
    back.add_argument("dir", metavar="DIR")
    back.add_argument("path", metavar="PATH")
    back.add_argument("--at", metavar="WHEN",
                      help="the version: its name in the list, or a time it was kept "
                      "(YYYYMMDD-HHMMSS, UTC; a prefix picks the newest that matches)")
    back.add_argument("--to", metavar="FILE",
                      help="write it to FILE (new) instead of to PATH in DIR")
    for q in (listing, back):
        q.add_argument("--versions-dir", metavar="STORE",
                       help="where the versions are (default: where rdc sync keeps them)")
        q.set_defaults(run=run)


def open_store(args: argparse.Namespace) -> VersionStore:
    if args.versions_dir:
        return VersionStore.existing(args.versions_dir)
    if os.path.exists(os.path.join(args.dir, MARKER)):  # DIR is a store
        return VersionStore.existing(args.dir)
    if not os.path.isdir(args.dir):
        raise FileAccessError(path=args.dir, reason="not a directory")
    return VersionStore.existing(default_location(args.dir))


def _relpath(text: str) -> str:
    try:
        return check_relpath(text.strip("/"), allow_root=True)
    except PathError as exc:
        raise UsageError(message=str(exc)) from None


def run(args: argparse.Namespace) -> int:
    store = open_store(args)
    path = _relpath(args.path)
    found = store.versions(path)
    if args.action == "list":
        show(found, args.json)
        return 0
    chosen = choose(found, path, args.at)
    if args.to:
        try:
            restore_to(chosen, args.to)
        except FileExistsError:
            raise UsageError(message=f"{args.to} exists: --to writes a new file") from None
        except OSError as exc:
            raise FileAccessError(path=args.to, reason=exc.strerror or str(exc)) from None
        print(f"restored {chosen.path} ({chosen.label}) to {args.to}")
        return 0
    try:
        with SafeRoot(store.root) as root:
            root.keeper = store.keeper()  # what is there now becomes a version too
            restore(chosen, root, path)
    except (OSError, PathError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise FileAccessError(path=os.path.join(store.root, path), reason=reason) from None
    print(f"restored {chosen.path} ({chosen.label}) in {store.root}")
    return 0


def choose(found: list[Version], path: str, at: str | None) -> Version:
    """The version of file ``path`` that ``at`` names (the newest without it)."""
    mine = [v for v in found if v.path == path]
    if at:
        mine = [v for v in mine if v.label == at or _stamp(v).startswith(at)]
    if not mine:
        what = f" kept at {at}" if at else ""
        raise UsageError(message=f"no version of {path or '.'}{what}")
    return max(mine, key=lambda v: (v.kept, v.n))


def _stamp(version: Version) -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime(version.kept))


def show(found: list[Version], as_json: bool) -> None:
    if as_json:
        json.dump([{"path": v.path, "version": v.label, "kept": _stamp(v), "size": v.size,
                    "mtime_ns": v.mtime_ns, "mode": v.mode, "location": str(v.location)}
                   for v in found], sys.stdout, indent=2)
        print()
        return
    if not found:
        print("no versions")
        return
    rows = [("PATH", "KEPT (UTC)", "SIZE", "MODIFIED", "VERSION")]
    for v in found:
        modified = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(v.mtime_ns / 1e9))
        kept = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(v.kept))
        rows.append((v.path, kept, human_bytes(v.size), modified, v.label))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        print("  ".join([*(c.ljust(w) for c, w in zip(row, widths, strict=False)), row[4]]))

