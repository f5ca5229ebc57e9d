"""`generate` and `generate_stream` on the public port, relayed to Triton over gRPC streaming.

Why not Triton's own HTTP generate_stream: under load, Triton 2.51 closes some of its SSE
streams cleanly before their last event (9 in 300 s, 38 cut and 10 hung in 600 s of soak),
while the same load over gRPC streaming to the same models cuts none (issue 13,
docs/architecture.md). So the front speaks Triton's generate JSON itself (front/generate_json.py
maps it exactly as Triton does) and asks Triton over gRPC. A client that goes away cancels the
gRPC call, which `bucketserve_bls` sees as a cancellation (the ensemble only between steps).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable

import grpc
import tritonclient.grpc.aio as grpcaio
from bucketserve.serving.front.generate_json import input_specs, to_request, to_response
from bucketserve.serving.front.health import Health
from bucketserve.serving.front.metrics import FrontMetrics
from starlette.responses import JSONResponse, Response, StreamingResponse
from tritonclient.utils import InferenceServerException

BUSY_MARK = "server busy"
CUT_MESSAGE = "stream ended without a final response (issue 13)"
SSE = "text/event-stream; charset=utf-8"
ONE_RESPONSE = (
    "generate expects the model to produce exactly 1 response; use generate_stream for a model"
    ' that streams (or send "stream": false)'
)
# a request parameter Triton's gRPC front reads: send an empty last response with the FINAL flag
FINAL_PARAMS = {"triton_enable_empty_final_response": True}
RESERVED = ("sequence_id", "sequence_start", "sequence_end", "priority", "binary_data_output")

log = logging.getLogger(__name__)


def error(status: int, message: str, retry: bool = False) -> JSONResponse:
    """Triton's own error body shape, so clients parse ours the same way."""
    headers = {"Retry-After": "1"} if retry else None
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def event(doc: dict) -> bytes:
    return b"data: " + json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


class Upstream(Exception):
    """Triton could not be reached or went away (the transport, not the model)."""


class Generation:
    """One gRPC stream: yields (response JSON, is_final) or raises Upstream / returns on cut."""

    def __init__(self, client: grpcaio.InferenceServerClient, request: dict) -> None:
        self.done = asyncio.Event()
        self.finished = False  # the FINAL flag arrived
        self.request = request
        self.call = client.stream_infer(self.requests())

    async def requests(self):
        yield self.request
        await self.done.wait()  # the stream stays open until the answer is complete

    async def responses(self, model: str, version: str) -> AsyncIterator[dict]:
        try:
            async for result, err in self.call:
                if err is not None:
                    self.finished = True  # an error response ends the request (it is FINAL)
                    yield {"error": err.message()}
                    return
                response = result.get_response()
                final = response.parameters["triton_final_response"].bool_param
                if response.outputs:
                    yield to_response(result, model, version)
                if final:
                    self.finished = True
                    return
        except grpc.RpcError as e:
            raise Upstream(f"{type(e).__name__}: {e.code().name}") from e
        finally:
            self.close()

    def close(self) -> None:
        self.done.set()
        self.call.cancel()  # a no-op after the FINAL flag; stops the generation otherwise


class GenerateRelay:
    """Serves the generate endpoints from Triton's gRPC port (one channel, reconnecting)."""

    def __init__(self, target: str, health: Health, metrics: FrontMetrics, cause: Callable) -> None:
        self.target, self.health, self.metrics, self.cause = target, health, metrics, cause
        self.client: grpcaio.InferenceServerClient | None = None
        self.inflight = 0  # requests being answered now (the shutdown drain waits on them)
        self.specs: dict[tuple[str, str, int], dict] = {}  # per model, version, server start

    async def open(self) -> None:
        self.client = grpcaio.InferenceServerClient(self.target)

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()

    async def input_specs(self, model: str, version: str) -> dict:
        key = (model, version, self.health.restarts)  # a restarted server re-reads its models
        if key not in self.specs:
            self.specs[key] = input_specs(await self.client.get_model_metadata(model, version))
        return self.specs[key]

    async def handle(self, model: str, version: str, body: bytes, stream: bool) -> Response:
        """One generate request whose body the front has already bounded and checked."""
        self.inflight += 1
        try:
            response = await self.answer(model, version, body, stream)
        except BaseException:
            self.inflight -= 1
            raise
        if not isinstance(response, StreamingResponse):  # a stream counts until it ends
            self.inflight -= 1
        return response

    async def answer(self, model: str, version: str, body: bytes, stream: bool) -> Response:
        try:
            doc = json.loads(body) if body.strip() else None
            specs = await self.input_specs(model, version)
        except InferenceServerException as e:  # unknown model, or Triton is down
            if e.status() == "StatusCode.UNAVAILABLE":
                return await self.went_away(e)
            return error(400, e.message())
        except ValueError as e:
            return error(400, f"request body is not valid JSON: {e}")
        try:
            inputs, params = to_request(doc, specs)
            for key in RESERVED:
                if key in params:
                    raise ValueError(f"'{key}' is a reserved request parameter")
        except ValueError as e:
            return error(400, str(e))
        request = {"model_name": model, "model_version": version, "inputs": inputs,
                   "parameters": {**params, **FINAL_PARAMS}}  # fmt: skip
        return await self.respond(Generation(self.client, request), model, version, stream)

    async def respond(self, gen: Generation, model: str, version: str, stream: bool) -> Response:
        """Wait for the first response: it sets the status (busy -> 503, an error -> 400)."""
        responses = gen.responses(model, version or "1")
        try:
            first = await anext(responses, None)
        except Upstream as e:
            return await self.went_away(e)
        if first is not None and "error" in first:
            if BUSY_MARK in first["error"]:
                self.metrics.rejected.labels("busy").inc()
                return error(503, first["error"], retry=True)
            if not stream:
                return error(400, first["error"])
            return Response(event(first), 400, media_type=SSE)
        if not stream:
            return await self.collect(first, responses, gen)
        return StreamingResponse(self.relay(first, responses, gen), media_type=SSE)

    async def collect(self, first: dict | None, responses, gen: Generation) -> Response:
        """generate: the one response (Triton answers the same when a model streams several)."""
        docs = [first] if first is not None else []
        try:
            async for doc in responses:
                docs.append(doc)
        except Upstream as e:
            return await self.went_away(e)
        errors = [d["error"] for d in docs if "error" in d]
        if errors:
            return error(400, errors[0])
        if not gen.finished:
            self.metrics.cut.inc()
            return error(502, CUT_MESSAGE)
        if len(docs) != 1:
            return error(400, ONE_RESPONSE)
        return JSONResponse(docs[0])

    async def relay(self, first: dict | None, responses, gen: Generation):
        """generate_stream: every response as an SSE event; a lost stream ends in an error."""
        try:
            if first is not None:
                yield event(first)
            async for doc in responses:
                yield event(doc)
            if not gen.finished:
                self.metrics.cut.inc()
                log.warning("%s (gRPC stream closed before the FINAL flag)", CUT_MESSAGE)
                yield event({"error": CUT_MESSAGE})
        except Upstream as e:
            self.metrics.broken.inc()
            yield event({"error": f"server went away: {await self.cause(e)}"})
        finally:
            gen.close()
            self.inflight -= 1

    async def went_away(self, exc: Exception) -> Response:
        self.metrics.broken.inc()
        return error(503, f"server went away: {await self.cause(exc)}; retry", retry=True)
