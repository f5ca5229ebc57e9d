"""A real tritonserver serving the default model (SmolLM2 on CPU), shared by the server tests."""

from __future__ import annotations

import psutil
import pytest
from bucketserve.serving.config import ServeConfig
from bucketserve.serving.front.local import LocalEdge
from bucketserve.serving.launch.launcher import TritonServer
from bucketserve.serving.launch.ports import free_port

__all__ = ["free_port", "start_server"]  # free_port: for the tests that import it from here


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
            value = value.server if isinstance(value, LocalEdge) else value
            if isinstance(value, TritonServer):
                report.sections.append((f"server state ({name})", server_state(value)))


def start_server(tmp_path_factory, **overrides) -> LocalEdge:
    run_dir = tmp_path_factory.mktemp("run")
    cfg = ServeConfig(
        http_port=free_port(),
        grpc_port=free_port(),
        metrics_port=free_port(),
        run_dir=str(run_dir),
        # the OpenAI port only where a test asks for it (the routes are on the edge's port too);
        # float32: the server's text is compared with transformers' float32 generate (bf16
        # parity: tests/parity)
        **(
            {
                "kv_cache_gb": 0.5,
                "max_model_len": 2048,
                "openai_port": 0,
                "dtype": "float32",
                "topology": "disaggregated",
            }
            | overrides
        ),
    )
    server = TritonServer(cfg)
    server.start()
    try:
        server.wait_ready(timeout_s=600)
        return LocalEdge(server)  # as `bucketserve serve` users reach it: through the edge
    except BaseException:
        server.stop()
        raise


# Each tritonserver start costs ~20 s of CI time on two cores: the two shared servers below
# serve every module that needs nothing else (each test leaves every KV block free).


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """The disaggregated topology (the default is colocated: `auto`, tested by `colocated` and
    test_topology_auto): one prefill and one decode instance on CPU, policy bucketserve, with
    the OpenAI front on its own port too."""
    srv = start_server(tmp_path_factory, openai_port=free_port())
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def colocated(tmp_path_factory):
    """The default topology (`auto`): two colocated SmolLM2 instances of one CPU thread each,
    32-token iterations, the OpenAI front on."""
    srv = start_server(tmp_path_factory, topology="auto", openai_port=free_port())
    yield srv
    srv.stop()
