"""Discrete-event simulator driving the real scheduler objects against a latency model.

The scheduler is made by `make_scheduler` with the simulator's clock injected; every decision
it takes is the one the server would take given the same stats. Three deployments:
"pd" (prefill instances hand KV to continuous-batching decode instances), "aggregated"
(vLLM-like: prefill iterations pause decode on the same instance), "static" (HF/UELLM-like).
"""

from __future__ import annotations

import heapq
import itertools
from time import perf_counter

from bucketserve.engine.scheduler import ScheduledStep
from bucketserve.scheduling import ClusterView, PrefillBatch, SchedulerConfig, make_scheduler
from bucketserve.sim.chunked import AggregatedEngine, ChunkedEngine
from bucketserve.sim.cluster import ClusterSpec
from bucketserve.sim.colocated import BulletEngine
from bucketserve.sim.hybrid import HybridEngine
from bucketserve.sim.instance import SimInstance, unfused_time
from bucketserve.sim.outcome import SimOutcome
from bucketserve.sim.prefix import Router
from bucketserve.sim.scls import SclsEngine
from bucketserve.sim.workers import PrefillWorker, StaticWorker
from bucketserve.sim.workload import SimRequest

MAX_EVENTS = 20_000_000
ENGINES = {"aggregated": AggregatedEngine, "bullet": BulletEngine, "chunked": ChunkedEngine,
           "hybrid": HybridEngine, "scls": SclsEngine}  # fmt: skip


class Simulator:
    """One run of one policy over one request list."""

    def __init__(
        self,
        policy: str,
        requests: list[SimRequest],
        cluster: ClusterSpec,
        latency,
        sched_config: SchedulerConfig | None = None,
        max_model_len: int = 4096,
    ):
        self.now = 0.0
        self.cluster, self.latency = cluster, latency
        self.mode = cluster.mode_for(policy)
        cfg = sched_config or cluster.scheduler_config(max_model_len, policy=policy)
        self.sched = make_scheduler(policy, cfg, lambda: self.now)
        self.requests = sorted(requests, key=lambda r: r.meta.arrival_s)
        self.by_id = {r.meta.request_id: r for r in self.requests}
        self.out = SimOutcome(policy, self.mode, self.requests, num_gpus=cluster.num_gpus(policy))
        self._heap: list = []
        self._tie = itertools.count()
        self._build_workers()
        self.router = None  # chunked with placement != "pull": the server's placement
        if cluster.placement != "pull":
            self.router = Router(self, cluster.placement == "prefix_aware", cluster.balance_tokens)
        self.engine = ENGINES[self.mode](self) if self.mode in ENGINES else None

    def _build_workers(self) -> None:
        c, lat = self.cluster, self.latency
        args = (c.kv_blocks, c.block_size)
        pd, static = self.mode == "pd", self.mode == "static"
        self.prefill = [
            PrefillWorker(f"prefill{i}", *args, lat, c.kv_bytes_per_token, c.padded_prefill)
            for i in range(c.num_prefill if pd else 0)
        ]
        self.decode = [
            SimInstance(f"decode{i}", "decode", c, handoff_time=lat.handoff_time)
            for i in range(c.num_decode if pd else 0)
        ]
        self.static = [
            StaticWorker(f"gpu{i}", *args, lat, c.kv_bytes_per_token)
            for i in range(c.num_aggregated if static else 0)
        ]
        self._workers = {w.instance_id: w for w in (*self.prefill, *self.decode, *self.static)}

    # ---- event loop ---------------------------------------------------------------------
    def push(self, t: float, fn, *args) -> None:
        heapq.heappush(self._heap, (t, next(self._tie), fn, args))

    def run(self) -> SimOutcome:
        for r in self.requests:
            self.push(r.meta.arrival_s, self._arrive, r)
        events = 0
        while self._heap:
            t, _, fn, args = heapq.heappop(self._heap)
            self.now = t
            fn(*args)
            events += 1
            if events > MAX_EVENTS:
                raise RuntimeError(f"simulation exceeded {MAX_EVENTS} events")
        self.out.prefill_busy_s = sum(w.busy_s for w in self.prefill)
        self.out.decode_busy_s = sum(w.busy_s for w in (*self.decode, *self.static))
        self.out.preemptions = sum(w.preemptions for w in self.decode)
        if self.engine is not None:
            self.out.decode_busy_s = self.engine.busy_s()
            self.out.preemptions = sum(w.preemptions for w in self.engine.workers)
        self.out.snapshot = self.sched.snapshot().to_dict()
        return self.out

    def _decide(self, view: ClusterView) -> PrefillBatch | None:
        t0 = perf_counter()
        batch = self.sched.next_batch(view)
        dt = perf_counter() - t0
        self.out.decision_s.append(dt)
        num_buckets = len(self.sched.buckets.buckets)
        self.out.decision_buckets.append(num_buckets)
        self.out.max_buckets = max(self.out.max_buckets, num_buckets)
        if batch is not None:
            self.out.batch_decision_s.append(dt)
            self.out.batches.append(batch)
            for meta in batch.requests:
                self.by_id[meta.request_id].scheduled_s = self.now
        return batch

    def _arrive(self, req: SimRequest) -> None:
        if self.router is not None:
            self.router.arrive(req)
        self.sched.add(req.meta)
        if self.engine is not None:
            self.engine.on_arrival()
        elif self.mode == "pd":
            self._dispatch()
        else:
            for w in self.static:
                self._static_try(w)

    def _finished(self, req: SimRequest) -> None:
        self.sched.on_request_finished(req.meta.request_id, req.output_len)

    # ---- disaggregated P/D -------------------------------------------------------------
    def _dispatch(self) -> None:
        idle = [p for p in self.prefill if not p.busy]
        while idle and self.sched.num_waiting:
            view = ClusterView([p.stats() for p in idle], [d.stats() for d in self.decode])
            batch = self._decide(view)
            if batch is None:
                return
            worker = self._workers[batch.prefill_id]
            idle.remove(worker)
            self._workers[batch.decode_id].in_transit += batch.size
            t = worker.start(batch)
            self.push(self.now + t, self._prefill_done, worker, batch, t)

    def _prefill_done(self, worker: PrefillWorker, batch: PrefillBatch, seconds: float) -> None:
        worker.finish(batch)
        self.sched.on_batch_done(batch, seconds)
        decode = self._workers[batch.decode_id]
        for meta in batch.requests:
            req = self.by_id[meta.request_id]
            req.record_token(self.now)
            decode.in_transit -= 1
            if req.output_len <= 1:
                req.finish_s = self.now
                worker.release(meta.prompt_len)
                self._finished(req)
            else:
                decode.add_prefilled(req, source=worker)
        self._kick(decode)
        self._dispatch()

    def _kick(self, decode: SimInstance) -> bool:
        """Schedule the next step if idle (the Scheduler admits hand-offs; their KV pull
        starts then); True if anything was admitted."""
        if decode.busy:
            return False
        step = decode.schedule(self.now)
        if not step.is_empty:
            t = unfused_time(self.latency, step)
            decode.start(t)
            self.push(self.now + t, self._step_done, decode, step)
        elif (ready := decode.next_ready_s()) is not None:
            self.push(ready, self._kick, decode)
        return bool(step.admitted)

    def _step_done(self, decode: SimInstance, step: ScheduledStep) -> None:
        done = decode.finish(step, self.now)
        for req in done:
            self._finished(req)
        if self._kick(decode) or done:  # memory moved: the scheduler may admit more now
            self._dispatch()

    # ---- static batches (HF / UELLM-like) ----------------------------------------------
    def _static_try(self, w: StaticWorker) -> None:
        if w.busy or not self.sched.num_waiting:
            return
        batch = self._decide(ClusterView([w.stats()], [w.stats()]))
        if batch is None:
            return
        prefill_s, total_s = w.run([self.by_id[m.request_id] for m in batch.requests], self.now)
        self.push(self.now + prefill_s, self.sched.on_batch_done, batch, prefill_s)
        self.push(self.now + total_s, self._static_done, w)

    def _static_done(self, w: StaticWorker) -> None:
        for req in w.finish():
            self._finished(req)
        self._static_try(w)
