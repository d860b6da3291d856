"""How a continuous sync is doing (``rdc status``): one `Tracker` per replica or watcher,
kept in this process's monotonic clock and told as a `PeerHealth` of ages, so that two
machines' clocks never have to agree.

Lag is the age of the oldest change not yet in step: it starts when a change is seen (a
notice from the server, a local event) and ends with the first round after it that ends in
step; that round's lag is kept as ``last_lag``.
"""

from __future__ import annotations

import time
from typing import Any

from rdc.wire.messages import PeerHealth

IN_STEP, SYNCING, BEHIND, AWAY, FAILING, WATCHING = (
    "in step", "syncing", "behind", "away", "failing", "watching")


def _ms(seconds: float) -> int:
    return max(0, int(seconds * 1000))


class Tracker:
    """The health of one replica or watcher; its methods are the events of its loop."""

    def __init__(self, role: str, name: str, mode: str = "", peer: str = "",
                 clock: Any = time.monotonic) -> None:
        self.role = role
        self.name = name
        self.mode = mode
        self.peer = peer
        self.clock = clock
        self.state = WATCHING if role == "watch" else AWAY
        self.connected_at: float | None = None
        self.ok_at: float | None = None
        self.behind_since: float | None = None
        self.last_lag = 0.0
        self.pending = 0
        self.error = ""
        self.error_at: float | None = None
        self.rounds = 0
        self.bytes = 0
        self.round: Any = None  # the round under way (its ``pending`` counts down)

    # ------------------------------------------------------------ events

    def connected(self) -> None:
        self.connected_at = self.clock()
        self.state = SYNCING

    def disconnected(self, error: str) -> None:
        self.connected_at = None
        self.round = None
        self.state = AWAY
        self.failed(error)

    def failed(self, error: str) -> None:
        self.error = error
        self.error_at = self.clock()

    def change_seen(self) -> None:
        """A change that is not in step yet (a notice, an event)."""
        if self.behind_since is None:
            self.behind_since = self.clock()
        if self.state == IN_STEP:
            self.state = BEHIND

    def round_started(self, round_: Any = None) -> None:
        """A round planned its actions (``round_``: its `TwoWay`, whose per-path
        ``pending`` counts what is still to do)."""
        self.state = SYNCING
        self.round = round_

    def round_ended(self, in_step: bool, failures: int, wire_bytes: int) -> None:
        now = self.clock()
        self.rounds += 1
        self.bytes += wire_bytes
        self.round = None
        self.pending = failures
        if in_step and not failures:
            if self.behind_since is not None:
                self.last_lag = now - self.behind_since
            self.behind_since = None
            self.ok_at = now
            self.state = IN_STEP
        else:
            if self.behind_since is None:
                self.behind_since = now
            self.state = FAILING if failures else BEHIND

    # ------------------------------------------------------------ telling

    def pending_now(self) -> int:
        if self.round is not None:
            return sum(1 for n in getattr(self.round, "pending", {}).values() if n)
        return self.pending

    def lag(self) -> float:
        return 0.0 if self.behind_since is None else self.clock() - self.behind_since

    def health(self) -> PeerHealth:
        now = self.clock()

        def age(at: float | None) -> int | None:
            return None if at is None else _ms(now - at)

        return PeerHealth(
            role=self.role, name=self.name, peer=self.peer, mode=self.mode, state=self.state,
            connected_ms=age(self.connected_at), ok_ms=age(self.ok_at),
            lag_ms=_ms(self.lag()), last_lag_ms=_ms(self.last_lag),
            pending=self.pending_now(), error=self.error, error_ms=age(self.error_at),
            rounds=self.rounds, bytes=self.bytes,
        )

    def absorb(self, told: PeerHealth) -> None:
        """What a peer's ``report`` says of itself, turned into this clock (its role and
        name are the peer's; its connection is what this side saw)."""
        now = self.clock()

        def at(ms: int | None) -> float | None:
            return None if ms is None else now - ms / 1000

        self.role = told.role if told.role in ("replica", "watch") else self.role
        self.name, self.mode, self.state = told.name, told.mode, told.state
        self.ok_at, self.error_at = at(told.ok_ms), at(told.error_ms)
        self.behind_since = at(told.lag_ms) if told.lag_ms else None
        self.last_lag = told.last_lag_ms / 1000
        self.pending, self.error = told.pending, told.error
        self.rounds, self.bytes = told.rounds, told.bytes

    def summary(self) -> str:
        """One line for a log."""
        parts = [self.state]
        if self.state == IN_STEP and self.last_lag:
            parts.append(f"last lag {self.last_lag:.2f} s")
        elif self.behind_since is not None:
            parts.append(f"lag {self.lag():.1f} s")
        if self.pending_now():
            parts.append(f"{self.pending_now()} pending")
        if self.error and self.state in (AWAY, FAILING):
            parts.append(f"last error: {self.error}")
        return ", ".join(parts)
