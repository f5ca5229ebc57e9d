"""Prefix caching (SmolLM2, fp32, CPU): prompts sharing prefixes of many lengths give the same
greedy tokens with the cache on as with it off and as transformers, and the hits are counted."""

from __future__ import annotations

import inspect
import json.decoder

import pytest
import torch
from bucketserve.engine.config import EngineConfig
from bucketserve.engine.llm_engine import LLMEngine
from bucketserve.engine.runner import ModelRunner
from bucketserve.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.parity

MAX_TOKENS = 12
QUESTIONS = ["What does this code do?", "Name one function here.", "Is it fast?",
             "Summarise it.", "Who wrote it?"]  # fmt: skip


@pytest.fixture(scope="module")
def prompts(tokenizer) -> list[list[int]]:
    """22 prompts over one ~700-token source prefix: block-aligned (16-token blocks) and
    mid-block shared lengths, full hits (identical prompts), prompts that are prefixes of
    others, and prompts shorter than one block."""
    system = tokenizer(inspect.getsource(json.decoder)).input_ids[:700]
    q = [tokenizer("\nQ: " + text + "\nA:").input_ids for text in QUESTIONS]
    out = [system + q[0]]  # the first computes the prefix
    for i, n in enumerate((700, 688, 512, 500, 333, 17, 16, 15)):  # 688, 512, 16: aligned
        out.append(system[:n] + q[(i + 1) % len(q)])
    out += [system + q[0], system + q[0]]  # full hits, mid-block (700 + question)
    out += [system[:688], system[:688], system[:512]]  # block-aligned full hits, a prefix
    out += [system[:600], system[:600] + q[1], system[:300], system]  # prefix of another
    out += [q[2], q[2] + q[3], system[:3] + q[4], system[:100] + q[4]]
    return out


@pytest.fixture(scope="module")
def runner(model_dir):
    r = ModelRunner(EngineConfig(model=model_dir, device="cpu", dtype="float32",
                                 attention="cpu_paged", kv_cache_gb=0.5))  # fmt: skip
    yield r
    r.close()


def generate(runner, prompts, caching: bool, chunk_tokens: int = 256):
    config = EngineConfig(model=runner.config.model, device="cpu", max_num_seqs=8,
                          enable_prefix_caching=caching)  # fmt: skip
    engine = LLMEngine(config, runner=runner, chunk_tokens=chunk_tokens)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    return engine, engine.generate(prompts, params)


def hf_greedy(hf, prompts: list[list[int]]) -> list[list[int]]:
    outs = []
    for p in prompts:
        ids = torch.tensor([p])
        with torch.inference_mode():
            seq = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                              max_new_tokens=MAX_TOKENS, min_new_tokens=MAX_TOKENS,
                              pad_token_id=2, eos_token_id=None)  # fmt: skip
        outs.append(seq[0, len(p) :].tolist())
    return outs


def test_prefix_cache_tokens_match_caching_off_and_transformers(runner, prompts, hf_model):
    off_engine, off = generate(runner, prompts, caching=False)
    assert off_engine.num_cached_tokens == 0
    engine, on = generate(runner, prompts, caching=True)
    mismatched = [i for i, (a, b) in enumerate(zip(on, off, strict=True)) if a != b]
    assert not mismatched
    bm = engine.block_manager
    assert bm.num_hit_tokens >= 10 * 512  # most prompts found their prefix
    assert bm.num_free_blocks == runner.num_blocks and bm.num_evictable_blocks > 0
    # a second round finds everything cached: every prompt but the last token (a full hit)
    again = [prompts[0], prompts[11], prompts[14]]  # mid-block, aligned, a prefix of others
    hits_before = bm.num_hit_tokens
    assert engine.generate(again, SamplingParams(temperature=0, max_tokens=MAX_TOKENS,
                                                 ignore_eos=True)) == [on[0], on[11], on[14]]  # fmt: skip
    assert bm.num_hit_tokens - hits_before == sum((len(p) - 1) // 16 * 16 for p in again)
    picks = [0, 2, 5, 7, 9, 11, 13, 15, 19]
    assert hf_greedy(hf_model, [prompts[i] for i in picks]) == [on[i] for i in picks]
