"""torch.ops.bucketserve.decode_layers (every decoder layer of a decode step in one C++ call)
against the layers' Python path on the same runner: bit-identical logits and KV, float32 and
bfloat16, with and without qkv bias, at several batch sizes; the models it cannot run (q/k
norms) keep the Python path."""

from __future__ import annotations

import pytest
import torch
from bucketserve.engine import cpu_ops
from bucketserve.engine.block_manager import BlockManager
from bucketserve.engine.config import EngineConfig
from bucketserve.engine.fusion import CpuCausalLM
from bucketserve.engine.model import CausalLM
from bucketserve.engine.runner import ModelRunner

from tests.unit.engine.helpers import make_hf_checkpoint, prefill_seqs

STEPS = 6


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen2")  # qkv bias, tied embeddings
    make_hf_checkpoint("qwen2", path)
    return str(path)


def decode_run(runner: ModelRunner, cls: type, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy decode steps of `batch` sequences with the model as `cls`: (logits of every
    step [STEPS, batch, V], the KV pool afterwards)."""
    runner.model.__class__ = cls
    runner.pool.zero_()
    bm = BlockManager(runner.num_blocks, runner.block_size)
    seqs = prefill_seqs(runner, bm, [list(range(10 + i, 10 + i + 5 + 7 * i)) for i in range(batch)])
    runner.prefill_logits(seqs)
    for seq in seqs:
        seq.append_token(7)  # fixed: greedy tokens follow from here
    steps = []
    for _ in range(STEPS):
        for seq in seqs:
            bm.ensure_slot(seq)
        logits = runner.decode_logits(seqs)
        steps.append(logits)
        for token, seq in zip(logits.argmax(-1).tolist(), seqs, strict=True):
            seq.append_token(token)
    return torch.stack(steps), runner.pool.clone()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("model", ["dummy:tiny", "qwen2"])
def test_decode_layers_match_the_python_layers_bit_for_bit(model, dtype, qwen2_dir):
    assert cpu_ops.load(), cpu_ops.unavailable_reason()
    config = EngineConfig(model=qwen2_dir if model == "qwen2" else model, device="cpu",
                          dtype=dtype, num_blocks=512, block_size=4)  # fmt: skip
    runner = ModelRunner(config)
    try:
        assert type(runner.model) is CpuCausalLM and runner.attention_backend == "cpu_paged"
        # 1, 3: small_linear's streaming loops (fp32 on AVX2, bf16); 6: oneDNN or, bf16 on
        # AVX2, its blocked loop; 18: oneDNN everywhere (bf16 on AVX2: fp32 GEMMs, widened)
        for batch in (1, 3, 6, 18):
            fast_logits, fast_pool = decode_run(runner, CpuCausalLM, batch)
            ref_logits, ref_pool = decode_run(runner, CausalLM, batch)
            assert torch.equal(fast_logits, ref_logits), (
                batch,
                (fast_logits - ref_logits).abs().max(),
            )
            assert torch.equal(fast_pool, ref_pool), batch
    finally:
        runner.close()


def test_models_with_qk_norms_keep_the_python_layers():
    runner = ModelRunner(EngineConfig(model="dummy:tiny-qwen3", device="cpu", num_blocks=16))
    try:
        assert type(runner.model) is CausalLM
    finally:
        runner.close()
