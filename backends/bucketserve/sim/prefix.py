"""Prefix caching in the simulator: a shared-system-prompt workload, the server's colocated
placement (least loaded, or prefix-aware with `PrefixIndex` + `by_affinity`), and the
comparison `python -m bucketserve.sim.prefix`.

The instances are chunked colocated ones (`SimInstance`) whose `BlockManager` runs its real
prefix cache over the requests' token ids, so hits, LRU eviction of unreferenced cached
blocks and preemption are the engine's own; a chunk that starts after a cached prefix is
charged `hybrid_time`'s (tokens, prefix) cost, reading the prefix's KV instead of computing it.

Placement is `SchedulerCore.next_colocated`'s: the instances whose intake is open (prompt
backlog below one iteration's budget), least loaded first, reordered for the oldest unplaced
request by `order_instances` (cached overlap vs load, least loaded past `balance_tokens`),
each offered alone to the policy. The index is the server's approximate one: built from the
placements themselves, never from the engines' caches.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bucketserve.bench.workloads import ALPACA_OUTPUT, ALPACA_PROMPT
from bucketserve.engine.block_hash import block_hashes
from bucketserve.scheduling import DEFAULT_SLOS, RequestMeta
from bucketserve.scheduling.prefix_index import (
    ColocatedPlacement,
    PrefixIndex,
    probably_cached,
)
from bucketserve.sim.workload import SimRequest, arrival_times

VOCAB = 32_000


@dataclass(slots=True)
class PrefixWorkload:
    """Requests that each start with one of `num_prefixes` shared system prompts of
    `prefix_tokens` tokens, then an Alpaca-like question (its own tokens); Alpaca-like outputs;
    Poisson arrivals. `hot_share` > 0: that share of requests use prefix 0 (a hot prompt), the
    rest spread evenly over all prefixes."""

    num_requests: int = 600
    rate: float = 8.0
    num_prefixes: int = 8
    prefix_tokens: int = 2048
    hot_share: float = 0.0
    max_tokens: int = 512
    max_model_len: int = 4096
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_requests < 1 or self.rate <= 0 or self.num_prefixes < 1:
            raise ValueError("num_requests and num_prefixes must be >= 1 and rate > 0")
        if not 0.0 <= self.hot_share <= 1.0:
            raise ValueError(f"hot_share must be in [0, 1], got {self.hot_share}")
        if not 0 < self.prefix_tokens < self.max_model_len - self.max_tokens - 1:
            raise ValueError(
                f"prefix_tokens must be in (0, {self.max_model_len - self.max_tokens - 1}), "
                f"got {self.prefix_tokens}"
            )


def prefix_requests(spec: PrefixWorkload) -> list[SimRequest]:
    """The request list (deterministic for spec.seed; the prefixes' tokens for spec.seed too)."""
    rng = np.random.default_rng([spec.seed, 7])
    n = spec.num_requests
    prefixes = [
        rng.integers(1, VOCAB, spec.prefix_tokens).tolist() for _ in range(spec.num_prefixes)
    ]
    times = arrival_times(rng, n, spec.rate, "poisson", 1.0)
    hot = rng.random(n) < spec.hot_share
    group = np.where(hot, 0, rng.integers(0, spec.num_prefixes, n))
    cap = spec.max_model_len - spec.max_tokens - spec.prefix_tokens
    question = np.clip(np.rint(ALPACA_PROMPT.draw(rng, n)), 1, cap).astype(int)
    out = np.clip(np.rint(ALPACA_OUTPUT.draw(rng, n)), 2, spec.max_tokens).astype(int)
    reqs = []
    for i in range(n):
        ids = prefixes[group[i]] + rng.integers(1, VOCAB, question[i]).tolist()
        meta = RequestMeta(
            f"r{i}", len(ids), spec.max_tokens, float(times[i]), "online",
            DEFAULT_SLOS["online"].ttft_for(len(ids)), DEFAULT_SLOS["online"].tpot_s,
            task_type=f"prefix{group[i]}",
        )  # fmt: skip
        reqs.append(SimRequest(meta, int(out[i]), prompt_ids=ids))
    return reqs


class Router:
    """The scheduler model's colocated placement over simulated instances (see the module
    docstring); `prefix_aware` False: least loaded only."""

    def __init__(self, sim, prefix_aware: bool, balance_tokens: float) -> None:
        self.block_size = sim.cluster.block_size
        self.prefix_aware, self.balance_tokens = prefix_aware, balance_tokens
        # the index exists wherever the engines cache (the server keeps one then); only
        # prefix_aware placement orders by it, the estimate of cached tokens serves both
        caching = sim.cluster.prefix_caching
        self.index = PrefixIndex(clock=lambda: sim.now) if caching else None
        self.placement = ColocatedPlacement(self.index, balance_tokens, clock=lambda: sim.now)
        self.unplaced: dict[str, SimRequest] = {}  # arrival order, like SchedulerCore.waiting
        self.placed: dict[str, int] = {}  # instance id -> requests placed there

    def arrive(self, req: SimRequest) -> None:
        """Before the policy sees it: its hashes, and what is probably cached (buckets sort by
        the uncached length)."""
        ids = req.prompt_ids if req.prompt_ids is not None else [0] * req.meta.prompt_len
        req.extra["hashes"] = hashes = block_hashes(ids, self.block_size)
        req.meta.num_cached_tokens = probably_cached(
            self.index, hashes, req.meta.prompt_len, self.block_size
        )
        self.unplaced[req.meta.request_id] = req

    def offer(self, stats: list, is_open) -> list:
        """The instances to offer the policy, in order (`ColocatedPlacement.offer`)."""
        stats = sorted(stats, key=lambda s: (s.prefill_backlog, s.running))
        if not self.prefix_aware or not self.unplaced:
            return [s for s in stats if is_open(s)]
        key, oldest = next(iter(self.unplaced.items()))
        hashes, n = oldest.extra["hashes"], oldest.meta.prompt_len
        return self.placement.offer(key, stats, is_open, hashes, n)

    def place(self, instance_id: str, req: SimRequest) -> None:
        del self.unplaced[req.meta.request_id]
        self.placed[instance_id] = self.placed.get(instance_id, 0) + 1
        if self.index is not None:
            self.index.record(instance_id, req.extra["hashes"])
