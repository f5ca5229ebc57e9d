"""A real tritonserver serving the default model (SmolLM2 on CPU), shared by the server tests."""

from __future__ import annotations

import socket

import pytest
from bucketserve.serving.config import ServeConfig
from bucketserve.serving.launcher import TritonServer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(tmp_path_factory, **overrides) -> TritonServer:
    run_dir = tmp_path_factory.mktemp("run")
    cfg = ServeConfig(
        http_port=free_port(),
        grpc_port=free_port(),
        metrics_port=free_port(),
        run_dir=str(run_dir),
        # the OpenAI front only where a test asks for it
        **({"kv_cache_gb": 0.5, "max_model_len": 2048, "openai_port": 0} | overrides),
    )
    server = TritonServer(cfg)
    server.start()
    try:
        server.wait_ready(timeout_s=600)
    except BaseException:
        server.stop()
        raise
    return server


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """The default topology: one prefill and one decode instance on CPU, policy bucketserve."""
    srv = start_server(tmp_path_factory)
    yield srv
    srv.stop()
