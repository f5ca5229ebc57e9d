"""The decode scheduler: which sequences run in the next forward pass (pure Python, no torch).

One iteration carries the newest token of every running sequence plus prompt chunks that fill
the rest of a token budget (Sarathi-Serve's stall-free batching; vLLM's chunked prefill); a
budget of 1 prompt token per decode is "decode first", a budget as large as the longest
prompt is "prefill whole prompts". Memory follows `scheduling.memory.DecodeMemory`: a
sequence is admitted with the blocks of all its tokens, grows one block at a time as it
decodes, and when the batch cannot grow the newest sequences are preempted and recomputed
later. The shape is nano-vllm's `schedule()` / `postprocess()`; `LLMEngine`, the server's
decode worker and the simulator all drive this one class.

Prefix caching (when the BlockManager has it on): a sequence admitted without KV starts its
table with the cached blocks of its longest cached prefix and prefills only the rest; the full
blocks each step computes are registered in `postprocess`. Cached blocks in use need no free
block and evictable ones count as free, so the cache never refuses an admission.
"""

from __future__ import annotations

import itertools
from bisect import insort
from collections import deque
from dataclasses import dataclass, field, replace

from bucketserve.engine.block_manager import BlockManager
from bucketserve.engine.sequence import Chunk, Sequence, SequenceStatus, check_stop, finish
from bucketserve.scheduling.memory import DecodeMemory, blocks_for


@dataclass(slots=True)
class BatchLimits:
    """How big one iteration may be."""

    max_num_seqs: int = 256  # running sequences
    token_budget: int = 512  # tokens per iteration: one per decode, the rest prompt chunks
    watermark: float = 0.01  # share of the pool admission keeps free

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.token_budget < 1:
            raise ValueError(f"token_budget must be >= 1, got {self.token_budget}")


@dataclass(slots=True)
class ScheduledStep:
    """The next forward pass, and what changed to make it."""

    decodes: list[Sequence] = field(default_factory=list)  # one token each (the newest)
    chunks: list[Chunk] = field(default_factory=list)  # prompt (or recompute) chunks
    admitted: list[Sequence] = field(default_factory=list)  # left `waiting` this round
    preempted: list[Sequence] = field(default_factory=list)  # blocks freed, back to waiting

    @property
    def sampled(self) -> list[Sequence]:
        """Sequences that get a token from this step, in the runner's row order."""
        return self.decodes + [c.seq for c in self.chunks if c.is_last]

    @property
    def is_empty(self) -> bool:
        """Nothing to run."""
        return not self.decodes and not self.chunks

    def drop(self, seq: Sequence) -> None:
        """Take `seq` out of this step (e.g. its KV could not be pulled); the caller ends it."""
        if seq in self.decodes:
            self.decodes.remove(seq)
        self.chunks = [c for c in self.chunks if c.seq is not seq]


@dataclass(slots=True)
class StepResult:
    """One sampled token and whether it ended its sequence (None: it goes on)."""

    seq: Sequence
    token: int
    finish_reason: str | None


class Scheduler:
    """Owns the waiting queue and the running batch of one engine instance."""

    def __init__(self, blocks: BlockManager, limits: BatchLimits, eos_token_ids,
                 max_model_len: int) -> None:  # fmt: skip
        self.blocks, self.limits = blocks, limits
        self.memory = DecodeMemory(blocks.num_total_blocks, blocks.block_size, limits.watermark)
        self.eos_token_ids, self.max_model_len = tuple(eos_token_ids), max_model_len
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in arrival order: the tail is preempted first
        self._arrival: dict[int, int] = {}  # id(seq) -> arrival rank
        self._ranks = itertools.count()
        self.num_preemptions = self.num_recomputed_tokens = 0

    def set_token_budget(self, token_budget: int) -> None:
        """Change the per-iteration token budget from the next `schedule()` on (a hybrid
        instance's role change); sequences mid-prefill continue in chunks of the new size."""
        self.limits = replace(self.limits, token_budget=token_budget)  # validated there

    @property
    def has_work(self) -> bool:
        """Some sequence is waiting or running."""
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence) -> None:
        """Queue a sequence. Its KV may come from elsewhere (a prefill hand-off:
        num_computed_tokens = prompt length; the caller copies the KV into the blocks of each
        sequence in `ScheduledStep.admitted` before running the step, or drops it) or not
        (num_computed_tokens = 0: its tokens are prefilled here, in chunks)."""
        self._arrival[id(seq)] = next(self._ranks)
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def schedule(self) -> ScheduledStep:
        """The next iteration: grow (or preempt), decodes, continued chunks, then admissions."""
        step = ScheduledStep(preempted=self._grow())
        step.decodes = [s for s in self.running if s.num_uncomputed_tokens == 1]
        budget = self.limits.token_budget - len(step.decodes)
        for seq in self.running:
            if budget > 0 and seq.num_uncomputed_tokens > 1:
                take = min(budget, seq.num_uncomputed_tokens)
                step.chunks.append(Chunk(seq, seq.num_computed_tokens, take))
                budget -= take
        self._admit(step, budget)
        return step

    def postprocess(self, step: ScheduledStep, tokens: list[int]) -> list[StepResult]:
        """Advance what ran, append the sampled tokens, apply the stop rule, free the done."""
        sampled = step.sampled
        blocks, bs = self.blocks, self.blocks.block_size
        for seq in step.decodes:
            seq.num_computed_tokens += 1
            if blocks.enable_caching and not seq.num_computed_tokens % bs:  # a block filled
                blocks.cache_blocks(seq, seq.num_computed_tokens - 1, seq.num_computed_tokens)
        for chunk in step.chunks:
            chunk.seq.num_computed_tokens += chunk.num_tokens
            self.blocks.cache_blocks(chunk.seq, chunk.start, chunk.start + chunk.num_tokens)
        results = []
        for seq, token in zip(sampled, tokens, strict=True):
            seq.append_token(token)
            reason = check_stop(seq, self.eos_token_ids, self.max_model_len)
            if reason is not None:
                self.finish(seq, reason)
            results.append(StepResult(seq, int(token), reason))
        return results

    def finish(self, seq: Sequence, reason: str) -> None:
        """End `seq` (stop, length, cancelled, error): out of the queues, blocks freed."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        if seq.block_table:
            self.blocks.release(seq)
        self._arrival.pop(id(seq), None)
        finish(seq, reason)

    def detach(self, seq: Sequence) -> list[int]:
        """Take a running sequence out without freeing its blocks: its decode continues on
        another instance, which copies them. The caller owns the returned ids and frees them
        once they were copied (or the copy is given up)."""
        self.running.remove(seq)
        self._arrival.pop(id(seq), None)
        ids = self.blocks.detach(seq)
        finish(seq, "migrated")
        return ids

    def register_kv(self, seq: Sequence) -> None:
        """The KV of an admitted sequence arrived from elsewhere (a hand-off, copied into its
        blocks): its full blocks join the prefix cache, e.g. for a recompute after preemption."""
        self.blocks.cache_blocks(seq, 0, seq.num_computed_tokens)

    def recompute(self, seq: Sequence) -> None:
        """A waiting sequence whose promised KV will not come (an expired hand-off): its
        tokens are prefilled here instead."""
        seq.num_computed_tokens = 0

    # ---- memory -------------------------------------------------------------------------
    def _grow(self) -> list[Sequence]:
        """Room for every running sequence's tokens this step; preempt from the tail if short."""
        bs, free = self.blocks.block_size, self.blocks.num_free_blocks
        need = [blocks_for(s.num_tokens, bs) - len(s.block_table) for s in self.running]
        if sum(n for n in need if n > 0) <= free:  # the common step: nobody is preempted
            for seq, n in zip(self.running, need, strict=True):
                if n > 0:
                    self.blocks.allocate_for(seq, seq.num_tokens)
            return []
        plan = [(len(s.block_table), s.num_tokens) for s in self.running]

        # what releasing one frees: blocks shared with others (a cached prefix) stay held
        def freed(i: int) -> int:
            return self.blocks.num_exclusive(self.running[i])

        preempted = []
        for _ in range(self.memory.preemptions(plan, free, freed)):
            seq = self.running.pop()
            self.blocks.release(seq)
            seq.num_computed_tokens = 0
            seq.status = SequenceStatus.WAITING
            self.num_preemptions += 1
            self.waiting.appendleft(seq)
            preempted.append(seq)
        for seq in self.running:
            self.blocks.ensure_slot(seq)
        return preempted

    def _admit(self, step: ScheduledStep, budget: int) -> None:
        """Admit waiting sequences in order while seats, blocks and the token budget last;
        leaves free the running batch's next-step growth and the watermark."""
        if not self.waiting:
            return
        bs = self.blocks.block_size
        growth = sum(max(0, blocks_for(s.num_tokens + 1, bs) - len(s.block_table))
                     for s in self.running)  # fmt: skip
        while self.waiting and len(self.running) < self.limits.max_num_seqs:
            seq = self.waiting[0]
            # KV promised by a hand-off (computed > 0, one token left) needs no prefill here
            needs_prefill = not seq.num_computed_tokens or seq.num_uncomputed_tokens > 1
            # no KV yet: a cached prefix is reused; its unreferenced blocks come out of `free`
            hits = self.blocks.find_cached(seq) if not seq.num_computed_tokens else []
            free = self.blocks.num_free_blocks - growth - self.blocks.num_unreferenced(hits)
            if (needs_prefill and budget <= 0) or not self.memory.can_admit(
                seq.num_tokens - len(hits) * bs, free, len(self.running)
            ):
                break
            self.waiting.popleft()
            self._take_blocks(seq, hits)
            seq.status = SequenceStatus.RUNNING
            insort(self.running, seq, key=lambda s: self._arrival[id(s)])
            step.admitted.append(seq)
            if not needs_prefill:  # its KV arrives (the caller copies it) before the step runs
                step.decodes.append(seq)
                budget -= 1
            else:
                take = min(budget, seq.num_uncomputed_tokens)
                step.chunks.append(Chunk(seq, seq.num_computed_tokens, take))
                budget -= take

    def _take_blocks(self, seq: Sequence, hits: list[int]) -> None:
        """The admitted sequence's table: its cached prefix (if it has no KV yet), then new
        blocks for the rest of its tokens."""
        if not seq.num_computed_tokens:
            seq.num_computed_tokens = self.blocks.take_cached(seq, hits)
            if seq.num_completion_tokens:  # preempted or an expired hand-off: rebuilt here
                self.num_recomputed_tokens += seq.num_uncomputed_tokens
            else:
                seq.num_cached_tokens = seq.num_computed_tokens
        self.blocks.allocate_for(seq, seq.num_tokens)

    def has_prompt_work(self) -> bool:
        """Any prompt still to prefill here (a cheap prompt_backlog() > 0 for a hot path: a
        waiting sequence without KV counts even if all but its last token is cached)."""
        return any(not s.num_computed_tokens for s in self.waiting) or any(
            s.num_uncomputed_tokens > 1 for s in self.running
        )

    def prompt_backlog(self) -> int:
        """Prompt tokens still to prefill here: the rest of each prompt mid-prefill, and each
        waiting sequence without KV less the prefix it would find cached (not work)."""
        bs, cached = self.blocks.block_size, self.blocks.find_cached
        total = sum(
            s.num_tokens - len(cached(s)) * bs for s in self.waiting if not s.num_computed_tokens
        )
        return total + sum(
            s.num_uncomputed_tokens for s in self.running if s.num_uncomputed_tokens > 1
        )


class PreemptionCounters:
    """The preemption counters of whatever runs a `scheduler` (the engine, a decode worker);
    read by metrics threads."""

    scheduler: Scheduler

    @property
    def num_preemptions(self) -> int:
        """Sequences preempted (and later recomputed) so far."""
        return self.scheduler.num_preemptions

    @property
    def num_recomputed_tokens(self) -> int:
        """Tokens whose KV was rebuilt after a preemption (or, in decode, an expired hand-off)."""
        return self.scheduler.num_recomputed_tokens
