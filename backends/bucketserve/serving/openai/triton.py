"""One generation through Triton's asyncio gRPC streaming to `bucketserve_bls` (the entry model
that sees cancellation: closing the stream stops decoding and frees the KV blocks)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import numpy as np
import tritonclient.grpc.aio as grpcaio
from tritonclient.grpc import InferInput

ENTRY_MODEL = "bucketserve_bls"


@dataclass(slots=True)
class Chunk:
    """What one Triton response adds: text, its token log-probs, and the running counts."""

    text: str
    finish_reason: str
    num_input_tokens: int
    num_output_tokens: int  # cumulative, as the decode model reports it
    logprobs: list[dict] = field(default_factory=list)  # vLLM-backend shape, one per token


class TritonError(Exception):
    """Triton answered the request with an error (its message names the field)."""


def _tensor(name: str, value, dtype: str, np_dtype) -> InferInput:
    t = InferInput(name, [1], dtype)
    t.set_data_from_numpy(np.array([value], dtype=np_dtype))
    return t


def build_inputs(text: str, sampling: dict, echo: bool, logprobs: bool) -> list[InferInput]:
    """The vLLM backend's convention: [1] tensors plus `sampling_parameters` JSON."""
    return [
        _tensor("text_input", text.encode(), "BYTES", np.object_),
        _tensor("stream", True, "BOOL", np.bool_),
        _tensor("sampling_parameters", json.dumps(sampling).encode(), "BYTES", np.object_),
        _tensor("exclude_input_in_output", not echo, "BOOL", np.bool_),
        _tensor("return_logprobs", logprobs, "BOOL", np.bool_),
    ]


async def generate(client: grpcaio.InferenceServerClient, inputs: list) -> AsyncIterator[Chunk]:
    """Yield a Chunk per response until the final one; leaving early cancels the request."""
    done = asyncio.Event()
    request = {"model_name": ENTRY_MODEL, "inputs": inputs,
               "request_id": f"oai-{uuid.uuid4().hex}"}  # fmt: skip

    async def requests():
        yield request
        await done.wait()  # keep the stream open until the answer is complete

    stream = client.stream_infer(requests())
    try:
        async for result, error in stream:
            if error is not None:
                raise TritonError(error.message() if hasattr(error, "message") else str(error))
            chunk = _chunk(result)
            if chunk is not None:
                yield chunk
            if chunk is None or chunk.finish_reason:  # the final response carries the reason
                return
    finally:
        done.set()
        stream.cancel()  # a no-op after the final response; stops generation otherwise


def _chunk(result) -> Chunk | None:
    if not result.get_response().outputs:
        return None
    raw = result.as_numpy("logprobs")
    logprobs = json.loads(raw.reshape(-1)[0] or b"[]") if raw is not None else []
    return Chunk(
        text=result.as_numpy("text_output").reshape(-1)[0].decode("utf-8"),
        finish_reason=result.as_numpy("finish_reason").reshape(-1)[0].decode(),
        num_input_tokens=int(result.as_numpy("num_input_tokens").reshape(-1)[0]),
        num_output_tokens=int(result.as_numpy("num_output_tokens").reshape(-1)[0]),
        logprobs=logprobs,
    )
