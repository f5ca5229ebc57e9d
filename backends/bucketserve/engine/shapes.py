"""Model shape metadata: read from a HF config.json, or from the dummy-shape table."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from bucketserve.engine.shape_table import DUMMY_SHAPES

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}

SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3")


@dataclass(slots=True)
class ModelConfig:
    """Architecture facts the engine needs; built from a HF config dict."""

    model_type: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_model_len: int
    eos_token_ids: tuple[int, ...]
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    qk_norm: bool = False
    dtype: str = "float32"
    hf_config: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.model_type not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"model_type must be one of {SUPPORTED_ARCHITECTURES}, got {self.model_type!r}"
            )
        if self.num_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads})"
            )
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"dtype must be one of {tuple(DTYPE_BYTES)}, got {self.dtype!r}")

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V one token occupies across all layers."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * DTYPE_BYTES[self.dtype]

    @property
    def num_params(self) -> int:
        """Parameter count (for memory-floor estimates), without norms and biases."""
        d, q, kv = (
            self.hidden_size,
            self.num_heads * self.head_dim,
            self.num_kv_heads * self.head_dim,
        )
        per_layer = d * (q + 2 * kv) + q * d + 3 * d * self.intermediate_size
        embed = self.vocab_size * d * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * per_layer + embed

    def with_dtype(self, dtype: str) -> ModelConfig:
        """A copy with another KV/weights dtype."""
        return model_config_from_hf(self.hf_config, dtype=dtype)


def _eos_ids(value) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(value) if isinstance(value, list | tuple) else (int(value),)


def _max_model_len(hf: dict) -> int:
    max_len = int(hf.get("max_position_embeddings", 2048))
    # Without sliding-window attention we are exact only inside the window.
    window = hf.get("sliding_window")
    if window and hf.get("use_sliding_window", hf.get("model_type") == "mistral"):
        max_len = min(max_len, int(window))
    return max_len


def _rope_theta(hf: dict) -> float:
    # transformers 5 writes only `rope_parameters` (theta and scaling in one dict); 4.x writes
    # top-level rope_theta / rope_scaling. Reading only the 4.x keys silently gives theta=10000.
    # docs/platform-notes.md#p13-transformers-5-config-and-chat-template
    params = hf.get("rope_parameters") or {}
    return float(hf.get("rope_theta") or params.get("rope_theta") or 10000.0)


def _rope_scaling(hf: dict) -> dict | None:
    if hf.get("rope_scaling"):
        return hf["rope_scaling"]
    params = {k: v for k, v in (hf.get("rope_parameters") or {}).items() if k != "rope_theta"}
    rope_type = params.get("rope_type", params.get("type", "default"))
    return params if rope_type != "default" else None


def model_config_from_hf(hf: dict, dtype: str = "float32") -> ModelConfig:
    """Build a ModelConfig from a config.json dict."""
    model_type = hf.get("model_type", "llama")
    num_heads = int(hf["num_attention_heads"])
    return ModelConfig(
        model_type=model_type,
        num_layers=int(hf["num_hidden_layers"]),
        hidden_size=int(hf["hidden_size"]),
        intermediate_size=int(hf["intermediate_size"]),
        num_heads=num_heads,
        num_kv_heads=int(hf.get("num_key_value_heads") or num_heads),
        head_dim=int(hf.get("head_dim") or hf["hidden_size"] // num_heads),
        vocab_size=int(hf["vocab_size"]),
        max_model_len=_max_model_len(hf),
        eos_token_ids=_eos_ids(hf.get("eos_token_id")),
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-5)),
        rope_theta=_rope_theta(hf),
        rope_scaling=_rope_scaling(hf),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        attention_bias=model_type == "qwen2" or bool(hf.get("attention_bias", False)),
        qk_norm=model_type == "qwen3",
        dtype=dtype,
        hf_config=dict(hf),
    )


def dummy_model_config(shape: str, dtype: str = "bfloat16") -> ModelConfig:
    """ModelConfig of a named dummy shape; touches no weights."""
    if shape not in DUMMY_SHAPES:
        raise ValueError(f"dummy shape must be one of {sorted(DUMMY_SHAPES)}, got {shape!r}")
    return model_config_from_hf(DUMMY_SHAPES[shape], dtype=dtype)


def read_model_config(model_dir: str, dtype: str = "float32") -> ModelConfig:
    """ModelConfig of a local HF-style checkpoint directory."""
    with open(os.path.join(model_dir, "config.json")) as f:
        return model_config_from_hf(json.load(f), dtype=dtype)
