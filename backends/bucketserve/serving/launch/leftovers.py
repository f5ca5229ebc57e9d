"""Clean up what a launcher killed with -9 left behind: its processes and its /dev/shm segments.

Triton's own regions stay behind after a stub died too
(docs/platform-notes.md#p17-shared-memory-left-after-a-stub-died).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import psutil

from bucketserve.serving.launch.launcher import clean_shm
from bucketserve.serving.launch.procs import mapped_shm_names

STATE_FILE = "launcher.json"
# Names only our servers create: ours (bs_<run id>_*, Triton's regions included since they carry
# our prefix) and the Python backend's default region name of servers started without it.
SWEPT_PREFIXES = ("bs_", "triton_python_backend_shm_region_")
MIN_AGE_S = 60.0  # a segment between shm_open and mmap is briefly unmapped: never touch new ones


def claim_run_dir(run_dir: Path, run_id: str) -> list[str]:
    """Record this launcher in run_dir; first clean up after a dead predecessor there."""
    notes = []
    state = run_dir / STATE_FILE
    if state.exists():
        prev = json.loads(state.read_text())
        if psutil.pid_exists(prev["pid"]) and prev["pid"] != os.getpid():
            raise RuntimeError(
                f"run dir {run_dir} is in use by a running launcher (pid {prev['pid']});"
                " stop it or pass another --run-dir"
            )
        killed = kill_processes_using(run_dir)
        clean_shm(prev["run_id"])
        notes.append(
            f"cleaned up after a launcher that died (pid {prev['pid']}, run {prev['run_id']}):"
            f" {killed} process(es) killed, its shared memory removed"
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    state.write_text(json.dumps({"pid": os.getpid(), "run_id": run_id}))
    return notes


def release_run_dir(run_dir: Path) -> None:
    (run_dir / STATE_FILE).unlink(missing_ok=True)


def kill_processes_using(run_dir: Path) -> int:
    """SIGKILL every process whose command line names run_dir (a dead run's server and stubs)."""
    needle, killed = str(run_dir), 0
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = proc.info["cmdline"] or []
        if proc.pid != os.getpid() and any(needle in arg for arg in cmd):
            try:
                os.kill(proc.pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
    return killed


def sweep_unmapped_shm(shm_dir: Path = Path("/dev/shm")) -> list[str]:
    """Remove our kind of segment when no live process maps its run's segments, and not new.

    A run's `bs_<id>_*` segments go as a group: one still mapped means that run is alive.
    """
    mapped = {run_key(name) for name in mapped_shm_names()}
    now, removed = time.time(), []
    for path in shm_dir.iterdir():
        if not path.name.startswith(SWEPT_PREFIXES) or run_key(path.name) in mapped:
            continue
        try:
            if now - path.stat().st_mtime > MIN_AGE_S:
                path.unlink()
                removed.append(path.name)
        except OSError:
            pass
    return removed


def run_key(name: str) -> str:
    """bs_<run id>_... -> bs_<run id>_; any other name stands for itself."""
    if name.startswith("bs_"):
        return "_".join(name.split("_", 2)[:2]) + "_"
    return name
