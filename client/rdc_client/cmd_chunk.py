"""``rdc chunk FILE...``: chunk files and report the size distribution and throughput."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

from rdc.content.chunking import iter_chunk_views
from rdc.errors import FileAccessError, UsageError
from rdc.params import DEFAULT_CHUNKS, ChunkParams


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "chunk",
        help="cut files into content-defined chunks and show their sizes",
        description="Cut files into content-defined chunks (winnowing) and report the chunk "
        "count, size distribution and throughput.",
    )
    p.add_argument("files", nargs="+", metavar="FILE")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print one JSON object")
    out.add_argument("--list", action="store_true", help="print OFFSET LENGTH per chunk")
    p.add_argument("--window", type=int, default=DEFAULT_CHUNKS.window, help="window bytes")
    p.add_argument("--min-size", type=int, default=DEFAULT_CHUNKS.min_size)
    p.add_argument("--max-size", type=int, default=DEFAULT_CHUNKS.max_size)
    p.set_defaults(run=run)


def params_from(args: argparse.Namespace) -> ChunkParams:
    try:
        return ChunkParams(args.window, args.min_size, args.max_size)
    except ValueError as exc:
        raise UsageError(message=str(exc)) from None


def distribution(lengths: list[int]) -> dict[str, Any]:
    """min, mean, median, p99 (nearest rank) and max of chunk lengths."""
    if not lengths:
        return {"min": None, "mean": None, "median": None, "p99": None, "max": None}
    ordered = sorted(lengths)
    p99 = ordered[max(0, -(-99 * len(ordered) // 100) - 1)]
    return {
        "min": ordered[0],
        "mean": round(statistics.fmean(ordered), 1),
        "median": statistics.median(ordered),
        "p99": p99,
        "max": ordered[-1],
    }


def chunk_file(path: str, params: ChunkParams, listing: bool) -> dict[str, Any]:
    lengths: list[int] = []
    start = time.perf_counter()
    try:
        with open(path, "rb") as f:
            for offset, data in iter_chunk_views(f, params):
                lengths.append(len(data))
                if listing:
                    sys.stdout.write(f"{offset} {len(data)}\n")
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise FileAccessError(path=path, reason=exc.strerror or exc) from None
    seconds = time.perf_counter() - start
    size = sum(lengths)
    return {
        "path": path,
        "bytes": size,
        "chunks": len(lengths),
        **distribution(lengths),
        "seconds": round(seconds, 6),
        "mb_per_s": round(size / seconds / 1e6, 1) if seconds > 0 else None,
    }


def _human(report: dict[str, Any]) -> str:
    if not report["chunks"]:
        return f"{report['path']}: empty, 0 chunks"
    return (
        f"{report['path']}: {report['bytes']:,} bytes, {report['chunks']:,} chunks; "
        f"size min {report['min']:,} mean {report['mean']:,.0f} median {report['median']:,.0f} "
        f"p99 {report['p99']:,} max {report['max']:,}; {report['mb_per_s']:,.0f} MB/s"
    )


def run(args: argparse.Namespace) -> int:
    params = params_from(args)
    reports, failed = [], 0
    for i, path in enumerate(args.files):
        if args.list and len(args.files) > 1:
            sys.stdout.write(f"{'' if i == 0 else chr(10)}==> {path} <==\n")
        try:
            reports.append(chunk_file(path, params, args.list))
        except FileAccessError as exc:
            print(f"rdc: {exc}", file=sys.stderr)
            failed += 1
            continue
        if not args.list and not args.json:
            print(_human(reports[-1]))
    if args.json:
        doc = {
            "params": {
                "window": params.window,
                "min_size": params.min_size,
                "max_size": params.max_size,
            },
            "files": reports,
        }
        print(json.dumps(doc))
    return FileAccessError.exit_code if failed else 0
