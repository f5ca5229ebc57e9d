"""transformers 5.x formats: `rope_parameters` in config.json, dict-like chat template output."""

from __future__ import annotations

import sys
from unittest import mock

import pytest
import torch
from bucketserve.engine.rope import inv_frequencies
from bucketserve.engine.shapes import model_config_from_hf

LLAMA31 = dict(
    model_type="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
    num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
    max_position_embeddings=131072, eos_token_id=128001,
)  # fmt: skip
SCALING = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
               original_max_position_embeddings=8192)  # fmt: skip


def test_v5_rope_parameters_read_like_v4_keys():
    v4 = model_config_from_hf(dict(LLAMA31, rope_theta=500000.0, rope_scaling=SCALING))
    v5 = model_config_from_hf(dict(LLAMA31, rope_parameters=dict(SCALING, rope_theta=500000.0)))
    assert v5.rope_theta == 500000.0
    assert v5.rope_scaling == SCALING
    assert torch.equal(inv_frequencies(v4), inv_frequencies(v5))


def test_v5_default_rope_has_no_scaling():
    mc = model_config_from_hf(dict(LLAMA31, rope_parameters=dict(rope_type="default",
                                                                  rope_theta=1e6)))  # fmt: skip
    assert (mc.rope_theta, mc.rope_scaling) == (1e6, None)


def test_v5_saved_llama3_config_round_trips(tmp_path):
    transformers = pytest.importorskip("transformers")
    from bucketserve.engine.shapes import read_model_config

    cfg = transformers.AutoConfig.for_model(
        **dict(LLAMA31, num_hidden_layers=1, rope_theta=500000.0, rope_scaling=SCALING)
    )
    cfg.save_pretrained(tmp_path)  # v4 or v5 layout, whichever is installed
    mc = read_model_config(str(tmp_path))
    assert mc.rope_theta == 500000.0 and mc.rope_scaling["rope_type"] == "llama3"


class _V5Tokenizer:
    """apply_chat_template as transformers 5 has it: tokenize=True returns a dict-like
    encoding unless return_dict=False."""

    chat_template = "x"

    def apply_chat_template(self, messages, add_generation_prompt=False, tokenize=True,
                            return_dict=True):  # fmt: skip
        ids = [1, 2, 3]
        return {"input_ids": ids, "attention_mask": [1, 1, 1]} if return_dict else ids


def test_preprocess_chat_template_ids_under_v5(monkeypatch):
    # The Triton stub module exists only inside tritonserver: a stand-in whose every attribute
    # is a mock, and the serving modules imported against it are dropped afterwards.
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", mock.MagicMock())
    before = set(sys.modules)
    try:
        from bucketserve.serving.models.preprocess import Preprocessor

        pre = object.__new__(Preprocessor)
        pre.tokenizer = _V5Tokenizer()
        assert pre.encode("hi", chat=True) == [1, 2, 3]
    finally:
        for name in set(sys.modules) - before:
            del sys.modules[name]
