"""The FastAPI app: /v1/models, /v1/chat/completions, /v1/completions, /health, /metrics."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from bucketserve.serving.openai import responses as R
from bucketserve.serving.openai.protocol import ChatRequest, CompletionRequest, OpenAIError
from bucketserve.serving.openai.triton import TritonError, build_inputs, generate

OVERLOAD = re.compile(r"busy|retry|overload|not healthy|shutting down", re.I)
FIELD = re.compile(r"^(?:sampling_parameters\.)?([a-z_]+)[= ]")
DISCONNECT_POLL_S = 0.2


@dataclass(slots=True)
class Settings:
    """Where Triton is, what the model is called, and its tokenizer (for the chat template)."""

    grpc_url: str
    metrics_url: str
    model: str
    tokenizer: object


class ConcurrencyCap:
    """ASGI middleware: beyond `limit` POSTs in flight (a stream counts until its last chunk),
    answer `503 server busy ... retry` at once, before the body is read or Triton is called,
    as the HTTP front does for `--max-concurrent-requests` (0: no cap)."""

    def __init__(self, app, limit: int = 0) -> None:
        self.app, self.limit, self.inflight = app, limit, 0

    async def __call__(self, scope, receive, send) -> None:
        if self.limit <= 0 or scope["type"] != "http" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        if self.inflight >= self.limit:
            busy = OpenAIError(503, f"server busy: {self.inflight} requests in flight"
                               f" (max_concurrent_requests={self.limit}); retry")  # fmt: skip
            answer = JSONResponse(busy.body(), status_code=503, headers={"Retry-After": "1"})
            return await answer(scope, receive, send)
        self.inflight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.inflight -= 1


def create_app(settings: Settings, client, pool, max_concurrent: int = 0) -> FastAPI:
    """`client`: a tritonclient.grpc.aio InferenceServerClient, `pool`: an open StreamPool
    (both created in the server's loop); `max_concurrent`: see ConcurrencyCap."""
    app = FastAPI(title="BucketServe OpenAI-compatible API")
    app.add_middleware(ConcurrencyCap, limit=max_concurrent)
    app.state.settings, app.state.client, app.state.pool = settings, client, pool
    app.add_exception_handler(OpenAIError, _openai_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.get("/v1/models")(lambda: _models(settings))
    app.get("/health")(_health)
    app.get("/metrics")(_metrics)
    app.post("/v1/chat/completions")(_chat)
    app.post("/v1/completions")(_completions)
    return app


async def _openai_error(request: Request, e: OpenAIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


async def _validation_error(request: Request, e: RequestValidationError) -> JSONResponse:
    err = e.errors()[0]
    loc = [str(x) for x in err.get("loc", ()) if x != "body"]
    param = ".".join(loc) or None
    return JSONResponse(OpenAIError(400, f"{param}: {err['msg']}", param).body(), status_code=400)


def _models(s: Settings) -> dict:
    return {"object": "list",
            "data": [{"id": s.model, "object": "model", "created": 0, "owned_by": "bucketserve"}]}  # fmt: skip


async def _health(request: Request) -> JSONResponse:
    try:
        ready = await request.app.state.client.is_server_ready()
    except Exception:
        ready = False
    return JSONResponse({"status": "ok" if ready else "unavailable"}, 200 if ready else 503)


async def _metrics(request: Request) -> PlainTextResponse:
    url = request.app.state.settings.metrics_url

    def fetch() -> str:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.read().decode()

    return PlainTextResponse(await asyncio.to_thread(fetch), media_type="text/plain; version=0.0.4")


def _check_model(req, s: Settings) -> None:
    if req.model != s.model:
        raise OpenAIError(404, f"The model '{req.model}' does not exist; served: '{s.model}'",
                          "model", "not_found_error")  # fmt: skip


async def _chat(req: ChatRequest, request: Request):
    s: Settings = request.app.state.settings
    _check_model(req, s)
    req.check()
    try:
        prompt = s.tokenizer.apply_chat_template(req.texts(), tokenize=False, add_generation_prompt=True)  # fmt: skip
    except Exception as e:
        raise OpenAIError(400, f"messages: the chat template failed: {e}", "messages") from None
    k = req.num_logprobs
    sampling = req.sampling(req.max_completion_tokens or req.max_tokens, k)
    inputs = build_inputs(prompt, sampling, echo=False, logprobs=k is not None)
    return await _respond(request, req, inputs, ChatShape(s.model, k))


async def _completions(req: CompletionRequest, request: Request):
    s: Settings = request.app.state.settings
    _check_model(req, s)
    req.check()
    k = req.logprobs
    inputs = build_inputs(req.text, req.sampling(req.max_tokens, k), req.echo, k is not None)
    return await _respond(request, req, inputs, CompletionShape(s.model, k))


class ChatShape:
    """How chat answers look (whole and streamed)."""

    obj = "chat.completion.chunk"

    def __init__(self, model: str, k: int | None) -> None:
        self.model, self.k, self.id = model, k, R.new_id("chatcmpl")

    def logprobs(self, entries: list[dict], offset: int):
        return R.chat_logprobs(entries, self.k) if self.k is not None else None

    def whole(self, text, reason, entries, u):
        return R.chat_response(self.id, self.model, text, reason, self.logprobs(entries, 0), u)

    def first(self, with_usage: bool) -> list[dict]:
        delta = {"role": "assistant", "content": ""}
        return [R.chat_chunk(self.id, self.model, delta, with_usage=with_usage)]

    def chunk(self, text, reason, entries, offset, with_usage):
        delta = {"content": text} if text else {}
        lp = self.logprobs(entries, offset)
        return R.chat_chunk(self.id, self.model, delta, reason, lp, with_usage=with_usage)


class CompletionShape(ChatShape):
    """How legacy completion answers look."""

    obj = "text_completion"

    def __init__(self, model: str, k: int | None) -> None:
        self.model, self.k, self.id = model, k, R.new_id("cmpl")

    def logprobs(self, entries: list[dict], offset: int):
        return R.completion_logprobs(entries, self.k, offset) if self.k is not None else None

    def whole(self, text, reason, entries, u):
        return R.completion_response(self.id, self.model, text, reason, self.logprobs(entries, 0), u)  # fmt: skip

    def first(self, with_usage: bool) -> list[dict]:
        return []

    def chunk(self, text, reason, entries, offset, with_usage):
        lp = self.logprobs(entries, offset)
        return R.completion_chunk(self.id, self.model, text, reason, lp, with_usage=with_usage)


def triton_error(message: str) -> OpenAIError:
    if OVERLOAD.search(message):
        return OpenAIError(503, message)
    m = FIELD.match(message)
    return OpenAIError(400, message, m.group(1) if m else None)


async def _respond(request: Request, req, inputs: list, shape):
    chunks = generate(request.app.state.pool, inputs)
    try:
        first = await anext(chunks)
    except TritonError as e:
        raise triton_error(str(e)) from None
    if req.stream:
        with_usage = bool(req.stream_options and req.stream_options.include_usage)
        return StreamingResponse(_sse(first, chunks, shape, with_usage), media_type="text/event-stream")  # fmt: skip
    task = asyncio.ensure_future(_collect(first, chunks))
    while not task.done():  # a client that hangs up cancels the generation (frees its KV)
        await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
        if not task.done() and await request.is_disconnected():
            task.cancel()
            await chunks.aclose()
            raise OpenAIError(499, "client closed the request")
    text, reason, entries, last = task.result()
    return shape.whole(
        text,
        reason,
        entries,
        R.usage(last.num_input_tokens, last.num_output_tokens, last.num_cached_tokens),
    )


async def _collect(first, chunks):
    text, entries, last = first.text, list(first.logprobs), first
    async for c in chunks:
        text, last = text + c.text, c
        entries += c.logprobs
    return text, last.finish_reason, entries, last


async def _sse(first, chunks, shape, with_usage: bool):
    """Server-sent events: chunks as they come, the usage chunk if asked, then [DONE]."""
    for obj in shape.first(with_usage):
        yield _event(obj)
    offset, last = 0, first
    try:
        c = first
        while True:
            if c.text or c.finish_reason or c.logprobs:
                yield _event(shape.chunk(c.text, c.finish_reason, c.logprobs, offset, with_usage))
            offset, last = offset + len(c.text), c
            c = await anext(chunks, None)
            if c is None:
                break
    except TritonError as e:
        yield _event(triton_error(str(e)).body())
    finally:
        await chunks.aclose()
    if with_usage:
        u = R.usage(last.num_input_tokens, last.num_output_tokens, last.num_cached_tokens)
        yield _event(R.usage_chunk(shape.id, shape.model, shape.obj, u))
    yield "data: [DONE]\n\n"


def _event(obj: dict) -> str:
    return f"data: {json.dumps(obj)}\n\n"
