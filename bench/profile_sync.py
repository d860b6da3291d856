#!/usr/bin/env python3
"""Where a push spends its time: cProfile of the rdc client and of ``rdc serve`` (every
thread of each) for one push, with the top functions by self and by cumulative time and
calls per file of the operations that cost per file.

Cases: ``django`` (the first push of Django 5.0.1 into an empty directory of a share),
``many`` (the first push of a generated tree of --files small files,
fixtures/make_many_files.py) and ``version`` (a push of Django --new over --old with both
indexes warm: the server's from the push of --old, the client's from a push of --new
elsewhere, both made before the profiled processes start). Profiles go to --out (default
bench/results/profile-CASE), one ``client.prof`` and one ``server.prof``, readable with
pstats or snakeviz. Times are CPU seconds of each thread (waits do not count); profiling
slows Python code about 2x (each call is counted): read shares and counts, not absolute
times.

    python bench/profile_sync.py django
    python bench/profile_sync.py many --files 10000
    python bench/profile_sync.py version --old 5.0.6 --new 5.0.7
"""

from __future__ import annotations

import argparse
import pstats
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from syncbench.rdcrun import Rdc, Server
from syncbench.trees import tree_diff

HERE = Path(__file__).resolve().parent
WRAPPER = HERE / "syncbench" / "profiled.py"
# Operations whose count per file says what the per-file path does. A function counts if
# its label ('path:line(function)' or the builtin's name) holds every '*'-separated part.
COUNTED = {
    "fsync": ("posix.fsync>", "posix.fdatasync>"),
    "rename/replace": ("posix.rename>", "posix.replace>"),
    "link": ("posix.link>",),
    "unlink": ("posix.unlink>",),
    "open (os.open, io.open)": ("posix.open>", "io.open>"),
    "stat (stat, lstat, fstat, DirEntry.stat)": ("posix.stat>", "posix.lstat>",
                                                 "posix.fstat>", "'stat' of 'posix.DirEntry'"),
    "SQL statements (execute, executemany)": ("'execute' of 'sqlite3", "'executemany' of 'sqlite3"),
    "msgpack pack (rdc.wire.codec)": ("wire/codec.py*(pack)",),
    "msgpack unpack (rdc.wire.codec)": ("wire/codec.py*(unpack)",),
    "frames sent": ("wire/frames.py*(send)",),
    "zstd compress": ("'compress' of 'zstandard",),
    "zstd decompress": ("'decompress' of 'zstandard",),
    "chunker scan (C)": ("'scan' of 'rdc._native._chunker",),
    "BLAKE3 chunk hashing (C, bulk)": ("_blake3.hash_chunks",),
    "blake3 digest (tree nodes)": ("'digest' of 'blake3",),
    "socket send": ("'send' of '_socket.socket'", "'sendall' of '_socket.socket'"),
    "socket recv": ("'recv' of '_socket.socket'", "'recv_into' of '_socket.socket'"),
    "event-loop waits (epoll)": ("'poll' of 'select.epoll'",),
    "thread hand-offs (trio.to_thread)": ("(to_thread_run_sync)",),
}


def label(func: tuple[str, int, str]) -> str:
    path, line, name = func
    if path == "~":
        return name
    parts = Path(path).parts
    for root in ("rdc", "rdc_client", "rdc_server", "trio", "msgpack", "zstandard"):
        if root in parts:
            short = "/".join(parts[len(parts) - parts[::-1].index(root) - 1:])
            return f"{short}:{line}({name})"
    return f"{Path(path).name}:{line}({name})"


def top(stats: pstats.Stats, key: int, n: int, files: int) -> str:
    """Markdown table of the ``n`` functions with the most self (key 2) or cumulative
    (key 3) time."""
    raw = stats.stats  # type: ignore[attr-defined]
    rows = sorted(raw.items(), key=lambda kv: -kv[1][key])[:n]
    total = stats.total_tt or 1  # type: ignore[attr-defined]
    lines = ["| function | calls | calls/file | self s | self % | cum s |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for func, (_, nc, tt, ct, _) in rows:
        lines.append(f"| `{label(func)}` | {nc:,} | {nc / files:.1f} | {tt:.2f} | "
                     f"{tt / total:.0%} | {ct:.2f} |")
    return "\n".join(lines)


def area(lab: str) -> str:
    """Which part of the stack a function belongs to, for the self-time-by-area table."""
    if "'run' of '_contextvars.Context'" in lab:
        # trio's worker threads call C functions handed to them (zstd's compress for frames
        # of 16 KiB and more) from Context.run, where cProfile cannot see them.
        return "Context.run self: C calls on worker threads (zstd of big frames)"
    if lab.startswith("trio/"):
        return "trio (scheduling, threads, I/O)"
    if lab.startswith(("rdc/", "rdc_client/", "rdc_server/")):
        return lab.split(":")[0]
    for needle, name in (("sqlite3", "SQLite (C)"), ("zstandard", "zstd (C)"),
                         ("_blake3", "BLAKE3 (C)"), ("_chunker", "chunker (C)"),
                         ("blake3", "blake3 package (C)"), ("_socket", "sockets"),
                         ("select.epoll", "epoll"), ("posix.", "os calls (open, stat, ...)"),
                         ("io.open", "os calls (open, stat, ...)"), ("msgpack", "msgpack")):
        if needle in lab:
            return name
    if lab.startswith("<"):
        return "other builtins (len, isinstance, dict, list, ...)"
    return "other Python (stdlib: os, contextlib, pathlib, ...)"


def by_area(stats: pstats.Stats, n: int) -> str:
    raw = stats.stats  # type: ignore[attr-defined]
    areas: dict[str, list[float]] = {}
    for func, (_, nc, tt, _, _) in raw.items():
        figures = areas.setdefault(area(label(func)), [0, 0.0])
        figures[0] += nc
        figures[1] += tt
    total = stats.total_tt or 1  # type: ignore[attr-defined]
    lines = ["| area | calls | self s | self % |", "| --- | ---: | ---: | ---: |"]
    for name, (nc, tt) in sorted(areas.items(), key=lambda kv: -kv[1][1])[:n]:
        lines.append(f"| {name} | {int(nc):,} | {tt:.2f} | {tt / total:.0%} |")
    return "\n".join(lines)


def counted(stats: pstats.Stats, files: int) -> str:
    lines = ["| operation | calls | calls/file | self s |", "| --- | ---: | ---: | ---: |"]
    raw = stats.stats  # type: ignore[attr-defined]
    for what, needles in COUNTED.items():
        hits = [(nc, tt) for func, (_, nc, tt, _, _) in raw.items()
                if any(all(part in label(func) for part in n.split("*")) for n in needles)]
        calls, seconds = sum(h[0] for h in hits), sum(h[1] for h in hits)
        lines.append(f"| {what} | {calls:,} | {calls / files:.2f} | {seconds:.2f} |")
    return "\n".join(lines)


def report(side: str, path: Path, files: int, n: int) -> None:
    stats = pstats.Stats(str(path))
    seconds = stats.total_tt  # type: ignore[attr-defined]
    print(f"\n### {side}: {seconds:.1f} s CPU profiled (all threads), {files:,} files\n")
    print("Self time by area:\n")
    print(by_area(stats, n))
    print(f"\nTop {n} by self time:\n")
    print(top(stats, 2, n, files))
    print(f"\nTop {n} by cumulative time (coroutines count each resume as a call):\n")
    print(top(stats, 3, n, files))
    print("\nPer-file operations:\n")
    print(counted(stats, files))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("case", choices=("django", "many", "version"))
    ap.add_argument("--old", default="5.0.6", help="version: the Django release the server has")
    ap.add_argument("--new", default="5.0.7", help="version: the one pushed")
    ap.add_argument("--files", type=int, default=10_000, help="many: how many files")
    ap.add_argument("--corpus", type=Path, default=Path("/tmp/corpus"))
    ap.add_argument("--cache", type=Path, default=Path("/tmp/rdc-bench-cache"))
    ap.add_argument("--out", type=Path, help="where the profiles go")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--report", action="store_true",
                    help="only print the tables of the profiles already in --out")
    args = ap.parse_args()
    if args.report:
        out = (args.out or HERE / "results" / f"profile-{args.case}").resolve()
        files = int((out / "files").read_text())
        report("client (rdc push)", out / "client.prof", files, args.top)
        report("server (rdc serve)", out / "server.prof", files, args.top)
        return 0
    old = None
    if args.case in ("django", "version"):
        tree = args.corpus / "django" / ("5.0.1" if args.case == "django" else args.new)
        old = args.corpus / "django" / args.old if args.case == "version" else None
        for needed in (tree, old):
            if needed is not None and not needed.is_dir():
                raise SystemExit(f"{needed} missing: ../shared/bench/make_corpus.sh")
    else:
        gen = args.cache / f"many-{args.files}-s1"
        subprocess.run([sys.executable, str(HERE.parent / "fixtures" / "make_many_files.py"),
                        str(gen), "--files", str(args.files)], check=True)
        tree = gen / "base"
    out = (args.out or HERE / "results" / f"profile-{args.case}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    files = sum(1 for p in tree.rglob("*") if p.is_file())
    (out / "files").write_text(f"{files}\n")
    prefix = [sys.executable, str(WRAPPER)]
    with tempfile.TemporaryDirectory(prefix="rdc-profile-") as tmp:
        work = Path(tmp)
        cache = work / "cache"
        cache.mkdir()
        if old is not None:  # warm both indexes, unprofiled
            rdc_bin = str(Path(sys.executable).with_name("rdc"))
            server = Server(rdc_bin, work)
            server.start()
            try:
                warm = Rdc(rdc_bin, server, work)
                warm.command("push", [str(old), server.url("tree")], cache)
                warm.command("push", [str(tree), server.url("warm")], cache)
            finally:
                server.stop(signal.SIGINT)
        server = Server("rdc", work, prefix=[*prefix, str(out / "server.prof")])
        server.start()
        try:
            rdc = Rdc("rdc", server, work, prefix=[*prefix, str(out / "client.prof")])
            usage, stats = rdc.command("push", [str(tree), server.url("tree")], cache)
            verify = tree_diff(tree, server.share / "tree")
        finally:
            server.stop(signal.SIGINT)
    for side in ("client", "server"):
        if not (out / f"{side}.prof").is_file():
            raise SystemExit(f"no {side} profile was written to {out}")
    what = f"over {old}, indexes warm" if old is not None else "into an empty directory"
    print(f"# Profile of a push of {tree} ({files:,} files) {what}\n")
    print(f"push under the profiler: {usage.seconds:.1f} s wall, client {usage.cpu:.1f} s CPU "
          f"{usage.peak_rss / 1e6:.0f} MB, server {stats['_server_cpu']:.1f} s CPU "
          f"{stats['_server_rss'] / 1e6:.0f} MB; {stats['bytes_sent']:,} B sent, "
          f"{stats['bytes_received']:,} B received; receiver {verify}; profiles in {out}")
    report("client (rdc push)", out / "client.prof", files, args.top)
    report("server (rdc serve)", out / "server.prof", files, args.top)
    return 0 if verify == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
