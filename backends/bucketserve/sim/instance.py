"""One simulated engine instance: the engine's own `Scheduler` over a real `BlockManager`.

The simulator's instances hold real `Sequence`s (token ids are zeros, sampling is greedy and
ignores EOS, so a request stops after exactly its output length) and let the engine Scheduler
decide every iteration: which decodes run, which prompt chunks fill the token budget, who is
admitted, who is preempted and recomputed, and who stops. What the simulator adds is time:
the deployment charges each `ScheduledStep` from its latency model, and a KV hand-off from a
prefill instance becomes usable `handoff_time` after admission (until then the sequence holds
its blocks but sits out of the steps).
"""

from __future__ import annotations

from bucketserve.engine.block_manager import BlockManager
from bucketserve.engine.sampling_params import SamplingParams
from bucketserve.engine.scheduler import BatchLimits, ScheduledStep, Scheduler
from bucketserve.engine.sequence import Sequence
from bucketserve.scheduling import InstanceStats
from bucketserve.scheduling.memory import blocks_for
from bucketserve.sim.workload import SimRequest

MAX_MODEL_LEN = 1 << 30  # the workload bounds lengths; the stop rule is max_tokens
NO_CHUNKS = 1 << 30  # token budget of an instance that prefills whole prompts


def make_sequence(req: SimRequest, first_token: bool, num_output: int = 1) -> Sequence:
    """The request as an engine Sequence; `first_token`: its prompt was prefilled elsewhere
    (a hand-off: its KV is computed and its first `num_output` tokens are out)."""
    params = SamplingParams(temperature=0.0, max_tokens=max(1, req.output_len), ignore_eos=True)
    ids = req.prompt_ids if req.prompt_ids is not None else [0] * req.meta.prompt_len
    seq = Sequence(list(ids), params, seq_id=req.meta.request_id)
    if first_token:
        for _ in range(num_output):
            seq.append_token(0)
        seq.num_computed_tokens = seq.num_tokens - 1
    return seq


class SimInstance:
    """The Scheduler, its blocks, and the simulator's bookkeeping around them."""

    def __init__(self, instance_id: str, role: str, cluster, token_budget: int = NO_CHUNKS,
                 handoff_time=None) -> None:  # fmt: skip
        self.instance_id, self.role = instance_id, role
        self.kv_bytes = cluster.kv_bytes_per_token
        self.blocks = BlockManager(cluster.kv_blocks, cluster.block_size, cluster.prefix_caching)
        limits = BatchLimits(cluster.max_num_seqs, token_budget)
        self.scheduler = Scheduler(self.blocks, limits, (), MAX_MODEL_LEN)
        self.handoff_time = handoff_time  # None: no hand-offs arrive here
        self.reqs: dict[str, SimRequest] = {}
        self.sources: dict[str, object] = {}  # request id -> PrefillWorker holding its KV
        self.ready_s: dict[str, float] = {}  # request id -> when its handed-off KV is here
        self.in_transit = 0  # batches placed here whose prefill has not finished
        self.busy = False
        self.busy_s = self.step_ema = 0.0

    # ---- views the tests and the policies read -------------------------------------------
    @property
    def total_blocks(self) -> int:
        return self.blocks.num_total_blocks

    @property
    def free_blocks(self) -> int:
        return self.blocks.num_free_blocks

    @property
    def running(self) -> list[Sequence]:
        return self.scheduler.running

    @property
    def queue(self):
        return self.scheduler.waiting

    @property
    def preemptions(self) -> int:
        return self.scheduler.num_preemptions

    def stats(self) -> InstanceStats:
        """What the cluster scheduler sees. Sequences waiting here that are new (a prompt, or a
        prefilled one) are promised blocks: on a P/D decode instance they are
        `pending_handoffs` (the scheduler's ledger knows their prompt blocks); on a colocated
        one their blocks count as taken. Preempted ones count as running."""
        bs, waiting = self.blocks.block_size, self.scheduler.waiting
        new = [s for s in waiting if s.num_computed_tokens or not s.num_completion_tokens]
        free, pending = self.free_blocks, self.in_transit + len(new)
        if self.role != "decode":  # colocated: a new prompt's blocks are as good as taken
            free = max(0, free - sum(blocks_for(s.num_tokens + 1, bs) for s in new))
            pending = 0
        return InstanceStats(
            self.instance_id, self.role, self.total_blocks, free, bs,
            len(self.running) + len(waiting) - len(new), self.step_ema, self.kv_bytes,
            pending_handoffs=pending, prefill_backlog=pending_prompt_tokens(self),
        )  # fmt: skip

    # ---- requests in -----------------------------------------------------------------------
    def add_prompt(self, req: SimRequest) -> None:
        """A prompt to prefill here, in chunks of the token budget."""
        self._add(req, make_sequence(req, first_token=False))

    def add_prefilled(self, req: SimRequest, source=None, num_output: int = 1) -> None:
        """A prompt prefilled elsewhere: on `source` (a prefill instance, or a hybrid instance
        its decode leaves after `num_output` tokens; its KV moves here when the Scheduler
        admits it) or, with no source, by a prefill stream on this GPU."""
        if source is not None:
            self.sources[req.meta.request_id] = source
        self._add(req, make_sequence(req, first_token=True, num_output=num_output))

    def _add(self, req: SimRequest, seq: Sequence) -> None:
        self.reqs[req.meta.request_id] = req
        self.scheduler.add(seq)

    # ---- one iteration -----------------------------------------------------------------------
    def schedule(self, now: float) -> ScheduledStep:
        """The Scheduler's next step, less the hand-offs whose KV is still on the way."""
        step = self.scheduler.schedule()
        for seq in step.preempted:
            self.reqs[seq.seq_id].preemptions += 1
            self.ready_s.pop(seq.seq_id, None)  # recomputed here: no KV to wait for
        for seq in step.admitted:
            self.reqs[seq.seq_id].extra.setdefault("cached_tokens", seq.num_cached_tokens)
            source = self.sources.pop(seq.seq_id, None)
            if source is not None:  # the pull starts now; the prefill side frees its blocks
                source.release(seq.num_prompt_tokens)
                self.ready_s[seq.seq_id] = now + self.handoff_time(seq.num_prompt_tokens)
        for seq in list(step.decodes):
            ready = self.ready_s.get(seq.seq_id)
            if ready is not None and ready > now:
                step.drop(seq)
            elif ready is not None:
                del self.ready_s[seq.seq_id]
        return step

    def start(self, seconds: float) -> None:
        """A step of `seconds` begins."""
        self.busy = True
        self.busy_s += seconds
        self.step_ema = seconds if self.step_ema == 0 else 0.9 * self.step_ema + 0.1 * seconds

    def finish(self, step: ScheduledStep, now: float) -> list[SimRequest]:
        """The step ran: every sampled sequence's token is out at `now`; returns the
        requests that finished (their blocks are back in the pool)."""
        self.busy = False
        results = self.scheduler.postprocess(step, [0] * len(step.sampled))
        done = []
        for res in results:
            req = self.reqs[res.seq.seq_id]
            req.record_token(now)
            if res.finish_reason is not None:
                req.finish_s = now
                del self.reqs[res.seq.seq_id]
                self.ready_s.pop(res.seq.seq_id, None)
                done.append(req)
        return done

    def next_ready_s(self) -> float | None:
        """When the next handed-off KV lands (None: nothing in flight)."""
        return min(self.ready_s.values(), default=None)


def pending_prompt_tokens(inst: SimInstance) -> int:
    """Prompt (or recompute) tokens queued or mid-prefill on `inst`, less cached prefixes."""
    return inst.scheduler.prompt_backlog()


def step_context(step: ScheduledStep) -> int:
    """KV tokens the step's decodes read (each reads its stored tokens)."""
    return sum(s.num_computed_tokens for s in step.decodes)


def chunk_list(step: ScheduledStep) -> list[tuple[int, int]]:
    """The step's prompt chunks as (tokens, prefix) pairs (latency.hybrid_time's form)."""
    return [(c.num_tokens, c.start) for c in step.chunks]


def unfused_time(latency, step: ScheduledStep) -> float:
    """A step charged as a decode step plus a separate prefill of its chunks (whole prompts
    or recomputes, which start at token 0)."""
    n = len(step.decodes)
    t = latency.decode_time(n, step_context(step)) if n else 0.0
    if step.chunks:
        t += latency.prefill_time([c.num_tokens for c in step.chunks])
    return t
