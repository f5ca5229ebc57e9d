"""Prometheus metrics on Triton's metrics port through the Python backend's metric API."""

from __future__ import annotations

import threading

import triton_python_backend_utils as pb_utils

LATENCY_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0]
TPOT_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5]
BATCH_BUCKETS = [1, 2, 4, 8, 16, 32, 64, 128, 256]
MAX_BUCKETS_EXPORTED = 16


_FAMILIES: dict[str, object] = {}  # a MetricFamily must outlive its Metrics: keep them all

# One metric call at a time per stub. The Triton 2.51 stub serializes a Metric's request into
# buffers it keeps on the Metric object and releases the GIL while the server reads them, so two
# threads updating the same metric overwrite (and free) the buffer the server is reading:
# tritonserver died with SIGSEGV in PbString::LoadFromSharedMemory under
# Metric::LoadFromSharedMemory / ProcessMetricRequest, and with std::bad_alloc on the same path
# (core dump of a 2-prefill/2-decode test server).
# docs/platform-notes.md#p25-concurrent-metric-updates
_LOCK = threading.Lock()


class LockedMetric:
    """A pb_utils Metric whose calls go through the stub-wide metric lock."""

    __slots__ = ("metric",)

    def __init__(self, metric) -> None:
        self.metric = metric

    def set(self, value: float) -> None:
        with _LOCK:
            self.metric.set(value)

    def increment(self, value: float) -> None:
        with _LOCK:
            self.metric.increment(value)

    def observe(self, value: float) -> None:
        with _LOCK:
            self.metric.observe(value)


def family(name: str, description: str, kind):
    full = f"bucketserve_{name}"
    with _LOCK:
        if full not in _FAMILIES:
            _FAMILIES[full] = pb_utils.MetricFamily(name=full, description=description, kind=kind)
        return _FAMILIES[full]


def metric(name: str, description: str, kind, **kwargs) -> LockedMetric:
    fam = family(name, description, kind)
    with _LOCK:
        return LockedMetric(fam.Metric(**kwargs))


def histogram(name: str, description: str, labels: dict, buckets: list[float]):
    return metric(
        name, description, pb_utils.MetricFamily.HISTOGRAM, labels=labels, buckets=buckets
    )


def gauge(name: str, description: str, labels: dict):
    return metric(name, description, pb_utils.MetricFamily.GAUGE, labels=labels)


def counter(name: str, description: str, labels: dict):
    return metric(name, description, pb_utils.MetricFamily.COUNTER, labels=labels)


def declare(obj, labels: dict, specs) -> None:
    """Set obj.<attr> for each (attr, maker, name, description, *buckets) of `specs`."""
    for attr, make, name, description, *buckets in specs:
        setattr(obj, attr, make(name, description, labels, *buckets))


class KvMetrics:
    """Free and total KV blocks of one engine instance; free counts the blocks that only hold
    an evictable cached prefix (allocatable), which `kv_blocks_cached` shows apart."""

    def __init__(self, instance: str) -> None:
        declare(self, {"instance": instance}, (
            ("free", gauge, "kv_blocks_free", "Free KV cache blocks of an engine instance"),
            ("total", gauge, "kv_blocks_total", "KV cache blocks of an engine instance"),
            ("cached", gauge, "kv_blocks_cached",
             "Free KV blocks still holding a cached prefix (evictable; counted in free)"),
        ))  # fmt: skip

    def set(self, free: int, total: int, cached: int = 0) -> None:
        self.free.set(free)
        self.total.set(total)
        self.cached.set(cached)


class PrefixCacheMetrics:
    """One engine instance's prefix cache: prompt tokens looked up and found, blocks evicted
    (counters, so hit rate = rate(hits) / rate(queries) over any window)."""

    def __init__(self, instance: str) -> None:
        declare(self, {"instance": instance}, (
            ("queries", counter, "prefix_cache_queries_total",
             "Prompt tokens looked up in the prefix cache"),
            ("hits", counter, "prefix_cache_hits_total",
             "Prompt tokens found in the prefix cache (not recomputed)"),
            ("evictions", counter, "prefix_cache_evictions_total",
             "Cached KV blocks evicted for reuse"),
        ))  # fmt: skip
        self._seen = (0, 0, 0)

    def set(self, blocks) -> None:
        """Catch the counters up with the BlockManager's totals (read from another thread)."""
        now = (blocks.num_queried_tokens, blocks.num_hit_tokens, blocks.num_evictions)
        for c, new, old in zip((self.queries, self.hits, self.evictions), now, self._seen,
                               strict=True):  # fmt: skip
            if new > old:
                c.increment(new - old)
        self._seen = now


class RequestMetrics:
    """Per-request latencies and token counts, observed when a request finishes (decode side)."""

    def __init__(self, instance: str) -> None:
        labels = {"instance": instance}
        declare(self, labels, (
            ("ttft", histogram, "time_to_first_token_seconds", "Time to first token",
             LATENCY_BUCKETS),
            ("tpot", histogram, "time_per_output_token_seconds",
             "Mean time per output token after the first", TPOT_BUCKETS),
            ("e2e", histogram, "e2e_request_latency_seconds", "End-to-end request latency",
             LATENCY_BUCKETS),
            ("handoff", histogram, "handoff_latency_seconds",
             "End of prefill to KV pulled by decode", LATENCY_BUCKETS),
            ("prompt_tokens", counter, "prompt_tokens_total", "Prompt tokens processed"),
            ("generation_tokens", counter, "generation_tokens_total", "Tokens generated"),
        ))  # fmt: skip
        self.kind = family(
            "requests_total", "Finished requests by finish reason", pb_utils.MetricFamily.COUNTER
        )
        self.by_reason: dict[str, object] = {}
        self.labels = labels

    def finished(
        self, reason: str, ttft: float, tpot: float | None, e2e: float, n_in: int, n_out: int
    ) -> None:
        self.ttft.observe(ttft)
        if tpot is not None:
            self.tpot.observe(tpot)
        self.e2e.observe(e2e)
        self.prompt_tokens.increment(n_in)
        self.generation_tokens.increment(n_out)
        if reason not in self.by_reason:
            self.by_reason[reason] = self.kind.Metric(
                labels={**self.labels, "finish_reason": reason}
            )
        self.by_reason[reason].increment(1)


class SchedulerMetrics:
    """Queue length per bucket, bucket boundaries, batch sizes, padding, decision cost."""

    def __init__(self, policy: str) -> None:
        labels = {"policy": policy}
        declare(self, labels, (
            ("batch_size", histogram, "prefill_batch_size", "Requests per prefill batch",
             BATCH_BUCKETS),
            ("batch_time", histogram, "prefill_batch_seconds",
             "Prefill batch latency seen by the scheduler", LATENCY_BUCKETS),
            ("padding", gauge, "padding_ratio", "Padding ratio of the last prefill batch"),
            ("num_buckets", gauge, "bucket_count", "Number of buckets"),
            ("waiting", gauge, "queue_length_total", "Requests waiting for prefill"),
            ("decision_s", counter, "scheduler_decision_seconds_total",
             "Wall time spent deciding batches"),
            ("decisions", counter, "scheduler_decisions_total", "Batch decisions taken"),
        ))  # fmt: skip
        kind = pb_utils.MetricFamily.GAUGE
        per_bucket = (family("queue_length", "Requests waiting per bucket", kind),
                      family("bucket_upper_bound", "Upper bound (exclusive, tokens) of each bucket",
                             kind))  # fmt: skip
        self.queue, self.bounds = (
            [f.Metric(labels={**labels, "bucket": str(i)}) for i in range(MAX_BUCKETS_EXPORTED)]
            for f in per_bucket
        )
        self.last_buckets = -1
        self.seen_decisions = 0

    def decision(self, seconds: float, snapshot) -> None:
        """Decision time accumulated since the last call, and the monitor's queue picture."""
        self.decision_s.increment(seconds)
        self.decisions.increment(snapshot.decisions - self.seen_decisions)
        self.seen_decisions = snapshot.decisions
        bounds, queues = snapshot.bucket_boundaries, snapshot.queue_per_bucket
        self.waiting.set(sum(queues))
        if len(bounds) != self.last_buckets or queues:
            self.num_buckets.set(len(bounds))
            for i in range(MAX_BUCKETS_EXPORTED):
                self.queue[i].set(queues[i] if i < len(queues) else 0)
                self.bounds[i].set(bounds[i][1] if i < len(bounds) else 0)
            self.last_buckets = len(bounds)

    def batch(self, size: int, padding_ratio: float, seconds: float) -> None:
        self.batch_size.observe(size)
        self.batch_time.observe(seconds)
        self.padding.set(padding_ratio)


def instance_finished(instance: str):
    """Requests an engine instance itself reports done; equals what the scheduler placed there
    (`placed_requests_total`) once the server is idle."""
    return counter(
        "instance_requests_total",
        "Requests an engine instance finished (any outcome)",
        {"instance": instance},
    )


class DecodeMetrics:
    """One decode instance's own account: requests finished there, preemptions, recompute."""

    def __init__(self, instance: str) -> None:
        self.finished = instance_finished(instance)
        declare(self, {"instance": instance}, (
            ("preemptions", counter, "preemptions_total", "Decode requests preempted for KV space"),
            ("recomputed", counter, "recomputed_tokens_total",
             "Tokens whose KV decode rebuilt after preemption"),
            ("iterations", counter, "iterations_total", "Engine iterations (forward passes)"),
            ("mixed", counter, "mixed_iterations_total",
             "Iterations that carried both decode tokens and prefill-chunk tokens"),
            ("prefill_tokens", counter, "iteration_prefill_tokens_total",
             "Prompt (chunk) tokens run by iterations"),
            ("decode_tokens", counter, "iteration_decode_tokens_total",
             "Decode tokens run by iterations"),
        ))  # fmt: skip
        self._seen = (0,) * 6

    def set(self, worker) -> None:
        """Catch the counters up with the decode worker's totals (read from another thread)."""
        st = worker.runner.stats
        now = (worker.num_preemptions, worker.num_recomputed_tokens,
               st.num_prefill_steps + st.num_decode_steps, st.num_mixed_steps,
               st.num_prefill_tokens, st.num_decode_tokens)  # fmt: skip
        counters = (self.preemptions, self.recomputed, self.iterations, self.mixed,
                    self.prefill_tokens, self.decode_tokens)  # fmt: skip
        for c, new, old in zip(counters, now, self._seen, strict=True):
            c.increment(new - old)
        self._seen = now


class MigrationMetrics:
    """A hybrid instance: the prompt-token budget its role gives it (0: decode-only) and the
    decodes it handed to peers or took from them."""

    def __init__(self, instance: str) -> None:
        declare(self, {"instance": instance}, (
            ("budget", gauge, "instance_token_budget",
             "Hybrid: prompt tokens per iteration this instance's role allows (0: decode-only)"),
            ("out", counter, "migrations_out_total",
             "Hybrid: running decodes this instance handed to a decode-only peer"),
            ("into", counter, "migrations_in_total",
             "Hybrid: running decodes this instance took over from a peer"),
        ))  # fmt: skip
        self._seen = (0, 0)

    def set(self, migration, budget: int | None) -> None:
        if budget is not None:
            self.budget.set(budget)
        now = (migration.num_out, migration.num_in)
        for c, new, old in zip((self.out, self.into), now, self._seen, strict=True):
            if new > old:
                c.increment(new - old)
        self._seen = now


class HybridMetrics:
    """The hybrid role controller: its layout (0: all mixed, k: k prefill-heavy instances)
    and how often it changed."""

    def __init__(self) -> None:
        declare(self, {}, (
            ("layout", gauge, "hybrid_layout",
             "Hybrid: prefill-heavy instances of the current layout (0: every instance mixed)"),
            ("changes", counter, "role_changes_total", "Hybrid: layout changes the controller made"),
        ))  # fmt: skip

    def set(self, layout: int, changed: bool) -> None:
        self.layout.set(layout)
        if changed:
            self.changes.increment(1)


class PlacementMetrics:
    """The scheduler's placement decisions: requests sent to each prefill / decode instance."""

    def __init__(self, instances: list[str]) -> None:
        self.placed = {
            i: counter(
                "placed_requests_total",
                "Requests the scheduler placed on an engine instance",
                {"instance": i},
            )
            for i in instances
        }

    def batch(self, prefill_id: str, decode_id: str, size: int) -> None:
        for instance in dict.fromkeys((prefill_id, decode_id)):  # colocated: one instance
            self.placed[instance].increment(size)
