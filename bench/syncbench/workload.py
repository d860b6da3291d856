"""A replication workload (bench/replication.py): edits, creates, renames and deletes on a
source tree, planned in advance from a seed so that two tools replicate exactly the same
changes, and a checker that times when each change is byte-identical on each replica.

Within one planned run no path is touched twice, so every change can be seen on its own:
its lag is the time from its write on the primary to the moment a replica holds exactly
what it wrote (or no longer holds what it removed).
"""

from __future__ import annotations

import hashlib
import os
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

WEIGHTS = (("edit", 0.5), ("create", 0.2), ("rename", 0.15), ("delete", 0.15))
WORDS = ("replica", "primary", "chunk", "sketch", "signature", "winnow", "merkle", "delta",
         "share", "token", "round", "watch", "lag", "mirror", "version", "conflict")


@dataclass(frozen=True)
class Change:
    kind: str
    path: str
    other: str = ""  # rename: the new path; create: a file whose content it starts from
    seed: int = 0


@dataclass
class Applied:
    """A change as it was made: when, and what each path it touched must hold (a content
    hash, or None for nothing)."""

    change: Change
    at: float
    expect: dict[str, bytes | None]
    seen: dict[int, float] = field(default_factory=dict)  # replica -> when it matched


def files_of(root: Path) -> list[str]:
    out = []
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            if os.path.isfile(path) and not os.path.islink(path):
                out.append(os.path.relpath(path, root))
    return sorted(out)


def plan(root: Path, count: int, seed: int, distinct: bool = True) -> list[Change]:
    """``count`` changes to the tree at ``root`` (as it is now); with ``distinct``, no path
    is touched twice."""
    rng = random.Random(seed)
    present = files_of(root)
    dirs = sorted({os.path.dirname(p) for p in present})
    touched: set[str] = set()
    out: list[Change] = []
    kinds, weights = zip(*WEIGHTS, strict=True)

    def pick() -> str:
        for _ in range(1000):
            path = rng.choice(present)
            if not distinct or path not in touched:
                return path
        raise RuntimeError("the tree is too small for this many distinct changes")

    for n in range(count):
        kind = rng.choices(kinds, weights)[0]
        if kind == "create":
            path = os.path.join(rng.choice(dirs), f"new-{seed}-{n}.txt")
            change = Change("create", path, pick() if rng.random() < 0.5 else "", n)
            present.append(path)
        elif kind == "rename":
            source = pick()
            where = os.path.dirname(source) if rng.random() < 0.7 else rng.choice(dirs)
            stem, ext = os.path.splitext(os.path.basename(source))
            change = Change("rename", source, os.path.join(where, f"{stem}-moved-{n}{ext}"))
            present.remove(source)
            present.append(change.other)
            touched.add(change.other)
        else:
            path = pick()
            change = Change(kind, path, seed=n)
            if kind == "delete":
                present.remove(path)
        touched.add(change.path)
        out.append(change)
    return out


def digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


def apply(root: Path, change: Change) -> Applied:
    """Make ``change`` in the tree at ``root`` (the same bytes wherever it is made)."""
    target = root / change.path
    rng = random.Random(f"{change.kind} {change.path} {change.seed}")
    expect: dict[str, bytes | None]
    if change.kind == "edit":
        data = target.read_bytes()
        lines = data.split(b"\n")
        at = rng.randrange(len(lines) + 1)
        lines.insert(at, f"# edited {change.seed}: {rng.getrandbits(64):x}".encode())
        data = b"\n".join(lines)
        target.write_bytes(data)  # in place, as many editors and programs write
        expect = {change.path: digest(data)}
    elif change.kind == "create":
        if change.other:  # a new file that starts from another (a copy, then edited)
            data = (f"# new file {change.seed}\n".encode() + (root / change.other).read_bytes())
        else:
            words = [rng.choice(WORDS) for _ in range(rng.randint(50, 2000))]
            data = " ".join(words).encode() + b"\n"
        target.write_bytes(data)
        expect = {change.path: digest(data)}
    elif change.kind == "rename":
        data = target.read_bytes()
        os.makedirs(os.path.dirname(root / change.other) or root, exist_ok=True)
        os.rename(target, root / change.other)
        expect = {change.path: None, change.other: digest(data)}
    else:
        os.remove(target)
        expect = {change.path: None}
    return Applied(change, time.monotonic(), expect)


def holds(root: Path, expect: dict[str, bytes | None]) -> bool:
    for path, want in expect.items():
        try:
            data = (root / path).read_bytes()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            if want is not None:
                return False
            continue
        if want is None or digest(data) != want:
            return False
    return True


class Checker:
    """Polls the replicas every ``interval`` seconds for the changes not yet seen there."""

    def __init__(self, replicas: list[Path], interval: float = 0.01) -> None:
        self.replicas = replicas
        self.interval = interval
        self.applied: list[Applied] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def add(self, applied: Applied) -> None:
        with self._lock:
            self.applied.append(applied)

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                todo = [a for a in self.applied if len(a.seen) < len(self.replicas)]
            for applied in todo:
                for i, root in enumerate(self.replicas):
                    if i not in applied.seen and holds(root, applied.expect):
                        applied.seen[i] = time.monotonic()
            self._stop.wait(self.interval)

    def pending(self) -> int:
        with self._lock:
            return sum(len(self.replicas) - len(a.seen) for a in self.applied)

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.pending() and time.monotonic() < deadline:
            time.sleep(0.05)
        return not self.pending()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def lags(self) -> list[float]:
        """Seconds from each change's write to its arrival, per replica (missing: inf)."""
        out = []
        for applied in self.applied:
            for i in range(len(self.replicas)):
                seen = applied.seen.get(i)
                out.append(float("inf") if seen is None else seen - applied.at)
        return out


def run_steady(root: Path, changes: list[Change], rate: float, checker: Checker) -> float:
    """Apply ``changes`` at ``rate`` per second (a steady schedule, not sleeps after each);
    the seconds it took."""
    started = time.monotonic()
    for n, change in enumerate(changes):
        delay = started + n / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        checker.add(apply(root, change))
    return time.monotonic() - started


def content_view(root: Path) -> dict[str, tuple] | None:
    """Every entry below ``root``: files by content hash and mode, directories present
    (rdc's temporaries left out); None if the tree changed under the walk."""
    out: dict[str, tuple] = {}
    try:
        for dirpath, dirnames, names in os.walk(root):
            for name in dirnames:
                out[os.path.relpath(os.path.join(dirpath, name), root)] = ("d",)
            for name in names:
                if name.startswith(".rdc-tmp-"):
                    continue
                path = os.path.join(dirpath, name)
                st = os.lstat(path)
                if os.path.islink(path):
                    out[os.path.relpath(path, root)] = ("l", os.readlink(path))
                else:
                    with open(path, "rb") as f:
                        out[os.path.relpath(path, root)] = (
                            "f", st.st_mode & 0o7777, digest(f.read()))
    except FileNotFoundError:
        return None
    return out
