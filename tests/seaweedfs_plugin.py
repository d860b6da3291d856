"""Registers the session fixture `seaweedfs` (from tests/seaweedfs.py) once for the whole
run. Test modules name this module in `pytest_plugins`: a fixture imported into two test
modules would be two fixtures, and start two servers."""

from tests.seaweedfs import seaweedfs

__all__ = ["seaweedfs"]
