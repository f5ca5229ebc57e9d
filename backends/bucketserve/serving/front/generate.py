"""`generate` and `generate_stream` on the public port, relayed to Triton over gRPC streaming.

Why not Triton's own HTTP generate_stream: under load, Triton 2.51 closes some of its SSE
streams cleanly before their last event (9 in 300 s, 38 cut and 10 hung in 600 s of soak),
while the same load over gRPC streaming to the same models cuts none (issue 13,
docs/architecture.md, docs/platform-notes.md#p21-http-generate-stream-cut-under-load). So the
front speaks Triton's generate JSON itself (front/generate_json.py maps it exactly as Triton
does) and asks Triton over gRPC. A client that goes away stops its
request (grpc_mux.py: a `stop` request with its id, which reaches a running decode step on
the ensemble and on `bucketserve_bls` alike).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import grpc
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from tritonclient.grpc import InferResult

from bucketserve.serving.front.disconnect import ClientGone, unless_disconnected
from bucketserve.serving.front.errors import BUSY_MARK, error
from bucketserve.serving.front.generate_json import input_specs, tensor, to_request, to_response
from bucketserve.serving.front.grpc_mux import Broken, StreamPool
from bucketserve.serving.front.health import Health
from bucketserve.serving.front.metrics import FrontMetrics

SSE = "text/event-stream; charset=utf-8"
ONE_RESPONSE = (
    "generate expects the model to produce exactly 1 response; use generate_stream for a model"
    ' that streams (or send "stream": false)'
)
RESERVED = ("sequence_id", "sequence_start", "sequence_end", "priority", "binary_data_output")


def event(doc: dict) -> bytes:
    return b"data: " + json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


def stop_inputs(specs: dict) -> list | None:
    """A TensorRT-LLM-style stop request for a model that takes one (ours all do)."""
    if "stop" not in specs or "text_input" not in specs:
        return None
    return [tensor(specs["text_input"], "stop"), tensor(specs["stop"], True)]


async def documents(answers, model: str, version: str) -> AsyncIterator[dict]:
    """Generate JSON per answer with outputs ({"error": ...} for an error answer)."""
    try:
        async for resp in answers:
            if resp.error_message:
                yield {"error": resp.error_message}
            elif resp.infer_response.outputs:
                yield to_response(InferResult(resp.infer_response), model, version)
    finally:
        await answers.aclose()  # now, not when collected: leaving early sends the stop


class GenerateRelay:
    """Serves the generate endpoints from Triton's gRPC port (a few shared streams)."""

    def __init__(
        self, target: str, health: Health, metrics: FrontMetrics, front, metadata: tuple = ()
    ) -> None:
        self.health, self.metrics = health, metrics
        self.front = front  # its went_away / cause: one account of a failed server for both paths
        self.pool = StreamPool(target, metadata=metadata)  # the edge's one pool, OpenAI's too
        self.specs: dict[tuple[str, str, int], dict] = {}  # per model, version, server start

    async def open(self) -> None:
        await self.pool.open()

    async def close(self) -> None:
        await self.pool.close()

    async def input_specs(self, model: str, version: str) -> dict:
        key = (model, version, self.health.restarts)  # a restarted server re-reads its models
        if key not in self.specs:
            self.specs[key] = input_specs(await self.pool.metadata(model, version))
        return self.specs[key]

    async def handle(
        self, model: str, version: str, body: bytes, stream: bool, request: Request | None = None
    ) -> Response:
        """One generate request whose body the edge has already bounded and checked; with
        `request`, a client that hangs up before a whole answer is ready stops it."""
        try:
            doc = json.loads(body) if body.strip() else None
            specs = await self.input_specs(model, version)
        except grpc.RpcError as e:  # unknown model, or Triton is down
            if e.code() == grpc.StatusCode.UNAVAILABLE:
                return await self.front.went_away(e)
            return error(400, e.details())
        except ValueError as e:
            return error(400, f"request body is not valid JSON: {e}")
        try:
            inputs, params = to_request(doc, specs)
            for key in RESERVED:
                if key in params:
                    raise ValueError(f"'{key}' is a reserved request parameter")
        except ValueError as e:
            return error(400, str(e))
        answers = self.pool.generate(model, version, inputs, params, stop_inputs(specs))
        return await self.respond(documents(answers, model, version or "1"), stream, request)

    async def respond(
        self, docs: AsyncIterator[dict], stream: bool, request: Request | None = None
    ) -> Response:
        """The response; with `request`, a client that hangs up before the first answer (a
        stream) or the whole answer (generate) stops the request (front/disconnect.py)."""
        if request is None:
            return await self.first_answer(docs, stream)
        try:
            return await unless_disconnected(request, self.first_answer(docs, stream))
        except ClientGone:
            return error(499, "client closed the request")  # nobody reads it

    async def first_answer(self, docs: AsyncIterator[dict], stream: bool) -> Response:
        """Wait for the first answer: it sets the status (busy -> 503, an error -> 400)."""
        try:
            first = await anext(docs, None)
        except Broken as e:
            return await self.front.went_away(e)
        if first is not None and "error" in first:
            await docs.aclose()
            if BUSY_MARK in first["error"]:
                self.metrics.rejected.labels("busy").inc()
                return error(503, first["error"], retry=True)
            if not stream:
                return error(400, first["error"])
            return Response(event(first), 400, media_type=SSE)
        if not stream:
            return await self.collect(first, docs)
        return StreamingResponse(self.relay(first, docs), media_type=SSE)

    async def collect(self, first: dict | None, docs: AsyncIterator[dict]) -> Response:
        """generate: the one response (Triton answers the same when a model streams several)."""
        found = [first] if first is not None else []
        try:
            found += [d async for d in docs]
        except Broken as e:
            return await self.front.went_away(e)
        errors = [d["error"] for d in found if "error" in d]
        if errors:
            return error(400, errors[0])
        if len(found) != 1:
            return error(400, ONE_RESPONSE)
        return JSONResponse(found[0])

    async def relay(self, first: dict | None, docs: AsyncIterator[dict]):
        """generate_stream: every answer as an SSE event; a lost server ends in an error."""
        try:
            if first is not None:
                yield event(first)
            async for doc in docs:
                yield event(doc)
        except Broken as e:
            self.metrics.broken.inc()
            yield event({"error": f"server went away: {await self.front.cause(e)}"})
        finally:
            await docs.aclose()  # a client that left: the request is stopped
