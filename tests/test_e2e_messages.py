"""End to end: every error a new user met says what went wrong and what to do, in one line
with a documented exit code, and never as a traceback (issue 14, items 1-9, 16, 17, 19).
Each test runs the real command and checks its output and exit status; the messages
asserted here are the ones README.md shows under "When something goes wrong"."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from .e2e_support import (
    E2E,
    OTHER_TOKEN,
    RDC,
    START_SECONDS,
    STOP_SECONDS,
    Result,
    Server,
    snapshot,
    wait_for,
    write,
)

SETTLE = 30.0


def one_error(result: Result, code: int) -> str:
    """The command failed with ``code`` and said so in one ``rdc:`` line, no traceback."""
    assert result.returncode == code, result
    assert "Traceback" not in result.stderr, result
    lines = [line for line in result.stderr.splitlines() if line.startswith("rdc")]
    assert len(lines) == 1, result
    return lines[0]


def serve_command(e2e: E2E, *args: str) -> Result:
    """``rdc serve ARGS`` expected to end by itself (an error at start-up)."""
    return e2e.rdc("serve", "--token-file", str(e2e.token_file), "--state-dir",
                   str(e2e.tmp / "state"), *args, timeout=START_SECONDS)


# ---------------------------------------------------------------- the server (1, 6, 9)


def test_serve_on_a_port_in_use_says_which_address(e2e: E2E) -> None:
    share = e2e.tmp / "share"
    share.mkdir()
    server = e2e.serve({"s": share})
    taken = serve_command(e2e, "--listen", f"127.0.0.1:{server.port}", "--share", f"s={share}")
    line = one_error(taken, 2)
    assert line == (f"rdc: cannot listen on 127.0.0.1:{server.port}: Address already in use "
                    "(another rdc serve or another program has that port: stop it, or choose "
                    "another with --listen HOST:PORT)")
    # Without a port the default one is meant: the line says so.
    with contextlib.ExitStack() as stack:
        holder = stack.enter_context(socket.socket())
        try:
            holder.bind(("127.0.0.1", 8730))
            holder.listen()
        except OSError:
            pass  # someone else has it: in use all the same
        default = serve_command(e2e, "--listen", "127.0.0.1", "--share", f"s={share}")
    assert one_error(default, 2).startswith("rdc: cannot listen on 127.0.0.1:8730: ")


def test_serve_refuses_a_share_name_given_twice_and_warns_of_unknown_config_keys(
        e2e: E2E) -> None:
    a, b = e2e.tmp / "a", e2e.tmp / "b"
    a.mkdir()
    b.mkdir()
    twice = serve_command(e2e, "--listen", "127.0.0.1:0", "--share", f"s={a}",
                          "--share-ro", f"s={b}")
    assert one_error(twice, 2) == ("rdc: share 's' is given twice (--share and --share-ro "
                                   "names must differ)")
    config = e2e.tmp / "rdc.toml"
    config.write_text(f'listn = "127.0.0.1:1"\n[shares]\ns = {{ path = "{a}", readonyl = true }}\n')
    server = e2e.serve(None, None, "--config", str(config))
    log = server.log()
    assert f"warning: {config}: unknown key 'listn' (ignored)" in log
    assert f"warning: {config}: unknown key 'readonyl' in share 's' (ignored)" in log


def test_tls_mismatches_say_what_is_likely_wrong(e2e: E2E) -> None:
    from .test_e2e_access import tls_files

    pems = tls_files(e2e.tmp)
    src, share = e2e.tmp / "src", e2e.tmp / "share"
    src.mkdir()
    share.mkdir()
    write(src / "a.txt", b"a\n")
    tls_server = e2e.serve({"s": share}, None, "--tls-cert", str(pems["cert"]),
                           "--tls-key", str(pems["key"]))
    plain = e2e.push(src, tls_server.url("s"))
    assert one_error(plain, 5) == (f"rdc: {tls_server.url('s')}: the server closed the "
                                   "connection during the handshake (if it uses TLS, "
                                   "connect with --tls)")
    wait_for(lambda: "TLS handshake failed" in tls_server.log(), 10, "the server's log line")
    line = next(x for x in tls_server.log().splitlines() if "TLS handshake failed" in x)
    assert line.endswith("(a client without --tls?)") and ": the other side does not speak " \
        "TLS" in line, line
    assert not re.search(r"ended: $", tls_server.log(), re.M)

    plain_server = e2e.serve({"s": share})
    tls = e2e.push(src, plain_server.url("s"), "--ca-file", str(pems["ca"]))
    assert one_error(tls, 5).endswith(
        "connect without --tls, or start the server with --tls-cert and --tls-key")
    wait_for(lambda: "TLS handshake on a connection" in plain_server.log(), 10, "the log line")
    assert ("protocol error: the peer started a TLS handshake on a connection without TLS "
            "(a client with --tls, and this server has no --tls-cert?)") in plain_server.log()
    assert snapshot(share) == {}


# ---------------------------------------------------------------- reaching a server (4, 5)


def test_connection_refused_says_so(e2e: E2E) -> None:
    src = e2e.tmp / "src"
    src.mkdir()
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = e2e.push(src, f"rdc://127.0.0.1:{port}/s")
    assert one_error(result, 5) == (
        f"rdc: cannot connect to 127.0.0.1:{port}: connection refused: nothing listens on "
        "that port (is rdc serve running there, on that port?)")
    unknown = e2e.push(src, "rdc://no-such-host.invalid/s")
    assert one_error(unknown, 5).startswith(
        "rdc: cannot connect to no-such-host.invalid:8730: host name not found")


def test_a_server_gone_in_the_middle_of_a_push_is_a_lost_connection(e2e: E2E) -> None:
    src, share = e2e.tmp / "src", e2e.tmp / "share"
    src.mkdir()
    share.mkdir()
    for n in range(2000):
        write(src / f"f{n:04d}.txt", f"file {n}\n".encode() * 40)
    server = e2e.serve({"s": share})
    push = e2e.start("push", str(src), server.url("s"))
    wait_for(lambda: "opened" in server.log(), SETTLE, "the server to open the share")
    os.kill(server.process.pid, signal.SIGSTOP)  # the client now waits for its answers
    try:
        time.sleep(0.2)
        assert push.poll() is None, "the push finished before the server was stopped"
    finally:
        server.kill()  # its sockets close: a reset, or an end of stream
    out, err = push.communicate(timeout=SETTLE)
    result = Result(["push"], push.returncode, out.decode(), err.decode())
    line = one_error(result, 5)
    assert line.startswith(f"rdc: {server.url('s')}: the connection was lost: "), line
    assert re.search(r"lost: (the server closed it|the connection was reset)", line), line


# ---------------------------------------------------------------- local paths (2, 3, 7)


def test_local_directories_are_named_for_what_is_wrong(e2e: E2E) -> None:
    share = e2e.tmp / "share"
    share.mkdir()
    write(share / "a.txt", b"a\n")
    server = e2e.serve({"s": share})
    missing = e2e.push(e2e.tmp / "nowhere", server.url("s"))
    assert one_error(missing, 3) == f"rdc: cannot read {e2e.tmp / 'nowhere'}: no such directory"
    a_file = e2e.tmp / "a-file"
    write(a_file, b"not a directory\n")
    into_file = e2e.pull(server.url("s"), a_file)
    assert one_error(into_file, 3) == (f"rdc: cannot write {a_file}: it exists and is not a "
                                       "directory")
    # A sync creates a missing local directory, as a pull does.
    fresh = e2e.tmp / "new" / "here"
    done = subprocess.run([*RDC, "sync", str(fresh), server.url("s"), "--token-file",
                           str(e2e.token_file)], capture_output=True, text=True,
                          env=dict(e2e.env, XDG_STATE_HOME=str(e2e.tmp / "st")), timeout=60)
    assert done.returncode == 0, done.stderr
    assert (fresh / "a.txt").read_bytes() == b"a\n"


@pytest.mark.parametrize(("command", "variable"), [
    ("sync", "XDG_STATE_HOME"), ("sync", "XDG_CACHE_HOME"), ("push", "XDG_CACHE_HOME")])
def test_an_unusable_state_or_cache_directory_stops_a_sync_before_any_change(
        e2e: E2E, command: str, variable: str) -> None:
    share, here = e2e.tmp / "share", e2e.tmp / "here"
    share.mkdir()
    here.mkdir()
    write(here / "new.txt", b"must not reach the server\n")
    server = e2e.serve({"s": share})
    blocker = e2e.tmp / "a-file"
    write(blocker, b"in the way\n")
    env = dict(e2e.env, XDG_STATE_HOME=str(e2e.tmp / "state-ok"))
    env[variable] = str(blocker / "rdc-dir")  # below a file: cannot be made, even by root
    done = subprocess.run([*RDC, command, str(here), server.url("s"), "--token-file",
                           str(e2e.token_file)], capture_output=True, text=True, env=env,
                          timeout=60)
    result = Result([command], done.returncode, done.stdout, done.stderr)
    line = one_error(result, 3)
    assert line.startswith(f"rdc: cannot write {blocker}"), line
    assert f"(set {variable} to a writable directory)" in line, line
    assert snapshot(share) == {}  # nothing changed on the server


def test_an_unwritable_state_directory_is_named(e2e: E2E) -> None:
    e2e.unprivileged()
    share, here, state = e2e.tmp / "share", e2e.tmp / "here", e2e.tmp / "state-ro"
    share.mkdir()
    here.mkdir()
    state.mkdir(mode=0o555)
    state.chmod(0o555)
    write(here / "new.txt", b"must not reach the server\n")
    server = e2e.serve({"s": share})
    done = subprocess.run([*e2e.prefix, *RDC, "sync", str(here), server.url("s"),
                           "--token-file", str(e2e.token_file)], capture_output=True,
                          text=True, env=dict(e2e.env, XDG_STATE_HOME=str(state)), timeout=60)
    result = Result(["sync"], done.returncode, done.stdout, done.stderr)
    assert one_error(result, 3) == (f"rdc: cannot write {state / 'rdc'}: Permission denied; "
                                    "rdc keeps what each sync did there (set XDG_STATE_HOME "
                                    "to a writable directory)")
    assert snapshot(share) == {}


# ---------------------------------------------------------------- the command line (8, 17)


def test_a_usage_error_in_a_command_shows_that_commands_usage(e2e: E2E) -> None:
    result = e2e.rdc("push", "a", "rdc://h/s", "--no-such-option")
    assert result.returncode == 2
    assert result.stderr.startswith("usage: rdc push "), result
    assert "rdc push: error: unrecognized arguments: --no-such-option" in result.stderr
    sync = e2e.rdc("sync", "a", "rdc://h/s", "--delete")  # push's option, not sync's
    assert sync.stderr.startswith("usage: rdc sync "), sync


def test_delta_verify_prints_its_result(e2e: E2E) -> None:
    old, new = e2e.tmp / "old.txt", e2e.tmp / "new.txt"
    write(old, b"the same start\n" * 500)
    write(new, b"the same start\n" * 500 + b"and an end\n")
    result = e2e.rdc("delta", str(old), str(new), "--verify").ok()
    assert f"verified    {new} rebuilt from the plan byte for byte (1 file)" in result.stdout
    plain = e2e.rdc("delta", str(old), str(new)).ok()
    assert "verified" not in plain.stdout


# ---------------------------------------------------------------- conflict copies (16)


def hostname_server(e2e: E2E, share: Path, host: str) -> Server:
    """``rdc serve`` in its own UTS namespace, where the host name is ``host``."""
    if shutil.which("unshare") is None or subprocess.run(
            ["unshare", "--uts", "true"], capture_output=True, timeout=10).returncode != 0:
        pytest.skip("cannot give the server a host name of its own (unshare --uts)")
    prefix = ["unshare", "--uts", "sh", "-c", f'hostname {host} && exec "$@"', "sh"]
    args = ["--listen", "127.0.0.1:0", "--token-file", str(e2e.token_file), "--state-dir",
            str(e2e.tmp / "state"), "--share", f"s={share}"]
    server = Server(args, e2e.env, e2e.tmp / "serve-host.log", prefix)
    e2e.servers.append(server)
    return server


@pytest.mark.parametrize("newer", ["here", "there"])
def test_conflict_copies_are_named_after_the_machine_whose_version_they_are(
        e2e: E2E, newer: str) -> None:
    share, here = e2e.tmp / "share", e2e.tmp / "here"
    share.mkdir()
    here.mkdir()
    server = hostname_server(e2e, share, "serverbox")
    env = dict(e2e.env, XDG_STATE_HOME=str(e2e.tmp / "st"))
    command = [*RDC, "sync", str(here), server.url("s"), "--token-file", str(e2e.token_file)]
    write(here / "notes.txt", b"common\n")
    assert subprocess.run(command, capture_output=True, env=env, timeout=60).returncode == 0
    write(here / "notes.txt", b"edited here\n")
    write(share / "notes.txt", b"edited on the server\n")
    later = 2_000_000_000 * 10**9
    os.utime((here if newer == "here" else share) / "notes.txt", ns=(later, later))
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    copies = [n for n in os.listdir(here) if n.startswith("notes.sync-conflict-")]
    assert len(copies) == 1, copies
    older = "serverbox" if newer == "here" else socket.gethostname()
    assert copies[0].endswith(f"-{older}.txt"), copies
    text = (here / copies[0]).read_bytes()
    assert text == (b"edited on the server\n" if newer == "here" else b"edited here\n")


# ---------------------------------------------------------------- watch (19)


def watch(e2e: E2E, local: Path, url: str, *extra: str) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(
        [*RDC, "watch", str(local), url, *extra], stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=dict(e2e.env, XDG_STATE_HOME=str(e2e.tmp / f"st-{len(e2e.started)}")))
    e2e.started.append(process)
    return process


def test_watch_ends_on_errors_that_will_not_clear(e2e: E2E) -> None:
    share, here = e2e.tmp / "share", e2e.tmp / "here"
    share.mkdir()
    here.mkdir()
    server = e2e.serve({"s": share}, {"ro": share})
    token = ("--token-file", str(e2e.token_file))
    cases = [
        (server.url("nope"), token, "rdc: no share 'nope' (or not for this token)"),
        (server.url("ro"), token, "rdc: share 'ro' is read-only"),
    ]
    bad_token = e2e.tmp / "bad-token"
    bad_token.write_text(f"{OTHER_TOKEN}\n")
    cases.append((server.url("s"), ("--token-file", str(bad_token)),
                  "rdc: server: authentication failed"))
    for url, extra, message in cases:
        process = watch(e2e, here, url, *extra)
        _, err = process.communicate(timeout=SETTLE)
        assert process.returncode == 4, (url, err)
        assert err.decode().strip().splitlines()[-1] == message, err
        assert b"trying again" not in err


def test_watch_retries_while_the_server_is_away(e2e: E2E) -> None:
    share, here = e2e.tmp / "share", e2e.tmp / "here"
    share.mkdir()
    here.mkdir()
    write(share / "a.txt", b"a\n")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = watch(e2e, here, f"rdc://127.0.0.1:{port}/s", "--token-file",
                    str(e2e.token_file), "--json")
    try:
        first = process.stderr.readline().decode()
        assert "connection refused" in first and "trying again in 1 s" in first, first
        status = json.loads(process.stdout.readline())
        assert status["type"] == "status" and status["state"] == "retrying", status
        assert status["retry_in"] == 1 and "connection refused" in status["message"], status
        assert process.poll() is None
        e2e.serve({"s": share}, None, "--listen", f"127.0.0.1:{port}")
        wait_for(lambda: (here / "a.txt").exists(), SETTLE, "the watch to connect and sync")
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(STOP_SECONDS)


def test_the_error_that_ends_a_command_is_a_json_event_too(e2e: E2E) -> None:
    """With ``--json``, stdout stays JSON lines to the end: the error that stops the
    command is an ``error`` event with its exit code, and its line for people is on
    stderr."""
    src = e2e.tmp / "src"
    src.mkdir()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = e2e.push(src, f"rdc://127.0.0.1:{port}/s", "--json")
    line = one_error(result, 5)
    events = [json.loads(text) for text in result.stdout.splitlines()]
    assert events == [{"type": "error", "path": None, "message": line.removeprefix("rdc: "),
                       "exit_code": 5}], result
