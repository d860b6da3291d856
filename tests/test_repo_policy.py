"""`forget`'s keep policy against a model written the other way round: the model puts every
snapshot in its period (day, ISO week, month), takes the newest periods first, and keeps the
newest snapshot of each; the implementation walks snapshots newest first."""

from __future__ import annotations

from datetime import datetime

from hypothesis import given
from hypothesis import strategies as st

from rdc.repo.policy import Policy, keep
from rdc.repo.snapshots import Snapshot

START = 1_700_000_000  # November 2023
SPAN = 3 * 365 * 86400


def snapshot(n: int, seconds: int, host: str) -> Snapshot:
    return Snapshot(seconds * 10**9 + n, host, [b"/data"], [], b"t" * 32, b"m" * 32, 0o755, 0,
                    name=f"{n:064x}")


def model(snaps: list[Snapshot], policy: Policy) -> set[str]:
    kept: set[str] = set()
    for host in {s.host for s in snaps}:
        mine = [s for s in snaps if s.host == host]
        by_age = sorted(mine, key=lambda s: (s.time, s.name))
        kept.update(s.name for s in by_age[max(0, len(by_age) - policy.last) :])
        for count, period in (
            (policy.daily, lambda t: datetime.fromtimestamp(t).date()),
            (policy.weekly, lambda t: datetime.fromtimestamp(t).isocalendar()[:2]),
            (policy.monthly, lambda t: (datetime.fromtimestamp(t).year,
                                        datetime.fromtimestamp(t).month)),
        ):
            newest: dict[object, Snapshot] = {}
            for s in by_age:  # later ones overwrite: the newest of each period remains
                newest[period(s.time / 1e9)] = s
            for key in sorted(newest, reverse=True)[:count]:
                kept.add(newest[key].name)
    return kept


moments = st.lists(
    st.tuples(st.integers(0, SPAN), st.sampled_from(["alpha", "beta"])),
    min_size=0, max_size=60,
)
# Clusters: several snapshots a day, and days in a row, are where the rules differ.
clustered = st.lists(
    st.tuples(st.integers(0, 40), st.integers(0, 86399), st.sampled_from(["alpha", "beta"])),
    max_size=60,
).map(lambda xs: [(d * 86400 + s, h) for d, s, h in xs])
policies = st.builds(Policy, st.integers(0, 5), st.integers(0, 10), st.integers(0, 6),
                     st.integers(0, 8))


@given(st.one_of(moments, clustered), policies)
def test_forget_keeps_exactly_what_the_policy_names(times, policy: Policy) -> None:
    snaps = [snapshot(n, START + t, host) for n, (t, host) in enumerate(times)]
    assert keep(snaps, policy) == model(snaps, policy)


def test_keep_last_keeps_the_newest() -> None:
    snaps = [snapshot(n, START + n * 3600, "alpha") for n in range(10)]
    assert keep(snaps, Policy(last=3)) == {s.name for s in snaps[-3:]}
    assert keep(snaps, Policy()) == set()


def test_keep_daily_keeps_one_per_day() -> None:
    # Three days, four snapshots each: the last of each day is kept.
    snaps = [snapshot(d * 4 + i, START + d * 86400 + i * 600, "alpha")
             for d in range(3) for i in range(4)]
    kept = keep(snaps, Policy(daily=2))
    assert kept == {snaps[-1].name, snaps[7].name}
