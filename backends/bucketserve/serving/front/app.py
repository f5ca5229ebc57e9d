"""The public HTTP edge: Triton's v2 API (guarded, generate over gRPC) and the OpenAI routes.

One app in one process (a thread of the launcher) is the only public HTTP surface. Triton 2.51's
HTTP front end crashes on some bodies (docs/platform-notes.md#p11-large-form-body-crash,
#p20-deeply-nested-json-crash) and cuts some generate_stream streams under load
(#p21-http-generate-stream-cut-under-load): every body is read here first, bounded by
`max_request_bytes`, and checked (front/guard.py) before one byte reaches Triton; `generate` and
`generate_stream` go to Triton's gRPC streaming API (front/generate.py), the OpenAI routes
(serving/openai) to the same gRPC streams, everything else to Triton's internal loopback HTTP
endpoint. One admission point (front/admission.py) answers readiness from the supervisor and caps
requests in flight for every route; one error mapping (front/errors.py); in-flight requests end
with an error that names why the server went away.
"""

from __future__ import annotations

import asyncio
import contextlib
import re

import anyio
import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route

from bucketserve.serving.front.admission import Admission
from bucketserve.serving.front.allowlist import AccessPolicy
from bucketserve.serving.front.errors import BUSY_MARK, error
from bucketserve.serving.front.generate import GenerateRelay
from bucketserve.serving.front.guard import BodyTooLarge, check_request, forward_headers
from bucketserve.serving.front.health import Health
from bucketserve.serving.front.metrics import FrontMetrics

CAUSE_WAIT_S = 1.0  # a reset may reach us before the supervisor has noticed the crash
INLINE_CHECK_BYTES = 64 * 1024
HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade"}
GENERATE = re.compile(r"/v2/models/([^/]+)(?:/versions/([^/]+))?/(generate|generate_stream)")
PROMETHEUS = "text/plain; version=0.0.4"


class Front:
    """Routes, the upstream clients and the one admission point the shutdown drain waits on.

    `openai`: the OpenAI routes' settings (serving/openai/app.py), None for none; `metrics_url`:
    Triton's Prometheus endpoint, whose page /metrics appends to the edge's own; `policy`: who
    may use which path (default: the entry models only, no keys); `grpc_metadata`: sent with
    every gRPC call to Triton (its API key, when Triton's gRPC port requires one)."""

    def __init__(
        self, health: Health, metrics: FrontMetrics, max_request_bytes: int, grpc_target: str,
        max_concurrent: int = 0, openai=None, metrics_url: str = "",
        policy: AccessPolicy | None = None, grpc_metadata: tuple = (),
    ) -> None:  # fmt: skip
        self.health = health
        self.metrics = metrics
        self.max_request_bytes = max_request_bytes
        self.metrics_url = metrics_url
        self.client: httpx.AsyncClient | None = None
        self.loop: asyncio.AbstractEventLoop | None = None  # uvicorn's, once it serves
        self.generate = GenerateRelay(grpc_target, health, metrics, self, grpc_metadata)
        routes = [
            Route("/v2/health/ready", self.ready, methods=["GET"]),
            Route("/v2/health/live", self.live, methods=["GET"]),
            Route("/health", self.health_status, methods=["GET"]),
            Route("/metrics", self.prometheus, methods=["GET"]),
        ]
        if openai is not None:
            from bucketserve.serving.openai.app import create_app

            routes.append(Mount("/v1", app=create_app(openai, self.generate.pool, self)))
        routes.append(Route("/{path:path}", self.proxy, methods=["GET", "POST", "PUT", "DELETE"]))
        app = Starlette(routes=routes, lifespan=self.lifespan)
        self.admission = Admission(app, health, metrics, max_concurrent, policy)
        self.app = self.admission

    @property
    def max_concurrent(self) -> int:
        """Inference requests (POSTs) in flight over every route; 0: no cap."""
        return self.admission.limit

    @max_concurrent.setter
    def max_concurrent(self, limit: int) -> None:
        self.admission.limit = limit

    @contextlib.asynccontextmanager
    async def lifespan(self, app):
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
        timeout = httpx.Timeout(None, connect=5.0)  # generation may take as long as it takes
        async with httpx.AsyncClient(limits=limits, timeout=timeout) as self.client:
            self.loop = asyncio.get_running_loop()
            await self.generate.open()
            try:
                yield
            finally:
                await self.generate.close()

    def release_upstream(self, timeout_s: float = 5.0) -> None:
        """Close the front's gRPC streams to Triton, from any thread: Triton's shutdown waits
        for every open stream (measured: 4 s more per SIGTERM while the front held them)."""
        if self.loop is not None and self.loop.is_running():
            future = asyncio.run_coroutine_threadsafe(self.generate.pool.close_streams(), self.loop)
            future.result(timeout_s)

    @property
    def inflight(self) -> int:
        """Requests being answered now, over any route (the shutdown drain waits on them)."""
        return self.admission.active

    async def ready(self, request: Request) -> Response:
        if not self.health.is_ready:
            return error(503, f"not ready: {self.health.cause}")
        return await self.proxy(request)

    async def live(self, request: Request) -> Response:
        return Response(status_code=200)  # the launcher is up; it restarts Triton on its own

    async def health_status(self, request: Request) -> Response:
        """One health for every client: the supervisor's view (OpenAI-style `/health`)."""
        if not self.health.is_ready:
            return JSONResponse({"status": "unavailable", "cause": self.health.cause}, 503)
        return JSONResponse({"status": "ok"})

    async def prometheus(self, request: Request) -> Response:
        """The edge's own metrics, then Triton's and the models' (while Triton answers)."""
        self.metrics.ready.set(1 if self.health.is_ready else 0)
        self.metrics.inflight.set(self.inflight)
        page = self.metrics.render()
        if self.metrics_url and self.health.is_ready:
            with contextlib.suppress(httpx.HTTPError):
                resp = await self.client.get(self.metrics_url, timeout=5.0)
                if resp.status_code == 200:
                    page += resp.content
        return Response(page, media_type=PROMETHEUS)

    async def proxy(self, request: Request) -> Response:
        try:
            body = await read_body(request, self.max_request_bytes)
        except BodyTooLarge as e:
            self.metrics.rejected.labels("too_large").inc()
            return error(413, str(e))
        check = (request.method, request.url.path, request.headers, body)
        if len(body) > INLINE_CHECK_BYTES:  # parsing megabytes would stall every other stream
            problem = await anyio.to_thread.run_sync(check_request, *check)
        else:
            problem = check_request(*check)
        if problem is not None:
            self.metrics.rejected.labels(problem.reason).inc()
            return error(problem.status, problem.message)
        found = GENERATE.fullmatch(request.url.path)
        if found and request.method == "POST":
            model, version, kind = found.groups()
            stream = kind == "generate_stream"
            return await self.generate.handle(model, version or "", body, stream, request)
        return await self.relay(request, body)

    async def relay(self, request: Request, body: bytes) -> Response:
        url = self.health.upstream + request.url.path
        up = self.client.build_request(
            request.method,
            url,
            params=request.url.query,
            headers=forward_headers(request.headers),
            content=body,
        )
        try:
            resp = await self.client.send(up, stream=True)
        except httpx.TransportError as e:
            return await self.went_away(e)
        headers = {k: v for k, v in resp.headers.items() if k.lower() not in HOP_HEADERS}
        if resp.status_code >= 400:
            return await self.finish_error(resp, headers)
        return StreamingResponse(self.stream(resp), resp.status_code, headers=headers)

    async def finish_error(self, resp: httpx.Response, headers: dict) -> Response:
        """Error bodies are small: read them whole, map the scheduler's busy error to 503."""
        try:
            content = await resp.aread()
        except httpx.TransportError as e:
            return await self.went_away(e)
        finally:
            await resp.aclose()
        if BUSY_MARK in content.decode("utf-8", "replace"):
            self.metrics.rejected.labels("busy").inc()
            headers.pop("content-length", None)
            return Response(content, 503, headers={**headers, "Retry-After": "1"})
        return Response(content, resp.status_code, headers=headers)

    async def stream(self, resp: httpx.Response):
        """The body as it comes; a cut shows as an incomplete response, never as a hang."""
        try:
            async for chunk in resp.aiter_raw():
                yield chunk
        except httpx.TransportError:
            self.metrics.broken.inc()
            raise
        finally:
            with anyio.CancelScope(shield=True):
                await resp.aclose()

    async def went_away(self, exc: Exception) -> Response:
        """A request Triton could not answer because it died or is gone: 503, with the cause."""
        self.metrics.broken.inc()
        return error(503, f"server went away: {await self.cause(exc)}; retry", retry=True)

    async def cause(self, exc: Exception) -> str:
        """The supervisor's account of the failure, if it has one within CAUSE_WAIT_S."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CAUSE_WAIT_S
        while self.health.is_ready and loop.time() < deadline:
            await asyncio.sleep(0.05)
        if not self.health.is_ready:
            return self.health.cause
        return f"connection to tritonserver lost ({type(exc).__name__})"


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, refusing more than `limit` bytes whether or not a length was declared."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(int(declared), limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(size, limit)
        chunks.append(chunk)
    return b"".join(chunks)
