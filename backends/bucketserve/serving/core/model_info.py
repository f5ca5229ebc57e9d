"""What the serving models need to know about the served model: tokenizer and context length."""

from __future__ import annotations

import json
import os
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


# Where AutoTokenizer would load the plain tokenizers backend, it is loaded directly: AutoTokenizer
# reads the model's config through transformers' model registry, which imports torch (5-6 s of
# CPU per process on a 2-core machine, for each preprocessing instance and the edge). The rule is
# AutoTokenizer's for these files (transformers 5): a tokenizer_config naming the backend, no
# remote code, and a model type AutoTokenizer maps to no class of its own (qwen2's names
# Qwen2Tokenizer whatever the file says). Anything else goes through AutoTokenizer.
# docs/platform-notes.md#p35-imports-that-cost-seconds-at-start-up
PLAIN_TOKENIZER_CLASSES = frozenset({"TokenizersBackend", "PreTrainedTokenizerFast"})
PLAIN_TOKENIZER_MODEL_TYPES = frozenset({"llama"})


def loads_plain_tokenizer(tokenizer_dir: str) -> bool:
    """AutoTokenizer would load `tokenizer_dir`'s tokenizer as transformers' TokenizersBackend."""
    try:
        with open(os.path.join(tokenizer_dir, "tokenizer_config.json")) as f:
            tok = json.load(f)
        with open(os.path.join(tokenizer_dir, "config.json")) as f:
            model_type = json.load(f).get("model_type")
    except (OSError, ValueError):
        return False
    return (
        tok.get("tokenizer_class") in PLAIN_TOKENIZER_CLASSES
        and "auto_map" not in tok
        and model_type in PLAIN_TOKENIZER_MODEL_TYPES
        and os.path.isfile(os.path.join(tokenizer_dir, "tokenizer.json"))
    )


def load_tokenizer(info: ModelInfo):
    """The model's tokenizer, as AutoTokenizer.from_pretrained(info.tokenizer_dir) loads it."""
    if loads_plain_tokenizer(info.tokenizer_dir):
        from transformers.tokenization_utils_tokenizers import TokenizersBackend

        return TokenizersBackend.from_pretrained(info.tokenizer_dir)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(info.tokenizer_dir)
