"""The HTTP front against real upstreams: an HTTP server (a tiny Starlette app under uvicorn) for
Triton's HTTP API, and a gRPC server speaking Triton's protocol for generate."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from bucketserve.serving.front.allowlist import AccessPolicy
from bucketserve.serving.front.app import Front
from bucketserve.serving.front.health import DEGRADED, READY, Health
from bucketserve.serving.front.metrics import FrontMetrics
from bucketserve.serving.front.server import FrontServer
from bucketserve.serving.launch.ports import free_port
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tests.unit.serving.grpc_upstream import GrpcUpstream

LIMIT = 64 * 1024
STAND_IN = AccessPolicy(public_models=None)  # the stand-in upstreams' models are not ours


class Upstream:
    """Stands in for Triton's HTTP endpoint: echoes the body's length or answers busy."""

    def __init__(self) -> None:
        self.seen: list[dict] = []
        app = Starlette(routes=[Route("/{path:path}", self.handle, methods=["GET", "POST"])])
        self.port = free_port()
        self.web = FrontServer(type("F", (), {"app": app})(), "127.0.0.1", self.port)

    async def handle(self, request: Request):
        body = await request.body()
        self.seen.append({"path": request.url.path, "ctype": request.headers.get("content-type"),
                          "len": len(body)})  # fmt: skip
        if request.url.path.endswith("/busy"):
            return JSONResponse({"error": "server busy: 4 requests are already waiting"}, 400)
        return JSONResponse({"len": len(body)})


@pytest.fixture
def setup():
    up, grpc_up = Upstream(), GrpcUpstream()
    up.web.start()
    grpc_up.start()
    health, metrics = Health(), FrontMetrics()
    health.set(READY, upstream=f"http://127.0.0.1:{up.port}")
    front = Front(health, metrics, LIMIT, grpc_up.target, policy=STAND_IN)
    port = free_port()
    web = FrontServer(front, "127.0.0.1", port)
    web.start()
    yield f"http://127.0.0.1:{port}", up, grpc_up, health, front
    web.stop()
    grpc_up.stop()
    up.web.stop()


def test_body_over_limit_is_413_before_upstream(setup):
    base, up, grpc_up, _, _ = setup
    r = requests.post(f"{base}/v2/models/m/generate", data=b"x" * (LIMIT + 1))
    assert r.status_code == 413
    assert "max_request_bytes=65536" in r.json()["error"]
    chunks = (b"x" * 4096 for _ in range(LIMIT // 4096 + 2))  # chunked: no declared length
    assert requests.post(f"{base}/v2/models/m/generate", data=chunks).status_code == 413
    assert requests.post(f"{base}/v2/models/m/infer", data=b"x" * (LIMIT + 1)).status_code == 413
    assert up.seen == [] and grpc_up.seen == []
    exact = b'{"text_input": "' + b"x" * (LIMIT - 18) + b'"}'  # exactly LIMIT bytes of JSON
    ok = requests.post(f"{base}/v2/models/m/generate", data=exact)
    assert ok.status_code == 200, ok.text
    assert ok.json() == {"model_name": "m", "model_version": "1",
                         "text_output": str(LIMIT - 18), "finish_reason": "stop"}  # fmt: skip


def test_form_body_is_read_as_json(setup):
    base, up, grpc_up, _, _ = setup
    body = json.dumps({"text_input": "hi"})
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    r = requests.post(f"{base}/v2/models/m/infer", data=body, headers=form)
    assert r.status_code == 200
    assert up.seen[-1]["ctype"] == "application/json"
    r = requests.post(f"{base}/v2/models/m/generate", data=body, headers=form)
    assert r.status_code == 200 and r.json()["text_output"] == "2"


def test_generate_maps_json_to_typed_tensors_and_names_bad_fields(setup):
    base, _, grpc_up, _, _ = setup
    r = requests.post(f"{base}/v2/models/m/versions/1/generate",
                      json={"text_input": "hey", "parameters": {"max_tokens": 5}, "tag": "x"})  # fmt: skip
    assert r.status_code == 200, r.text
    sent = grpc_up.seen[-1]
    assert sent.model_version == "1"
    assert [(t.name, t.datatype, list(t.shape)) for t in sent.inputs] == [
        ("text_input", "BYTES", [1]), ("max_tokens", "INT32", [1])]  # fmt: skip
    assert sent.parameters["tag"].string_param == "x"
    assert sent.parameters["triton_enable_empty_final_response"].bool_param
    r = requests.post(f"{base}/v2/models/m/generate", json={"text_input": "a", "max_tokens": "5"})
    assert r.status_code == 400 and "'max_tokens' must be an integer" in r.json()["error"]
    r = requests.post(f"{base}/v2/models/nope/generate", json={"text_input": "a"})
    assert r.status_code == 400 and "unknown model" in r.json()["error"]
    r = requests.post(f"{base}/v2/models/two/generate", json={"text_input": "a"})
    assert r.status_code == 400 and "exactly 1 response" in r.json()["error"]
    events = sse_events(f"{base}/v2/models/two/generate_stream")
    assert [e["text_output"] for e in events] == ["a", "b"]  # the flag alone sends no event


def test_not_ready_while_degraded(setup):
    base, up, _, health, _ = setup
    assert requests.get(f"{base}/v2/health/ready").status_code == 200
    health.set(DEGRADED, "stub process decode_0_0 (pid 1) died; the server is restarting")
    r = requests.get(f"{base}/v2/health/ready")
    assert r.status_code == 503 and "decode_0_0" in r.json()["error"]
    r = requests.post(f"{base}/v2/models/m/generate", json={})
    assert r.status_code == 503 and r.headers["Retry-After"] == "1"
    assert requests.get(f"{base}/v2/health/live").status_code == 200


def test_busy_error_maps_to_503(setup):
    base, _, _, _, front = setup
    r = requests.post(f"{base}/v2/models/m/busy", json={})
    assert r.status_code == 503 and "server busy" in r.json()["error"]
    for path in ("generate", "generate_stream"):
        r = requests.post(f"{base}/v2/models/busy/{path}", json={"text_input": "a"})
        assert r.status_code == 503 and r.headers["Retry-After"] == "1"
        assert "server busy" in r.json()["error"]
    assert front.inflight == 0


def test_stream_relays_and_ends_with_the_cause_when_upstream_dies(setup):
    base, _, grpc_up, health, front = setup
    events, t_dead = [], None
    with requests.post(f"{base}/v2/models/stream/generate_stream", json={}, stream=True) as r:
        assert r.headers["content-type"] == "text/event-stream; charset=utf-8"
        for line in r.iter_lines():
            if not line.startswith(b"data: "):
                continue
            events.append(json.loads(line[6:]))
            if len(events) == 3:  # the supervisor's order: degraded with a cause, then kill
                health.set(DEGRADED, "stub process decode_0_0 (pid 7) died")
                t_dead = time.monotonic()
                grpc_up.stop()
    assert [e.get("text_output") for e in events[:3]] == ["t0", "t1", "t2"]
    assert "decode_0_0" in events[-1]["error"] and len(events) == 4
    assert time.monotonic() - t_dead < 5
    assert front.inflight == 0 and front.metrics.broken._value.get() == 1


def test_client_going_away_stops_its_request(setup):
    base, _, grpc_up, _, front = setup
    with requests.post(f"{base}/v2/models/stream/generate_stream", json={}, stream=True) as r:
        next(r.iter_lines())  # the first event arrived; now hang up
    deadline = time.monotonic() + 5
    while not grpc_up.stopped and time.monotonic() < deadline:
        time.sleep(0.02)
    generation, stop = grpc_up.seen[-2:]
    assert grpc_up.stopped == {generation.id}, "no stop request named the abandoned request"
    assert stop.id == generation.id and stop.model_name == "stream"
    while front.inflight and time.monotonic() < deadline:
        time.sleep(0.02)
    assert front.inflight == 0


def sse_events(url: str) -> list[dict]:
    with requests.post(url, json={}, stream=True) as r:
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith(b"data: ")]


def test_requests_share_a_few_streams_and_get_their_own_answers(setup):
    """Triton 2.51 keeps ~6.5 KB per gRPC stream it served: the front multiplexes requests over
    a few long-lived streams (front/grpc_mux.py), matching answers by request id."""
    base, _, grpc_up, _, front = setup
    with ThreadPoolExecutor(16) as pool:
        texts = list(pool.map(lambda i: requests.post(f"{base}/v2/models/m/generate",
                                                      json={"text_input": "x" * i}).json(),
                              range(1, 41)))  # fmt: skip
    assert [t["text_output"] for t in texts] == [str(i) for i in range(1, 41)]
    assert len({id(s) for s in front.generate.pool.streams if s is not None}) <= 4
    assert len({r.id for r in grpc_up.seen}) == len(grpc_up.seen) == 40
    assert front.inflight == 0


def test_requests_beyond_the_concurrency_cap_are_busy_at_once(setup):
    """max_concurrent_requests: the next inference request gets 503 busy before reaching
    Triton while the cap is in use, and is served again once a request ends."""
    base, up, grpc_up, _, front = setup
    front.max_concurrent = 2
    url = f"{base}/v2/models/stream/generate_stream"
    with ThreadPoolExecutor(2) as pool:
        held = [pool.submit(sse_events, url) for _ in range(2)]
        deadline = time.monotonic() + 5
        while (front.inflight < 2 or len(grpc_up.seen) < 2) and time.monotonic() < deadline:
            time.sleep(0.02)
        sent = len(grpc_up.seen)
        t0 = time.monotonic()
        r = requests.post(f"{base}/v2/models/m/generate", json={"text_input": "x"})
        assert r.status_code == 503 and time.monotonic() - t0 < 1.0
        assert "max_concurrent_requests=2" in r.json()["error"] and r.headers["Retry-After"]
        assert requests.post(f"{base}/v2/models/m/infer", data=b"{}").status_code == 503
        assert len(grpc_up.seen) == sent and up.seen == []  # nothing reached the upstreams
        assert requests.get(f"{base}/v2/models/m").status_code == 200  # metadata still served
        grpc_up.release.set()
        assert all(events[-1]["text_output"] == "end" for events in (h.result() for h in held))
    assert requests.post(f"{base}/v2/models/m/generate", json={"text_input": "x"}).ok
    assert front.metrics.rejected.labels("concurrency")._value.get() == 2
