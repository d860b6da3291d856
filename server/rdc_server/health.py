"""The daemon's view of replication, per share: its own followers (the share follows an
upstream: `rdc_server.follow`) and the connections that watch it (replicas of it and
``rdc watch`` clients, with what they report). ``rdc status`` reads it; changes of state
go to the log."""

from __future__ import annotations

import logging

from rdc.transfer.health import WATCHING, Tracker
from rdc.wire import messages as m

log = logging.getLogger("rdc.serve")


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

    def health(self, share: str) -> list[m.PeerHealth]:
        trackers = [*self._followers.get(share, ()), *self._watchers.get(share, {}).values()]
        return [tracker.health() for tracker in trackers]
