"""The README's first set-up command ends in fixtures/demo.py: it must run, and the copy it
pulls must be the tree it pushed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

DEMO = Path(__file__).resolve().parent.parent / "fixtures" / "demo.py"


def test_the_demo_pushes_and_pulls_an_identical_copy() -> None:
    # As a user runs it: records unchecked (rdc.records), the one end-to-end run so.
    env = {k: v for k, v in os.environ.items() if k != "RDC_CHECK_RECORDS"}
    done = subprocess.run([sys.executable, str(DEMO)], capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "the pulled copy is identical" in done.stdout
    assert "Traceback" not in done.stderr
