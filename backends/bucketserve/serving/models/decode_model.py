"""The `decode` model: continuous batching over KV pulled from prefill; streams text deltas."""

from __future__ import annotations

import queue
import threading
import time

import triton_python_backend_utils as pb_utils

from bucketserve.kv.names import shm_name
from bucketserve.kv.stats import StatsBlock
from bucketserve.serving.config import ServeConfig
from bucketserve.serving.contract import PACKED_OUTPUT
from bucketserve.serving.core.decode_stream import Delta
from bucketserve.serving.core.decode_worker import DecodeWorker
from bucketserve.serving.core.engine_glue import build_runner
from bucketserve.serving.core.kv_intake import publish_pool
from bucketserve.serving.core.messages import (
    KIND_GENERATE,
    KIND_STOP,
    MIGRATED,
    Handoff,
    MessageError,
    PackedDelta,
    encode,
    open_message,
    seal_message,
)
from bucketserve.serving.core.migration import Migration
from bucketserve.serving.core.model_info import load_tokenizer, model_info
from bucketserve.serving.core.notify import FinishNotifier, socket_path
from bucketserve.serving.core.relay import Client, ResponseRelay, merge
from bucketserve.serving.launch.repository import model_index
from bucketserve.serving.models.guarded_sender import GuardedSender
from bucketserve.serving.models.metrics import (
    DecodeMetrics,
    KvMetrics,
    MigrationMetrics,
    PrefixCacheMetrics,
    RequestMetrics,
)
from bucketserve.serving.models.triton_io import (
    bytes_input,
    bytes_tensor,
    model_parameter,
    route_logging,
    user_tensors,
)

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
GAUGE_INTERVAL_S = 0.25


def response(text: str, reason: str, n_in: int, n_out: int, logprobs=None, packed=False,
             num_cached: int = 0):  # fmt: skip
    """One response: the user outputs, or (a relay asked for it) the one packed tensor."""
    entries, cum = logprobs or ([], 0.0)
    d = PackedDelta(text, reason, n_in, n_out, entries, cum, num_cached)
    tensors = [bytes_tensor(PACKED_OUTPUT, encode(d))] if packed else user_tensors(d)
    return pb_utils.InferenceResponse(output_tensors=tensors)


class DecodeModel:
    """Triton lifecycle: execute() hands requests to the engine thread; a sender thread replies."""

    def initialize(self, args: dict) -> None:
        from bucketserve.engine.block_manager import BlockManager

        route_logging("bucketserve.serving.core.relay", "bucketserve.serving.core.decode_worker")
        cfg = ServeConfig.read(model_parameter(args, "run_config"))
        index = model_index(args["model_name"])
        self.name = f"decode{index}"
        runner = build_runner(
            cfg, cfg.decode_devices[index], shm_name(cfg.run_id, "decode", index, "kv")
        )
        pb_utils.Logger.log_info(f"{self.name}: {runner.describe()}")
        self.blocks = BlockManager(runner.num_blocks, runner.block_size,
                                   cfg.enable_prefix_caching, namespace=cfg.model)  # fmt: skip
        self.stats = StatsBlock.create(shm_name(cfg.run_id, "decode", index, "st"))
        tokenizer = load_tokenizer(model_info(cfg)).backend_tokenizer
        self.outbox: queue.Queue = queue.Queue()
        self.migration = None
        if cfg.is_hybrid:  # decodes may move to peers: our pool and ack table are theirs to open
            self.migration = Migration(cfg, index, runner.num_blocks)
            publish_pool(cfg, index, runner.pool_handle, role="decode")
        self.worker = DecodeWorker(
            runner,
            self.blocks,
            tokenizer,
            self.stats,
            self.outbox,
            cfg.handoff_timeout_s,
            max_batch=cfg.max_decode_batch,
            watermark=cfg.scheduler_config(runner.model_config.max_model_len).watermark,
            token_budget=cfg.iteration_tokens if cfg.is_colocated else cfg.max_prefill_tokens,
            run=cfg,
            migration=self.migration,
        )
        self.stream_interval_s = cfg.stream_interval_s
        self.worker.publish()
        self.notifier = FinishNotifier(socket_path(cfg.run_dir, cfg.run_id))
        self.relay = ResponseRelay(self.worker, send, send_error, self.on_final, send_moved,
                                   self.on_moved)  # fmt: skip
        self.migration_metrics = MigrationMetrics(self.name) if self.migration else None
        if self.migration_metrics is not None:  # the starting budget, not the gauge's 0
            self.migration_metrics.set(self.migration, self.migration.budget)
        self.kv_metrics = KvMetrics(self.name)
        self.cache_metrics = PrefixCacheMetrics(self.name)
        self.decode_metrics = DecodeMetrics(self.name)
        self.req_metrics = RequestMetrics(self.name)
        self.threads = [
            threading.Thread(target=self.worker.loop, name="decode-engine", daemon=True),
            threading.Thread(target=self.send_loop, name="decode-sender", daemon=True),
        ]
        for t in self.threads:
            t.start()

    def execute(self, requests: list) -> None:
        for request in requests:
            sender = GuardedSender(  # FINAL-safe is_cancelled
                request.get_response_sender(),
                packed=PACKED_OUTPUT in request.requested_output_names(),
            )
            try:  # refused before any work unless the scheduler (this run) wrote it
                handoff = open_message(Handoff, bytes_input(request, "_handoff"))
            except MessageError as e:
                sender.send(
                    pb_utils.InferenceResponse(error=pb_utils.TritonError(f"decode: {e}")),
                    flags=FINAL,
                )
                continue
            if handoff.kind == KIND_STOP:
                self.relay.stop(handoff.target)
                sender.send(response("", "cancelled", 0, 0, packed=sender.packed), flags=FINAL)
            elif handoff.kind == KIND_GENERATE:
                self.relay.start(sender, handoff)
            else:  # cancelled while still queued for prefill
                n_in = handoff.params.num_input_tokens
                sender.send(response("", "cancelled", n_in, 0, packed=sender.packed), flags=FINAL)
        return None

    def send_loop(self) -> None:
        """Coalesce: everything queued since the last send goes out as one response per request.

        One sending stub caps responses per second:
        docs/platform-notes.md#p10-one-sending-stub-caps-tokens-per-second
        """
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
            sent_s = time.monotonic()
            finished = self.relay.deliver(merge(items))
            if finished:
                self.kv_gauges()
            if time.monotonic() >= next_gauge:
                self.housekeeping()
                next_gauge = time.monotonic() + GAUGE_INTERVAL_S
            # Coalescing interval: what the engine produces meanwhile goes out in one response.
            time.sleep(max(0.0, self.stream_interval_s - (time.monotonic() - sent_s)))

    def housekeeping(self) -> None:
        """KV gauges, and cancellation of requests whose client went away (non-streaming too)."""
        self.kv_gauges()
        self.cache_metrics.set(self.blocks)
        self.decode_metrics.set(self.worker)
        if self.migration_metrics is not None:
            self.migration_metrics.set(self.migration, self.worker.budget)
        self.relay.cancel_gone()

    def kv_gauges(self) -> None:
        b = self.blocks
        self.kv_metrics.set(b.num_free_blocks, b.num_total_blocks, b.num_evictable_blocks)

    def on_final(self, d: Delta, client: Client) -> None:
        """After a request's FINAL: tell the scheduler, count it, observe its latencies."""
        self.notifier.finished(client.handoff.sched_key, d.num_output_tokens,
                               slo_outcome(d, client))  # fmt: skip
        self.decode_metrics.finished.increment(1)
        self.observe(d, client)

    def on_moved(self, d: Delta, client: Client) -> None:
        """The request continues on another instance: the scheduler moves its reservation."""
        self.notifier.moved(client.handoff.sched_key, d.handoff.decode_index)

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
        if h.prefill_index >= 0 and not h.is_migration:  # a prefill's KV hand-off
            self.req_metrics.handoff.observe(max(0.0, client.first_token_s - h.prefill_done_s))

    def finalize(self) -> None:
        self.worker.shutdown()
        self.threads[0].join()
        self.outbox.put(None)
        self.threads[1].join()
        self.stats.close()
        self.stats.unlink()
        self.notifier.close()
        if self.migration is not None:
            self.migration.close()
        self.worker.runner.close()


def send(sender, text: str, reason: str, n_in: int, n_out: int, final: bool, logprobs=None,
         num_cached: int = 0):  # fmt: skip
    packed = sender.packed  # a GuardedSender: what the request asked for
    r = response(text, reason, n_in, n_out, logprobs, packed, num_cached)
    sender.send(r, flags=FINAL if final else 0)


def slo_outcome(d: Delta, client: Client) -> tuple[bool, bool] | None:
    """(TTFT met, TPOT met) of a request that generated, against the SLOs the scheduler
    resolved for it (the hybrid role controller's input); None if it did not run."""
    h, now = client.handoff, time.time()
    if not (h.ttft_slo_s and h.tpot_slo_s) or d.error or not client.first_token_s:
        return None
    n = d.num_output_tokens
    tpot = (now - client.first_token_s) / (n - 1) if n > 1 else 0.0
    return client.first_token_s - h.arrival_s <= h.ttft_slo_s, tpot <= h.tpot_slo_s


def send_moved(sender, h: Handoff) -> None:
    """The FINAL of this instance's stream for a decode that moved: the relay (router or
    bucketserve_bls, which always ask for the packed output) follows the sealed hand-off."""
    if not sender.packed:
        raise RuntimeError("a moved decode needs a relay that follows it (decode_router, bls)")
    d = PackedDelta("", MIGRATED, h.params.num_input_tokens, len(h.output_ids),
                    handoff=seal_message(h).decode())  # fmt: skip
    sender.send(pb_utils.InferenceResponse(output_tensors=[bytes_tensor(PACKED_OUTPUT, encode(d))]),
                flags=FINAL)  # fmt: skip


def send_error(sender, message: str, busy: bool) -> None:
    sender.send(pb_utils.InferenceResponse(error=triton_error(message, busy)), flags=FINAL)


def triton_error(message: str, busy: bool):
    """A busy (capacity) error carries UNAVAILABLE, which HTTP maps to 503 and gRPC to
    UNAVAILABLE: the client should retry later; anything else stays INTERNAL."""
    code = pb_utils.TritonError.UNAVAILABLE if busy else pb_utils.TritonError.INTERNAL
    return pb_utils.TritonError(message, code)
