"""Run by test_triton_attention.py in a subprocess with TRITON_INTERPRET=1 (triton decides
at import time whether kernels are interpreted). Prints one JSON line of results."""

from __future__ import annotations

import json

import torch
from bucketserve.engine.block_manager import BlockManager
from bucketserve.engine.config import EngineConfig
from bucketserve.engine.runner import ModelRunner
from bucketserve.engine.sdpa_attention import SdpaBackend
from bucketserve.engine.triton_attention import TritonBackend

from tests.unit.engine.helpers import paged_decode, prefill_seqs, rel_err, scattered_paged_cache

CASES = [  # lengths, heads, kv heads, head_dim, block size
    ([1, 17, 40], 6, 2, 32, 16),  # partial blocks, groups of 3
    ([5, 64, 3], 9, 3, 64, 16),  # SmolLM2's head layout
    ([33], 4, 4, 24, 32),  # head_dim not a power of two, no GQA
]


def kernel_errors() -> list[float]:
    """Max |triton - SDPA| per case over scattered blocks."""
    errors, gen = [], torch.Generator().manual_seed(0)
    for lengths, heads, kv_heads, dim, block in CASES:
        k_cache, v_cache, tables = scattered_paged_cache(lengths, block, kv_heads, dim, gen, 32)
        q = torch.randn(len(lengths), heads, dim, generator=gen)
        outs = [paged_decode(b, q, k_cache, v_cache, tables, lengths)
                for b in (TritonBackend(), SdpaBackend())]  # fmt: skip
        errors.append(float((outs[0] - outs[1]).abs().max()))
    return errors


def runner_error() -> float:
    """dummy:tiny decode logits with attention='triton' vs the default CPU path."""
    logits = []
    for attention in ("triton", "auto"):
        runner = ModelRunner(EngineConfig(model="dummy:tiny", device="cpu", num_blocks=64,
                                          block_size=16, attention=attention))  # fmt: skip
        bm = BlockManager(runner.num_blocks, runner.block_size)
        seqs = prefill_seqs(runner, bm, [list(range(10, 10 + n)) for n in (1, 20, 47)])
        runner.prefill(seqs)
        for seq in seqs:
            seq.append_token(5)
            bm.ensure_slot(seq)
        logits.append(runner.decode_logits(seqs))
        runner.close()
    return rel_err(logits[0], logits[1])


if __name__ == "__main__":
    print(json.dumps({"kernel": kernel_errors(), "runner": runner_error()}))
