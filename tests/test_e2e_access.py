"""End to end: who may do what. TLS with a certificate the client checks; tokens (a wrong
one gets exit 4 and changes nothing); read-only shares and per-token rights."""

from __future__ import annotations

from pathlib import Path

import trustme

from .e2e_support import (
    E2E,
    OTHER_TOKEN,
    TOKEN,
    assert_same_tree,
    random_file,
    snapshot,
    write,
)


def some_files(root: Path) -> None:
    (root / "d").mkdir(parents=True)
    write(root / "d" / "a.txt", b"alpha\n" * 100)
    write(root / "b.bin", bytes(range(256)) * 64)


def tls_files(tmp: Path) -> dict[str, Path]:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    paths = {"ca": tmp / "ca.pem", "cert": tmp / "cert.pem", "key": tmp / "key.pem"}
    ca.cert_pem.write_to_path(str(paths["ca"]))
    for n, pem in enumerate(cert.cert_chain_pems):
        pem.write_to_path(str(paths["cert"]), append=n > 0)
    cert.private_key_pem.write_to_path(str(paths["key"]))
    return paths


def test_tls_with_the_servers_ca_works_both_ways(e2e: E2E) -> None:
    pems = tls_files(e2e.tmp)
    src = e2e.tmp / "src"
    some_files(src)
    random_file(src / "random.bin", 100_000, seed=1)  # does not compress
    share = e2e.tmp / "share"
    share.mkdir()
    server = e2e.serve({"s": share}, None, "--tls-cert", str(pems["cert"]),
                       "--tls-key", str(pems["key"]))
    assert "(TLS)" in server.log()

    pushed = e2e.push(src, server.url("s"), "--tls", "--ca-file", str(pems["ca"])).ok()
    assert_same_tree(src, share)
    dst = e2e.tmp / "dst"
    e2e.pull(server.url("s"), dst, "--ca-file", str(pems["ca"])).ok()  # implies --tls
    assert_same_tree(share, dst)
    # The count is of what crossed the socket, so of TLS records.
    assert pushed.stats["bytes_sent"] > 100_000


def test_tls_without_the_ca_or_without_tls_fails_cleanly(e2e: E2E) -> None:
    pems = tls_files(e2e.tmp)
    src = e2e.tmp / "src"
    some_files(src)
    share = e2e.tmp / "share"
    share.mkdir()
    server = e2e.serve({"s": share}, None, "--tls-cert", str(pems["cert"]),
                       "--tls-key", str(pems["key"]))

    untrusted = e2e.push(src, server.url("s"), "--tls")
    assert untrusted.returncode == 5, untrusted
    assert "certificate verify failed" in untrusted.stderr, untrusted
    assert "Traceback" not in untrusted.stderr
    assert snapshot(share) == {}

    plain = e2e.push(src, server.url("s"))  # speaks rdc to a TLS server
    assert plain.returncode == 5, plain
    assert "Traceback" not in plain.stderr
    assert snapshot(share) == {}

    e2e.push(src, server.url("s"), "--ca-file", str(pems["ca"])).ok()  # still serving
    assert_same_tree(src, share)


def test_tls_client_against_a_plain_server_fails_cleanly(e2e: E2E) -> None:
    pems = tls_files(e2e.tmp)
    src = e2e.tmp / "src"
    some_files(src)
    share = e2e.tmp / "share"
    share.mkdir()
    server = e2e.serve({"s": share})
    result = e2e.push(src, server.url("s"), "--ca-file", str(pems["ca"]))
    assert result.returncode == 5, result
    assert ("TLS with 127.0.0.1 failed: the other side does not speak TLS ([SSL: "
            "WRONG_VERSION_NUMBER]") in result.stderr, result
    assert "connect without --tls" in result.stderr, result
    assert "Traceback" not in result.stderr
    assert snapshot(share) == {}


def test_a_wrong_token_is_refused_and_changes_nothing(e2e: E2E) -> None:
    src = e2e.tmp / "src"
    some_files(src)
    share = e2e.tmp / "share"
    share.mkdir()
    write(share / "existing", b"the server's\n")
    server = e2e.serve({"s": share})
    before = snapshot(share)
    e2e.token_file.write_text(f"{OTHER_TOKEN}\n")

    pushed = e2e.push(src, server.url("s"))
    assert pushed.returncode == 4, pushed
    assert "authentication failed" in pushed.stderr and "Traceback" not in pushed.stderr
    assert pushed.stats is None  # no summary of a transfer that never began
    assert snapshot(share) == before

    dst = e2e.tmp / "dst"
    some_files(dst)
    mine = snapshot(dst)
    pulled = e2e.pull(server.url("s"), dst, "--delete")
    assert pulled.returncode == 4, pulled
    assert snapshot(dst) == mine
    fresh = e2e.tmp / "fresh" / "dir"
    assert e2e.pull(server.url("s"), fresh).returncode == 4
    assert not (e2e.tmp / "fresh").exists()
    assert "authentication failed" in server.log()

    e2e.token_file.write_text(f"{TOKEN}\n")  # the server kept serving
    e2e.push(src, server.url("s"), "--delete").ok()
    assert_same_tree(src, share)


def test_a_read_only_share_refuses_pushes_and_serves_pulls(e2e: E2E) -> None:
    src = e2e.tmp / "src"
    some_files(src)
    share = e2e.tmp / "share"
    share.mkdir()
    write(share / "published", b"read me\n" * 50)
    before = snapshot(share)
    server = e2e.serve(None, {"ro": share})
    assert "(read-only)" in server.log()

    for extra in ((), ("--delete",)):
        pushed = e2e.push(src, server.url("ro"), *extra)
        assert pushed.returncode == 4, pushed
        assert "read-only" in pushed.stderr and "Traceback" not in pushed.stderr, pushed
        assert snapshot(share) == before
    nested = e2e.push(src, server.url("ro", "new/dir"))
    assert nested.returncode == 4, nested
    assert snapshot(share) == before

    dst = e2e.tmp / "dst"
    e2e.pull(server.url("ro"), dst).ok()
    assert_same_tree(share, dst)


def test_token_rights_limit_shares_and_modes(e2e: E2E) -> None:
    a, b = e2e.tmp / "a", e2e.tmp / "b"
    a.mkdir()
    b.mkdir()
    write(b / "theirs", b"b's\n")
    tokens = e2e.tmp / "rights"
    tokens.write_text(f"{TOKEN} a:ro  # reads a only\n{OTHER_TOKEN} b\n")
    server = e2e.serve({"a": a, "b": b}, None, token_file=tokens)
    src = e2e.tmp / "src"
    some_files(src)

    refused = e2e.push(src, server.url("a"))
    assert refused.returncode == 4 and "read-only" in refused.stderr, refused
    other = e2e.pull(server.url("b"), e2e.tmp / "dst")
    assert other.returncode == 4 and "no share" in other.stderr, other
    unknown = e2e.pull(server.url("nope"), e2e.tmp / "dst")
    assert unknown.returncode == 4 and "no share" in unknown.stderr, unknown
    assert snapshot(a) == {}
    e2e.pull(server.url("a"), e2e.tmp / "dst").ok()

    e2e.token_file.write_text(f"{OTHER_TOKEN}\n")
    e2e.push(src, server.url("b", "sub")).ok()
    assert_same_tree(src, b / "sub")
