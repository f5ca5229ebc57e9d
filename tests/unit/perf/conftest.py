"""Make the flat modules of perf/ importable (they run as scripts from that folder)."""

from __future__ import annotations

import sys
from pathlib import Path

PERF_DIR = Path(__file__).resolve().parents[3] / "perf"
if str(PERF_DIR) not in sys.path:
    sys.path.insert(0, str(PERF_DIR))
