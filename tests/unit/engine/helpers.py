"""Shared helpers for engine unit tests: tiny HF checkpoints and runner setup."""

from __future__ import annotations

import torch
from bucketserve.engine.block_manager import BlockManager
from bucketserve.engine.config import EngineConfig
from bucketserve.engine.runner import ModelRunner
from bucketserve.engine.sequence import Sequence
from transformers import AutoConfig, AutoModelForCausalLM

TINY = dict(
    hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, vocab_size=300, max_position_embeddings=256, eos_token_id=2,
    rms_norm_eps=1e-5,
)  # fmt: skip

ARCHS = {
    "llama": dict(model_type="llama", rope_theta=10000.0),
    "llama3": dict(
        model_type="llama",
        rope_theta=500000.0,
        tie_word_embeddings=True,
        rope_scaling=dict(
            rope_type="llama3",
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=64,
        ),
    ),  # fmt: skip
    "mistral": dict(model_type="mistral", sliding_window=None),
    "qwen2": dict(model_type="qwen2", tie_word_embeddings=True),
    "qwen3": dict(model_type="qwen3", head_dim=32),
}


def make_hf_checkpoint(arch: str, path) -> torch.nn.Module:
    """Save a random tiny HF model of `arch` to `path`; returns the HF model (float32, eval)."""
    fields = dict(TINY, **ARCHS[arch])
    config = AutoConfig.for_model(**fields)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        config, dtype=torch.float32, attn_implementation="sdpa"
    )
    with torch.no_grad():  # random norms and biases exercise the weight mapping
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(path)
    return model.eval()


def prefill_seqs(runner, bm: BlockManager, prompts: list[list[int]]) -> list[Sequence]:
    """Sequences with blocks allocated for their prompts."""
    seqs = [Sequence(p) for p in prompts]
    for s in seqs:
        bm.allocate_for(s)
    return seqs


def step_logits(runner, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(prefill logits, one decode step's logits after token 7) of `prompts`; closes runner."""
    bm = BlockManager(runner.num_blocks, runner.block_size)
    seqs = prefill_seqs(runner, bm, prompts)
    prefill = runner.prefill_logits(seqs)
    for seq in seqs:
        seq.append_token(7)
        bm.ensure_slot(seq)
    decode = runner.decode_logits(seqs)
    runner.close()
    return prefill, decode


def fast_and_eager_logits(model: str, check, **config) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(fast, eager) pairs of step_logits: the CPU fast path (C++ kernels, fused oneDNN linears)
    and the plain HF layout (sdpa), each runner first passed to check(runner, fast)."""
    prompts = [list(range(10, 10 + n)) for n in (1, 4, 9, 30)]
    logits = {}
    for fast in (True, False):
        runner = ModelRunner(EngineConfig(model=model, device="cpu", num_blocks=64, block_size=4,
                                          optimize_weights=fast,
                                          attention="auto" if fast else "sdpa", **config))  # fmt: skip
        check(runner, fast)
        logits[fast] = step_logits(runner, prompts)
    return list(zip(logits[True], logits[False], strict=True))


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max|a - b| / max|b|."""
    return float((a - b).abs().max() / b.abs().max())


def scattered_paged_cache(lengths, block, kv_heads, head_dim, gen, num_blocks):
    """Random K/V caches [num_blocks, block, KVH, D] and one block table per sequence, the
    tables taking blocks from a shuffled order so each sequence's blocks are scattered."""
    k_cache = torch.randn(num_blocks, block, kv_heads, head_dim, generator=gen)
    v_cache = torch.randn(num_blocks, block, kv_heads, head_dim, generator=gen)
    ids = torch.randperm(num_blocks, generator=gen).tolist()
    tables, start = [], 0
    for n in lengths:
        need = -(-n // block)
        tables.append(ids[start : start + need])
        start += need
    return k_cache, v_cache, tables


def paged_decode(backend, q, k_cache, v_cache, tables, lengths):
    """One decode attention call through `backend`: q [B, H, D] -> [B, H, D]."""
    from bucketserve.engine.attention import AttentionMetadata

    meta = AttentionMetadata(is_prefill=False, slot_mapping=torch.zeros(len(lengths)),
                             seq_lens=lengths, max_seqlen=max(lengths))  # fmt: skip
    to_tensor = lambda data, dtype: torch.tensor(data, dtype=dtype)  # noqa: E731
    backend.prepare_decode(meta, tables, lengths, k_cache.shape[1], to_tensor)
    return backend.decode(q, k_cache, v_cache, meta, scale=q.shape[-1] ** -0.5)
