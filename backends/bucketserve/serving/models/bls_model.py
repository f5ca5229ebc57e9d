"""`bucketserve_bls`: drives preprocessing -> scheduler -> decode through BLS and relays the stream.

It exists because a Triton 2.51 ensemble cannot pass a client's cancellation into a step that is
already running (docs/platform-notes.md#p19-ensemble-cancellation-stops-between-steps); a
top-level decoupled model sees it, and forwards it as a stop request.
"""

from __future__ import annotations

import json
import threading
import time
import uuid

import numpy as np
import triton_python_backend_utils as pb_utils

from bucketserve.serving.config import ServeConfig
from bucketserve.serving.contract import INPUT_NAMES, GenerateParams
from bucketserve.serving.core.bls_stream import KEEPER
from bucketserve.serving.core.messages import (
    KIND_GENERATE,
    KIND_STOP,
    Handoff,
    open_message,
    seal_message,
)
from bucketserve.serving.models.guarded_sender import GuardedSender
from bucketserve.serving.models.router_model import StepError, broadcast_stop, call, relay
from bucketserve.serving.models.triton_io import bytes_tensor, model_parameter, route_logging

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
WATCH_INTERVAL_S = 0.1


def stop_request(request_id: str, num_decode: int) -> None:
    """What the ensemble gets from `stop: true`: drop it from the queue, stop its decoding."""
    ids = np.zeros(0, dtype=np.int32)
    stop = GenerateParams(request_id=request_id, stop=True)
    params = bytes_tensor("_params", seal_message(stop, ids.tobytes()))
    ids = pb_utils.Tensor("_input_ids", ids)
    for resp in call("scheduler", [ids, params], ["_handoff"]):
        handoff = pb_utils.get_output_tensor_by_name(resp, "_handoff")
        broadcast_stop(range(num_decode), handoff.as_numpy())


class BlsModel:
    """One relay thread per request plus a watcher that turns client cancellation into stops."""

    def initialize(self, args: dict) -> None:
        route_logging("bucketserve.serving.models.router_model")
        cfg = ServeConfig.read(model_parameter(args, "run_config"))
        self.num_decode = len(cfg.decode_devices)
        # TensorRT-LLM-shaped entry models (max_batch_size 1) carry a leading batch dimension.
        self.batched = json.loads(args["model_config"]).get("max_batch_size", 0) > 0
        self.active: dict[str, object] = {}  # request id -> response sender
        self.stopped: set[str] = set()
        self.lock = threading.Lock()
        self.closing = threading.Event()
        self.watcher = threading.Thread(target=self.watch, name="bls-watch", daemon=True)
        self.watcher.start()

    def execute(self, requests: list) -> None:
        # Everything the relay needs is taken from the request here: after execute returns the
        # stub may release the request's input tensors, and a thread reading them then crashed
        # the stub (SIGSEGV in triton_python_backend_stub, three times in a 10-minute soak).
        for request in requests:
            sender = GuardedSender(request.get_response_sender())  # FINAL-safe is_cancelled
            rid = request.request_id() or f"bls-{uuid.uuid4().hex}"
            try:
                inputs = [
                    (n, self.unbatch(n, t.as_numpy()).copy())
                    for n in INPUT_NAMES
                    if (t := pb_utils.get_input_tensor_by_name(request, n)) is not None
                ]
            except Exception as e:
                sender.send(
                    pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e))), flags=FINAL
                )
                continue
            with self.lock:
                self.active[rid] = sender
            threading.Thread(target=self.relay, args=(sender, rid, inputs), daemon=True).start()
        return None

    def relay(self, sender: GuardedSender, rid: str, inputs: list) -> None:
        try:
            self.run(sender, rid, [pb_utils.Tensor(n, arr) for n, arr in inputs])
        except Exception as e:
            if not isinstance(e, StepError):  # a step's error is the client's answer, not ours
                pb_utils.Logger.log_warn(f"bucketserve_bls: {rid}: {type(e).__name__}: {e}")
            try:
                error = e.error if isinstance(e, StepError) else pb_utils.TritonError(str(e))
                sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL)
            except Exception as e2:  # the client is gone; nothing left to tell it
                pb_utils.Logger.log_warn(f"bucketserve_bls: {rid}: no FINAL sent: {e2}")
        finally:
            with self.lock:
                self.active.pop(rid, None)
                self.stopped.discard(rid)

    def run(self, sender, rid: str, inputs: list) -> None:
        pre = pb_utils.InferenceRequest(
            model_name="preprocessing",
            inputs=inputs,
            request_id=rid,
            requested_output_names=["_input_ids", "_params"],
        ).exec()
        if pre.has_error():
            raise StepError(pre.error())
        raw = None
        for resp in call("scheduler", pre.output_tensors(), ["_handoff"], sender.barrier):
            raw = pb_utils.get_output_tensor_by_name(resp, "_handoff").as_numpy()
        handoff = open_message(Handoff, raw.reshape(-1)[0])
        if handoff.kind == KIND_STOP:  # the front's stop names a request, not an instance:
            broadcast_stop(range(1, self.num_decode), raw, sender.barrier)  # decode_0 below
        # the decode instance the scheduler placed it on (a cancelled hand-off: any answers)
        index = handoff.decode_index if handoff.kind == KIND_GENERATE else 0
        # decode answers packed: docs/platform-notes.md#p26-bls-responses-kept-until-the-stream-ends
        relay(index, raw, sender, self.batch if self.batched else None, label=rid)

    def unbatch(self, name: str, arr: np.ndarray) -> np.ndarray:
        """[1, ...] -> [...] for the models behind the relay (they take the vLLM shapes)."""
        if not self.batched:
            return arr
        if arr.shape[0] != 1:
            raise ValueError(f"{name} has batch size {arr.shape[0]}; supported: 1")
        return arr.reshape(arr.shape[1:])

    def batch(self, t):
        """[...] -> [1, ...] for a TensorRT-LLM-shaped entry model."""
        arr = t.as_numpy()
        return pb_utils.Tensor(t.name(), arr.reshape((1, *arr.shape)))

    def watch(self) -> None:
        """Every WATCH_INTERVAL_S: stop the requests whose client cancelled. Nothing here may end
        the thread (it is the only way a cancellation reaches decode): a sender whose query fails
        is asked again next round, and a stop that fails is sent again."""
        while not self.closing.wait(WATCH_INTERVAL_S):
            with self.lock:
                active = [(rid, s) for rid, s in self.active.items() if rid not in self.stopped]
            gone = []
            for rid, s in active:
                try:
                    if s.is_cancelled():
                        gone.append(rid)
                except Exception as e:
                    pb_utils.Logger.log_warn(f"bucketserve_bls: is_cancelled({rid}) failed: {e}")
            if not gone:
                continue
            started = time.monotonic()
            failed = 0
            for rid in gone:
                try:
                    stop_request(rid, self.num_decode)
                except Exception as e:
                    failed += 1
                    pb_utils.Logger.log_warn(f"bucketserve_bls: stopping {rid} failed: {e}")
                    continue
                with self.lock:
                    if rid in self.active:  # still relaying: do not stop it twice
                        self.stopped.add(rid)
            pb_utils.Logger.log_info(
                f"bucketserve_bls: {len(gone) - failed} cancelled requests stopped in "
                f"{time.monotonic() - started:.2f} s ({failed} to retry)"
            )

    def finalize(self) -> None:
        self.closing.set()
        self.watcher.join()
        KEEPER.clear()  # the kept iterators go now, with the GIL held
