"""LLMEngine: offline generation over one ModelRunner, driven by the decode Scheduler."""

from __future__ import annotations

from bucketserve.engine.block_manager import BlockManager
from bucketserve.engine.config import EngineConfig
from bucketserve.engine.guided import check_guide
from bucketserve.engine.runner import ModelRunner
from bucketserve.engine.sampling_params import SamplingParams
from bucketserve.engine.scheduler import BatchLimits, PreemptionCounters, Scheduler
from bucketserve.engine.sequence import Sequence


class LLMEngine(PreemptionCounters):
    """Runs lists of prompts to completion on one ModelRunner (parity tests, benchmarks).

    Every iteration is one fused forward pass: a token for each running sequence plus prompt
    chunks up to `chunk_tokens` tokens in all (default: max_num_batched_tokens)."""

    def __init__(self, config: EngineConfig, runner: ModelRunner | None = None,
                 chunk_tokens: int | None = None) -> None:  # fmt: skip
        self.config = config
        self.runner = runner or ModelRunner(config)
        self.block_manager = BlockManager(
            self.runner.num_blocks, self.runner.block_size, config.enable_prefix_caching,
            namespace=config.model,
        )  # fmt: skip
        self.max_model_len = self.runner.model_config.max_model_len
        self.eos_token_ids = self.runner.model_config.eos_token_ids
        limits = BatchLimits(config.max_num_seqs, chunk_tokens or config.max_num_batched_tokens)
        self.scheduler = Scheduler(
            self.block_manager, limits, self.eos_token_ids, self.max_model_len
        )

    @property
    def num_cached_tokens(self) -> int:
        """Prompt tokens served from the prefix cache so far (its hits)."""
        return self.block_manager.num_hit_tokens

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
        for sp in sampling_params:
            check_guide(sp)  # a bad schema fails here, before any request runs
        self.runner.sampler.prefetch(sampling_params)
        seqs = [Sequence(p, sp) for p, sp in zip(prompts, sampling_params, strict=True)]
        for seq in seqs:
            self._check_fits(seq)
            self.scheduler.add(seq)
        try:
            while self.scheduler.has_work:
                self.step()
        finally:
            for seq in seqs:
                if not seq.is_finished:
                    self.scheduler.finish(seq, "cancelled")
        return [s.completion_token_ids for s in seqs]

    def step(self) -> None:
        """One scheduled iteration through the runner."""
        step = self.scheduler.schedule()
        if step.is_empty:
            raise RuntimeError("scheduler has work but scheduled nothing (pool too small?)")
        out = self.runner.step_sampled(step.decodes, step.chunks)
        self.scheduler.postprocess(step, out.tokens)

    def _check_fits(self, seq: Sequence) -> None:
        limit = min(
            self.max_model_len, self.block_manager.num_total_blocks * self.runner.block_size
        )
        if seq.num_tokens + 1 > limit:
            raise ValueError(f"prompt must have < {limit} tokens, got {seq.num_tokens}")

    def close(self) -> None:
        """Release the runner's KV pool."""
        self.runner.close()
