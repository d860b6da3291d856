"""Scrubbing: every share read again against its index on a schedule (``--scrub-every``,
``scrub_every`` in the config), so that bit rot is found while a good copy is still
around, not when a restore fails. Each finding is logged and re-indexed (`rdc.local.verify`):
the next push of a good copy repairs it, and two-way clients repair it from theirs.

A scrub takes each share's lock as a write would: connections to that share wait for it
(a pull's own reads do too). One share at a time; the first scrub starts one interval
after the daemon did.
"""

from __future__ import annotations

import logging
import re

import trio

from rdc.errors import RdcError, UsageError
from rdc.local.paths import displayable
from rdc.local.verify import CHANGED, verify_tree
from rdc_server.shares import Registry

log = logging.getLogger("rdc.serve")
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_interval(text: object) -> float:
    """``90``, ``30s``, ``10m``, ``12h``, ``7d``, ``2w``: seconds between scrubs."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", str(text))
    seconds = float(found.group(1)) * UNITS[found.group(2) or "s"] if found else 0.0
    if seconds < 1:
        raise UsageError(message=f"scrub interval {text!r}: give a number of seconds of at "
                         "least 1, or a duration like 30m, 12h, 7d")
    return seconds


async def scrub_forever(registry: Registry, every: float) -> None:
    """Scrub every share, then again ``every`` seconds later, until cancelled."""
    while True:
        await trio.sleep(every)
        for name in sorted(registry.shares):
            await scrub_share(registry, name)


async def scrub_share(registry: Registry, name: str) -> int:
    """Read share ``name`` again against its index; log what was found. Returns the
    number of mismatches."""
    share = registry.shares[name]
    try:
        directory = await trio.to_thread.run_sync(registry.acquire, share, "", False)
    except (RdcError, OSError) as exc:
        log.warning("scrub %s: cannot open the share: %s", name, exc)
        return 0
    try:
        async with directory.lock:
            report = await trio.to_thread.run_sync(verify_tree, directory.replica)
    except OSError as exc:
        log.warning("scrub %s: %s", name, exc)
        return 0
    finally:
        registry.release(directory)
    for finding in report.findings:
        log.warning("scrub %s: %s: %s (bit rot?); re-indexed", name,
                    displayable(finding.path), CHANGED)
    for path, reason in report.errors[:20]:
        log.warning("scrub %s: cannot read %s: %s", name, displayable(path), reason)
    log.info("scrub %s: %d files, %d bytes read again, %d mismatched", name, report.files,
             report.bytes, len(report.findings))
    if report.findings:
        registry.bump(name)  # watching clients look again (and repair from their copies)
    return len(report.findings)
