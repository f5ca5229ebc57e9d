"""LLMEngine on dummy:tiny: batching independence, preemption, seeds, no leaked blocks."""

from __future__ import annotations

import pytest
from bucketserve.engine.config import EngineConfig
from bucketserve.engine.llm_engine import LLMEngine
from bucketserve.engine.runner import ModelRunner
from bucketserve.engine.sampling_params import SamplingParams

PROMPTS = [
    [(7 * i + j) % 500 + 3 for j in range(n)] for i, n in enumerate((1, 5, 12, 3, 30, 8, 17))
]
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


@pytest.fixture
def runner():
    r = ModelRunner(EngineConfig(model="dummy:tiny", device="cpu", num_blocks=64, block_size=4))
    yield r
    r.close()


def _engine(runner, **overrides) -> LLMEngine:
    config = EngineConfig(model="dummy:tiny", device="cpu", **overrides)
    return LLMEngine(config, runner=runner)


def test_greedy_output_independent_of_batching(runner):
    results = []
    for max_num_seqs, budget in [(1, 16384), (3, 20), (32, 16384)]:
        engine = _engine(runner, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget)
        results.append(engine.generate(PROMPTS, GREEDY))
        assert engine.block_manager.num_free_blocks == runner.num_blocks
    assert results[0] == results[1] == results[2]
    assert all(len(out) == 12 for out in results[0])


def test_preemption_under_block_pressure_keeps_outputs(runner):
    reference = _engine(runner).generate(PROMPTS, GREEDY)
    small = ModelRunner(EngineConfig(model="dummy:tiny", device="cpu", num_blocks=14, block_size=4))
    try:
        engine = LLMEngine(EngineConfig(model="dummy:tiny", device="cpu"), runner=small)
        assert engine.generate(PROMPTS, GREEDY) == reference
        assert engine.num_preemptions > 0 and engine.num_recomputed_tokens > 0
        assert engine.block_manager.num_free_blocks == 14
    finally:
        small.close()


def test_seeded_sampling_reproducible_across_batches(runner):
    params = [SamplingParams(temperature=1.0, top_p=0.9, seed=i, max_tokens=10) for i in range(7)]
    together = _engine(runner).generate(PROMPTS, params)
    alone = [_engine(runner).generate([p], sp)[0] for p, sp in zip(PROMPTS, params, strict=True)]
    assert together == alone


def test_stop_rules_and_mixed_params(runner):
    engine = _engine(runner)
    first = engine.generate(PROMPTS[:1], GREEDY)[0]
    stop_at = first[3]
    params = [
        SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[stop_at], ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=2),
    ]
    out = engine.generate([PROMPTS[0], PROMPTS[0]], params)
    assert out[0] == first[: first.index(stop_at) + 1]
    assert len(out[1]) <= 2
    assert engine.block_manager.num_free_blocks == runner.num_blocks


def test_bad_inputs(runner):
    engine = _engine(runner)
    with pytest.raises(ValueError, match="one entry per prompt"):
        engine.generate(PROMPTS, [GREEDY])
    with pytest.raises(ValueError, match="prompt must have"):
        engine.generate([list(range(3, 400))], GREEDY)  # 64 blocks * 4 = 256 tokens
