"""One generation through Triton's gRPC streaming to `bucketserve_bls`, over the few long-lived
streams of a StreamPool (front/grpc_mux.py: one stream per request leaks in Triton 2.51,
docs/platform-notes.md#p22-memory-per-grpc-stream). A generation left early is stopped with a
`stop` request carrying its id (frees its KV blocks)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import numpy as np
from tritonclient.grpc import InferResult

from bucketserve.serving.front.generate_json import Tensor
from bucketserve.serving.front.grpc_mux import Broken, StreamPool

ENTRY_MODEL = "bucketserve_bls"


@dataclass(slots=True)
class Chunk:
    """What one Triton response adds: text, its token log-probs, and the running counts."""

    text: str
    finish_reason: str
    num_input_tokens: int
    num_output_tokens: int  # cumulative, as the decode model reports it
    logprobs: list[dict] = field(default_factory=list)  # vLLM-backend shape, one per token
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache (final response)


class TritonError(Exception):
    """Triton answered the request with an error (its message names the field)."""


def _tensor(name: str, value, dtype: str, np_dtype) -> Tensor:
    return Tensor(name, dtype, (1,), np.array([value], dtype=np_dtype))


def build_inputs(text: str, sampling: dict, echo: bool, logprobs: bool) -> list[Tensor]:
    """The vLLM backend's convention: [1] tensors plus `sampling_parameters` JSON."""
    return [
        _tensor("text_input", text.encode(), "BYTES", np.object_),
        _tensor("stream", True, "BOOL", np.bool_),
        _tensor("sampling_parameters", json.dumps(sampling).encode(), "BYTES", np.object_),
        _tensor("exclude_input_in_output", not echo, "BOOL", np.bool_),
        _tensor("return_logprobs", logprobs, "BOOL", np.bool_),
    ]


STOP = [
    _tensor("text_input", b"stop", "BYTES", np.object_),
    _tensor("stop", True, "BOOL", np.bool_),
]


async def generate(pool: StreamPool, inputs: list[Tensor]) -> AsyncIterator[Chunk]:
    """Yield a Chunk per response until the final one; leaving early stops the request."""
    answers = pool.generate(ENTRY_MODEL, "", inputs, {}, STOP)
    try:
        async for resp in answers:
            if resp.error_message:
                raise TritonError(resp.error_message)
            if resp.infer_response.outputs:
                yield _chunk(InferResult(resp.infer_response))
    except Broken as e:
        raise TritonError(f"server unavailable ({e}); retry") from None
    finally:
        await answers.aclose()


def _chunk(result) -> Chunk:
    raw = result.as_numpy("logprobs")
    logprobs = json.loads(raw.reshape(-1)[0] or b"[]") if raw is not None else []
    cached = result.as_numpy("num_cached_tokens")
    return Chunk(
        text=result.as_numpy("text_output").reshape(-1)[0].decode("utf-8"),
        finish_reason=result.as_numpy("finish_reason").reshape(-1)[0].decode(),
        num_input_tokens=int(result.as_numpy("num_input_tokens").reshape(-1)[0]),
        num_output_tokens=int(result.as_numpy("num_output_tokens").reshape(-1)[0]),
        logprobs=logprobs,
        num_cached_tokens=int(cached.reshape(-1)[0]) if cached is not None else 0,
    )
