"""The decode step's memory floor for perf/engine/engine_bench.py: the bytes one step must read (the
weights once, the batch's KV) over the read bandwidth measured on this machine."""

from __future__ import annotations

import time

import torch

from bucketserve.engine.shapes import DTYPE_BYTES

BANDWIDTH_BYTES = 1 << 30  # read buffer: far larger than any cache
BANDWIDTH_RUNS = 7  # best kept: other jobs on a shared machine only ever slow a read down


def read_bandwidth(nbytes: int = BANDWIDTH_BYTES, runs: int = BANDWIDTH_RUNS) -> float:
    """Bytes/s one sum over an nbytes float32 tensor reads, with torch's current threads
    (the threads the engine's GEMMs get)."""
    x = torch.ones(nbytes // 4)  # written once: its pages are mapped before timing
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - start)
    return nbytes / best


def step_bytes(mc, batch: int, context: int) -> int:
    """Bytes one decode step reads at least: every weight once (one embedding row per
    sequence, unless the LM head shares the table) and `context` tokens of KV per sequence."""
    params = mc.num_params - (0 if mc.tie_word_embeddings else mc.vocab_size * mc.hidden_size)
    return params * DTYPE_BYTES[mc.dtype] + batch * context * mc.kv_bytes_per_token


def decode_floor(mc, batch: int, context: int, bandwidth: float, step_ms: float) -> dict:
    """floor_ms (step_bytes at `bandwidth`) and floor_ratio (step_ms / floor_ms)."""
    floor_ms = 1e3 * step_bytes(mc, batch, context) / bandwidth
    return dict(floor_ms=round(floor_ms, 3), floor_ratio=round(step_ms / floor_ms, 2))
