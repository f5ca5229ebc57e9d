"""`decode_router`: the ensemble's decode step when there are several decode instances.

A Triton ensemble names its steps statically, so it cannot send a request to the decode
instance the scheduler chose. This decoupled model reads the hand-off's `decode_index` and
relays the stream of `decode_<index>` (BLS, one thread per request). `bucketserve_bls` uses the
same helpers to call the chosen instance directly.
"""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

from bucketserve.serving.config import ServeConfig
from bucketserve.serving.contract import PACKED_OUTPUT
from bucketserve.serving.core.bls_stream import KEEPER, decoupled_responses
from bucketserve.serving.core.messages import (
    KIND_GENERATE,
    KIND_STOP,
    MIGRATED,
    Handoff,
    MessageError,
    open_message,
)
from bucketserve.serving.models.guarded_sender import GuardedSender
from bucketserve.serving.models.triton_io import (
    model_parameter,
    packed_delta,
    route_logging,
    user_tensors,
)

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL

log = logging.getLogger(__name__)


class StepError(RuntimeError):
    """An error response of a called model, with its Triton error (and code) kept."""

    def __init__(self, error) -> None:
        super().__init__(error.message())
        self.error = error


def call(model: str, inputs: list, outputs: list[str], barrier=None):
    """A decoupled BLS call; yields its non-empty responses, raising StepError on an error
    response. `barrier`: see bls_stream (a live sender's `barrier`)."""
    request = pb_utils.InferenceRequest(
        model_name=model, inputs=inputs, requested_output_names=outputs
    )
    stream = decoupled_responses(request, barrier)
    try:
        for resp in stream:
            if resp.has_error():
                raise StepError(resp.error())
            if resp.output_tensors():
                yield resp
    finally:
        stream.close()  # now, not whenever the generator is collected


def decode_stream(index: int, handoff_bytes: np.ndarray, barrier=None):
    """The non-empty responses of `decode_<index>` for one hand-off, packed (contract.py:
    PACKED_OUTPUT, docs/platform-notes.md#p26-bls-responses-kept-until-the-stream-ends); StepError
    on an error."""
    inputs = [pb_utils.Tensor("_handoff", handoff_bytes)]
    return call(f"decode_{index}", inputs, [PACKED_OUTPUT], barrier)


def relay(index: int, handoff_bytes: np.ndarray, sender, wrap=None, label: str = "") -> None:
    """Forward decode_<index>'s stream to `sender`, ending with exactly one FINAL; `wrap`
    reshapes each output tensor (a TensorRT-LLM-shaped entry model adds the batch dimension).
    A stream that ends MIGRATED (hybrid: the decode moved to a peer) is followed: the next
    instance's stream continues the same response. The FINAL goes out only after the BLS
    stream is closed: its barrier needs a live sender. `label` (the request id) names the
    request in the server log when its stream is cut."""
    last, error, relayed = None, None, 0
    started = last_s = time.monotonic()
    while True:
        moved = None
        stream = decode_stream(index, handoff_bytes, sender.barrier)
        try:
            for resp in stream:
                last_s = time.monotonic()
                delta = packed_delta(resp)  # the stream keeps `resp`: few, small tensors
                if delta.finish_reason == MIGRATED:
                    moved = delta.handoff
                    break
                outputs = user_tensors(delta)  # these go once sent
                if wrap:
                    outputs = [wrap(t) for t in outputs]
                if delta.finish_reason:
                    last = outputs
                    break
                sender.send(pb_utils.InferenceResponse(output_tensors=outputs))
                relayed += 1
        except StepError as e:
            error = e.error
        finally:
            stream.close()
        if moved is None:
            break
        try:  # sealed by the instance it left: only this run's instances can move a request
            index = open_message(Handoff, moved).decode_index
        except MessageError as e:
            error = pb_utils.TritonError(f"decode_{index}: bad hand-off of a moved decode: {e}")
            break
        handoff_bytes = np.array([moved.encode()], dtype=np.object_)
    if error is not None:
        sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL)
    elif last is not None:
        sender.send(pb_utils.InferenceResponse(output_tensors=last), flags=FINAL)
    else:  # a stream cut short says so: the client must not take it for a whole answer
        message = f"decode_{index}: stream ended without a finish reason (issue 13)"
        now = time.monotonic()
        log.warning(
            "%s: request %s, %d responses relayed, %.1f s after the start, %.1f s after the last",
            message, label or "?", relayed, now - started, now - last_s,
        )  # fmt: skip
        sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(message)), flags=FINAL)


def broadcast_stop(indices, handoff_bytes: np.ndarray, barrier=None) -> None:
    """A stop names a request, not an instance: each decode instance gets it (cheap)."""
    for index in indices:
        for _ in decode_stream(index, handoff_bytes, barrier):
            pass


class RouterModel:
    """Triton lifecycle: each request is relayed on its own thread."""

    def initialize(self, args: dict) -> None:
        route_logging(__name__)
        cfg = ServeConfig.read(model_parameter(args, "run_config"))
        self.num_decode = len(cfg.decode_devices)

    def execute(self, requests: list) -> None:
        for request in requests:  # read here: the stub may release the inputs after execute
            sender = GuardedSender(request.get_response_sender())  # FINAL-safe is_cancelled
            t = pb_utils.get_input_tensor_by_name(request, "_handoff")
            raw = None if t is None else t.as_numpy().copy()
            threading.Thread(target=self.route, args=(sender, raw), daemon=True).start()
        return None

    def route(self, sender: GuardedSender, raw) -> None:
        try:
            if raw is None:
                raise ValueError("missing input _handoff")
            handoff = open_message(Handoff, raw.reshape(-1)[0])  # refused unless sealed here
            if handoff.kind == KIND_STOP:  # decode_0 answers it below
                broadcast_stop(range(1, self.num_decode), raw, sender.barrier)
            index = handoff.decode_index if handoff.kind == KIND_GENERATE else 0
            relay(index, raw, sender, label=handoff.params.request_id)
        except Exception as e:  # every request still gets its FINAL
            sender.send(
                pb_utils.InferenceResponse(error=pb_utils.TritonError(f"decode_router: {e}")),
                flags=FINAL,
            )

    def finalize(self) -> None:
        KEEPER.clear()  # the kept iterators go now, with the GIL held
