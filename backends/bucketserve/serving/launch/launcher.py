"""Start a real tritonserver on a rendered run folder, wait until ready, stop it cleanly."""

from __future__ import annotations

import glob
import os
import secrets
import signal
import subprocess
import time
from dataclasses import replace
from pathlib import Path

from bucketserve.serving.config import ServeConfig
from bucketserve.serving.core.messages import RUN_SECRET_ENV, new_run_secret
from bucketserve.serving.front.allowlist import ADMIN_GROUPS, ADMIN_HEADER, API_KEY_HEADER
from bucketserve.serving.launch.ports import (
    Port,
    check_free,
    http_ready,
    local_host,
    triton_port_error,
)
from bucketserve.serving.launch.procs import (
    RUN_CONFIG_ENV,
    die_with_parent,
    kill_tree,
    reap_children,
    stubs_of,
)
from bucketserve.serving.launch.repository import render
from bucketserve.serving.launch.triton_env import assemble_backends, find_triton, server_env


def prepare_model(spec: str) -> str:
    """Resolve the model to a local directory once, with a progress bar on first conversion."""
    from bucketserve.engine.loader import is_dummy, resolve_model

    local = resolve_model(spec)  # dummy shapes still need SmolLM2's tokenizer on disk
    return spec if is_dummy(spec) else local


class TritonServer:
    """One tritonserver process serving the BucketServe models for a ServeConfig."""

    def __init__(
        self,
        cfg: ServeConfig,
        triton_http_port: int | None = None,
        triton_grpc_port: int | None = None,
    ) -> None:
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
        # behind the front (serving/front) Triton's HTTP listens on an internal loopback port
        self.internal_http = triton_http_port is not None
        self.http_port = cfg.http_port if triton_http_port is None else triton_http_port
        # and its gRPC too, behind the gRPC edge (front/grpc_edge.py): the public --grpc-port
        self.internal_grpc = triton_grpc_port is not None
        self.grpc_port = cfg.grpc_port if triton_grpc_port is None else triton_grpc_port
        # Triton's admin APIs answer only this key: the operator's, else one nobody knows
        self.admin_key = cfg.admin_key or secrets.token_urlsafe(24)

    @property
    def http_url(self) -> str:
        host = "127.0.0.1" if self.internal_http else self.cfg.host
        return f"{host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        """Triton's own gRPC address (behind the edge: the internal one, 127.0.0.1)."""
        host = "127.0.0.1" if self.internal_grpc else local_host(self.cfg.host)
        return f"{host}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.cfg.host}:{self.cfg.metrics_port}/metrics"

    def command(self, repo: Path, backends: Path, server_bin: Path) -> list[str]:
        c = self.cfg
        return [
            str(server_bin),
            f"--model-repository={repo}",
            f"--backend-directory={backends}",
            f"--http-address={self.http_url.rsplit(':', 1)[0]}",
            f"--http-port={self.http_port}",
            f"--grpc-address={'127.0.0.1' if self.internal_grpc else c.host}",
            f"--grpc-port={self.grpc_port}",
            f"--metrics-address={c.host}",
            f"--metrics-port={c.metrics_port}",
            "--allow-metrics=true",
            "--allow-gpu-metrics=false",
            "--allow-cpu-metrics=true",
            f"--log-verbose={c.log_verbose}",
            "--exit-on-error=true",
            "--exit-timeout-secs=10",
            # every config.pbtxt is complete: without this the Python backend first starts a
            # stub per model to ask it to complete its config (~10 s of CPU per server start;
            # docs/platform-notes.md#p36-config-auto-complete-starts-a-stub-per-model)
            "--disable-auto-complete-config",
            "--metrics-config=summary_latencies=true",
            # the backend's own regions carry our run id, so clean_shm finds them after a crash
            # (docs/platform-notes.md#p17-shared-memory-left-after-a-stub-died)
            f"--backend-config=python,shm-region-prefix-name={triton_shm_prefix(c.run_id)}",
            *restricted_apis(c, self.admin_key),
        ]

    def listeners(self) -> list[tuple[str, Port]]:
        """The (host, port) pairs tritonserver binds, with the flags that set the ports."""
        c, loopback = self.cfg, "127.0.0.1"
        if self.internal_http:
            http = (loopback, Port(self.http_port, "the internal HTTP port"))
        else:
            http = (c.host, Port(self.http_port, "--http-port"))
        if self.internal_grpc:
            grpc = (loopback, Port(self.grpc_port, "the internal gRPC port"))
        else:
            grpc = (c.host, Port(self.grpc_port, "--grpc-port"))
        return [http, grpc, (c.host, Port(c.metrics_port, "--metrics-port"))]

    def ports(self) -> list[Port]:
        """The ports tritonserver binds, with the flags that set them."""
        return [port for _, port in self.listeners()]

    def start(self) -> None:
        """Start tritonserver (not yet ready); PortUnavailable now if one of its ports is taken
        (it would find out only after loading every model)."""
        for host, port in self.listeners():
            check_free(host, [port])
        self.run_dir.mkdir(parents=True, exist_ok=True)
        clean_shm(self.cfg.run_id)
        install = find_triton()
        repo = render(self.cfg, self.run_dir)
        backends = assemble_backends(install, self.run_dir)
        env = server_env(install, {
            RUN_CONFIG_ENV: str(self.run_dir / "run_config.json"),
            RUN_SECRET_ENV: new_run_secret(),  # seals the internal messages of this start
        })  # fmt: skip
        if self.log_path.exists():  # a restart keeps the log of the server that died
            self.log_path.replace(self.log_path.with_suffix(".log.prev"))
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            # a killed launcher takes its server with it
            die_with_parent(self.command(repo, backends, install.server_bin)),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )

    def wait_ready(self, timeout_s: float = 600.0) -> None:
        """Poll /v2/health/ready; raise with the log's tail if the server exits or times out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise self.exit_error()
            if self.is_ready():
                return
            time.sleep(0.5)
        raise TimeoutError(f"tritonserver not ready after {timeout_s:.0f}s:\n{self.log_tail()}")

    def is_ready(self) -> bool:
        """One probe of Triton's own /v2/health/ready."""
        return http_ready(self.http_url, 2)

    def exit_error(self) -> RuntimeError:
        """Why tritonserver exited: a port it could not bind (named), else its log's tail."""
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return triton_port_error(text, self.cfg.host, self.ports()) or RuntimeError(
            f"tritonserver exited ({self.proc.returncode}):\n{self.log_tail()}"
        )

    def log_tail(self, n: int = 60) -> str:
        if not self.log_path.exists():
            return "(no server log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def stop(self, timeout_s: float = 60.0) -> None:
        """SIGINT (Triton drains and unloads models), then SIGKILL the group if it hangs."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                pass
        self.kill()

    def kill(self) -> None:
        """SIGKILL the server and every stub it started (also after it crashed), free its shm."""
        if self.proc is not None:
            # a crashed server's stubs live on in its process group (docs/platform-notes.md#p18-orphaned-stubs): always kill it
            stubs = [s.pid for s in stubs_of(self.proc.pid)]
            kill_tree(self.proc.pid, stubs)
            self.proc.wait()
            reap_children()  # stubs re-parented to us (a subreaper) after the server died
        clean_shm(self.cfg.run_id)

    def start_ready(self) -> TritonServer:
        """start() and wait_ready(); stopped again if it never gets ready."""
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __enter__(self) -> TritonServer:
        return self.start_ready()

    def __exit__(self, *exc) -> None:
        self.stop()


def triton_metrics_url(cfg: ServeConfig) -> str:
    """Triton's Prometheus endpoint as a local client reaches it."""
    return f"http://{local_host(cfg.host)}:{cfg.metrics_port}/metrics"


def restricted_apis(cfg: ServeConfig, admin_key: str) -> list[str]:
    """Triton's own ports: its admin API groups need `admin_key` (HTTP header `admin-key`, gRPC
    `triton-grpc-protocol-admin-key`); with an API key, gRPC inference and metadata need it."""
    groups = ",".join(ADMIN_GROUPS)
    flags = [f"--http-restricted-api={groups}:{ADMIN_HEADER}={admin_key}",
             f"--grpc-restricted-protocol={groups}:{ADMIN_HEADER}={admin_key}"]  # fmt: skip
    if cfg.api_key:
        flags.append(
            f"--grpc-restricted-protocol=inference,metadata:{API_KEY_HEADER}={cfg.api_key}"
        )
    return flags


def triton_shm_prefix(run_id: str) -> str:
    """Prefix of the Python backend's shared-memory regions for one run (default: triton_python_...)."""
    return f"bs_{run_id}_tpb_"


def clean_shm(run_id: str) -> None:
    """Remove shared-memory segments a crashed run of this id may have left behind."""
    for path in glob.glob(f"/dev/shm/bs_{run_id}_*"):
        try:
            os.unlink(path)
        except OSError:
            pass
