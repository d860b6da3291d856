"""rdc.records: frozen under test; outside, plain slotted dataclasses that compare, hash
and print as the frozen ones do."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap

import pytest

from rdc import records
from rdc.wire import messages as m


def test_records_are_frozen_under_test() -> None:
    offer = m.FileOffer("a/b", 1, b"r" * 32, 0, None, 0o644, 5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        offer.size = 2  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.Done(ok=True).ok = False  # type: ignore[misc]
    assert records.CHECKED


UNCHECKED = textwrap.dedent("""
    import dataclasses
    from rdc import records
    from rdc.wire import messages as m
    assert not records.CHECKED

    @records.record
    class Pair:
        a: int
        b: bytes = b""

    @dataclasses.dataclass(frozen=True, slots=True)
    class Frozen:
        a: int
        b: bytes = b""

    one, same, other = Pair(1, b"x"), Pair(1, b"x"), Pair(2)
    assert one == same and one != other and len({one, same, other}) == 2
    assert hash(one) == hash(Frozen(1, b"x")) and repr(one) == "Pair(a=1, b=b'x')"
    assert dataclasses.replace(one, a=3) == Pair(3, b"x") and not hasattr(one, "__dict__")
    one.a = 5  # unchecked: no frozen __setattr__ in the way (what makes it cheap)
    assert one.a == 5

    @records.record
    class One:
        a: int

    @dataclasses.dataclass(frozen=True, slots=True)
    class FrozenOne:
        a: int

    @records.record
    class Empty:
        pass

    @records.record
    class Hidden:
        a: int
        b: int = dataclasses.field(default=0, compare=False, repr=False)

    assert One(4) == One(4) and One(4) != One(5) and One(4) != FrozenOne(4)
    assert hash(One(4)) == hash(FrozenOne(4)) and repr(One(4)) == "One(a=4)"
    assert Empty() == Empty() and hash(Empty()) == hash(()) and repr(Empty()) == "Empty()"
    assert Hidden(1, 2) == Hidden(1, 3) and hash(Hidden(1, 2)) == hash(Hidden(1, 3))
    assert repr(Hidden(1, 2)) == "Hidden(a=1)" and Hidden(1, 2) != Hidden(2, 2)
    assert Pair.__eq__.__qualname__ == "Pair.__eq__"

    offer = m.FileOffer("a/b", 1, b"r" * 32, 0, None, 0o644, 5)
    assert m.decode(m.encode(m.Offers(files=[offer]), 7)) == (7, m.Offers(files=[offer]))
    print("ok")
""")


def test_outside_the_suite_records_compare_hash_and_travel_as_frozen_ones() -> None:
    env = dict(os.environ, RDC_CHECK_RECORDS="0")
    done = subprocess.run([sys.executable, "-c", UNCHECKED], capture_output=True, text=True,
                          env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
