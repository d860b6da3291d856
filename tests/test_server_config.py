"""``rdc serve`` settings: command line, TOML file, token file and its rights."""

from __future__ import annotations

import argparse

import pytest

from rdc.errors import UsageError
from rdc_server.config import load, parse_listen
from rdc_server.shares import Share


def args(**overrides) -> argparse.Namespace:
    base = dict(config=None, listen=None, share=None, share_ro=None, token_file=None,
                state_dir=None, tls_cert=None, tls_key=None)
    return argparse.Namespace(**{**base, **overrides})


def test_listen_addresses() -> None:
    assert parse_listen("127.0.0.1:9000") == ("127.0.0.1", 9000)
    assert parse_listen("[::1]:9000") == ("::1", 9000)
    assert parse_listen(":9000") == ("0.0.0.0", 9000)
    assert parse_listen("example.org") == ("example.org", 8730)
    for bad in ("host:port", "[::1", "host:70000"):
        with pytest.raises(UsageError):
            parse_listen(bad)


def test_toml_file_and_command_line_combine(tmp_path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "photos").mkdir()
    (tmp_path / "tokens").write_text(
        "# who may do what\n"
        "everything-token-0001\n"
        "photos-only-token-0002 photos:ro\n"
    )
    (tmp_path / "rdc.toml").write_text(
        f'listen = "127.0.0.1:9100"\n'
        f'state_dir = "{tmp_path / "state"}"\n'
        f'token_file = "{tmp_path / "tokens"}"\n'
        f"[shares]\n"
        f'docs = "{tmp_path / "docs"}"\n'
        f'photos = {{ path = "{tmp_path / "photos"}", readonly = true }}\n'
    )
    config = load(args(config=str(tmp_path / "rdc.toml"), listen="127.0.0.1:9200"))
    assert (config.host, config.port) == ("127.0.0.1", 9200)  # the command line wins
    assert config.shares["photos"].readonly and not config.shares["docs"].readonly
    everything = config.tokens.check("everything-token-0001")
    photos = config.tokens.check("photos-only-token-0002")
    assert everything is not None and everything.mode(config.shares["docs"]) == "rw"
    assert photos.mode(config.shares["docs"]) is None
    assert photos.mode(config.shares["photos"]) == "ro"
    assert config.tokens.check("everything-token-0002") is None
    assert config.tokens.check("") is None


def test_bad_settings_are_usage_errors(tmp_path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "short").write_text("short\n")
    (tmp_path / "bad-grant").write_text("a-long-enough-token-1 nosuchshare\n")
    share = f"d={tmp_path / 'd'}"
    cases = [
        args(),  # no shares
        args(share=[share]),  # no token file
        args(share=[share], token_file=str(tmp_path / "short"), state_dir=str(tmp_path)),
        args(share=[share], token_file=str(tmp_path / "bad-grant"), state_dir=str(tmp_path)),
        args(share=["d"], token_file=str(tmp_path / "short")),  # NAME=PATH
        args(share=[f"x={tmp_path / 'missing'}"]),
        args(config=str(tmp_path / "missing.toml")),
    ]
    for case in cases:
        with pytest.raises(UsageError):
            load(case)


def test_the_state_directory_must_not_be_inside_a_share(tmp_path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "tokens").write_text("a-long-enough-token-1\n")
    with pytest.raises(UsageError, match="state directory"):
        load(args(share=[f"d={tmp_path / 'd'}"], token_file=str(tmp_path / "tokens"),
                  state_dir=str(tmp_path / "d" / "state")))


def test_share_rights_default_to_the_share(tmp_path) -> None:
    from rdc_server.shares import Rights

    ro = Share("ro", str(tmp_path), readonly=True)
    rw = Share("rw", str(tmp_path))
    assert Rights().mode(ro) == "ro" and Rights().mode(rw) == "rw"
    assert Rights({"rw": "rw"}).mode(ro) is None
    assert Rights({"ro": "rw"}).mode(ro) == "ro"  # a token cannot lift a share's read-only
