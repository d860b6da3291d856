"""Shared test set-up. The suite runs twice in CI: with the C extension, which must have
loaded, and with RDC_PUREPYTHON=1, where `scaled` shrinks the larger inputs."""

from __future__ import annotations

import os
import signal

# Before rdc is imported, here and in every server and client the tests start: records
# are truly frozen under test (rdc.records).
os.environ["RDC_CHECK_RECORDS"] = "1"

import pytest
from hypothesis import settings

from rdc import _native, records
from rdc.transfer import serving

if not records.CHECKED:
    raise RuntimeError("rdc.records was imported before tests/conftest.py set RDC_CHECK_RECORDS")

# The end-to-end fixture (the real `rdc serve` and `rdc` processes) of tests/test_e2e_*.py.
from .e2e_support import e2e  # noqa: F401

PURE = _native.PURE_PYTHON

settings.register_profile("c", max_examples=200, deadline=None)
settings.register_profile("pure", max_examples=25, deadline=None)
settings.load_profile("pure" if PURE else "c")


def scaled(c_size: int, pure_size: int) -> int:
    """An input size: the full one with the C extension, a smaller one in the pure run."""
    return pure_size if PURE else c_size


def pytest_report_header(config: pytest.Config) -> str:
    return f"rdc chunker implementation: {_native.IMPLEMENTATION}"


def pytest_sessionstart(session: pytest.Session) -> None:
    if not PURE and _native.IMPLEMENTATION != "c":  # pragma: no cover
        raise pytest.UsageError("the C extension did not load; refusing to test the fallback")
    # A shell starts a background job (`pytest &`, a CI script's `&`) with SIGINT ignored,
    # and children inherit that: the tests that press Ctrl-C on `rdc` would see it ignored,
    # as it should be in such a job. A handler here is reset to the default in children.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How many batches and single-file exchanges the server served: pushed batches
    (``batches``) and files (``single``), pulled batches (``gets``) and files (``alone``:
    the offers it made for a ``get``)."""
    counts = {"batches": 0, "single": 0, "gets": 0, "alone": 0}
    real_offers, real_file, real_gets = (serving.receive_offers, serving.receive_file,
                                         serving.serve_gets)
    real_offer = serving.make_offer

    async def offers(*args):
        counts["batches"] += 1
        return await real_offers(*args)

    async def single(*args):
        counts["single"] += 1
        return await real_file(*args)

    async def gets(*args):
        counts["gets"] += 1
        return await real_gets(*args)

    def alone(*args, **kwargs):
        counts["alone"] += 1
        return real_offer(*args, **kwargs)

    monkeypatch.setattr(serving, "receive_offers", offers)
    monkeypatch.setattr(serving, "make_offer", alone)
    monkeypatch.setattr(serving, "receive_file", single)
    monkeypatch.setattr(serving, "serve_gets", gets)
    return counts


@pytest.fixture
def fixtures_dir() -> str:
    return os.path.join(os.path.dirname(__file__), os.pardir, "fixtures")
