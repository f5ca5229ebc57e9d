"""Greedy output through the server equals Hugging Face transformers `generate`."""

from __future__ import annotations

import concurrent.futures as cf

import pytest
import torch

from .helpers import greedy_text

pytestmark = [pytest.mark.server, pytest.mark.parity]

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The three primary colors are",
    "Water boils at a temperature of",
    "import numpy as np\n\n# compute the mean of",
    "The quick brown fox",
    "In 1969, the first humans",
    "A haiku about the ocean:\n",
    "List of prime numbers: 2, 3, 5,",
    "Photosynthesis is the process by which",
    "SELECT name FROM users WHERE",
]
NEW_TOKENS = 32


@pytest.fixture(scope="module")
def reference(server):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(server.cfg.model_dir)
    model = AutoModelForCausalLM.from_pretrained(server.cfg.model_dir, torch_dtype=torch.float32)
    out = {}
    with torch.inference_mode():
        for p in PROMPTS:
            ids = tok(p, return_tensors="pt").input_ids
            gen = model.generate(
                ids, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=tok.eos_token_id
            )
            out[p] = tok.decode(gen[0, ids.shape[1] :], skip_special_tokens=True)
    return out


def test_server_greedy_equals_transformers(server, reference):
    def ask(prompt: str) -> str:
        return greedy_text(server, prompt, NEW_TOKENS)

    with cf.ThreadPoolExecutor(len(PROMPTS)) as pool:  # concurrent: batched prefill and decode
        got = dict(zip(PROMPTS, pool.map(ask, PROMPTS), strict=True))
    mismatches = {p: (got[p], reference[p]) for p in PROMPTS if got[p] != reference[p]}
    assert not mismatches, mismatches
