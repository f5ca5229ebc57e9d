"""SmolLM2 in bfloat16 on CPU against transformers in bfloat16 on the same CPU.

bf16 rounding differs between the two (oneDNN's GEMM blocking, fused kernels rounding once
where transformers rounds per op), so greedy decoding may part where two tokens are nearly
tied. The rule: every prompt matches token for token, or up to its first divergence, where
the engine's token is within NEAR_TIE of transformers' best logit at that step. Perplexity on
a fixed text (perf/perplexity.py) bounds the bf16 cost over the whole distribution."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from bucketserve.engine.config import EngineConfig, cpu_bf16_flags
from bucketserve.engine.llm_engine import LLMEngine
from bucketserve.engine.runner import ModelRunner
from bucketserve.engine.sampling_params import SamplingParams

from tests.parity.conftest import EOS_TOKEN_ID, MAX_NEW_TOKENS
from tests.parity.prompts import build_prompts

pytestmark = [
    pytest.mark.parity,
    pytest.mark.skipif(not cpu_bf16_flags(), reason="the CPU has no native bf16"),
]
# Both sides round logits to bf16: at |logit| in [16, 32) one step is 0.125, so two tokens a
# few steps apart are a tie that rounding elsewhere in the model may flip (transformers' own
# bf16 logits tie exactly at some divergences). Measured here: gaps 0 to 0.25 at the first
# divergence of 10 of the 23 prompts (the others match all 64 tokens).
NEAR_TIE = 0.5
TOP = 8  # transformers' top logits kept per step: the engine's token must be among them
MAX_PERPLEXITY_DELTA = 0.01  # |bf16 / fp32 - 1|; measured -0.02 %


@dataclass(frozen=True)
class Bf16Reference:
    """transformers' bf16 greedy tokens and, per step, its top-TOP (logit, token) pairs."""

    name: str
    prompt: list[int]
    tokens: list[int]
    top: list[dict[int, float]]  # per generated token: token id -> logit
    params: SamplingParams


@pytest.fixture(scope="module")
def bf16_references(model_dir) -> list[Bf16Reference]:
    """HF greedy generations in bfloat16, one prompt at a time (no padding)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()
    hf.generation_config.eos_token_id = None
    refs = []
    for prompt in build_prompts(tokenizer):
        ids = torch.tensor([prompt.token_ids])
        eos = EOS_TOKEN_ID if prompt.stops_at_eos else None
        config = GenerationConfig(max_new_tokens=MAX_NEW_TOKENS, do_sample=False,
                                  pad_token_id=EOS_TOKEN_ID, eos_token_id=eos)  # fmt: skip
        with torch.inference_mode():
            out = hf.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config,
                              return_dict_in_generate=True, output_logits=True)  # fmt: skip
        top = [dict(zip(t.indices.tolist(), t.values.tolist(), strict=True))
               for t in (row[0].float().topk(TOP) for row in out.logits)]  # fmt: skip
        params = SamplingParams(temperature=0, max_tokens=MAX_NEW_TOKENS,
                                ignore_eos=not prompt.stops_at_eos)  # fmt: skip
        tokens = out.sequences[0, ids.shape[1] :].tolist()
        refs.append(Bf16Reference(prompt.name, list(prompt.token_ids), tokens, top, params))
    return refs


@pytest.fixture(scope="module")
def bf16_runner(model_dir):
    r = ModelRunner(EngineConfig(model=model_dir, device="cpu", dtype="bfloat16", kv_cache_gb=0.5))
    yield r
    r.close()


def first_divergence(ours: list[int], ref: list[int]) -> int | None:
    """Index of the first differing token (a longer output differs where the shorter ends)."""
    for i, (a, b) in enumerate(zip(ours, ref, strict=False)):
        if a != b:
            return i
    return None if len(ours) == len(ref) else min(len(ours), len(ref))


def tie_gap(ref: Bf16Reference, ours: list[int], step: int) -> float:
    """transformers' best logit minus its logit for the engine's token at `step` (inf when
    that token is outside its top TOP); an engine output that ended there chose EOS."""
    top = ref.top[step] if step < len(ref.top) else {}
    token = ours[step] if step < len(ours) else EOS_TOKEN_ID
    return max(top.values()) - top[token] if token in top else float("inf")


@pytest.mark.parametrize("max_num_seqs", [1, 8])
def test_bf16_greedy_matches_transformers_bf16_up_to_near_ties(
    bf16_runner, bf16_references, max_num_seqs
):
    assert bf16_runner.dtype == torch.bfloat16 and bf16_runner.elementwise_impl == "cpp"
    config = EngineConfig(model=bf16_runner.config.model, device="cpu", max_num_seqs=max_num_seqs)
    engine = LLMEngine(config, runner=bf16_runner)
    refs = bf16_references
    outputs = engine.generate([r.prompt for r in refs], [r.params for r in refs])
    gaps = {}
    for ref, ours in zip(refs, outputs, strict=True):
        step = first_divergence(ours, ref.tokens)
        if step is not None:
            gaps[f"{ref.name}@{step}"] = round(tie_gap(ref, ours, step), 3)
    assert all(gap < NEAR_TIE for gap in gaps.values()), gaps
    assert len(gaps) <= len(refs) // 2, gaps  # most prompts agree token for token
    assert engine.block_manager.num_free_blocks == bf16_runner.num_blocks


def test_bf16_perplexity_within_one_percent_of_fp32(model_dir):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "perf"))
    from perplexity import perplexity, text_chunks
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
