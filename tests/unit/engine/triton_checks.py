"""Run by test_triton_attention.py in a subprocess with TRITON_INTERPRET=1 (triton decides
at import time whether kernels are interpreted). Prints one JSON line of results."""

from __future__ import annotations

import json

import torch
from bucketserve.engine.attention import AttentionMetadata
from bucketserve.engine.block_manager import BlockManager
from bucketserve.engine.config import EngineConfig
from bucketserve.engine.runner import ModelRunner
from bucketserve.engine.sdpa_attention import SdpaBackend
from bucketserve.engine.triton_attention import TritonBackend

from tests.unit.engine.helpers import prefill_seqs, rel_err

CASES = [  # lengths, heads, kv heads, head_dim, block size
    ([1, 17, 40], 6, 2, 32, 16),  # partial blocks, groups of 3
    ([5, 64, 3], 9, 3, 64, 16),  # SmolLM2's head layout
    ([33], 4, 4, 24, 32),  # head_dim not a power of two, no GQA
]


def kernel_errors() -> list[float]:
    """Max |triton - SDPA| per case over scattered blocks."""
    errors, gen = [], torch.Generator().manual_seed(0)
    for lengths, heads, kv_heads, dim, block in CASES:
        k_cache = torch.randn(32, block, kv_heads, dim, generator=gen)
        v_cache = torch.randn(32, block, kv_heads, dim, generator=gen)
        ids, tables = torch.randperm(32, generator=gen).tolist(), []
        for n in lengths:
            tables.append([ids.pop() for _ in range(-(-n // block))])
        q = torch.randn(len(lengths), heads, dim, generator=gen)
        outs = []
        for backend in (TritonBackend(), SdpaBackend()):
            meta = AttentionMetadata(is_prefill=False, slot_mapping=torch.zeros(1),
                                     seq_lens=lengths, max_seqlen=max(lengths))  # fmt: skip
            backend.prepare_decode(
                meta, tables, lengths, block, lambda d, t: torch.tensor(d, dtype=t)
            )
            outs.append(backend.decode(q, k_cache, v_cache, meta, dim**-0.5))
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
