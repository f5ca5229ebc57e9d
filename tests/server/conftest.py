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
# serve every module that needs nothing else (each test leaves every KV block free). They hold
# ~5 GB each (two engine stubs of ~2.1 GB RSS with 0.5 GB of KV): the modules that use them run
# first, and each stops after its last test (`pytest_runtest_teardown`), so the modules that start
# their own servers, and the parity tests on the other xdist worker (tests/conftest.py), do not
# run beside them. A test names the shared servers it uses among its fixtures' arguments (not
# by `request.getfixturevalue`, which this order cannot see).
SESSION_SERVERS = ("server", "colocated")
_running: dict[str, LocalEdge] = {}  # session server name -> the running server
_last_user: dict[str, str] = {}  # session server name -> node id of the last test that uses it


def _module_rank(items) -> int:
    """Where a server test module runs: 0 uses `server` only, 1 uses `colocated`, 2 starts its
    own servers (so `colocated` starts late and both live together only for rank-1 modules)."""
    used = {name for item in items for name in SESSION_SERVERS if name in item.fixturenames}
    return 1 if "colocated" in used else 0 if used else 2


def session_servers_first(items: list) -> tuple[list, dict[str, str]]:
    """`items` with the server modules ordered by `_module_rank` (stable: file order within a
    rank; every other test where it was), and each session server's last test in that order."""
    server = [i for i in items if i.nodeid.startswith("tests/server/")]
    if not server:
        return items, {}
    modules: dict[str, list] = {}
    for item in server:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)
    ordered = [i for m in sorted(modules.values(), key=_module_rank) for i in m]
    first = items.index(server[0])
    others = [i for i in items if not i.nodeid.startswith("tests/server/")]
    last_user = {name: i.nodeid for i in ordered for name in SESSION_SERVERS
                 if name in i.fixturenames}  # fmt: skip
    return others[:first] + ordered + others[first:], last_user


def pytest_collection_modifyitems(items):
    items[:], last_user = session_servers_first(items)
    _last_user.clear()
    _last_user.update(last_user)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield
    for name, nodeid in _last_user.items():
        if nodeid == item.nodeid and name in _running:
            _running.pop(name).stop()


def _session_server(tmp_path_factory, name: str, **overrides):
    _running[name] = start_server(tmp_path_factory, **overrides)
    yield _running[name]
    if name in _running:  # not stopped after its last test (a run that ended early)
        _running.pop(name).stop()


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """The disaggregated topology (the default is colocated: `auto`, tested by `colocated` and
    test_topology_auto): one prefill and one decode instance on CPU, policy bucketserve, with
    the OpenAI front on its own port too."""
    yield from _session_server(tmp_path_factory, "server", openai_port=free_port())


@pytest.fixture(scope="session")
def colocated(tmp_path_factory):
    """The default topology (`auto`): two colocated SmolLM2 instances of one CPU thread each,
    32-token iterations, the OpenAI front on."""
    yield from _session_server(tmp_path_factory, "colocated", topology="auto",
                               openai_port=free_port())  # fmt: skip
