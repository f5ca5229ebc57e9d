"""Shape table, KV bytes per token, and model resolution (no weights touched)."""

from __future__ import annotations

import os

import pytest
from bucketserve.engine import loader
from bucketserve.engine.shapes import dummy_model_config, model_config_from_hf


def _forbid_files(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("dummy shapes must not touch model files")

    monkeypatch.setattr(loader, "resolve_model", boom)
    monkeypatch.setattr(loader, "load_state_dict", boom)


def test_llama3_8b_kv_bytes_without_weights(monkeypatch):
    _forbid_files(monkeypatch)
    mc = loader.model_config_for("dummy:llama-3-8b", dtype="bfloat16")
    assert mc.kv_bytes_per_token == 131_072
    assert (mc.num_layers, mc.num_kv_heads, mc.head_dim, mc.vocab_size) == (32, 8, 128, 128256)
    assert 7.9e9 < mc.num_params < 8.1e9


def test_llama2_13b_kv_bytes(monkeypatch):
    _forbid_files(monkeypatch)
    assert loader.model_config_for("dummy:llama-2-13b", "bfloat16").kv_bytes_per_token == 819_200


def test_kv_bytes_scale_with_dtype():
    assert dummy_model_config("llama-3-8b", "float32").kv_bytes_per_token == 262_144


def test_unknown_dummy_shape_lists_choices():
    with pytest.raises(ValueError, match="dummy shape must be one of"):
        dummy_model_config("gpt-5")


def test_hf_config_fields():
    hf = dict(model_type="qwen3", hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
              num_attention_heads=16, num_key_value_heads=8, head_dim=128, vocab_size=151936,
              max_position_embeddings=40960, eos_token_id=151645)  # fmt: skip
    qwen3 = model_config_from_hf(hf)
    assert qwen3.head_dim == 128 and qwen3.qk_norm and not qwen3.attention_bias
    assert qwen3.eos_token_ids == (151645,)
    qwen2 = model_config_from_hf(dict(hf, model_type="qwen2", head_dim=None))
    assert qwen2.attention_bias and qwen2.head_dim == 64
    mistral = model_config_from_hf(
        dict(hf, model_type="mistral", sliding_window=4096, max_position_embeddings=32768)
    )
    assert mistral.max_model_len == 4096  # exact only inside the window


def test_unsupported_architecture_rejected():
    with pytest.raises(ValueError, match="model_type must be one of"):
        model_config_from_hf(dict(model_type="gpt2", hidden_size=8, intermediate_size=8,
                                  num_hidden_layers=1, num_attention_heads=1, vocab_size=8))  # fmt: skip


def test_is_dummy_and_bad_specs(tmp_path):
    assert loader.is_dummy("dummy:tiny") and not loader.is_dummy("smollm2")
    with pytest.raises(ValueError, match="model must be"):
        loader.resolve_model(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="has no config.json"):
        loader.resolve_model(str(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    assert loader.resolve_model(str(tmp_path)) == str(tmp_path)


def test_gguf_conversion_is_atomic(tmp_path, monkeypatch):
    monkeypatch.setenv("BUCKETSERVE_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")

    def crash(path, out_dir):
        (open(os.path.join(out_dir, "config.json"), "w")).close()
        raise RuntimeError("killed mid-conversion")

    monkeypatch.setattr(loader, "convert_gguf", crash)
    with pytest.raises(RuntimeError, match="mid-conversion"):
        loader.resolve_model(str(gguf))
    models = tmp_path / "cache" / "models"
    assert list(models.iterdir()) == []  # no half-written cache, no temp dir left

    def convert(path, out_dir):
        for name in ("config.json", "model.safetensors"):
            (open(os.path.join(out_dir, name), "w")).close()

    monkeypatch.setattr(loader, "convert_gguf", convert)
    assert loader.resolve_model(str(gguf)) == str(models / "m")
    monkeypatch.setattr(loader, "convert_gguf", crash)  # cached now: no second conversion
    assert loader.resolve_model(str(gguf)) == str(models / "m")


def test_stale_or_unstamped_conversion_is_redone(tmp_path, monkeypatch):
    monkeypatch.setenv("BUCKETSERVE_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF v1")
    calls = []

    def convert(path, out_dir):
        calls.append(path)
        for name in ("config.json", "model.safetensors"):
            (open(os.path.join(out_dir, name), "w")).close()

    monkeypatch.setattr(loader, "convert_gguf", convert)
    target = tmp_path / "cache" / "models" / "m"
    target.mkdir(parents=True)  # an older loader's cache: complete files, no stamp
    (target / "model.safetensors").write_bytes(b"old weights")
    assert loader.resolve_model(str(gguf)) == str(target) and len(calls) == 1
    assert (target / "model.safetensors").read_bytes() == b""  # the new conversion
    assert loader.resolve_model(str(gguf)) == str(target) and len(calls) == 1  # current now
    gguf.write_bytes(b"GGUF v2, another size")  # the package shipped a different file
    loader.resolve_model(str(gguf))
    monkeypatch.setattr(loader, "CONVERSION_VERSION", loader.CONVERSION_VERSION + 1)
    loader.resolve_model(str(gguf))
    assert len(calls) == 3
    assert sorted(p.name for p in target.parent.iterdir()) == ["m"]  # nothing left behind


def test_smollm2_gguf_is_found_without_import():
    path = loader.smollm2_gguf_path()
    assert path.endswith("SmolLM2-135M-Instruct.Q4_1.gguf") and os.path.isfile(path)
