"""End to end: the counters of ``--stats``, ``--stats-json`` and ``--json`` add up, across
push, pull, sync and watch, with failures, local copies, deletions and excluded files mixed
in; every file is counted once (transferred, failed or unchanged), the total is the number
of files there are, and the event stream has one event per file transferred, per error
and per deletion (issue 14, items 11, 12, 13, 14 and 20)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from .e2e_support import E2E, RDC, STOP_SECONDS, Result, wait_for, write

SETTLE = 30.0  # seconds a change may take to reach a watcher (the pure run is slow)


def events_of(text: str) -> list[dict[str, Any]]:
    """The JSON lines of ``--json`` output; every line must be one."""
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def files_in(root: Path, skip_suffix: str = ".log") -> set[str]:
    out = set()
    for dirpath, _, names in os.walk(root):
        for name in names:
            if not name.endswith(skip_suffix) and name != ".rdc-folder":  # (never synced)
                out.add(os.path.relpath(os.path.join(dirpath, name), root))
    return out


def assert_adds_up(stats: dict[str, Any]) -> None:
    """Each file counted once, nothing negative, errors at least the failed files."""
    parts = ("files_unchanged", "files_transferred", "files_failed", "files_to_transfer")
    assert all(stats[k] >= 0 for k in (*parts, "files_total", "files_copied_locally")), stats
    assert stats["files_total"] == sum(stats[k] for k in parts), stats
    assert stats["files_copied_locally"] <= stats["files_transferred"], stats
    assert len(stats["errors"]) >= stats["files_failed"], stats


def assert_events_match(events: list[dict[str, Any]], stats: dict[str, Any]) -> None:
    """The stream holds one file event per file transferred, one error event per error,
    one delete event per deletion, and ends with a summary equal to ``stats``."""
    kinds = [e["type"] for e in events]
    assert kinds[-1] == "summary", kinds
    summary = events[-1]
    for key, value in stats.items():
        if key != "seconds":
            assert summary[key] == value, (key, summary[key], value)
    files = [e for e in events if e["type"] == "file"]
    assert len(files) == stats["files_transferred"], files
    assert len({e["path"] for e in files}) == len(files)
    assert sum(e["how"] == "copy" for e in files) == stats["files_copied_locally"]
    assert sum(e["literal_bytes"] for e in files) == stats["literal_bytes"]
    errors = [e for e in events if e["type"] == "error"]
    assert [(e["path"], e["message"]) for e in errors] == [
        (e["path"], e["error"]) for e in stats["errors"]]
    assert sum(e["type"] == "delete" for e in events) == stats["deleted"]


def listed(result: Result, verb: str) -> set[str]:
    """Paths of ``-v`` lines starting with ``verb`` (the listing is on stderr with
    --json, stdout else)."""
    text = result.stdout + result.stderr
    return {line.split(" ", 1)[1] for line in text.splitlines() if line.startswith(verb + " ")}


def test_push_counters_with_failures_copies_deletions_and_excludes(e2e: E2E) -> None:
    e2e.unprivileged()
    src, share = e2e.tmp / "src", e2e.tmp / "share"
    (src / "locked").mkdir(parents=True)
    share.mkdir()
    for n in range(8):
        write(src / f"f{n}.txt", f"file {n}\n".encode() * (n + 1))
    write(src / "locked" / "inside.txt", b"version 1\n")
    write(src / "skip.log", b"excluded\n")
    server = e2e.serve({"s": share})
    first = e2e.push(src, server.url("s"), "--exclude", "*.log", "--json").ok()
    assert first.stats["files_total"] == first.stats["files_transferred"] == 9
    assert_adds_up(first.stats)
    assert_events_match(events_of(first.stdout), first.stats)

    write(src / "f1.txt", b"edited\n")
    write(src / "f2.txt", b"edited too\n" * 3)
    write(src / "again.txt", (src / "f5.txt").read_bytes())  # the server has it: a copy
    write(src / "secret.txt", b"unreadable\n", 0o000)
    write(src / "locked" / "inside.txt", b"version 2\n")  # the server cannot write there
    write(src / "more.log", b"excluded\n")
    write(share / "stale.txt", b"only on the server\n")
    (share / "locked").chmod(0o555)
    try:
        result = e2e.push(src, server.url("s"), "--exclude", "*.log", "--delete", "-v",
                          "--json")
    finally:
        (share / "locked").chmod(0o755)
    assert result.returncode == 3, result
    stats = result.stats
    assert_adds_up(stats)
    assert_events_match(events_of(result.stdout), stats)
    assert stats["files_total"] == len(files_in(src)) == 11
    assert stats["files_transferred"] == 3 and stats["files_copied_locally"] == 1, stats
    assert stats["files_failed"] == 2 and stats["files_unchanged"] == 6, stats
    assert {e["path"] for e in stats["errors"]} == {"secret.txt", "locked/inside.txt"}
    # A file could not be read, so nothing was deleted, and -v does not say otherwise.
    assert stats["deleted"] == 0 and (share / "stale.txt").exists()
    assert listed(result, "delete") == set(), result
    assert listed(result, "send") == {"f1.txt", "f2.txt", "again.txt"}, result
    assert "nothing was deleted" in result.stderr
    assert "the trees differ at the end" in result.stderr  # something failed

    (src / "secret.txt").chmod(0o644)
    fixed = e2e.push(src, server.url("s"), "--exclude", "*.log", "--delete", "-v",
                     "--json").ok()
    assert_adds_up(fixed.stats)
    assert_events_match(events_of(fixed.stdout), fixed.stats)
    assert fixed.stats["files_transferred"] == 2 and fixed.stats["files_failed"] == 0
    assert fixed.stats["deleted"] == 1 and listed(fixed, "delete") == {"stale.txt"}
    assert fixed.stats["files_total"] == 11 and fixed.stats["in_step"] is True
    assert "warning" not in fixed.stderr, fixed


def test_pull_counters_with_failures_copies_deletions_and_excludes(e2e: E2E) -> None:
    e2e.unprivileged()
    share, dst = e2e.tmp / "share", e2e.tmp / "dst"
    (share / "locked").mkdir(parents=True)
    for n in range(6):
        write(share / f"f{n}.txt", f"file {n}\n".encode() * (n + 2))
    write(share / "locked" / "inside.txt", b"version 1\n")
    write(share / "server.log", b"excluded\n")
    server = e2e.serve({"s": share})
    e2e.pull(server.url("s"), dst, "--exclude", "*.log").ok()

    write(share / "f0.txt", b"edited on the server\n")
    write(share / "twin.txt", (share / "f3.txt").read_bytes())  # dst has it: a copy
    write(share / "locked" / "inside.txt", b"version 2\n")  # dst cannot write there
    write(dst / "extra.txt", b"only here\n")
    write(dst / "mine.log", b"excluded here\n")
    (dst / "locked").chmod(0o555)
    try:
        result = e2e.pull(server.url("s"), dst, "--exclude", "*.log", "--delete", "-v",
                          "--stats")
    finally:
        (dst / "locked").chmod(0o755)
    assert result.returncode == 3, result
    stats = result.stats
    assert_adds_up(stats)
    assert stats["files_total"] == len(files_in(share)) == 8, stats
    assert stats["files_transferred"] == 2 and stats["files_copied_locally"] == 1, stats
    assert stats["files_failed"] == 1 and stats["files_unchanged"] == 5, stats
    assert stats["deleted"] == 1 and not (dst / "extra.txt").exists()
    assert listed(result, "fetch") == {"f0.txt", "twin.txt"}, result
    assert listed(result, "delete") == {"extra.txt"}
    assert (dst / "mine.log").exists()
    assert ("files: 8 total, 2 transferred (1 copied locally), 5 unchanged, 1 failed"
            in result.stdout), result


def test_a_receiver_with_extra_files_is_no_warning(e2e: E2E) -> None:
    """Extra files on the receiving side without --delete are the expected state: the
    trees differ, but nothing failed, so no warning (item 13)."""
    src, share = e2e.tmp / "src", e2e.tmp / "share"
    src.mkdir()
    share.mkdir()
    write(src / "a.txt", b"a\n")
    write(share / "extra.txt", b"the server's own\n")
    server = e2e.serve({"s": share})
    result = e2e.push(src, server.url("s"), "--stats", "-v").ok()
    assert result.stats["in_step"] is False
    assert "warning" not in result.stdout + result.stderr, result
    # The comparison is made twice when the trees still differ at the end (a hash
    # prefix could have matched by accident): -v lists what the first one sent.
    assert listed(result, "send") == {"a.txt"}, result
    assert "extra extra.txt (kept; --delete removes it)" in result.stdout
    dst = e2e.tmp / "dst"
    write_dst = dst / "mine.txt"
    dst.mkdir()
    write(write_dst, b"mine\n")
    pulled = e2e.pull(server.url("s"), dst, "--stats", "-v").ok()
    assert "warning" not in pulled.stdout + pulled.stderr, pulled
    assert listed(pulled, "fetch") == {"a.txt", "extra.txt"}, pulled
    assert pulled.stats["files_transferred"] == 2 and pulled.stats["files_total"] == 2


def sync(e2e: E2E, local: Path, url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    env = dict(e2e.env, XDG_STATE_HOME=str(e2e.tmp / "state-client"))
    return subprocess.run(
        [*e2e.prefix, *RDC, "sync", str(local), url, "--token-file", str(e2e.token_file),
         *extra], capture_output=True, text=True, env=env, timeout=60)


def test_sync_counters_with_a_conflict_failures_deletions_and_excludes(e2e: E2E) -> None:
    e2e.unprivileged()
    share, here = e2e.tmp / "share", e2e.tmp / "here"
    (share / "locked").mkdir(parents=True)
    here.mkdir()
    for n in range(6):
        write(share / f"f{n}.txt", f"file {n}\n".encode() * (n + 2))
    write(share / "locked" / "inside.txt", b"version 1\n")
    server = e2e.serve({"s": share})
    url = server.url("s")
    first = sync(e2e, here, url, "--exclude", "*.log", "--json")
    assert first.returncode == 0, first.stderr
    summary = events_of(first.stdout)[-1]
    assert_adds_up(summary)
    assert summary["files_total"] == summary["files_transferred"] == 7
    again = sync(e2e, here, url, "--exclude", "*.log", "--json")
    quiet = events_of(again.stdout)[-1]
    assert quiet["files_unchanged"] == quiet["files_total"] == 7, quiet
    # Nothing to do, but the connection's bytes (handshake, open) are counted, as in a push.
    assert quiet["bytes_sent"] > 0 and quiet["bytes_received"] > 0, quiet

    write(here / "f0.txt", b"edited here\n")
    write(share / "f1.txt", b"edited there\n")
    write(here / "f2.txt", b"both, here\n")
    write(share / "f2.txt", b"both, there\n")  # a conflict: both kept
    os.remove(here / "f3.txt")
    os.remove(share / "f4.txt")
    write(here / "copy.txt", (here / "f5.txt").read_bytes())
    write(here / "notes.log", b"excluded\n")
    write(here / "locked" / "inside.txt", b"version 2 here\n")  # the server cannot write
    (share / "locked").chmod(0o555)
    try:
        result = sync(e2e, here, url, "--exclude", "*.log", "--json", "-v",
                      "--stats-json", str(e2e.tmp / "sync.json"))
    finally:
        (share / "locked").chmod(0o755)
    assert result.returncode == 3, result.stderr
    events = events_of(result.stdout)
    stats = json.loads((e2e.tmp / "sync.json").read_text())
    assert_adds_up(stats)
    assert_events_match(events, stats)
    assert stats["files_total"] == len(files_in(here)), (stats, files_in(here))
    assert stats["files_failed"] == 1 and stats["errors"][0]["path"] == "locked/inside.txt"
    # f0 up, f1 down, the conflict copy and f2 (one each way), copy.txt up: 5 files
    assert stats["files_transferred"] == 5, stats
    assert stats["deleted"] == 2, stats
    assert [e["path"] for e in events if e["type"] == "conflict"] == ["f2.txt"]
    deletes = {(e["path"], e["where"]) for e in events if e["type"] == "delete"}
    assert deletes == {("f3.txt", "remote"), ("f4.txt", "local")}


def test_watch_counts_each_round_and_prints_only_rounds_that_did_something(
        e2e: E2E) -> None:
    share, here = e2e.tmp / "share", e2e.tmp / "here"
    share.mkdir()
    here.mkdir()
    write(share / "first.txt", b"on the server\n")
    server = e2e.serve({"s": share})
    log = e2e.tmp / "watch.jsonl"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [*RDC, "watch", str(here), server.url("s"), "--token-file", str(e2e.token_file),
             "--json", "--exclude", "*.log"],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.PIPE,
            env=dict(e2e.env, XDG_STATE_HOME=str(e2e.tmp / "state-watch")))
    e2e.started.append(process)

    def events() -> list[dict[str, Any]]:
        return events_of(log.read_text())

    def summaries() -> list[dict[str, Any]]:
        return [e for e in events() if e["type"] == "summary"]

    wait_for(lambda: any(e["type"] == "status" and e["state"] == "connected"
                         for e in events()), SETTLE, "the watcher to connect")
    wait_for(lambda: (here / "first.txt").exists() and summaries(), SETTLE, "the first round")
    write(here / "mine.txt", b"made here\n")
    write(here / "copy.txt", b"on the server\n")
    write(here / "skip.log", b"excluded\n")
    wait_for(lambda: (share / "mine.txt").exists() and (share / "copy.txt").exists(),
             SETTLE, "local files to reach the server")
    wait_for(lambda: sum(s["files_transferred"] for s in summaries()) == 3, SETTLE,
             "the rounds' summaries")
    done = len(summaries())
    # A change on the server's disk that leaves everything as it was: a round that does
    # nothing, which prints nothing. Then a real one.
    st = os.stat(share / "first.txt")
    os.utime(share / "first.txt", ns=(st.st_atime_ns, st.st_mtime_ns))
    os.remove(here / "mine.txt")
    wait_for(lambda: not (share / "mine.txt").exists(), SETTLE, "the deletion to cross")
    wait_for(lambda: len(summaries()) > done, SETTLE, "the deletion's summary")
    process.send_signal(signal.SIGINT)
    assert process.wait(STOP_SECONDS) == 130
    rounds = summaries()
    for stats in rounds:
        assert_adds_up(stats)
        assert stats["command"] == "watch"
    assert len(rounds) == done + 1, rounds  # the round that did nothing printed nothing
    assert rounds[-1]["deleted"] == 1 and rounds[-1]["files_total"] == 2, rounds[-1]
    files = [e for e in events() if e["type"] == "file"]
    assert sorted(e["path"] for e in files) == ["copy.txt", "first.txt", "mine.txt"]
    assert not any(e["path"] == "skip.log" for e in files)


@pytest.mark.parametrize("verb", ["push", "pull"])
def test_stats_json_to_stdout_and_quiet(e2e: E2E, verb: str) -> None:
    """``--stats-json -`` writes the summary to stdout and everything else to stderr;
    ``-q`` prints nothing but errors (item 15)."""
    src, share = e2e.tmp / "src", e2e.tmp / "share"
    src.mkdir()
    share.mkdir()
    for n in range(3):
        write((src if verb == "push" else share) / f"f{n}.txt", f"{n}\n".encode())
    server = e2e.serve({"s": share})
    a, b = (str(src), server.url("s")) if verb == "push" else (server.url("s"), str(src))
    token = ("--token-file", str(e2e.token_file))
    result = e2e.rdc(verb, a, b, *token, "--stats-json", "-", "--stats", "-v").ok()
    summary = json.loads(result.stdout)  # stdout is the JSON, whole
    assert summary["files_transferred"] == 3
    assert "files: 3 total" in result.stderr and not (e2e.tmp / "-").exists()
    assert ("send f0.txt" if verb == "push" else "fetch f0.txt") in result.stderr

    write((src if verb == "push" else share) / "f0.txt", b"changed\n")
    quiet = e2e.rdc(verb, a, b, *token, "-q").ok()
    assert quiet.stdout == "" and quiet.stderr == "", quiet
    clash = e2e.rdc(verb, a, b, *token, "-q", "-v")
    assert clash.returncode == 2 and "-q" in clash.stderr, clash


def test_sync_verbose_lists_what_was_done_on_each_side(e2e: E2E) -> None:
    """``sync -v`` names every kind of change a round makes and on which side, so that a
    round that only set a time is not a summary of nothing (items 12, 14); a dry run lists
    the same with ``would``."""
    share, here = e2e.tmp / "share", e2e.tmp / "here"
    share.mkdir()
    here.mkdir()
    for name in ("a.txt", "b.txt", "c.txt"):
        write(share / name, f"{name}\n".encode())
    server = e2e.serve({"s": share})
    url = server.url("s")
    assert sync(e2e, here, url).returncode == 0
    (here / "nd").mkdir()
    write(here / "nd" / "n.txt", b"new here\n")
    os.symlink("a.txt", here / "lnk")
    os.utime(share / "b.txt", ns=(10**18, 10**18))
    os.remove(share / "c.txt")
    (share / "emptyd").mkdir()
    expected = ["create here emptyd/", "create there nd/", "send nd/n.txt",
                "link there lnk -> a.txt", "delete here c.txt", "set mode and time here b.txt"]

    def listing(text: str) -> list[str]:
        """The lines before the summary, but the new link's own time (set or not,
        as the file system allows)."""
        return [line for line in text.splitlines()[:len(expected) + 1]
                if not line.endswith("mode and time there lnk")][:len(expected)]

    plan = sync(e2e, here, url, "-n")
    assert plan.returncode == 0, plan.stderr
    assert listing(plan.stdout) == [f"would {line}" for line in expected], plan.stdout
    done = sync(e2e, here, url, "-v", "--stats")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert listing(done.stdout) == expected, done.stdout
    assert os.stat(here / "b.txt").st_mtime_ns == 10**18
    assert "files: 3 total, 1 transferred (0 copied locally), 2 unchanged, 0 failed" in lines
