#!/usr/bin/env python3
"""rdc against rsync on the same syncs: bytes on the wire (both directions), wall time,
CPU and peak memory of both sides, and the delta bound (xdelta3, zstd --patch-from).

Each case brings a receiver that holds the OLD tree up to the NEW one: (a) a first copy
of Django 5.0.1 into an empty directory, (b) consecutive Django releases, (c) a 256 MiB
file with 10 scattered edits, (d) a tree with 20% of its files renamed or moved, (e) a
tree with small edits scattered over many files, (f) the same sync run a second time with
nothing changed (the second run is measured), (g) many files: a generated tree of N small
files (fixtures/make_many_files.py) copied into an empty directory, then 1% of its files
edited, then nothing changed, three pushes in a row on the same receiver; then a pull of
the edited tree into a local copy of the base tree; (h) a Django pair the other way: a
local copy of OLD pulls NEW from the share. Also: (i) the resident memory of an idle
server after a push of a 2,900-file tree.

rsync runs over a fake remote shell (`localsh`), so its real delta algorithm runs and its
``--stats`` byte counts are real; variants -a, -az, -acz (plus --fuzzy for the renamed
tree; -a and -az for a first copy). Its *best* variant per case is the one with the fewest
bytes, its *fastest* the one with the least wall time. rdc pushes into a local
``rdc serve`` (the pulled cases pull from it); its bytes are everything its client
counted on the socket, with zstd (the default) and ``--no-compress``. Every receiver is
checked against its sender afterwards (paths, contents, modes, mtimes).

rdc keeps signature indexes (the server's of the receiving tree, the client's of the
sending one); rsync keeps none. Times are given per index state:
  cold       both indexes built during the timed run (rdc reads everything, like rsync -c):
             the headline
  srv-warm   the server indexed the OLD tree before timing, the client's index is cold
             (many files, pulled: the server's index of the NEW tree as the pushes left it)
  warm       both indexes built before timing (a repeated sync between the same trees;
             many files: as the step before left them)
  re-run     (no change) the second of two identical pushes, indexes as the first left them
  synced     (renamed, scattered) a working copy this client pushed OLD from, then made
             NEW in place: its index knows what the server holds (a user renaming or
             editing within a tree they sync), where the other states' client never
             pushed OLD
Time ratios are rdc / rsync's fastest variant, byte ratios rdc / rsync's best: below 1 rdc
wins. Absolute times on a shared 2-core machine swing by 30%; ratios within one run do
not. CPU is user + system seconds: the rdc client's from wait4, the server's from
/proc/PID/stat around the run; all of rsync's processes. Peak RSS: the client's ru_maxrss,
the server's VmHWM (reset before each run), rsync's processes' peaks summed. One more push
per case goes through a proxy that counts rdc's bytes per message type. Prints markdown
tables; --json FILE writes every figure. Exits 1 if a receiver differs from its sender.

    pip install -e '.[bench]'
    flock /tmp/rdc-bench.lock python bench/sync_vs_rsync.py [--quick] [--cases django,many]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from syncbench import measure
from syncbench.deltas import DeltaBound
from syncbench.model import Case, Run
from syncbench.rdcrun import Rdc, Server, rdc_binary, run_cases
from syncbench.report import print_closing, print_report, ratio
from syncbench.rsyncrun import BenchError, rsync_once, rsync_step
from syncbench.tally import FrameTally
from syncbench.trees import (
    discard,
    keep_deletions_for_the_end,
    link_or_copy,
    link_tree,
    replace_by_links,
    reset,
    tree_diff,
)

GROUPS = ("firstcopy", "django", "pull", "bigbin", "renamed", "scattered", "nochange", "many",
          "idle")
QUICK_GROUPS = ("firstcopy", "django", "nochange", "many", "idle")
# Cases also pushed from a working copy this client synced OLD from (state "synced").
SYNCED_GROUPS = ("renamed", "scattered")
BYTE_TARGETS = {"django": 0.5, "pull": 0.5, "bigbin": 0.5, "renamed": 0.5, "scattered": 1.0}
# Issue 12: time ratios rdc / rsync's fastest, per case (many files: per step).
TIME_TARGETS = {"firstcopy": 1.5, "django": 1.5, "pull": 1.5, "renamed": 2.0,
                "scattered": 1.5, "bigbin": 1.5, "nochange": 1.0, "many first copy": 2.0,
                "many 1% edited": 1.5, "many no change": 1.0, "many 1% edited, pulled": 1.5}
RSS_TARGET = 200e6  # bytes, client and server, many files
IDLE_TARGET = 80e6
NOCHANGE_MAX_BYTES = 10_000
SCATTERED_BASE = "5.0.7"  # make_scattered.py /tmp/corpus/django/5.0.7 .../scattered/tree
FIRST_COPY_VERSION = "5.0.1"
PULL_PAIR = ("5.0.1", "5.0.2")  # its 29 edited files of 64 KiB-1 MiB travel in batches
IDLE_FILES = 2_900
HERE = Path(__file__).resolve().parent


# ------------------------------------------------------------------ cases


def django_versions(corpus: Path) -> list[str]:
    root = corpus / "django"
    if not root.is_dir():
        return []
    names = [p.name for p in root.iterdir() if re.fullmatch(r"\d+(\.\d+)*", p.name)]
    return sorted(names, key=lambda v: tuple(int(x) for x in v.split(".")))


def scattered_tree(corpus: Path, shared: Path) -> Path | None:
    """The scattered-edits tree, made with ../shared/bench/make_scattered.py if missing
    (into a temporary name first: another bench may be making it too)."""
    tree, base = corpus / "scattered" / "tree", corpus / "django" / SCATTERED_BASE
    if tree.is_dir() or not base.is_dir():
        return tree if tree.is_dir() else None
    script = shared / "make_scattered.py"
    if not script.is_file():
        return None
    tmp = corpus / "scattered" / f"tree.{os.getpid()}"
    tmp.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, str(script), str(base), str(tmp)], check=True,
                   capture_output=True)
    try:
        tmp.rename(tree)
    except OSError:  # made meanwhile by someone else
        shutil.rmtree(tmp)
    return tree


def build_cases(corpus: Path, groups: list[str], quick: bool, work: Path, shared: Path,
                bound: DeltaBound) -> list[Case]:
    plain = [["-a"], ["-az"], ["-acz"]]
    cases: list[Case] = []
    versions = django_versions(corpus)
    pairs = list(itertools.pairwise(versions))

    def tar(version: str) -> Path:
        return bound.tar_of(corpus / "django" / version,
                            corpus / "tar" / f"django-{version}.tar")

    for group in groups:
        if group in ("django", "nochange", "pull") and not pairs:
            print(f"note: skipping {group}: no Django trees under {corpus / 'django'}")
            continue
        if group == "firstcopy":
            tree = corpus / "django" / FIRST_COPY_VERSION
            if not tree.is_dir():
                print(f"note: skipping firstcopy: {tree} missing")
                continue
            cases.append(Case(f"first copy (django {FIRST_COPY_VERSION})", group, None, tree,
                              [["-a", "--delete"], ["-az", "--delete"]],
                              bound_new=tar(FIRST_COPY_VERSION)))
        elif group == "django":
            for a, b in pairs[:1] if quick else pairs:
                cases.append(Case(f"django {a}->{b}", group, corpus / "django" / a,
                                  corpus / "django" / b, [[*v, "--delete"] for v in plain],
                                  bound_old=tar(a), bound_new=tar(b)))
        elif group == "pull":
            a, b = PULL_PAIR if PULL_PAIR in pairs else pairs[0]
            cases.append(Case(f"django {a}->{b}, pulled", group, corpus / "django" / a,
                              corpus / "django" / b, [[*v, "--delete"] for v in plain],
                              bound_old=tar(a), bound_new=tar(b), pull=True))
        elif group == "nochange":
            a, b = pairs[0]
            cases.append(Case(f"no change (django {b} again)", group, corpus / "django" / a,
                              corpus / "django" / b, [[*v, "--delete"] for v in plain],
                              bound_old=tar(b), bound_new=tar(b)))
        elif group == "bigbin":
            orig, edited = corpus / "bigbin" / "orig.bin", corpus / "bigbin" / "edited.bin"
            if not (orig.is_file() and edited.is_file()):
                print(f"note: skipping bigbin: {orig} or {edited} missing")
                continue
            # Both sides call the file data.bin; links keep the corpus untouched (every
            # receiver gets a real copy, and both tools replace files, never edit them).
            for side, src in (("old", orig), ("new", edited)):
                (work / "big" / side).mkdir(parents=True, exist_ok=True)
                link_or_copy(src, work / "big" / side / "data.bin")
            cases.append(Case("bigbin 256 MiB, 10 edits", group, work / "big" / "old",
                              work / "big" / "new", plain, single="data.bin",
                              bound_old=orig, bound_new=edited))
        elif group == "renamed":
            tree, base_file = corpus / "renamed" / "tree", corpus / "renamed" / "base_version"
            base = base_file.read_text().strip() if base_file.is_file() else ""
            if not tree.is_dir() or not (corpus / "django" / base).is_dir():
                print(f"note: skipping renamed: {tree} or its base version missing")
                continue
            variants = [[*v, *fz, "--delete-after"] for fz in ([], ["--fuzzy"]) for v in plain]
            cases.append(Case(f"renamed/moved over {base}", group, corpus / "django" / base,
                              tree, variants, bound_old=tar(base),
                              bound_new=bound.tar_of(tree)))
        elif group == "scattered":
            tree = scattered_tree(corpus, shared)
            if tree is None:
                print(f"note: skipping scattered: no {corpus / 'django' / SCATTERED_BASE} "
                      f"or {shared / 'make_scattered.py'}")
                continue
            cases.append(Case(f"scattered edits over {SCATTERED_BASE}", group,
                              corpus / "django" / SCATTERED_BASE, tree,
                              [[*v, "--delete"] for v in plain],
                              bound_old=tar(SCATTERED_BASE), bound_new=bound.tar_of(tree)))
    return cases


def many_files_tree(cache: Path, files: int, seed: int) -> Path:
    """The generated tree (base/, edited/, edited.txt), made once per size and seed."""
    dst = cache / f"many-{files}-s{seed}"
    subprocess.run([sys.executable, str(HERE.parent / "fixtures" / "make_many_files.py"),
                    str(dst), "--files", str(files), "--seed", str(seed)], check=True)
    return dst


# ------------------------------------------------------------------ results


def fastest(repeats: int, once: Callable[[], Run]) -> Run:
    """The fastest of ``repeats`` runs (each from a fresh receiver); a failed verification
    in any of them stays visible."""
    results = [once() for _ in range(repeats)]
    best = min(results, key=lambda r: r.seconds)
    best.verify = next((r.verify for r in results if r.verify != "ok"), best.verify)
    return best


def summarize(runs: list[Run], main: Run, plain: Run | None, bound: dict[str, int | None],
              time_target: float | None) -> dict:
    """The figures of one case (or one many-files step) from its runs: ``main`` is rdc's
    headline run, ``plain`` the same without zstd."""
    rsync_runs = [r for r in runs if r.tool == "rsync"]
    best = min(rsync_runs, key=lambda r: (r.total, r.seconds))
    fast = min(rsync_runs, key=lambda r: r.seconds)
    rdc_bytes = [r.total for r in runs
                 if r.tool == "rdc" and r.variant == "zstd" and r.state != "synced"]
    result = {
        "rsync_best": best.variant,
        "rsync_fastest": fast.variant,
        "byte_ratio": ratio(main.total, best.total),
        "byte_ratio_no_compress": ratio(plain.total, best.total) if plain else None,
        "time_ratio": ratio(main.seconds, fast.seconds),
        "time_ratio_vs_rsync_best_bytes": ratio(main.seconds, best.seconds),
        # CPU: rdc's client and server against all of rsync's processes; steadier than
        # wall time when other work shares the machine.
        "cpu_ratio": ratio(main.cpu + (main.server_cpu or 0), fast.cpu),
        "delta_bound": bound,
        "rdc_over_xdelta3": ratio(main.total, bound.get("xdelta3")),
        "rdc_over_zstd": ratio(main.total, bound.get("zstd")),
        "rdc_run": main.figures(),
        "rsync_best_run": best.figures(),
        "rsync_fastest_run": fast.figures(),
        "rdc_zstd_bytes_range": [min(rdc_bytes), max(rdc_bytes)],
        "rdc_files_transferred": main.stats.get("files_transferred"),
        "verified": all(r.verify == "ok" for r in runs),
        "runs": [r.figures() for r in runs],
        "targets": [],
    }
    if time_target is not None:
        add_target(result, "time ratio", result["time_ratio"], time_target)
    if result["rdc_over_xdelta3"] is not None and bound.get("xdelta3", 0) > 1000:
        add_target(result, "rdc/xdelta3", result["rdc_over_xdelta3"], 2.0)
    return result


def add_target(result: dict, what: str, value: float | None, limit: float) -> None:
    result["targets"].append({"what": what, "value": value, "limit": limit,
                              "meets": value is not None and value <= limit})


def run_case(case: Case, rdc: Rdc, localsh: str, work: Path, breakdown: bool, repeats: int,
             quick: bool, bound: DeltaBound, log: list[str]) -> dict:
    runs: list[Run] = []
    rdc.server.settle()  # nor should rsync share the machine with it
    for opts in case.rsync_variants:
        runs.append(fastest(repeats, lambda o=opts: rsync_once(case, o, work / "rsync-dst",
                                                               localsh)))
        show(runs[-1])
    if (work / "rsync-dst").exists():
        discard(work / "rsync-dst")
    if case.group == "nochange":
        plan = [("re-run", True)] + ([] if quick else [("re-run", False)])
    elif case.group == "firstcopy":
        plan = [("cold", True)] + ([] if quick else [("warm", True), ("cold", False)])
    else:
        plan = [("cold", True)] + ([] if quick else [("srv-warm", True), ("warm", True),
                                                     ("cold", False)])
        if case.group in SYNCED_GROUPS and not quick:
            plan.append(("synced", True))
    warm_cache = rdc.fresh("warmcache")
    sync = rdc.pull if case.pull else rdc.push
    for state, compress in plan:
        runs.append(fastest(repeats, lambda s=state, c=compress: sync(case, s, c, warm_cache)))
        show(runs[-1])
    tally = None
    if breakdown:
        tally = FrameTally(rdc.server.port)
        try:
            counted = sync(case, "warm" if case.group != "nochange" else "re-run", True,
                           warm_cache, port=tally.port)
        finally:
            tally.close()
        if counted.verify != "ok":
            log.append(f"{case.name}: the run through the frame tally: {counted.verify}")
    for r in runs:
        if r.verify != "ok":
            log.append(f"{case.name}: {r.tool} {r.variant} [{r.state}]: receiver differs: "
                       f"{r.verify}")
    rdc_runs = {(r.variant, r.state): r for r in runs if r.tool == "rdc"}
    headline = "re-run" if case.group == "nochange" else "cold"
    main = rdc_runs[("zstd", headline)]
    sizes = bound.sizes(case.bound_old, case.bound_new) if case.bound_new else {}
    result = summarize(runs, main, rdc_runs.get(("--no-compress", headline)), sizes,
                       TIME_TARGETS[case.group])
    result["group"] = case.group
    for state in ("srv-warm", "warm", "synced"):
        if ("zstd", state) in rdc_runs:
            result[f"time_ratio_{state.replace('-', '_')}"] = ratio(
                rdc_runs[("zstd", state)].seconds, result["rsync_fastest_run"]["seconds"])
    if ("zstd", "synced") in rdc_runs:
        synced = rdc_runs[("zstd", "synced")].total
        result["synced_bytes"] = synced
        result["synced_over_xdelta3"] = ratio(synced, sizes.get("xdelta3"))
    if case.group == "nochange":
        add_target(result, "rdc bytes / 10,000", main.total / NOCHANGE_MAX_BYTES, 1.0)
    else:
        pair = case.group in ("django", "pull")
        if pair and result.get("time_ratio_warm") is not None:
            add_target(result, "warm time ratio", result["time_ratio_warm"], 1.0)
        if case.group in BYTE_TARGETS:
            add_target(result, "byte ratio", result["byte_ratio"], BYTE_TARGETS[case.group])
        if pair and result["rdc_over_zstd"] is not None:
            add_target(result, "rdc/zstd", result["rdc_over_zstd"], 1.0)
        if case.group == "scattered":
            add_target(result, "byte ratio", result["byte_ratio"], 0.5)
        if case.group == "renamed":
            fuzzy = [r for r in runs if r.tool == "rsync" and r.variant == "-az --fuzzy"]
            if fuzzy:
                add_target(result, "rdc / rsync -az --fuzzy",
                           ratio(main.total, fuzzy[0].total), 0.1)
        if result.get("synced_over_xdelta3") is not None:
            add_target(result, "synced rdc/xdelta3", result["synced_over_xdelta3"], 2.0)
    if tally is not None:
        result["rdc_wire_by_role"] = {k: round(v) for k, v in
                                      sorted(tally.groups().items(), key=lambda kv: -kv[1])}
        result["rdc_wire_by_message"] = {
            f"{d} {t}": [round(n), tally.counts[(d, t)]]
            for (d, t), n in sorted(tally.bytes.items(), key=lambda kv: -kv[1])
        }
        result["rdc_file_payload_bytes"] = tally.payload
        result["rdc_wire_items"] = tally.items
    return result


def show(run: Run) -> None:
    server = "" if run.server_cpu is None else (f" server {run.server_cpu:.2f} s CPU "
                                                f"{(run.server_rss or 0) / 1e6:.0f} MB")
    print(f"  {run.tool} {run.variant}{f' [{run.state}]' if run.state else ''}: "
          f"{run.total:,} B {run.seconds:.2f} s, {run.cpu:.2f} s CPU {run.rss / 1e6:.0f} MB"
          f"{server}: {run.verify}", flush=True)


# ------------------------------------------------------------------ many files


MANY_STEPS = ("first copy", "1% edited", "no change", "1% edited, pulled")


def run_many(tree: Path, files: int, rdc: Rdc, localsh: str, work: Path,
             bound: DeltaBound, log: list[str]) -> dict[str, dict]:
    """Three pushes in a row onto one receiver: an empty directory gets the base tree, then
    1% of the sender's files change (in place, as an editor saves them), then nothing
    changes. The sender is a hard-linked copy of base/ that becomes edited/. Then a pull:
    a local real copy of base/ (its files get replaced) takes the edited tree from the
    remote side (rsync: the sender over the fake remote shell; rdc: the server's share
    directory the pushes left, its index as they left it, the client's index cold)."""
    base, edited = tree / "base", tree / "edited"
    changed = (tree / "edited.txt").read_text().split()
    sender, pulled = work / "many-src", work / "many-pull"
    steps = [(MANY_STEPS[0], []), (MANY_STEPS[1], changed), (MANY_STEPS[2], [])]
    pull = MANY_STEPS[3]
    runs: dict[str, list[Run]] = {s: [] for s in MANY_STEPS}
    label = f"many {files:,} files"
    rdc.server.settle(limit=120)  # rsync should not share the machine with it either
    for opts in (["-a", "--delete"], ["-az", "--delete"], ["-acz", "--delete"]):
        link_tree(base, sender)
        dst = work / "many-rsync"
        reset(None, dst)
        for step, change in steps:
            replace_by_links(edited, sender, change)
            os.sync()
            run = rsync_step(f"{label}: {step}", "", opts, f"{sender}/", f"localhost:{dst}/",
                             localsh)
            run.verify = tree_diff(sender, dst)
            runs[step].append(run)
            show(run)
        discard(dst)
        reset(base, pulled)  # the sender now holds the edited tree
        run = rsync_step(f"{label}: {pull}", "", opts, f"localhost:{sender}/", f"{pulled}/",
                         localsh)
        run.verify = tree_diff(sender, pulled)
        runs[pull].append(run)
        show(run)
    link_tree(base, sender)
    dst = rdc.server.share / "many"
    reset(None, dst)
    cache = rdc.fresh("cache")
    for step, change in steps:
        replace_by_links(edited, sender, change)
        usage, stats = rdc.command("push", ["--delete", str(sender), rdc.server.url("many")],
                                   cache, settle_limit=120)
        run = rdc.run_of(f"{label}: {step}", "cold" if step == MANY_STEPS[0] else "warm",
                         "zstd", usage, stats, tree_diff(sender, dst))
        runs[step].append(run)
        show(run)
    # The share directory holds the edited tree the pushes left (the last push verified
    # it against the sender): pulled into a copy of base with a cold client index.
    reset(base, pulled)
    usage, stats = rdc.command("pull", ["--delete", rdc.server.url("many"), str(pulled)],
                               rdc.fresh("cache"), settle_limit=120)
    run = rdc.run_of(f"{label}: {pull}", "srv-warm", "zstd", usage, stats,
                     tree_diff(sender, pulled))
    runs[pull].append(run)
    show(run)
    discard(pulled)
    discard(dst)
    shutil.rmtree(sender)  # (hard links: its deletion frees no inode)
    base_tar, edited_tar = bound.tar_of(base), bound.tar_of(edited)
    pairs = {MANY_STEPS[0]: (None, base_tar), MANY_STEPS[1]: (base_tar, edited_tar),
             MANY_STEPS[2]: (edited_tar, edited_tar), pull: (base_tar, edited_tar)}
    results = {}
    for step in MANY_STEPS:
        step_runs = runs[step]
        for r in step_runs:
            if r.verify != "ok":
                log.append(f"{r.case}: {r.tool} {r.variant}: receiver differs: {r.verify}")
        main = step_runs[-1]
        res = summarize(step_runs, main, None, bound.sizes(*pairs[step]),
                        TIME_TARGETS[f"many {step}"])
        res["group"] = "many"
        res["files"] = files
        add_target(res, "client RSS MB", main.rss / 1e6, RSS_TARGET / 1e6)
        add_target(res, "server RSS MB", (main.server_rss or 0) / 1e6, RSS_TARGET / 1e6)
        results[f"{label}: {step}"] = res
    return results


# ------------------------------------------------------------------ idle server


def idle_server(rdc_bin: str, work: Path, tree: Path, seconds: tuple[int, ...] = (5, 15)
                ) -> dict:
    """Resident memory of an ``rdc serve`` of its own: when started, and some seconds
    after one push of ``tree`` has ended."""
    server = Server(rdc_bin, work / "idle-server")
    server.start()
    try:
        server.settle()
        fresh = measure.status_bytes(server.pid, "VmRSS")
        rdc = Rdc(rdc_bin, server, work / "idle-server")
        usage, stats = rdc.command("push", [str(tree), server.url("tree")],
                                   rdc.fresh("cache"))
        verify = tree_diff(tree, server.share / "tree")
        after, waited = {}, 0.0
        for s in seconds:
            time.sleep(s - waited)
            waited = s
            after[s] = measure.status_bytes(server.pid, "VmRSS")
    finally:
        server.stop()
    files = sum(len(f) for _, _, f in os.walk(tree))
    size = sum(p.stat().st_size for p in tree.rglob("*") if p.is_file())
    return {"files": files, "bytes": size, "push_seconds": round(usage.seconds, 3),
            "rss_fresh": fresh, "server_peak_rss": stats["_server_rss"],
            "rss_after": after, "verify": verify,
            "meets_target": after[seconds[0]] <= IDLE_TARGET}


# ------------------------------------------------------------------ the run


def shared_bench() -> Path:
    """../shared/bench beside the checkout (a worktree may sit deeper: look upwards)."""
    for parent in HERE.parents:
        if (parent / "shared" / "bench" / "localsh").is_file():
            return parent / "shared" / "bench"
    return HERE.parents[1].parent / "shared" / "bench"


@contextlib.contextmanager
def workdir(base: str | None, keep: bool) -> Iterator[Path]:
    if base is not None:
        Path(base).mkdir(parents=True, exist_ok=True)  # (--work names where to put it)
    path = Path(tempfile.mkdtemp(prefix="rdc-sync-bench-", dir=base))
    try:
        yield path
    finally:
        if keep:
            print(f"kept {path}")
        else:
            shutil.rmtree(path, ignore_errors=True)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, default=Path("/tmp/corpus"),
                    help="built by ../shared/bench/make_corpus.sh (default /tmp/corpus)")
    ap.add_argument("--cases", default=",".join(GROUPS),
                    help=f"comma-separated subset of {','.join(GROUPS)}")
    ap.add_argument("--quick", action="store_true",
                    help="under 3 minutes: first copy, one Django pair, no change, many files "
                         "(2,000 unless --files), idle server; rdc's headline run only, no "
                         "breakdown; zstd's delta bound only where cached")
    ap.add_argument("--files", type=int, help="files of the many-files case (default 100,000)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the many-files tree")
    ap.add_argument("--localsh", default=str(shared_bench() / "localsh"),
                    help="rsync's fake remote shell (default: shared/bench/localsh in the "
                         "nearest folder above this script that has one)")
    ap.add_argument("--work", default="/tmp", help="where the temporary copies go")
    ap.add_argument("--cache", type=Path, default=Path("/tmp/rdc-bench-cache"),
                    help="kept across runs: generated trees, tars, delta sizes "
                         "(default /tmp/rdc-bench-cache)")
    ap.add_argument("--bound", choices=("all", "xdelta3", "none"), default="all",
                    help="which delta bounds to measure (cached ones are always shown)")
    ap.add_argument("--zstd-max", type=int, default=512,
                    help="MB: zstd's bound for larger tars only where cached (zstd -19 takes "
                         "about 13 minutes per GB; default 512)")
    ap.add_argument("--no-breakdown", action="store_true",
                    help="skip the extra rdc push through the frame-counting proxy")
    ap.add_argument("--runs", type=int, default=1,
                    help="repeat every timed run, keep the fastest (default 1)")
    ap.add_argument("--json", type=Path, help="write every figure to this file")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    args.groups = [g.strip() for g in args.cases.split(",") if g.strip()]
    unknown = set(args.groups) - set(GROUPS)
    if unknown:
        ap.error(f"unknown cases {sorted(unknown)}; choose from {','.join(GROUPS)}")
    if args.quick:
        args.groups = [g for g in args.groups if g in QUICK_GROUPS]
        args.no_breakdown = True
    if args.files is None:
        args.files = 2_000 if args.quick else 100_000
    if args.files < 100 or args.runs < 1:
        ap.error("--files must be >= 100 and --runs >= 1")
    return args


def main() -> None:
    args = parse_args()
    rdc_bin = rdc_binary()
    for tool in ("rsync", "tar", *(["xdelta3"] if args.bound != "none" else []),
                 *(["zstd"] if args.bound == "all" else [])):
        if shutil.which(tool) is None:
            raise SystemExit(f"needs {tool} on PATH (apt-get install {tool}; or --bound)")
    if not os.access(args.localsh, os.X_OK):
        raise SystemExit(f"{args.localsh} is not executable (--localsh)")
    rsync_version = subprocess.run(["rsync", "--version"], capture_output=True,
                                   text=True).stdout.splitlines()[0]
    load = os.getloadavg()
    print(f"{rsync_version}; rdc {rdc_bin}; corpus {args.corpus}; rsync -e {args.localsh}; "
          f"fastest of {args.runs} per timed run; load average {load[0]:.2f} {load[1]:.2f} "
          f"{load[2]:.2f}", flush=True)
    tools = {"all": ("xdelta3", "zstd"), "xdelta3": ("xdelta3",), "none": ()}[args.bound]
    bound = DeltaBound(args.cache, ("xdelta3", "zstd"),
                       cached_only=tuple(t for t in ("xdelta3", "zstd")
                                         if t not in tools or (args.quick and t == "zstd")),
                       zstd_max=args.zstd_max * 1_000_000)
    log: list[str] = []
    results: dict[str, dict] = {}
    idle = None
    started = time.monotonic()
    with workdir(args.work, args.keep) as work:
        if "many" in args.groups:  # (said before any case runs, not 15 minutes in)
            args.cache.mkdir(parents=True, exist_ok=True)
            if os.stat(args.cache).st_dev != os.stat(work).st_dev:
                raise SystemExit(
                    f"--cache {args.cache} and the work directory {work} are on different "
                    "file systems, and the many-files case hard-links its trees from the "
                    "cache: give --cache a directory on the file system of --work")
        cases = build_cases(args.corpus, args.groups, args.quick, work,
                            Path(args.localsh).parent, bound)
        keep_deletions_for_the_end(work / "trash")  # deleted with the work directory
        server = Server(rdc_bin, work)
        server.start()
        try:
            rdc = Rdc(rdc_bin, server, work)
            results.update(run_cases(cases, server, lambda case: run_case(
                case, rdc, args.localsh, work, not args.no_breakdown, args.runs, args.quick,
                bound, log), log))
            if "many" in args.groups:
                tree = many_files_tree(args.cache, args.files, args.seed)
                print(f"many files: {tree}", flush=True)
                try:
                    results.update(run_many(tree, args.files, rdc, args.localsh, work,
                                            bound, log))
                except (BenchError, OSError) as exc:
                    log.append(f"many files: FAILED: {exc}")
                    print(f"  FAILED: {exc}", flush=True)
        finally:
            server.stop()
        if "idle" in args.groups:
            tree = many_files_tree(args.cache, IDLE_FILES, 2) / "base"
            print(f"idle server after a push of {tree}", flush=True)
            try:
                idle = idle_server(rdc_bin, work, tree)
            except (BenchError, OSError) as exc:
                log.append(f"idle server: FAILED: {exc}")
            else:
                if idle["verify"] != "ok":
                    log.append(f"idle server: receiver differs: {idle['verify']}")
    print_report(results, idle)
    end_load = print_closing(load, started, log, " (other work on the machine slows both "
                             "tools' timings)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "cases": results, "idle_server": idle, "problems": log, "rsync": rsync_version,
            "load_average": {"start": load, "end": end_load}, "files": args.files,
            "quick": args.quick, "seconds": round(time.monotonic() - started, 1),
        }, indent=1))
    sys.exit(1 if log else 0)


if __name__ == "__main__":
    main()
