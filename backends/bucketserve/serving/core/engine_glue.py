"""The serving layer's only contact with the engine: build a runner, make sequences, publish stats."""

from __future__ import annotations

import os
import time

from bucketserve.serving.config import ServeConfig


def cpu_threads(cfg: ServeConfig) -> int:
    """Intra-op threads for one CPU engine: the cores split among the CPU engine instances, so
    prefill and decode running at once do not oversubscribe the machine (OpenMP spin-waits)."""
    sharing = (cfg.engine_prefill_devices + cfg.decode_devices).count("cpu")
    return max(1, (os.cpu_count() or 1) // max(1, sharing))


def build_runner(cfg: ServeConfig, device: str, pool_name: str):
    """A ModelRunner for one engine instance; its KV pool is exported under `pool_name`."""
    from bucketserve.engine.config import EngineConfig
    from bucketserve.engine.runner import ModelRunner

    optional = {"kv_cache_gb": cfg.kv_cache_gb} if cfg.kv_cache_gb is not None else {}
    if device == "cpu":
        optional["num_threads"] = cpu_threads(cfg)
    if device.startswith("cuda"):  # instances sharing a GPU split its total memory
        sharing = (cfg.engine_prefill_devices + cfg.decode_devices).count(device)
        share = cfg.gpu_memory_utilization or round(0.9 / sharing, 3)
        optional["gpu_memory_utilization"] = share
    ecfg = EngineConfig(
        model=cfg.model_dir,
        device=device,
        dtype=cfg.dtype,
        block_size=cfg.block_size,
        attention=cfg.attention,
        max_model_len=cfg.max_model_len,
        pool_name=pool_name,
        cuda_graphs=cfg.cuda_graphs,
        # the largest batches this instance runs: they size its activation headroom on GPU
        # and its static decode buffers
        max_num_batched_tokens=cfg.max_prefill_tokens,
        max_num_seqs=cfg.max_decode_batch,
        warm_gemms=True,  # CPU: oneDNN's per-shape memory taken before serving, not during
        **optional,
    )
    return ModelRunner(ecfg)


def new_sequence(token_ids: list[int], sampling, cache_salt: str | None = None):
    """An engine Sequence for a request's tokens and its SamplingParams (carried as is)."""
    from bucketserve.engine.sequence import Sequence

    return Sequence(list(token_ids), sampling, cache_salt=cache_salt)


def logprob_list(lp) -> list | None:
    """A sampler TokenLogprob as JSON-ready [logprob, top ids, top logprobs] (None stays None)."""
    return None if lp is None else [lp.logprob, lp.top_ids, lp.top_logprobs]


def publish_stats(stats, runner, blocks, running: int, waiting: int, pending: int,
                  received: int = 0, backlog: int = 0) -> None:  # fmt: skip
    """Write this instance's numbers to its shared-memory stats block (read by the scheduler)."""
    stats.publish(
        total_blocks=blocks.num_total_blocks,
        free_blocks=blocks.num_free_blocks,
        block_size=runner.block_size,
        running=running,
        waiting=waiting,
        step_latency_ema_s=runner.stats.ema_decode_s or runner.stats.ema_prefill_s,
        tokens_processed=runner.stats.num_tokens,
        kv_bytes_per_token=runner.model_config.kv_bytes_per_token,
        heartbeat=time.time(),
        pending_handoffs=pending,
        num_received=received,
        prefill_backlog=backlog,
    )
