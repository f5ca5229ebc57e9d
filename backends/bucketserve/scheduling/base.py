"""The scheduler skeleton every policy shares: waiting queue, admission, starvation bound.

A policy supplies `_preferred` (which bucket, in which order) and `_take` (how many of those
fit its batch rule); this class picks the target instances, enforces the block budget of both
pools, serves overdue requests first, and keeps the ledger and the monitor up to date.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from itertools import takewhile
from time import perf_counter

from bucketserve.scheduling.batch import PrefillBatch
from bucketserve.scheduling.buckets import BucketManager
from bucketserve.scheduling.cluster import ClusterView, InstanceStats
from bucketserve.scheduling.config import SchedulerConfig
from bucketserve.scheduling.memory import (
    Budget,
    DecodeLedger,
    Reservation,
    blocks_for,
    decode_headroom,
    reserve_tokens,
)
from bucketserve.scheduling.monitor import Ema, GlobalMonitor, MonitorSnapshot
from bucketserve.scheduling.placement import DecodeCandidate, DecodePlacer, request_load
from bucketserve.scheduling.request import RequestMeta

Ordered = tuple[Iterable[RequestMeta], tuple[int, int]]
Target = tuple[InstanceStats, InstanceStats, Budget]
LEDGER_GRACE_S = 1.0  # idle decode + no open batch for this long: forget unreported finishes


class BaseScheduler:
    """Shared machinery; subclasses set `name`, `default_reserve` and the two hooks."""

    name = "base"
    default_reserve = "none"

    def __init__(self, config: SchedulerConfig, clock: Callable[[], float]) -> None:
        self.config = config
        self._clock = clock
        self.buckets = BucketManager(config.max_model_len)
        self.ledger = DecodeLedger()
        self.monitor = GlobalMonitor()
        self.placer = DecodePlacer(config.decode_balance)
        self.reserve_mode = config.output_reserve or self.default_reserve
        self.output_mean = Ema(0.05)
        self.output_mean.add(config.expected_output_tokens)
        self._open: dict[int, str] = {}  # batch_id -> decode_id, until on_batch_done
        self._last_done: dict[str, float] = {}
        self._next_id = 0

    # ---- public API -------------------------------------------------------------------
    def add(self, meta: RequestMeta) -> None:
        """Queue a request (call in arrival order)."""
        if meta.prompt_len + meta.max_tokens > self.config.max_model_len:
            raise ValueError(
                f"prompt_len + max_tokens must be <= max_model_len={self.config.max_model_len}, "
                f"got {meta.prompt_len} + {meta.max_tokens}"
            )
        if meta.request_id in self.buckets:
            raise ValueError(f"request_id {meta.request_id!r} is already queued")
        self.buckets.add(meta)
        self.monitor.observe_arrival(meta.arrival_s, meta.prompt_len)
        self._on_add(meta)

    def cancel(self, request_id: str) -> bool:
        """Drop a still-waiting request; False if it is unknown or already scheduled."""
        return self.buckets.remove(request_id) is not None

    @property
    def num_waiting(self) -> int:
        return self.buckets.total

    def next_batch(self, view: ClusterView) -> PrefillBatch | None:
        """The next prefill batch for one of view.prefill, or None (nothing fits or waits)."""
        t0 = perf_counter()
        self.monitor.observe_view(view)
        batch = self._decide(view, self._clock()) if self.buckets.total else None
        self.monitor.record_decision(perf_counter() - t0, batch.padding_ratio if batch else None)
        return batch

    def on_batch_done(self, batch: PrefillBatch, duration_s: float) -> None:
        """A prefill batch finished after duration_s seconds of execution."""
        self._open.pop(batch.batch_id, None)
        self._last_done[batch.decode_id] = self._clock()
        self.monitor.record_batch_latency(duration_s)
        self._observe_latency(batch, duration_s)

    def on_request_finished(self, request_id: str, num_output_tokens: int | None = None) -> None:
        """The decode side finished (or dropped) a request: release its reservation."""
        self.ledger.release(request_id)
        if num_output_tokens:
            self.output_mean.add(num_output_tokens)

    def snapshot(self) -> MonitorSnapshot:
        snap = self.monitor.snapshot(self.name, self._clock(), self.buckets, self.num_waiting)
        snap.extra = {
            "in_flight": float(len(self.ledger)),
            "expected_output": self.output_mean.value,
        }
        snap.extra.update(self._extra())
        return snap

    # ---- policy hooks -----------------------------------------------------------------
    def _on_add(self, meta: RequestMeta) -> None:
        return None

    def _prepare(self, prefill: InstanceStats, decode: InstanceStats, now: float) -> None:
        return None

    def _preferred(self, now: float) -> Ordered:
        raise NotImplementedError

    def _take(
        self, ordered: Iterable[RequestMeta], budget: Budget, now: float
    ) -> list[RequestMeta]:
        raise NotImplementedError

    def _may_dispatch(self, decode: InstanceStats, now: float) -> bool:
        return True

    def _observe_latency(self, batch: PrefillBatch, duration_s: float) -> None:
        return None

    def _extra(self) -> dict[str, float]:
        return {}

    # ---- shared machinery -------------------------------------------------------------
    def _decide(self, view: ClusterView, now: float) -> PrefillBatch | None:
        target = self._target(view, now)
        if target is None:
            return None
        prefill, decode, budget = target
        self._prepare(prefill, decode, now)
        ordered, bounds = self._overdue(now) or self._preferred(now)
        chosen = self._take(ordered, budget, now)
        if not chosen:
            return None
        return self._commit(chosen, bounds, prefill, decode, now)

    def _target(self, view: ClusterView, now: float) -> Target | None:
        """The emptiest ready prefill instance and the decode instance the placer picks."""
        decode_by_id = {d.instance_id: d for d in view.decode}
        for p in sorted(view.prefill, key=lambda s: (-s.free_blocks, s.instance_id)):
            colocated = decode_by_id.get(p.instance_id)
            candidates = [colocated] if colocated else view.decode
            d, room = self._place(candidates, now)
            if d is not None:
                seqs = self.config.max_num_seqs - max(
                    d.running + d.pending_handoffs, self.ledger.count(d.instance_id)
                )
                prefill_room = room if colocated else p.free_blocks
                tokens = self.config.max_prefill_tokens
                return p, d, Budget(prefill_room, room, seqs, d.block_size, tokens,
                                    colocated=colocated is not None)  # fmt: skip
        return None

    def _place(self, decode: list[InstanceStats], now: float) -> tuple[InstanceStats | None, int]:
        """The decode instance for the next batch (by config.decode_balance) and its headroom."""
        by_id, options = {}, []
        for d in decode:
            self._expire_ledger(d, now)
            if not self._may_dispatch(d, now):
                continue
            room = decode_headroom(d, self.ledger, self.config.watermark)
            count = max(d.running + d.pending_handoffs, self.ledger.count(d.instance_id))
            by_id[d.instance_id] = (d, room)
            options.append(
                DecodeCandidate(d.instance_id, room, count, self.ledger.load(d.instance_id))
            )
        chosen = self.placer.choose(options)
        return by_id[chosen.instance_id] if chosen else (None, 0)

    def _expire_ledger(self, d: InstanceStats, now: float) -> None:
        """Fallback for callers that never report finishes: an idle decode owes nothing."""
        if d.running or d.pending_handoffs or d.instance_id in self._open.values():
            return
        if now - self._last_done.get(d.instance_id, now) >= LEDGER_GRACE_S:
            self.ledger.clear(d.instance_id)

    def _overdue(self, now: float) -> Ordered | None:
        """Requests past the starvation bound, oldest first: they go next, whatever the policy."""
        cutoff = now - self.config.max_wait_s
        late = [b for b in self.buckets.buckets if b.requests and b.oldest().arrival_s <= cutoff]
        if not late:
            return None
        merged = heapq.merge(*(b.requests.values() for b in late), key=lambda m: m.arrival_s)
        bounds = (min(b.low for b in late), max(b.high for b in late))
        return takewhile(lambda m: m.arrival_s <= cutoff, merged), bounds

    @staticmethod
    def _own_prompt(meta: RequestMeta, colocated: bool) -> int:
        """Prompt tokens whose blocks the request adds to its instance. Colocated, the prefix
        it probably finds cached there is shared with the requests that hold it, so it is
        not counted again; an estimate that proves wrong (evicted, or cached elsewhere) is
        caught by the live view (the engine's free blocks) and the engine's preemption.
        Disaggregated, the decode instance receives every prompt block."""
        return meta.prompt_len - meta.num_cached_tokens if colocated else meta.prompt_len

    def _decode_blocks(self, meta: RequestMeta, block_size: int, colocated: bool) -> int:
        out = reserve_tokens(meta, self.reserve_mode, self.output_mean.value or 1.0)
        return blocks_for(self._own_prompt(meta, colocated) + out, block_size)

    def _claim(self, meta: RequestMeta, budget: Budget) -> bool:
        """Take one request's prompt blocks (prefill) and reserved blocks (decode) if they fit."""
        prompt = blocks_for(self._own_prompt(meta, budget.colocated), budget.block_size)
        decode = self._decode_blocks(meta, budget.block_size, budget.colocated)
        return budget.try_take(prompt, decode, meta.prompt_len)

    def _commit(
        self,
        chosen: list[RequestMeta],
        bounds: tuple[int, int],
        p: InstanceStats,
        d: InstanceStats,
        now: float,
    ) -> PrefillBatch:
        batch = PrefillBatch(self._next_id, chosen, bounds, p.instance_id, d.instance_id, now)
        self._next_id += 1
        self._open[batch.batch_id] = d.instance_id
        self.placer.placed(d.instance_id)
        expected = self.output_mean.value or 1.0
        colocated = p.instance_id == d.instance_id
        for meta in chosen:
            self.buckets.remove(meta.request_id)
            res = Reservation(
                meta.request_id,
                d.instance_id,
                blocks_for(self._own_prompt(meta, colocated), d.block_size),
                self._decode_blocks(meta, d.block_size, colocated),
                batch.batch_id,
                request_load(meta.prompt_len, min(meta.max_tokens, expected)),
            )
            self.ledger.reserve(res)
        return batch
