"""Facts about a benchmark run for its report: machine, build, command, host load."""

from __future__ import annotations

import os
import platform
import re
import shlex
import subprocess
import sys
from pathlib import Path

from bucketserve.bench.paths import ROOT

CORPUS = (
    "real English text from the Python standard library's own documentation (pydoc_data "
    "language-reference topics and stdlib docstrings), cut to the drawn length with the served "
    "model's tokenizer (measured lengths within 2 tokens of the draw)."
)


def machine_name() -> str:
    return f"{platform.machine()}-cpu{os.cpu_count()}"


def cpu_model() -> str:
    """The CPU's model name (capacity differs between machines of the same size)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    found = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    return found.group(1).strip() if found else ""


def git_commit() -> str:
    """Short HEAD, with +dirty when tracked files differ from it (the server runs the tree)."""

    def git(*args: str) -> str:
        proc = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return proc.stdout.strip()

    dirty = "+dirty" if git("status", "--porcelain", "--untracked-files=no") else ""
    return (git("rev-parse", "--short", "HEAD") or "unknown") + dirty


def context(a, pre, date: str, num_requests: int, wall_s: float) -> dict:
    """The report's setup facts that do not depend on the workload objects."""
    load = os.getloadavg()
    return {
        "date": date, "machine": machine_name(), "commit": git_commit(),
        "model": "SmolLM2-135M-Instruct",
        "command": "python perf/load/compare.py " + shlex.join(sys.argv[1:]),
        "workload": pre.workload, "profile": pre.profile, "seed": a.seed,
        "num_requests": num_requests, "duration_s": pre.duration_s, "drain_s": pre.drain_s,
        "max_requests": pre.max_requests, "warmup": pre.warmup, "wall_s": wall_s,
        "corpus": CORPUS,
        "host_note": f"{os.cpu_count()} CPUs, shared with other jobs; 1/5/15-min load average "
        f"at the end {load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f} (per-run load in the table). "
        "Single run per point, no confidence intervals: treat small differences as noise.",
    }  # fmt: skip
