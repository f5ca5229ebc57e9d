"""The public HTTP port: Triton's HTTP API, guarded, with generate served over gRPC.

It exists because Triton 2.51's HTTP front end crashes on some bodies (DESIGN fact 11) and cuts
some generate_stream streams under load (issue 13): every body is read here first, bounded by
`max_request_bytes`, and checked (front/guard.py) before one byte reaches Triton; `generate` and
`generate_stream` go to Triton's gRPC streaming API (front/generate.py), everything else to its
internal HTTP endpoint. It also answers readiness from the supervisor (not-ready while degraded
or draining) and ends in-flight requests with an error that names why the server went away.
"""

from __future__ import annotations

import asyncio
import contextlib
import re

import anyio
import httpx
from bucketserve.serving.front.generate import BUSY_MARK, GenerateRelay, error
from bucketserve.serving.front.guard import BodyTooLarge, check_request, forward_headers
from bucketserve.serving.front.health import Health
from bucketserve.serving.front.metrics import FrontMetrics
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

CAUSE_WAIT_S = 1.0  # a reset may reach us before the supervisor has noticed the crash
INLINE_CHECK_BYTES = 64 * 1024
HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade"}
GENERATE = re.compile(r"/v2/models/([^/]+)(?:/versions/([^/]+))?/(generate|generate_stream)")


class Front:
    """Routes, the upstream client and the in-flight count the shutdown drain waits on."""

    def __init__(
        self, health: Health, metrics: FrontMetrics, max_request_bytes: int, grpc_target: str,
        max_concurrent: int = 0,
    ) -> None:  # fmt: skip
        self.health = health
        self.metrics = metrics
        self.max_request_bytes = max_request_bytes
        self.max_concurrent = max_concurrent  # inference requests in flight; 0: no cap
        self.proxied = 0  # requests relayed over HTTP now
        self.client: httpx.AsyncClient | None = None
        self.loop: asyncio.AbstractEventLoop | None = None  # uvicorn's, once it serves
        self.generate = GenerateRelay(grpc_target, health, metrics, self)
        self.app = Starlette(
            routes=[
                Route("/v2/health/ready", self.ready, methods=["GET"]),
                Route("/v2/health/live", self.live, methods=["GET"]),
                Route("/metrics", self.prometheus, methods=["GET"]),
                Route("/{path:path}", self.proxy, methods=["GET", "POST", "PUT", "DELETE"]),
            ],
            lifespan=self.lifespan,
        )

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
        """Requests being answered now, over either path (the shutdown drain waits on them)."""
        return self.proxied + self.generate.inflight

    async def ready(self, request: Request) -> Response:
        if not self.health.is_ready:
            return error(503, f"not ready: {self.health.cause}")
        return await self.proxy(request)

    async def live(self, request: Request) -> Response:
        return Response(status_code=200)  # the launcher is up; it restarts Triton on its own

    async def prometheus(self, request: Request) -> Response:
        self.metrics.ready.set(1 if self.health.is_ready else 0)
        self.metrics.inflight.set(self.inflight)
        return Response(self.metrics.render(), media_type="text/plain; version=0.0.4")

    async def proxy(self, request: Request) -> Response:
        if not self.health.is_ready:
            self.metrics.rejected.labels("not_ready").inc()
            return error(503, f"server unavailable: {self.health.cause}; retry", retry=True)
        if request.method == "POST" and 0 < self.max_concurrent <= self.inflight:
            # Before Triton: a busy answer from the scheduler comes only after the request
            # went through Triton and tokenization (16 s at the 90th percentile under 2x load),
            # and every request Triton holds costs memory there and in the stubs.
            self.metrics.rejected.labels("concurrency").inc()
            return error(503, f"server busy: {self.inflight} requests in flight"
                         f" (max_concurrent_requests={self.max_concurrent}); retry", retry=True)  # fmt: skip
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
            return await self.generate.handle(model, version or "", body, kind == "generate_stream")
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
        self.proxied += 1
        try:
            resp = await self.client.send(up, stream=True)
        except httpx.TransportError as e:
            self.proxied -= 1
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
            self.proxied -= 1
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
            self.proxied -= 1
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
