"""Dynamic Batching Controller: the paper's memory-safe batch size (Eqs. 1, 5, 6).

    M_KV   = 2 * L * H * D * B * sum(S_i)                 (K and V, every layer; Eq. 1/5)
    M_safe = safety * M_remain,  safety = 0.9              (M_remain: free memory after weights)
    N_max  = max N  s.t.  sum_{i=1..N} S_i <= M_safe / (2 * L * H * D * B)      (Eq. 6)

S_i is the request's sequence length at arrival (its prompt), as the paper writes it. Live
free memory is free_blocks * block_size * kv_bytes_per_token from the Global Monitor.
"""

from __future__ import annotations

from collections.abc import Iterable

from bucketserve.scheduling.cluster import InstanceStats


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """2 * L * H * D * B: bytes of K and V one token occupies across all layers."""
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def token_capacity(free_bytes: float, bytes_per_token: int, safety: float = 0.9) -> int:
    """M_safe / (2LHDB): how many KV tokens fit in `safety` x the free memory."""
    if bytes_per_token <= 0:
        raise ValueError(f"bytes_per_token must be > 0, got {bytes_per_token}")
    return max(0, int(safety * free_bytes // bytes_per_token))


def max_batch_size(lengths: Iterable[int], capacity_tokens: int) -> int:
    """Eq. 6: the largest N whose first N lengths sum to at most capacity_tokens."""
    total = 0
    n = 0
    for length in lengths:
        total += length
        if total > capacity_tokens:
            break
        n += 1
    return n


def estimate_n_max(capacity_tokens: int, mean_len: float) -> int:
    """Eq. 6 with every S_i at the queue's mean length (Algorithm 1 compares queues to this)."""
    return int(capacity_tokens // max(mean_len, 1.0))


class DynamicBatchingController:
    """Recomputes the Eq. 6 token capacity from live stats of the batch's two targets."""

    def __init__(self, safety: float = 0.9) -> None:
        self.safety = safety
        self.last_capacity: int | None = None

    def capacity(self, prefill: InstanceStats, decode: InstanceStats) -> int:
        """Tokens that fit both the prefill pool and the decode pool (M_remain = the smaller)."""
        free = min(prefill.free_bytes, decode.free_bytes)
        self.last_capacity = token_capacity(free, decode.kv_bytes_per_token, self.safety)
        return self.last_capacity

    def n_max(self, mean_len: float) -> int | None:
        """N_max for the queue's mean length, or None before any stats were seen."""
        if self.last_capacity is None:
            return None
        return estimate_n_max(self.last_capacity, mean_len)
