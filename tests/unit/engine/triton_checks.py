"""Run by test_triton_attention.py in a subprocess with TRITON_INTERPRET=1 (triton decides
at import time whether kernels are interpreted). Prints one JSON line of results."""

from __future__ import annotations

import json

import torch
from bucketserve.engine.attention.sdpa import SdpaBackend
from bucketserve.engine.attention.triton_paged import TritonBackend
from bucketserve.engine.block_manager import BlockManager
from bucketserve.engine.config import EngineConfig
from bucketserve.engine.runner import ModelRunner

from tests.unit.engine.helpers import paged_decode, prefill_seqs, rel_err, scattered_paged_cache

CASES = [  # lengths, heads, kv heads, head_dim, block size
    ([1, 17, 40], 6, 2, 32, 16),  # partial blocks, groups of 3
    ([5, 64, 3], 9, 3, 64, 16),  # SmolLM2's head layout
    ([33], 4, 4, 24, 32),  # head_dim not a power of two, no GQA
    ([300, 5], 4, 2, 32, 16),  # 16 context splits: uneven, some empty
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


def elementwise_errors() -> dict[str, float]:
    """Max |triton - torch reference| of the fused RMSNorm, rope + KV store and SiLU-and-mul."""
    from bucketserve.engine import triton_ops
    from bucketserve.engine.attention import store_kv
    from bucketserve.engine.model import RMSNorm
    from bucketserve.engine.rope import apply_rope

    torch.set_grad_enabled(False)
    gen = torch.Generator().manual_seed(1)
    errors = {}
    x, norm = torch.randn(5, 48, generator=gen), RMSNorm(48, 1e-5)
    norm.weight.data = torch.randn(48, generator=gen)
    errors["rms_norm"] = float((triton_ops.rms_norm(x, norm.weight, 1e-5) - norm(x)).abs().max())
    gate_up = torch.randn(3, 2 * 40, generator=gen)
    ref = torch.nn.functional.silu(gate_up[:, :40]) * gate_up[:, 40:]
    errors["silu_and_mul"] = float((triton_ops.silu_and_mul(gate_up) - ref).abs().max())
    heads, kv_heads, dim, tokens = 6, 2, 16, 4
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, generator=gen)  # fused layout
    q, k, v = (t.view(tokens, -1, dim) for t in qkv.split([heads * dim, kv_heads * dim,
                                                           kv_heads * dim], -1))  # fmt: skip
    cos, sin = torch.randn(tokens, dim, generator=gen), torch.randn(tokens, dim, generator=gen)
    slots = torch.tensor([9, 2, 30, 17])
    caches = [torch.zeros(8, 4, kv_heads, dim) for _ in range(4)]
    ref_q, ref_k = apply_rope(q, cos[:, None], sin[:, None]), apply_rope(k, cos[:, None],
                                                                         sin[:, None])  # fmt: skip
    store_kv(ref_k, v, caches[0], caches[1], slots)
    triton_ops.rope_and_store(q, k, v, cos, sin, caches[2], caches[3], slots)
    errors["rope_and_store"] = max(float((a - b).abs().max()) for a, b in
                                   ((q, ref_q), (k, ref_k), (caches[2], caches[0]),
                                    (caches[3], caches[1])))  # fmt: skip
    return errors


def runner_error() -> dict:
    """dummy:tiny decode logits with attention='triton' (Triton decode, fused element-wise
    kernels, the static decode step) vs the default CPU path."""
    logits, paths = [], []
    for attention in ("triton", "auto"):
        runner = ModelRunner(EngineConfig(model="dummy:tiny", device="cpu", dtype="float32",
                                          num_blocks=64, block_size=16, attention=attention))  # fmt: skip
        bm = BlockManager(runner.num_blocks, runner.block_size)
        seqs = prefill_seqs(runner, bm, [list(range(10, 10 + n)) for n in (1, 20, 47)])
        runner.prefill(seqs)
        for seq in seqs:
            seq.append_token(5)
            bm.ensure_slot(seq)
        logits.append(runner.decode_logits(seqs))
        paths.append([runner.elementwise_impl, runner._graphs is not None])
        runner.close()
    return {"err": rel_err(logits[0], logits[1]), "paths": paths}


def chunked_tokens() -> dict:
    """Greedy tokens of chunked prefill fused with decodes (chunks of 8 tokens, the Triton
    decode kernel on the decode rows) against whole prompts through the default CPU path."""
    from bucketserve.engine.llm_engine import LLMEngine
    from bucketserve.engine.sampling_params import SamplingParams

    prompts = [list(range(10, 10 + n)) for n in (1, 20, 47, 9)]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    outs, mixed = [], []
    for attention, chunk in (("triton", 8), ("auto", 4096)):
        config = EngineConfig(model="dummy:tiny", device="cpu", dtype="float32", num_blocks=64, block_size=16,
                              attention=attention)  # fmt: skip
        engine = LLMEngine(config, chunk_tokens=chunk)
        outs.append(engine.generate(prompts, params))
        mixed.append(engine.runner.stats.num_mixed_steps)
        engine.close()
    return {"equal": outs[0] == outs[1], "mixed_steps": mixed}


if __name__ == "__main__":
    print(json.dumps({"kernel": kernel_errors(), "elementwise": elementwise_errors(),
                      "runner": runner_error(), "chunked": chunked_tokens()}))  # fmt: skip
