"""The daemon's view of replication, per share: its own followers (the share follows an
upstream: `rdc_server.follow`) and the connections that watch it (replicas of it and
``rdc watch`` clients, with what they report). ``rdc status`` reads it; changes of state
go to the log."""

from __future__ import annotations

import logging

import trio

from rdc.transfer.health import WATCHING, Tracker
from rdc.wire import messages as m

log = logging.getLogger("rdc.serve")
SUMMARY_SECONDS = 600.0  # how often the log lists every replica and watcher


class Board:
    """Trackers by share: followers for good, watchers while their connection lasts."""

    def __init__(self) -> None:
        self._followers: dict[str, list[Tracker]] = {}
        self._watchers: dict[str, dict[int, Tracker]] = {}

    def follower(self, share: str, tracker: Tracker) -> None:
        self._followers.setdefault(share, []).append(tracker)

    def watcher(self, share: str, key: int, peer: str) -> Tracker:
        """The tracker of connection ``key`` on ``share`` (made at its first watch or
        report)."""
        watchers = self._watchers.setdefault(share, {})
        tracker = watchers.get(key)
        if tracker is None:
            tracker = watchers[key] = Tracker("watch", "", peer=peer)
            tracker.connected()
            tracker.state = WATCHING
        return tracker

    def reported(self, share: str, key: int, peer: str, told: m.PeerHealth) -> None:
        tracker = self.watcher(share, key, peer)
        before = (tracker.state, tracker.error)
        tracker.absorb(told)
        if (tracker.state, tracker.error) != before:
            log.info("share %s: %s %s (%s) is %s", share, tracker.role, tracker.name or "?",
                     peer, tracker.summary())

    def gone(self, share: str, key: int) -> None:
        tracker = self._watchers.get(share, {}).pop(key, None)
        if tracker is not None and tracker.state != WATCHING:
            log.info("share %s: %s %s (%s) disconnected", share, tracker.role,
                     tracker.name or "?", tracker.peer)

    def summary(self) -> list[str]:
        """One log line per follower and watcher: state, last successful round, lag,
        pending files, last error."""
        lines = []
        for share in sorted({*self._followers, *self._watchers}):
            trackers = [*self._followers.get(share, ()), *self._watchers.get(share, {}).values()]
            for tracker in trackers:
                health = tracker.health()
                ok = "never" if health.ok_ms is None else f"{health.ok_ms / 1000:.0f} s ago"
                lines.append(f"share {share}: {tracker.role} {tracker.name or '?'}"
                             f"{f' ({tracker.peer})' if tracker.peer else ''}: "
                             f"{tracker.summary()}; last in step {ok}")
        return lines

    async def log_summaries(self, every: float = SUMMARY_SECONDS) -> None:
        """Write `summary` to the log every ``every`` seconds, until cancelled."""
        while True:
            await trio.sleep(every)
            for line in self.summary():
                log.info("%s", line)

    def health(self, share: str) -> list[m.PeerHealth]:
        trackers = [*self._followers.get(share, ()), *self._watchers.get(share, {}).values()]
        return [tracker.health() for tracker in trackers]
