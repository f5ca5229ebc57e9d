"""Greedy log-probs from the engine's sampler equal transformers' log-softmax of its logits."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from bucketserve.engine.block_manager import BlockManager
from bucketserve.engine.config import EngineConfig
from bucketserve.engine.runner import ModelRunner
from bucketserve.engine.sequence import Sequence

from tests.parity.conftest import NUM_LOGIT_STEPS

pytestmark = pytest.mark.parity
TOLERANCE = 1e-4
NUM_PROMPTS = 10
TOP = 5


@pytest.fixture(scope="module")
def runner(model_dir):
    r = ModelRunner(EngineConfig(model=model_dir, device="cpu", dtype="float32", kv_cache_gb=1.0))
    yield r
    r.close()


def test_greedy_logprobs_match_transformers(runner, references):
    refs = references[:NUM_PROMPTS]
    bm = BlockManager(runner.num_blocks, runner.block_size)
    seqs = [Sequence(list(r.prompt.token_ids), replace(r.params, logprobs=TOP)) for r in refs]
    for seq in seqs:
        bm.allocate_for(seq)
    out = runner.prefill_sampled(seqs)  # one packed batch
    worst = 0.0
    for step in range(NUM_LOGIT_STEPS):
        active = [i for i, r in enumerate(refs) if len(r.logits) > step]
        for i in active:
            expected = torch.log_softmax(refs[i].logits[step].double(), dim=-1)
            lp = out.logprobs[active.index(i)]
            assert out.tokens[active.index(i)] == refs[i].tokens[step]
            worst = max(worst, abs(lp.logprob - expected[refs[i].tokens[step]].item()))
            top = expected.topk(TOP)
            assert lp.top_ids == top.indices.tolist()
            worst = max(worst, max(abs(a - b) for a, b in zip(lp.top_logprobs, top.values.tolist(), strict=True)))  # fmt: skip
        still = [i for i in active if len(refs[i].logits) > step + 1]
        for i in still:
            seqs[i].append_token(refs[i].tokens[step])
            bm.ensure_slot(seqs[i])
        if not still:
            break
        out = runner.decode_sampled([seqs[i] for i in still])
        active = still
    print(f"largest |logprob - HF log_softmax| over {NUM_PROMPTS} prompts: {worst:.2e}")
    assert worst <= TOLERANCE
    for seq in seqs:
        bm.release(seq)
