"""Bookkeeping modules stay importable without torch (STYLE habit 5)."""

from __future__ import annotations

import subprocess
import sys

CODE = """
import sys
import bucketserve.engine.block_manager, bucketserve.engine.sequence
import bucketserve.engine.sampling_params
assert "torch" not in sys.modules, "torch was imported"
"""


def test_block_manager_and_sequence_import_no_torch():
    subprocess.run([sys.executable, "-c", CODE], check=True)
