"""Llama-family decoder (Llama 2/3, Mistral, Qwen2, Qwen3, SmolLM2) in plain PyTorch.

Parameter names follow Hugging Face, so a HF state dict loads directly. Tokens arrive packed:
one flat [T] batch of all sequences; attention reads the paged KV cache through the backend.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bucketserve.engine.attention import AttentionMetadata, store_kv
from bucketserve.engine.rope import apply_rope, rope_cache
from bucketserve.engine.shapes import ModelConfig


class RMSNorm(nn.Module):
    """RMSNorm computed in float32 like HF's LlamaRMSNorm."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class Attention(nn.Module):
    """Grouped-query attention with optional qkv bias (Qwen2) and q/k norms (Qwen3)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        d, hd = config.hidden_size, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, hd
        bias = config.attention_bias
        self.q_proj = nn.Linear(d, self.num_heads * hd, bias=bias)
        self.k_proj = nn.Linear(d, self.num_kv_heads * hd, bias=bias)
        self.v_proj = nn.Linear(d, self.num_kv_heads * hd, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * hd, d, bias=False)
        if config.qk_norm:
            self.q_norm = RMSNorm(hd, config.rms_norm_eps)
            self.k_norm = RMSNorm(hd, config.rms_norm_eps)
        self.scale = hd**-0.5
        self.qkv_proj: nn.Module | None = None  # set by fusion.fuse_projections

    def _qkv(self, x: torch.Tensor):
        if self.qkv_proj is None:
            return self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        return self.qkv_proj(x).split([q_size, kv_size, kv_size], dim=-1)

    def forward(self, x, cos, sin, meta: AttentionMetadata, k_cache, v_cache, backend):
        """x: [T, D] -> [T, D]; writes this step's K/V into the caches."""
        num_tokens = x.shape[0]
        q, k, v = self._qkv(x)
        q = q.view(num_tokens, self.num_heads, self.head_dim)  # [T, H, hd]
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)  # [T, KVH, hd]
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self._rope_and_store(q, k, v, cos, sin, k_cache, v_cache, meta.slot_mapping)
        out = backend.forward(q, k, v, k_cache, v_cache, meta, self.scale)  # [T, H, hd]
        return self.o_proj(out.reshape(num_tokens, -1))

    def _rope_and_store(self, q, k, v, cos, sin, k_cache, v_cache, slot_mapping):
        """Rotate q [T, H, hd] and k [T, KVH, hd] (cos, sin: [T, 1, hd]), cache k and v."""
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        store_kv(k, v, k_cache, v_cache, slot_mapping)
        return q, k


class MLP(nn.Module):
    """SwiGLU feed-forward."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        d, f = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(d, f, bias=False)
        self.up_proj = nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)
        self.gate_up_proj: nn.Module | None = None  # set by fusion.fuse_projections

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, D] -> [T, D]."""
        if self.gate_up_proj is None:
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return self.down_proj(self._act_and_mul(self.gate_up_proj(x)))

    def _act_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """gate_up: [T, 2F] -> silu(gate) * up [T, F]."""
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up


class DecoderLayer(nn.Module):
    """Pre-norm attention + MLP block."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.self_attn = Attention(config)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, cos, sin, meta, k_cache, v_cache, backend):
        """x: [T, D] -> [T, D]."""
        h = x + self.self_attn(self.input_layernorm(x), cos, sin, meta, k_cache, v_cache, backend)
        return h + self.mlp(self.post_attention_layernorm(h))


class Backbone(nn.Module):
    """Embeddings, decoder layers and final norm (HF's `model.` prefix)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        # _weight: no random init (the loader assigns every weight); on the meta device
        # Embedding's normal_ would import torch._dynamo, 3-4 s of each engine's start-up
        # (docs/platform-notes.md#p35-imports-that-cost-seconds-at-start-up)
        empty = torch.empty(config.vocab_size, config.hidden_size)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, _weight=empty)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class CausalLM(nn.Module):
    """Decoder-only language model over a paged KV pool."""

    def __init__(self, config: ModelConfig, max_len: int) -> None:
        super().__init__()
        self.config = config
        self.max_len = max_len
        self.model = Backbone(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.rope_cos: torch.Tensor | None = None  # [max_len, head_dim] fp32
        self.rope_sin: torch.Tensor | None = None

    def init_rope(self, device) -> None:
        """Build the cos/sin tables (after weights are placed on `device`)."""
        self.rope_cos, self.rope_sin = rope_cache(self.config, self.max_len, device)

    def tie_weights(self) -> None:
        """Share lm_head with the input embeddings when the config says so."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids, positions, meta: AttentionMetadata, pool, backend):
        """input_ids, positions: [T] -> hidden [T, D]; pool: [L, 2, N, bs, KVH, hd]."""
        x = self.model.embed_tokens(input_ids)  # [T, D]
        cos = self.rope_cos[positions].unsqueeze(1).to(x.dtype)  # [T, 1, hd]
        sin = self.rope_sin[positions].unsqueeze(1).to(x.dtype)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, meta, pool[i, 0], pool[i, 1], backend)
        return self.model.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [N, D] -> logits [N, V] in float32."""
        return self.lm_head(hidden).float()
