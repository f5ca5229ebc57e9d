"""The `prefill` model: packed prefill of one bucket batch into this instance's exported KV pool.

With prefix caching each sequence starts from the cached blocks of its longest cached prefix and
only the rest is computed (a chunk over cached context). Every block of a sequence, shared or
not, is handed to decode; the hand-off holds one reference to each until decode acks it or it
expires, so a shared block stays put while any hand-off or later request still reads it."""

from __future__ import annotations

import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

from bucketserve.engine.block_manager import BlockManager, OutOfBlocksError
from bucketserve.engine.sequence import Chunk
from bucketserve.kv.handoff import HandoffTable
from bucketserve.kv.names import shm_name
from bucketserve.kv.stats import StatsBlock
from bucketserve.serving.config import ServeConfig
from bucketserve.serving.core.engine_glue import (
    build_runner,
    logprob_list,
    new_sequence,
    publish_stats,
)
from bucketserve.serving.core.kv_intake import publish_pool
from bucketserve.serving.core.messages import (
    MessageError,
    PrefillBatch,
    PrefillReply,
    PrefillResult,
    encode,
    open_message,
)
from bucketserve.serving.launch.repository import model_index
from bucketserve.serving.models.metrics import KvMetrics, PrefixCacheMetrics, instance_finished
from bucketserve.serving.models.triton_io import (
    array_input,
    bytes_input,
    bytes_tensor,
    model_parameter,
)

RECLAIM_INTERVAL_S = 0.02
GAUGE_INTERVAL_S = 0.25


class PrefillWorker:
    """Owns one runner, its block manager and hand-off table; pure of Triton."""

    def __init__(self, cfg: ServeConfig, index: int) -> None:
        self.cfg, self.index = cfg, index
        self.runner = build_runner(
            cfg, cfg.prefill_devices[index], shm_name(cfg.run_id, "prefill", index, "kv")
        )
        self.blocks = BlockManager(self.runner.num_blocks, self.runner.block_size,
                                   cfg.enable_prefix_caching, namespace=cfg.model)  # fmt: skip
        self.table_name = shm_name(cfg.run_id, "prefill", index, "ho")
        self.table = HandoffTable.create(
            self.table_name, self.runner.num_blocks, cfg.handoff_timeout_s
        )
        self.stats = StatsBlock.create(shm_name(cfg.run_id, "prefill", index, "st"))
        self.lock = threading.Lock()
        self.publish()
        publish_pool(cfg, index, self.runner.pool_handle)  # decode opens it by our index

    def publish(self) -> None:
        publish_stats(self.stats, self.runner, self.blocks, 0, 0, self.table.num_pending)

    def reclaim(self) -> None:
        """Return blocks that decode acknowledged, or that nobody pulled in time."""
        with self.lock:
            freed = self.table.reclaim(time.monotonic())
            if freed:
                self.blocks.free(freed)
            self.publish()

    def run(self, ids: np.ndarray, seq_lens: np.ndarray, rows: list,
            salts: list | None = None) -> PrefillReply:  # fmt: skip
        """Prefill one packed batch; `rows` are the sequences' SamplingParams, `salts` their
        cache salts (None: none)."""
        start = time.perf_counter()
        self.runner.sampler.prefetch(rows)  # guides compile while the batch's prompts run
        self.reclaim()
        seqs, offset = [], 0
        for n, row, salt in zip(seq_lens.tolist(), rows, salts or [None] * len(rows), strict=True):
            seqs.append(new_sequence(ids[offset : offset + n].tolist(), row, salt))
            offset += n
        with self.lock:
            self.admit(seqs)
        try:
            first = self.runner.step_sampled([], [self.uncached(s) for s in seqs])
        except BaseException:
            with self.lock:
                for s in seqs:
                    self.blocks.release(s)
            raise
        now, bs = time.monotonic(), self.blocks.block_size
        with self.lock:
            for s in seqs:
                self.blocks.cache_blocks(s, s.num_cached_tokens, s.num_tokens)
        results = [
            PrefillResult(
                tok,
                list(s.block_table),
                # its cached prefix blocks may be pending in other hand-offs too
                self.table.publish(list(s.block_table), now, s.num_cached_tokens // bs),
                logprob_list(lp),
                s.num_cached_tokens,
            )
            for tok, lp, s in zip(first.tokens, first.logprobs, seqs, strict=True)
        ]
        self.publish()
        return PrefillReply(self.index, results, time.perf_counter() - start)

    def admit(self, seqs: list) -> None:
        """Each sequence's table: its cached prefix, then new blocks; all or none (pool full)."""
        needed = sum(self.blocks.blocks_needed(s.num_tokens) for s in seqs)
        taken = []
        try:
            for s in seqs:
                s.num_cached_tokens = self.blocks.take_cached(s, self.blocks.find_cached(s))
                taken.append(s)
                self.blocks.allocate_for(s, s.num_tokens)
        except OutOfBlocksError:
            for s in taken:
                self.blocks.release(s)
            raise RuntimeError(
                f"prefill KV pool full: batch needs up to {needed} blocks, "
                f"{self.blocks.num_free_blocks} free"
            ) from None

    @staticmethod
    def uncached(seq) -> Chunk:
        """The part of the prompt to compute: after the cached prefix, to the last token."""
        seq.num_computed_tokens = seq.num_cached_tokens
        return Chunk(seq, seq.num_cached_tokens, seq.num_tokens - seq.num_cached_tokens)

    def close(self) -> None:
        self.stats.close()
        self.stats.unlink()
        self.table.close()
        self.table.unlink()
        self.runner.close()


class PrefillModel:
    """Triton lifecycle: one batch per request from the scheduler; a thread reclaims blocks."""

    def initialize(self, args: dict) -> None:
        cfg = ServeConfig.read(model_parameter(args, "run_config"))
        self.worker = PrefillWorker(cfg, model_index(args["model_name"]))
        pb_utils.Logger.log_info(f"prefill{self.worker.index}: {self.worker.runner.describe()}")
        name = f"prefill{self.worker.index}"
        self.kv_metrics = KvMetrics(name)
        self.cache_metrics = PrefixCacheMetrics(name)
        self.finished = instance_finished(name)
        self.stop_event = threading.Event()
        self.thread = threading.Thread(
            target=self.reclaim_loop, name="prefill-reclaim", daemon=True
        )
        self.thread.start()

    def reclaim_loop(self) -> None:
        next_gauge = 0.0
        while not self.stop_event.wait(RECLAIM_INTERVAL_S):
            try:
                self.worker.reclaim()
                if time.monotonic() >= next_gauge:
                    blocks = self.worker.blocks
                    self.kv_metrics.set(blocks.num_free_blocks, blocks.num_total_blocks,
                                        blocks.num_evictable_blocks)  # fmt: skip
                    self.cache_metrics.set(blocks)
                    next_gauge = time.monotonic() + GAUGE_INTERVAL_S
            except Exception as e:  # without this thread, unpulled blocks would never return
                pb_utils.Logger.log_error(f"prefill reclaim: {type(e).__name__}: {e}")

    def execute(self, requests: list) -> list:
        return [self.one(r) for r in requests]

    def one(self, request):
        try:  # refused before any block is taken unless the scheduler (this run) wrote it
            ids = array_input(request, "input_ids", np.int32)
            lens = array_input(request, "seq_lens", np.int32)
            raw = bytes_input(request, "sampling")
            batch = open_message(PrefillBatch, raw, ids.tobytes(), lens.tobytes())
        except MessageError as e:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(f"prefill: {e}"))
        rows = batch.sampling
        try:
            self.finished.increment(len(rows))  # its requests are done here, whatever happens
            start = time.time()
            reply = self.worker.run(ids, lens, rows, batch.cache_salts)
            # wall-clock span of each batch: shows (and lets tests check) batches overlapping
            pb_utils.Logger.log_info(
                f"prefill{self.worker.index} batch seqs={len(rows)} tokens={int(lens.sum())} "
                f"span={start:.6f}-{time.time():.6f}"
            )
        except Exception as e:  # the scheduler turns this into per-request errors
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(f"prefill failed: {e}"))
        return pb_utils.InferenceResponse(output_tensors=[bytes_tensor("result", encode(reply))])

    def finalize(self) -> None:
        self.stop_event.set()
        self.thread.join()
        self.worker.close()
