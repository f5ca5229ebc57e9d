"""Start a real tritonserver on a rendered run folder, wait until ready, stop it cleanly."""

from __future__ import annotations

import glob
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path

from bucketserve.serving.config import ServeConfig
from bucketserve.serving.repository import render
from bucketserve.serving.triton_env import assemble_backends, find_triton, server_env


def prepare_model(spec: str) -> str:
    """Resolve the model to a local directory once, with a progress bar on first conversion."""
    from bucketserve.engine.loader import is_dummy, resolve_model

    local = resolve_model(spec)  # dummy shapes still need SmolLM2's tokenizer on disk
    return spec if is_dummy(spec) else local


class TritonServer:
    """One tritonserver process serving the BucketServe models for a ServeConfig."""

    def __init__(self, cfg: ServeConfig) -> None:
        run_id = cfg.run_id or secrets.token_hex(3)
        self.cfg = replace(
            cfg,
            run_id=run_id,
            run_dir=str(cfg.run_path),
            model_dir=cfg.model_dir or prepare_model(cfg.model),
        )
        self.run_dir = self.cfg.run_path
        self.log_path = self.run_dir / "server.log"
        self.proc: subprocess.Popen | None = None
        self.openai: subprocess.Popen | None = None  # the OpenAI-compatible front end

    @property
    def http_url(self) -> str:
        return f"{self.cfg.host}:{self.cfg.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.cfg.host}:{self.cfg.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.cfg.host}:{self.cfg.metrics_port}/metrics"

    def command(self, repo: Path, backends: Path, server_bin: Path) -> list[str]:
        c = self.cfg
        return [
            str(server_bin),
            f"--model-repository={repo}",
            f"--backend-directory={backends}",
            f"--http-address={c.host}",
            f"--http-port={c.http_port}",
            f"--grpc-address={c.host}",
            f"--grpc-port={c.grpc_port}",
            f"--metrics-address={c.host}",
            f"--metrics-port={c.metrics_port}",
            "--allow-metrics=true",
            "--allow-gpu-metrics=false",
            "--allow-cpu-metrics=true",
            f"--log-verbose={c.log_verbose}",
            "--exit-on-error=true",
            "--exit-timeout-secs=10",
            "--metrics-config=summary_latencies=true",
        ]

    def start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        clean_shm(self.cfg.run_id)
        install = find_triton()
        repo = render(self.cfg, self.run_dir)
        backends = assemble_backends(install, self.run_dir)
        env = server_env(install, {"BUCKETSERVE_RUN_CONFIG": str(self.run_dir / "run_config.json")})
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            self.command(repo, backends, install.server_bin),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        self.openai = start_openai(self.cfg, self.run_dir)

    def wait_ready(self, timeout_s: float = 600.0) -> None:
        """Poll /v2/health/ready; raise with the log's tail if the server exits or times out."""
        deadline = time.monotonic() + timeout_s
        url = f"http://{self.http_url}/v2/health/ready"
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(
                    f"tritonserver exited ({self.proc.returncode}):\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.5)
        raise TimeoutError(f"tritonserver not ready after {timeout_s:.0f}s:\n{self.log_tail()}")

    def log_tail(self, n: int = 60) -> str:
        if not self.log_path.exists():
            return "(no server log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def stop(self, timeout_s: float = 60.0) -> None:
        """SIGINT (Triton drains and unloads models), then SIGKILL the group if it hangs."""
        stop_openai(self.openai)
        if self.proc is None or self.proc.poll() is not None:
            clean_shm(self.cfg.run_id)
            return
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
        try:  # stubs left behind by a server that gave up unloading share its process group
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        clean_shm(self.cfg.run_id)

    def __enter__(self) -> TritonServer:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_openai(cfg: ServeConfig, run_dir: Path) -> subprocess.Popen | None:
    """The OpenAI-compatible front end as its own process (it talks gRPC to Triton)."""
    if not cfg.openai_port:
        return None
    cmd = [sys.executable, "-m", "bucketserve.serving.openai", "--run-config",
           str(run_dir / "run_config.json"), "--host", cfg.host, "--port", str(cfg.openai_port)]  # fmt: skip
    log = open(run_dir / "openai.log", "wb")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)


def stop_openai(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def clean_shm(run_id: str) -> None:
    """Remove shared-memory segments a crashed run of this id may have left behind."""
    for path in glob.glob(f"/dev/shm/bs_{run_id}_*"):
        try:
            os.unlink(path)
        except OSError:
            pass
