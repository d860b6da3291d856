"""The world an attack runs in: a real ``rdc serve`` on 127.0.0.1, a share with realistic
content, a read-only share, and outside them a canary tree that must never change.

Layout under one temporary directory::

    share/     share ``s`` (read-write): text, the repo's own sources, binaries, links,
               a non-UTF-8 name; ``evil`` and ``evil-secret`` are links out of it, and
               ``linked.txt`` is a hard link to ``outside/canary-linked-*``
    ro/        share ``r`` (read-only): must never change
    outside/   the canary: a secret file (its content and the canary names must never be
               in anything the server sends), files whose content, mode and mtime must
               never change, a directory in which nothing may be created
    template/  what ``share/`` is reset to between fuzz batches
    state/, cache/, local/, *.log: the server's and the clients' own

Tokens: `TOKEN` may do everything, `RO_TOKEN` reads ``s`` and ``r`` only.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import random
import re
import secrets
import shutil
import signal
import stat
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.e2e_support import (
    LISTENING,
    RDC,
    START_SECONDS,
    STOP_SECONDS,
    TOKEN,
    Node,
    command_env,
    snapshot,
)

RO_TOKEN = "fuzz-read-only-token-0123456789"
OWN = {"share", "state", "cache", "local", "template", "results"}  # not canary
# Sources of rdc itself as realistic text: the share's src/rdc/NAME, copied from rdc/PATH.
SOURCES = {"paths.py": "local/paths.py", "fs.py": "local/fs.py",
           "snapshot.py": "local/snapshot.py", "connection.py": "wire/connection.py",
           "descent.py": "transfer/descent.py", "tree.py": "content/tree.py",
           "ignore.py": "local/ignore.py", "errors.py": "errors.py"}
FUTURE = 10_413_792_000  # 2300-01-01, in seconds
REPO = Path(__file__).resolve().parents[2]


@dataclass
class Canary:
    """Names and contents outside the shares."""

    tag: str
    token: bytes  # the secret file's repeated content unit

    @property
    def secret(self) -> str:
        return f"canary-secret-{self.tag}.txt"

    @property
    def keep(self) -> str:
        return f"canary-keep-{self.tag}.txt"

    @property
    def linked(self) -> str:
        return f"canary-linked-{self.tag}.txt"

    @property
    def alias(self) -> str:
        return f"canary-alias-{self.tag}"

    @property
    def empty(self) -> str:
        return f"canary-empty-{self.tag}"

    def leaks(self) -> list[bytes]:
        """Byte strings that no server message may carry as data (the alias is only ever a
        link target, which listings carry legitimately)."""
        return [self.token, *(n.encode() for n in (self.secret, self.keep, self.linked,
                                                  self.empty))]


@dataclass
class Daemon:
    """One ``rdc serve`` process; its log is appended to ``log_path``."""

    process: subprocess.Popen[bytes]
    log_path: Path
    port: int

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> int | None:
        if self.running:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait(STOP_SECONDS)


@dataclass
class World:
    tmp: Path
    scale: float = 1.0  # binary sizes (the pure-Python run uses less)
    canary: Canary = field(default_factory=lambda: Canary(
        secrets.token_hex(6), f"SECRET-{secrets.token_hex(12)}\n".encode()))
    daemon: Daemon | None = None
    env: dict[str, str] = field(default_factory=dict)
    log_checked: int = 0  # bytes of the server's log already checked (by an earlier fuzzer)

    @property
    def share(self) -> Path:
        return self.tmp / "share"

    @property
    def ro(self) -> Path:
        return self.tmp / "ro"

    @property
    def outside(self) -> Path:
        return self.tmp / "outside"

    @property
    def template(self) -> Path:
        return self.tmp / "template"

    @property
    def port(self) -> int:
        assert self.daemon is not None
        return self.daemon.port

    def url(self, path: str = "", share: str = "s", port: int | None = None) -> str:
        return f"rdc://127.0.0.1:{port or self.port}/{share}" + (f"/{path}" if path else "")

    # ------------------------------------------------------------ building

    def build(self) -> None:
        self.env = command_env(self.tmp)
        (self.tmp / "tokens").write_text(f"{TOKEN}\n{RO_TOKEN} s:ro r\n")
        (self.tmp / "rw-token").write_text(f"{TOKEN}\n")
        (self.tmp / "ro-token").write_text(f"{RO_TOKEN}\n")
        self.reset_canary()
        self.share.mkdir()
        fill_share(self.share, self, random.Random(1))
        self.ro.mkdir()
        (self.ro / "notes.txt").write_bytes(b"read-only notes\n" * 20)
        (self.ro / "sub").mkdir()
        (self.ro / "sub" / "data.bin").write_bytes(random.Random(2).randbytes(5000))
        self.link_hard()

    def reset_canary(self) -> None:
        """(Re)make the canary tree exactly as it was built, and link it into the share."""
        for _ in range(10):  # an escaping server may be writing there meanwhile
            with contextlib.suppress(OSError):
                remove(self.outside)
                self.outside.mkdir()
                break
        else:
            raise RuntimeError(f"cannot reset the canary tree {self.outside}")
        c = self.canary
        write(self.outside / c.secret, c.token * 40, 0o600, 1_600_000_000)
        write(self.outside / c.keep, b"keep me as I am\n" * 30, 0o644, 1_600_000_001)
        write(self.outside / c.linked, b"hard-linked from the share\n" * 10, 0o640,
              1_600_000_002)
        os.symlink(c.secret, self.outside / c.alias)
        (self.outside / c.empty).mkdir(mode=0o755)
        os.utime(self.outside / c.empty, ns=(1_600_000_003 * 10**9,) * 2)
        os.utime(self.outside, ns=(1_600_000_004 * 10**9,) * 2)
        if self.share.exists():
            self.link_hard()

    def link_hard(self) -> None:
        """``share/linked.txt`` as a hard link to the canary file outside."""
        here, there = self.share / "linked.txt", self.outside / self.canary.linked
        with contextlib.suppress(FileNotFoundError):
            if os.path.samestat(os.lstat(here), os.lstat(there)):
                return
            remove(here)
        os.link(there, here)

    def outside_now(self) -> dict[bytes, Node]:
        """Everything that is not the share or the harness's own: the canary tree, the
        read-only share, and whatever else appeared next to them."""
        return snapshot(self.tmp, lambda rel: rel.split(b"/")[0].decode(errors="replace")
                        in OWN or rel.endswith(b".log") or rel.startswith(b"stats-"))

    def save_template(self) -> None:
        """The share as it is now becomes what `reset_share` restores."""
        if self.template.exists():
            shutil.rmtree(self.template)
        shutil.copytree(self.share, self.template, symlinks=True)

    def reset_share(self) -> int:
        """Make the share the template again, in place (directories that are still right
        keep their inodes); the number of entries fixed."""
        fixed = mirror(self.template, self.share, skip={b"linked.txt"})
        self.link_hard()
        return fixed

    # ------------------------------------------------------------ the daemon

    def start(self, *extra: str) -> Daemon:
        log_path = self.tmp / "serve.log"
        args = [*RDC, "serve", "--listen", "127.0.0.1:0", "--share", f"s={self.share}",
                "--share-ro", f"r={self.ro}", "--token-file", str(self.tmp / "tokens"),
                "--state-dir", str(self.tmp / "state"), *extra]
        with open(log_path, "ab") as log:  # the child keeps its own descriptor
            start = log.tell()
            process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log,
                                       stderr=log, env=self.env, preexec_fn=_die_with_parent)
        deadline = time.monotonic() + START_SECONDS
        while True:
            with open(log_path, "rb") as f:
                f.seek(start)
                found = LISTENING.search(f.read().decode(errors="replace"))
            if found:
                break
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(f"rdc serve did not start:\n{log_path.read_text()[-4000:]}")
            time.sleep(0.02)
        self.daemon = Daemon(process, log_path, int(found.group(2)))
        return self.daemon

    def stop(self) -> None:
        if self.daemon is not None:
            self.daemon.stop()


def _die_with_parent() -> None:
    """In the daemon, before exec: SIGTERM when the harness dies, however it dies
    (PR_SET_PDEATHSIG), so that no server outlives a killed fuzz run."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)


def write(path: Path, data: bytes, mode: int, mtime_s: int) -> None:
    path.write_bytes(data)
    os.chmod(path, mode)
    os.utime(path, ns=(mtime_s * 10**9 + 123_456_789,) * 2)


def fill_share(share: Path, world: World, rng: random.Random) -> None:
    """Realistic content: prose, the repo's own sources, binaries that chunk into several
    leaves (random, zeros), modes other than 0644, links in and out, a non-UTF-8 name, a
    time after 2262."""
    words = ("sync delta chunk tree root sketch seed share index file leaf node mode time "
             "the a of to and in is for on with").split()
    (share / "docs").mkdir()
    for i in range(10):
        text = " ".join(rng.choice(words) for _ in range(rng.randrange(20, 900)))
        (share / "docs" / f"note-{i:02}.md").write_text(f"# Note {i}\n\n{text}\n")
    (share / "src" / "rdc").mkdir(parents=True)
    for name, source in SOURCES.items():
        shutil.copyfile(REPO / "rdc" / source, share / "src" / "rdc" / name)
    (share / "data").mkdir()
    (share / "data" / "blob.bin").write_bytes(rng.randbytes(int(320_000 * world.scale)))
    (share / "data" / "zeros.bin").write_bytes(bytes(int(40_000 * world.scale)))
    (share / "data" / "tiny.bin").write_bytes(rng.randbytes(100))
    (share / "empty").mkdir()
    write(share / "private.txt", b"private\n", 0o600, 1_500_000_000)
    write(share / "run.sh", b"#!/bin/sh\necho hi\n", 0o755, 1_500_000_001)
    # Dated 2300 (as ``touch -d 2300-01-01`` makes it): past what 64-bit nanoseconds hold.
    write(share / "future.txt", b"from the future\n", 0o644, FUTURE)
    (share / os.fsdecode(b"caf\xe9.txt")).write_bytes(b"latin-1 name\n")
    os.symlink("docs/note-00.md", share / "link")
    os.symlink(world.outside, share / "evil")
    os.symlink(world.outside / world.canary.alias, share / "evil-secret")


def make_deep(directory: Path, levels: int) -> None:
    """Directories ``a/a/...`` ``levels`` deep in ``directory``, made from descriptors (the
    path grows past PATH_MAX); `remove` takes them away."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(levels):
            os.mkdir("a", dir_fd=fd)
            deeper = os.open("a", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = deeper
    finally:
        os.close(fd)


def remove(path: Path | bytes | str) -> None:
    """Remove whatever is at ``path``: a directory with everything below it, however deep
    (the fuzzer makes paths longer than PATH_MAX); links are removed, not followed."""
    parent, name = os.path.split(os.fsencode(path))
    dfd = os.open(parent or b".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        remove_at(dfd, name)
    finally:
        os.close(dfd)


def remove_at(dfd: int, name: bytes) -> None:
    """Remove ``name`` in directory ``dfd``. Subdirectories are first moved up into
    ``dfd`` under scratch names, so that at most two descriptors are open and no path is
    ever longer than two names."""
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=dfd)
        return
    scratch = itertools.count()
    pending = [name]
    while pending:
        current = pending.pop()
        fd = os.open(current, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dfd)
        try:
            with os.scandir(fd) as entries:
                children = [(e.name, e.is_dir(follow_symlinks=False)) for e in entries]
            for child, is_dir in children:
                if is_dir:
                    moved = f".attack-rm-{os.getpid()}-{next(scratch)}"
                    os.rename(child, moved, src_dir_fd=fd, dst_dir_fd=dfd)
                    pending.append(moved.encode())
                else:
                    os.unlink(child, dir_fd=fd)
        finally:
            os.close(fd)
        os.rmdir(current, dir_fd=dfd)


def mirror(src: Path, dst: Path, skip: set[bytes]) -> int:
    """Make ``dst`` hold what ``src`` holds (kinds, contents, modes, mtimes, link
    targets), changing only what differs and never following a link in ``dst``; paths in
    ``skip`` are left alone. The number of entries changed."""
    want = {r: n for r, n in snapshot(src).items() if r not in skip}
    have = {r: n for r, n in snapshot(dst).items() if r not in skip}
    s, d = os.fsencode(src), os.fsencode(dst)
    changed = 0
    wrong = {r for r in have if r not in want or want[r].kind != have[r].kind}
    for rel in sorted(wrong):
        if os.path.dirname(rel) not in wrong:  # the top of what goes (a short path)
            remove(os.path.join(d, rel))
            changed += 1
    for rel in sorted(want):
        node, old = want[rel], have.get(rel)
        if old == node and os.path.lexists(os.path.join(d, rel)):
            continue
        changed += 1
        source, target = os.path.join(s, rel), os.path.join(d, rel)
        if node.kind == "d":
            if not os.path.lexists(target):
                os.mkdir(target)
        elif node.kind == "l":
            if os.path.lexists(target):
                os.unlink(target)
            os.symlink(os.readlink(source), target)
        elif old is None or not os.path.lexists(target) or old.digest != node.digest:
            temp = target + b".mirror"
            shutil.copyfile(source, temp, follow_symlinks=False)
            os.replace(temp, target)
    for rel in sorted(want, key=len, reverse=True):  # times last: children move them
        node, target = want[rel], os.path.join(d, rel)
        if node.kind != "l":
            os.chmod(target, node.mode)
        os.utime(target, ns=(node.mtime_ns, node.mtime_ns), follow_symlinks=False)
    top = os.stat(src)
    os.chmod(dst, stat.S_IMODE(top.st_mode))
    os.utime(dst, ns=(top.st_mtime_ns, top.st_mtime_ns))
    return changed


# ---------------------------------------------------------------- the daemon from outside


def memory_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of ``pid`` in KiB; (0, 0) if it is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0, 0
    rss = re.search(r"VmRSS:\s+(\d+)", text)
    hwm = re.search(r"VmHWM:\s+(\d+)", text)
    return (int(rss.group(1)) if rss else 0, int(hwm.group(1)) if hwm else 0)


def cpu_seconds(pid: int) -> float:
    """User and system CPU time ``pid`` has used so far."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def busy(pid: int) -> bool:
    """Whether a thread of ``pid`` is running, waiting for a CPU or waiting on the disk
    (state R or D): the process is still at work, not idle in a wait for input."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for task in tasks:
        try:
            text = Path(f"/proc/{pid}/task/{task}/stat").read_text()
        except OSError:
            continue
        if text.rpartition(")")[2].split()[:1] in (["R"], ["D"]):
            return True
    return False


def descriptor_targets(pid: int) -> list[str]:
    """What each open descriptor of ``pid`` refers to (``readlink /proc/PID/fd/N``)."""
    root = f"/proc/{pid}/fd"
    try:
        names = os.listdir(root)
    except OSError:
        return []
    out = []
    for name in names:
        with contextlib.suppress(OSError):
            out.append(os.readlink(f"{root}/{name}"))
    return out


def descriptor_kind(target: str, world: World) -> str:
    """A descriptor by what it is: a socket, in the share, in the state directory (the
    indexes), outside the shares (never), deleted (a file or directory removed since), or
    other."""
    if target.startswith("socket:"):
        return "socket"
    if target.endswith(" (deleted)"):
        return "deleted"
    for kind, root in (("share", world.share), ("state", world.tmp / "state"),
                       ("OUTSIDE", world.outside)):
        if target == str(root) or target.startswith(f"{root}/"):
            return kind
    return "other"


def descriptors(pid: int, world: World) -> dict[str, int]:
    """Open descriptors of ``pid`` counted by `descriptor_kind`."""
    out: dict[str, int] = {}
    for target in descriptor_targets(pid):
        kind = descriptor_kind(target, world)
        out[kind] = out.get(kind, 0) + 1
    return out
