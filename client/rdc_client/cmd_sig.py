"""``rdc sig FILE``: a file's Merkle root, tree levels and similarity sketch."""

from __future__ import annotations

import argparse
import json
import sys

from rdc.content.signature import signature_of_path
from rdc.errors import FileAccessError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sig",
        help="show a file's signature: root, tree levels, sketch",
        description="Compute a file's signature: its Merkle root over "
        "content-defined chunks, the node count of each tree level, and "
        "its 12-trait similarity sketch.",
    )
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("--json", action="store_true", help="print one JSON object per line")
    p.set_defaults(run=run)


def describe(path: str) -> dict:
    try:
        signature = signature_of_path(path)
    except OSError as exc:
        raise FileAccessError(path=path, reason=exc.strerror or exc) from None
    levels = signature.tree.levels
    return {
        "path": path,
        "size": signature.size,
        "root": signature.root.hex(),
        "chunks": len(levels[0]),
        "levels": [{"level": i + 1, "nodes": len(level)} for i, level in enumerate(levels)],
        "sketch": list(signature.sketch) if signature.sketch is not None else None,
    }


def run(args: argparse.Namespace) -> int:
    failed = 0
    for path in args.files:
        try:
            info = describe(path)
        except FileAccessError as exc:
            print(f"rdc: {exc}", file=sys.stderr)
            failed += 1
            continue
        if args.json:
            print(json.dumps(info))
            continue
        sketch = (
            "none (empty file)"
            if info["sketch"] is None
            else " ".join(f"{t:02d}" for t in info["sketch"])
        )
        counts = ", ".join(f"level {lv['level']}: {lv['nodes']:,}" for lv in info["levels"])
        print(
            f"{path}\n  size    {info['size']:,} bytes\n  root    {info['root']}\n"
            f"  chunks  {info['chunks']:,}\n  levels  {counts}\n  sketch  {sketch}"
        )
    return FileAccessError.exit_code if failed else 0
