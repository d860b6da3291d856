"""``rdc delta OLD NEW``: what sending NEW costs a receiver that holds OLD."""

from __future__ import annotations

import argparse
import json
import os
from contextlib import closing

from rdc.errors import FileAccessError, UsageError
from rdc.local.paths import displayable
from rdc.params import WIRE_PREFIX
from rdc.transfer.delta import delta_file_over_file, delta_file_over_tree, delta_tree
from rdc.transfer.descent import DeltaReport
from rdc_client.local_index import scanned


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "delta",
        help="what a transfer of NEW to a holder of OLD would cost",
        description="Run the transfer's descent in memory and report its cost: "
        "literal bytes, signature bytes per tree level, round trips. OLD is a "
        "file or a directory of candidate seeds; NEW a file, or a directory "
        "(then each file is sent over the same path in OLD plus similar "
        "files found by sketch).",
    )
    p.add_argument("old", metavar="OLD")
    p.add_argument("new", metavar="NEW")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--hash-bytes",
        type=int,
        default=WIRE_PREFIX,
        choices=(4, 6, 8, 12, 16, 32),
        help=f"hash prefix bytes per wire entry (default {WIRE_PREFIX})",
    )
    p.add_argument(
        "--verify", action="store_true", help="rebuild NEW from the plan and check it byte for byte"
    )
    p.add_argument(
        "--files", type=int, default=0, metavar="N",
        help="with two directories, also list the N files that cost the most bytes",
    )
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    old, new = args.old, args.new
    for path in (old, new):
        if not os.path.exists(path):
            raise FileAccessError(path=path, reason="No such file or directory")
    kwargs = {"prefix": args.hash_bytes, "verify": args.verify}
    if args.files < 0:
        raise UsageError(message="--files takes a count of 0 or more")
    costliest: list[tuple[str, DeltaReport]] = []
    try:
        if os.path.isdir(new):
            if not os.path.isdir(old):
                raise UsageError(message="when NEW is a directory, OLD must be one too")
            with closing(scanned(old, args.progress)) as o, closing(
                scanned(new, args.progress)
            ) as n:
                total, files = delta_tree(o, n, costliest if args.files else None, **kwargs)
        elif os.path.isdir(old):
            with closing(scanned(old, args.progress)) as o:
                total, files = delta_file_over_tree(o, new, **kwargs), 1
        else:
            total, files = delta_file_over_file(old, new, **kwargs), 1
    except OSError as exc:
        raise FileAccessError(path=exc.filename or new, reason=exc.strerror or exc) from None
    result = {
        "old": old,
        "new": new,
        "files": files,
        "literal_bytes": total.literal_bytes,
        "matched_bytes": total.matched_bytes,
        "refined_bytes": total.refined_bytes,
        "false_matches": total.false_matches,
        "signature_bytes": total.signature_bytes,
        "signature_bytes_by_level": dict(sorted(total.signature_bytes_by_level.items())),
        "request_bytes": total.request_bytes,
        "offer_bytes": total.offer_bytes,
        "data_message_bytes": total.data_message_bytes,
        "total_bytes": total.total_bytes,
        "round_trips": total.round_trips,
        "hash_bytes": args.hash_bytes,
    }
    if args.verify:  # (a file that did not rebuild raised RebuildMismatch)
        result["verified"] = files
    costliest.sort(key=lambda item: (-item[1].total_bytes, item[0]))
    top = costliest[: args.files]
    if args.files:
        result["costliest"] = [{"path": path, "total_bytes": r.total_bytes,
                                "literal_bytes": r.literal_bytes,
                                "signature_bytes": r.signature_bytes,
                                "request_bytes": r.request_bytes, "offer_bytes": r.offer_bytes}
                               for path, r in top]
    if args.json:
        print(json.dumps(result))
        return 0
    levels = ", ".join(f"{k} {v:,}" for k, v in result["signature_bytes_by_level"].items())
    print(
        f"{new} over {old} ({files:,} file{'s' if files != 1 else ''} offered):\n"
        f"  literal     {total.literal_bytes:,} bytes\n"
        f"  matched     {total.matched_bytes:,} bytes (of which {total.refined_bytes:,} "
        f"refined: old blocks below the sub-chunks; {total.false_matches:,} fetched again)\n"
        f"  signatures  {total.signature_bytes:,} bytes ({levels or 'none'})\n"
        f"  requests    {total.request_bytes:,} bytes, offers {total.offer_bytes:,} bytes\n"
        f"  total       {total.total_bytes:,} bytes in {total.round_trips} round trips"
    )
    if args.verify:
        print(f"  verified    {new} rebuilt from the plan byte for byte "
              f"({files:,} file{'s' if files != 1 else ''})")
    if top:
        print(f"  costliest {'total':>9} {'literal':>9} {'signatures':>10} {'requests':>9}  file")
        for path, r in top:
            print(f"{'':12}{r.total_bytes:>9,} {r.literal_bytes:>9,} {r.signature_bytes:>10,} "
                  f"{r.request_bytes:>9,}  {displayable(path)}")
    return 0
