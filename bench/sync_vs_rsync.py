#!/usr/bin/env python3
"""rdc against rsync on the same syncs: bytes on the wire (both directions) and wall time.

Each case brings a receiver that holds the OLD tree up to the NEW one: (a) consecutive
Django releases, (b) a 256 MiB file with 10 scattered edits, (c) a tree with 20% of its
files renamed or moved, (d) a tree with small edits scattered over many files, (e) the
same sync run a second time with nothing changed (the second run is measured).

rsync runs over a fake remote shell (`localsh`), so its real delta algorithm runs and its
``--stats`` byte counts are real; variants -a, -az, -acz (plus --fuzzy for the renamed
tree). Its *best* variant per case is the one with the fewest bytes. rdc pushes into a
local ``rdc serve``; its bytes are everything its client counted on the socket, with zstd
(the default) and ``--no-compress``. Every receiver is checked against the sender
afterwards (paths, contents, modes, mtimes).

rdc keeps signature indexes (the server's of the receiving tree, the client's of the
sending one); rsync keeps none. Times are given per index state:
  cold       both indexes built during the timed run (rdc reads everything, like rsync -c):
             the headline time ratio
  srv-warm   the server indexed the OLD tree before timing, the client's index is cold
  warm       both indexes built before timing (a repeated sync between the same trees)
  re-run     (no change) the second of two identical pushes, indexes as the first left them
Ratios are rdc / rsync-best: below 1 rdc wins. Absolute times on a shared 2-core machine
swing by 30%; ratios within one run do not. The cpu column splits rdc's time between
client and server. One more push per case goes through a proxy that counts rdc's bytes
per message type (listings, offers, tree signatures, literal data, ...). Prints tables;
the last line is one JSON object. Exits 1 if a receiver differs from its sender.

    pip install -e '.[bench]'
    flock /tmp/rdc-bench.lock python bench/sync_vs_rsync.py [--quick] [--cases django,nochange]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import re
import resource
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import msgpack
import zstandard

from rdc.wire.frames import HISTORY

GROUPS = ("django", "bigbin", "renamed", "scattered", "nochange")


def rdc_env(**extra: str) -> dict[str, str]:
    """The environment rdc runs in: as installed, with its bytecode cached (pip compiles
    it at install). Where PYTHONDONTWRITEBYTECODE is set, every start would compile rdc's
    own modules from source, some 40 ms that no user pays."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(extra)
    return env
TARGETS = {"django": 0.5, "bigbin": 0.5, "renamed": 0.5, "scattered": 1.0}
NOCHANGE_MAX_BYTES = 10_000
SCATTERED_BASE = "5.0.7"  # make_scattered.py /tmp/corpus/django/5.0.7 .../scattered/tree
STATES = ("cold", "srv-warm", "warm")


class BenchError(Exception):
    pass


# ------------------------------------------------------------------ cases


@dataclass
class Case:
    name: str
    group: str
    old: Path  # what the receiver starts with
    new: Path  # what the sender has
    rsync_variants: list[list[str]]
    single: str | None = None  # rsync this one file rather than the directory


@dataclass
class Run:
    case: str
    tool: str
    variant: str
    state: str
    sent: int = 0
    received: int = 0
    literal: int | None = None
    seconds: float = 0.0
    verify: str = "ok"
    cpu: float = 0.0  # CPU seconds: all rsync processes; the rdc client
    server_cpu: float | None = None  # the rdc server during the timed push
    stats: dict = field(default_factory=dict)

    @property
    def total(self) -> int:
        return self.sent + self.received


def django_versions(corpus: Path) -> list[str]:
    root = corpus / "django"
    if not root.is_dir():
        return []
    names = [p.name for p in root.iterdir() if re.fullmatch(r"\d+(\.\d+)*", p.name)]
    return sorted(names, key=lambda v: tuple(int(x) for x in v.split(".")))


def build_cases(corpus: Path, groups: list[str], quick: bool, work: Path) -> list[Case]:
    plain = [["-a"], ["-az"], ["-acz"]]
    cases: list[Case] = []
    versions = django_versions(corpus)
    pairs = list(itertools.pairwise(versions))
    for group in groups:
        if group in ("django", "nochange") and not pairs:
            print(f"note: skipping {group}: no Django trees under {corpus / 'django'}")
            continue
        if group == "django":
            for a, b in pairs[:1] if quick else pairs:
                cases.append(Case(f"django {a}->{b}", group, corpus / "django" / a,
                                  corpus / "django" / b, [[*v, "--delete"] for v in plain]))
        elif group == "nochange":
            a, b = pairs[0]
            cases.append(Case(f"no change (django {b} again)", group, corpus / "django" / a,
                              corpus / "django" / b, [[*v, "--delete"] for v in plain]))
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
                              work / "big" / "new", plain, single="data.bin"))
        elif group == "renamed":
            tree, base_file = corpus / "renamed" / "tree", corpus / "renamed" / "base_version"
            base = base_file.read_text().strip() if base_file.is_file() else ""
            if not tree.is_dir() or not (corpus / "django" / base).is_dir():
                print(f"note: skipping renamed: {tree} or its base version missing")
                continue
            variants = [[*v, *fz, "--delete-after"] for fz in ([], ["--fuzzy"]) for v in plain]
            cases.append(Case(f"renamed/moved over {base}", group, corpus / "django" / base,
                              tree, variants))
        elif group == "scattered":
            tree, base = corpus / "scattered" / "tree", corpus / "django" / SCATTERED_BASE
            if not tree.is_dir() or not base.is_dir():
                print(f"note: skipping scattered: {tree} or {base} missing "
                      "(make_scattered.py django/5.0.7 scattered/tree)")
                continue
            cases.append(Case(f"scattered edits over {SCATTERED_BASE}", group, base, tree,
                              [[*v, "--delete"] for v in plain]))
    return cases


def link_or_copy(src: Path, dst: Path) -> None:
    if dst.exists():
        return
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


# ------------------------------------------------------------------ trees


def reset(old: Path, dst: Path) -> None:
    """``dst`` becomes a fresh copy of ``old`` (new inodes, mtimes kept)."""
    if dst.exists():
        shutil.rmtree(dst)
    subprocess.run(["cp", "-a", str(old), str(dst)], check=True)
    os.sync()  # no writeback of the copy inside a timed run


def children_cpu() -> float:
    """CPU seconds of the waited-for children of this process (and their waited-for
    descendants: rsync's remote side under localsh counts)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def process_cpu(pid: int) -> float:
    """CPU seconds of a running process, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def entries(root: Path) -> dict[str, os.stat_result]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            out[os.path.relpath(path, root)] = os.lstat(path)
    return out


def same_bytes(a: str, b: str) -> bool:
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            x, y = fa.read(1 << 20), fb.read(1 << 20)
            if x != y:
                return False
            if not x:
                return True


def tree_diff(want: Path, got: Path) -> str:
    """'ok', or what differs between the sender's tree and the receiver's (by kind, with
    the first example)."""
    a, b = entries(want), entries(got)
    problems: dict[str, list[str]] = {}
    for path in sorted(a.keys() - b.keys()):
        problems.setdefault("missing", []).append(path)
    for path in sorted(b.keys() - a.keys()):
        problems.setdefault("extra", []).append(path)
    for path in sorted(a.keys() & b.keys()):
        sa, sb = a[path], b[path]
        kind = stat.S_IFMT(sa.st_mode)
        if kind != stat.S_IFMT(sb.st_mode):
            problems.setdefault("type", []).append(path)
        elif stat.S_ISLNK(sa.st_mode):
            if os.readlink(want / path) != os.readlink(got / path):
                problems.setdefault("link", []).append(path)
        elif stat.S_ISREG(sa.st_mode):
            if sa.st_size != sb.st_size or not same_bytes(str(want / path), str(got / path)):
                problems.setdefault("content", []).append(path)
            if sa.st_mtime_ns != sb.st_mtime_ns:
                problems.setdefault("mtime", []).append(path)
            if stat.S_IMODE(sa.st_mode) != stat.S_IMODE(sb.st_mode):
                problems.setdefault("mode", []).append(path)
    if not problems:
        return "ok"
    return "; ".join(f"{k} {len(v)} (e.g. {v[0]})" for k, v in problems.items())


# ------------------------------------------------------------------ rsync


def rsync_stat(text: str, label: str) -> int:
    m = re.search(rf"^{label}: ([\d,]+)", text, re.MULTILINE)
    if not m:
        raise BenchError(f"rsync --stats has no {label!r}:\n{text}")
    return int(m.group(1).replace(",", ""))


def rsync_once(case: Case, opts: list[str], dst: Path, localsh: str) -> Run:
    reset(case.old, dst)
    if case.single:
        src, dest = str(case.new / case.single), f"localhost:{dst / case.single}"
    else:
        src, dest = f"{case.new}/", f"localhost:{dst}/"
    cmd = ["rsync", *opts, "--stats", "-e", localsh, src, dest]
    runs = 2 if case.group == "nochange" else 1
    for _ in range(runs):  # no change: the second run over the result of the first
        cpu = children_cpu()
        start = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        cpu = children_cpu() - cpu
        if proc.returncode != 0:
            raise BenchError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr}")
    out = proc.stdout
    return Run(case.name, "rsync", " ".join(o for o in opts if not o.startswith("--delete")),
               "", rsync_stat(out, "Total bytes sent"), rsync_stat(out, "Total bytes received"),
               rsync_stat(out, "Literal data"), seconds, tree_diff(case.new, dst), cpu)


# ------------------------------------------------------------------ rdc


class Server:
    """One ``rdc serve`` on loopback, port 0, exporting share ``bench`` = work/share."""

    def __init__(self, rdc: str, work: Path) -> None:
        self.rdc, self.work = rdc, work
        self.share = work / "share"
        self.share.mkdir()
        self.token = work / "token"
        self.token.write_text(os.urandom(16).hex() + "\n")
        self.log = work / "serve.log"
        self.proc: subprocess.Popen | None = None
        self.port = 0

    def start(self) -> None:
        offset = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [self.rdc, "serve", "--listen", "127.0.0.1:0", "--share", f"bench={self.share}",
                 "--token-file", str(self.token), "--state-dir", str(self.work / "state")],
                stdout=log, stderr=subprocess.STDOUT, env=rdc_env(),
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            m = re.search(r"listening on [^\s:]+:(\d+)", self.log.read_text()[offset:])
            if m:
                self.port = int(m.group(1))
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise BenchError(f"rdc serve did not start:\n{self.log.read_text()}")

    def settle(self, quiet: float = 0.01, limit: float = 10.0) -> None:
        """Wait (at most ``limit`` s) until the server uses under ``quiet`` CPU seconds in a
        tenth of a second. Its share watcher handles the events of the copies and deletions
        this bench makes in the share; a timed run should not pay for those."""
        assert self.proc is not None
        deadline = time.monotonic() + limit
        before = process_cpu(self.proc.pid)
        while time.monotonic() < deadline:
            time.sleep(0.1)
            now = process_cpu(self.proc.pid)
            if now - before < quiet:
                return
            before = now

    def check(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            raise BenchError(f"rdc serve died:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def url(self, path: str, port: int | None = None) -> str:
        return f"rdc://127.0.0.1:{port or self.port}/bench/{path}"


class Rdc:
    """Pushes into fresh directories of the server's share, one per run (a new directory
    has a new server index, so 'cold' is really cold)."""

    def __init__(self, rdc: str, server: Server, work: Path) -> None:
        self.rdc, self.server, self.work = rdc, server, work
        self.count = 0

    def fresh(self, what: str) -> Path:
        self.count += 1
        path = self.work / f"{what}{self.count:03d}"
        path.mkdir()
        return path

    def command(self, verb: str, args: list[str], cache: Path) -> tuple[float, dict]:
        """Run ``rdc VERB ARGS`` with the client index in ``cache``; (seconds, stats with
        the client's and the server's CPU seconds added)."""
        stats_file = self.work / "stats.json"
        stats_file.unlink(missing_ok=True)
        cmd = [self.rdc, verb, "--token-file", str(self.server.token),
               "--stats-json", str(stats_file), *args]
        env = rdc_env(XDG_CACHE_HOME=str(cache))
        assert self.server.proc is not None
        os.sync()
        self.server.settle()
        cpu, server_cpu = children_cpu(), process_cpu(self.server.proc.pid)
        start = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        seconds = time.perf_counter() - start
        cpu, server_cpu = children_cpu() - cpu, process_cpu(self.server.proc.pid) - server_cpu
        if proc.returncode != 0:
            raise BenchError(
                f"XDG_CACHE_HOME={cache} {' '.join(cmd)} exited {proc.returncode}\n"
                f"stdout: {proc.stdout}\nstderr: {proc.stderr}\n"
                f"server log (tail):\n{self.server.log_tail()}"
            )
        self.server.check()
        stats = json.loads(stats_file.read_text())
        stats["_cpu"], stats["_server_cpu"] = cpu, server_cpu
        return seconds, stats

    def push(self, case: Case, state: str, compress: bool = True, warm_cache: Path | None = None,
             proxy: FrameTally | None = None) -> Run:
        name = f"r{self.count + 1:03d}"
        self.count += 1
        dst = self.server.share / name
        reset(case.old, dst)
        url = self.server.url(name)
        flags = ["--delete"] + ([] if compress else ["--no-compress"])
        if state in ("cold", "re-run"):
            cache = self.fresh("cache")
        elif state == "srv-warm":
            # A dry-run pull into an empty directory makes the server index its tree.
            self.command("pull", ["-n", url, str(self.fresh("empty"))], self.fresh("cache"))
            cache = self.fresh("cache")
        else:
            # A dry-run push indexes both sides (the client's index of NEW is kept).
            assert warm_cache is not None
            cache = warm_cache
            self.command("push", ["-n", *flags, str(case.new), url], cache)
        runs = 2 if case.group == "nochange" else 1
        for i in range(runs):  # no change: the second push over the result of the first
            if proxy is not None and i == runs - 1:
                url = self.server.url(name, proxy.port)
            seconds, stats = self.command("push", [*flags, str(case.new), url], cache)
        verify = tree_diff(case.new, dst)
        if not stats.get("in_step"):
            verify += " (rdc: in_step false)"
        shutil.rmtree(dst)
        return Run(case.name, "rdc", "zstd" if compress else "--no-compress", state,
                   stats["bytes_sent"], stats["bytes_received"], stats["literal_bytes"],
                   seconds, verify, stats.pop("_cpu"), stats.pop("_server_cpu"), stats)


# ------------------------------------------------------------------ frame tally


class FrameTally:
    """A TCP proxy in front of the server that reads rdc frames in both directions and adds
    up the bytes on the wire per message type. A (compressed) frame's bytes are shared out
    to its messages in proportion to their uncompressed size."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream = upstream_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.bytes: dict[tuple[str, str], float] = {}
        self.counts: dict[tuple[str, str], int] = {}
        self.payload = {"C>S": 0, "S>C": 0}  # file bytes inside data / offer messages
        self.items: dict[str, int] = {}  # what listings and ops carried
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.upstream))
            done = threading.Barrier(2, action=lambda c=client, s=server: (c.close(), s.close()))
            for a, b, d in ((client, server, "C>S"), (server, client, "S>C")):
                threading.Thread(target=self._pump, args=(a, b, d, done), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, direction: str,
              done: threading.Barrier) -> None:
        buf = bytearray()
        history = bytearray()  # what rdc.wire.frames keeps: bodies after the handshake
        frames = 0
        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
                buf += data
                while len(buf) >= 4:
                    header = int.from_bytes(buf[:4], "big")
                    length = header & 0x7FFFFFFF
                    if len(buf) < 4 + length:
                        break
                    body = bytes(buf[4 : 4 + length])
                    del buf[: 4 + length]
                    if header >> 31:
                        dictionary = zstandard.ZstdCompressionDict(
                            bytes(history), dict_type=zstandard.DICT_TYPE_RAWCONTENT
                        ) if history else None
                        body = zstandard.ZstdDecompressor(dict_data=dictionary).decompress(body)
                    frames += 1
                    if frames > 1:  # the first frame each way is the handshake
                        history += body[-HISTORY:]
                        del history[: max(0, len(history) - HISTORY)]
                    self._count(direction, body, 4 + length)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)
            with contextlib.suppress(threading.BrokenBarrierError):
                done.wait()

    def _count(self, direction: str, body: bytes, wire: int) -> None:
        unpacker = msgpack.Unpacker(raw=False, max_buffer_size=len(body) + 1)
        unpacker.feed(body)
        items = []
        for _ in range(unpacker.read_array_header()):
            before = unpacker.tell()
            message = unpacker.unpack()
            items.append((message, unpacker.tell() - before))
        total = sum(size for _, size in items) or 1
        with self.lock:
            for message, size in items:
                t = message.get("t", "?")
                if t == "want":
                    t = f"want {message.get('k')}"
                elif t == "offer" and "data" in message:
                    t = "offer+data"
                if t in ("data", "offer+data"):
                    pieces = message.get("d") or [message.get("data") or b""]
                    self.payload[direction] += sum(len(p) for p in pieces)
                elif t == "listing":
                    dirs = message.get("dirs") or []
                    self._add("directories listed", len(dirs))
                    self._add("listing entries", sum(len(d[1] or []) for d in dirs))
                elif t == "ops":
                    for op in message.get("ops") or []:
                        self._add(f"ops {op[0]}", 1)
                key = (direction, t)
                self.bytes[key] = self.bytes.get(key, 0.0) + wire * size / total
                self.counts[key] = self.counts.get(key, 0) + 1

    def _add(self, key: str, n: int) -> None:
        self.items[key] = self.items.get(key, 0) + n

    def close(self) -> None:
        self.listener.close()

    def groups(self) -> dict[str, float]:
        """Wire bytes by role: listings, metadata, offers, tree signatures, literal data."""
        role = {
            "list": "listings", "listing": "listings",
            "mlist": "metadata", "mlisting": "metadata", "mset": "metadata", "ok": "metadata",
            "offer": "offers", "offer+data": "offers (with data <256 B)", "done": "offers",
            "want expand": "signatures", "want subs": "signatures", "lists": "signatures",
            "want fetch": "literal data", "want whole": "literal data", "data": "literal data",
            "ops": "ops", "oks": "ops",
        }
        out: dict[str, float] = {}
        for (_, t), n in self.bytes.items():
            g = role.get(t, "handshake/open/finish")
            out[g] = out.get(g, 0.0) + n
        return out


# ------------------------------------------------------------------ the run


def fmt_int(n: int | None) -> str:
    return "" if n is None else f"{n:,}"


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else round(a / b, 3)


def fastest(repeats: int, once: Callable[[], Run]) -> Run:
    """The fastest of ``repeats`` runs (each from a fresh receiver); a failed verification
    in any of them stays visible."""
    results = [once() for _ in range(repeats)]
    best = min(results, key=lambda r: r.seconds)
    best.verify = next((r.verify for r in results if r.verify != "ok"), best.verify)
    return best


def run_case(case: Case, rdc: Rdc, localsh: str, work: Path, breakdown: bool, repeats: int,
             log: list[str]) -> dict:
    runs: list[Run] = []
    rdc.server.settle()  # nor should rsync share the machine with it
    for opts in case.rsync_variants:
        runs.append(fastest(repeats, lambda o=opts: rsync_once(case, o, work / "rsync-dst",
                                                               localsh)))
        print(f"  {runs[-1].tool} {runs[-1].variant}: {runs[-1].total:,} B "
              f"{runs[-1].seconds:.2f} s {runs[-1].verify}", flush=True)
    shutil.rmtree(work / "rsync-dst", ignore_errors=True)
    tally = None
    if case.group == "nochange":
        plan = [("re-run", True), ("re-run", False)]
    else:
        plan = [("cold", True), ("srv-warm", True), ("warm", True), ("cold", False)]
    warm_cache = rdc.fresh("warmcache")
    for state, compress in plan:
        runs.append(fastest(repeats, lambda s=state, c=compress: rdc.push(case, s, c,
                                                                         warm_cache)))
        print(f"  rdc {runs[-1].variant} [{state}]: {runs[-1].total:,} B "
              f"{runs[-1].seconds:.2f} s {runs[-1].verify}", flush=True)
    if breakdown:
        tally = FrameTally(rdc.server.port)
        try:
            counted = rdc.push(case, "warm" if case.group != "nochange" else "re-run",
                               True, warm_cache, proxy=tally)
        finally:
            tally.close()
        if counted.verify != "ok":
            log.append(f"{case.name}: the run through the frame tally: {counted.verify}")
    for r in runs:
        if r.verify != "ok":
            log.append(f"{case.name}: {r.tool} {r.variant} [{r.state}]: receiver differs: "
                       f"{r.verify}")

    rsync_runs = [r for r in runs if r.tool == "rsync"]
    best = min(rsync_runs, key=lambda r: (r.total, r.seconds))
    rdc_runs = {(r.variant, r.state): r for r in runs if r.tool == "rdc"}
    headline = "re-run" if case.group == "nochange" else "cold"
    main = rdc_runs[("zstd", headline)]
    plain = rdc_runs[("--no-compress", headline)]
    # With zstd, rdc's bytes vary by a few percent from run to run (how messages batch
    # into frames depends on timing); the index state does not matter.
    rdc_bytes = [r.total for (v, _), r in rdc_runs.items() if v == "zstd"]
    result = {
        "rsync_best": best.variant,
        "byte_ratio": ratio(main.total, best.total),
        "byte_ratio_no_compress": ratio(plain.total, best.total),
        "time_ratio": ratio(main.seconds, best.seconds),
        "bytes": {f"{r.tool} {r.variant}" + (f" [{r.state}]" if r.state not in ("", headline)
                                             else ""): r.total for r in runs},
        "bytes_sent_received": {"rsync_best": [best.sent, best.received],
                                "rdc": [main.sent, main.received],
                                "rdc_no_compress": [plain.sent, plain.received]},
        "literal": {"rsync": best.literal, "rdc": main.literal},
        "seconds": {"rsync_best": round(best.seconds, 3),
                    **{f"rdc {v} [{s}]": round(r.seconds, 3) for (v, s), r in rdc_runs.items()}},
        "rdc_zstd_bytes_range": [min(rdc_bytes), max(rdc_bytes)],
        "cpu_seconds": {"rsync_best": round(best.cpu, 2),
                        **{f"rdc {v} [{s}]": [round(r.cpu, 2), round(r.server_cpu or 0, 2)]
                           for (v, s), r in rdc_runs.items()}},
        "rdc_files_transferred": main.stats.get("files_transferred"),
        "verified": all(r.verify == "ok" for r in runs),
    }
    if case.group == "nochange":
        result["target"] = f"rdc < {NOCHANGE_MAX_BYTES:,} B and time ratio <= 1"
        result["meets_target"] = (main.total < NOCHANGE_MAX_BYTES
                                  and main.seconds <= best.seconds)
    else:
        result["time_ratio_srv_warm"] = ratio(rdc_runs[("zstd", "srv-warm")].seconds,
                                              best.seconds)
        result["time_ratio_warm"] = ratio(rdc_runs[("zstd", "warm")].seconds, best.seconds)
        result["target"] = f"byte ratio <= {TARGETS[case.group]}"
        result["meets_target"] = result["byte_ratio"] <= TARGETS[case.group]
    if tally is not None:
        result["rdc_wire_by_role"] = {k: round(v) for k, v in
                                      sorted(tally.groups().items(), key=lambda kv: -kv[1])}
        result["rdc_wire_by_message"] = {
            f"{d} {t}": [round(n), tally.counts[(d, t)]]
            for (d, t), n in sorted(tally.bytes.items(), key=lambda kv: -kv[1])
        }
        result["rdc_file_payload_bytes"] = tally.payload
        result["rdc_wire_items"] = tally.items
    result["_runs"] = runs
    return result


def print_tables(results: dict[str, dict]) -> None:
    print()
    print(f"{'case':<30} {'tool':<24} {'index':<9} {'sent':>11} {'received':>10} "
          f"{'total':>11} {'literal':>11} {'seconds':>8} {'cpu':>11}  verify")
    for name, res in results.items():
        for r in res["_runs"]:
            label = f"{r.tool} {r.variant}"
            if r.tool == "rsync" and r.variant == res["rsync_best"]:
                label += " *"
            cpu = f"{r.cpu:.2f}" + ("" if r.server_cpu is None else f"+{r.server_cpu:.2f}")
            print(f"{name:<30} {label:<24} {r.state:<9} {r.sent:>11,} {r.received:>10,} "
                  f"{r.total:>11,} {fmt_int(r.literal):>11} {r.seconds:>8.2f} {cpu:>11}  "
                  f"{r.verify}")
    print("(* rsync's best variant: fewest bytes. cpu: CPU seconds of all rsync processes; "
          "of rdc's client + server.\n rdc's bytes with zstd vary by a few percent between "
          "runs: frames batch messages differently.)")
    print()
    print(f"{'case':<30} {'rsync best':<22} {'bytes':>11} {'rdc bytes':>11} {'ratio':>6} "
          f"{'nozstd':>7} {'t cold':>7} {'srvwarm':>8} {'warm':>6}  target")

    def r2(x: float | None) -> str:
        return "" if x is None else f"{x:.2f}"

    for name, res in results.items():
        best = res["bytes"][f"rsync {res['rsync_best']}"]
        rdc_total = res["bytes"]["rdc zstd"]
        verdict = "meets" if res["meets_target"] else "MISSES"
        print(f"{name:<30} {res['rsync_best']:<22} {best:>11,} {rdc_total:>11,} "
              f"{r2(res['byte_ratio']):>6} {r2(res['byte_ratio_no_compress']):>7} "
              f"{r2(res['time_ratio']):>7} {r2(res.get('time_ratio_srv_warm')):>8} "
              f"{r2(res.get('time_ratio_warm')):>6}  {verdict} ({res['target']})")
    print("(ratios rdc / rsync best; bytes = sent + received; time ratios per rdc index "
          "state, see the docstring;\n no change: 't cold' is the re-run)")
    tallied = {n: r for n, r in results.items() if "rdc_wire_by_role" in r}
    if tallied:
        print()
        print("rdc bytes on the wire by role (zstd, one more push through a frame-counting "
              "proxy, warm indexes):")
        for name, res in tallied.items():
            total = sum(res["rdc_wire_by_role"].values()) or 1
            parts = ", ".join(f"{k} {v:,} ({v / total:.0%})"
                              for k, v in res["rdc_wire_by_role"].items())
            print(f"  {name}: {parts}")
            if res["rdc_wire_items"]:
                items = ", ".join(f"{k} {v:,}" for k, v in res["rdc_wire_items"].items())
                print(f"    ({items})")


@contextlib.contextmanager
def workdir(base: str | None, keep: bool) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="rdc-sync-bench-", dir=base))
    try:
        yield path
    finally:
        if keep:
            print(f"kept {path}")
        else:
            shutil.rmtree(path, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, default=Path("/tmp/corpus"),
                    help="built by ../shared/bench/make_corpus.sh (default /tmp/corpus)")
    ap.add_argument("--cases", default=",".join(GROUPS),
                    help=f"comma-separated subset of {','.join(GROUPS)}")
    ap.add_argument("--quick", action="store_true",
                    help="one Django pair, the big file and the no-change case")
    ap.add_argument("--localsh", default=str(Path(__file__).resolve().parents[2] / "shared"
                                             / "bench" / "localsh"),
                    help="rsync's fake remote shell (default ../shared/bench/localsh)")
    ap.add_argument("--work", default="/tmp", help="where the temporary copies go")
    ap.add_argument("--no-breakdown", action="store_true",
                    help="skip the extra rdc push through the frame-counting proxy")
    ap.add_argument("--runs", type=int, default=1,
                    help="repeat every timed run, keep the fastest (default 1)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    groups = [g.strip() for g in args.cases.split(",") if g.strip()]
    if args.quick:
        groups = [g for g in groups if g in ("django", "bigbin", "nochange")]
    unknown = set(groups) - set(GROUPS)
    if unknown:
        ap.error(f"unknown cases {sorted(unknown)}; choose from {','.join(GROUPS)}")
    rdc_bin = shutil.which("rdc", path=f"{Path(sys.executable).parent}{os.pathsep}"
                                       f"{os.environ.get('PATH', '')}")
    if rdc_bin is None or shutil.which("rsync") is None:
        raise SystemExit("needs rdc (pip install -e .) and rsync on PATH")
    if not os.access(args.localsh, os.X_OK):
        raise SystemExit(f"{args.localsh} is not executable (--localsh)")
    rsync_version = subprocess.run(["rsync", "--version"], capture_output=True,
                                   text=True).stdout.splitlines()[0]
    print(f"{rsync_version}; rdc {rdc_bin}; corpus {args.corpus}; rsync -e {args.localsh}; "
          f"fastest of {args.runs} per timed run; load average {os.getloadavg()[0]:.1f}")
    print("Every run starts from a fresh copy (cp -a) of the OLD tree on the receiver; the "
          "sender has the NEW tree.\nrdc index states: cold = the server indexes the OLD "
          "copy and the client the NEW tree inside the timed push (headline);\nsrv-warm = "
          "the server indexed the OLD copy before timing (dry-run pull), client cold; "
          "warm = both indexed\nbefore timing (dry-run push). No change: each tool syncs "
          "twice, the second run is measured.")
    log: list[str] = []
    results: dict[str, dict] = {}
    with workdir(args.work, args.keep) as work:
        cases = build_cases(args.corpus, groups, args.quick, work)
        server = Server(rdc_bin, work)
        server.start()
        try:
            rdc = Rdc(rdc_bin, server, work)
            for case in cases:
                print(f"{case.name}: {case.old} -> {case.new}", flush=True)
                try:
                    results[case.name] = run_case(case, rdc, args.localsh, work,
                                                  not args.no_breakdown, args.runs, log)
                except BenchError as exc:
                    log.append(f"{case.name}: FAILED: {exc}")
                    print(f"  FAILED: {exc}", flush=True)
                    if server.proc is not None and server.proc.poll() is not None:
                        server.start()
        finally:
            server.stop()
    print_tables(results)
    print(f"load average at the end: {os.getloadavg()[0]:.1f} (other work on the machine "
          "slows both tools' timings)")
    for line in log:
        print(f"problem: {line}")
    if not log:
        print("all receivers equal their senders (paths, contents, modes, mtimes)")
    for res in results.values():
        del res["_runs"]
    print(json.dumps({"cases": results, "problems": log, "rsync": rsync_version}))
    sys.exit(1 if log else 0)


if __name__ == "__main__":
    main()
