"""The one HTTP edge: v2 and OpenAI routes in one app, behind one cap, one readiness, one error
mapping by route, and sockets bound up front (a port in use fails with its flag)."""

from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from bucketserve.serving.front.app import Front
from bucketserve.serving.front.health import DEGRADED, READY, Health
from bucketserve.serving.front.metrics import FrontMetrics
from bucketserve.serving.front.server import FrontServer
from bucketserve.serving.launch.ports import (
    Port,
    PortUnavailable,
    check_free,
    free_port,
    http_ready,
)
from bucketserve.serving.openai.app import Settings

from tests.unit.serving.grpc_upstream import GrpcUpstream
from tests.unit.serving.test_front import STAND_IN, Upstream, sse_events


@pytest.fixture
def edge():
    up, grpc_up = Upstream(), GrpcUpstream()
    up.web.start()
    grpc_up.start()
    health = Health()
    health.set(READY, upstream=f"http://127.0.0.1:{up.port}")
    front = Front(health, FrontMetrics(), 1 << 16, grpc_up.target, openai=Settings("m"),
                  policy=STAND_IN)  # fmt: skip
    port, second = free_port(), free_port()
    web = FrontServer(front, "127.0.0.1", port, (Port(second, "--openai-port"),))
    web.start()
    yield f"http://127.0.0.1:{port}", f"http://127.0.0.1:{second}", grpc_up, health, front
    web.stop()
    grpc_up.stop()
    up.web.stop()


def test_both_ports_serve_every_route(edge):
    base, second, _, _, _ = edge
    for url in (base, second):
        assert requests.get(f"{url}/v1/models").json()["data"][0]["id"] == "m"
        assert requests.get(f"{url}/health").json() == {"status": "ok"}
        r = requests.post(f"{url}/v2/models/m/generate", json={"text_input": "abc"})
        assert r.status_code == 200 and r.json()["text_output"] == "3"
        assert b"bucketserve_front_inflight_requests" in requests.get(f"{url}/metrics").content


def test_one_cap_for_v2_and_openai_routes_in_each_routes_shape(edge):
    base, second, grpc_up, _, front = edge
    front.max_concurrent = 2
    with ThreadPoolExecutor(2) as pool:
        held = [pool.submit(sse_events, f"{base}/v2/models/stream/generate_stream")
                for _ in range(2)]  # fmt: skip
        deadline = time.monotonic() + 5
        while (front.inflight < 2 or len(grpc_up.seen) < 2) and time.monotonic() < deadline:
            time.sleep(0.02)
        sent = len(grpc_up.seen)
        r = requests.post(f"{second}/v1/completions", json={"model": "m", "prompt": "x"})
        assert r.status_code == 503 and r.headers["Retry-After"] == "1"
        err = r.json()["error"]
        assert err["type"] == "server_error" and err["param"] is None
        assert err["message"].startswith("server busy: 2 requests in flight")
        assert "max_concurrent_requests=2" in err["message"]
        r = requests.post(f"{base}/v2/models/m/generate", json={"text_input": "x"})
        assert r.status_code == 503 and "max_concurrent_requests=2" in r.json()["error"]
        assert requests.get(f"{base}/v1/models").status_code == 200  # not a POST: not capped
        assert len(grpc_up.seen) == sent  # nothing reached Triton
        grpc_up.release.set()
        assert all(events[-1]["text_output"] == "end" for events in (h.result() for h in held))
    assert front.inflight == 0
    assert front.metrics.rejected.labels("concurrency")._value.get() == 2


def test_not_ready_is_503_on_every_route_and_health_says_why(edge):
    base, _, _, health, _ = edge
    health.set(DEGRADED, "stub process decode_0_0 (pid 7) died")
    r = requests.post(f"{base}/v1/chat/completions",
                      json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
    assert r.status_code == 503 and "decode_0_0" in r.json()["error"]["message"]
    r = requests.post(f"{base}/v2/models/m/generate", json={"text_input": "x"})
    assert r.status_code == 503 and "decode_0_0" in r.json()["error"]
    r = requests.get(f"{base}/health")
    assert r.status_code == 503 and "decode_0_0" in r.json()["cause"]


def test_http_ready_is_true_only_for_a_ready_server(edge):
    host_port = edge[0].removeprefix("http://")
    assert http_ready(host_port, 5.0)
    edge[3].set(DEGRADED, "stub process decode_0_0 (pid 7) died")
    assert not http_ready(host_port, 5.0)
    assert not http_ready(f"127.0.0.1:{free_port()}", 5.0)  # nothing listens


def test_openai_errors_keep_openai_shape(edge):
    base, _, _, _, _ = edge
    r = requests.post(f"{base}/v1/completions", json={"model": "gpt-4o", "prompt": "x"})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    r = requests.post(f"{base}/v1/completions", json={"model": "m", "prompt": "x", "n": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"


def test_a_port_in_use_fails_naming_port_and_flag():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(PortUnavailable, match=rf"127.0.0.1:{port} \(--grpc-port {port}\)"):
            check_free("127.0.0.1", [Port(free_port(), "--http-port"), Port(port, "--grpc-port")])
        front = Front(Health(), FrontMetrics(), 1 << 16, "127.0.0.1:9")
        free = free_port()
        with pytest.raises(PortUnavailable, match=f"--openai-port {port}"):
            FrontServer(front, "127.0.0.1", free, (Port(port, "--openai-port"),))
        check_free("127.0.0.1", [Port(free, "--http-port")])  # the first socket was let go


def test_triton_log_of_a_port_it_could_not_bind_names_the_flag():
    from bucketserve.serving.launch.ports import triton_port_error

    log = "E1203 main.cc:245] \"failed to start GRPC service: Unavailable - Socket '127.0.0.1:18391' already in use \""  # fmt: skip
    ports = [Port(18391, "--grpc-port"), Port(18392, "--metrics-port")]
    err = triton_port_error(log, "127.0.0.1", ports)
    assert isinstance(err, PortUnavailable) and "(--grpc-port 18391)" in str(err)
    assert triton_port_error("I1203 all fine", "127.0.0.1", ports) is None


def test_banner_lists_only_the_ports_that_listen():
    from bucketserve.serving.config import ServeConfig
    from bucketserve.serving.launch.service import banner

    text = banner(ServeConfig(http_port=18290, openai_port=0), "log")
    assert "OpenAI   http://127.0.0.1:18290/v1\n" in text and ":9000" not in text
    assert "OpenAI   http://127.0.0.1:18290/v1, http://127.0.0.1:9000/v1" in banner(
        ServeConfig(http_port=18290), "log"
    )


def hang_up_after_sending(url: str, path: str, body: bytes) -> None:
    """POST `body`, wait until the edge is working on it, then close the connection."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as s:
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(body)}\r\n\r\n".encode() + body)  # fmt: skip
        time.sleep(0.5)


@pytest.mark.parametrize(
    ("path", "body"),
    [("/v2/models/stream/generate", b'{"text_input": "x"}'),
     ("/v1/completions", b'{"model": "m", "prompt": "x"}')],
)  # fmt: skip
def test_a_client_that_hangs_up_on_a_whole_answer_stops_its_request(edge, path, body):
    """One cancellation path: v2 `generate` and a non-streamed OpenAI request alike send the
    `stop` for a request whose client left before the answer was ready."""
    base, _, grpc_up, _, front = edge
    hang_up_after_sending(base, path, body)
    assert grpc_up.seen and not grpc_up.stopped  # working on it until the client left
    deadline = time.monotonic() + 5
    while not grpc_up.stopped and time.monotonic() < deadline:
        time.sleep(0.02)
    generation = [r for r in grpc_up.seen if r.id in grpc_up.stopped]
    assert generation, "no stop request named the abandoned request"
    while front.inflight and time.monotonic() < deadline:
        time.sleep(0.02)
    assert front.inflight == 0


def test_free_port_never_hands_out_a_port_twice(monkeypatch):
    """The kernel gave one ephemeral port to two binds in a row (gRPC and metrics of one
    server, which then would not start): free_port asks again until the port is new."""
    from bucketserve.serving.launch import ports

    given = iter([41001, 41001, 41002, 41001, 41003])
    monkeypatch.setattr(ports, "_handed_out", set())
    monkeypatch.setattr(ports, "_ephemeral_port", lambda: next(given))
    assert [ports.free_port() for _ in range(3)] == [41001, 41002, 41003]
