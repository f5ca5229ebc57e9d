"""AsyncClient: the asyncio API over tritonclient.grpc.aio (one channel, one RPC per request)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import grpc
import tritonclient.grpc.aio as grpcaio
from tritonclient.utils import InferenceServerException

from bucketserve_client.client import (
    ENSEMBLE,
    FINAL_WAIT_S,
    STOP_WAIT_S,
    ClientBase,
)
from bucketserve_client.params import GenerationParams, stop_inputs
from bucketserve_client.response import (
    Chunk,
    Completion,
    GenerationError,
    StreamState,
    error_message,
)

log = logging.getLogger(__name__)
CLOSE_WAIT_S = 2.0  # after the FINAL flag, how long the server may take to end the RPC


def request(model: str, inputs: list, request_id: str) -> dict:
    """One entry of stream_infer's request iterator, asking for the FINAL flag on every response."""
    # aio's stream_infer has no enable_empty_final_response argument; this is the parameter
    # the synchronous client sets for it.
    return {
        "model_name": model,
        "inputs": inputs,
        "request_id": request_id,
        "parameters": {"triton_enable_empty_final_response": True},
    }


async def drain(outbox: asyncio.Queue) -> AsyncIterator[dict]:
    """The request iterator of one RPC: what is put on outbox, until None (half-close)."""
    while (item := await outbox.get()) is not None:
        yield item


async def next_response(responses, state: StreamState, timeout_s: float | None):
    """The next (result, error) pair; None when the RPC ended or the wait timed out."""
    try:
        return await asyncio.wait_for(responses.__anext__(), timeout_s)
    except (StopAsyncIteration, asyncio.TimeoutError):
        return None
    except (grpc.RpcError, InferenceServerException) as e:
        state.is_finished = state.is_final = True
        raise GenerationError(error_message(e), state.request_id) from None


class AsyncClient(ClientBase):
    """asyncio BucketServe client; any number of concurrent requests share one gRPC channel."""

    def __init__(
        self, url: str = "127.0.0.1:8001", model: str = ENSEMBLE, timeout_s: float | None = None
    ) -> None:
        super().__init__(url, model, timeout_s)
        self._grpc: grpcaio.InferenceServerClient | None = None

    def channel(self) -> grpcaio.InferenceServerClient:
        """The aio client, created inside the running event loop on first use."""
        if self._grpc is None:
            self._grpc = grpcaio.InferenceServerClient(self.url)
        return self._grpc

    async def close(self) -> None:
        """Close the gRPC channel (a later request opens a new one)."""
        if self._grpc is not None:
            await self._grpc.close()
            self._grpc = None

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def generate(
        self,
        prompt: str,
        params: GenerationParams | None = None,
        *,
        stream: bool = False,
        **overrides,
    ) -> Completion:
        """The whole completion; stream=True has the server send deltas (a real ttft_s)."""
        inputs, state, collector = self._start(prompt, params, overrides, stream)
        async for chunk in self._run(inputs, state):
            collector.add(chunk)
        return collector.completion(time.monotonic() - state.start)

    def stream(
        self, prompt: str, params: GenerationParams | None = None, **overrides
    ) -> AsyncIterator[Chunk]:
        """Text deltas as they arrive; aclose() or task cancellation cancels the generation.

        Use `async with contextlib.aclosing(client.stream(...)) as chunks:` to cancel at the
        moment the loop is left (otherwise it happens when the iterator is garbage collected).
        """
        return self._stream(prompt, params, overrides)

    async def _run(self, inputs: list, state: StreamState) -> AsyncIterator[Chunk]:
        outbox: asyncio.Queue = asyncio.Queue()
        outbox.put_nowait(request(self.model, inputs, state.request_id))
        responses = self.channel().stream_infer(drain(outbox), stream_timeout=self.timeout_s)
        try:
            while not state.is_final:
                timeout_s = FINAL_WAIT_S if state.is_finished else None
                item = await next_response(responses, state, timeout_s)
                if item is None:
                    break
                chunk = state.on_response(*item)
                if chunk is not None:
                    yield chunk
        finally:
            await self._close(responses, outbox, state)

    async def _close(self, responses, outbox: asyncio.Queue, state: StreamState) -> None:
        """End the RPC; a generation that is still running is cancelled first."""
        outbox.put_nowait(None)
        if state.is_final:
            try:
                await next_response(responses, state, CLOSE_WAIT_S)  # the server ends the RPC
            except GenerationError:
                pass  # the request is over; how its RPC ended does not matter any more
        responses.cancel()  # for bucketserve_bls this is the cancellation the server sees
        if not state.is_finished and self.model == ENSEMBLE:
            await self.send_stop(state.request_id)

    async def send_stop(self, request_id: str) -> None:
        """The ensemble's cancellation: `stop: true` with the same request_id; wait for its FINAL."""
        outbox: asyncio.Queue = asyncio.Queue()
        outbox.put_nowait(request(self.model, stop_inputs(), request_id))
        outbox.put_nowait(None)
        acks = self.channel().stream_infer(drain(outbox), stream_timeout=STOP_WAIT_S)
        state = StreamState(request_id)
        try:
            while not state.is_final:
                item = await next_response(acks, state, STOP_WAIT_S)
                if item is None:
                    raise GenerationError(f"no acknowledgement within {STOP_WAIT_S}s", request_id)
                state.on_response(*item)
        except GenerationError as e:  # the caller is leaving; a failed stop must not mask why
            log.warning("bucketserve: stopping request %s failed: %s", request_id, e)
        finally:
            acks.cancel()
