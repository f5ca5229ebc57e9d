"""Where the benchmark scripts and their results live: the checkout's perf/ folder.

`make setup` installs the package editable, so this file sits in the checkout's
backends/bucketserve/bench/; installed elsewhere, the current directory stands for the checkout.
"""

from __future__ import annotations

from pathlib import Path

_CHECKOUT = Path(__file__).resolve().parents[3]
ROOT = _CHECKOUT if (_CHECKOUT / "perf").is_dir() else Path.cwd()
PERF = ROOT / "perf"
RESULTS = PERF / "results"
TOOLS = PERF / "tools"  # genai_perf.sh, aiperf.sh and their venvs' names
