"""The OpenAI routes of the edge: /v1/models, /v1/chat/completions, /v1/completions.

A FastAPI app mounted at /v1 inside the edge (serving/front/app.py): the edge's admission point
caps and counts these requests with the v2 ones, they stream over the edge's one gRPC pool, and
`/health` and `/metrics` are the edge's.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse

from bucketserve.serving.front.disconnect import ClientGone, unless_disconnected
from bucketserve.serving.front.errors import OVERLOAD
from bucketserve.serving.openai import responses as R
from bucketserve.serving.openai.protocol import ChatRequest, CompletionRequest, OpenAIError
from bucketserve.serving.openai.triton import TritonError, build_inputs, generate

FIELD = re.compile(r"^(?:sampling_parameters\.)?([a-z_]+)[= ]")


@dataclass(slots=True)
class Settings:
    """What the model is called, and how to get its tokenizer (for the chat template): loaded
    on the first chat request, off the event loop, so the edge listens before it is needed."""

    model: str
    load_tokenizer: Callable[[], object] | None = None
    tokenizer: object = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def get_tokenizer(self):
        async with self.lock:
            if self.tokenizer is None and self.load_tokenizer is not None:
                self.tokenizer = await asyncio.to_thread(self.load_tokenizer)
        return self.tokenizer


def create_app(settings: Settings, pool, edge=None) -> FastAPI:
    """`pool`: the edge's StreamPool (opened in the edge's loop); `edge`: the Front."""
    app = FastAPI(title="BucketServe OpenAI-compatible API")
    app.state.settings, app.state.pool, app.state.edge = settings, pool, edge
    app.add_exception_handler(OpenAIError, _openai_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.get("/models")(lambda: _models(settings))
    app.post("/chat/completions")(_chat)
    app.post("/completions")(_completions)
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


def _check_model(req, s: Settings) -> None:
    if req.model != s.model:
        raise OpenAIError(404, f"The model '{req.model}' does not exist; served: '{s.model}'",
                          "model", "not_found_error")  # fmt: skip


async def _chat(req: ChatRequest, request: Request):
    s: Settings = request.app.state.settings
    _check_model(req, s)
    req.check()
    tokenizer = await s.get_tokenizer()
    try:
        prompt = tokenizer.apply_chat_template(req.texts(), tokenize=False, add_generation_prompt=True)  # fmt: skip
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
    """An error answer from Triton: retry-later ones are 503, the rest 400 naming the field."""
    if OVERLOAD.search(message):
        return OpenAIError(503, message)
    m = FIELD.match(message)
    return OpenAIError(400, message, m.group(1) if m else None)


async def _respond(request: Request, req, inputs: list, shape):
    """A client that hangs up before the first chunk (a stream) or the whole answer stops
    the generation (frees its KV), as on v2 routes (front/disconnect.py)."""
    chunks = generate(request.app.state.pool, inputs)
    try:
        return await unless_disconnected(request, _answer(req, chunks, shape))
    except ClientGone:
        await chunks.aclose()
        raise OpenAIError(499, "client closed the request") from None


async def _answer(req, chunks, shape):
    try:
        first = await anext(chunks)
        if req.stream:
            with_usage = bool(req.stream_options and req.stream_options.include_usage)
            return StreamingResponse(_sse(first, chunks, shape, with_usage), media_type="text/event-stream")  # fmt: skip
        text, reason, entries, last = await _collect(first, chunks)
    except TritonError as e:
        await chunks.aclose()
        raise triton_error(str(e)) from None
    u = R.usage(last.num_input_tokens, last.num_output_tokens, last.num_cached_tokens)
    return shape.whole(text, reason, entries, u)


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
