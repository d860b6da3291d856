#!/usr/bin/env python3
"""File-server replication, rdc against rsync in a loop (lsyncd's way), in one run.

On a Django tree: a primary and two replicas. rdc: three ``rdc serve`` processes, the two
replicas following the primary's share (receive-only). rsync: the primary's directory
watched for changes (inotify, through watchdog, as lsyncd does), and at each burst of
events ``rsync -az --delete`` to both replicas at once, again until a run starts with
nothing new (rsync runs over a fake remote shell, so its delta algorithm and its
``--stats`` byte counts are real).

The same workload for both, planned from one seed: edits, creates, renames and deletes at
a steady rate for a fixed time. Reported per tool: replication lag (p50, p99, max, from the
write on the primary to a byte-identical file on each replica, polled every 10 ms), bytes
on the wire per change (both directions, both replicas: rdc's counted by its replicas,
rsync's from --stats), CPU seconds of every process involved (rdc: the three servers;
rsync: all its processes). Then a replica offline while 1,000 changes land on the primary:
catch-up time (rdc: from starting the replica's server until its log says in step; rsync:
one run) and bytes. Ratios are rdc / rsync; targets from issue 16. Absolute figures swing
on a shared machine: the load average is printed beside them.

    python bench/replication.py [--seconds 60] [--rate 2] [--catchup 1000] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from syncbench import measure, workload
from syncbench.rdcrun import rdc_env

HERE = Path(__file__).resolve().parent
LOCALSH = HERE.parent.parent / "shared" / "bench" / "localsh"
TOKEN = "replication-bench-token-0123456789"
TARGETS = {"p50": 1.0, "p99": 3.0, "bytes": 0.5, "catchup bytes": 0.5, "catchup time": 1.5}
RDC = [sys.executable, "-m", "rdc_client"]


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


# ---------------------------------------------------------------- rdc


class Serve:
    """One ``rdc serve`` on loopback (port 0), with its log."""

    def __init__(self, work: Path, name: str, args: list[str], port: int = 0) -> None:
        self.work, self.name, self.args, self.port = work, name, args, port
        self.log = work / f"{name}.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> float:
        """Start it; the monotonic time it was started."""
        offset = self.log.stat().st_size if self.log.exists() else 0
        started = time.monotonic()
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [*RDC, "serve", "--listen", f"127.0.0.1:{self.port}", "--token-file",
                 str(self.work / "token"), "--state-dir", str(self.work / f"state-{self.name}"),
                 *self.args], stdout=log, stderr=subprocess.STDOUT, env=rdc_env())
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            found = re.search(r"listening on [^\s:]+:(\d+)", self.log.read_text()[offset:])
            if found:
                self.port = int(found.group(1))
                return started
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        raise SystemExit(f"rdc serve {self.name} did not start:\n{self.log.read_text()}")

    def url(self, share: str) -> str:
        return f"rdc://127.0.0.1:{self.port}/{share}"

    def cpu(self) -> float:
        assert self.proc is not None
        return measure.process_cpu(self.proc.pid)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(30)


def follower_bytes(server: Serve) -> int:
    """What the replica's follower carried on the wire so far (``rdc status``)."""
    done = subprocess.run([*RDC, "status", server.url("m"), "--json", "--token-file",
                           str(server.work / "token")], capture_output=True, text=True,
                          env=rdc_env(), timeout=60)
    if done.returncode:
        raise SystemExit(f"rdc status failed: {done.stderr}")
    [mine] = [p for p in json.loads(done.stdout)["peers"] if p["role"] == "follows"]
    return mine["bytes"]


def in_step_after(server: Serve, offset: int, timeout: float) -> float:
    """The monotonic time of the first round after byte ``offset`` of the log that ended
    in step (from the log line's wall-clock stamp)."""
    deadline = time.monotonic() + timeout
    pattern = re.compile(r"^(\S+ \S+) rdc serve: replica .*; in step", re.MULTILINE)
    while time.monotonic() < deadline:
        found = pattern.search(server.log.read_text()[offset:])
        if found:
            stamp = time.mktime(time.strptime(found.group(1).split(",")[0], "%Y-%m-%d %H:%M:%S"))
            wall = stamp + int(found.group(1).split(",")[1]) / 1000
            return time.monotonic() - (time.time() - wall)
        time.sleep(0.05)
    raise SystemExit(f"{server.name} did not get in step:\n{server.log.read_text()[offset:]}")


def replica_config(work: Path, name: str, share: Path, upstream: str) -> list[str]:
    config = work / f"{name}.toml"
    config.write_text(f'[shares.m]\npath = "{share}"\n[shares.m.follow]\nurl = "{upstream}"\n'
                      f'token_file = "{work / "token"}"\nmode = "receive-only"\n')
    return ["--config", str(config)]


def wait_same(a: Path, b: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        want, got = workload.content_view(a), workload.content_view(b)
        if want is not None and want == got:
            return
        time.sleep(0.5)
    raise SystemExit(f"{b} did not become a copy of {a}")


def rdc_phase(work: Path, corpus: Path, changes: list, burst: list,
              args: argparse.Namespace) -> dict:
    root = work / "rdc"
    root.mkdir(exist_ok=True)
    primary_dir, replicas = root / "primary", [root / "r1", root / "r2"]
    for d in (primary_dir, *replicas):
        if d.exists():
            shutil.rmtree(d)
    subprocess.run(["cp", "-a", str(corpus), str(primary_dir)], check=True)
    for d in replicas:
        d.mkdir()
    (root / "token").write_text(TOKEN + "\n")
    primary = Serve(root, "primary", ["--share", f"s={primary_dir}"])
    servers: list[Serve] = []
    try:
        primary.start()
        servers += [Serve(root, f"r{i}", replica_config(root, f"r{i}", d, primary.url("s")))
                    for i, d in enumerate(replicas, 1)]
        first = time.monotonic()
        for server in servers:
            server.start()
        for d in replicas:
            wait_same(primary_dir, d, 600)
        first_copy = {"seconds": time.monotonic() - first,
                      "bytes": sum(follower_bytes(s) for s in servers)}
        time.sleep(2)  # the servers' share watchers settle
        print(f"rdc: first copy to both replicas in {first_copy['seconds']:.1f} s; "
              f"workload (load {load()})", file=sys.stderr)
        bytes_before = sum(follower_bytes(s) for s in servers)
        cpu_before = [s.cpu() for s in (primary, *servers)]
        checker = workload.Checker(replicas)
        seconds = workload.run_steady(primary_dir, changes, args.rate, checker)
        done = checker.wait(120)
        checker.stop()
        time.sleep(1)
        cpu_each = [s.cpu() - c for s, c in zip((primary, *servers), cpu_before, strict=True)]
        cpu = sum(cpu_each)
        wire = sum(follower_bytes(s) for s in servers) - bytes_before
        steady = {"seconds": seconds, "lags": checker.lags(), "bytes": wire, "cpu": cpu,
                  "cpu by server": cpu_each, "complete": done}
        for d in replicas:
            wait_same(primary_dir, d, 60)

        print(f"rdc: catch-up after {len(burst)} changes (load {load()})", file=sys.stderr)
        offline = servers[1]
        offline.stop()
        for change in burst:
            workload.apply(primary_dir, change)
        cpu_primary = primary.cpu()
        offset = offline.log.stat().st_size
        started = offline.start()
        ended = in_step_after(offline, offset, 600)
        catchup = {"seconds": ended - started, "bytes": follower_bytes(offline),
                   "cpu": offline.cpu() + primary.cpu() - cpu_primary}
        wait_same(primary_dir, replicas[1], 60)
    finally:
        for server in (*servers, primary):
            server.stop()
    return {"first copy": first_copy, "steady": steady, "catchup": catchup}


# ---------------------------------------------------------------- rsync


class RsyncLoop:
    """lsyncd's way: on each burst of file-system events in ``source``, ``rsync -az
    --delete`` to every replica at once; again while events keep coming."""

    def __init__(self, source: Path, replicas: list[Path], localsh: str) -> None:
        from watchdog.events import FileSystemEventHandler
        from watchdog.observers import Observer

        from rdc_server.watcher import CHANGES

        self.source, self.replicas, self.localsh = source, replicas, localsh
        self.dirty = threading.Event()
        self.stopping = threading.Event()
        self.bytes = 0
        self.cpu = 0.0
        self.runs = 0
        loop = self

        class Handler(FileSystemEventHandler):
            def on_any_event(self, event) -> None:
                if event.event_type not in ("opened", "closed_no_write"):
                    loop.dirty.set()

        self.observer = Observer()
        # Changes only, as lsyncd asks inotify: rsync's own reads must not flood the queue.
        self.observer.schedule(Handler(), str(source), recursive=True,
                               event_filter=CHANGES)
        self.observer.start()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def once(self, replica: Path) -> tuple[int, float, float]:
        """One rsync run to ``replica``: bytes (both ways), CPU and wall seconds."""
        done = measure.run(["rsync", "-az", "--delete", "--stats", "-e", self.localsh,
                            f"{self.source}/", f"localhost:{replica}/"])
        if done.returncode:
            raise SystemExit(f"rsync failed: {done.stderr}")
        sent = int(re.search(r"Total bytes sent: ([\d,]+)", done.stdout)[1].replace(",", ""))
        got = int(re.search(r"Total bytes received: ([\d,]+)", done.stdout)[1]
                  .replace(",", ""))
        return sent + got, done.usage.cpu, done.usage.seconds

    def _run(self) -> None:
        while not self.stopping.is_set():
            if not self.dirty.wait(0.05):
                continue
            self.dirty.clear()
            results: list[tuple[int, float, float]] = []

            def one(replica: Path, into: list = results) -> None:
                into.append(self.once(replica))

            threads = [threading.Thread(target=one, args=(r,)) for r in self.replicas]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            self.runs += 1
            self.bytes += sum(r[0] for r in results)
            self.cpu += sum(r[1] for r in results)

    def stop(self) -> None:
        self.observer.stop()
        self.observer.join()
        while self.dirty.is_set():
            time.sleep(0.05)
        self.stopping.set()
        self.thread.join()


def rsync_phase(work: Path, corpus: Path, changes: list, burst: list, localsh: str,
                rate: float) -> dict:
    root = work / "rsync"
    primary_dir, replicas = root / "primary", [root / "r1", root / "r2"]
    root.mkdir(exist_ok=True)
    for d in (primary_dir, *replicas):
        if d.exists():
            shutil.rmtree(d)
        subprocess.run(["cp", "-a", str(corpus), str(d)], check=True)
    os.sync()
    time.sleep(1)
    print(f"rsync: workload (load {load()})", file=sys.stderr)
    loop = RsyncLoop(primary_dir, replicas, localsh)
    checker = workload.Checker(replicas)
    seconds = workload.run_steady(primary_dir, changes, rate, checker)
    done = checker.wait(120)
    checker.stop()
    time.sleep(1)
    loop.stop()
    steady = {"seconds": seconds, "lags": checker.lags(), "bytes": loop.bytes, "cpu": loop.cpu,
              "complete": done, "runs": loop.runs}
    for d in replicas:
        wait_same(primary_dir, d, 60)
    print(f"rsync: catch-up after {len(burst)} changes (load {load()})", file=sys.stderr)
    for change in burst:
        workload.apply(primary_dir, change)
    os.sync()
    wire, cpu, wall = loop.once(replicas[1])
    wait_same(primary_dir, replicas[1], 60)
    return {"steady": steady, "catchup": {"seconds": wall, "bytes": wire, "cpu": cpu}}


# ---------------------------------------------------------------- report


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]


def summary(steady: dict, changes: int) -> dict:
    lags = steady["lags"]
    return {"p50": percentile(lags, 50), "p99": percentile(lags, 99), "max": max(lags),
            "mean": statistics.fmean(lags), "bytes per change": steady["bytes"] / changes,
            "cpu": steady["cpu"]}


def report(result: dict, changes: int, burst: int) -> list[str]:
    rdc, rsync = result["rdc"], result["rsync"]
    a, b = summary(rdc["steady"], changes), summary(rsync["steady"], changes)
    lines = [
        f"Replication of a Django tree to two replicas: {changes} changes at "
        f"{result['rate']:g}/s, then {burst} changes while a replica is offline. "
        f"Load average: {result['load before']} before, {result['load after']} after.",
        "",
        "| steady workload | rdc | rsync -az loop | rdc / rsync | target |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    for key, unit, target in (("p50", "s", "p50 <= 1 s"), ("p99", "s", "p99 <= 3 s"),
                              ("max", "s", ""), ("mean", "s", ""),
                              ("bytes per change", "B", "<= 0.5x"), ("cpu", "s", "")):
        ra = a[key] / b[key] if b[key] else float("nan")
        fmt = (lambda v: f"{v:,.0f}") if unit == "B" else (lambda v: f"{v:.2f}")
        lines.append(f"| {key} ({unit}) | {fmt(a[key])} | {fmt(b[key])} | {ra:.2f} | "
                     f"{target} |")
    ca, cb = rdc["catchup"], rsync["catchup"]
    lines += ["", f"| catch-up after {burst} changes | rdc | rsync -az | rdc / rsync | target |",
              "| --- | ---: | ---: | ---: | --- |",
              f"| time (s) | {ca['seconds']:.2f} | {cb['seconds']:.2f} | "
              f"{ca['seconds'] / cb['seconds']:.2f} | <= 1.5x |",
              f"| bytes | {ca['bytes']:,} | {cb['bytes']:,} | {ca['bytes'] / cb['bytes']:.2f} | "
              "<= 0.5x |",
              f"| cpu (s) | {ca['cpu']:.2f} | {cb['cpu']:.2f} | {ca['cpu'] / cb['cpu']:.2f} | |",
              "", f"rdc's first copy to both replicas: {rdc['first copy']['seconds']:.1f} s, "
              f"{rdc['first copy']['bytes']:,} bytes; rsync ran {rsync['steady']['runs']} "
              "times (two replicas each) in the steady phase."]
    met = {
        "p50": a["p50"] <= TARGETS["p50"], "p99": a["p99"] <= TARGETS["p99"],
        "bytes": a["bytes per change"] <= TARGETS["bytes"] * b["bytes per change"],
        "catchup bytes": ca["bytes"] <= TARGETS["catchup bytes"] * cb["bytes"],
        "catchup time": ca["seconds"] <= TARGETS["catchup time"] * cb["seconds"],
    }
    lines.append("targets: " + ", ".join(f"{k} {'met' if v else 'MISSED'}"
                                          for k, v in met.items()))
    result["targets"] = met
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", default="/tmp/corpus/django/5.0.1", type=Path)
    ap.add_argument("--seconds", type=float, default=60, help="length of the steady workload")
    ap.add_argument("--rate", type=float, default=2.0, help="changes per second")
    ap.add_argument("--catchup", type=int, default=1000, help="changes while offline")
    ap.add_argument("--seed", type=int, default=16)
    ap.add_argument("--work", type=Path, help="work directory (default: a temporary one)")
    ap.add_argument("--localsh", default=str(LOCALSH), help="rsync's fake remote shell")
    ap.add_argument("--json", type=Path, help="write every figure here")
    args = ap.parse_args()
    if not args.corpus.is_dir():
        raise SystemExit(f"no corpus at {args.corpus}: run ../shared/bench/make_corpus.sh")
    localsh = args.localsh if os.path.exists(args.localsh) else "/work/shared/bench/localsh"
    count = max(1, int(args.seconds * args.rate))
    changes = workload.plan(args.corpus, count, args.seed)
    # The burst is planned on the tree as the steady workload leaves it.
    work = args.work or Path(tempfile.mkdtemp(prefix="rdc-repl-"))
    work.mkdir(parents=True, exist_ok=True)
    scratch = work / "plan"
    if scratch.exists():
        shutil.rmtree(scratch)
    subprocess.run(["cp", "-a", str(args.corpus), str(scratch)], check=True)
    for change in changes:
        workload.apply(scratch, change)
    burst = workload.plan(scratch, args.catchup, args.seed + 1, distinct=False)
    shutil.rmtree(scratch)
    result: dict = {"rate": args.rate, "changes": count, "burst": args.catchup,
                    "load before": load()}
    try:
        result["rdc"] = rdc_phase(work, args.corpus, changes, burst, args)
        result["rsync"] = rsync_phase(work, args.corpus, changes, burst, localsh, args.rate)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    result["load after"] = load()
    print("\n".join(report(result, count, args.catchup)))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
