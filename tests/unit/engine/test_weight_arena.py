"""engine/weight_arena.py: the weights a CPU decode step streams move into one buffer in the
order the step reads them, with their values and a tied embedding intact; the model then owns
every tensor it keeps (a float32 checkpoint's file mapping is let go); and decoding over the
arena gives the same logits as over the weights where the loader left them."""

from __future__ import annotations

import gc
import os
from unittest import mock

import pytest
import torch
from bucketserve.engine import fusion, loader
from bucketserve.engine.config import EngineConfig
from bucketserve.engine.runner import ModelRunner
from bucketserve.engine.weight_arena import (
    ALIGN,
    HUGE_PAGE,
    own_tensors,
    place_streamed_weights,
    streamed_linears,
)

from tests.unit.engine.helpers import make_hf_checkpoint, step_logits

PROMPTS = [[5, 9, 13, 2, 40], list(range(20, 31))]


def tiny_model(dtype=torch.float32):
    config = loader.model_config_for("dummy:tiny", dtype=str(dtype).removeprefix("torch."))
    model = loader.build_model(config, None, torch.device("cpu"), dtype, max_len=64)
    fusion.fuse_projections(model)
    return model


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_streamed_weights_lie_in_one_buffer_in_read_order(dtype):
    model = tiny_model(dtype)
    linears = streamed_linears(model)
    assert len(linears) == 4 * len(model.model.layers) + 1 and linears[-1] is model.lm_head
    before = [m.weight.clone() for m in linears]
    assert model.lm_head.weight is model.model.embed_tokens.weight  # dummy:tiny ties them
    buffer = place_streamed_weights(model, lambda m: m is not linears[1])  # all but one
    assert buffer.data_ptr() % HUGE_PAGE == 0
    storage = buffer.untyped_storage().data_ptr()
    placed = [m for m in linears if m is not linears[1]]
    offsets = [m.weight.data_ptr() - buffer.data_ptr() for m in placed]
    assert offsets == sorted(offsets) and offsets[0] == 0
    assert all(o % ALIGN == 0 for o in offsets)
    for m, old in zip(linears, before, strict=True):
        assert torch.equal(m.weight, old)  # values moved intact
        assert (m.weight.untyped_storage().data_ptr() == storage) == (m is not linears[1])
    assert model.model.embed_tokens.weight is model.lm_head.weight  # still one table
    assert offsets[-1] + model.lm_head.weight.nbytes <= buffer.numel()


def test_nothing_streams_nothing_placed():
    model = tiny_model()
    assert place_streamed_weights(model, lambda m: False) is None


def test_own_tensors_copies_views_and_keeps_sharing():
    model = tiny_model()
    big = torch.zeros(10_000)
    norm = model.model.norm
    norm.weight = torch.nn.Parameter(big[:64], requires_grad=False)  # a view into a larger buffer
    shared = torch.ones(3)
    model.lm_head.extra_a = shared  # plain tensor attributes, shared by two modules
    model.model.norm.extra_b = shared
    arena = place_streamed_weights(model, lambda m: True)
    own_tensors(model, arena)
    assert norm.weight.untyped_storage().data_ptr() != big.untyped_storage().data_ptr()
    assert norm.weight.untyped_storage().nbytes() == norm.weight.nbytes
    assert model.lm_head.extra_a is model.model.norm.extra_b  # still one tensor
    assert model.lm_head.extra_a.data_ptr() != shared.data_ptr()
    assert model.lm_head.weight.untyped_storage().data_ptr() == arena.untyped_storage().data_ptr()


def mapped(path: str) -> bool:
    with open("/proc/self/maps") as f:
        return any(path in line for line in f)


def test_a_float32_checkpoint_file_is_not_kept_mapped(tmp_path):
    """safetensors maps a float32 checkpoint and the loaded tensors are views of it; once the
    linears are packed (and the streamed ones placed) nothing may keep that mapping, which
    would hold the whole file resident."""
    make_hf_checkpoint("llama3", tmp_path)
    (weights,) = [str(p) for p in tmp_path.glob("*.safetensors")]
    state = loader.load_state_dict(str(tmp_path))
    assert mapped(os.path.realpath(weights)), "the loader no longer maps the file: test is moot"
    del state
    gc.collect()
    runner = ModelRunner(EngineConfig(model=str(tmp_path), device="cpu", dtype="float32",
                                      num_blocks=32))  # fmt: skip
    try:
        assert runner.linear_impl == "onednn"
        gc.collect()
        assert not mapped(os.path.realpath(weights))
    finally:
        runner.close()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_decoding_over_the_arena_matches_the_loaded_layout(dtype):
    if not fusion.small_linear_available(getattr(torch, dtype)):
        pytest.skip(f"no {dtype} small_linear on this CPU, so no arena to compare; runs on "
                    "CPUs where the decode step streams plain weights: bf16 with AVX512-BF16 or "
                    "AVX2, fp32 on AVX2 CPUs without AVX-512")  # fmt: skip
    config = dict(model="dummy:tiny", device="cpu", dtype=dtype, num_blocks=64, seed=0)
    runner = ModelRunner(EngineConfig(**config))
    assert runner.model.lm_head.plain_weight is not None
    arena = step_logits(runner, PROMPTS)
    with mock.patch.object(fusion, "place_streamed_weights", lambda model, streams: None), \
         mock.patch.object(fusion, "own_tensors", lambda model, arena=None: 0):  # fmt: skip
        runner = ModelRunner(EngineConfig(**config))
    loaded = step_logits(runner, PROMPTS)
    for a, b in zip(arena, loaded, strict=True):
        assert torch.equal(a, b)
