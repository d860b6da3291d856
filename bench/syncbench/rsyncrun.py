"""rsync over a fake remote shell (``localsh``): its real sender, receiver and delta
algorithm over pipes, and its ``--stats`` byte counts."""

from __future__ import annotations

import re
from pathlib import Path

from . import measure
from .model import Case, Run
from .trees import reset, tree_diff


class BenchError(Exception):
    pass


def rsync_stat(text: str, label: str) -> int:
    m = re.search(rf"^{label}: ([\d,]+)", text, re.MULTILINE)
    if not m:
        raise BenchError(f"rsync --stats has no {label!r}:\n{text}")
    return int(m.group(1).replace(",", ""))


def variant_name(opts: list[str]) -> str:
    return " ".join(o for o in opts if not o.startswith("--delete"))


def rsync_step(case_name: str, state: str, opts: list[str], src: str, dest: str,
               localsh: str) -> Run:
    """One measured rsync run (not verified: the caller knows what to compare)."""
    cmd = ["rsync", *opts, "--stats", "-e", localsh, src, dest]
    done = measure.run(cmd, tree_name="rsync")
    if done.returncode != 0:
        raise BenchError(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stderr}")
    out, u = done.stdout, done.usage
    return Run(case_name, "rsync", variant_name(opts), state,
               rsync_stat(out, "Total bytes sent"), rsync_stat(out, "Total bytes received"),
               rsync_stat(out, "Literal data"), u.seconds, "ok", u.cpu, u.peak_rss, u.peaks)


def rsync_once(case: Case, opts: list[str], dst: Path, localsh: str) -> Run:
    reset(case.old, dst)
    if case.single:
        src, dest = str(case.new / case.single), f"localhost:{dst / case.single}"
    elif case.pull:
        src, dest = f"localhost:{case.new}/", f"{dst}/"
    else:
        src, dest = f"{case.new}/", f"localhost:{dst}/"
    runs = 2 if case.group == "nochange" else 1
    for _ in range(runs):  # no change: the second run over the result of the first
        run = rsync_step(case.name, "", opts, src, dest, localsh)
    run.verify = tree_diff(case.new, dst)
    return run
