"""Step counters the serving layer publishes (tokens processed, EMA step latencies)."""

from __future__ import annotations

from dataclasses import dataclass

EMA_ALPHA = 0.1


@dataclass(slots=True)
class StepStats:
    """Counters updated by the runner after every step; read-only for everyone else."""

    num_prefill_steps: int = 0
    num_decode_steps: int = 0
    num_prefill_tokens: int = 0  # prompt tokens run through prefill
    num_decode_tokens: int = 0  # tokens produced by decode steps (one per sequence per step)
    ema_prefill_s: float = 0.0
    ema_decode_s: float = 0.0
    ema_step_s: float = 0.0  # any step, prefill or decode
    last_step_s: float = 0.0
    last_batch_size: int = 0
    num_mixed_steps: int = 0  # steps that carried decode tokens and prefill-chunk tokens

    def record_mixed(self, num_decodes: int, num_chunk_tokens: int, seconds: float) -> None:
        """Account one fused step: decode rows plus prefill-chunk rows (counted as decode
        for the step EMA, which is what a running sequence waits per token)."""
        self.record(False, num_decodes, num_decodes, seconds)
        self.num_prefill_tokens += num_chunk_tokens
        self.num_mixed_steps += 1

    def record(self, is_prefill: bool, batch_size: int, num_tokens: int, seconds: float) -> None:
        """Account one step."""
        self.last_step_s, self.last_batch_size = seconds, batch_size
        num_steps = self.num_prefill_steps + self.num_decode_steps + 1
        self.ema_step_s = _ema(self.ema_step_s, seconds, num_steps)
        if is_prefill:
            self.num_prefill_steps += 1
            self.num_prefill_tokens += num_tokens
            self.ema_prefill_s = _ema(self.ema_prefill_s, seconds, self.num_prefill_steps)
        else:
            self.num_decode_steps += 1
            self.num_decode_tokens += num_tokens
            self.ema_decode_s = _ema(self.ema_decode_s, seconds, self.num_decode_steps)

    @property
    def num_tokens(self) -> int:
        """All tokens processed."""
        return self.num_prefill_tokens + self.num_decode_tokens


def _ema(old: float, new: float, count: int) -> float:
    return new if count == 1 else (1 - EMA_ALPHA) * old + EMA_ALPHA * new
