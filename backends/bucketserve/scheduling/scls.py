"""SCLS (slice-level scheduling, arXiv 2406.13511), rebuilt from its abstract and third-party
notes (its full text was not in hand; see shared/research/papers.md section 3):

* generation slicing: a batch is served for at most `scls_slice_tokens` output tokens; the
  unfinished are re-queued and re-batched (here their KV is dropped and the prompt plus what
  was generated is prefilled again, the base design the notes suggest);
* memory bounded per slice: each request reserves prompt + one slice of blocks;
* batch-size search: over the length-sorted window of the oldest `edf_scan` requests, the
  prefix size N that maximises estimated throughput N x slice / T(N), with T from two
  bilinear models fitted online (prefill batches, decode steps);
* max-min balancing across instances lives with the caller (sim.scls picks the instance with
  the least estimated outstanding work).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from itertools import islice

from bucketserve.scheduling.base import BaseScheduler, Ordered
from bucketserve.scheduling.batch import PrefillBatch
from bucketserve.scheduling.config import SchedulerConfig
from bucketserve.scheduling.latency_model import BilinearLatencyModel
from bucketserve.scheduling.memory import Budget, blocks_for
from bucketserve.scheduling.request import RequestMeta


class SclsScheduler(BaseScheduler):
    """Policy "scls": slice batches sized by an estimated-throughput search."""

    name = "scls"
    default_reserve = "none"

    def __init__(self, config: SchedulerConfig, clock: Callable[[], float]) -> None:
        super().__init__(config, clock)
        self.prefill_model = BilinearLatencyModel(
            config.prefill_tokens_per_s, config.prefill_overhead_s
        )
        # decode steps: ~ memory-bound, so a small per-(N x context) term on a fixed cost
        self.step_model = BilinearLatencyModel(2e6, config.scls_step_prior_s)

    def _decode_blocks(self, meta: RequestMeta, block_size: int, colocated: bool) -> int:
        own = self._own_prompt(meta, colocated)
        return blocks_for(own + self.config.scls_slice_tokens, block_size)

    def _observe_latency(self, batch: PrefillBatch, duration_s: float) -> None:
        self.prefill_model.observe(batch.size, batch.max_len, duration_s)

    def observe_step(self, n: int, max_context: int, seconds: float) -> None:
        """One decode step of a slice batch took `seconds`."""
        self.step_model.observe(n, max_context, seconds)

    def slice_time(self, n: int, longest: int) -> float:
        """Estimated seconds to serve one slice of a batch of n, longest prompt `longest`."""
        s = self.config.scls_slice_tokens
        return self.prefill_model.predict(n, longest) + s * self.step_model.predict(
            n, longest + s // 2
        )

    def _preferred(self, now: float) -> Ordered:
        only = self.buckets.buckets[0]
        window = sorted(
            islice(only.requests.values(), self.config.edf_scan), key=lambda m: m.prompt_len
        )
        return window, (only.low, only.high)

    def _take(
        self, ordered: Iterable[RequestMeta], budget: Budget, now: float
    ) -> list[RequestMeta]:
        """The prefix (of what fits memory) with the best estimated requests per second."""
        fitting: list[RequestMeta] = []
        for meta in ordered:
            if not self._claim(meta, budget):
                break
            fitting.append(meta)
        best_n, best_rate = 0, -1.0
        for n in range(1, len(fitting) + 1):
            rate = n / self.slice_time(n, fitting[n - 1].prompt_len)
            if rate > best_rate:
                best_n, best_rate = n, rate
        return fitting[:best_n]
