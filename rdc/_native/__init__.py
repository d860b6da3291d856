"""The one place that picks the native implementations: the chunker, the chunk hashes, the
sketch, tree grouping and packing (and unpacking) of signatures, a small buffer's whole
signature in one call (and many small files' in another), the refinement encoder, the
directory listing of walks, a metadata vector's modes and times, a batch's temporary files,
trees of entries (a walk's entries made, a kept tree unpacked, directories sealed and
stamped), and the set sketch that reconciles two sets of fingerprints (sums, locator, roots).

The compiled modules are required unless ``RDC_PUREPYTHON=1`` forces the pure-Python
references: a broken build must fail loudly, not hide behind a 100x slower fallback.
"""

from __future__ import annotations

import os
from typing import Any

from rdc._native import signature_ref

PURE_PYTHON = os.environ.get("RDC_PUREPYTHON", "") not in ("", "0")

if PURE_PYTHON:
    from rdc._native import blake3_ref, listing_ref, refine_ref, setsketch_ref
    from rdc._native.chunker_ref import ReferenceScanner

    Scanner = ReferenceScanner
    hash_chunks = blake3_ref.hash_chunks
    sketch = signature_ref.sketch
    group_cuts = signature_ref.group_cuts
    next_level_payloads = signature_ref.next_level_payloads
    trait_candidates = signature_ref.trait_candidates
    trait_buckets = signature_ref.trait_buckets
    list_dir = listing_ref.list_dir
    stamp_tree = listing_ref.stamp_tree
    refine_encode = refine_ref.encode
    set_sketch = setsketch_ref.set_sketch
    set_locator = setsketch_ref.set_locator
    set_roots = setsketch_ref.set_roots
    sign_buffer = None  # (the step-by-step path of rdc.content.signature is the reference)
    sign_files = None  # (files are then read and signed one at a time)
    set_meta = None  # (entries are then set one at a time)
    pack_tree = None  # (rdc.content.tree packs in Python)
    unpack_level = None  # (and unpacks in Python)
    make_temps = None  # (temporaries are then made one at a time)
    install_new = None  # (and installed one at a time)
    make_dirs = None  # (directories are then made one at a time)
    unpack_sealed = None  # (rdc.local.sealed unpacks in Python)
    list_entries = None  # (rdc.local.snapshot makes a walk's entries in Python)
    seal_entries = None  # (rdc.local.snapshot seals and stamps in Python)
    stamp_entries = None
    start_writeback = None  # (the commit's fsync writes a file's every page)
    IMPLEMENTATION = "python"
else:
    try:
        from rdc._native._blake3 import hash_chunks
        from rdc._native._chunker import Scanner
        from rdc._native._entries import list as list_entries
        from rdc._native._entries import seal as seal_entries
        from rdc._native._entries import stamp as stamp_entries
        from rdc._native._entries import unpack as unpack_sealed
        from rdc._native._listing import list_dir, stamp_tree
        from rdc._native._meta import set_meta
        from rdc._native._refine import encode as refine_encode
        from rdc._native._setsketch import set_locator, set_roots, set_sketch
        from rdc._native._sign import sign as sign_buffer
        from rdc._native._sign import sign_files
        from rdc._native._signature import (
            group_cuts,
            next_level_payloads,
            pack_tree,
            sketch,
            trait_buckets,
            trait_candidates,
            unpack_level,
        )
        from rdc._native._temps import install_new, make_dirs, make_temps, start_writeback
    except ImportError as exc:  # pragma: no cover - exercised by a broken install
        raise ImportError(
            f"rdc's C extension did not load ({exc}). Reinstall rdc where gcc and the "
            "Python headers are available (pip install -e .), or set RDC_PUREPYTHON=1 "
            "to run the slow pure-Python implementation."
        ) from exc
    IMPLEMENTATION = "c"


def __getattr__(name: str) -> Any:
    # The reference chunker builds its Rabin tables in Python when imported: only tests and
    # the pure run need it, so a command's start-up does not pay for it.
    if name == "ReferenceScanner":
        from rdc._native.chunker_ref import ReferenceScanner

        return ReferenceScanner
    raise AttributeError(name)


__all__ = [
    "IMPLEMENTATION",
    "PURE_PYTHON",
    "ReferenceScanner",
    "Scanner",
    "group_cuts",
    "hash_chunks",
    "install_new",
    "list_dir",
    "list_entries",
    "make_dirs",
    "make_temps",
    "next_level_payloads",
    "pack_tree",
    "refine_encode",
    "seal_entries",
    "set_locator",
    "set_meta",
    "set_roots",
    "set_sketch",
    "sign_buffer",
    "sign_files",
    "sketch",
    "stamp_entries",
    "stamp_tree",
    "start_writeback",
    "trait_buckets",
    "trait_candidates",
    "unpack_level",
    "unpack_sealed",
]
