"""Sampler: greedy, seeds independent of batch composition, min_tokens, top-k, top-p."""

from __future__ import annotations

import torch
from bucketserve.engine.sampler import Sampler, SampleRow
from bucketserve.engine.sampling_params import SamplingParams

VOCAB = 64


def _logits(batch: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_is_argmax():
    logits = _logits(5)
    rows = [SampleRow(SamplingParams(temperature=0), 0)] * 5
    assert Sampler()(logits, rows).tokens == logits.argmax(-1).tolist()


def test_seeded_rows_ignore_batch_composition():
    logits = _logits(6)
    params = SamplingParams(temperature=1.0, seed=1234)
    alone = [
        Sampler(seed=s)(logits[2:3], [SampleRow(params, n)]).tokens[0] for s, n in [(0, 7), (9, 7)]
    ]
    mixed_rows = [SampleRow(SamplingParams(temperature=0.7, seed=i), 7) for i in range(6)]
    mixed_rows[4] = SampleRow(params, 7)
    batched = Sampler(seed=5)(torch.cat([logits[:4], logits[2:3], logits[5:]]), mixed_rows).tokens
    assert alone[0] == alone[1] == batched[4]


def test_seeded_stream_differs_per_step_and_per_seed():
    logits = torch.zeros(1, VOCAB)  # uniform: the draw is pure noise
    draws = {Sampler()(logits, [SampleRow(SamplingParams(seed=3), n)]).tokens[0] for n in range(20)}
    assert len(draws) > 10
    by_seed = {
        Sampler()(logits, [SampleRow(SamplingParams(seed=s), 0)]).tokens[0] for s in range(20)
    }
    assert len(by_seed) > 10


def test_min_tokens_masks_eos_and_stop_ids():
    logits = torch.full((1, VOCAB), -10.0)
    logits[0, 2], logits[0, 3], logits[0, 7] = 10.0, 9.0, 8.0  # eos > stop id > other
    params = SamplingParams(temperature=0, min_tokens=3, stop_token_ids=[3])
    sampler = Sampler()
    assert sampler(logits, [SampleRow(params, 2, eos_token_ids=(2,))]).tokens == [7]
    assert sampler(logits, [SampleRow(params, 3, eos_token_ids=(2,))]).tokens == [2]
    ignoring = SamplingParams(temperature=0, min_tokens=3, ignore_eos=True)
    assert sampler(logits, [SampleRow(ignoring, 0, eos_token_ids=(2,))]).tokens == [2]


def test_top_k_only_draws_from_k_best():
    logits = _logits(1, seed=3)
    top = set(logits[0].topk(4).indices.tolist())
    sampler = Sampler(seed=1)
    rows = [SampleRow(SamplingParams(temperature=5.0, top_k=4), 0)]
    draws = {sampler(logits, rows).tokens[0] for _ in range(200)}
    assert draws <= top and len(draws) > 1


def test_top_p_keeps_smallest_nucleus():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05] + [0.0] * (VOCAB - 4)])
    logits = probs.clamp_min(1e-12).log()
    sampler = Sampler(seed=2)
    rows = [SampleRow(SamplingParams(temperature=1.0, top_p=0.75), 0)]
    draws = [sampler(logits, rows).tokens[0] for _ in range(300)]
    assert set(draws) == {0, 1}


def test_mixed_batch_rows_use_own_parameters():
    logits = _logits(3, seed=4)
    rows = [
        SampleRow(SamplingParams(temperature=0), 0),
        SampleRow(SamplingParams(temperature=1.0, top_k=1), 0),  # top-1: deterministic
        SampleRow(SamplingParams(temperature=1.0, top_p=1e-6), 0),  # nucleus of one
    ]
    assert Sampler()(logits, rows).tokens == logits.argmax(-1).tolist()


def test_temperature_sharpens_distribution():
    logits = _logits(1, seed=6)
    best = int(logits.argmax())
    sampler = Sampler(seed=3)
    cold = [
        sampler(logits, [SampleRow(SamplingParams(temperature=0.05), 0)]).tokens[0]
        for _ in range(50)
    ]
    hot = [
        sampler(logits, [SampleRow(SamplingParams(temperature=50.0), 0)]).tokens[0]
        for _ in range(50)
    ]
    assert cold.count(best) >= 48 and len(set(hot)) > 10
