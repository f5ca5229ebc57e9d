"""The decode step's memory floor for perf/engine/engine_bench.py: the bytes one step must read (the
weights once, the batch's KV) over the read bandwidth measured on this machine.

A shared VM's read bandwidth is not one number: this one's moves between ~33 and ~60 GB/s
within seconds (docs/measurements.md). So each timed decode gets its own floor, from the
bandwidth measured right before and right after it (the higher of the two: a step is never
credited with less bandwidth than the machine showed around it), and the bench reports the
median of those per-round ratios.

The bandwidth is read over memory of the kind the streamed weights live in
(engine/weight_arena.py: one mapping, huge pages advised): on the 2-core AVX2 VM the best-of-5
sum read 1.15x as fast there as over torch's own allocation (median of 10 alternating rounds,
0.86-1.44x), so a floor from the latter would credit the step with bandwidth it lacks."""

from __future__ import annotations

import statistics
import time

import torch

from bucketserve.engine.shapes import DTYPE_BYTES
from bucketserve.engine.weight_arena import arena_buffer

BANDWIDTH_BYTES = 1 << 28  # read buffer: 8x a 32 MiB L3
BANDWIDTH_RUNS = 5  # best kept: other jobs on a shared machine only ever slow a read down


_buffer: torch.Tensor | None = None


def read_bandwidth(nbytes: int = BANDWIDTH_BYTES, runs: int = BANDWIDTH_RUNS) -> float:
    """Bytes/s one sum over an nbytes float32 tensor reads, with torch's current threads
    (the threads the engine's GEMMs get), in an arena buffer as the streamed weights are; the
    buffer is kept for the next call."""
    global _buffer
    if _buffer is None or _buffer.numel() != nbytes // 4:
        _buffer = arena_buffer(nbytes // 4 * 4).view(torch.float32)
        _buffer.fill_(1.0)  # written once: its pages are mapped before timing
    x, best = _buffer, float("inf")
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


def decode_floor(mc, batch: int, context: int, rounds: list[tuple[float, float]]) -> dict:
    """From each round's (step_ms, bandwidth B/s): the median bandwidth, floor_ms at it
    (step_bytes / bandwidth) and floor_ratio, the median of the rounds' step_ms / floor_ms."""
    nbytes = step_bytes(mc, batch, context)
    bandwidth = statistics.median(bw for _, bw in rounds)
    ratios = [step_ms / (1e3 * nbytes / bw) for step_ms, bw in rounds]
    return dict(read_bandwidth=round(bandwidth / 1e9, 1) * 1e9,
                floor_ms=round(1e3 * nbytes / bandwidth, 3),
                floor_ratio=round(statistics.median(ratios), 2),
                floor_ratios=[round(r, 2) for r in ratios])  # fmt: skip
