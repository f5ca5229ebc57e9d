"""Responses as the caller sees them: Chunk, Completion, GenerationError, and the parser."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

FINAL_PARAMETER = "triton_final_response"  # set on every response when empty finals are enabled


class GenerationError(RuntimeError):
    """The server (or the connection to it) failed a request; carries the server's message."""

    def __init__(self, message: str, request_id: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.request_id = request_id


@dataclass(slots=True, frozen=True)
class Chunk:
    """One streamed response: a text delta and the counts so far."""

    text: str
    finish_reason: str  # "" until the last chunk, then stop | length | cancelled
    num_input_tokens: int
    num_output_tokens: int  # cumulative
    time: float  # seconds from sending the request to receiving this chunk


@dataclass(slots=True, frozen=True)
class Completion:
    """A finished generation. With stream=False the server answers once, so ttft_s == latency_s."""

    text: str
    finish_reason: str
    num_input_tokens: int
    num_output_tokens: int
    ttft_s: float
    latency_s: float
    request_id: str = ""


def error_message(error) -> str:
    """The server's message of a tritonclient exception (without the gRPC status prefix)."""
    message = getattr(error, "message", None)
    text = message() if callable(message) else None
    if text is None and hasattr(error, "details"):  # grpc.RpcError from the asyncio client
        text = error.details()
    return text or str(error)


def first_value(result, name: str):
    """The single value of a [1] output, or None when the response does not carry it."""
    arr = result.as_numpy(name)
    if arr is None or arr.size == 0:
        return None
    value = arr.reshape(-1)[0]
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else value


def is_final(result) -> bool:
    """True when the response carries Triton's FINAL flag (needs enable_empty_final_response)."""
    parameters = result.get_response().parameters
    return FINAL_PARAMETER in parameters and parameters[FINAL_PARAMETER].bool_param


def parse_chunk(result, elapsed_s: float) -> Chunk | None:
    """The Chunk a response carries; None for a flags-only (empty) response."""
    text = first_value(result, "text_output")
    reason = first_value(result, "finish_reason")
    if text is None and reason is None:
        return None
    n_in = first_value(result, "num_input_tokens")
    n_out = first_value(result, "num_output_tokens")
    return Chunk(
        text=text or "",
        finish_reason=str(reason or ""),
        num_input_tokens=int(n_in or 0),
        num_output_tokens=int(n_out or 0),
        time=elapsed_s,
    )


@dataclass(slots=True)
class StreamState:
    """Where one request's stream stands; turns (result, error) pairs into chunks."""

    request_id: str
    start: float = field(default_factory=time.monotonic)
    is_finished: bool = False  # a finish_reason, an error or the FINAL flag was seen
    is_final: bool = False  # the FINAL flag was seen: nothing more will come

    def on_response(self, result, error) -> Chunk | None:
        """The chunk worth showing the caller, or None; raises GenerationError on an error."""
        if error is not None:
            self.is_finished = self.is_final = True
            raise GenerationError(error_message(error), self.request_id)
        chunk = parse_chunk(result, time.monotonic() - self.start)
        if is_final(result):
            self.is_finished = self.is_final = True
        if chunk is None:
            return None
        if chunk.finish_reason:
            self.is_finished = True
        return chunk if chunk.text or chunk.finish_reason else None


@dataclass(slots=True)
class Collector:
    """Joins a request's chunks into its Completion."""

    request_id: str
    parts: list[str] = field(default_factory=list)
    last: Chunk | None = None
    ttft_s: float | None = None

    def add(self, chunk: Chunk) -> None:
        """Take one chunk; the first with output sets ttft_s."""
        if self.ttft_s is None and (chunk.text or chunk.num_output_tokens):
            self.ttft_s = chunk.time
        self.parts.append(chunk.text)
        self.last = chunk

    def completion(self, latency_s: float) -> Completion:
        """The Completion of the chunks taken so far."""
        last = self.last
        return Completion(
            text="".join(self.parts),
            finish_reason=last.finish_reason if last else "",
            num_input_tokens=last.num_input_tokens if last else 0,
            num_output_tokens=last.num_output_tokens if last else 0,
            ttft_s=latency_s if self.ttft_s is None else self.ttft_s,
            latency_s=latency_s,
            request_id=self.request_id,
        )
