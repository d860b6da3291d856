"""Directories of a tree held open by descriptor, a few at a time, each reached from the
tree's root without following a symlink (`SafeRoot.subroot`, from its parent when that is
held): a file is opened or made relative to its parent's descriptor instead of walking its
whole path again, which on a deep tree is most of the system calls."""

from __future__ import annotations

from collections import OrderedDict

from rdc.local.fs import SafeRoot
from rdc.local.paths import name as leaf_name
from rdc.local.paths import parent

HELD = 32


class HeldDirs:
    def __init__(self, fs: SafeRoot) -> None:
        self.fs = fs
        self.held: OrderedDict[str, SafeRoot] = OrderedDict()

    def get(self, rel: str) -> SafeRoot:
        """Directory ``rel`` ("" for the root) as a `SafeRoot` of its own (borrowed: valid
        until this object closes it)."""
        held = self.held.get(rel)
        if held is not None:
            self.held.move_to_end(rel)
            return held
        held = self.held[rel] = (self.fs.subroot(rel) if not rel
                                 else self.get(parent(rel)).subroot(leaf_name(rel)))
        while len(self.held) > HELD:
            self.held.popitem(last=False)[1].close()
        return held

    def close(self) -> None:
        while self.held:
            self.held.popitem()[1].close()
