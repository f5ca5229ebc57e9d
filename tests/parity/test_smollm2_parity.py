"""SmolLM2 (fp32, CPU): same greedy tokens and logits as transformers."""

from __future__ import annotations

import pytest
from bucketserve.engine.block_manager import BlockManager
from bucketserve.engine.config import EngineConfig
from bucketserve.engine.llm_engine import LLMEngine
from bucketserve.engine.runner import ModelRunner
from bucketserve.engine.sequence import Sequence

from tests.parity.conftest import MAX_NEW_TOKENS, NUM_LOGIT_STEPS, rel_err

pytestmark = pytest.mark.parity
LOGIT_TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def runner(model_dir):
    r = ModelRunner(EngineConfig(model=model_dir, device="cpu", dtype="float32", kv_cache_gb=1.0))
    yield r
    r.close()


def test_prompt_set_is_varied(references):
    lengths = [len(r.prompt.token_ids) for r in references]
    assert len(references) >= 20 and min(lengths) == 1 and max(lengths) >= 1400
    assert any(r.prompt.stops_at_eos for r in references)
    # some references end at EOS before the limit, others run to it: both stop rules are compared
    assert any(len(r.tokens) < MAX_NEW_TOKENS for r in references)
    assert any(len(r.tokens) == MAX_NEW_TOKENS for r in references)


@pytest.mark.parametrize("max_num_seqs", [1, 32])  # one at a time; 46 sequences over 32 rows
def test_greedy_tokens_match_transformers(runner, references, max_num_seqs):
    config = EngineConfig(model=runner.config.model, device="cpu", max_num_seqs=max_num_seqs)
    engine = LLMEngine(config, runner=runner)
    refs = references * 2 if max_num_seqs == 32 else references  # enough to fill 32 rows
    outputs = engine.generate([list(r.prompt.token_ids) for r in refs], [r.params for r in refs])
    mismatched = [r.prompt.name for r, out in zip(refs, outputs, strict=True) if out != r.tokens]
    assert not mismatched
    assert runner.stats.last_batch_size <= max_num_seqs
    assert engine.block_manager.num_free_blocks == runner.num_blocks


def test_prefill_and_decode_logits_match_transformers(runner, references):
    bm = BlockManager(runner.num_blocks, runner.block_size)
    seqs = [Sequence(list(r.prompt.token_ids), r.params) for r in references]
    for seq in seqs:
        bm.allocate_for(seq)
    logits = runner.prefill_logits(seqs)  # every prompt in one packed batch
    errors = {
        r.prompt.name: rel_err(row, r.logits[0]) for r, row in zip(references, logits, strict=True)
    }
    for step in range(1, NUM_LOGIT_STEPS):
        active = [(r, s) for r, s in zip(references, seqs, strict=True) if len(r.logits) > step]
        for ref, seq in active:
            seq.append_token(ref.tokens[step - 1])
            bm.ensure_slot(seq)
        logits = runner.decode_logits([s for _, s in active])
        for (ref, _), row in zip(active, logits, strict=True):
            errors[f"{ref.prompt.name}@{step}"] = rel_err(row, ref.logits[step])
    for seq in seqs:
        bm.release(seq)
    worst = max(errors, key=errors.get)
    assert errors[worst] < LOGIT_TOLERANCE, (worst, errors[worst])
    assert bm.num_free_blocks == runner.num_blocks
