"""Client: the synchronous API over tritonclient's gRPC stream (one stream per request)."""

from __future__ import annotations

import logging
import queue
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace

import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from bucketserve_client.params import (
    GenerationParams,
    build_inputs,
    check_model,
    stop_inputs,
)
from bucketserve_client.response import (
    Chunk,
    Collector,
    Completion,
    GenerationError,
    StreamState,
    error_message,
)

log = logging.getLogger(__name__)
ENSEMBLE = "bucketserve"
FINAL_WAIT_S = 2.0  # after the finish_reason, how long to wait for the FINAL flag
STOP_WAIT_S = 5.0  # how long a `stop` request may take to be acknowledged


def new_request_id() -> str:
    """A unique request id (the ensemble's `stop` request finds the generation by it)."""
    return uuid.uuid4().hex


def merge_params(params: GenerationParams | None, overrides: dict) -> GenerationParams:
    """params with keyword overrides applied; unknown keywords are ValueErrors."""
    unknown = sorted(set(overrides) - set(GenerationParams.field_names()))
    if unknown:
        names = ", ".join(GenerationParams.field_names())
        raise ValueError(f"unknown generation parameter(s) {unknown}; known: {names}")
    return replace(params or GenerationParams(), **overrides)


class ClientBase:
    """What both clients share: the server's gRPC address, the entry model, a timeout."""

    def __init__(
        self, url: str = "127.0.0.1:8001", model: str = ENSEMBLE, timeout_s: float | None = None
    ) -> None:
        check_model(model)
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0 or None, got {timeout_s}")
        self.url = url
        self.model = model
        self.timeout_s = timeout_s

    @staticmethod
    def _start(prompt: str, params, overrides: dict, stream: bool):
        """(inputs, state, collector) of one whole-completion request."""
        inputs = build_inputs(prompt, merge_params(params, overrides), stream=stream)
        state = StreamState(new_request_id())
        return inputs, state, Collector(state.request_id)

    def _stream(self, prompt: str, params, overrides: dict):
        """The chunks of one streamed request: self._run's iterator (async in AsyncClient)."""
        inputs = build_inputs(prompt, merge_params(params, overrides), stream=True)
        return self._run(inputs, StreamState(new_request_id()))


class Client(ClientBase):
    """Synchronous BucketServe client; thread-safe (each request opens its own gRPC stream)."""

    def generate(
        self,
        prompt: str,
        params: GenerationParams | None = None,
        *,
        stream: bool = False,
        **overrides,
    ) -> Completion:
        """The whole completion; stream=True has the server send deltas (a real ttft_s)."""
        inputs, state, collector = self._start(prompt, params, overrides, stream)
        for chunk in self._run(inputs, state):
            collector.add(chunk)
        return collector.completion(time.monotonic() - state.start)

    def stream(
        self, prompt: str, params: GenerationParams | None = None, **overrides
    ) -> Iterator[Chunk]:
        """Text deltas as they arrive; closing the iterator early cancels the generation."""
        return self._stream(prompt, params, overrides)

    def _run(self, inputs: list, state: StreamState) -> Iterator[Chunk]:
        responses: queue.Queue = queue.Queue()
        client = grpcclient.InferenceServerClient(self.url)
        try:
            self._open(client, inputs, state, responses)
            while not state.is_final:
                try:
                    item = responses.get(timeout=FINAL_WAIT_S if state.is_finished else None)
                except queue.Empty:
                    break
                chunk = state.on_response(*item)
                if chunk is not None:
                    yield chunk
        finally:
            self._close(client, state)

    def _open(self, client, inputs: list, state: StreamState, responses: queue.Queue) -> None:
        """Start the stream and send the request; GenerationError if that fails."""
        try:
            client.start_stream(
                callback=lambda result, error: responses.put((result, error)),
                stream_timeout=self.timeout_s,
            )
            client.async_stream_infer(
                self.model, inputs, request_id=state.request_id, enable_empty_final_response=True
            )
        except InferenceServerException as e:
            # a dead stream says only "no longer in valid state"; the callback has the reason
            try:
                reason = responses.get(timeout=1.0)[1]
            except queue.Empty:
                reason = None
            state.is_finished = state.is_final = True
            raise GenerationError(error_message(reason or e), state.request_id) from None

    def _close(self, client, state: StreamState) -> None:
        """End the stream; a generation that is still running is cancelled first."""
        try:
            # cancel_requests=True is the cancellation for bucketserve_bls (the server sees
            # is_cancelled); after the FINAL flag a plain half-close ends the stream.
            stop_stream(client, cancel=not state.is_final)
            if not state.is_finished and self.model == ENSEMBLE:
                send_stop(client, self.model, state.request_id)
        finally:
            client.close()


def send_stop(client, model: str, request_id: str) -> None:
    """The ensemble's cancellation: `stop: true` with the same request_id; wait for its FINAL."""
    acks: queue.Queue = queue.Queue()
    try:
        client.start_stream(
            callback=lambda result, error: acks.put((result, error)), stream_timeout=STOP_WAIT_S
        )
        client.async_stream_infer(
            model, stop_inputs(), request_id=request_id, enable_empty_final_response=True
        )
        state = StreamState(request_id)
        while not state.is_final:
            state.on_response(*acks.get(timeout=STOP_WAIT_S))
    except queue.Empty:
        log.warning(
            "bucketserve: stop of request %s not acknowledged within %ss", request_id, STOP_WAIT_S
        )
    except Exception as e:  # the caller is leaving; a failed stop must not mask why
        log.warning("bucketserve: stopping request %s failed: %s", request_id, error_message(e))
    finally:
        stop_stream(client, cancel=True)


def stop_stream(client, cancel: bool) -> None:
    """stop_stream, without leaking grpc's request thread when cancelling."""
    if cancel:
        # tritonclient 2.51 cancels without ending the request iterator, which leaves grpc's
        # request-sending thread blocked forever (one leaked thread per cancelled request):
        # docs/platform-notes.md#p32-tritonclient-cancel-leaves-the-request-iterator-open
        pending = getattr(getattr(client, "_stream", None), "_request_queue", None)
        if pending is not None:
            pending.put(None)
    client.stop_stream(cancel_requests=cancel)
