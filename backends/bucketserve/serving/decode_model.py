"""The `decode` model: continuous batching over KV pulled from prefill; streams text deltas."""

from __future__ import annotations

import itertools
import json
import queue
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import triton_python_backend_utils as pb_utils

from bucketserve.kv.names import shm_name
from bucketserve.kv.stats import StatsBlock
from bucketserve.serving.config import ServeConfig
from bucketserve.serving.decode_worker import DecodeWorker, Delta
from bucketserve.serving.engine_glue import build_runner
from bucketserve.serving.handoff import KIND_GENERATE, KIND_STOP, Handoff
from bucketserve.serving.metrics import KvMetrics, RequestMetrics
from bucketserve.serving.model_info import load_tokenizer, model_info
from bucketserve.serving.notify import FinishNotifier, socket_path
from bucketserve.serving.triton_io import bytes_tensor, instance_index, json_input, model_parameter

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
GAUGE_INTERVAL_S = 0.25
EARLY_STOP_TTL_S = 60.0


@dataclass(slots=True)
class Client:
    """The Triton side of one request: where its responses go and what it asked for."""

    sender: object
    handoff: Handoff
    buffer: str = ""
    first_token_s: float = 0.0
    echoed: bool = False
    logprobs: list = field(default_factory=list)  # buffered with `buffer` when not streaming
    cum_logprob: float = 0.0


def response(text: str, reason: str, n_in: int, n_out: int, logprobs=None, cum=0.0):
    """One response; the log-prob outputs are empty unless the request asked for them."""
    logprobs = logprobs or []
    return pb_utils.InferenceResponse(
        output_tensors=[
            bytes_tensor("text_output", text),
            bytes_tensor("finish_reason", reason),
            pb_utils.Tensor("num_input_tokens", np.array([n_in], dtype=np.int32)),
            pb_utils.Tensor("num_output_tokens", np.array([n_out], dtype=np.int32)),
            *logprob_tensors(logprobs, cum),
        ]
    )


def logprob_tensors(logprobs: list[dict], cum: float) -> list:
    """TensorRT-LLM's output_log_probs / cum_log_probs and the vLLM backend's logprobs JSON."""
    values = [next(iter(e.values()))["logprob"] for e in logprobs]
    return [
        pb_utils.Tensor("output_log_probs", np.asarray(values, dtype=np.float32)),
        pb_utils.Tensor("cum_log_probs", np.asarray([cum] if logprobs else [], dtype=np.float32)),
        bytes_tensor("logprobs", json.dumps(logprobs) if logprobs else ""),
    ]


class DecodeModel:
    """Triton lifecycle: execute() hands requests to the engine thread; a sender thread replies."""

    def initialize(self, args: dict) -> None:
        from bucketserve.engine.block_manager import BlockManager

        cfg = ServeConfig.read(model_parameter(args, "run_config"))
        index = instance_index(args)
        self.name = f"decode{index}"
        runner = build_runner(
            cfg, cfg.decode_devices[index], shm_name(cfg.run_id, "decode", index, "kv")
        )
        pb_utils.Logger.log_info(f"{self.name}: {runner.describe()}")
        self.blocks = BlockManager(runner.num_blocks, runner.block_size)
        self.stats = StatsBlock.create(shm_name(cfg.run_id, "decode", index, "st"))
        tokenizer = load_tokenizer(model_info(cfg)).backend_tokenizer
        self.outbox: queue.Queue = queue.Queue()
        self.worker = DecodeWorker(
            runner, self.blocks, tokenizer, self.stats, self.outbox, cfg.handoff_timeout_s
        )
        self.worker.publish()
        self.clients: dict[int, Client] = {}
        self.by_request_id: dict[str, int] = {}
        self.early_stops: dict[str, float] = {}  # request id -> when its stop arrived
        self.notifier = FinishNotifier(socket_path(cfg.run_dir, cfg.run_id))
        self.lock = threading.Lock()
        self.keys = itertools.count()
        self.kv_metrics = KvMetrics(self.name)
        self.req_metrics = RequestMetrics(self.name)
        self.threads = [
            threading.Thread(target=self.worker.loop, name="decode-engine", daemon=True),
            threading.Thread(target=self.send_loop, name="decode-sender", daemon=True),
        ]
        for t in self.threads:
            t.start()

    def execute(self, requests: list) -> None:
        for request in requests:
            sender = request.get_response_sender()
            try:
                handoff = Handoff.from_json(json_input(request, "_handoff"))
            except Exception as e:
                sender.send(
                    pb_utils.InferenceResponse(
                        error=pb_utils.TritonError(f"decode: bad hand-off: {e}")
                    ),
                    flags=FINAL,
                )
                continue
            if handoff.kind == KIND_STOP:
                self.stop(handoff.target)
                sender.send(response("", "cancelled", 0, 0), flags=FINAL)
            elif handoff.kind == KIND_GENERATE:
                self.start(sender, handoff)
            else:  # cancelled while still queued for prefill
                sender.send(
                    response("", "cancelled", handoff.params.num_input_tokens, 0), flags=FINAL
                )
        return None

    def start(self, sender, handoff: Handoff) -> None:
        key = next(self.keys)
        rid = handoff.params.request_id
        with self.lock:
            self.clients[key] = Client(sender, handoff)
            if rid:
                self.by_request_id[rid] = key
            stopped_early = self.early_stops.pop(rid, None) is not None if rid else False
        self.worker.submit(key, handoff)
        if stopped_early:
            self.worker.cancel(key)

    def stop(self, request_id: str) -> None:
        """Cancel a running request; a stop that overtakes its request (still in prefill) waits."""
        with self.lock:
            key = self.by_request_id.get(request_id)
            if key is None and request_id:
                now = time.monotonic()
                self.early_stops = {
                    r: t for r, t in self.early_stops.items() if now - t < EARLY_STOP_TTL_S
                }
                self.early_stops[request_id] = now
        if key is not None:
            self.worker.cancel(key)

    def send_loop(self) -> None:
        """Coalesce: everything queued since the last send goes out as one response per request."""
        next_gauge = 0.0
        while True:
            try:
                first = self.outbox.get(timeout=GAUGE_INTERVAL_S)
            except queue.Empty:
                first = False
            if first is None:
                return
            items = [first] if first else []
            while True:
                try:
                    item = self.outbox.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self.outbox.put(None)
                    break
                items.append(item)
            finished = self.deliver(merge(items))
            if finished:
                self.kv_metrics.set(self.blocks.num_free_blocks, self.blocks.num_total_blocks)
            if time.monotonic() >= next_gauge:
                self.housekeeping()
                next_gauge = time.monotonic() + GAUGE_INTERVAL_S

    def housekeeping(self) -> None:
        """KV gauges, and cancellation of requests whose client went away (non-streaming too)."""
        self.kv_metrics.set(self.blocks.num_free_blocks, self.blocks.num_total_blocks)
        with self.lock:
            clients = list(self.clients.items())
        for key, client in clients:
            if client.sender.is_cancelled():
                self.worker.cancel(key)

    def deliver(self, deltas: list[Delta]) -> bool:
        """Send what each request produced; True when some request finished."""
        finished = False
        for d in deltas:
            with self.lock:
                client = self.clients.get(d.key)
            if client is None:
                continue
            if d.first_token_s:
                client.first_token_s = d.first_token_s
            p = client.handoff.params
            text = d.text
            if not client.echoed and p.prompt_text:
                text, client.echoed = p.prompt_text + text, True
            client.logprobs += d.logprobs
            client.cum_logprob += sum(next(iter(e.values()))["logprob"] for e in d.logprobs)
            if not d.finish_reason and not p.stream:
                client.buffer += text
                continue
            text, client.buffer = client.buffer + text, ""
            if d.finish_reason:
                self.complete(d, client, text)
                finished = True
            else:
                lps, client.logprobs = client.logprobs, []
                client.sender.send(
                    response(
                        text, "", p.num_input_tokens, d.num_output_tokens, lps, client.cum_logprob
                    )
                )
                if client.sender.is_cancelled():
                    self.worker.cancel(d.key)
        return finished

    def complete(self, d: Delta, client: Client, text: str) -> None:
        p = client.handoff.params
        with self.lock:
            self.clients.pop(d.key, None)
            if self.by_request_id.get(p.request_id) == d.key:
                del self.by_request_id[p.request_id]
        self.notifier.finished(client.handoff.sched_key, d.num_output_tokens)
        if d.error:
            client.sender.send(
                pb_utils.InferenceResponse(error=pb_utils.TritonError(d.error)), flags=FINAL
            )
        else:
            n_in, n_out = p.num_input_tokens, d.num_output_tokens
            lps, cum = client.logprobs, client.cum_logprob
            client.sender.send(response(text, d.finish_reason, n_in, n_out, lps, cum), flags=FINAL)
        self.observe(d, client)

    def observe(self, d: Delta, client: Client) -> None:
        h, now = client.handoff, time.time()
        if not client.first_token_s or d.error:
            return
        ttft = client.first_token_s - h.arrival_s
        tpot = (
            (now - client.first_token_s) / (d.num_output_tokens - 1)
            if d.num_output_tokens > 1
            else None
        )
        self.req_metrics.finished(
            d.finish_reason,
            ttft,
            tpot,
            now - h.arrival_s,
            h.params.num_input_tokens,
            d.num_output_tokens,
        )
        self.req_metrics.handoff.observe(max(0.0, client.first_token_s - h.prefill_done_s))

    def finalize(self) -> None:
        self.worker.shutdown()
        self.threads[0].join()
        self.outbox.put(None)
        self.threads[1].join()
        self.stats.close()
        self.stats.unlink()
        self.notifier.close()
        self.worker.runner.close()


def merge(items: list[Delta]) -> list[Delta]:
    """One delta per request: texts concatenated, the latest counts and finish reason kept."""
    merged: dict[int, Delta] = {}
    for d in items:
        prev = merged.get(d.key)
        if prev is None:
            merged[d.key] = d
            continue
        prev.text += d.text
        prev.num_output_tokens = d.num_output_tokens
        prev.finish_reason, prev.error = d.finish_reason, d.error
        prev.first_token_s = prev.first_token_s or d.first_token_s
        prev.logprobs += d.logprobs
    return list(merged.values())
