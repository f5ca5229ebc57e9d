"""Context attention on dummy:tiny, every CPU backend: a prompt run in chunks over its cached
KV, alone or fused with other sequences' decodes, gives the logits of the whole prompt."""

from __future__ import annotations

import pytest
import torch
from bucketserve.engine.block_manager import BlockManager
from bucketserve.engine.config import EngineConfig
from bucketserve.engine.llm_engine import LLMEngine
from bucketserve.engine.runner import ModelRunner
from bucketserve.engine.sampling_params import SamplingParams
from bucketserve.engine.sequence import Chunk, Sequence

PROMPTS = [list(range(5, 5 + n)) for n in (1, 3, 17, 40, 64, 90)]
GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)


@pytest.fixture(scope="module", params=["cpu_paged", "sdpa"])
def runner(request):
    r = ModelRunner(EngineConfig(model="dummy:tiny", device="cpu", dtype="float32", num_blocks=128,
                                 block_size=8, attention=request.param))  # fmt: skip
    yield r
    r.close()


@pytest.mark.parametrize("chunk", [1, 5, 16, 33])
def test_chunked_prompt_logits_equal_whole_prompt(runner, chunk):
    bm = BlockManager(runner.num_blocks, runner.block_size)
    whole, pieces = Sequence(PROMPTS[-1]), Sequence(PROMPTS[-1])
    bm.allocate_for(whole), bm.allocate_for(pieces)
    expected = runner.prefill_logits([whole])[0]
    start, last = 0, None
    while start < pieces.num_tokens:
        n = min(chunk, pieces.num_tokens - start)
        with torch.inference_mode():
            logits, rows = runner._step_logits([], [Chunk(pieces, start, n)])
        last = logits[0] if rows else None
        start += n
    assert last is not None
    assert torch.allclose(last, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("chunk_tokens", [4, 16, 48])
def test_mixed_iterations_give_the_tokens_of_whole_prompts(runner, chunk_tokens):
    base = EngineConfig(model="dummy:tiny", device="cpu")
    reference = LLMEngine(base, runner=runner, chunk_tokens=4096).generate(PROMPTS, GREEDY)
    mixed_before = runner.stats.num_mixed_steps
    engine = LLMEngine(base, runner=runner, chunk_tokens=chunk_tokens)
    assert engine.generate(PROMPTS, GREEDY) == reference
    assert runner.stats.num_mixed_steps > mixed_before
    assert engine.block_manager.num_free_blocks == runner.num_blocks
