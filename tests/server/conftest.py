"""A real tritonserver serving the default model (SmolLM2 on CPU), shared by the server tests."""

from __future__ import annotations

import socket

import psutil
import pytest
from bucketserve.serving.config import ServeConfig
from bucketserve.serving.front.app import Front
from bucketserve.serving.front.health import READY, Health
from bucketserve.serving.front.metrics import FrontMetrics
from bucketserve.serving.front.server import FrontServer
from bucketserve.serving.launcher import TritonServer
from bucketserve.serving.service import grpc_target


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Fronted:
    """A TritonServer reached as `bucketserve serve` users reach it: HTTP through the front
    (serving/front: guarded Triton HTTP API, generate over gRPC); all else is the server's."""

    def __init__(self, server: TritonServer) -> None:
        self.server = server
        health = Health()
        health.set(READY, upstream=f"http://{server.http_url}")
        front = Front(health, FrontMetrics(), server.cfg.max_request_bytes, grpc_target(server.cfg))
        self.port = free_port()
        self.web = FrontServer(front, "127.0.0.1", self.port)
        self.web.start()

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __getattr__(self, name: str):
        return getattr(self.server, name)

    def stop(self) -> None:
        self.web.stop()
        self.server.stop()


def server_state(server: TritonServer) -> str:
    """What a failed server test leaves for whoever reads the CI log: whether tritonserver
    and each of its children still run, and the tail of the server log."""
    lines = []
    if server.proc is not None:
        lines.append(f"tritonserver pid {server.proc.pid}: returncode {server.proc.poll()}")
        try:
            for child in psutil.Process(server.proc.pid).children():
                try:
                    lines.append(
                        f"  child {child.pid} {child.status()}: {' '.join(child.cmdline()[1:3])}"
                    )
                except psutil.Error as e:
                    lines.append(f"  child {child.pid}: {type(e).__name__}")
        except psutil.NoSuchProcess:
            pass
    lines.append(server.log_tail(80))
    return "\n".join(lines)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed:
        for name, value in getattr(item, "funcargs", {}).items():
            value = value.server if isinstance(value, Fronted) else value
            if isinstance(value, TritonServer):
                report.sections.append((f"server state ({name})", server_state(value)))


def start_server(tmp_path_factory, **overrides) -> Fronted:
    run_dir = tmp_path_factory.mktemp("run")
    cfg = ServeConfig(
        http_port=free_port(),
        grpc_port=free_port(),
        metrics_port=free_port(),
        run_dir=str(run_dir),
        # the OpenAI front only where a test asks for it; float32: the server's text is
        # compared with transformers' float32 generate (bf16 parity: tests/parity)
        **(
            {"kv_cache_gb": 0.5, "max_model_len": 2048, "openai_port": 0, "dtype": "float32"}
            | overrides
        ),
    )
    server = TritonServer(cfg)
    server.start()
    try:
        server.wait_ready(timeout_s=600)
        return Fronted(server)
    except BaseException:
        server.stop()
        raise


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """The default topology: one prefill and one decode instance on CPU, policy bucketserve."""
    srv = start_server(tmp_path_factory)
    yield srv
    srv.stop()
