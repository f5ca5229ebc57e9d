"""What the serving models need to know about the served model: tokenizer and context length."""

from __future__ import annotations

from dataclasses import dataclass

from bucketserve.serving.config import ServeConfig


@dataclass(slots=True, frozen=True)
class ModelInfo:
    """Tokenizer location and the context limit requests are validated against."""

    tokenizer_dir: str
    max_model_len: int


def model_info(cfg: ServeConfig) -> ModelInfo:
    from bucketserve.engine.loader import dummy_shape, is_dummy, resolve_model
    from bucketserve.engine.shapes import dummy_model_config, read_model_config

    tok_dir = resolve_model(cfg.model_dir)  # for dummy shapes: SmolLM2's tokenizer
    if is_dummy(cfg.model_dir):
        ctx = dummy_model_config(dummy_shape(cfg.model_dir)).max_model_len
    else:
        ctx = read_model_config(cfg.model_dir).max_model_len
    if cfg.max_model_len is not None:
        ctx = min(ctx, cfg.max_model_len)
    return ModelInfo(tok_dir, ctx)


def load_tokenizer(info: ModelInfo):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(info.tokenizer_dir)
