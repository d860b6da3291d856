#!/usr/bin/env python3
"""Signature speed against BLAKE3 alone, and ``rdc delta`` bytes against rsync's.

Part 1, in memory: signature throughput (chunk + BLAKE3 + tree + sketch, all cores) of
random data next to one BLAKE3 call over the same data on one thread, and the parts that
bound it: the chunker alone, and the chunk hashes: rdc's C BLAKE3 of all chunks in one call
on each code path this CPU has (one thread), and blake3-py per chunk on one and on two
threads (it takes the GIL back after each chunk, so two threads are no faster). Then a tree
of small files (Django) signed one by one (with and without the one-call native signer,
next to BLAKE3 of each file alone) and refreshed into an index.

Part 2, bytes on the wire for the corpora of ../shared/bench/ (make_corpus.sh,
make_scattered.py): the ``rdc delta --json`` totals of each case beside rsync's bytes
(sent + received), measured in this run over the fake remote shell ``localsh`` on copies in
a temporary directory, the best of -a, -az and -acz (and --fuzzy for the renamed tree).
rdc's totals do not count the directory comparison that finds the changed files; rsync's
include its file list.

Absolute speeds on these shared 2-core machines swing between runs; ratios measured in one
run hold better. Other processes' CPU use during each timed run is reported, and runs
disturbed by them are retried for up to --patience seconds per measurement. Prints
tables; the last line is one JSON object. Serialize with other benchmarks:

    flock /tmp/rdc-bench.lock python bench/signatures.py [--mib 1024] [--corpus /tmp/corpus]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable

import blake3

from rdc import _native
from rdc._native import _blake3
from rdc.content.signature import signature_of_bytes, signature_of_path
from rdc.content.stream import StreamSigner
from rdc.local.index import IndexDatabase, refresh
from rdc.local.replica import Replica
from rdc.params import DEFAULT_CHUNKS
from rdc.transfer.delta import delta_file_over_file, delta_tree
from rdc.transfer.descent import DeltaReport

MIB = 1 << 20
HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_LOCALSH = os.path.join(HERE, os.pardir, os.pardir, "shared", "bench", "localsh")
DJANGO = ("5.0.1", "5.0.2", "5.0.3", "5.0.4", "5.0.6", "5.0.7")


# ---------------------------------------------------------------- timing


def _cpu_ticks() -> tuple[int, int]:
    """(all, idle) jiffies of the machine, or zeros where /proc/stat is missing."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return 0, 0
    return sum(fields), fields[3] + fields[4]


class Timing:
    """One timed call: wall seconds, this process's CPU and the other processes' CPU, both
    in percent of one core."""

    def __init__(self, fn: Callable[[], object]) -> None:
        all0, idle0 = _cpu_ticks()
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        start = time.perf_counter()
        self.result = fn()
        self.seconds = time.perf_counter() - start
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        all1, idle1 = _cpu_ticks()
        mine = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
        self.cpu = 100 * mine / self.seconds
        busy = (all1 - all0) - (idle1 - idle0)
        machine = 100 * (os.cpu_count() or 1) * busy / (all1 - all0) if all1 > all0 else 0.0
        self.others = max(0.0, machine - self.cpu)


QUIET = 15.0  # other processes' CPU (% of a core) under which a run counts as undisturbed


def best(fn: Callable[[], object], runs: int, patience: float = 0.0) -> Timing:
    """The fastest of ``runs`` runs. With ``patience`` (seconds), runs disturbed by other
    processes are retried until an undisturbed one is among them or the time is up."""
    timings = [Timing(fn) for _ in range(runs)]
    deadline = time.monotonic() + patience
    while min(t.others for t in timings) > QUIET and time.monotonic() < deadline:
        time.sleep(2)
        timings.append(Timing(fn))
    quiet = [t for t in timings if t.others <= QUIET] or timings
    return min(quiet, key=lambda t: t.seconds)


def mbps(size: int, timing: Timing) -> float:
    return size / timing.seconds / 1e6


# ---------------------------------------------------------------- part 1: speed


def hash_spans(view: memoryview, spans: list[tuple[int, int]]) -> None:
    b3 = blake3.blake3
    for start, end in spans:
        b3(view[start:end]).digest()


def on_threads(fn: Callable, parts: list) -> None:
    threads = [threading.Thread(target=fn, args=part) for part in parts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def stream_signed(view: memoryview, ends: list[int] | None = None) -> object:
    signer = StreamSigner(ends=ends)
    for at in range(0, len(view), MIB):
        signer.feed(view[at : at + MIB])
    return signer.finish()


def speed(mib: int, runs: int, patience: float) -> dict:
    size = mib * MIB
    rng = random.Random(1)
    data = b"".join(rng.randbytes(MIB) for _ in range(mib))
    view = memoryview(data)
    p = DEFAULT_CHUNKS
    rows: dict[str, Timing] = {}
    rows["blake3, one call, 1 thread"] = best(lambda: blake3.blake3(data).digest(), runs, patience)
    rows["blake3, one call, 2 threads"] = best(
        lambda: on_threads(
            lambda v: blake3.blake3(v).digest(), [(view[: size // 2],), (view[size // 2 :],)]
        ),
        runs,
        patience,
    )
    scanner = lambda: _native.Scanner(p.window, p.min_size, p.max_size)  # noqa: E731
    scan = best(lambda: scanner().scan(data, 0, True), runs, patience)
    rows["chunker alone, 1 thread"] = scan
    ends = scan.result
    spans = list(zip([0, *ends[:-1]], ends, strict=True))
    half = len(spans) // 2
    rows["blake3 per chunk, 1 thread"] = best(lambda: hash_spans(view, spans), runs, patience)
    rows["blake3 per chunk, 2 threads"] = best(
        lambda: on_threads(hash_spans, [(view, spans[:half]), (view, spans[half:])]),
        runs,
        patience,
    )
    hash_chunks = _blake3.hash_chunks
    for path in _blake3.paths():
        rows[f"rdc hash_chunks {path}, 1 thread"] = best(
            lambda path=path: hash_chunks(data, ends, path=path), runs, patience
        )
    sig = best(lambda: signature_of_bytes(data), runs, patience)
    rows["signature_of_bytes"] = sig
    with tempfile.NamedTemporaryFile(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as f:
        f.write(data)
        f.flush()
        sig_file = best(lambda: signature_of_path(f.name), runs, patience)
        rows["signature_of_path (tmpfs file)"] = sig_file
    # As one segment, on the calling thread alone: what the parallel segments buy.
    with_one_segment = best(lambda: signature_of_bytes(data, segment_size=size), 1, patience)
    rows["signature_of_bytes, 1 thread"] = with_one_segment
    # The target's path: a rebuilt file signed as it is written, in 1 MiB pieces.
    streamed = best(lambda: stream_signed(view), runs, patience)
    rows["StreamSigner, 1 MiB pieces"] = streamed
    # The same where the leaf ends are known (a delta's target): hashing without chunking.
    ends = list(itertools.accumulate(sig.result.tree.leaves.lengths))
    at_ends = best(lambda: stream_signed(view, ends), runs, patience)
    rows["StreamSigner at known leaf ends"] = at_ends
    if any(t.result != sig.result for t in (sig_file, with_one_segment, streamed, at_ends)):
        raise SystemExit("signatures differ between paths: a bug")
    blake = rows["blake3, one call, 1 thread"]
    print(f"Signature speed: {mib} MiB random in memory, best of {runs} runs")
    print(f"{'what':<36} {'MB/s':>7} {'vs blake3':>10} {'cpu %':>6} {'others %':>9}")
    for name, t in rows.items():
        print(
            f"{name:<36} {mbps(size, t):>7.0f} {blake.seconds / t.seconds:>10.2f} "
            f"{t.cpu:>6.0f} {t.others:>9.0f}"
        )
    return {
        "sig_mbps": round(mbps(size, sig), 1),
        "blake3_mbps": round(mbps(size, blake), 1),
        "sig_vs_blake3": round(blake.seconds / sig.seconds, 3),
        "sig_file_mbps": round(mbps(size, sig_file), 1),
        "sig_one_thread_mbps": round(mbps(size, with_one_segment), 1),
        "stream_signer_mbps": round(mbps(size, streamed), 1),
        "stream_signer_known_ends_mbps": round(mbps(size, at_ends), 1),
        "blake3_2threads_mbps": round(mbps(size, rows["blake3, one call, 2 threads"]), 1),
        "chunker_mbps": round(mbps(size, scan), 1),
        "blake3_per_chunk_mbps": round(mbps(size, rows["blake3 per chunk, 1 thread"]), 1),
        "blake3_per_chunk_2threads_mbps": round(
            mbps(size, rows["blake3 per chunk, 2 threads"]), 1
        ),
        "hash_chunks_mbps": {
            path: round(mbps(size, rows[f"rdc hash_chunks {path}, 1 thread"]), 1)
            for path in _blake3.paths()
        },
        "sig_cpu_pct": round(sig.cpu),
        "others_cpu_pct_during_sig": round(sig.others),
        "mib": mib,
    }


def small_files(root: str, runs: int, patience: float) -> dict | None:
    if not os.path.isdir(root):
        print(f"\nsmall files: {root} missing, skipped")
        return None
    paths = [os.path.join(d, name) for d, _, names in os.walk(root) for name in names]
    size = sum(os.path.getsize(p) for p in paths)

    def sign_all() -> None:
        for path in paths:
            signature_of_path(path)

    def sign_steps() -> None:  # without the one-call native signer (rdc._native._sign)
        saved, _native.sign_buffer = _native.sign_buffer, None
        try:
            sign_all()
        finally:
            _native.sign_buffer = saved

    def blake3_all() -> None:  # the reference: read and hash each file, nothing else
        for path in paths:
            with open(path, "rb") as f:
                blake3.blake3(f.read()).digest()

    def refreshed(workers: int) -> Callable[[], object]:
        def run() -> object:
            with tempfile.TemporaryDirectory() as tmp:
                db = IndexDatabase(os.path.join(tmp, "index.sqlite3"))
                try:
                    return refresh(db, root, workers=workers)
                finally:
                    db.close()

        return run

    rows = {
        "BLAKE3 of each file (reference)": best(blake3_all, runs, patience),
        "signature_of_path, one by one": best(sign_all, runs, patience),
        "... step by step (no one-call signer)": best(sign_steps, runs, patience),
        "index refresh, 1 worker": best(refreshed(1), runs, patience),
        "index refresh, 2 workers": best(refreshed(2), runs, patience),
    }
    print(f"\nSmall files: {root} ({len(paths):,} files, {size / 1e6:.1f} MB), best of {runs}")
    print(f"{'what':<36} {'files/s':>8} {'MB/s':>7} {'cpu %':>6} {'others %':>9}")
    for name, t in rows.items():
        print(
            f"{name:<36} {len(paths) / t.seconds:>8.0f} {mbps(size, t):>7.1f} "
            f"{t.cpu:>6.0f} {t.others:>9.0f}"
        )
    return {name: round(len(paths) / t.seconds) for name, t in rows.items()} | {
        "files": len(paths)
    }


# ---------------------------------------------------------------- part 2: bytes


def rsync_bytes(src: str, seed: str, options: list[str], localsh: str, work: str) -> int:
    """Bytes rsync sends plus receives to bring a copy of ``seed`` up to ``src`` over the
    fake remote shell (its real sender and receiver, over pipes)."""
    dst = os.path.join(work, "dst")
    shutil.rmtree(dst, ignore_errors=True)
    subprocess.run(["cp", "-a", seed, dst], check=True)
    out = subprocess.run(
        ["rsync", *options, "--stats", "-e", localsh, f"{src}/", f"localhost:{dst}/"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    total = 0
    for label in ("Total bytes sent", "Total bytes received"):
        match = re.search(rf"^{label}: ([\d,]+)", out, re.MULTILINE)
        if not match:
            raise RuntimeError(f"rsync --stats without {label!r}:\n{out}")
        total += int(match.group(1).replace(",", ""))
    diff = subprocess.run(["diff", "-rq", src, dst], capture_output=True)
    if diff.returncode != 0:
        raise RuntimeError(f"rsync left {dst} different from {src}")
    shutil.rmtree(dst)
    return total


def rdc_tree_delta(old: str, new: str, work: str) -> tuple[DeltaReport, int]:
    old_replica = Replica(old, os.path.join(work, "old.sqlite3"))
    new_replica = Replica(new, os.path.join(work, "new.sqlite3"))
    try:
        old_replica.scan()
        new_replica.scan()
        return delta_tree(old_replica, new_replica)
    finally:
        old_replica.close()
        new_replica.close()
        for name in ("old", "new"):
            for suffix in ("", "-wal", "-shm"):
                path = os.path.join(work, f"{name}.sqlite3{suffix}")
                if os.path.exists(path):
                    os.remove(path)


def cases(corpus: str) -> list[tuple[str, str, str, list[list[str]]]]:
    """(name, old, new, rsync option sets) of each case whose corpus exists."""
    found = []
    versions = [v for v in DJANGO if os.path.isdir(os.path.join(corpus, "django", v))]
    plain = [["-a", "--delete"], ["-az", "--delete"], ["-acz", "--delete"]]
    for a, b in itertools.pairwise(versions):
        found.append(
            (f"django {a} -> {b}", f"{corpus}/django/{a}", f"{corpus}/django/{b}", plain)
        )
    found.append(
        ("bigbin orig -> edited", f"{corpus}/bigbin/orig.bin", f"{corpus}/bigbin/edited.bin",
         [["-a"], ["-az"], ["-acz"]])
    )
    base = "5.0.1"
    try:
        with open(f"{corpus}/renamed/base_version") as f:
            base = f.read().strip()
    except OSError:
        pass
    after = ["--delete-after"]
    found.append(
        (f"renamed tree over {base}", f"{corpus}/django/{base}", f"{corpus}/renamed/tree",
         [["-a", *after], ["-az", *after], ["-acz", *after], ["-a", "--fuzzy", *after],
          ["-az", "--fuzzy", *after]])
    )
    found.append(
        ("scattered tree over 5.0.7", f"{corpus}/django/5.0.7", f"{corpus}/scattered/tree", plain)
    )
    return found


def wire_bytes(corpus: str, localsh: str) -> list[dict]:
    print(f"\nBytes on the wire: rdc delta totals vs rsync (corpus {corpus})")
    have_rsync = shutil.which("rsync") is not None and os.access(localsh, os.X_OK)
    if not have_rsync:
        print(f"note: rsync or {localsh} not found: rsync column left empty")
    header = (
        f"{'case':<28} {'files':>6} {'rdc total':>11} {'literal':>11} {'signatures':>11} "
        f"{'trips':>5} {'rsync best':>11} {'rsync opts':<22} {'rdc/rsync':>9}"
    )
    print(header)
    rows = []
    for name, old, new, option_sets in cases(corpus):
        if not (os.path.exists(old) and os.path.exists(new)):
            print(f"{name:<28} skipped: {old if not os.path.exists(old) else new} missing")
            continue
        with tempfile.TemporaryDirectory(prefix="rdc-bench-") as work:
            if os.path.isdir(new):
                report, files = rdc_tree_delta(old, new, work)
                src, seed = new, old
            else:
                report, files = delta_file_over_file(old, new), 1
                # rsync compares files of the same name: data.bin on both sides
                src, seed = os.path.join(work, "src"), os.path.join(work, "seed")
                for directory, path in ((src, new), (seed, old)):
                    os.mkdir(directory)
                    try:
                        os.link(path, os.path.join(directory, "data.bin"))
                    except OSError:
                        shutil.copy2(path, os.path.join(directory, "data.bin"))
            rsync = {}
            if have_rsync:
                for options in option_sets:
                    rsync[" ".join(options)] = rsync_bytes(src, seed, options, localsh, work)
        best_opts = min(rsync, key=rsync.get) if rsync else None
        row = {
            "case": name,
            "files": files,
            "total_bytes": report.total_bytes,
            "literal_bytes": report.literal_bytes,
            "signature_bytes": report.signature_bytes,
            "round_trips": report.round_trips,
            "rsync_bytes": rsync,
            "rsync_best": rsync[best_opts] if best_opts else None,
            "rsync_best_options": best_opts,
        }
        rows.append(row)
        ratio = f"{report.total_bytes / row['rsync_best']:.3f}" if best_opts else ""
        print(
            f"{name:<28} {files:>6} {report.total_bytes:>11,} {report.literal_bytes:>11,} "
            f"{report.signature_bytes:>11,} {report.round_trips:>5} "
            f"{row['rsync_best'] or 0:>11,} {best_opts or '':<22} {ratio:>9}"
        )
    print(
        "note: rdc totals (rdc delta --json total_bytes) do not count the directory "
        "comparison that finds the changed files; rsync's bytes include its file list."
    )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=1024, help="random input size (MiB)")
    ap.add_argument("--runs", type=int, default=3, help="timed runs; the best counts")
    ap.add_argument(
        "--patience",
        type=float,
        default=120.0,
        help="seconds per measurement to retry runs disturbed by other processes",
    )
    ap.add_argument("--corpus", default="/tmp/corpus", help="corpora of ../shared/bench")
    ap.add_argument("--localsh", default=DEFAULT_LOCALSH, help="rsync's fake remote shell")
    ap.add_argument("--no-wire", action="store_true", help="skip part 2 (rdc delta, rsync)")
    args = ap.parse_args()
    if _native.IMPLEMENTATION != "c":
        raise SystemExit("the C extension is not loaded; unset RDC_PUREPYTHON")
    localsh = os.path.abspath(args.localsh)
    if not os.path.exists(localsh) and os.path.exists("/work/shared/bench/localsh"):
        localsh = "/work/shared/bench/localsh"
    result = speed(args.mib, args.runs, args.patience)
    result["small_files"] = small_files(
        os.path.join(args.corpus, "django", "5.0.1"), args.runs, args.patience
    )
    result["delta"] = None if args.no_wire else wire_bytes(args.corpus, localsh)
    result["cores"] = os.cpu_count()
    sys.stdout.flush()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
