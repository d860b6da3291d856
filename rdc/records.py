"""Immutable records: frozen, slotted dataclasses at the price of plain ones.

A frozen dataclass sets each field through ``object.__setattr__``: making one with seven
fields took 1.5 us against 0.3 us for a plain slotted one, and rdc makes several per file
on each side (offers, expectations, decisions, pieces, events). Its class also costs
three more generated functions at import (``__setattr__``, ``__delattr__``,
``__hash__``), about a fifth of ``rdc.wire.messages``' import time.

So `record` makes a plain slotted dataclass with the same equality, hash and repr a
frozen one has, and tells type checkers it is frozen (``dataclass_transform``). Those
three methods come from one ``attrgetter`` of the fields per class instead of being
generated as source and compiled per class: ``dataclasses`` runs an ``exec`` for each
generated method, and rdc imports about a hundred records.

With ``RDC_CHECK_RECORDS=1`` (the test suite sets it, and its servers and clients inherit
it) records are truly frozen dataclasses, so an assignment to one anywhere under test
raises ``FrozenInstanceError``, as an ``assert`` catches what production does not pay to
check.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, fields
from operator import attrgetter
from typing import Any, TypeVar, dataclass_transform, overload

CHECKED = os.environ.get("RDC_CHECK_RECORDS", "") not in ("", "0")

T = TypeVar("T")


@overload
def record(cls: type[T], /) -> type[T]: ...
@overload
def record(*, kw_only: bool = False) -> Callable[[type[T]], type[T]]: ...


@dataclass_transform(frozen_default=True)
def record(cls: Any = None, /, *, kw_only: bool = False) -> Any:
    """``@dataclass(frozen=True, slots=True)``, checked only under ``RDC_CHECK_RECORDS``."""

    def make(c: type[T]) -> type[T]:
        if CHECKED:
            return dataclass(frozen=True, slots=True, kw_only=kw_only)(c)
        made = dataclass(slots=True, kw_only=kw_only, eq=False, repr=False)(c)
        _compare_by_fields(made)
        return made

    return make if cls is None else make(cls)


def _compare_by_fields(cls: type) -> None:
    """Give ``cls`` the ``__eq__``, ``__hash__`` and ``__repr__`` a frozen dataclass has,
    built from one ``attrgetter`` of its fields rather than generated and compiled per
    class (three ``exec`` calls a class: about half of the import time of rdc's records)."""
    compared = [f.name for f in fields(cls) if f.compare]
    shown = [f.name for f in fields(cls) if f.repr]
    if len(compared) > 1:
        key = attrgetter(*compared)  # (a tuple of the fields, as a frozen one hashes)
    else:
        def key(obj: Any) -> tuple:
            return tuple(getattr(obj, name) for name in compared)

    def __eq__(self: Any, other: Any) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return key(self) == key(other)

    def __hash__(self: Any) -> int:
        return hash(key(self))

    def __repr__(self: Any) -> str:
        inner = ", ".join(f"{name}={getattr(self, name)!r}" for name in shown)
        return f"{self.__class__.__qualname__}({inner})"

    for method in (__eq__, __hash__, __repr__):
        method.__qualname__ = f"{cls.__qualname__}.{method.__name__}"
        setattr(cls, method.__name__, method)
