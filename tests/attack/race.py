"""The symlink races of issue 10: a directory of the share swapped for a symlink to the
outside while the server opens it (item 1) or scans it (item 5).

`open_race`: with the protocol alone, one connection (read-write token) keeps replacing a
directory ``d`` of the share, and a fresh ``d-N`` each round, by a symlink to the outside
(``ops`` rm + link) and back (rm + mkdir); other connections keep opening it and, once
opened, list it, get files (the secret's name among them) and write (an offer, a mkdir).
Every listing, every received byte and the canary tree are checked: nothing outside may be
listed, read, created or changed.

`scan_race`: the real clients while a directory is swapped on disk: the server's side (a
pull while the share's ``sub`` is swapped) and the client's (a push while the local
``sub`` is). Each run must end cleanly, the entry skipped: no traceback, no internal
error, and the outside never listed or sent.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rdc.content.signature import signature_of_bytes
from tests.attack.world import World, remove
from tests.e2e_support import RDC, RUN_SECONDS, TOKEN, RawClient, snapshot

# What escaped: the outside listed, an outside file offered, the secret's bytes received,
# the outside changed (written), the attack itself stopped (cannot vouch for the rest).
KINDS = ("listed", "offered", "read", "written", "stopped")


@dataclass
class RaceReport:
    seconds: float = 0.0
    attempts: int = 0  # opens sent
    opened: int = 0  # opens the server accepted
    swaps: int = 0  # directory <-> symlink replacements made
    escaped: int = 0  # attempts in which something escaped
    escapes: list[str] = field(default_factory=list)  # "KIND: what", KIND in KINDS

    def line(self) -> str:
        kinds = ", ".join(f"{k} {n}" for k in KINDS if (n := sum(
            e.startswith(k + ":") for e in self.escapes)))
        return (f"{self.attempts} attempts ({self.opened} opened, {self.swaps} swaps) in "
                f"{self.seconds:.1f} s: {self.escaped} escaped"
                + (f" ({kinds})" if kinds else ""))


def _small_offer(path: bytes, data: bytes) -> dict[str, Any]:
    signature = signature_of_bytes(data)
    return {"path": path, "size": len(data), "root": signature.root,
            "depth": len(signature.tree.levels), "sketch": signature.sketch, "mode": 0o644,
            "mtime": 1_700_000_000_000_000_000, "data": data}


class Attacker(threading.Thread):
    """Swaps share paths between a directory (with a file in it) and a symlink to the
    outside, with ``ops`` over one connection, until stopped."""

    def __init__(self, world: World) -> None:
        super().__init__(daemon=True)
        self.world = world
        self.current = b"d"
        self.swaps = 0
        self.stop = threading.Event()
        self.error = ""

    def run(self) -> None:
        try:
            client = RawClient(self.world.port, timeout=10)
            client.hello()
            client.open("s", write=True)
            outside = os.fsencode(self.world.outside)
            for n in range(1_000_000):
                if self.stop.is_set():
                    break
                name = b"d" if n % 2 == 0 else b"d-%d" % n
                self._ops(client, [["rm", name, None, None], ["mkdir", name, 0o755, None]])
                conversation = client.request("offer", **_small_offer(name + b"/inside.txt",
                                                                      b"inside d\n"))
                client.answer(conversation)
                self.current = name
                for _ in range(3):  # a few flips per name: some opens land on each state
                    self._ops(client, [["rm", name, None, None], ["link", name, outside, None]])
                    self._ops(client, [["rm", name, None, None],
                                       ["mkdir", name, 0o755, None]])
            client.close()
        except Exception as exc:  # the report says the attack stopped, and why
            self.error = f"{type(exc).__name__}: {exc}"

    def _ops(self, client: RawClient, ops: list) -> None:
        conversation = client.request("ops", ops=ops)
        client.answer(conversation)
        self.swaps += 1


class Victim(threading.Thread):
    """Opens the attacker's current path again and again; what each opened conversation
    sees is checked."""

    def __init__(self, world: World, attacker: Attacker, report: RaceReport,
                 lock: threading.Lock, stop: threading.Event, until_first: bool) -> None:
        super().__init__(daemon=True)
        self.world = world
        self.attacker = attacker
        self.report = report
        self.lock = lock
        self.stop = stop
        self.until_first = until_first
        self.names = world.canary.leaks()[1:]
        self.escaped = False
        self.token = world.canary.token

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            try:
                self.attempt(n)
            except (OSError, AssertionError):
                continue  # the server cut this connection: not an escape in itself

    def escape(self, kind: str, what: str) -> None:
        self.escaped = True
        with self.lock:
            self.report.escapes.append(f"{kind}: {what}")
        if self.until_first:
            self.stop.set()

    def attempt(self, n: int) -> None:
        self.escaped = False
        try:
            self._attempt(n)
        finally:
            if self.escaped:
                with self.lock:
                    self.report.escaped += 1

    def _attempt(self, n: int) -> None:
        name = self.attacker.current
        client = RawClient(self.world.port, timeout=10)
        try:
            client.hello()
            with self.lock:
                self.report.attempts += 1
            conversation = client.request("open", share="s", path=name, write=True,
                                          create=False, excludes=[])
            if client.answer(conversation)[-1].get("t") != "opened":
                return
            with self.lock:
                self.report.opened += 1
            listed = self.listing(client)
            if any(leak in listed for leak in self.names):
                self.escape("listed", f"opened {name!r}, listed {sorted(listed)[:8]}")
            for path in [*sorted(listed)[:2], self.names[0]]:
                self.get(client, name, path)
            conversation = client.request("offer", **_small_offer(b"planted-%d" % n,
                                                                  b"planted\n"))
            client.answer(conversation)
            conversation = client.request("ops", ops=[["mkdir", b"made-%d" % n, 0o755, None]])
            client.answer(conversation)
        finally:
            client.close()

    def listing(self, client: RawClient) -> set[bytes]:
        conversation = client.request("list", paths=[b""], hb=8)
        names: set[bytes] = set()
        for message in client.answer(conversation):
            for item in message.get("dirs") or []:
                names |= {entry[0] for entry in item[1] or []}
        return names

    def get(self, client: RawClient, name: bytes, path: bytes) -> None:
        conversation = client.request("get", path=path)
        answer = client.answer(conversation)[-1]
        if answer.get("t") != "offer":
            return
        if path in self.names:
            self.escape("offered", f"opened {name!r}, the server offered {path!r}")
        data = answer.get("data") or b""
        if "data" not in answer:  # not inline: ask for all of it
            client.send({"t": "want", "id": conversation, "k": "whole"})
            ended = False
            while not ended and (batch := client.receive()) is not None:
                for message in batch:
                    if message.get("id") == conversation:
                        data += b"".join(message.get("d") or [])
                        ended = ended or message.get("end") or message.get("t") == "error"
        client.send({"t": "done", "id": conversation, "ok": True, "how": "whole"})
        if self.token in data:
            self.escape("read", f"opened {name!r}, the secret's bytes arrived as {path!r}")


def open_race(world: World, seconds: float, victims: int = 2,
              until_first: bool = True) -> RaceReport:
    """Run the open race for ``seconds`` (or until the first escape); the canary tree is
    checked every 20 attempts and at the end."""
    report = RaceReport()
    baseline = world.outside_now()
    lock = threading.Lock()
    stop = threading.Event()
    attacker = Attacker(world)
    attacker.start()
    team = [Victim(world, attacker, report, lock, stop, until_first) for _ in range(victims)]
    start = time.monotonic()
    for victim in team:
        victim.start()
    checked = 0
    try:
        while time.monotonic() - start < seconds and attacker.is_alive():
            if until_first and report.escapes:
                break
            time.sleep(0.05)
            if report.attempts - checked >= 20:
                checked = report.attempts
                _canary(world, baseline, report, until_first)
    finally:
        stop.set()
        attacker.stop.set()
        for victim in team:
            victim.join(30)
        attacker.join(30)
    _canary(world, baseline, report, True)
    report.seconds = time.monotonic() - start
    report.swaps = attacker.swaps
    if attacker.error:
        report.escapes.append(f"stopped: the attacker stopped: {attacker.error}")
    return report


def _canary(world: World, baseline: dict, report: RaceReport, final: bool) -> None:
    now = world.outside_now()
    if now == baseline:
        return
    changed = sorted(set(now) ^ set(baseline) | {k for k in now if baseline.get(k) != now[k]})
    report.escapes.append(f"written: {[c.decode(errors='replace') for c in changed][:8]}")
    if not final:
        world.reset_canary()


# ---------------------------------------------------------------- the scan race


@dataclass
class ScanReport:
    side: str
    runs: int = 0
    clean: int = 0
    swaps: int = 0
    failures: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (f"{self.side}: {self.runs} runs during {self.swaps} swaps, {self.clean} clean, "
                f"{len(self.failures)} failed")


class Swapper(threading.Thread):
    """Replaces directory ``path`` by a symlink to ``target`` and back, on the local disk,
    as fast as it can, until stopped."""

    def __init__(self, path: Path, target: Path) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.target = target
        self.aside = path.with_name(path.name + ".aside")
        self.swaps = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            with contextlib.suppress(OSError):
                os.rename(self.path, self.aside)
                os.symlink(self.target, self.path)
                time.sleep(0.001)
                os.unlink(self.path)
                os.rename(self.aside, self.path)
                self.swaps += 1
            time.sleep(0.001)

    def finish(self) -> None:
        self.stop.set()
        self.join(10)
        if os.path.islink(self.path):
            os.unlink(self.path)
        if os.path.isdir(self.aside) and not os.path.lexists(self.path):
            os.rename(self.aside, self.path)


def _fill(directory: Path, files: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        (directory / f"f{i:03}.txt").write_bytes(b"scanned while swapped %d\n" % i * 20)


def scan_race(world: World, side: str, seconds: float) -> ScanReport:
    """``side`` "server": pulls of the share while ``share/sub`` is swapped; "client":
    pushes of a local tree while its ``sub`` is swapped. A run is clean if it exits 0 (or
    3, some entries skipped), prints no traceback, the server logs no traceback or
    internal error, and nothing of the outside arrives."""
    report = ScanReport(side)
    local = world.tmp / "local" / f"scan-{side}"
    if side == "server":
        swapped = world.share / "sub"
    else:
        swapped = local / "sub"
        shutil.copytree(world.share / "docs", local / "docs")
    _fill(swapped, 300)
    assert world.daemon is not None
    log_start = world.daemon.log_path.stat().st_size
    swapper = Swapper(swapped, world.outside)
    swapper.start()
    start = time.monotonic()
    try:
        while time.monotonic() - start < seconds:
            report.runs += 1
            if side == "server":
                target = world.tmp / "local" / "scan-pulled"
                args = ["pull", world.url(), str(target)]
            else:
                target = world.share / "pushed"
                args = ["push", str(local), world.url("pushed")]
            done = subprocess.run([*RDC, *args, "--token-file", str(world.tmp / "rw-token")],
                                  stdin=subprocess.DEVNULL, capture_output=True,
                                  env=world.env, timeout=RUN_SECONDS)
            trouble = _trouble(world, done, target, log_start)
            log_start = world.daemon.log_path.stat().st_size
            if trouble:
                report.failures.append(f"run {report.runs}: {trouble}")
            else:
                report.clean += 1
    finally:
        swapper.finish()
        report.swaps = swapper.swaps
        for leftover in (world.share / "sub", world.share / "sub.aside",
                         world.share / "pushed"):
            remove(leftover)
    return report


def _trouble(world: World, done: subprocess.CompletedProcess[bytes], target: Path,
             log_start: int) -> str:
    stderr = done.stderr.decode(errors="replace")
    assert world.daemon is not None
    with open(world.daemon.log_path, "rb") as f:
        f.seek(log_start)
        log = f.read().decode(errors="replace")
    problems = []
    if done.returncode not in (0, 3):
        problems.append(f"exit {done.returncode}: {stderr.strip()[-300:]}")
    if "Traceback" in stderr:
        problems.append("a traceback from rdc: " + stderr.strip()[-300:])
    if "Traceback" in log or "internal error" in log:
        lines = [x for x in log.splitlines() if "internal error" in x or "Error" in x]
        problems.append("the server: " + " | ".join(lines[-3:])[:300])
    if target.exists():
        seen = snapshot(target)
        names = {os.path.basename(rel) for rel in seen}
        for leak in world.canary.leaks()[1:]:
            if leak in names:
                problems.append(f"the outside arrived: {leak!r}")
        for rel, node in seen.items():
            if node.kind == "f":
                with open(os.path.join(os.fsencode(target), rel), "rb") as f:
                    if world.canary.token in f.read():
                        problems.append(f"the secret arrived in {rel!r}")
    return "; ".join(problems)


__all__ = ["TOKEN", "open_race", "scan_race"]
