"""Batched token sampling with per-row parameters, and the log-probabilities of what was picked.

Randomness is counter-based: a row's noise is a hash of (seed, tokens generated so far, token
id), so a seeded request's tokens depend on neither batch composition nor which process or
device samples them (prefill and decode may run in different instances), and no
torch.Generator is built per row per step. Unseeded rows get a fresh seed from the sampler's own
generator each step.

Guided rows (structured output) are masked to the tokens their grammar allows first, before
stop-token masks, penalties and top-k/top-p (engine/guided_mask.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from bucketserve.engine.guided import GrammarCache
from bucketserve.engine.guided_mask import GuidedMasks
from bucketserve.engine.logits_process import (
    apply_penalties,
    apply_top_k_top_p,
    mask_banned,
    to_device,
)
from bucketserve.engine.sampling_params import SamplingParams

_MASK64 = 2**64 - 1


@dataclass(slots=True)
class SampleRow:
    """What the sampler needs to know about one sequence in the batch."""

    params: SamplingParams
    num_generated: int  # completion tokens before this sample
    eos_token_ids: tuple[int, ...] = ()
    token_ids: list[int] = field(default_factory=list)  # prompt + completion (penalties, bad words)


@dataclass(slots=True)
class TokenLogprob:
    """Log-probability of a sampled token and of the `k` most likely tokens at that step."""

    logprob: float
    top_ids: list[int] = field(default_factory=list)
    top_logprobs: list[float] = field(default_factory=list)


@dataclass(slots=True)
class SampleOutput:
    """One step's result: a token per row, and its TokenLogprob where the row asked for it."""

    tokens: list[int]
    logprobs: list[TokenLogprob | None]


def step_seed(seed: int, num_generated: int) -> int:
    """Noise key for one (request seed, step) pair."""
    mixed = (seed * 6364136223846793005 + (num_generated + 1) * 1442695040888963407) & _MASK64
    mixed ^= mixed >> 29
    return mixed - 2**64 if mixed >= 2**63 else mixed  # as int64


def _srl(x: torch.Tensor, n: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic)."""
    return (x >> n) & ((1 << (64 - n)) - 1)


def gumbel_noise(keys: torch.Tensor, vocab: int) -> torch.Tensor:
    """keys: [N] int64 -> Gumbel(0, 1) noise [N, V] from a splitmix64 hash of (key, token id)."""
    z = keys.unsqueeze(1) + torch.arange(1, vocab + 1, device=keys.device) * -7046029254386353131
    z = (z ^ _srl(z, 30)) * -4658895280553007687
    z = (z ^ _srl(z, 27)) * -7723592293110705685
    z = z ^ _srl(z, 31)
    # 23 bits, not 24: (2**24 - 0.5) / 2**24 rounds to 1.0 in float32, whose noise is +inf,
    # and -inf (a masked token) + inf = NaN, which argmax picks: once in ~350 steps a masked
    # (or any) token was sampled. With 23 bits u stays in [2**-24, 1 - 2**-24], both exact.
    u = (_srl(z, 41).to(torch.float32) + 0.5) * (1.0 / (1 << 23))
    return -torch.log(-torch.log(u))


class Sampler:
    """Turns logits [B, V] into one token id per row (and log-probs for rows that ask)."""

    def __init__(self, device: torch.device | str = "cpu", seed: int = 0,
                 grammars: GrammarCache | None = None) -> None:  # fmt: skip
        self.device = torch.device(device)
        self.generator = torch.Generator().manual_seed(seed)  # CPU: fresh keys, no device sync
        self.guided = GuidedMasks(grammars) if grammars is not None else None

    def prefetch(self, params: list[SamplingParams]) -> None:
        """Start compiling the guides of requests about to run (overlaps their forward pass)."""
        for p in params:
            if p.is_guided:
                self._guided().prefetch(p)

    def _guided(self) -> GuidedMasks:
        if self.guided is None:
            raise ValueError("structured output needs a sampler built with a GrammarCache")
        return self.guided

    def __call__(self, logits: torch.Tensor, rows: list[SampleRow]) -> SampleOutput:
        """logits: [B, V] float32 -> SampleOutput with B tokens."""
        if logits.shape[0] != len(rows):
            raise ValueError(f"rows must match logits batch {logits.shape[0]}, got {len(rows)}")
        raw = logits
        if any(r.params.is_guided for r in rows):
            logits = self._guided().apply(logits, rows)
        logits = apply_penalties(mask_banned(logits, rows), rows)
        tokens = logits.argmax(dim=-1)  # [B]
        sampled = [i for i, r in enumerate(rows) if not r.params.is_greedy]
        if sampled:
            picked = self._sample(logits[sampled], [rows[i] for i in sampled])
            tokens = tokens.index_put((to_device(sampled, torch.int64, logits.device),), picked)
        return self._gather(raw, tokens, rows)

    def _sample(self, logits: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
        """logits: [N, V] of non-greedy rows -> [N] sampled ids (Gumbel-max)."""
        temps = to_device([r.params.temperature for r in rows], logits.dtype, logits.device)
        logits = logits / temps.unsqueeze(1)
        if any(r.params.uses_top_k or r.params.uses_top_p for r in rows):
            logits = apply_top_k_top_p(logits, rows)
        keys = to_device(self._keys(rows), torch.int64, logits.device)
        # Gumbel-max: argmax(logits + G) with G ~ Gumbel(0, 1) samples from softmax(logits).
        return (logits + gumbel_noise(keys, logits.shape[1])).argmax(dim=-1)

    def _keys(self, rows: list[SampleRow]) -> list[int]:
        fresh = torch.randint(-(2**63), 2**63 - 1, (len(rows),), generator=self.generator)
        return [
            step_seed(r.params.seed, r.num_generated) if r.params.seed is not None else int(k)
            for r, k in zip(rows, fresh.tolist(), strict=True)
        ]

    def _gather(self, raw: torch.Tensor, tokens: torch.Tensor, rows) -> SampleOutput:
        """One device->host copy for the tokens and, when asked, their log-probs."""
        wanted = [r.params.logprobs for r in rows]
        if all(k is None for k in wanted):
            return SampleOutput(tokens.tolist(), [None] * len(rows))
        k = max(w or 0 for w in wanted)
        logp = torch.log_softmax(raw.float(), dim=-1)  # [B, V] of the model's distribution
        chosen = logp.gather(1, tokens.unsqueeze(1))  # [B, 1]
        top = logp.topk(k, dim=-1) if k else None
        parts = [tokens.unsqueeze(1).double(), chosen.double()]
        if top is not None:
            parts += [top.indices.double(), top.values.double()]
        host = torch.cat(parts, dim=1).tolist()  # the step's only sync
        logprobs = [_row_logprob(h, w, k) for h, w in zip(host, wanted, strict=True)]
        return SampleOutput([int(h[0]) for h in host], logprobs)


def _row_logprob(host: list[float], wanted: int | None, k: int) -> TokenLogprob | None:
    if wanted is None:
        return None
    ids = [int(t) for t in host[2 : 2 + wanted]]
    return TokenLogprob(host[1], ids, host[2 + k : 2 + k + wanted])
