"""The HTTP front against a real upstream HTTP server (a tiny Starlette app under uvicorn)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import pytest
import requests
from bucketserve.serving.front.app import Front
from bucketserve.serving.front.health import DEGRADED, READY, Health
from bucketserve.serving.front.metrics import FrontMetrics
from bucketserve.serving.front.server import FrontServer
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

LIMIT = 64 * 1024


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Upstream:
    """Stands in for Triton's HTTP endpoint: echoes, streams, answers busy, or dies mid-stream."""

    def __init__(self) -> None:
        self.seen: list[dict] = []
        self.release = threading.Event()
        app = Starlette(routes=[Route("/{path:path}", self.handle, methods=["GET", "POST"])])
        self.port = free_port()
        self.web = FrontServer(type("F", (), {"app": app})(), "127.0.0.1", self.port)

    async def handle(self, request: Request):
        body = await request.body()
        self.seen.append({"path": request.url.path, "ctype": request.headers.get("content-type"),
                          "len": len(body)})  # fmt: skip
        if request.url.path.endswith("/busy"):
            return JSONResponse({"error": "server busy: 4 requests are already waiting"}, 400)
        if request.url.path.endswith("/short/generate_stream"):  # closed early, cleanly
            return StreamingResponse(self.short_events(False), media_type="text/event-stream")
        if request.url.path.endswith("/whole/generate_stream"):
            return StreamingResponse(self.short_events(True), media_type="text/event-stream")
        if request.url.path.endswith("/cut/generate_stream"):
            return StreamingResponse(self.cut_events(), media_type="text/event-stream")
        if request.url.path.endswith("/generate_stream"):
            return StreamingResponse(self.events(), media_type="text/event-stream")
        return JSONResponse({"len": len(body)})

    async def events(self):
        for i in range(3):
            yield f'data: {{"text_output": "t{i}"}}\n\n'.encode()
            await asyncio.sleep(0.05)
        while not self.release.is_set():  # then hang until the test kills the upstream
            await asyncio.sleep(0.02)
        yield b'data: {"text_output": "end"}\n\n'

    async def short_events(self, finish: bool):
        yield b'data: {"text_output": "a", "finish_reason": ""}\n\n'
        last = "length" if finish else ""
        yield f'data: {{"text_output": "b", "finish_reason": "{last}"}}\n\n'.encode()

    async def cut_events(self):
        """One event split across two writes, then half an event, then silence until killed."""
        yield b'data: {"text_out'
        await asyncio.sleep(0.05)
        yield b'put": "t0"}\n\ndata: {"text_output": "par'
        while not self.release.is_set():
            await asyncio.sleep(0.02)


@pytest.fixture
def setup():
    up = Upstream()
    up.web.start()
    health, metrics = Health(), FrontMetrics()
    health.set(READY, upstream=f"http://127.0.0.1:{up.port}")
    front = Front(health, metrics, LIMIT)
    port = free_port()
    web = FrontServer(front, "127.0.0.1", port)
    web.start()
    yield f"http://127.0.0.1:{port}", up, health, front
    up.release.set()
    web.stop()
    up.web.stop()


def test_body_over_limit_is_413_before_upstream(setup):
    base, up, _, _ = setup
    r = requests.post(f"{base}/v2/models/m/generate", data=b"x" * (LIMIT + 1))
    assert r.status_code == 413
    assert "max_request_bytes=65536" in r.json()["error"]
    chunks = (b"x" * 4096 for _ in range(LIMIT // 4096 + 2))  # chunked: no declared length
    assert requests.post(f"{base}/v2/models/m/generate", data=chunks).status_code == 413
    assert up.seen == []
    exact = b'{"text_input": "' + b"x" * (LIMIT - 18) + b'"}'  # exactly LIMIT bytes of JSON
    ok = requests.post(f"{base}/v2/models/m/generate", data=exact)
    assert ok.status_code == 200 and ok.json() == {"len": LIMIT}


def test_form_body_reaches_triton_as_json(setup):
    base, up, _, _ = setup
    body = json.dumps({"text_input": "hi"})
    r = requests.post(
        f"{base}/v2/models/m/generate",
        data=body,
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert r.status_code == 200
    assert up.seen[-1]["ctype"] == "application/json"


def test_not_ready_while_degraded(setup):
    base, up, health, _ = setup
    assert requests.get(f"{base}/v2/health/ready").status_code == 200
    health.set(DEGRADED, "stub process decode_0_0 (pid 1) died; the server is restarting")
    r = requests.get(f"{base}/v2/health/ready")
    assert r.status_code == 503 and "decode_0_0" in r.json()["error"]
    r = requests.post(f"{base}/v2/models/m/generate", json={})
    assert r.status_code == 503 and r.headers["Retry-After"] == "1"
    assert requests.get(f"{base}/v2/health/live").status_code == 200


def test_busy_error_maps_to_503(setup):
    base, _, _, _ = setup
    r = requests.post(f"{base}/v2/models/m/busy", json={})
    assert r.status_code == 503 and "server busy" in r.json()["error"]


def test_stream_relays_and_ends_with_the_cause_when_upstream_dies(setup):
    base, up, health, front = setup
    events, t_dead = [], None
    with requests.post(f"{base}/v2/models/m/generate_stream", json={}, stream=True) as r:
        for line in r.iter_lines():
            if not line.startswith(b"data: "):
                continue
            events.append(json.loads(line[6:]))
            if len(events) == 3:  # the supervisor's order: degraded with a cause, then kill
                health.set(DEGRADED, "stub process decode_0_0 (pid 7) died")
                t_dead = time.monotonic()
                up.web.server.force_exit = True
                up.web.stop()
    assert [e.get("text_output") for e in events[:3]] == ["t0", "t1", "t2"]
    assert "decode_0_0" in events[-1]["error"]
    assert time.monotonic() - t_dead < 5
    assert front.inflight == 0


def test_stream_cut_inside_an_event_never_reaches_the_client_half_written(setup):
    base, up, health, front = setup
    lines = []
    with requests.post(f"{base}/v2/models/cut/generate_stream", json={}, stream=True) as r:
        for line in r.iter_lines():
            if not line.startswith(b"data: "):
                continue
            lines.append(line)
            if len(lines) == 1:
                health.set(DEGRADED, "stub process decode_0_0 (pid 7) died")
                up.web.server.force_exit = True
                up.web.stop()
    events = [json.loads(line[6:]) for line in lines]  # every line is a whole JSON event
    assert events[0] == {"text_output": "t0"}
    assert "decode_0_0" in events[-1]["error"] and len(events) == 2
    assert front.inflight == 0


def sse_events(url: str) -> list[dict]:
    with requests.post(url, json={}, stream=True) as r:
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith(b"data: ")]


def test_stream_closed_without_a_last_event_ends_in_an_error_and_is_counted(setup):
    """Triton closing a stream cleanly before its finish reason must not pass for a whole
    answer (seen in soaks, issue 13): the client gets an error event after the last text."""
    base, _, _, front = setup
    events = sse_events(f"{base}/v2/models/short/generate_stream")
    assert [e.get("text_output") for e in events[:2]] == ["a", "b"]
    assert events[-1] == {"error": "stream ended without a final response (issue 13)"}
    assert front.metrics.cut._value.get() == 1
    whole = sse_events(f"{base}/v2/models/whole/generate_stream")  # a whole one is untouched
    assert len(whole) == 2 and whole[-1]["finish_reason"] == "length"
    assert front.metrics.cut._value.get() == 1 and front.inflight == 0
