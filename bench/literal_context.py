#!/usr/bin/env python3
"""What literal data costs compressed against different contexts (issue 18, step 3).

For each file of NEW that differs from the file at its path in OLD, the descent is run in
memory (`rdc.transfer.descent.simulate`, the old file as the only seed), giving the bytes
the source sends: the refined fetch items, or the whole file. Those bytes are then
compressed four ways, at zstd levels 3, 6 (the wire's first 32 MB) and 19:

- ``stream``: one zstd stream over every file's literal in path order, flushed per file,
  as the connection's compressor sees it (each frame compresses against the window of all
  frames before it);
- ``matched``: per file, with the file's matched bytes (the pieces the target rebuilds
  from its seed, which both sides hold) as a raw-content dictionary;
- ``stream+matched``: the stream, with each file's matched bytes put before its literal
  in a parallel stream whose cost of the matched part is left out (an upper bound on what
  feeding shared data into the connection's window could save);
- ``old``: per file, with the whole old file as the dictionary (what ``zstd
  --patch-from`` has per file and a sync does not: the source never holds it).

New files (no file at the path in OLD) go whole into the stream and count in all rows.
Prints one table; the numbers are sizes in bytes, the same on every machine.

    python bench/literal_context.py OLD NEW
    python bench/literal_context.py /tmp/corpus/django/5.0.1 /tmp/corpus/django/5.0.2
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import zstandard

from rdc.content.signature import signature_of_bytes
from rdc.transfer.descent import SeedFile, SeedMap, SourceFile, simulate

LEVELS = (3, 6, 19)
WINDOW_LOG = 22  # as rdc.wire.frames


def literal_of(old: bytes, new: bytes) -> tuple[bytes, bytes]:
    """(what the source sends for NEW with OLD as the seed, the matched bytes of NEW)."""
    source = SourceFile(signature_of_bytes(new).tree, lambda at, n: new[at : at + n])
    seeds = SeedMap([SeedFile(signature_of_bytes(old).tree, lambda at, n: old[at : at + n])])
    plan, _, _ = simulate(source, seeds, False)
    if plan.whole:
        return new, b""
    sent = b"".join(source.item(item.wire()) for item in plan.fetch)
    matched = b"".join(new[p.offset : p.offset + p.length] for p in plan.pieces if p.seed >= 0)
    return sent, matched


def pairs(old_root: Path, new_root: Path) -> list[tuple[bytes | None, bytes]]:
    """(old content or None, new content) of each changed or new regular file, by path."""
    out = []
    for dirpath, dirnames, names in os.walk(new_root):
        dirnames.sort()
        for name in sorted(names):
            new_path = Path(dirpath) / name
            if new_path.is_symlink() or not new_path.is_file():
                continue
            old_path = old_root / new_path.relative_to(new_root)
            new = new_path.read_bytes()
            old = (old_path.read_bytes()
                   if old_path.is_file() and not old_path.is_symlink() else None)
            if old != new:
                out.append((old, new))
    return out


def compressor(level: int) -> zstandard.ZstdCompressionObj:
    params = zstandard.ZstdCompressionParameters.from_level(level, window_log=WINDOW_LOG)
    return zstandard.ZstdCompressor(compression_params=params).compressobj()


def squeeze(stream: zstandard.ZstdCompressionObj, data: bytes) -> int:
    return len(stream.compress(data) + stream.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK))


def with_dictionary(level: int, dictionary: bytes, data: bytes) -> int:
    if not dictionary:
        return len(zstandard.ZstdCompressor(level=level).compress(data))
    d = zstandard.ZstdCompressionDict(dictionary[-(1 << WINDOW_LOG):],
                                      dict_type=zstandard.DICT_TYPE_RAWCONTENT)
    return len(zstandard.ZstdCompressor(level=level, dict_data=d).compress(data))


def measure(files: list[tuple[bytes | None, bytes]], level: int) -> dict[str, int]:
    sizes = dict.fromkeys(("stream", "matched", "stream+matched", "old"), 0)
    plain, primed = compressor(level), compressor(level)
    for old, new in files:
        sent, matched = literal_of(old, new) if old is not None else (new, b"")
        streamed = squeeze(plain, sent)
        sizes["stream"] += streamed
        squeeze(primed, matched)  # (not counted: the target would have it already)
        sizes["stream+matched"] += squeeze(primed, sent)
        if old is None:
            sizes["matched"] += streamed
            sizes["old"] += streamed
        else:
            sizes["matched"] += with_dictionary(level, matched, sent)
            sizes["old"] += with_dictionary(level, old, sent)
    return sizes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    args = ap.parse_args()
    files = pairs(args.old, args.new)
    raw = sum(len(literal_of(old, new)[0]) if old is not None else len(new)
              for old, new in files)
    print(f"{len(files)} files changed or new; literal bytes before compression: {raw:,}")
    print("| zstd level | stream (the wire) | matched as dictionary | stream + matched "
          "| old file as dictionary |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for level in LEVELS:
        s = measure(files, level)
        print(f"| {level} | {s['stream']:,} | {s['matched']:,} | {s['stream+matched']:,} "
              f"| {s['old']:,} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
