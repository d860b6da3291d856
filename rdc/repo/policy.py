"""Which snapshots `forget` keeps: the newest N, and the newest of each of the last N days,
ISO weeks and months that have snapshots (in local time), per group of host and paths.
A snapshot kept by any rule is kept."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from datetime import datetime

from rdc.repo.snapshots import Snapshot, newest_first


@dataclass(frozen=True)
class Policy:
    last: int = 0
    daily: int = 0
    weekly: int = 0
    monthly: int = 0

    def __post_init__(self) -> None:
        if min(self.last, self.daily, self.weekly, self.monthly) < 0:
            raise ValueError("keep counts are not negative")

    @property
    def empty(self) -> bool:
        return not (self.last or self.daily or self.weekly or self.monthly)


def _local(ns: int) -> datetime:
    return datetime.fromtimestamp(ns / 1e9)


def day(ns: int) -> Hashable:
    return _local(ns).date()


def week(ns: int) -> Hashable:
    return _local(ns).isocalendar()[:2]


def month(ns: int) -> Hashable:
    moment = _local(ns)
    return moment.year, moment.month


def _newest_per_period(snaps: list[Snapshot], period: Callable[[int], Hashable], n: int
                       ) -> set[str]:
    kept: set[str] = set()
    seen: set[Hashable] = set()
    for snap in snaps:  # newest first
        if len(seen) >= n:
            break
        key = period(snap.time)
        if key not in seen:
            seen.add(key)
            kept.add(snap.name)
    return kept


def keep(snapshots: list[Snapshot], policy: Policy) -> set[str]:
    """The names of the snapshots ``policy`` keeps."""
    groups: dict[tuple, list[Snapshot]] = {}
    for snap in snapshots:
        groups.setdefault(snap.group(), []).append(snap)
    kept: set[str] = set()
    for members in groups.values():
        ordered = newest_first(members)
        kept.update(s.name for s in ordered[: policy.last])
        kept |= _newest_per_period(ordered, day, policy.daily)
        kept |= _newest_per_period(ordered, week, policy.weekly)
        kept |= _newest_per_period(ordered, month, policy.monthly)
    return kept
