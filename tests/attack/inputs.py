"""What the fuzzer plays: captured sessions of real clients, and inputs made from them.

A `Session` is what one real ``rdc`` connection sent, frame by frame, with the server
message each frame waited for. An `Input` is one connection's worth (or two racing) of
planned frames, each possibly broken (`tests.attack.wire.Breakage`); it is reproducible
from (seed, index) and the sessions, and is also saved whole beside a finding (`dump`,
`load`: zstd-compressed msgpack), so that a reproducer does not depend on the captures of
a later run.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import zstandard

from tests.attack.wire import Breakage

# In a planned message, bytes that the player replaces with the first 8 bytes of the
# content hash the server's ``opened`` gave (what an ``mset`` vector must name to apply).
OPENED_CONTENT = b"\xa5opened\xa5"
# A trigger: the server message (conversation id, type) a frame waits for; the wait also
# ends when that conversation ends, when the connection ends, or after a timeout.
Trigger = tuple[int | None, str]


@dataclass
class Frame:
    """One frame of a captured session, client to server."""

    messages: list[dict[str, Any]]
    squeezed: bool  # the real client compressed it
    trigger: Trigger | None  # the last server message that arrived before it


@dataclass
class Session:
    """One captured connection of a real client: its frames (``frames[0]`` is hello)."""

    name: str
    frames: list[Frame]
    replies: int = 0  # server messages seen (for the capture summary)


@dataclass
class Planned:
    """A frame as the fuzzer will send it: messages (or a raw body), compressed or not,
    broken or not, after waiting for ``trigger``."""

    messages: list[Any]
    squeeze: bool = False
    trigger: Trigger | None = None
    breakage: Breakage | None = None
    raw: bytes | None = None  # a body sent as is, instead of the messages

    def to_wire(self) -> list:
        return [self.messages, self.squeeze, list(self.trigger) if self.trigger else None,
                self.breakage.to_wire() if self.breakage else None, self.raw]

    @classmethod
    def from_wire(cls, item: list) -> Planned:
        messages, squeeze, trigger, breakage, raw = item
        return cls(messages, squeeze, tuple(trigger) if trigger else None,  # type: ignore[arg-type]
                   Breakage.from_wire(breakage) if breakage else None, raw)


@dataclass
class Input:
    """One fuzz input: the frames of one connection, or of two run at once (a race)."""

    seed: int
    index: int
    session: str
    level: str
    connections: list[list[Planned]]
    notes: list[str] = field(default_factory=list)  # the mutations, for people
    respond: bool = False  # answer the server's wants of known offers from their content
    respond_mutation: float = 0.0  # chance that an answer is mutated
    hold: float = 0.0  # seconds to stay connected after the last frame

    @property
    def label(self) -> str:
        return f"seed {self.seed} index {self.index} ({self.session}, {self.level})"

    def describe(self) -> str:
        return f"{self.label}: " + "; ".join(self.notes)


def planned_from(session: Session) -> list[Planned]:
    """The session's frames as planned frames (deep copies, ready to mutate)."""
    return [Planned(copy.deepcopy(f.messages), f.squeezed, f.trigger) for f in session.frames]


def dump(inp: Input, path: Path) -> None:
    record = {
        "seed": inp.seed, "index": inp.index, "session": inp.session, "level": inp.level,
        "notes": inp.notes, "respond": inp.respond, "respond_mutation": inp.respond_mutation,
        "hold": inp.hold, "connections": [[p.to_wire() for p in c] for c in inp.connections],
    }
    path.write_bytes(zstandard.ZstdCompressor(level=3).compress(
        msgpack.packb(record, use_bin_type=True)))


def load(path: Path) -> Input:
    data = zstandard.ZstdDecompressor().decompress(path.read_bytes(), max_output_size=1 << 30)
    record = msgpack.unpackb(data, raw=False, strict_map_key=False)
    return Input(
        record["seed"], record["index"], record["session"], record["level"],
        [[Planned.from_wire(p) for p in c] for c in record["connections"]],
        record["notes"], record["respond"], record["respond_mutation"], record["hold"],
    )


def dump_sessions(sessions: list[Session], path: Path) -> None:
    """The captures, for looking at (and for ``bench/fuzz.py --sessions``)."""
    record = [[s.name, s.replies, [[f.messages, f.squeezed, list(f.trigger) if f.trigger
                                    else None] for f in s.frames]] for s in sessions]
    path.write_bytes(msgpack.packb(record, use_bin_type=True))


def load_sessions(path: Path) -> list[Session]:
    record = msgpack.unpackb(path.read_bytes(), raw=False, strict_map_key=False)
    return [Session(name, [Frame(m, sq, tuple(t) if t else None)  # type: ignore[arg-type]
                           for m, sq, t in frames], replies)
            for name, replies, frames in record]
