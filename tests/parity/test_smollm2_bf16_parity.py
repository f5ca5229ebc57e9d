"""SmolLM2 in bfloat16 on CPU against transformers in bfloat16 on the same CPU: greedy tokens
equal up to near-ties (tests/parity/bf16_refs.py), and perplexity on a fixed text within 1 %
of float32 (perf/engine/perplexity.py)."""

from __future__ import annotations

import pytest
import torch
from bucketserve.engine.config import EngineConfig
from bucketserve.engine.llm_engine import LLMEngine
from bucketserve.engine.runner import ModelRunner

from tests.parity.bf16_refs import (
    NEAR_TIE,
    divergence_gaps,
    engine_bf16_skip_reason,
    hf_bf16_skip_reason,
)
from tests.parity.conftest import EOS_TOKEN_ID

pytestmark = [
    pytest.mark.parity,
    pytest.mark.skipif(
        engine_bf16_skip_reason() is not None, reason=str(engine_bf16_skip_reason())
    ),
]
MAX_PERPLEXITY_DELTA = 0.01  # |bf16 / fp32 - 1|; measured -0.02 %


@pytest.fixture(scope="module")
def bf16_runner(model_dir):
    r = ModelRunner(EngineConfig(model=model_dir, device="cpu", dtype="bfloat16", kv_cache_gb=0.5))
    yield r
    r.close()


@pytest.mark.skipif(hf_bf16_skip_reason() is not None, reason=str(hf_bf16_skip_reason()))
@pytest.mark.parametrize("max_num_seqs", [1, 8])
def test_bf16_greedy_matches_transformers_bf16_up_to_near_ties(
    bf16_runner, bf16_references, max_num_seqs
):
    assert bf16_runner.dtype == torch.bfloat16 and bf16_runner.elementwise_impl == "cpp"
    config = EngineConfig(model=bf16_runner.config.model, device="cpu", max_num_seqs=max_num_seqs)
    engine = LLMEngine(config, runner=bf16_runner)
    refs = bf16_references
    outputs = engine.generate([r.prompt for r in refs], [r.params for r in refs])
    gaps = divergence_gaps(refs, outputs, EOS_TOKEN_ID)
    assert all(gap < NEAR_TIE for gap in gaps.values()), gaps
    assert len(gaps) <= len(refs) // 2, gaps  # most prompts agree token for token
    assert engine.block_manager.num_free_blocks == bf16_runner.num_blocks


def test_bf16_perplexity_within_one_percent_of_fp32(model_dir):
    from bucketserve.bench.perplexity import perplexity, text_chunks
    from transformers import AutoTokenizer

    chunks = text_chunks(AutoTokenizer.from_pretrained(model_dir), num_chunks=4, length=128)
    result = {}
    for dtype in ("float32", "bfloat16"):
        runner = ModelRunner(EngineConfig(model=model_dir, device="cpu", dtype=dtype,
                                          kv_cache_gb=0.1, max_model_len=256))  # fmt: skip
        result[dtype] = perplexity(runner, chunks)
        runner.close()
    assert 1 < result["float32"] < 100  # a real language model on real text
    assert abs(result["bfloat16"] / result["float32"] - 1) < MAX_PERPLEXITY_DELTA, result
