"""SchedulerCore: the scheduler model's logic without Triton (queue, placement, parallel prefill).

One decision thread asks the scheduling policy for the next batch, offering only the prefill
instances that are idle; the batch goes to that instance's dispatcher thread, which makes the
(blocking) prefill call and hands each request on, with the decode instance the policy chose.
So N prefill instances run up to N batches at once, and the policy's view of each instance is
exact: an instance is offered again only after its batch returned and its stats are current.
Triton I/O is injected: `prefill(index, items)`, `send_handoff(sender, handoff)`,
`send_error(sender, message, busy)`; `metrics` has decision/batch/placed methods.

Colocated topology (`chunk_tokens` > 0): there is no prefill call. The policy sees one
instance at a time as both its prefill and its decode side (least loaded first); a batch goes
straight to that instance as hand-offs without KV, which it prefills in chunks inside its
fused iterations. An instance is offered again once it has taken in everything sent to it and
its prompt backlog is below one iteration's budget, so the policy's queue order (buckets,
deadlines) still decides what runs next instead of the instance's FIFO.

Hybrid (with a `HybridControl`): the same, but each instance's intake is bounded by the
prompt-token budget the role controller gives it (serving/core/roles_file.py), and an
instance with budget 0 (decode-only) is offered no prompts; decodes reach it from its peers.
Every finish notice carries whether the request met its SLOs, which the controller reads;
a decode that moved takes its reservation along (`moved`).

Prefix-aware placement (with a `PrefixIndex`): the instances offered are ordered for the
oldest waiting request by cached overlap vs load (`scheduling/prefix_index.py`), from the
scheduler's own record of which prompt blocks it sent where; least loaded when the loads
differ by more than `balance_tokens`. Colocated, a request whose prefix holder has its intake
closed waits for it (up to `MAX_HOLD_S`) instead of missing elsewhere (`ColocatedPlacement`;
the simulator runs the same class, sim/prefix.py).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from bucketserve.engine.block_hash import block_hashes
from bucketserve.scheduling import ClusterView, PrefillBatch, RequestMeta
from bucketserve.scheduling.memory import capacity_message
from bucketserve.scheduling.prefix_index import (
    ColocatedPlacement,
    PrefixIndex,
    order_instances,
    probably_cached,
)
from bucketserve.serving.contract import GenerateParams
from bucketserve.serving.core.messages import KIND_CANCELLED, KIND_GENERATE, KIND_STOP, Handoff

ERROR_BACKOFF_S = 0.5  # after an unexpected error, before the loop tries again
INTAKE_TIMEOUT_S = 5.0  # colocated: a batch not taken in by then (instance restarted) is forgotten
IDLE_WAIT_S = 0.005
METRICS_INTERVAL_S = 0.5

log = logging.getLogger(__name__)


class Busy(RuntimeError):
    """The server cannot take this request now; the client should retry (HTTP 503)."""


@dataclass(slots=True)
class Waiting:
    """A request held here until its prefill batch has run."""

    sender: object
    ids: list[int]
    params: GenerateParams
    arrival_s: float  # wall clock, for latency metrics downstream
    hashes: list[int] | None = None  # its full-block hashes (prefix-aware placement)


def instance_index(instance_id: str) -> int:
    """ "prefill1" -> 1, "decode0" -> 0 (ClusterStats names instances role + index)."""
    return int(instance_id.lstrip("abcdefghijklmnopqrstuvwxyz"))


class SchedulerCore:
    """Owns the waiting table and the threads; every policy call happens under `cond`."""

    def __init__(self, sched, view: Callable[[], ClusterView | None], prefill, send_handoff,
                 send_error, num_prefill: int, metrics, chunk_tokens: int = 0,
                 prefix_index: PrefixIndex | None = None, hybrid=None) -> None:  # fmt: skip
        self.sched, self.view, self.prefill = sched, view, prefill
        self.prefix_index, self.block_size = prefix_index, 16  # block size: from the stats
        self.placement = ColocatedPlacement(prefix_index)  # colocated: which instances to offer
        self.chunk_tokens = chunk_tokens  # > 0: colocated instances, no prefill calls
        self.hybrid = hybrid  # HybridControl: per-instance budgets (hybrid topology)
        self.sent: dict[int, int] = {}  # colocated: requests sent per instance
        self.open: dict[int, tuple[PrefillBatch, float]] = {}  # batch not yet taken in
        self.send_handoff, self.send_error, self.metrics = send_handoff, send_error, metrics
        self.waiting: dict[str, Waiting] = {}
        self.by_user_id: dict[str, str] = {}
        self.fresh: list[str] = []  # keys not yet checked against the decode pools' size
        self.busy: set[str] = set()  # prefill instances with a batch in flight
        self.next_key = 0
        self.decision_s, self.next_metrics, self.next_roles_metrics = 0.0, 0.0, 0.0
        self.cond = threading.Condition()
        self.stopping = False
        self.jobs = [queue.Queue() for _ in range(num_prefill)]
        self.threads = [threading.Thread(target=self.loop, name="scheduler-loop", daemon=True)]
        self.threads += [
            threading.Thread(target=self.dispatch_loop, args=(i,), name=f"prefill-{i}", daemon=True)
            for i in range(num_prefill)
        ]  # fmt: skip

    def start(self) -> None:
        for t in self.threads:
            t.start()

    # ---- requests in --------------------------------------------------------------------
    def add(self, sender, ids: list[int], params: GenerateParams) -> None:
        """Queue a request. Admission control (a bounded queue raising Busy) belongs here."""
        with self.cond:
            key = str(self.next_key)
            self.next_key += 1
            item = Waiting(sender, ids, params, time.time())
            meta = RequestMeta(key, len(ids), params.max_tokens, time.monotonic(),
                               params.slo_class, params.ttft_slo_s, params.tpot_slo_s,
                               num_cached_tokens=self.probably_cached(item))  # fmt: skip
            try:
                self.sched.add(meta)
            except ValueError as e:
                self.send_error(sender, f"scheduler: {e}", False)
                return
            self.waiting[key] = item
            self.fresh.append(key)
            if params.request_id:
                self.by_user_id[params.request_id] = key
            self.cond.notify()

    def stop(self, sender, params: GenerateParams) -> None:
        """`stop: true` + request_id: drop it here if still queued, and tell decode to stop it."""
        with self.cond:
            key = self.by_user_id.pop(params.request_id, None)
            item = self.waiting.pop(key, None) if key and self.sched.cancel(key) else None
        if item is not None:
            self.send_handoff(item.sender, Handoff(KIND_CANCELLED, item.params))
        self.send_handoff(sender, Handoff(KIND_STOP, params, target=params.request_id))

    def finished(self, key: str, num_output_tokens: int,
                 slo_met: tuple[bool, bool] | None = None) -> None:  # fmt: skip
        """Decode reported the request done: release its decode-side reservation."""
        with self.cond:
            self.sched.on_request_finished(key, num_output_tokens)
            if self.hybrid is not None and slo_met is not None:
                self.hybrid.record(slo_met)
            self.cond.notify()

    def moved(self, key: str, decode_index: int) -> None:
        """A hybrid instance handed the request's decode to instance `decode_index`."""
        with self.cond:
            self.sched.ledger.move(key, f"decode{decode_index}")
            if self.hybrid is not None:
                self.hybrid.moved += 1

    # ---- decisions ----------------------------------------------------------------------
    def loop(self) -> None:
        while True:
            try:
                with self.cond:
                    if self.stopping:
                        return
                    if self.hybrid is not None:
                        self.control_roles()
                    picked = self.next_colocated() if self.chunk_tokens else self.next_batch()
                    if picked is None:
                        self.cond.wait(IDLE_WAIT_S)
                        continue
                    if not self.chunk_tokens:
                        self.busy.add(picked[0].prefill_id)
                if self.chunk_tokens:
                    self.send_prompts(*picked)
                else:
                    self.jobs[instance_index(picked[0].prefill_id)].put(picked)
            except Exception:  # the loop must outlive any one bad iteration
                log.exception("scheduler loop")
                time.sleep(ERROR_BACKOFF_S)

    def control_roles(self) -> None:
        """Hybrid: the role controller's look (it acts once per period)."""
        changed = self.hybrid.tick(time.monotonic())
        if changed:
            log.info("hybrid layout %d: budgets %s", self.hybrid.layout, self.hybrid.budgets)
        if changed or time.monotonic() >= self.next_roles_metrics:
            self.metrics.roles(self.hybrid.layout, changed)
            self.next_roles_metrics = time.monotonic() + METRICS_INTERVAL_S

    def next_batch(self) -> tuple[PrefillBatch, list[Waiting]] | None:
        view = self.view() if self.waiting else None
        if view is None:
            return None
        self.reject_unfittable(view)
        view.prefill = [p for p in view.prefill if p.instance_id not in self.busy]
        if not view.prefill or not self.waiting:
            return None
        preferred = self.by_affinity(view.prefill)[0]
        if len(view.prefill) > 1:  # the instance that probably caches the prefix, if it fits
            picked = self.decide(ClusterView(prefill=[preferred], decode=view.decode))
            if picked is not None:
                return picked
        return self.decide(view)

    def next_colocated(self) -> tuple[PrefillBatch, list[Waiting]] | None:
        """Offer each instance whose intake is open, least loaded first, to the policy."""
        view = self.view()
        if view is None:
            return None
        self.reject_unfittable(view)
        least_loaded = sorted(view.decode, key=lambda s: (s.prefill_backlog, s.running))
        if least_loaded:
            self.block_size = least_loaded[0].block_size
        # every round, waiting or not: an absorbed batch reports its duration when seen
        is_open = {s.instance_id: self.intake_open(s) for s in least_loaded}
        if not self.waiting:
            return None
        key, item = next(iter(self.waiting.items()))  # arrival order: the policy's likely next
        hashes = self.hashes(item) if self.prefix_index is not None else []
        prompted = [s for s in least_loaded if self.intake_budget(s)]  # hybrid: not decode-only
        offered = self.placement.offer(key, prompted, lambda s: is_open[s.instance_id],
                                       hashes, len(item.ids))  # fmt: skip
        for stats in offered:
            picked = self.decide(ClusterView(prefill=[stats], decode=[stats]))
            if picked is not None:
                return picked
        return None

    def by_affinity(self, instances: list) -> list:
        """`instances` ordered for the oldest waiting request: cached overlap vs load."""
        if instances:
            self.block_size = instances[0].block_size  # the engines' (hashes are per size)
        if self.prefix_index is None or len(instances) < 2 or not self.waiting:
            return instances
        item = next(iter(self.waiting.values()))  # arrival order: the policy's likely next
        return order_instances(self.prefix_index, instances, self.hashes(item), len(item.ids))

    def probably_cached(self, item: Waiting) -> int:
        """Prompt tokens some instance probably caches (the engine always computes the last)."""
        if self.prefix_index is None:
            return 0
        return probably_cached(self.prefix_index, self.hashes(item), len(item.ids), self.block_size)

    def hashes(self, item: Waiting) -> list[int]:
        if item.hashes is None:
            item.hashes = block_hashes(item.ids, self.block_size, cache_salt=item.params.cache_salt)
        return item.hashes

    def record(self, instance_id: str, items: list[Waiting]) -> None:
        """Where these prompts' blocks now (probably) are."""
        if self.prefix_index is None:
            return
        with self.cond:  # the decision thread reads the index (cond's lock is re-entrant)
            for item in items:
                self.prefix_index.record(instance_id, self.hashes(item))

    def intake_open(self, stats) -> bool:
        """Colocated: the instance took in what was sent and has room in its next iteration;
        the batch it absorbed reports its duration to the policy's latency model."""
        index = instance_index(stats.instance_id)
        batch, sent_s = self.open.get(index, (None, 0.0))
        in_flight = stats.num_received < self.sent.get(index, 0)
        if in_flight and time.monotonic() - sent_s < INTAKE_TIMEOUT_S:
            return False
        budget = self.intake_budget(stats)
        if stats.prefill_backlog >= (budget or self.chunk_tokens):  # not yet absorbed
            return False
        if batch is not None:
            del self.open[index]
            duration = time.monotonic() - sent_s
            self.sched.on_batch_done(batch, duration)
            self.metrics.batch(batch.size, batch.padding_ratio, duration)
        if in_flight:  # timed out: the instance restarted and lost them (their FINALs went out)
            self.sent[index] = stats.num_received
        return budget > 0  # hybrid: a decode-only instance takes no prompts

    def intake_budget(self, stats) -> int:
        """Prompt tokens an instance may have queued before it is offered more (colocated:
        one iteration's budget; hybrid: its role's budget, 0 for decode-only)."""
        if self.hybrid is None:
            return self.chunk_tokens
        return self.hybrid.budget(instance_index(stats.instance_id))

    def decide(self, view: ClusterView) -> tuple[PrefillBatch, list[Waiting]] | None:
        """Ask the policy for a batch over `view`; pops its requests from the waiting table."""
        t0 = time.perf_counter()
        batch = self.sched.next_batch(view)
        self.decision_s += time.perf_counter() - t0
        if batch is not None or time.monotonic() >= self.next_metrics:
            self.metrics.decision(self.decision_s, self.sched.snapshot())
            self.decision_s, self.next_metrics = 0.0, time.monotonic() + METRICS_INTERVAL_S
        if batch is None:
            return None
        items = [self.waiting.pop(m.request_id) for m in batch.requests]
        for item in items:
            if item.params.request_id:
                self.by_user_id.pop(item.params.request_id, None)
        return batch, items

    def reject_unfittable(self, view: ClusterView) -> None:
        """A request whose prompt + max_tokens exceeds every decode pool can never run: it
        ends now with a busy error instead of waiting forever."""
        limit = max((d.total_blocks * d.block_size for d in view.decode), default=0)
        fresh, self.fresh = self.fresh, []
        for key in fresh:
            item = self.waiting.get(key)
            if item is None or len(item.ids) + item.params.max_tokens <= limit:
                continue
            self.sched.cancel(key)
            del self.waiting[key]
            self.by_user_id.pop(item.params.request_id, None)
            message = capacity_message(len(item.ids), item.params.max_tokens, limit)
            self.send_error(item.sender, message, True)

    # ---- dispatch -----------------------------------------------------------------------
    def send_prompts(self, batch: PrefillBatch, items: list[Waiting]) -> None:
        """Colocated: the batch's prompts go to its instance as hand-offs without KV."""
        index = instance_index(batch.decode_id)
        with self.cond:
            self.sent[index] = self.sent.get(index, 0) + len(items)
            self.open[index] = (batch, time.monotonic())
        self.metrics.placed(batch.prefill_id, batch.decode_id, batch.size)
        self.record(batch.decode_id, items)
        for item, meta in zip(items, batch.requests, strict=True):
            self.send_handoff(item.sender, Handoff(
                KIND_GENERATE, item.params, prompt_ids=item.ids, decode_index=index,
                arrival_s=item.arrival_s, sched_key=meta.request_id,
                ttft_slo_s=meta.ttft_slo_s, tpot_slo_s=meta.tpot_slo_s,
            ))  # fmt: skip

    def dispatch_loop(self, index: int) -> None:
        while (job := self.jobs[index].get()) is not None:
            batch, items = job
            try:
                self.run_batch(index, batch, items)
            except Exception:
                log.exception("prefill dispatch")
            finally:
                with self.cond:
                    self.busy.discard(batch.prefill_id)
                    self.cond.notify()

    def run_batch(self, index: int, batch: PrefillBatch, items: list[Waiting]) -> None:
        start = time.perf_counter()
        try:
            reply = self.prefill(index, items)
        except Exception as e:
            with self.cond:
                for meta in batch.requests:
                    self.sched.on_request_finished(meta.request_id, 0)
            for item in items:
                self.send_error(item.sender, str(e), False)
            return
        duration = time.perf_counter() - start
        with self.cond:
            self.sched.on_batch_done(batch, duration)
        self.metrics.batch(len(items), batch.padding_ratio, duration)
        self.metrics.placed(batch.prefill_id, batch.decode_id, batch.size)
        self.record(batch.prefill_id, items)
        done, decode_index = time.time(), instance_index(batch.decode_id)
        for item, res, meta in zip(items, reply.results, batch.requests, strict=True):
            self.send_handoff(item.sender, Handoff(
                KIND_GENERATE, item.params, prompt_ids=item.ids, first_token=res.first_token,
                prefill_index=reply.index, decode_index=decode_index, handoff_id=res.handoff_id,
                block_ids=res.block_ids, arrival_s=item.arrival_s, prefill_done_s=done,
                sched_key=meta.request_id, first_logprob=res.logprob,
                num_cached_tokens=res.num_cached_tokens,
            ))  # fmt: skip

    def close(self) -> list[Waiting]:
        """Stop the threads; returns the requests still queued (the caller answers them)."""
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
            pending = list(self.waiting.values())
            self.waiting.clear()
        for jobs in self.jobs:
            jobs.put(None)
        for t in self.threads:
            t.join()
        return pending
