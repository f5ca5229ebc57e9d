"""Sampler extras: log-probs of what was picked, penalties, bad words, top-k before top-p."""

from __future__ import annotations

import torch
from bucketserve.engine.logits_process import apply_top_k_top_p
from bucketserve.engine.sampler import Sampler, SampleRow
from bucketserve.engine.sampling_params import SamplingParams

VOCAB = 64


def _logits(batch: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_logprobs_are_log_softmax_and_top_k():
    logits = _logits(3, seed=1)
    rows = [SampleRow(SamplingParams(temperature=0, logprobs=k), 0) for k in (None, 0, 5)]
    out = Sampler()(logits, rows)
    ref = torch.log_softmax(logits, dim=-1)
    assert out.logprobs[0] is None
    for i in (1, 2):
        assert abs(out.logprobs[i].logprob - ref[i, out.tokens[i]].item()) < 1e-6
    top = ref[2].topk(5)
    assert out.logprobs[2].top_ids == top.indices.tolist()
    assert torch.allclose(torch.tensor(out.logprobs[2].top_logprobs), top.values)
    assert out.logprobs[1].top_ids == []


def test_sampled_logprob_matches_its_token():
    logits = _logits(2, seed=2)
    rows = [SampleRow(SamplingParams(temperature=1.0, seed=5, logprobs=2), 0)] * 2
    out = Sampler()(logits, rows)
    ref = torch.log_softmax(logits, dim=-1)
    for i, tok in enumerate(out.tokens):
        assert abs(out.logprobs[i].logprob - ref[i, tok].item()) < 1e-6


def test_seeded_draws_repeat_and_follow_the_distribution():
    probs = torch.tensor([[0.6, 0.3, 0.1] + [0.0] * (VOCAB - 3)])
    logits = probs.clamp_min(1e-12).log()
    counts = torch.zeros(3)
    for seed in range(2000):
        row = [SampleRow(SamplingParams(temperature=1.0, seed=seed), 0)]
        tok = Sampler()(logits, row).tokens[0]
        assert Sampler(seed=99)(logits, row).tokens[0] == tok  # the seed alone decides
        counts[tok] += 1
    assert torch.allclose(counts / counts.sum(), probs[0, :3], atol=0.04)


def test_repetition_and_presence_penalties_change_the_pick():
    logits = torch.full((1, VOCAB), -5.0)
    logits[0, 4], logits[0, 9] = 3.0, 2.5
    history = [1, 4]  # prompt [1], generated [4]
    plain = SampleRow(SamplingParams(temperature=0), 1, token_ids=history)
    rep = SampleRow(SamplingParams(temperature=0, repetition_penalty=1.5), 1, token_ids=history)
    pres = SampleRow(SamplingParams(temperature=0, presence_penalty=1.0), 1, token_ids=history)
    assert Sampler()(logits.repeat(3, 1), [plain, rep, pres]).tokens == [4, 9, 9]


def test_frequency_penalty_counts_repeats():
    logits = torch.full((1, VOCAB), -5.0)
    logits[0, 4], logits[0, 9] = 3.0, 1.5
    once = SampleRow(SamplingParams(temperature=0, frequency_penalty=1.0), 1, token_ids=[0, 4])
    twice = SampleRow(SamplingParams(temperature=0, frequency_penalty=1.0), 2, token_ids=[0, 4, 4])
    assert Sampler()(logits.repeat(2, 1), [once, twice]).tokens == [4, 9]


def test_bad_words_block_their_last_token_after_the_prefix():
    logits = torch.full((1, VOCAB), -5.0)
    logits[0, 6], logits[0, 7] = 3.0, 2.0
    params = SamplingParams(temperature=0, bad_words_ids=[[5, 6], [8]])
    after_prefix = SampleRow(params, 1, token_ids=[1, 5])
    elsewhere = SampleRow(params, 1, token_ids=[1, 3])
    assert Sampler()(logits.repeat(2, 1), [after_prefix, elsewhere]).tokens == [7, 6]


def _full_sort_reference(logits: torch.Tensor, top_k: list[int], top_p: list[float]):
    """The previous implementation: sort the whole vocabulary."""
    vocab = logits.shape[1]
    k = torch.tensor([k if k > 0 else vocab for k in top_k]).unsqueeze(1)
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    drop = torch.arange(vocab).unsqueeze(0) >= k
    probs = torch.softmax(sorted_logits.masked_fill(drop, float("-inf")), dim=-1)
    drop |= (probs.cumsum(-1) - probs) > torch.tensor(top_p).unsqueeze(1)
    mask = torch.empty_like(drop).scatter_(1, order, drop)
    return logits.masked_fill(mask, float("-inf"))


def test_top_k_first_equals_full_sort():
    logits = _logits(4, seed=7)
    for top_k, top_p in [([5, 10, 3, 8], [1.0, 0.5, 0.9, 0.2]), ([0, 10, 3, 0], [0.7, 1.0, 0.9, 0.3])]:  # fmt: skip
        rows = [SampleRow(SamplingParams(top_k=k, top_p=p), 0) for k, p in zip(top_k, top_p, strict=True)]  # fmt: skip
        got = apply_top_k_top_p(logits, rows)
        assert torch.equal(got, _full_sort_reference(logits, top_k, top_p))
