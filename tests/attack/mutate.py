"""The seeded mutator: (seed, index) and the captured sessions make one `Input`, always the
same one.

Three levels, as an attacker would work: *frame* (the 4-byte header, the compressed flag,
truncation, zstd frames whose stated size lies, bombs, broken msgpack), *message* (each
field: other types, 0, -1, 2**63, 2**64-1, huge lists, long, non-UTF-8, ``..``, absolute and
temporary-name paths, missing and extra keys, a wrong ``t``), and *sequence* (frames and
messages dropped, duplicated, reordered; ids replayed, 0 or huge; requests before open, two
opens, hello again; waits removed; a flood of large messages into a conversation that
reads nothing; a second connection racing the first).
"""

from __future__ import annotations

import copy
import functools
import random
from collections.abc import Callable
from typing import Any

import msgpack

from rdc.content.signature import FileSignature, signature_of_bytes
from rdc.wire import messages as wire_messages
from rdc.wire.codec import MAX_FRAME, MAX_PIECE
from tests.attack.inputs import OPENED_CONTENT, Input, Planned, Session, planned_from
from tests.attack.values import INTS, STRINGS, mutate_value, pick_path
from tests.attack.wire import Breakage

LEVELS = ("frame", "message", "sequence")
WEIGHTS = (2, 5, 3)
# The protocol's own vocabulary, read from rdc.wire.messages as it is when the run starts
# (and a few words it does not have: "mode" is the op protocol 2 retired).
REQUESTS = {cls.TYPE for cls in vars(wire_messages).values() if isinstance(cls, type)
            and issubclass(cls, wire_messages.Message) and cls.REQUEST}
OPS = [*wire_messages.Op.KINDS, "mode", "chown", ""]
WANT_KINDS = [*wire_messages.KINDS["want"], "all", ""]
ANSWERS = {"lists", "data"}  # what a pushing client sends for the server's wants/verdicts
OFFERS = ("offer", "offers")  # requests whose answers the player can make itself
RAW_BODIES = [
    b"", b"\xc1", b"\x80", b"\x90", b"\x91\xc0", b"\x91\x80", b"\x91\x81\xa1t\xc0",
    b"\x91" * 100_000 + b"\xc0", b"\x91" + b"\x81\xa1t" * 50_000 + b"\xa1x",
    b"\xdd\xff\xff\xff\xff", b"\x91\xdb\xff\xff\xff\xff", b"\x91\xc6\x7f\xff\xff\xff",
    b"\x91\xd4\x01\x00", b"\x91\x81\x01\x02", b"\x91\x81\xc0\xc0", b"\x92\x81\xa1t\xa4ping\xc0",
    b"\x91\x81\xa1t\xa4ping\x00",
]


def generate(seed: int, index: int, sessions: list[Session],
             levels: tuple[str, ...] = LEVELS) -> Input:
    """Input number ``index`` of the run with ``seed``; level ``replay`` plays a session
    as captured (the reference a run's rate is compared with, and a check of the harness:
    real sessions find nothing on a sound server)."""
    rng = random.Random(f"rdc-fuzz/{seed}/{index}")
    session = rng.choice(sessions)
    if levels == ("replay",):
        return Input(seed, index, session.name, "replay", [planned_from(session)])
    level = rng.choices(levels, [WEIGHTS[LEVELS.index(x)] for x in levels])[0]
    frames = planned_from(session)
    inp = Input(seed, index, session.name, level, [frames])
    if len(frames) > 3 and rng.random() < 0.7:  # a prefix: shorter, and varied depths
        del frames[min(len(frames) - 1, 3 + int(rng.expovariate(1 / 4))) :]
        inp.notes.append(f"first {len(frames)} frames")
    if any(x.get("t") in OFFERS for x in _messages(frames)) and rng.random() < 0.5:
        strip_answers(frames)
        inp.respond = True
        inp.respond_mutation = rng.choice([0.0, 0.0, 0.05, 0.3])
        inp.notes.append(f"answers wants itself (mutating {inp.respond_mutation:.0%})")
    mutation = {"frame": frame_mutation, "message": message_mutation,
                "sequence": sequence_mutation}[level]
    for _ in range(min(4, 1 + int(rng.expovariate(1.2)))):
        mutation(rng, inp, sessions)
    return inp


def _messages(frames: list[Planned]) -> list[dict[str, Any]]:
    return [m for f in frames for m in f.messages if isinstance(m, dict)]


def strip_answers(frames: list[Planned]) -> None:
    """Leave out what the client sent for the server's wants (the player answers them);
    frames left empty go."""
    for frame in frames:
        frame.messages = [m for m in frame.messages
                          if not (isinstance(m, dict) and m.get("t") in ANSWERS)]
    frames[:] = [f for f in frames if f.messages]


def seen_paths(frames: list[Planned]) -> list[bytes]:
    out = []
    for message in _messages(frames):
        for key in ("path", "paths"):
            value = message.get(key)
            if isinstance(value, bytes) and value:
                out.append(value)
            elif isinstance(value, list):
                out += [p for p in value if isinstance(p, bytes) and p]
    return out[:200]


# ---------------------------------------------------------------- frames


def frame_mutation(rng: random.Random, inp: Input, sessions: list[Session]) -> None:
    frames = inp.connections[0]
    at = 0 if rng.random() < 0.3 else rng.randrange(len(frames))
    frame = frames[at]
    size = len(msgpack.packb(frame.messages, use_bin_type=True))
    kind = rng.choice(["length", "flag", "truncate", "plain_size", "no_plain_size",
                       "unflushed", "restart", "new_frame", "wide_window", "bomb", "flip",
                       "garbage", "raw", "squeeze", "split"])
    if kind == "raw":
        frame.raw = rng.choice(RAW_BODIES)
        inp.notes.append(f"frame {at}: raw body {frame.raw[:12]!r}... ({len(frame.raw)} B)")
        return
    if kind == "squeeze":
        frame.squeeze = not frame.squeeze
        inp.notes.append(f"frame {at}: compressed={frame.squeeze}")
        return
    if kind == "split":  # every message in a frame of its own
        frames[at : at + 1] = [Planned([m], frame.squeeze, frame.trigger if i == 0 else None)
                               for i, m in enumerate(frame.messages)]
        inp.notes.append(f"frame {at}: split into {len(frame.messages)}")
        return
    value, extra = 0, None
    if kind == "length":
        value = rng.choice([0, 1, size - 1, size + 1, MAX_FRAME, MAX_FRAME + 1, 2**31 - 1])
    elif kind == "truncate":
        value = rng.randrange(1, size + 4)
    elif kind == "plain_size":
        value = rng.choice([0, 1, size - 1, size + 1, MAX_FRAME, MAX_FRAME + 1, 2**32 - 1])
    elif kind == "new_frame":
        value = rng.choice([1, 3, 6, 19])
    elif kind == "wide_window":
        value = rng.choice([23, 24, 27])  # 8 MiB (the most allowed), 16 MiB, 128 MiB
    elif kind == "bomb":
        value = rng.choice([MAX_FRAME - 64, MAX_FRAME + 1000, 16 * MAX_FRAME])
        extra = rng.choice([None, MAX_FRAME, 100])
    elif kind == "flip":
        extra = [[rng.randrange(1 << 20), 1 << rng.randrange(8)]
                 for _ in range(rng.randrange(1, 4))]
    elif kind == "garbage":
        extra = rng.randbytes(rng.randrange(1, 16))
    frame.breakage = Breakage(kind, value, extra)
    inp.notes.append(f"frame {at}: {kind} {value} {extra!r:.40}")


# ---------------------------------------------------------------- messages


def message_mutation(rng: random.Random, inp: Input, sessions: list[Session]) -> None:
    frames = inp.connections[0]
    at = 0 if rng.random() < 0.05 or len(frames) == 1 else rng.randrange(1, len(frames))
    frame = frames[at]
    if not frame.messages:
        return
    which = rng.randrange(len(frame.messages))
    message = frame.messages[which]
    if not isinstance(message, dict):
        return
    paths = seen_paths(frames)
    how = rng.choices(["field", "drop", "extra", "t", "whole"], [12, 2, 2, 2, 1])[0]
    keys = [k for k in message if k != "t"]
    if how == "field" and keys:
        key = rng.choice(keys)
        message[key] = field_value(rng, message, key, paths)
        note = f"{key}={_show(message[key])}"
    elif how == "drop" and keys:
        key = rng.choice(keys)
        del message[key]
        note = f"without {key}"
    elif how == "extra":
        key = rng.choice(["x", "id", "more", "end", "ok", "k", "z" * 300])
        message[key] = mutate_value(rng, None, key, paths)
        note = f"extra {key}={_show(message[key])}"
    elif how == "t":
        message["t"] = rng.choice([*wire_messages.TYPES, "gimme", "", "OPEN", "open\0"])
        note = f"t={message['t']!r}"
    else:
        frame.messages[which] = rng.choice([None, 0, "open", b"open", [message], []])
        note = f"replaced by {frame.messages[which]!r}"
    inp.notes.append(f"frame {at} message {which} ({message.get('t')!r}): {note}")


def field_value(rng: random.Random, message: dict, key: str, paths: list[bytes]) -> Any:
    value = message[key]
    t = message.get("t")
    if key == "id" and rng.random() < 0.5:
        bent = value + 1000 if type(value) is int else 1000
        return rng.choice([0, 1, 2, 2**32 - 1, 2**32, -1, value, bent])
    if key == "k" and t == "want" and rng.random() < 0.5:
        return rng.choice(WANT_KINDS)
    if key == "ops" and isinstance(value, list) and value and rng.random() < 0.5:
        return mutate_op(rng, value, paths)
    if key == "share" and rng.random() < 0.5:
        return rng.choice(["s", "r", "nope", "", "s/x"])
    if key == "token" and rng.random() < 0.5:
        from tests.attack.world import RO_TOKEN

        return rng.choice([RO_TOKEN, "", "wrong-token-0123456789", value + "x"])
    if key in ("mtime", "mode", "size", "depth", "seq", "hb", "n") and rng.random() < 0.6:
        return rng.choice(INTS)
    return mutate_value(rng, value, key, paths)


def mutate_op(rng: random.Random, ops: list, paths: list[bytes]) -> list:
    """An op list with one op bent: another op name, path, argument or expectation, or a
    dangerous op that the capture did not have."""
    out = copy.deepcopy(ops)
    at = rng.randrange(len(out))
    op = out[at] if isinstance(out[at], list) and len(out[at]) == 4 else ["meta", b"x",
                                                                            [0, 0], None]
    part = rng.randrange(5)
    if part == 0:
        op[0] = rng.choice(OPS)
    elif part == 1:
        op[1] = pick_path(rng, paths)
    elif part == 2:
        op[2] = rng.choice([None, 0, 0o777, 0o4777, 2**64 - 1, -1, b"/etc", b"../x",
                            b"x" * 5000, [0o644, 2**64 - 1], [0o644, -(2**63)],
                            [0o644, 2**63 - 1], [0o644, 10**19], [0o7777, 0], [1 << 20, 0],
                            [0o644], [0o644, 0, 0], "x", True])
    elif part == 3:
        op[3] = rng.choice([None, [], ["f", b"\0" * 8], ["d", b""], ["l", b"/etc"],
                            ["x", b""], ["f"], "f", 0])
    else:
        path = pick_path(rng, paths)
        op = rng.choice([["mode", path, 0o777, None], ["meta", path, [0o666, 2**64 - 1], None],
                         ["meta", path, [0o600, 2**63 - 1], None], ["rm", path, None, None],
                         ["meta", path, [0o4777, 10**18], None], ["link", path, b"/", None],
                         ["mv", path, b"moved", None], ["mkdir", path, 0o7777, None],
                         ["meta", b"", [0o700, 0], None]])
    out[at] = op
    return out


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:50]}... ({len(text)} chars)"


# ---------------------------------------------------------------- sequences


def sequence_mutation(rng: random.Random, inp: Input, sessions: list[Session]) -> None:
    frames = inp.connections[0]
    how = rng.choices(list(SEQUENCE), [SEQUENCE_WEIGHTS.get(k, 1) for k in SEQUENCE])[0]
    note = SEQUENCE[how](rng, inp, frames, sessions)
    if note:
        inp.notes.append(f"{how}: {note}")


def _later(rng: random.Random, frames: list[Planned]) -> int:
    return rng.randrange(1, len(frames)) if len(frames) > 1 else 0


def drop(rng: random.Random, inp: Input, frames: list[Planned], _: list) -> str:
    at = _later(rng, frames)
    if rng.random() < 0.5 and len(frames[at].messages) > 1:
        frames[at].messages.pop(rng.randrange(len(frames[at].messages)))
        return f"a message of frame {at}"
    del frames[at]
    return f"frame {at}"


def duplicate(rng: random.Random, inp: Input, frames: list[Planned], _: list) -> str:
    at = _later(rng, frames)
    if rng.random() < 0.5 and frames[at].messages:
        frames[at].messages.append(copy.deepcopy(rng.choice(frames[at].messages)))
        return f"a message of frame {at}"
    frames.insert(at + 1, copy.deepcopy(frames[at]))
    return f"frame {at}"


def reorder(rng: random.Random, inp: Input, frames: list[Planned], _: list) -> str:
    if len(frames) < 3:
        return ""
    a = rng.randrange(1, len(frames) - 1)
    frames[a], frames[a + 1] = frames[a + 1], frames[a]
    if rng.random() < 0.5:
        frames[a].trigger = frames[a + 1].trigger = None
    return f"frames {a} and {a + 1} swapped"


def ids(rng: random.Random, inp: Input, frames: list[Planned], _: list) -> str:
    requests = [m for m in _messages(frames) if m.get("t") in REQUESTS and "id" in m]
    if not requests:
        return ""
    message = rng.choice(requests)
    used = sorted({m["id"] for m in requests if isinstance(m["id"], int)})
    message["id"] = rng.choice([0, 0, rng.choice(used), max(used) + 1, 2**32 - 1])
    return f"{message['t']} gets id {message['id']}"


def before_open(rng: random.Random, inp: Input, frames: list[Planned], _: list) -> str:
    opens = [i for i, f in enumerate(frames) if any(
        isinstance(m, dict) and m.get("t") == "open" for m in f.messages)]
    if not opens or len(frames) <= opens[0] + 1:
        return ""
    if rng.random() < 0.5:
        frames.pop(opens[0])
        return "no open"
    later = frames.pop(rng.randrange(opens[0] + 1, len(frames)))
    later.trigger = None
    frames.insert(opens[0], later)
    return "a later frame before the open"


def open_twice(rng: random.Random, inp: Input, frames: list[Planned], _: list) -> str:
    opens = [m for m in _messages(frames) if m.get("t") in ("open", "hello")]
    if not opens:
        return ""
    again = copy.deepcopy(rng.choice(opens))
    if again.get("t") == "open":
        again["id"] = 10_000 + rng.randrange(100)
        if rng.random() < 0.5:
            again["path"] = pick_path(rng, seen_paths(frames))
    frames.insert(rng.randrange(1, len(frames) + 1), Planned([again]))
    return f"{again['t']} again"


def no_waits(rng: random.Random, inp: Input, frames: list[Planned], _: list) -> str:
    start = rng.randrange(1, max(2, len(frames)))
    for frame in frames[start:]:
        frame.trigger = None
    return f"frames from {start} sent without waiting"


def merge(rng: random.Random, inp: Input, frames: list[Planned], _: list) -> str:
    if len(frames) < 3:
        return ""
    at = rng.randrange(1, len(frames) - 1)
    frames[at].messages += frames.pop(at + 1).messages
    return f"frames {at} and {at + 1} merged"


def ping(rng: random.Random, inp: Input, frames: list[Planned], _: list) -> str:
    at = rng.randrange(len(frames))
    extra = rng.choice([{"t": "ping"}, {"t": "ping", "id": 5}, {"t": "error", "code": "x",
                                                                   "msg": "y"},
                        {"t": "changed", "id": 1, "seq": 1}, {"t": "ping", "x": [1] * 100}])
    frames[at].messages.insert(rng.randrange(len(frames[at].messages) + 1), extra)
    return f"{extra['t']} into frame {at}"


def stranger(rng: random.Random, inp: Input, frames: list[Planned], _: list) -> str:
    """A reply type, or a request, in a conversation the server does not know."""
    t = rng.choice(["want", "lists", "data", "done", "more", "listing", "ok", "oks",
                    "finished", "opened", "welcome"])
    template = next((m for m in _messages(frames) if m.get("t") == t), None)
    message = copy.deepcopy(template) if template else {"t": t}
    message["id"] = rng.choice([0, 3, 999, 2**32 - 1])
    frames.insert(rng.randrange(1, len(frames) + 1), Planned([message]))
    return f"{t} with id {message['id']}"


def flood(rng: random.Random, inp: Input, frames: list[Planned], _: list) -> str:
    """A conversation that reads nothing (watch) stuffed with large messages, each a few
    hundred bytes compressed and 4 MiB once decompressed: memory must stay bounded."""
    opened = next((i for i, f in enumerate(frames) if any(
        isinstance(m, dict) and m.get("t") == "open" for m in f.messages)), None)
    if opened is None or not inp.connections[0][0].messages:
        return ""
    del frames[opened + 1 :]
    wid = 900 + rng.randrange(50)
    frames.append(Planned([{"t": "watch", "id": wid, "seq": 0}], trigger=(1, "opened")))
    piece = b"\0" * min(MAX_PIECE, (MAX_FRAME - 4096) // 4)
    count = rng.choice([4, 8, 16])
    for _ in range(count):
        frames.append(Planned([{"t": "lists", "id": wid, "lists": [[0, piece, piece]] * 2}],
                              squeeze=True))
    inp.hold = 0.5
    return f"{count} messages of 4 MiB into watch {wid}"


def race(rng: random.Random, inp: Input, frames: list[Planned], sessions: list) -> str:
    """A second connection, another captured session lightly bent, at the same time."""
    other = rng.choice(sessions)
    second = planned_from(other)
    if len(second) > 3:
        del second[rng.randrange(3, len(second)) :]
    shadow = Input(inp.seed, inp.index, other.name, "message", [second])
    message_mutation(rng, shadow, sessions)
    inp.connections.append(second)
    return f"with {other.name} ({'; '.join(shadow.notes)})"


# Entries of the share an injected request aims at: the hard link to the outside, links
# out of the share, directories, a private file, the share itself, a non-UTF-8 name.
TARGETS = [b"linked.txt", b"evil", b"evil-secret", b"evil/x", b"link", b"docs", b"data",
           b"data/blob.bin", b"private.txt", b"run.sh", b"empty", b"caf\xe9.txt", b"work",
           b"", b"docs/note-00.md", b"src/rdc", b"nowhere", b"future.txt"]
TIMES = [0, -1, 1, 2**62, 2**63 - 1, -(2**63), 10**19, 2**64 - 1, 16 * 10**18]
MODES = [0, 0o777, 0o7777, 0o4755, 0o2777, 0o1000, 0o10000, 2**64 - 1, -1]
KINDS = ["ops", "ops", "ops", "get", "gets", "list", "offer", "offers", "offers", "mlist",
         "mset", "mset"]


@functools.lru_cache(maxsize=16)
def _signed(data: bytes) -> FileSignature:
    return signature_of_bytes(data)


def _small_file(rng: random.Random, path: bytes) -> list:
    """A file offer of a batch (protocol 2's nine fields), well-formed or with a root that
    lies, with a hostile mode and time."""
    data = rng.choice([b"", b"planted\n", b"x" * 255, b"y" * 3000])
    signature = _signed(data)
    root = signature.root if rng.random() < 0.7 else b"\0" * 32
    expect = rng.choice([None, None, b"", b"\0" * 8])
    return [path, len(data), root, len(signature.tree.levels), signature.sketch,
            rng.choice(MODES), rng.choice(TIMES), expect, data if len(data) < 256 else None]


def injected(rng: random.Random, message_id: int) -> dict[str, Any]:
    """A request the captures do not have, aimed at one of TARGETS with a hostile value."""
    path = rng.choice(TARGETS)
    kind = rng.choice(KINDS)
    if kind == "ops":
        op = rng.choice(OPS[:7])
        arg = {"mkdir": rng.choice(MODES), "mode": rng.choice(MODES),
               "meta": [rng.choice(MODES[:4]), rng.choice(TIMES)],
               "link": rng.choice([b"/", b"..", b"../..", b"/etc/passwd", b"x" * 5000]),
               "mv": rng.choice([b"moved", b"evil/moved", b"..", b"docs/x"])}.get(op)
        expect = rng.choice([None, None, [], ["d", b""], ["f", b"\0" * 8], ["l", b"/"]])
        return {"t": "ops", "id": message_id, "ops": [[op, path, arg, expect]]}
    if kind == "offer":  # a well-formed small file (or one whose root lies)
        f = _small_file(rng, path)
        return {"t": "offer", "id": message_id, "path": path, "size": f[1], "root": f[2],
                "depth": f[3], "sketch": f[4], "mode": f[5], "mtime": f[6],
                **({"data": f[8]} if f[8] is not None else {})}
    if kind == "offers":
        others = [_small_file(rng, rng.choice(TARGETS)) for _ in range(rng.randrange(3))]
        return {"t": "offers", "id": message_id, "files": [_small_file(rng, path), *others]}
    if kind == "get":
        return {"t": "get", "id": message_id, "path": path}
    if kind == "gets":
        return {"t": "gets", "id": message_id,
                "files": [[p, rng.choice([None, b"", b"\0" * 8])]
                          for p in {path, *rng.sample(TARGETS, 2)}]}
    if kind == "mset":  # the opened directory's entries, all to one mode and time
        count = rng.choice([1, 8, 12, 13, 14, 4096])
        times, modes = [rng.choice(TIMES)] * count, [rng.choice(MODES[:4])] * count
        content = rng.choice([OPENED_CONTENT, OPENED_CONTENT, b"", b"\0" * 8])
        return {"t": "mset", "id": message_id, "dirs": [
            [b"" if rng.random() < 0.7 else path, content, rng.random() < 0.3,
             [sorted(set(times)), bytes(count)], [sorted(set(modes)), bytes(count)]]]}
    return {"t": kind, "id": message_id, "paths": [path], "hb": 8,
            **({"meta": True, "sizes": True} if rng.random() < 0.5 else {})}


def inject(rng: random.Random, inp: Input, frames: list[Planned], _: list) -> str:
    """Requests of its own after the open (made writable half the time)."""
    opened = next((i for i, f in enumerate(frames) if any(
        isinstance(m, dict) and m.get("t") == "open" for m in f.messages)), None)
    if opened is None:
        return ""
    opening = next(m for m in frames[opened].messages
                   if isinstance(m, dict) and m.get("t") == "open")
    if rng.random() < 0.5:
        opening["write"] = True
    requests = [injected(rng, 5000 + n) for n in range(rng.randrange(1, 4))]
    frames.insert(opened + 1, Planned(requests, trigger=(opening.get("id"), "opened")))
    return "; ".join(f"{m['t']} {_show(m.get('ops') or m.get('path') or m.get('paths'))}"
                     for m in requests)


SEQUENCE: dict[str, Callable[[random.Random, Input, list[Planned], list], str]] = {
    "drop": drop, "duplicate": duplicate, "reorder": reorder, "ids": ids,
    "before-open": before_open, "twice": open_twice, "no-waits": no_waits, "merge": merge,
    "ping": ping, "stranger": stranger, "flood": flood, "race": race, "inject": inject,
}
SEQUENCE_WEIGHTS = {"inject": 8}
__all__ = ["LEVELS", "STRINGS", "generate"]
