"""End to end: processes killed in the middle of a transfer, and the daemon stopped by
SIGTERM or SIGINT. Whatever happens, every target file is its old version or its new one,
never a mix; the next successful run leaves no temporaries behind."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from . import crash_support
from .conftest import scaled
from .e2e_support import (
    E2E,
    RUN_SECONDS,
    TEMP,
    RawClient,
    Server,
    assert_same_tree,
    file_hash,
    random_file,
    stamp_times,
    temporaries,
    wait_for,
    wait_until_stale,
    write,
)

BIG = scaled(64 << 20, 2 << 20)  # long enough in flight to be caught there (with C)
# Two of them, both in flight when the peer dies: several conversations see it at once.
BIG_FILES = ("big.bin", "big2.bin")
PROMPT = 5.0  # seconds a stopped daemon may take to exit


@pytest.fixture(scope="module")
def material(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The big files, made once: new versions, and old ones that share nothing with them."""
    tmp = tmp_path_factory.mktemp("material")
    made = {}
    for n, name in enumerate(BIG_FILES):
        made[f"{name}-old"] = tmp / f"{name}-old"
        made[f"{name}-new"] = tmp / f"{name}-new"
        random_file(made[f"{name}-old"], BIG // 32, seed=10 * n + 1)
        random_file(made[f"{name}-new"], BIG // 2, seed=10 * n + 2)
    return made


def old_and_new(
    material: dict[str, Path], old: Path, new: Path
) -> dict[bytes, set[bytes | None]]:
    """The target's tree ``old`` and the source's ``new``: the same paths, other contents,
    big files that share nothing with their old versions, and one new file. Returns, per
    path, the hashes it may have on the target after an interruption (None: absent)."""
    for root, version in ((old, "old"), (new, "new")):
        (root / "sub").mkdir(parents=True)
        for name in BIG_FILES:
            shutil.copyfile(material[f"{name}-{version}"], root / name)
        random_file(root / "mid.bin", 300_000, seed=1 if version == "old" else 2)
        write(root / "a.txt", f"{version} version\n".encode() * 100)
        write(root / "sub" / "b.txt", f"b, {version} version\n".encode())
    write(new / "new.txt", b"only in the new tree\n")
    # Times in the past, so that the indexes trust what they read once; not the same on
    # both sides, or a sync by stamp roots would take the versions for the same (as rsync
    # -a would): those of an edit are later.
    for seed, root in ((3, old), (4, new)):
        stamp_times(root, seed=seed)
    allowed: dict[bytes, set[bytes | None]] = {}
    for rel in (*BIG_FILES, "mid.bin", "a.txt", "sub/b.txt", "new.txt"):
        allowed[rel.encode()] = {
            file_hash(root / rel) if (root / rel).exists() else None for root in (old, new)
        }
    return allowed


def check_old_or_new(target: Path, allowed: dict[bytes, set[bytes | None]]) -> None:
    for rel, versions in allowed.items():
        path = target / os.fsdecode(rel)
        found = file_hash(path) if path.exists() else None
        assert found in versions, f"{rel!r} is neither its old nor its new version"
    names = {rel for rel in allowed} | {b"sub", b".rdc-folder"}
    for dirpath, dirnames, filenames in os.walk(os.fsencode(target)):
        for name in dirnames + filenames:
            rel = os.path.relpath(os.path.join(dirpath, name), os.fsencode(target))
            assert rel in names or TEMP.match(name), f"unexpected {rel!r}"


def in_flight(target: Path, process: subprocess.Popen[bytes]) -> bool:
    """True once a big file has a temporary with data in it under ``target``; fails the
    test if ``process`` ended first. (Not every big file: the receiver may write them one
    after the other. Since a file that shares nothing with its old version skips most of
    its fine lists, `descent.FINE_PROBE`, the C run's does here too: one file's data
    arrived while the other's descent had not ended.)"""
    if process.poll() is not None:
        _, err = process.communicate()
        pytest.fail(f"the transfer ended ({process.returncode}) before it could be "
                    f"interrupted: {err.decode(errors='replace')}")
    writing = set()
    for path in temporaries(target):
        name = os.fsdecode(path).rpartition("-")[2]
        with contextlib.suppress(FileNotFoundError):
            if name in BIG_FILES and os.path.getsize(path) > 0:
                writing.add(name)
    return bool(writing)


def finish(process: subprocess.Popen[bytes]) -> tuple[int, str]:
    try:
        _, err = process.communicate(timeout=RUN_SECONDS)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        pytest.fail(f"rdc still running {RUN_SECONDS} s after its peer went away")
    return process.returncode, err.decode(errors="replace")


@dataclass
class Interrupted:
    """A push (or pull) caught with its big files in flight: the server, the running
    client, the source and target trees, and what each target file may then be."""

    verb: str
    server: Server
    process: subprocess.Popen[bytes]
    source: Path
    target: Path
    allowed: dict[bytes, set[bytes | None]]

    def recovers(self, e2e: E2E, server: Server | None = None) -> None:
        """Every target file is its old or its new version; a rerun (against ``server``,
        by default the same one) completes the transfer and leaves no temporaries."""
        check_old_or_new(self.target, self.allowed)
        wait_until_stale(self.target)
        url = (server or self.server).url("s")
        if self.verb == "push":
            e2e.push(self.source, url).ok()
        else:
            e2e.pull(url, self.target).ok()
        assert_same_tree(self.source, self.target)
        assert not temporaries(e2e.tmp)


def interrupted(e2e: E2E, material: dict[str, Path], verb: str) -> Interrupted:
    share, local = e2e.tmp / "share", e2e.tmp / "local"
    source, target = (local, share) if verb == "push" else (share, local)
    allowed = old_and_new(material, target, source)
    server = e2e.serve({"s": share})
    args = (str(local), server.url("s")) if verb == "push" else (server.url("s"), str(local))
    process = e2e.start(verb, *args)
    wait_for(lambda: in_flight(target, process), RUN_SECONDS, "the big files to be in flight",
             interval=0.002)
    return Interrupted(verb, server, process, source, target, allowed)


@pytest.mark.slow
def test_client_killed_mid_push(e2e: E2E, material: dict[str, Path]) -> None:
    run = interrupted(e2e, material, "push")
    run.process.kill()
    assert finish(run.process)[0] == -signal.SIGKILL
    assert run.server.running
    run.recovers(e2e)


@pytest.mark.slow
def test_ctrl_c_interrupts_a_push(e2e: E2E, material: dict[str, Path]) -> None:
    run = interrupted(e2e, material, "push")
    run.process.send_signal(signal.SIGINT)
    status, err = finish(run.process)
    assert status == 130, err
    assert err.strip() == "rdc: interrupted", err
    run.recovers(e2e)


@pytest.mark.slow
@pytest.mark.parametrize("verb", ["push", "pull"])
def test_server_killed_mid_transfer(e2e: E2E, material: dict[str, Path], verb: str) -> None:
    run = interrupted(e2e, material, verb)
    run.server.kill()
    status, err = finish(run.process)
    assert status == 5, err
    assert "Traceback" not in err and "rdc:" in err, err
    run.recovers(e2e, e2e.serve({"s": e2e.tmp / "share"}))  # same share and state directory


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_the_daemon_cleanly(e2e: E2E, signum: int) -> None:
    share = e2e.tmp / "share"
    share.mkdir()
    server = e2e.serve({"s": share})
    idle = RawClient(server.port, timeout=PROMPT)  # an open connection does not hold it up
    assert idle.hello()["t"] == "welcome"
    idle.open("s")
    silent = RawClient(server.port, timeout=PROMPT)  # nor does one mid-handshake
    started = time.monotonic()
    assert server.stop(signum, timeout=PROMPT) == 0
    assert time.monotonic() - started < PROMPT
    assert idle.until_closed() == []
    assert silent.until_closed() == []
    log = server.log()
    assert f"{signal.Signals(signum).name}: stopping" in log
    assert "Traceback" not in log


@pytest.mark.slow
def test_sigterm_stops_the_daemon_during_a_push(e2e: E2E, material: dict[str, Path]) -> None:
    """(SIGINT takes the same path; `test_a_signal_stops_the_daemon_cleanly` has both.)"""
    run = interrupted(e2e, material, "push")
    started = time.monotonic()
    assert run.server.stop(signal.SIGTERM, timeout=PROMPT) == 0
    assert time.monotonic() - started < PROMPT
    status, err = finish(run.process)
    assert status == 5, err
    assert "Traceback" not in run.server.log()
    run.recovers(e2e, e2e.serve({"s": e2e.tmp / "share"}))


KILLS = scaled(10, 6)  # bench/crash.py runs hundreds


def test_kills_at_random_points_leave_old_or_new_and_converge(e2e: E2E) -> None:
    """Pushes and pulls (with --delete) killed at random points, client or server: every
    file is its old or its new version, and the next run converges (tests/crash_support;
    bench/crash.py is the long run)."""
    tally = crash_support.run(e2e, transfers=KILLS, seconds=25, seed=13,
                              big=scaled(4 << 20, 1 << 20), at_least=2)
    assert not tally.problems, "\n".join(tally.problems)
    assert tally.total >= 2, tally
    assert sum(tally.mid_transfer.values()) >= 1, tally  # not all after the end
