#!/usr/bin/env python3
"""rdc against rsync over a link with round-trip time: the same syncs with 0, 10, 50 ms
(--rtt) added between the two sides.

Why: every other bench runs on loopback, where a round trip costs nothing, so none of them
shows what the number of *sequential* round trips in rdc's protocol costs over a WAN
(10-50 ms). rsync pipelines its transfer and pays a handful of round trips per run. Here
rdc's client reaches ``rdc serve`` through a proxy that delivers every chunk rtt/2 after
it was read, each way (syncbench/proxy.py over syncbench/delay.py), and rsync's remote
shell is the fake one of the other benches (localsh) behind a relay that delays its pipes
the same way (syncbench/delaysh.py). Both tools go through their relay at 0 ms too, so
what a row adds over the 0-ms row is the delay alone. Throughput is not limited.

Cases: Django 5.0.6 -> 5.0.7 pushed (djpush) and pulled (djpull: a local copy of 5.0.6
pulls 5.0.7 from the share), the renamed/moved tree over 5.0.1 (renamed), scattered edits
over 5.0.7 (scattered), and a first copy of 5.0.1 into an empty directory (firstcopy).
rsync runs -a and -az (with --delete) into a fresh ``cp -a`` of OLD; rdc pushes into a
fresh share directory, its indexes cold (built in the timed run) and warm (built by a dry
run before it, over the undelayed port). Per RTT: wall times (fastest of --runs), the
ratio rdc / rsync -az, and each tool's time over its own 0-ms time divided by the RTT:
roughly how many round trips it waits for one after the other. Every receiver is checked
against its sender; exits 1 if one differs. --json FILE writes every figure.

    flock /tmp/rdc-bench.lock python bench/latency.py --rtt 0,20 --cases djpush
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from sync_vs_rsync import fastest, scattered_tree, shared_bench, show, workdir
from syncbench.model import Case, Run
from syncbench.proxy import DelayProxy
from syncbench.rdcrun import Rdc, Server, rdc_binary, run_cases
from syncbench.report import num, print_closing, ratio, table
from syncbench.rsyncrun import rsync_once
from syncbench.trees import discard, keep_deletions_for_the_end

GROUPS = ("djpush", "djpull", "renamed", "scattered", "firstcopy")
PAIR = ("5.0.6", "5.0.7")
SCATTERED_BASE = "5.0.7"
FIRST_COPY = "5.0.1"
RSYNC_VARIANTS = (["-a", "--delete"], ["-az", "--delete"])
RDC_STATES = ("cold", "warm")
RTT_ENV = "RDC_BENCH_RTT_MS"  # read by syncbench/delaysh.py
HERE = Path(__file__).resolve().parent


def build_cases(corpus: Path, groups: list[str], shared: Path) -> list[Case]:
    django = corpus / "django"
    variants = [list(v) for v in RSYNC_VARIANTS]
    cases: list[Case] = []
    for group in groups:
        if group in ("djpush", "djpull"):
            old, new = django / PAIR[0], django / PAIR[1]
            pulled = group == "djpull"
            cases.append(Case(f"django {PAIR[0]}->{PAIR[1]}{', pulled' if pulled else ''}",
                              group, old, new, variants, pull=pulled))
        elif group == "renamed":
            base_file = corpus / "renamed" / "base_version"
            base = base_file.read_text().strip() if base_file.is_file() else ""
            cases.append(Case(f"renamed/moved over {base}", group, django / base,
                              corpus / "renamed" / "tree", variants))
        elif group == "scattered":
            tree = scattered_tree(corpus, shared)
            cases.append(Case(f"scattered edits over {SCATTERED_BASE}", group,
                              django / SCATTERED_BASE, tree or corpus / "scattered" / "tree",
                              variants))
        elif group == "firstcopy":
            cases.append(Case(f"first copy (django {FIRST_COPY})", group, None,
                              django / FIRST_COPY, variants))
    for case in cases:
        missing = [p for p in (case.old, case.new) if p is not None and not p.is_dir()]
        if missing:
            raise SystemExit(f"{case.group}: {missing[0]} missing (../shared/bench/"
                             f"make_corpus.sh builds /tmp/corpus)")
    return cases


def label(run: Run) -> str:
    return f"rsync {run.variant}" if run.tool == "rsync" else f"rdc {run.state}"


def run_case(case: Case, rdc: Rdc, rtts: list[int], delaysh: str, work: Path, repeats: int,
             log: list[str]) -> dict[int, dict[str, Run]]:
    """Every tool and state at every RTT: the fastest run of each."""
    out: dict[int, dict[str, Run]] = {}
    warm_cache = rdc.fresh("warmcache")
    sync = rdc.pull if case.pull else rdc.push
    for rtt in rtts:
        print(f" RTT {rtt} ms", flush=True)
        runs: list[Run] = []
        os.environ[RTT_ENV] = str(rtt)
        rdc.server.settle()  # rsync should not share the machine with it
        for opts in case.rsync_variants:
            runs.append(fastest(repeats, lambda o=opts: rsync_once(
                case, o, work / "rsync-dst", delaysh)))
            show(runs[-1])
        if (work / "rsync-dst").exists():
            discard(work / "rsync-dst")
        proxy = DelayProxy(rdc.server.port, rtt / 1000)
        try:
            for state in RDC_STATES:
                runs.append(fastest(repeats, lambda s=state, p=proxy.port: sync(
                    case, s, True, warm_cache, port=p)))
                show(runs[-1])
        finally:
            proxy.close()
        for r in runs:
            if r.verify != "ok":
                log.append(f"{case.name}: RTT {rtt} ms: {label(r)}: receiver differs: "
                           f"{r.verify}")
        out[rtt] = {label(r): r for r in runs}
    return out


def round_trips(runs: dict[int, dict[str, Run]], rtt: int, key: str) -> float | None:
    """Seconds over the same run at 0 ms, in round trips of ``rtt``."""
    if rtt == 0 or 0 not in runs:
        return None
    return round((runs[rtt][key].seconds - runs[0][key].seconds) / (rtt / 1000), 1)


def summary(runs: dict[int, dict[str, Run]]) -> dict:
    rows = {}
    for rtt, by in runs.items():
        az = by["rsync -az"].seconds if "rsync -az" in by else None
        rows[str(rtt)] = {
            "seconds": {k: round(r.seconds, 3) for k, r in by.items()},
            "ratio_rdc_cold_over_rsync_az": ratio(by["rdc cold"].seconds, az),
            "ratio_rdc_warm_over_rsync_az": ratio(by["rdc warm"].seconds, az),
            "round_trips": {k: round_trips(runs, rtt, k) for k in by},
            "runs": {k: r.figures() for k, r in by.items()},
        }
    return rows


def print_table(name: str, runs: dict[int, dict[str, Run]]) -> None:
    a, az = "rsync -a", "rsync -az"
    rows = []
    for rtt, by in runs.items():
        t = {k: r.seconds for k, r in by.items()}
        rows.append([
            str(rtt), num(t[a]), num(t[az]), num(t["rdc cold"]), num(t["rdc warm"]),
            num(ratio(t["rdc cold"], t[az])), num(ratio(t["rdc warm"], t[az])),
            num(round_trips(runs, rtt, az), 1), num(round_trips(runs, rtt, "rdc cold"), 1),
            num(round_trips(runs, rtt, "rdc warm"), 1),
            "ok" if all(r.verify == "ok" for r in by.values()) else "DIFFERS",
        ])
    print(f"\n### {name}\n")
    print(table(["RTT ms", "rsync -a s", "rsync -az s", "rdc cold s", "rdc warm s",
                 "cold / -az", "warm / -az", "-az RTs", "rdc cold RTs", "rdc warm RTs",
                 "verify"], rows))


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rtt", default="0,10,50",
                    help="round-trip times to add, ms, comma-separated (default 0,10,50; "
                         "the round-trip estimates need 0)")
    ap.add_argument("--cases", default=",".join(GROUPS),
                    help=f"comma-separated subset of {','.join(GROUPS)}")
    ap.add_argument("--runs", type=int, default=2,
                    help="repeat every timed run, keep the fastest (default 2)")
    ap.add_argument("--corpus", type=Path, default=Path("/tmp/corpus"),
                    help="built by ../shared/bench/make_corpus.sh (default /tmp/corpus)")
    ap.add_argument("--localsh", default=str(shared_bench() / "localsh"),
                    help="rsync's fake remote shell, behind the delaying relay")
    ap.add_argument("--work", default="/tmp", help="where the temporary copies go")
    ap.add_argument("--json", type=Path, help="write every figure to this file")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    try:
        args.rtts = sorted({int(x) for x in args.rtt.split(",") if x.strip()})
    except ValueError:
        ap.error("--rtt takes whole milliseconds, comma-separated")
    args.groups = [g.strip() for g in args.cases.split(",") if g.strip()]
    unknown = set(args.groups) - set(GROUPS)
    if unknown:
        ap.error(f"unknown cases {sorted(unknown)}; choose from {','.join(GROUPS)}")
    if args.runs < 1 or not args.rtts or min(args.rtts) < 0:
        ap.error("--runs must be >= 1 and --rtt non-negative")
    return args


def main() -> None:
    args = parse_args()
    rdc_bin = rdc_binary()
    if shutil.which("rsync") is None:
        raise SystemExit("needs rsync on PATH")
    if not os.access(args.localsh, os.X_OK):
        raise SystemExit(f"{args.localsh} is not executable (--localsh)")
    os.environ["RDC_BENCH_LOCALSH"] = args.localsh
    # -S: the relay needs no site-packages, and starts 10 ms sooner (rsync -e splits on
    # spaces: no paths with spaces here).
    delaysh = f"{sys.executable} -S {HERE / 'syncbench' / 'delaysh.py'}"
    rsync_version = subprocess.run(["rsync", "--version"], capture_output=True,
                                   text=True).stdout.splitlines()[0]
    load = os.getloadavg()
    print(f"{rsync_version}; rdc {rdc_bin}; RTTs {args.rtts} ms; fastest of {args.runs}; "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}", flush=True)
    log: list[str] = []
    results: dict[str, dict[int, dict[str, Run]]] = {}
    started = time.monotonic()
    with workdir(args.work, args.keep) as work:
        cases = build_cases(args.corpus, args.groups, Path(args.localsh).parent)
        keep_deletions_for_the_end(work / "trash")
        server = Server(rdc_bin, work)
        server.start()
        try:
            rdc = Rdc(rdc_bin, server, work)
            results.update(run_cases(cases, server, lambda case: run_case(
                case, rdc, args.rtts, delaysh, work, args.runs, log), log))
        finally:
            server.stop()
            shutil.rmtree(work / "trash", ignore_errors=True)
    print("\nRTs: seconds over the same tool's 0-ms time, divided by the RTT (about how "
          "many round trips it waited for one after the other).")
    for name, runs in results.items():
        print_table(name, runs)
    end_load = print_closing(load, started, log)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "cases": {name: summary(runs) for name, runs in results.items()},
            "rtts_ms": args.rtts, "runs": args.runs, "problems": log, "rsync": rsync_version,
            "load_average": {"start": load, "end": end_load},
            "seconds": round(time.monotonic() - started, 1),
        }, indent=1))
    sys.exit(1 if log else 0)


if __name__ == "__main__":
    main()
