"""Immutable records: frozen, slotted dataclasses at the price of plain ones.

A frozen dataclass sets each field through ``object.__setattr__``: making one with seven
fields took 1.5 us against 0.3 us for a plain slotted one, and rdc makes several per file
on each side (offers, expectations, decisions, pieces, events). Its class also costs
three more generated functions at import (``__setattr__``, ``__delattr__``,
``__hash__``), about a fifth of ``rdc.wire.messages``' import time.

So `record` makes a plain slotted dataclass with the same equality and the same hash a
frozen one has (``unsafe_hash``: the fields' hash), and tells type checkers it is frozen
(``dataclass_transform``). With ``RDC_CHECK_RECORDS=1`` (the test suite sets it, and its
servers and clients inherit it) records are truly frozen dataclasses, so an assignment to
one anywhere under test raises ``FrozenInstanceError``, as an ``assert`` catches what
production does not pay to check.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
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
        return dataclass(slots=True, kw_only=kw_only, unsafe_hash=True)(c)

    return make if cls is None else make(cls)
