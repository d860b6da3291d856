"""rdc through its command line only: one ``rdc serve`` on loopback, and ``rdc push`` /
``rdc pull`` runs measured with their ``--stats-json``."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from . import measure
from .model import Case, Run
from .rsyncrun import BenchError
from .trees import discard, reset, tree_diff


def rdc_env(**extra: str) -> dict[str, str]:
    """The environment rdc runs in: as installed, with its bytecode cached (pip compiles
    it at install). Where PYTHONDONTWRITEBYTECODE is set, every start would compile rdc's
    own modules from source, some 40 ms that no user pays."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(extra)
    return env


class Server:
    """One ``rdc serve`` on loopback, port 0, exporting share ``bench`` = work/share.
    ``prefix`` runs it under a wrapper (a profiler)."""

    def __init__(self, rdc: str, work: Path, prefix: list[str] | None = None) -> None:
        self.rdc, self.work, self.prefix = rdc, work, prefix or []
        self.share = work / "share"
        self.share.mkdir(parents=True, exist_ok=True)
        self.token = work / "token"
        self.token.write_text(os.urandom(16).hex() + "\n")
        self.log = work / "serve.log"
        self.proc: subprocess.Popen | None = None
        self.port = 0

    def start(self) -> None:
        offset = self.log.stat().st_size if self.log.exists() else 0
        argv = self.prefix or [self.rdc]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [*argv, "serve", "--listen", "127.0.0.1:0", "--share", f"bench={self.share}",
                 "--token-file", str(self.token), "--state-dir", str(self.work / "state")],
                stdout=log, stderr=subprocess.STDOUT, env=rdc_env(),
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            m = re.search(r"listening on [^\s:]+:(\d+)", self.log.read_text()[offset:])
            if m:
                self.port = int(m.group(1))
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise BenchError(f"rdc serve did not start:\n{self.log.read_text()}")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def settle(self, quiet: float = 0.01, limit: float = 10.0) -> None:
        """Wait (at most ``limit`` s) until the server uses under ``quiet`` CPU seconds in a
        tenth of a second. Its share watcher handles the events of the copies and deletions
        this bench makes in the share; a timed run should not pay for those."""
        deadline = time.monotonic() + limit
        before = measure.process_cpu(self.pid)
        while time.monotonic() < deadline:
            time.sleep(0.1)
            now = measure.process_cpu(self.pid)
            if now - before < quiet:
                return
            before = now

    def check(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            raise BenchError(f"rdc serve died:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def url(self, path: str, port: int | None = None) -> str:
        return f"rdc://127.0.0.1:{port or self.port}/bench/{path}"


class Rdc:
    """Runs the rdc client against one server; pushes of tree-pair cases go into fresh
    directories of the share, one per run (a new directory has a new server index, so
    'cold' is really cold)."""

    def __init__(self, rdc: str, server: Server, work: Path,
                 prefix: list[str] | None = None) -> None:
        self.rdc, self.server, self.work, self.prefix = rdc, server, work, prefix or []
        self.count = 0

    def fresh(self, what: str) -> Path:
        self.count += 1
        path = self.work / f"{what}{self.count:03d}"
        path.mkdir()
        return path

    def command(self, verb: str, args: list[str], cache: Path,
                settle_limit: float = 10.0) -> tuple[measure.Usage, dict]:
        """Run ``rdc VERB ARGS`` with the client index in ``cache``: its usage, and its
        stats with the server's CPU seconds and peak RSS added (_server_cpu, _server_rss)."""
        stats_file = self.work / "stats.json"
        stats_file.unlink(missing_ok=True)
        cmd = [*(self.prefix or [self.rdc]), verb, "--token-file", str(self.server.token),
               "--stats-json", str(stats_file), *args]
        env = rdc_env(XDG_CACHE_HOME=str(cache))
        os.sync()
        self.server.settle(limit=settle_limit)
        probe = measure.ServerProbe(self.server.pid)
        probe.begin()
        done = measure.run(cmd, env=env)
        server_cpu, server_rss = probe.end()
        if done.returncode != 0:
            raise BenchError(
                f"XDG_CACHE_HOME={cache} {' '.join(cmd)} exited {done.returncode}\n"
                f"stdout: {done.stdout}\nstderr: {done.stderr}\n"
                f"server log (tail):\n{self.server.log_tail()}"
            )
        self.server.check()
        stats = json.loads(stats_file.read_text())
        stats["_server_cpu"], stats["_server_rss"] = server_cpu, server_rss
        return done.usage, stats

    def run_of(self, case_name: str, state: str, variant: str, usage: measure.Usage,
               stats: dict, verify: str) -> Run:
        if not stats.get("in_step"):
            verify += " (rdc: in_step false)"
        return Run(case_name, "rdc", variant, state, stats["bytes_sent"],
                   stats["bytes_received"], stats["literal_bytes"], usage.seconds, verify,
                   usage.cpu, usage.peak_rss, server_cpu=stats.pop("_server_cpu"),
                   server_rss=stats.pop("_server_rss"), stats=stats)

    def push(self, case: Case, state: str, compress: bool = True, warm_cache: Path | None = None,
             port: int | None = None) -> Run:
        name = f"r{self.count + 1:03d}"
        self.count += 1
        dst = self.server.share / name
        reset(case.old, dst)
        url = self.server.url(name)
        flags = ["--delete"] + ([] if compress else ["--no-compress"])
        source, local = case.new, None
        if state == "synced":
            # A working copy this client pushed OLD from, then made NEW in place (rsync
            # into it) and pushes again: a user who renamed or edited within a tree they
            # sync, whose index knows what the server holds.
            local = self.fresh("local")
            reset(case.old, local)
            cache = self.fresh("cache")
            self.command("push", [*flags, str(local), url], cache)
            subprocess.run(["rsync", "-a", "--delete", f"{case.new}/", f"{local}/"],
                           check=True)
            os.sync()
            source = local
        else:
            cache = self._cache(state, url, warm_cache,
                                ["push", "-n", *flags, str(case.new), url])
        runs = 2 if case.group == "nochange" else 1
        for i in range(runs):  # no change: the second push over the result of the first
            if port is not None and i == runs - 1:
                url = self.server.url(name, port)
            usage, stats = self.command("push", [*flags, str(source), url], cache)
        verify = tree_diff(case.new, dst)
        discard(dst)
        if local is not None:
            discard(local)
        return self.run_of(case.name, state, "zstd" if compress else "--no-compress", usage,
                           stats, verify)

    def pull(self, case: Case, state: str, compress: bool = True, warm_cache: Path | None = None,
             port: int | None = None) -> Run:
        """The sync the other way: a fresh directory of the share holds NEW (so 'cold' is
        the server's index too), and a local copy of OLD pulls it; the index states as for
        `push`, the client's being of that local copy."""
        name = f"r{self.count + 1:03d}"
        self.count += 1
        src = self.server.share / name
        reset(case.new, src)
        local = self.fresh("pulled")
        reset(case.old, local)
        flags = ["--delete"] + ([] if compress else ["--no-compress"])
        url = self.server.url(name)
        cache = self._cache(state, url, warm_cache, ["pull", "-n", *flags, url, str(local)])
        url = url if port is None else self.server.url(name, port)
        usage, stats = self.command("pull", [*flags, url, str(local)], cache)
        verify = tree_diff(case.new, local)
        discard(local)
        discard(src)
        return self.run_of(case.name, state, "zstd" if compress else "--no-compress", usage,
                           stats, verify)

    def _cache(self, state: str, url: str, warm_cache: Path | None, dry_run: list[str]
               ) -> Path:
        """The client index directory for a run in ``state``, the indexes made ready:
        srv-warm, a dry-run pull into an empty directory makes the server index its tree;
        warm, the ``dry_run`` command (verb first) indexes both sides, the client's in
        ``warm_cache``, which is kept."""
        if state in ("cold", "re-run"):
            return self.fresh("cache")
        if state == "srv-warm":
            self.command("pull", ["-n", url, str(self.fresh("empty"))], self.fresh("cache"))
            return self.fresh("cache")
        assert warm_cache is not None
        self.command(dry_run[0], dry_run[1:], warm_cache)
        return warm_cache


T = TypeVar("T")


def run_cases(cases: Sequence[Case], server: Server, run: Callable[[Case], T],
              log: list[str]) -> dict[str, T]:
    """``run`` of each case in turn, by name, its trees printed first. One that fails (a
    `BenchError`, or an OSError: a full disk, say) is logged and printed, the server
    started again if that stopped it, and the rest go on."""
    results: dict[str, T] = {}
    for case in cases:
        print(f"{case.name}: {case.old or '(empty)'} -> {case.new}", flush=True)
        try:
            results[case.name] = run(case)
        except (BenchError, OSError) as exc:
            log.append(f"{case.name}: FAILED: {exc}")
            print(f"  FAILED: {exc}", flush=True)
            if server.proc is not None and server.proc.poll() is not None:
                server.start()
    return results


def rdc_binary() -> str:
    """The ``rdc`` command beside this Python (a virtual environment's), else on PATH;
    SystemExit without one."""
    found = shutil.which("rdc", path=f"{Path(sys.executable).parent}{os.pathsep}"
                                     f"{os.environ.get('PATH', '')}")
    if found is None:
        raise SystemExit("needs rdc (pip install -e .)")
    return found
