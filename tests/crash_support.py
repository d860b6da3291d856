"""Transfers killed at random points, checked: the loop behind ``bench/crash.py`` (hundreds
of transfers) and ``tests/test_e2e_crash.py`` (a few).

Two versions of a tree, A and B (B edits, deletes, adds and renames some of A's entries;
small files that go in batches, mid-sized ones that go one by one, a large one, links),
are kept in read-only shares and local directories. Each transfer brings a target holding
one version to the other, pushing (local directory to a writable share) or pulling (a
share to a local directory), both with ``--delete``; after a random delay the client or
the server is killed with SIGKILL. Then every path of the target must be its A version,
its B version or absent where a version lacks it, with nothing else there but rdc's
temporaries (never a mix, never a half-written file under a real name); and the same
transfer run again, with nothing killed, must end in step (exit 0, trees equal). A
server killed is started again on the same shares and state directory.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from .e2e_support import (
    E2E,
    RUN_SECONDS,
    TEMP,
    Server,
    assert_same_tree,
    file_hash,
    random_file,
    stamp_times,
    temporaries,
    wait_until_stale,
    write,
)

MARKER = b".rdc-folder"


def version_a(root: Path, big: int) -> None:
    for d in ("docs/old", "src/pkg", "data"):
        (root / d).mkdir(parents=True)
    for n in range(30):
        write(root / "src" / "pkg" / f"m{n:02}.py", f"# module {n}\n".encode() * (20 + n * 7))
    for n in range(6):
        write(root / "docs" / "old" / f"page{n}.txt", f"page {n}\n".encode() * 400)
    for n in range(3):
        random_file(root / "data" / f"mid{n}.bin", 150_000 + 70_000 * n, seed=n + 1)
    random_file(root / "data" / "big.bin", big, seed=10)
    os.symlink("src/pkg/m00.py", root / "main.py")
    write(root / "README", b"version A\n")
    stamp_times(root, seed=1)


def version_b(a: Path, root: Path, big: int) -> None:
    """A with edits, deletions, additions and a renamed directory."""
    shutil.copytree(a, root, symlinks=True)
    for n in range(0, 30, 3):
        write(root / "src" / "pkg" / f"m{n:02}.py", f"# module {n}, edited in B\n".encode() * 30)
    for n in range(1, 30, 7):
        os.unlink(root / "src" / "pkg" / f"m{n:02}.py")
    for n in range(5):
        write(root / "src" / "pkg" / f"new{n}.py", f"# new in B {n}\n".encode() * 50)
    (root / "docs" / "old").rename(root / "docs" / "new")
    random_file(root / "data" / "mid1.bin", 260_000, seed=21)
    random_file(root / "data" / "big.bin", big, seed=20)  # nothing in common with A's
    os.unlink(root / "main.py")
    os.symlink("src/pkg/m03.py", root / "main.py")
    write(root / "README", b"version B\n")
    stamp_times(root, seed=2)


def file_versions(a: Path, b: Path) -> dict[bytes, set[bytes | None]]:
    """Per path of either version, what a target may hold there: A's content, B's, or
    nothing where one version has nothing (links: their targets; directories: "d")."""
    def entries(root: Path) -> dict[bytes, bytes]:
        out = {}
        base = os.fsencode(root)
        for dirpath, dirnames, filenames in os.walk(base):
            for name in dirnames + filenames:
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, base)
                if os.path.islink(path):
                    out[rel] = b"l:" + os.readlink(path)
                elif os.path.isdir(path):
                    out[rel] = b"d"
                else:
                    out[rel] = file_hash(path)
        return out

    ea, eb = entries(a), entries(b)
    return {rel: {ea.get(rel), eb.get(rel)} for rel in set(ea) | set(eb)}


def violations(target: Path, allowed: dict[bytes, set[bytes | None]]) -> list[str]:
    """What in ``target`` is neither its A nor its B version (nor rdc's own)."""
    found: list[str] = []
    base = os.fsencode(target)
    seen = set()
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = [d for d in dirnames if not TEMP.match(d)]  # a directory going away
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, base)
            if TEMP.match(name) or rel == MARKER:
                continue
            seen.add(rel)
            if os.path.islink(path):
                have = b"l:" + os.readlink(path)
            elif os.path.isdir(path):
                have = b"d"
            else:
                have = file_hash(path)
            if have not in allowed.get(rel, set()):
                found.append(f"{rel!r} is neither its old nor its new version")
    for rel, versions in allowed.items():
        if rel not in seen and None not in versions:
            found.append(f"{rel!r} is missing, though both versions have it")
    return found


@dataclass
class Tally:
    """What the loop did, per (verb, victim)."""

    runs: Counter = field(default_factory=Counter)
    mid_transfer: Counter = field(default_factory=Counter)  # killed while it ran
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def total(self) -> int:
        return sum(self.runs.values())


class CrashLoop:
    """The trees, the daemon, and one killed transfer at a time (`step`)."""

    def __init__(self, e2e: E2E, rng: random.Random, big: int) -> None:
        self.e2e = e2e
        self.rng = rng
        tmp = e2e.tmp
        self.local = {"A": tmp / "localA", "B": tmp / "localB"}
        version_a(self.local["A"], big)
        version_b(self.local["A"], self.local["B"], big)
        self.allowed = file_versions(self.local["A"], self.local["B"])
        self.shares = {"A": tmp / "shareA", "B": tmp / "shareB", "w": tmp / "shareW"}
        for v in "AB":
            shutil.copytree(self.local[v], self.shares[v], symlinks=True)
        self.shares["w"].mkdir()
        self.pulled = tmp / "pulled"
        self.server = self._serve()
        self.held = {"w": None, "pulled": None}  # the version each target holds now
        self.took = {"push": 0.5, "pull": 0.5}  # seconds a whole transfer takes, as seen

    def _serve(self) -> Server:
        return self.e2e.serve({"w": self.shares["w"]},
                              {"A": self.shares["A"], "B": self.shares["B"]})

    def _command(self, verb: str, version: str) -> tuple[str, str, Path, Path]:
        if verb == "push":
            return (str(self.local[version]), self.server.url("w"), self.local[version],
                    self.shares["w"])
        return self.server.url(version), str(self.pulled), self.shares[version], self.pulled

    def settle(self, verb: str) -> None:
        """Bring the target of ``verb`` to a version, unkilled (the first time, and after
        a run that found a problem)."""
        target = "w" if verb == "push" else "pulled"
        version = self.rng.choice("AB")
        a, b, source, path = self._command(verb, version)
        started = time.monotonic()
        self._run(verb, a, b).ok()
        self.took[verb] = max(0.05, time.monotonic() - started)
        assert_same_tree(source, path)
        self.held[target] = version

    def _run(self, verb: str, a: str, b: str):
        return self.e2e._transfer(verb, a, b, ("--delete",))

    def step(self, tally: Tally) -> None:
        """One transfer to the other version, killed at a random point, checked, and run
        again to its end."""
        verb = self.rng.choice(("push", "pull"))
        target = "w" if verb == "push" else "pulled"
        if self.held[target] is None:
            self.settle(verb)
        version = "B" if self.held[target] == "A" else "A"
        victim = self.rng.choice(("client", "server"))
        a, b, source, path = self._command(verb, version)
        process = self.e2e.start(verb, a, b, "--delete")
        time.sleep(self.rng.uniform(0, 1.3 * self.took[verb]))
        key = (verb, victim)
        tally.runs[key] += 1
        if process.poll() is None:
            tally.mid_transfer[key] += 1
        if victim == "client":
            process.kill()
        else:
            self.server.kill()
        try:
            process.communicate(timeout=RUN_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            tally.problems.append(f"{verb}: the client hung after the server was killed")
        if victim == "server":
            self.server = self._serve()
            a, b, source, path = self._command(verb, version)
        where = f"#{tally.total} {verb}, {victim} killed"
        tally.problems += [f"{where}: {v}" for v in violations(path, self.allowed)]
        started = time.monotonic()
        again = self._run(verb, a, b)
        self.took[verb] = 0.7 * self.took[verb] + 0.3 * (time.monotonic() - started)
        if again.returncode != 0 or "Traceback" in again.stderr:
            tally.problems.append(f"{where}: the next run did not converge: {again}")
            self.held[target] = None
            return
        try:
            assert_same_tree(source, path, skip=_temporary)
        except AssertionError as exc:
            tally.problems.append(f"{where}: the next run left the trees apart: {exc}")
            self.held[target] = None
            return
        self.held[target] = version

    def finish(self, tally: Tally) -> None:
        """Once the killed runs' temporaries are stale, one more run to each target: none
        may be left (a partial file only until its path is written again)."""
        for verb, target in (("push", "w"), ("pull", "pulled")):
            version = self.held[target]
            if version is None:
                continue
            a, b, _, path = self._command(verb, version)
            wait_until_stale(path)
            self._run(verb, a, b).ok()
            left = temporaries(path)
            if left:
                tally.problems.append(f"{verb}: temporaries left at the end: {left}")

    def close(self) -> None:
        if self.server.running:
            self.server.stop(signal.SIGTERM)


def _temporary(rel: bytes) -> bool:
    return TEMP.match(rel.rpartition(b"/")[2]) is not None


def run(e2e: E2E, transfers: int, seconds: float, seed: int, big: int,
        at_least: int = 1) -> Tally:
    """Up to ``transfers`` killed transfers within about ``seconds``; past that time, more
    until there are ``at_least`` of them and one was killed while it ran (a slow machine
    cuts the count, not the coverage)."""
    tally = Tally()
    started = time.monotonic()
    loop = CrashLoop(e2e, random.Random(seed), big)

    def more() -> bool:
        if tally.total >= transfers:
            return False
        return (time.monotonic() - started < seconds or tally.total < at_least
                or not tally.mid_transfer)

    try:
        while more():
            loop.step(tally)
        loop.finish(tally)
    finally:
        tally.seconds = time.monotonic() - started
        loop.close()
    return tally
