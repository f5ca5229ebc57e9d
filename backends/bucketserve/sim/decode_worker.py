"""A continuous-batching decode instance: paged KV blocks, hand-off queue, recompute preemption.

Also serves as the aggregated (vLLM-like) instance: `start_prefill` runs a prefill iteration
on the same device, pausing decode, and its sequences join the running batch afterwards.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from bucketserve.scheduling import InstanceStats
from bucketserve.scheduling.memory import DecodeMemory, blocks_for
from bucketserve.sim.workload import SimRequest


@dataclass(slots=True)
class Seq:
    """One request on a decode instance."""

    req: SimRequest
    context: int  # tokens whose KV is stored (prompt + generated - 1)
    generated: int  # tokens produced so far (the prefill produced the first)
    source: object | None = None  # PrefillWorker still holding its prompt blocks
    blocks: int = 0
    ready_s: float = 0.0
    recompute: bool = False


class DecodeWorker:
    """Runs one decode step at a time over every admitted, ready sequence."""

    def __init__(
        self,
        instance_id: str,
        role: str,
        total_blocks: int,
        block_size: int,
        max_num_seqs: int,
        latency,
        kv_bytes: int,
    ):
        self.instance_id, self.role = instance_id, role
        self.total_blocks = self.free_blocks = total_blocks
        self.memory = DecodeMemory(total_blocks, block_size)  # the server's decode memory model
        self.block_size, self.max_num_seqs = block_size, max_num_seqs
        self.latency, self.kv_bytes = latency, kv_bytes
        self.running: list[Seq] = []
        self.queue: deque[Seq] = deque()
        self.in_transit = 0
        self.busy = False
        self.step_ema = 0.0
        self.busy_s = 0.0
        self.preemptions = 0
        self._step: list[Seq] = []
        self._pending_join: list[Seq] = []

    def stats(self) -> InstanceStats:
        waiting = sum(1 for s in self.queue if s.recompute)
        return InstanceStats(
            self.instance_id, self.role, self.total_blocks, self.free_blocks, self.block_size,
            len(self.running) + waiting, self.step_ema, self.kv_bytes,
            pending_handoffs=self.in_transit + len(self.queue) - waiting,
        )  # fmt: skip

    def enqueue(self, seq: Seq) -> None:
        self.queue.append(seq)

    def admit(self, now: float) -> list[Seq]:
        """Move queued sequences in (FIFO) while blocks and seats last; returns the admitted."""
        admitted = []
        growth = self.memory.growth([(s.blocks, s.context + 1) for s in self.running])
        while self.queue and len(self.running) < self.max_num_seqs:
            seq = self.queue[0]
            free = self.free_blocks - growth
            if not self.memory.can_admit(seq.context, free, len(self.running)):
                break
            need = self.memory.admit_blocks(seq.context)
            self.queue.popleft()
            self.free_blocks -= need
            seq.blocks = need
            if seq.source is not None:
                seq.ready_s = now + self.latency.handoff_time(seq.context)
            self.running.append(seq)
            admitted.append(seq)
        return admitted

    def _preempt_tail(self) -> None:
        victim = self.running.pop()
        self.free_blocks += victim.blocks
        victim.blocks = 0
        victim.recompute = True
        victim.req.preemptions += 1
        self.preemptions += 1
        self.queue.appendleft(victim)

    def _reserve_slots(self, now: float) -> list[Seq]:
        """Give every ready sequence room for its next token, preempting from the tail."""
        plan = [(s.blocks, s.context + 1 if s.ready_s <= now else 0) for s in self.running]
        for _ in range(self.memory.preemptions(plan, self.free_blocks)):
            self._preempt_tail()
        for seq in self.running:
            if seq.ready_s <= now and seq.context + 1 > seq.blocks * self.block_size:
                grow = blocks_for(seq.context + 1, self.block_size) - seq.blocks
                self.free_blocks -= grow
                seq.blocks += grow
        return [s for s in self.running if s.ready_s <= now]

    def start_step(self, now: float) -> float | None:
        """Duration of the next decode step, or None when no admitted sequence is ready."""
        ready = self._reserve_slots(now)
        if not ready:
            return None
        recompute = [s.context for s in ready if s.recompute]
        for s in ready:
            s.recompute = False
        context = sum(s.context for s in ready)
        t = self.latency.decode_time(len(ready), context)
        if recompute:
            t += self.latency.prefill_time(recompute)
        self._step = ready
        self.busy = True
        self.busy_s += t
        self.step_ema = t if self.step_ema == 0 else 0.9 * self.step_ema + 0.1 * t
        return t

    def finish_step(self, now: float) -> list[Seq]:
        """Apply one token to every stepped sequence; return (and free) the finished ones."""
        self.busy = False
        done = []
        for seq in self._step:
            seq.context += 1
            seq.generated += 1
            if seq.generated >= seq.req.output_len:
                seq.req.finish_s = now
                done.append(seq)
        if done:
            gone = {id(s) for s in done}
            self.running = [s for s in self.running if id(s) not in gone]
            self.free_blocks += sum(s.blocks for s in done)
        self._step = []
        return done

    def next_ready_s(self) -> float | None:
        return min((s.ready_s for s in self.running), default=None)

    def start_prefill(self, batch_reqs: list[SimRequest], padded: bool, now: float) -> float:
        """Aggregated mode: allocate prompt blocks and run a prefill iteration here."""
        lengths = [r.meta.prompt_len for r in batch_reqs]
        self.busy = True
        t = self.latency.prefill_time(lengths, padded)
        self.busy_s += t
        for r in batch_reqs:
            seq = Seq(r, r.meta.prompt_len, 1)
            seq.blocks = blocks_for(seq.context, self.block_size)
            self.free_blocks -= seq.blocks
            self._pending_join.append(seq)
        return t

    def finish_prefill(self, now: float) -> list[Seq]:
        """Aggregated mode: first tokens out; the sequences join decode. Returns those done."""
        self.busy = False
        joined, self._pending_join = self._pending_join, []
        done = []
        for seq in joined:
            seq.req.first_token_s = now
            if seq.generated >= seq.req.output_len:
                seq.req.finish_s = now
                self.free_blocks += seq.blocks
                done.append(seq)
            else:
                self.running.append(seq)
        return done
