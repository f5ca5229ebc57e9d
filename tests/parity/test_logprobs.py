"""Greedy log-probs from the engine's sampler equal transformers' log-softmax of its logits.

Its own small reference (10 prompts, 4 steps each, one cached HF forward per step) instead of
the session's greedy generations, so it stays cheap on a loaded machine."""

from __future__ import annotations

import pytest
import torch
from bucketserve.engine.block_manager import BlockManager
from bucketserve.engine.config import EngineConfig
from bucketserve.engine.runner import ModelRunner
from bucketserve.engine.sampling_params import SamplingParams
from bucketserve.engine.sequence import Sequence

from tests.parity.prompts import build_prompts

pytestmark = pytest.mark.parity
TOLERANCE = 1e-4
NUM_PROMPTS = 10
NUM_STEPS = 4  # prefill + 3 decode steps
TOP = 5


@pytest.fixture(scope="module")
def hf_steps(tokenizer, hf_model) -> list[tuple[list[int], list[torch.Tensor]]]:
    """(prompt ids, HF log-softmax [V] at each greedy step) for the first 10 parity prompts."""
    hf = hf_model
    out = []
    for prompt in build_prompts(tokenizer)[:NUM_PROMPTS]:
        ids, past, steps = torch.tensor([prompt.token_ids]), None, []
        with torch.inference_mode():
            for _ in range(NUM_STEPS):
                res = hf(ids, past_key_values=past, use_cache=True)
                logp = torch.log_softmax(res.logits[0, -1].double(), dim=-1)
                steps.append(logp)
                past, ids = res.past_key_values, logp.argmax().view(1, 1)
        out.append((list(prompt.token_ids), steps))
    return out


def test_greedy_logprobs_match_transformers(model_dir, hf_steps):
    runner = ModelRunner(EngineConfig(model=model_dir, device="cpu", dtype="float32", kv_cache_gb=0.5))  # fmt: skip
    bm = BlockManager(runner.num_blocks, runner.block_size)
    params = SamplingParams(temperature=0, max_tokens=NUM_STEPS, logprobs=TOP, ignore_eos=True)
    seqs = [Sequence(ids, params) for ids, _ in hf_steps]
    for seq in seqs:
        bm.allocate_for(seq)
    out, worst = runner.prefill_sampled(seqs), 0.0  # all 10 prompts in one packed batch
    for step in range(NUM_STEPS):
        for seq, (_, ref), tok, lp in zip(seqs, hf_steps, out.tokens, out.logprobs, strict=True):
            expected = ref[step]
            assert tok == int(expected.argmax())
            top = expected.topk(TOP)
            assert lp.top_ids == top.indices.tolist()
            errors = [abs(lp.logprob - expected[tok].item())]
            errors += [abs(a - b) for a, b in zip(lp.top_logprobs, top.values.tolist(), strict=True)]  # fmt: skip
            worst = max(worst, *errors)
            seq.append_token(tok)
            bm.ensure_slot(seq)
        if step + 1 < NUM_STEPS:
            out = runner.decode_sampled(seqs)
    print(f"largest |logprob - HF log_softmax| over {NUM_PROMPTS} prompts x {NUM_STEPS} steps: {worst:.2e}")  # fmt: skip
    assert worst <= TOLERANCE
    for seq in seqs:
        bm.release(seq)
    runner.close()
