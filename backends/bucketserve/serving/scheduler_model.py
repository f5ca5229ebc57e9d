"""The `scheduler` model: BucketServe's gateway, buckets, batch controller and P/D scheduler."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np
import triton_python_backend_utils as pb_utils

from bucketserve.scheduling import ClusterView, RequestMeta, make_scheduler
from bucketserve.serving.cluster import ClusterStats
from bucketserve.serving.config import ServeConfig
from bucketserve.serving.contract import GenerateParams
from bucketserve.serving.handoff import (
    KIND_CANCELLED,
    KIND_GENERATE,
    KIND_STOP,
    Handoff,
    PrefillReply,
    sampling_rows_json,
)
from bucketserve.serving.metrics import SchedulerMetrics
from bucketserve.serving.model_info import model_info
from bucketserve.serving.notify import FinishListener, socket_path
from bucketserve.serving.triton_io import bytes_tensor, json_input, model_parameter

ERROR_BACKOFF_S = 0.5  # after an unexpected error, before the loop tries again
IDLE_WAIT_S = 0.005
METRICS_INTERVAL_S = 0.5
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


@dataclass(slots=True)
class Waiting:
    """A request held here until its prefill batch has run."""

    sender: object
    ids: list[int]
    params: GenerateParams
    arrival_s: float


def send_handoff(sender, handoff: Handoff) -> None:
    response = pb_utils.InferenceResponse(
        output_tensors=[bytes_tensor("_handoff", handoff.to_json())]
    )
    sender.send(response, flags=FINAL)


def send_error(sender, message: str) -> None:
    sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(message)), flags=FINAL)


class SchedulerModel:
    """Queues requests, forms prefill batches by policy, calls `prefill`, hands each on to decode."""

    def initialize(self, args: dict) -> None:
        self.cfg = ServeConfig.read(model_parameter(args, "run_config"))
        info = model_info(self.cfg)
        sched_cfg = self.cfg.scheduler_config(info.max_model_len)
        self.sched = make_scheduler(self.cfg.policy, sched_cfg, time.monotonic)
        self.cluster = ClusterStats(self.cfg)
        self.metrics = SchedulerMetrics(self.cfg.policy)
        self.waiting: dict[str, Waiting] = {}
        self.by_user_id: dict[str, str] = {}
        self.next_key = 0
        self.decision_s, self.next_metrics = 0.0, 0.0
        self.cond = threading.Condition()
        self.stopping = False
        self.listener = FinishListener(
            socket_path(self.cfg.run_dir, self.cfg.run_id), self.finished
        )
        self.threads = [
            threading.Thread(target=self.loop, name="scheduler-loop", daemon=True),
            threading.Thread(target=self.listener.serve, name="scheduler-notices", daemon=True),
        ]
        for t in self.threads:
            t.start()

    def finished(self, key: str, num_output_tokens: int) -> None:
        """Decode reported the request done: release its decode-side reservation."""
        with self.cond:
            self.sched.on_request_finished(key, num_output_tokens)
            self.cond.notify()

    def execute(self, requests: list) -> None:
        for request in requests:
            sender = request.get_response_sender()
            try:
                params = GenerateParams.from_json(json_input(request, "_params"))
                ids = (
                    pb_utils.get_input_tensor_by_name(request, "_input_ids").as_numpy().reshape(-1)
                )
            except Exception as e:
                send_error(sender, f"scheduler: malformed request: {e}")
                continue
            if params.stop:
                self.stop(sender, params)
            else:
                self.enqueue(sender, ids.astype(np.int64).tolist(), params)
        return None

    def enqueue(self, sender, ids: list[int], params: GenerateParams) -> None:
        with self.cond:
            key = str(self.next_key)
            self.next_key += 1
            self.waiting[key] = Waiting(sender, ids, params, time.time())
            if params.request_id:
                self.by_user_id[params.request_id] = key
            self.sched.add(
                RequestMeta(
                    request_id=key,
                    prompt_len=len(ids),
                    max_tokens=params.max_tokens,
                    arrival_s=time.monotonic(),
                    slo_class=params.slo_class,
                    ttft_slo_s=params.ttft_slo_s,
                    tpot_slo_s=params.tpot_slo_s,
                )
            )
            self.cond.notify()

    def stop(self, sender, params: GenerateParams) -> None:
        """`stop: true` + request_id: drop it here if still queued, and tell decode to stop it."""
        with self.cond:
            key = self.by_user_id.pop(params.request_id, None)
            item = self.waiting.pop(key, None) if key and self.sched.cancel(key) else None
        if item is not None:
            send_handoff(item.sender, Handoff(KIND_CANCELLED, item.params))
        send_handoff(sender, Handoff(KIND_STOP, params, target=params.request_id))

    def loop(self) -> None:
        while True:
            try:
                with self.cond:
                    if self.stopping:
                        return
                    batch, items = self.next_batch()
                    if batch is None:
                        self.cond.wait(IDLE_WAIT_S)
                        continue
                self.dispatch(batch, items)
            except Exception as e:  # the loop must outlive any one bad iteration
                pb_utils.Logger.log_error(f"scheduler loop: {type(e).__name__}: {e}")
                time.sleep(ERROR_BACKOFF_S)

    def next_batch(self):
        view: ClusterView | None = self.cluster.view()
        if view is None or not self.waiting:
            return None, []
        t0 = time.perf_counter()
        batch = self.sched.next_batch(view)
        self.decision_s += time.perf_counter() - t0
        if batch is not None or time.monotonic() >= self.next_metrics:
            self.metrics.decision(self.decision_s, self.sched.snapshot())
            self.decision_s, self.next_metrics = 0.0, time.monotonic() + METRICS_INTERVAL_S
        if batch is None:
            return None, []
        items = []
        for meta in batch.requests:
            item = self.waiting.pop(meta.request_id)
            if item.params.request_id:
                self.by_user_id.pop(item.params.request_id, None)
            items.append(item)
        return batch, items

    def dispatch(self, batch, items: list[Waiting]) -> None:
        start = time.perf_counter()
        try:
            reply = self.prefill(items)
        except Exception as e:
            with self.cond:
                for meta in batch.requests:
                    self.sched.on_request_finished(meta.request_id, 0)
            for item in items:
                send_error(item.sender, str(e))
            return
        duration = time.perf_counter() - start
        with self.cond:
            self.sched.on_batch_done(batch, duration)
        self.metrics.batch(len(items), batch.padding_ratio, duration)
        done = time.time()
        for item, res, meta in zip(items, reply.results, batch.requests, strict=True):
            send_handoff(
                item.sender,
                Handoff(
                    KIND_GENERATE,
                    item.params,
                    prompt_ids=item.ids,
                    first_token=res.first_token,
                    prefill_index=reply.index,
                    pool=reply.pool,
                    handoff_table=reply.handoff_table,
                    handoff_id=res.handoff_id,
                    block_ids=res.block_ids,
                    arrival_s=item.arrival_s,
                    prefill_done_s=done,
                    sched_key=meta.request_id,
                    first_logprob=res.logprob,
                ),
            )

    def prefill(self, items: list[Waiting]) -> PrefillReply:
        """One BLS call to `prefill` with the packed batch."""
        ids = np.concatenate([np.asarray(i.ids, dtype=np.int32) for i in items])
        lens = np.asarray([len(i.ids) for i in items], dtype=np.int32)
        rows = sampling_rows_json([i.params for i in items])
        request = pb_utils.InferenceRequest(
            model_name="prefill",
            requested_output_names=["result"],
            inputs=[
                pb_utils.Tensor("input_ids", ids),
                pb_utils.Tensor("seq_lens", lens),
                bytes_tensor("sampling", rows),
            ],
        )
        response = request.exec()
        if response.has_error():
            raise RuntimeError(response.error().message())
        out = pb_utils.get_output_tensor_by_name(response, "result").as_numpy().reshape(-1)[0]
        return PrefillReply.from_json(out)

    def finalize(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
            pending = list(self.waiting.values())
            self.waiting.clear()
        self.listener.close()
        for t in self.threads:
            t.join()
        for item in pending:
            send_error(item.sender, "server shutting down")
        self.cluster.close()
