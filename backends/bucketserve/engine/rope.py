"""Rotary position embeddings (default, linear and llama3 scaling), HF-compatible numerics."""

from __future__ import annotations

import math

import torch

from bucketserve.engine.shapes import ModelConfig


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    # Same formula as transformers' _compute_llama3_parameters.
    factor = scaling["factor"]
    low_freq_factor = scaling["low_freq_factor"]
    high_freq_factor = scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    low_freq_wavelen = old_len / low_freq_factor
    high_freq_wavelen = old_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def inv_frequencies(config: ModelConfig) -> torch.Tensor:
    """Inverse frequencies [head_dim // 2] in float32, with the config's rope scaling."""
    dim = config.head_dim
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    inv_freq = 1.0 / (config.rope_theta**exponents)
    scaling = config.rope_scaling or {}
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        return inv_freq / scaling["factor"]
    if rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, scaling)
    raise ValueError(f"rope_scaling.rope_type must be default, linear or llama3, got {rope_type!r}")


def rope_cache(config: ModelConfig, max_len: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin tables [max_len, head_dim] in float32."""
    inv_freq = inv_frequencies(config).to(device)
    positions = torch.arange(max_len, device=device, dtype=torch.float32)
    freqs = torch.outer(positions, inv_freq)  # [max_len, head_dim // 2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [max_len, head_dim]
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, H, D]; cos, sin: [T, 1, D] (already in x's dtype)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
