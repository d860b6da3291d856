#!/usr/bin/env python3
"""What a backup into a repository behind `rdc serve` sends, against the same backups into
a local directory repository in the same run.

Steps, each `rdc backup --json` into both repositories: the Django releases in order
(/tmp/corpus/django/*; `--quick`: the first three), then a copy of the last release with
one file edited (a second backup of a slightly changed tree), then, without `--quick`, the
256 MiB bigbin and its edited version. Per step: the tree's size, what the repository grew
by, the bytes the client sent and received (its connection's counter, compressed, the
handshake, index sync and locks included), and the wall time over the network against the
local one (the reference). Dedup is the client's, so what travels should be about what
the repository grows by, not what the tree holds.

    flock /tmp/rdc-bench.lock python bench/backup_over_network.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CORPUS = Path(os.environ.get("CORPUS", "/tmp/corpus"))
DJANGO = ["5.0.1", "5.0.2", "5.0.3", "5.0.4", "5.0.6", "5.0.7"]
RDC = [sys.executable, "-m", "rdc_client"]
TOKEN = "bench-token-0123456789abcdef"


def tree_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def warm(path: Path) -> None:
    for p in [path] if path.is_file() else path.rglob("*"):
        if p.is_file() and not p.is_symlink():
            with open(p, "rb") as f:
                while f.read(1 << 20):
                    pass


def run(env: dict[str, str], *args: str) -> tuple[dict, float]:
    start = time.monotonic()
    done = subprocess.run([*RDC, *args], capture_output=True, env=env, timeout=3600)
    seconds = time.monotonic() - start
    if done.returncode != 0:
        sys.exit(f"rdc {' '.join(args)} failed: {done.stderr.decode()}")
    return (json.loads(done.stdout) if done.stdout.strip().startswith(b"{") else {}), seconds


def human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="three releases and the edit")
    args = parser.parse_args()
    releases = DJANGO[:3] if args.quick else DJANGO
    missing = [r for r in releases if not (CORPUS / "django" / r).is_dir()]
    if missing:
        sys.exit(f"no corpus at {CORPUS}: run ../shared/bench/make_corpus.sh")
    work = Path(tempfile.mkdtemp(prefix="rdc-netbench-"))
    env = dict(os.environ, XDG_CACHE_HOME=str(work / "cache"), LC_ALL="C.UTF-8")
    (work / "tokens").write_text(TOKEN + "\n")
    (work / "token").write_text(TOKEN + "\n")
    log = open(work / "serve.log", "wb")  # noqa: SIM115 - closed at the end
    server = subprocess.Popen(
        [*RDC, "serve", "--listen", "127.0.0.1:0", "--repo", f"bk={work / 'served'}",
         "--token-file", str(work / "tokens"), "--state-dir", str(work / "state")],
        stdout=log, stderr=log, env=env)
    try:
        deadline = time.monotonic() + 30
        while not (found := re.search(r"listening on (\S+):(\d+)",
                                      (work / "serve.log").read_text())):
            if time.monotonic() > deadline or server.poll() is not None:
                sys.exit("rdc serve did not start:\n" + (work / "serve.log").read_text())
            time.sleep(0.05)
        url = f"rdc://127.0.0.1:{found.group(2)}/bk"
        local = str(work / "local")
        net = ["--token-file", str(work / "token")]
        run(env, "init", url, *net)
        run(env, "init", local)

        edited = work / "edited"
        shutil.copytree(CORPUS / "django" / releases[-1], edited, symlinks=True)
        steps: list[tuple[str, Path]] = [(f"django {r}", CORPUS / "django" / r)
                                         for r in releases]
        steps += [("last release, copied", edited), ("the copy, one file edited", edited)]
        if not args.quick and (CORPUS / "bigbin" / "orig.bin").is_file():
            steps += [("bigbin", CORPUS / "bigbin" / "orig.bin"),
                      ("bigbin edited", CORPUS / "bigbin" / "edited.bin")]
        rows = []
        for name, source in steps:
            if name == "the copy, one file edited":
                target = next(p for p in sorted(edited.rglob("*.py")) if p.stat().st_size > 4000)
                with open(target, "a") as f:
                    f.write("\n# one edited line\n")
            warm(source)  # neither run pays for a cold page cache
            over, t_net = run(env, "backup", "--json", str(source), url, *net)
            here, t_local = run(env, "backup", "--json", str(source), local)
            rows.append({"step": name, "tree": tree_bytes(source), "added": over["added_bytes"],
                         "sent": over["wire"]["sent"], "received": over["wire"]["received"],
                         "seconds_net": t_net, "seconds_local": t_local,
                         "added_local": here["added_bytes"]})
        print(f"{'step':28} {'tree':>9} {'added':>9} {'sent':>9} {'recv':>9} "
              f"{'sent/tree':>9} {'sent/added':>10} {'time net/local':>14}")
        for r in rows:
            print(f"{r['step']:28} {human(r['tree']):>9} {human(r['added']):>9} "
                  f"{human(r['sent']):>9} {human(r['received']):>9} "
                  f"{r['sent'] / r['tree']:>9.4f} {r['sent'] / max(r['added'], 1):>10.2f} "
                  f"{r['seconds_net'] / r['seconds_local']:>14.2f}")
        print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        print(json.dumps({"rows": rows}))
    finally:
        server.terminate()
        server.wait(30)
        log.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
