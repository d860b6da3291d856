"""``rdc similar DIR``: groups of near-duplicate files, found through the sketch index."""

from __future__ import annotations

import argparse
import json
import os
from contextlib import closing

from rdc.content.signature import jaccard, sketch_elements
from rdc.content.sketch import resemblance
from rdc.local.index import CANDIDATE_THRESHOLD, IndexDatabase, RefreshStats
from rdc_client.local_index import scanned


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "similar",
        help="find groups of near-duplicate files in a directory",
        description="Find near-duplicate files: candidates come from the 12 "
        "inverted trait indices (not all pairs), then each pair is confirmed "
        "by comparing the files' chunk sets.",
    )
    p.add_argument("directory", metavar="DIR")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--threshold",
        type=int,
        default=CANDIDATE_THRESHOLD,
        help=f"traits of 12 a candidate must share (default {CANDIDATE_THRESHOLD})",
    )
    p.add_argument(
        "--min-resemblance",
        type=float,
        default=0.5,
        help="confirmed Jaccard resemblance that makes a pair (default 0.5)",
    )
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="show progress while signing (default: when stderr is a terminal)",
    )
    p.set_defaults(run=run)


class _Groups:
    def __init__(self) -> None:
        self.parent: dict[int, int] = {}

    def find(self, x: int) -> int:
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def join(self, a: int, b: int) -> None:
        self.parent[self.find(a)] = self.find(b)


def run(args: argparse.Namespace) -> int:
    with closing(scanned(args.directory, args.progress)) as replica:
        return _similar(args, replica.db, replica.stats)


def _similar(args: argparse.Namespace, db: IndexDatabase, stats: RefreshStats) -> int:
    files = {f.id: f for f in db.files() if f.sketch is not None}
    elements: dict[int, set[bytes]] = {}

    def elements_of(file_id: int) -> set[bytes]:
        if file_id not in elements:
            path = os.path.join(args.directory, files[file_id].path)

            def read_all() -> bytes:
                with open(path, "rb") as f:
                    return f.read()

            elements[file_id] = sketch_elements(db.tree(file_id), read_all)
        return elements[file_id]

    pairs, groups = [], _Groups()
    for file_id, f in files.items():
        for other, _ in db.candidates(f.sketch, args.threshold, limit=20, exclude=file_id):
            if other < file_id or other not in files:
                continue
            try:
                exact = jaccard(elements_of(file_id), elements_of(other))
            except OSError:
                continue  # changed or gone since the refresh
            if exact < args.min_resemblance:
                continue
            estimate = resemblance(f.sketch, files[other].sketch)
            pairs.append((file_id, other, estimate, exact))
            groups.join(file_id, other)
    members: dict[int, list[int]] = {}
    for file_id in sorted({x for p in pairs for x in p[:2]}, key=lambda i: files[i].path):
        members.setdefault(groups.find(file_id), []).append(file_id)
    report = []
    for ids in sorted(members.values(), key=lambda m: files[m[0]].path):
        group_pairs = [p for p in pairs if groups.find(p[0]) == groups.find(ids[0])]
        report.append(
            {
                "files": [files[i].path for i in ids],
                "pairs": [
                    {
                        "a": files[a].path,
                        "b": files[b].path,
                        "estimate": round(est.estimate, 3),
                        "stderr": round(est.stderr, 3),
                        "matching_traits": est.matches,
                        "jaccard": round(exact, 3),
                    }
                    for a, b, est, exact in group_pairs
                ],
            }
        )
    if args.json:
        print(
            json.dumps(
                {
                    "directory": args.directory,
                    "files_indexed": stats.files,
                    "threshold": args.threshold,
                    "groups": report,
                }
            )
        )
        return 0
    if not report:
        print(f"no near-duplicates among {stats.files:,} files")
    for n, group in enumerate(report, 1):
        print(f"group {n} ({len(group['files'])} files):")
        for pair in group["pairs"]:
            print(
                f"  {pair['a']}  ~  {pair['b']}: resemblance {pair['jaccard']:.2f} "
                f"(sketch estimate {pair['estimate']:.2f} ± {pair['stderr']:.2f}, "
                f"{pair['matching_traits']}/12 traits)"
            )
    return 0
