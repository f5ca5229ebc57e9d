"""LLMEngine: offline generation with packed prefill and continuous-batching decode."""

from __future__ import annotations

from collections import deque

from bucketserve.engine.block_manager import BlockManager
from bucketserve.engine.config import EngineConfig
from bucketserve.engine.runner import ModelRunner
from bucketserve.engine.sampling_params import SamplingParams
from bucketserve.engine.sequence import Sequence, SequenceStatus, check_stop, finish
from bucketserve.scheduling.memory import DecodeMemory


class LLMEngine:
    """Runs lists of prompts to completion on one ModelRunner (parity tests, benchmarks)."""

    def __init__(self, config: EngineConfig, runner: ModelRunner | None = None) -> None:
        self.config = config
        self.runner = runner or ModelRunner(config)
        self.block_manager = BlockManager(self.runner.num_blocks, self.runner.block_size)
        self.memory = DecodeMemory(self.runner.num_blocks, self.runner.block_size)
        self.num_preemptions = 0
        self.num_recomputed_tokens = 0
        self.max_model_len = self.runner.model_config.max_model_len
        self.eos_token_ids = self.runner.model_config.eos_token_ids

    def generate(
        self, prompts: list[list[int]], sampling_params: SamplingParams | list[SamplingParams]
    ) -> list[list[int]]:
        """Completion token ids for each prompt, in prompt order."""
        if isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params] * len(prompts)
        if len(sampling_params) != len(prompts):
            raise ValueError(
                f"sampling_params must have one entry per prompt ({len(prompts)}), "
                f"got {len(sampling_params)}"
            )
        seqs = [Sequence(p, sp) for p, sp in zip(prompts, sampling_params, strict=True)]
        for seq in seqs:
            self._check_fits(seq)
        waiting, running = deque(seqs), []
        try:
            while waiting or running:
                batch = self._admit(waiting, running)
                if batch:
                    self._step(batch, self.runner.prefill(batch), running)
                else:
                    self._decode_step(waiting, running)
        finally:
            for seq in seqs:
                if seq.block_table:
                    self.block_manager.release(seq)
        return [s.completion_token_ids for s in seqs]

    def _check_fits(self, seq: Sequence) -> None:
        limit = min(
            self.max_model_len, self.block_manager.num_total_blocks * self.runner.block_size
        )
        if seq.num_tokens + 1 > limit:
            raise ValueError(f"prompt must have < {limit} tokens, got {seq.num_tokens}")

    def _admit(self, waiting: deque[Sequence], running: list[Sequence]) -> list[Sequence]:
        """Pop waiting sequences that fit the token budget, batch cap and free blocks."""
        batch, num_tokens, bm = [], 0, self.block_manager
        growth = self.memory.growth([(len(s.block_table), s.num_tokens) for s in running])
        while waiting and len(running) + len(batch) < self.config.max_num_seqs:
            seq = waiting[0]
            too_many = batch and num_tokens + seq.num_tokens > self.config.max_num_batched_tokens
            free = bm.num_free_blocks - growth
            fits = self.memory.can_admit(seq.num_tokens, free, len(running))
            if too_many or not fits:
                break
            if seq.num_completion_tokens:  # a preempted sequence: its KV is recomputed
                self.num_recomputed_tokens += seq.num_tokens
            bm.allocate_for(seq)
            seq.status = SequenceStatus.RUNNING
            batch.append(waiting.popleft())
            num_tokens += seq.num_tokens
        return batch

    def _decode_step(self, waiting: deque[Sequence], running: list[Sequence]) -> None:
        bm = self.block_manager
        plan = [(len(s.block_table), s.num_tokens) for s in running]
        for _ in range(self.memory.preemptions(plan, bm.num_free_blocks)):
            self._preempt(running.pop(), waiting)  # newest first: recompute it later
        for seq in running:
            bm.ensure_slot(seq)
        batch = list(running)
        running.clear()
        self._step(batch, self.runner.decode(batch), running)

    def _preempt(self, seq: Sequence, waiting: deque[Sequence]) -> None:
        self.num_preemptions += 1
        self.block_manager.release(seq)
        seq.status = SequenceStatus.WAITING
        waiting.appendleft(seq)

    def _step(self, batch: list[Sequence], tokens: list[int], running: list[Sequence]) -> None:
        """Append sampled tokens; finished sequences free their blocks, others keep running."""
        for seq, token in zip(batch, tokens, strict=True):
            seq.append_token(token)
            reason = check_stop(seq, self.eos_token_ids, self.max_model_len)
            if reason is None:
                running.append(seq)
            else:
                finish(seq, reason)
                self.block_manager.release(seq)

    def close(self) -> None:
        """Release the runner's KV pool."""
        self.runner.close()
