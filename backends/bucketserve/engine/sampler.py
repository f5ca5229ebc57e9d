"""Batched token sampling with per-row parameters.

Seeded rows draw their noise from a generator seeded by (seed, number of tokens generated so
far), so a request's tokens depend on neither batch composition nor which process samples
them (prefill and decode may run in different instances).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bucketserve.engine.sampling_params import SamplingParams

_MASK64 = 2**64 - 1


@dataclass(slots=True)
class SampleRow:
    """What the sampler needs to know about one sequence in the batch."""

    params: SamplingParams
    num_generated: int  # completion tokens before this sample
    eos_token_ids: tuple[int, ...] = ()


def step_seed(seed: int, num_generated: int) -> int:
    """Generator seed for one (request seed, step) pair."""
    mixed = (seed * 6364136223846793005 + (num_generated + 1) * 1442695040888963407) & _MASK64
    return mixed ^ (mixed >> 29)


class Sampler:
    """Turns logits [B, V] into one token id per row."""

    def __init__(self, device: torch.device | str = "cpu", seed: int = 0) -> None:
        self.device = torch.device(device)
        self.generator = torch.Generator(self.device).manual_seed(seed)

    def __call__(self, logits: torch.Tensor, rows: list[SampleRow]) -> list[int]:
        """logits: [B, V] float32 -> B token ids."""
        if logits.shape[0] != len(rows):
            raise ValueError(f"rows must match logits batch {logits.shape[0]}, got {len(rows)}")
        logits = mask_stop_tokens(logits, rows)
        greedy = logits.argmax(dim=-1)  # [B]
        sampled_rows = [i for i, r in enumerate(rows) if not r.params.is_greedy]
        if not sampled_rows:
            return greedy.tolist()
        picked = self._sample(logits[sampled_rows], [rows[i] for i in sampled_rows])
        tokens = greedy.tolist()
        for i, token in zip(sampled_rows, picked.tolist(), strict=True):
            tokens[i] = token
        return tokens

    def _sample(self, logits: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
        """logits: [N, V] of non-greedy rows -> [N] sampled ids."""
        temps = torch.tensor([r.params.temperature for r in rows], dtype=logits.dtype)
        logits = logits / temps.to(logits.device).unsqueeze(1)
        if any(r.params.uses_top_k or r.params.uses_top_p for r in rows):
            logits = apply_top_k_top_p(logits, rows)
        probs = torch.softmax(logits, dim=-1)
        noise = self._exponential_noise(probs, rows)  # [N, V]
        # Exponential race: argmax(p / E) with E ~ Exp(1) samples from p.
        return (probs / noise).argmax(dim=-1)

    def _exponential_noise(self, probs: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
        noise = torch.empty_like(probs).exponential_(generator=self.generator)
        for i, row in enumerate(rows):
            if row.params.seed is not None:
                gen = torch.Generator(probs.device)
                gen.manual_seed(step_seed(row.params.seed, row.num_generated))
                noise[i].exponential_(generator=gen)
        return noise


def mask_stop_tokens(logits: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
    """-inf on EOS and stop ids for rows that have not reached min_tokens yet."""
    row_idx, col_idx = [], []
    for i, row in enumerate(rows):
        if row.num_generated >= row.params.min_tokens:
            continue
        stop_ids = set(row.params.stop_token_ids)
        if not row.params.ignore_eos:
            stop_ids.update(row.eos_token_ids)
        ids = [t for t in stop_ids if t < logits.shape[1]]
        row_idx.extend([i] * len(ids))
        col_idx.extend(ids)
    if not row_idx:
        return logits
    logits = logits.clone()
    logits[row_idx, col_idx] = float("-inf")
    return logits


def apply_top_k_top_p(logits: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
    """Mask logits [N, V] outside each row's top-k and top-p nucleus with -inf."""
    vocab = logits.shape[1]
    top_k = [r.params.top_k if r.params.uses_top_k else vocab for r in rows]
    top_k_t = torch.tensor(top_k, device=logits.device).clamp(max=vocab).unsqueeze(1)
    top_p_t = torch.tensor([r.params.top_p for r in rows], device=logits.device).unsqueeze(1)
    sorted_logits, order = logits.sort(dim=-1, descending=True)  # [N, V]
    ranks = torch.arange(vocab, device=logits.device).unsqueeze(0)  # [1, V]
    drop = ranks >= top_k_t
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    probs = torch.softmax(sorted_logits, dim=-1)
    # Drop a token when the tokens ranked above it already hold top_p of the mass.
    drop |= (probs.cumsum(dim=-1) - probs) > top_p_t
    mask = torch.empty_like(drop).scatter_(1, order, drop)
    return logits.masked_fill(mask, float("-inf"))
