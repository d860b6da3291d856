"""What sending a file or a tree costs a target that holds older data: the transfer's
descent run in memory (``rdc delta``)."""

from __future__ import annotations

import os

from rdc.content.signature import FileSignature, signature_of_path
from rdc.content.tree import Tree
from rdc.errors import RdcError
from rdc.local.replica import Replica
from rdc.params import WIRE_PREFIX
from rdc.transfer.descent import DeltaReport, SeedFile, SeedMap, SourceFile, rebuild, simulate
from rdc.transfer.seeds import choose_seeds, file_reader


def delta_one(
    new_path: str,
    tree: Tree,
    sketch: bytes | None,
    seeds: list[SeedFile],
    have: bool,
    prefix: int = WIRE_PREFIX,
    verify: bool = False,
    inline_subs: bool = False,
) -> DeltaReport:
    seed_map = SeedMap(seeds, prefix)
    source = SourceFile(tree, file_reader(new_path), prefix)
    plan, report, literal = simulate(source, seed_map, have, sketch, inline_subs)
    if verify and not report.have:
        with open(new_path, "rb") as f:
            if rebuild(plan, seed_map, literal) != f.read():
                raise RebuildMismatch(path=new_path)
    return report


class RebuildMismatch(RdcError):
    """verification failed: {path} rebuilt from the plan differs from the file"""


def delta_file_over_file(old: str, new: str, **kwargs) -> DeltaReport:
    old_sig, new_sig = signature_of_path(old), signature_of_path(new)
    seeds = [SeedFile(old_sig.tree, file_reader(old))]
    return delta_one(
        new, new_sig.tree, new_sig.sketch, seeds, old_sig.root == new_sig.root, **kwargs
    )


def delta_file_over_tree(
    old: Replica, new: str, signature: FileSignature | None = None, **kwargs
) -> DeltaReport:
    """Cost of sending the file ``new`` to a holder of the directory ``old`` (scanned)."""
    signature = signature or signature_of_path(new)
    have = bool(old.holders(signature.root, 1))
    seeds = [] if have else choose_seeds(old, None, signature.sketch)
    return delta_one(new, signature.tree, signature.sketch, seeds, have, **kwargs)


def delta_tree(old: Replica, new: Replica, costliest: list[tuple[str, DeltaReport]] | None = None,
               **kwargs) -> tuple[DeltaReport, int]:
    """Cost of bringing ``old`` to the content of ``new`` (both scanned): every file whose
    content differs from the file at its path in ``old`` is offered. (The directory
    comparison that finds them is not counted here.) Returns the summed report and the
    number of files offered; ``costliest``, if given, gets each file's (path, report)."""
    total = DeltaReport()
    offered = 0
    for f in new.db.files():
        same_path = old.db.get(f.path)
        if same_path is not None and same_path.root == f.root:
            continue
        offered += 1
        have = bool(old.holders(f.root, 1))
        seeds = [] if have else choose_seeds(old, f.path, f.sketch)
        new_path = os.path.join(new.root, f.path)
        report = delta_one(new_path, new.db.tree(f.id), f.sketch, seeds, have, **kwargs)
        total.add(report)
        if costliest is not None:
            costliest.append((f.path, report))
    return total, offered
