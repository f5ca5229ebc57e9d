"""The `scheduler` model: Triton glue over SchedulerCore (tensors in, hand-offs and errors out)."""

from __future__ import annotations

import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

from bucketserve.scheduling import make_scheduler
from bucketserve.scheduling.prefix_index import PrefixIndex
from bucketserve.serving.config import ServeConfig
from bucketserve.serving.contract import GenerateParams
from bucketserve.serving.core.cluster import ClusterStats
from bucketserve.serving.core.messages import (
    Handoff,
    MessageError,
    PrefillBatch,
    PrefillReply,
    decode,
    open_message,
    seal_message,
)
from bucketserve.serving.core.model_info import model_info
from bucketserve.serving.core.notify import FinishListener, socket_path
from bucketserve.serving.core.roles_file import HybridControl
from bucketserve.serving.core.scheduler_core import SchedulerCore, Waiting
from bucketserve.serving.models.metrics import HybridMetrics, PlacementMetrics, SchedulerMetrics
from bucketserve.serving.models.overload import Admission
from bucketserve.serving.models.triton_io import (
    array_input,
    bytes_input,
    bytes_tensor,
    model_parameter,
    route_logging,
)

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def send_handoff(sender, handoff: Handoff) -> None:
    response = pb_utils.InferenceResponse(
        output_tensors=[bytes_tensor("_handoff", seal_message(handoff))]
    )
    sender.send(response, flags=FINAL)


def send_error(sender, message: str, busy: bool = False) -> None:
    code = pb_utils.TritonError.UNAVAILABLE if busy else pb_utils.TritonError.INTERNAL
    sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code)), flags=FINAL)


def call_prefill(index: int, items: list[Waiting]) -> PrefillReply:
    """One BLS call to `prefill_<index>` (the instance the scheduler chose) with the batch."""
    ids = np.concatenate([np.asarray(i.ids, dtype=np.int32) for i in items])
    lens = np.asarray([len(i.ids) for i in items], dtype=np.int32)
    batch = PrefillBatch.of([i.params for i in items])
    request = pb_utils.InferenceRequest(
        model_name=f"prefill_{index}",
        requested_output_names=["result"],
        inputs=[
            pb_utils.Tensor("input_ids", ids),
            pb_utils.Tensor("seq_lens", lens),
            bytes_tensor("sampling", seal_message(batch, ids.tobytes(), lens.tobytes())),
        ],
    )
    response = request.exec()
    if response.has_error():
        raise RuntimeError(response.error().message())
    out = pb_utils.get_output_tensor_by_name(response, "result").as_numpy().reshape(-1)[0]
    return decode(PrefillReply, out)


class Metrics:
    """The core's metrics hooks on Triton's metric API."""

    def __init__(self, cfg: ServeConfig) -> None:
        self.sched = SchedulerMetrics(cfg.policy)
        instances = [f"prefill{i}" for i in range(len(cfg.engine_prefill_devices))]
        instances += [f"decode{i}" for i in range(len(cfg.decode_devices))]
        self.placement = PlacementMetrics(instances)
        self.hybrid = HybridMetrics() if cfg.is_hybrid else None
        self.decision = self.sched.decision
        self.batch = self.sched.batch
        self.placed = self.placement.batch

    def roles(self, layout: int, changed: bool) -> None:
        if self.hybrid is not None:
            self.hybrid.set(layout, changed)


class SchedulerModel:
    """Queues requests, forms prefill batches by policy, calls `prefill_<i>`, hands on to decode."""

    def initialize(self, args: dict) -> None:
        route_logging("bucketserve.serving.core.scheduler_core")
        self.cfg = ServeConfig.read(model_parameter(args, "run_config"))
        max_model_len = model_info(self.cfg).max_model_len
        sched_cfg = self.cfg.scheduler_config(max_model_len)
        sched = make_scheduler(self.cfg.policy, sched_cfg, time.monotonic)
        self.cluster = ClusterStats(self.cfg)
        self.admission = Admission(self.cfg, max_model_len)  # bounded queue: busy beyond
        self.metrics = Metrics(self.cfg)
        self.core = SchedulerCore(
            sched, self.cluster.view, call_prefill, send_handoff, send_error,
            len(self.cfg.engine_prefill_devices), self.metrics, self.cfg.iteration_tokens if self.cfg.is_colocated else 0,
            PrefixIndex() if self.cfg.enable_prefix_caching else None,
            HybridControl(self.cfg) if self.cfg.is_hybrid else None,
        )  # fmt: skip
        self.listener = FinishListener(
            socket_path(self.cfg.run_dir, self.cfg.run_id), self.core.finished, self.core.moved
        )
        self.notices = threading.Thread(
            target=self.listener.serve, name="scheduler-notices", daemon=True
        )
        self.notices.start()
        self.core.start()

    def execute(self, requests: list) -> None:
        for request in requests:
            sender = request.get_response_sender()
            try:  # refused before any work unless preprocessing (this run) wrote it
                ids = array_input(request, "_input_ids", np.int32)
                params = open_message(
                    GenerateParams, bytes_input(request, "_params"), ids.tobytes()
                )
            except MessageError as e:
                send_error(sender, f"scheduler: {e}")
                continue
            if params.stop:
                self.core.stop(sender, params)
            elif self.admission.admit(sender, len(self.core.waiting)):
                self.core.add(sender, ids.reshape(-1).astype(np.int64).tolist(), params)
        return None

    def finalize(self) -> None:
        self.listener.close()
        self.notices.join()
        for item in self.core.close():
            send_error(item.sender, "server shutting down", busy=True)
        self.cluster.close()
