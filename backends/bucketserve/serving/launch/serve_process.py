"""`bucketserve serve` as a child process, for the fault tests and perf/reliability/soak.py.

They need the real thing: signals go to the real launcher, the front and the supervisor run as
in production, and the processes it starts can be found and killed by their command lines.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from bucketserve.serving.launch.ports import free_port, http_ready
from bucketserve.serving.launch.procs import STUB_NAME, stub_instance

__all__ = ["ServeProcess", "free_port"]


class ServeProcess:
    """One launcher on free loopback ports; its run dir names every process it starts."""

    def __init__(self, run_dir: Path, *args: str) -> None:
        self.run_dir = Path(run_dir).resolve()
        self.http_port, self.grpc_port, self.metrics_port = free_port(), free_port(), free_port()
        self.args = [
            *("--http-port", str(self.http_port), "--grpc-port", str(self.grpc_port)),
            *("--metrics-port", str(self.metrics_port), "--run-dir", str(self.run_dir)),
            *("--openai-port", "0"),  # no fixed port: several of these run side by side
            *args,
        ]
        self.log_path = self.run_dir.parent / f"{self.run_dir.name}-launcher.log"
        self.proc: subprocess.Popen | None = None
        self._run_id = ""

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def start(self) -> None:
        cmd = [sys.executable, "-m", "bucketserve.serving.launch.cli", "serve", *self.args]
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)

    def ready(self) -> bool:
        return http_ready(self.http_url, 5)

    def wait_ready(self, timeout_s: float = 600.0) -> float:
        """Seconds until the front says ready; raises if the launcher exits or time runs out."""
        start = time.monotonic()
        while time.monotonic() - start < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"launcher exited ({self.proc.returncode}):\n{self.log_tail()}")
            if self.ready():
                return time.monotonic() - start
            time.sleep(0.5)
        raise TimeoutError(f"not ready after {timeout_s:.0f}s:\n{self.log_tail()}")

    def log_tail(self, n: int = 40) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-n:])

    def processes(self) -> list[psutil.Process]:
        """Every live process of this run but the launcher: tritonserver, stubs, watchdogs."""
        needle, found = str(self.run_dir), []
        launcher = self.proc.pid if self.proc else -1
        for p in psutil.process_iter(["cmdline", "status"]):
            cmd = p.info["cmdline"] or []
            if p.pid == launcher or p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if any(needle in a for a in cmd):
                found.append(p)
        return found

    def server_pid(self) -> int | None:
        for p in self.processes():
            if p.info["cmdline"][0].endswith("tritonserver"):
                return p.pid
        return None

    def stub_pid(self, instance: str) -> int | None:
        """The live stub of `instance` (e.g. decode_0_0), or of the first one under that prefix
        (decode_0 -> decode_0_0_0: per-device models are named decode_<i>)."""
        for p in self.processes():
            cmd = p.info["cmdline"]
            if cmd[0].endswith(STUB_NAME):
                name = stub_instance(cmd)
                if name == instance or name.startswith(instance + "_"):
                    return p.pid
        return None

    def shm_segments(self) -> set[str]:
        """This run's /dev/shm segments (ours and Triton's carry the run id, see launcher.py)."""
        run_id = self.run_id()
        if not run_id:
            return set()
        return {n for n in os.listdir("/dev/shm") if n.startswith(f"bs_{run_id}_")}

    def run_id(self) -> str:
        """Read once while the launcher runs (it removes its state file when it exits)."""
        state = self.run_dir / "launcher.json"
        if not self._run_id and state.exists():
            self._run_id = json.loads(state.read_text())["run_id"]
        return self._run_id

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 120.0) -> float:
        """Signal the launcher, wait for it; seconds it took (SIGKILL if it overran)."""
        if self.proc is None or self.proc.poll() is not None:
            return 0.0
        start = time.monotonic()
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return time.monotonic() - start
