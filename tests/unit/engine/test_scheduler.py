"""The engine Scheduler without torch: budgets, chunk order, admission, preemption, the stop
rule, and no leaked block, for arbitrary prompts, budgets and pool sizes (hypothesis)."""

from __future__ import annotations

import pytest
from bucketserve.engine.block_manager import BlockManager
from bucketserve.engine.sampling_params import SamplingParams
from bucketserve.engine.scheduler import BatchLimits, Scheduler
from bucketserve.engine.sequence import Sequence
from hypothesis import given, settings
from hypothesis import strategies as st

EOS = 2


def fake_token(ids: list[int]) -> int:
    """A deterministic 'model' whose next token depends on every earlier token."""
    return 3 + sum(i * (k + 1) for k, i in enumerate(ids)) % 50


def run(prompts, budget: int, num_blocks: int, max_seqs: int = 64, max_tokens: int = 6):
    bm = BlockManager(num_blocks, 4)
    sched = Scheduler(bm, BatchLimits(max_seqs, budget, watermark=0.0), (EOS,), 4096)
    seqs = [Sequence(p, SamplingParams(max_tokens=max_tokens, ignore_eos=True)) for p in prompts]
    for s in seqs:
        sched.add(s)
    steps = 0
    while sched.has_work:
        step = sched.schedule()
        assert not step.is_empty, "work left but nothing scheduled"
        assert len(step.decodes) + sum(c.num_tokens for c in step.chunks) <= max(
            budget, len(step.decodes)
        )
        assert len(sched.running) <= max_seqs
        for c in step.chunks:  # each chunk continues its sequence's computed prefix
            assert c.start == c.seq.num_computed_tokens and c.num_tokens >= 1
            assert len(c.seq.block_table) * 4 >= c.seq.num_tokens
        for s in step.decodes:
            assert s.num_uncomputed_tokens == 1
        tokens = [fake_token(s.token_ids) for s in step.sampled]
        sched.postprocess(step, tokens)
        steps += 1
        assert steps < 10_000
    assert bm.num_free_blocks == num_blocks
    return [s.completion_token_ids for s in seqs], sched


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 40), min_size=1, max_size=8),
    budget=st.integers(1, 64),
    spare=st.integers(0, 30),
)
def test_any_budget_and_pool_give_the_unconstrained_tokens(lengths, budget, spare):
    prompts = [[(7 * i + j) % 90 + 3 for j in range(n)] for i, n in enumerate(lengths)]
    reference, _ = run(prompts, budget=4096, num_blocks=512)
    need = max(-(-(n + 7) // 4) for n in lengths)  # the longest sequence must fit alone
    got, _ = run(prompts, budget=budget, num_blocks=need + spare)
    assert got == reference


def test_small_pool_preempts_and_recomputes():
    prompts = [list(range(3, 3 + n)) for n in (10, 12, 9, 14)]
    reference, _ = run(prompts, 4096, 512, max_tokens=20)
    got, sched = run(prompts, 8, 12, max_tokens=20)
    assert got == reference
    assert sched.num_preemptions > 0 and sched.num_recomputed_tokens > 0


def test_decodes_come_first_and_chunks_fill_the_rest():
    bm = BlockManager(64, 4)
    sched = Scheduler(bm, BatchLimits(8, 10), (EOS,), 4096)
    short, long = Sequence([5, 6]), Sequence(list(range(3, 33)))
    sched.add(short)
    step = sched.schedule()
    sched.postprocess(step, [7])  # the short prompt is now decoding
    sched.add(long)
    step = sched.schedule()
    assert step.decodes == [short]
    assert [(c.seq, c.start, c.num_tokens) for c in step.chunks] == [(long, 0, 9)]
    sched.postprocess(step, [8])  # only the decode sampled; the chunk was not the prompt's last
    step = sched.schedule()
    assert [(c.start, c.num_tokens) for c in step.chunks] == [(9, 9)]


def test_token_budget_changes_between_iterations():
    bm = BlockManager(64, 4)
    sched = Scheduler(bm, BatchLimits(8, 10), (EOS,), 4096)
    long = Sequence(list(range(3, 33)))
    sched.add(long)
    step = sched.schedule()
    assert [c.num_tokens for c in step.chunks] == [10]
    sched.postprocess(step, [])
    sched.set_token_budget(4)  # the mid-prefill prompt continues in the new chunk size
    step = sched.schedule()
    assert [(c.start, c.num_tokens) for c in step.chunks] == [(10, 4)]
    with pytest.raises(ValueError, match="token_budget"):
        sched.set_token_budget(0)
    assert sched.limits.token_budget == 4


def test_handoff_sequence_joins_decoding_without_a_prefill():
    bm = BlockManager(64, 4)
    sched = Scheduler(bm, BatchLimits(8, 16), (EOS,), 4096)
    seq = Sequence([5, 6, 7], SamplingParams(max_tokens=3))
    seq.append_token(9)  # the first token, sampled by a prefill instance
    seq.num_computed_tokens = 3  # its KV is copied in on admission
    sched.add(seq)
    step = sched.schedule()
    assert step.admitted == [seq] and step.decodes == [seq] and step.chunks == []
    assert len(seq.block_table) == 1  # blocks for all 4 tokens


def test_stop_rule_eos_after_min_tokens_and_length():
    bm = BlockManager(64, 4)
    sched = Scheduler(bm, BatchLimits(8, 64), (EOS,), 4096)
    eos_early = Sequence([5, 6], SamplingParams(max_tokens=5, min_tokens=2))
    sched.add(eos_early)
    results = sched.postprocess(sched.schedule(), [EOS])  # masked in practice; rule says go on
    assert results[0].finish_reason is None
    results = sched.postprocess(sched.schedule(), [EOS])
    assert results[0].finish_reason == "stop" and eos_early.is_finished
    assert not sched.has_work and bm.num_free_blocks == 64
