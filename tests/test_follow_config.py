"""A share's replication and versions settings in the daemon's TOML config; the health
tracker's bookkeeping."""

from __future__ import annotations

import argparse
from pathlib import Path
from types import SimpleNamespace

import pytest

from rdc.errors import UsageError
from rdc.transfer.health import AWAY, BEHIND, FAILING, IN_STEP, SYNCING, Tracker
from rdc.wire import messages as m
from rdc_server.config import load

TOKEN = "a-token-of-enough-length"


def args(**overrides) -> argparse.Namespace:
    base = dict(config=None, listen=None, share=None, share_ro=None, token_file=None,
                state_dir=None, tls_cert=None, tls_key=None)
    return argparse.Namespace(**{**base, **overrides})


def configure(tmp: Path, share_table: str) -> argparse.Namespace:
    (tmp / "mirror").mkdir(exist_ok=True)
    (tmp / "tokens").write_text(f"{TOKEN}\n")
    (tmp / "upstream-token").write_text(f"{TOKEN}\n")
    (tmp / "rdc.toml").write_text(
        f'state_dir = "{tmp / "state"}"\ntoken_file = "{tmp / "tokens"}"\n'
        f'[shares.mirror]\npath = "{tmp / "mirror"}"\n{share_table}'
    )
    return args(config=str(tmp / "rdc.toml"))


def test_a_receive_only_replica_is_read_only_for_clients(tmp_path) -> None:
    config = load(configure(tmp_path, (
        'versions = "staggered:30"\n'
        "[shares.mirror.follow]\n"
        'url = "rdc://primary.lan:9000/docs/sub"\n'
        f'token_file = "{tmp_path / "upstream-token"}"\n'
        'bwlimit = "1M"\n'
    )))
    share, upstream = config.shares["mirror"], config.upstreams["mirror"]
    assert share.readonly and share.replica_of == "rdc://primary.lan:9000/docs/sub"
    assert share.versions is not None and share.versions.max_days == 30
    assert (upstream.url.host, upstream.url.port, upstream.url.share, upstream.url.path) == (
        "primary.lan", 9000, "docs", "sub")
    assert upstream.mode == "receive-only" and upstream.rate == 1 << 20
    assert upstream.token == TOKEN and not upstream.tls


def test_a_two_way_replica_takes_writes(tmp_path) -> None:
    config = load(configure(tmp_path, (
        "[shares.mirror.follow]\n"
        'url = "rdc://primary.lan/docs"\n'
        f'token_file = "{tmp_path / "upstream-token"}"\n'
        'mode = "two-way"\nca_file = "/etc/ca.pem"\n'
    )))
    assert not config.shares["mirror"].readonly
    upstream = config.upstreams["mirror"]
    assert upstream.mode == "two-way" and upstream.tls and upstream.ca_file == "/etc/ca.pem"


@pytest.mark.parametrize(("table", "message"), [
    ("[shares.mirror.follow]\nurl = \"rdc://h/s\"\n", "url and token_file are required"),
    ("[shares.mirror.follow]\nurl = \"http://h/s\"\ntoken_file = \"TF\"\n", "not an rdc://"),
    ("[shares.mirror.follow]\nurl = \"rdc://h/s\"\ntoken_file = \"TF\"\nmode = \"both\"\n",
     "mode must be one of"),
    ("[shares.mirror.follow]\nurl = \"rdc://h/s\"\ntoken_file = \"/nonexistent\"\n",
     "cannot read /nonexistent"),
    ("[shares.mirror.follow]\nurl = \"rdc://h/s\"\ntoken_file = \"TF\"\nspeed = 3\n",
     "unknown setting 'speed'"),
    ("[shares.mirror.follow]\nurl = \"rdc://h/s\"\ntoken_file = \"TF\"\nbwlimit = \"fast\"\n",
     "bad rate"),
    ('versions = "forever"\n', "bad versions policy"),
    ('versions = 3\nversions_dir = "MIRROR/.versions"\n', "must be kept outside it"),
])
def test_bad_replication_settings_are_usage_errors(tmp_path, table: str, message: str) -> None:
    table = table.replace("TF", str(tmp_path / "upstream-token"))
    table = table.replace("MIRROR", str(tmp_path / "mirror"))
    with pytest.raises(UsageError, match=message):
        load(configure(tmp_path, table))


def test_replication_settings_are_known_keys_and_a_typo_is_warned_of(tmp_path) -> None:
    config = load(configure(tmp_path, (
        'versions = 3\ncolour = "blue"\n'
        "[shares.mirror.follow]\n"
        'url = "rdc://primary.lan/docs"\n'
        f'token_file = "{tmp_path / "upstream-token"}"\n'
    )))
    assert [w for w in config.warnings if "share 'mirror'" in w] == [
        f"{tmp_path / 'rdc.toml'}: unknown key 'colour' in share 'mirror' (ignored)"]


def test_a_share_given_on_the_command_line_follows_nothing(tmp_path) -> None:
    namespace = configure(tmp_path, (
        "[shares.mirror.follow]\n"
        'url = "rdc://primary.lan/docs"\n'
        f'token_file = "{tmp_path / "upstream-token"}"\n'
    ))
    namespace.share = [f"mirror={tmp_path / 'mirror'}"]
    config = load(namespace)
    assert not config.upstreams and not config.shares["mirror"].readonly


# ---------------------------------------------------------------- the tracker


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_lag_runs_from_the_first_change_to_the_round_that_ends_in_step() -> None:
    clock = Clock()
    tracker = Tracker("follows", "rdc://a/s", "receive-only", clock=clock)
    assert tracker.state == AWAY and tracker.health().ok_ms is None
    tracker.connected()
    assert tracker.state == SYNCING
    tracker.round_ended(True, 0, 500)
    assert tracker.state == IN_STEP and tracker.lag() == 0
    clock.now += 10
    tracker.change_seen()
    clock.now += 1
    tracker.change_seen()  # a second change does not restart the lag
    assert tracker.state == BEHIND and tracker.health().lag_ms == 1000
    clock.now += 0.5
    tracker.round_ended(False, 2, 300)  # two files failed: still behind
    assert tracker.state == FAILING and tracker.health().pending == 2
    clock.now += 1
    tracker.round_ended(True, 0, 200)
    health = tracker.health()
    assert tracker.state == IN_STEP and health.lag_ms == 0 and health.last_lag_ms == 2500
    assert health.rounds == 3 and health.bytes == 1000 and health.ok_ms == 0
    tracker.disconnected("upstream away")
    clock.now += 3
    health = tracker.health()
    assert health.state == AWAY and health.error == "upstream away"
    assert health.error_ms == 3000 and health.connected_ms is None and health.ok_ms == 3000


def test_a_report_is_read_in_the_receivers_clock() -> None:
    there, here = Clock(), Clock()
    there.now, here.now = 5_000.0, 50.0  # two machines, two clocks
    peer = Tracker("watch", "laptop", "two-way", clock=there)
    peer.connected()
    peer.round_ended(True, 0, 10)
    there.now += 2
    peer.change_seen()
    there.now += 3
    seen = Tracker("watch", "", clock=here)
    seen.absorb(peer.health())
    here.now += 1
    told = seen.health()
    assert told.name == "laptop" and told.mode == "two-way" and told.state == BEHIND
    assert told.ok_ms == 6000 and told.lag_ms == 4000


def test_a_pending_count_follows_the_round_under_way() -> None:
    tracker = Tracker("follows", "u")

    tracker.round_started(SimpleNamespace(pending={"a": 1, "b": 0, "c": 2}))
    assert tracker.health().pending == 2
    assert isinstance(tracker.health(), m.PeerHealth)
