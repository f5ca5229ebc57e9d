"""Session fixtures: the SmolLM2 model, prompts, and transformers' reference generations."""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest
import torch
from bucketserve.engine.loader import resolve_model
from bucketserve.engine.sampling_params import SamplingParams

from tests.parity.bf16_refs import Bf16Reference, hf_bf16_references
from tests.parity.prompts import Prompt, build_prompts

# 32 greedy tokens per prompt (23 prompts): 736 tokens compared per engine configuration; at 64
# the references and the engine runs cost twice the CI time for the same code paths.
MAX_NEW_TOKENS = 32
NUM_LOGIT_STEPS = 4  # HF logits kept per prompt (prefill + 3 decode steps)
EOS_TOKEN_ID = 2
# One torch thread by default: on a shared 2-core machine OpenMP's spin-waiting makes two
# threads 5-10x slower than one; alone, two threads are only ~1.3x faster.
TORCH_THREADS = int(os.environ.get("BUCKETSERVE_TEST_THREADS", "1"))


@dataclass(frozen=True)
class Reference:
    """transformers' greedy output and first-step logits for one prompt."""

    prompt: Prompt
    tokens: list[int]
    logits: torch.Tensor  # [min(NUM_LOGIT_STEPS, len(tokens)), V] float32

    @property
    def params(self) -> SamplingParams:
        """The engine's equivalent of the reference's generation settings."""
        return SamplingParams(temperature=0, max_tokens=MAX_NEW_TOKENS,
                              ignore_eos=not self.prompt.stops_at_eos)  # fmt: skip


@pytest.fixture(scope="session", autouse=True)
def torch_threads():
    """Pin torch's CPU threads for the parity session (restored afterwards)."""
    old = torch.get_num_threads()
    torch.set_num_threads(TORCH_THREADS)
    yield TORCH_THREADS
    torch.set_num_threads(old)


@pytest.fixture(scope="session")
def model_dir() -> str:
    """The converted SmolLM2 checkpoint directory."""
    return resolve_model("smollm2")


@pytest.fixture(scope="session")
def tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="session")
def hf_model(model_dir):
    """transformers' float32 model, loaded once for every reference of the session."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None  # set per call: raw prompts ignore EOS
    return hf


@pytest.fixture(scope="session")
def references(tokenizer, hf_model) -> list[Reference]:
    """HF greedy generations, computed once per session (one prompt at a time, no padding)."""
    from transformers import GenerationConfig

    hf = hf_model
    refs = []
    for prompt in build_prompts(tokenizer):
        ids = torch.tensor([prompt.token_ids])
        config = GenerationConfig(
            max_new_tokens=MAX_NEW_TOKENS, do_sample=False, pad_token_id=EOS_TOKEN_ID,
            eos_token_id=EOS_TOKEN_ID if prompt.stops_at_eos else None,
        )  # fmt: skip
        with torch.inference_mode():
            out = hf.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config,
                              return_dict_in_generate=True, output_logits=True)  # fmt: skip
        tokens = out.sequences[0, ids.shape[1] :].tolist()
        logits = torch.cat(out.logits[:NUM_LOGIT_STEPS]).float()
        refs.append(Reference(prompt, tokens, logits))
    return refs


@pytest.fixture(scope="session")
def bf16_references(model_dir) -> list[Bf16Reference]:
    """transformers' greedy generations in bfloat16 (for the bf16 engine's near-tie rule)."""
    return hf_bf16_references(model_dir, MAX_NEW_TOKENS, EOS_TOKEN_ID)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative logit error: max|a - b| / max|b| over one row."""
    return float((a - b).abs().max() / b.abs().max())
