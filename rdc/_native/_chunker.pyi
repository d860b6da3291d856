"""Stub for the C chunker (rdc/_native/_chunker.c); contract in chunker_impl.h."""

from typing_extensions import Buffer

class Scanner:
    """Resumable winnowing scanner over one stream.

    ``path`` picks a code path (one of `paths()`; default: `default_path()`) and
    ``sparse_lead`` the sparse rolling threshold (None: automatic, -1: off, 0..255: forced);
    both are for tests and benchmarks, and neither changes a cut.
    """

    def __init__(
        self,
        window: int,
        min_size: int,
        max_size: int,
        filter: bool = True,
        *,
        path: str | None = None,
        sparse_lead: int | None = None,
    ) -> None: ...
    def scan(self, data: Buffer, base: int, final: bool) -> list[int]:
        """New cuts (stream offsets) decided by ``data`` = stream bytes from ``base``, which
        must not be past the last cut. ``final``: the stream ends with this data."""
    @property
    def last_cut(self) -> int: ...
    @property
    def path(self) -> str: ...
    @property
    def ext_evaluations(self) -> int: ...
    @property
    def positions(self) -> int:
        """Leads computed (a window rolled again counts twice)."""
    @property
    def sparse_windows(self) -> int:
        """Windows decided from the sparse roll."""
    @property
    def dense_windows(self) -> int:
        """Windows decided from stored leads."""
    @property
    def rerolled(self) -> int:
        """Sparse windows without a small lead, rolled again in full."""

def lead(window: Buffer, shift: int) -> int: ...
def ext(window: Buffer, *, path: str | None = None) -> int: ...
def gear_table() -> tuple[int, ...]: ...
def paths() -> list[str]:
    """The code paths this CPU can run, slowest first ("portable", "sse2", "avx2")."""

def default_path() -> str:
    """The path a Scanner takes when given none: $RDC_CHUNKER_PATH, else the fastest."""
