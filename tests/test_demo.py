"""The README's first set-up command ends in fixtures/demo.py: it must run, and the copy it
pulls must be the tree it pushed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

DEMO = Path(__file__).resolve().parent.parent / "fixtures" / "demo.py"


def test_the_demo_pushes_and_pulls_an_identical_copy() -> None:
    done = subprocess.run([sys.executable, str(DEMO)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "the pulled copy is identical" in done.stdout
    assert "Traceback" not in done.stderr
