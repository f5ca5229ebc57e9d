"""Chunked prefill and fused decode + prefill-chunk steps (SmolLM2, fp32, CPU): the same
greedy tokens as transformers, for every CPU attention backend and several chunk sizes."""

from __future__ import annotations

import pytest
from bucketserve.engine.config import EngineConfig
from bucketserve.engine.llm_engine import LLMEngine
from bucketserve.engine.runner import ModelRunner

pytestmark = pytest.mark.parity


@pytest.fixture(scope="module")
def runner(request, model_dir):
    r = ModelRunner(EngineConfig(model=model_dir, device="cpu", dtype="float32",
                                 attention=request.param, kv_cache_gb=1.0))  # fmt: skip
    yield r
    r.close()


# The default CPU backend at the smallest and a large step budget, sdpa (the fallback) between.
# A step's budget is shared by its decodes and chunks, so chunks end off block boundaries at
# every budget.
CASES = [("cpu_paged", 16), ("cpu_paged", 256), ("sdpa", 64)]


@pytest.mark.parametrize(("runner", "chunk_tokens"), CASES, indirect=["runner"])
def test_chunked_greedy_tokens_match_transformers(runner, references, chunk_tokens):
    config = EngineConfig(model=runner.config.model, device="cpu", max_num_seqs=8)
    engine = LLMEngine(config, runner=runner, chunk_tokens=chunk_tokens)
    mixed_before = runner.stats.num_mixed_steps
    prompts = [list(r.prompt.token_ids) for r in references]
    outputs = engine.generate(prompts, [r.params for r in references])
    mismatched = [r.prompt.name for r, out in zip(references, outputs, strict=True)
                  if out != r.tokens]  # fmt: skip
    assert not mismatched
    # prompts longer than the chunk ran in pieces, and some steps fused decodes with chunks
    assert max(len(p) for p in prompts) > 5 * chunk_tokens
    assert runner.stats.num_mixed_steps > mixed_before
    assert engine.block_manager.num_free_blocks == runner.num_blocks
