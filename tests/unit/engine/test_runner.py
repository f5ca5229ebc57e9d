"""ModelRunner on dummy:tiny: prefill/decode consistency, batching, stats, errors."""

from __future__ import annotations

import gc
import subprocess
import sys
import weakref

import pytest
import torch
from bucketserve.engine.block_manager import BlockManager
from bucketserve.engine.config import EngineConfig
from bucketserve.engine.llm_engine import LLMEngine
from bucketserve.engine.runner import ModelRunner
from bucketserve.engine.sampling_params import SamplingParams
from bucketserve.engine.sequence import Sequence

from tests.unit.engine.helpers import prefill_seqs, rel_err

PROMPTS = [list(range(10, 10 + n)) for n in (1, 3, 4, 5, 9, 16, 23)]


def test_metadata(tiny_runner):
    r = tiny_runner
    mc = r.model_config
    assert (mc.num_layers, mc.hidden_size, mc.num_heads, mc.num_kv_heads, mc.head_dim) == (
        2,
        64,
        4,
        2,
        16,
    )
    assert mc.vocab_size == 49152 and mc.eos_token_ids == (2,)
    assert mc.kv_bytes_per_token == 2 * 2 * 2 * 16 * 4
    assert r.attention_backend == "cpu_paged" and r.block_size == 4 and r.num_blocks == 96
    assert r.elementwise_impl == "cpp" and r.linear_impl == "onednn"
    # one scratch block past num_blocks: padded rows of a static decode step use it
    assert tuple(r.pool.shape) == (2, 2, 97, 4, 2, 16) and r.pool_handle.num_blocks == 97


def test_prefill_then_decode_equals_longer_prefill(tiny_runner):
    r = tiny_runner
    bm = BlockManager(r.num_blocks, r.block_size)
    seqs = prefill_seqs(r, bm, PROMPTS)
    r.prefill(seqs)
    for seq in seqs:
        seq.append_token(777)
        bm.ensure_slot(seq)
    decoded = r.decode_logits(seqs)
    longer = prefill_seqs(r, bm, [s.token_ids for s in seqs])
    assert rel_err(decoded, r.prefill_logits(longer)) < 1e-5


def test_batch_composition_does_not_change_logits(tiny_runner):
    r = tiny_runner
    bm = BlockManager(r.num_blocks, r.block_size)
    together = r.prefill_logits(prefill_seqs(r, bm, PROMPTS))
    for i, prompt in enumerate(PROMPTS):
        alone = r.prefill_logits(prefill_seqs(r, bm, [prompt]))
        assert rel_err(alone[0], together[i]) < 1e-5


def test_prefill_returns_one_token_without_appending(tiny_runner):
    r = tiny_runner
    bm = BlockManager(r.num_blocks, r.block_size)
    seqs = [Sequence(p, SamplingParams(temperature=0)) for p in PROMPTS[:3]]
    for seq in seqs:
        bm.allocate_for(seq)
    tokens = r.prefill(seqs)
    assert [s.num_tokens for s in seqs] == [len(p) for p in PROMPTS[:3]]
    assert tokens == r.prefill_logits(seqs).argmax(-1).tolist()


def test_stats_count_tokens_and_steps(tiny_runner):
    r = tiny_runner
    bm = BlockManager(r.num_blocks, r.block_size)
    seqs = prefill_seqs(r, bm, PROMPTS[:2])
    r.prefill(seqs)
    for seq in seqs:
        seq.append_token(5)
        bm.ensure_slot(seq)
    r.decode(seqs)
    r.decode(seqs)
    s = r.stats
    assert (s.num_prefill_steps, s.num_decode_steps) == (1, 2)
    assert s.num_prefill_tokens == len(PROMPTS[0]) + len(PROMPTS[1])
    assert s.num_decode_tokens == 4 and s.num_tokens == s.num_prefill_tokens + 4
    assert s.ema_decode_s > 0 and s.ema_prefill_s > 0 and s.last_batch_size == 2


def test_missing_blocks_and_too_long_rejected(tiny_runner):
    with pytest.raises(ValueError, match="allocate through the BlockManager"):
        tiny_runner.prefill([Sequence([1, 2, 3])])
    seq = Sequence(list(range(3000)))
    with pytest.raises(ValueError, match="max_model_len"):
        tiny_runner.prefill([seq])


def test_auto_pool_size_and_too_small_error():
    r = ModelRunner(EngineConfig(model="dummy:tiny", device="cpu", kv_cache_gb=0.01))
    try:
        assert r.num_blocks == int(0.01 * 2**30) // (r.model_config.kv_bytes_per_token * 16)
    finally:
        r.close()
    with pytest.raises(ValueError, match="KV pool too small"):
        ModelRunner(EngineConfig(model="dummy:tiny", device="cpu", kv_cache_gb=1e-5))


def test_bfloat16_runs_on_cpu():
    r = ModelRunner(EngineConfig(model="dummy:tiny", device="cpu", dtype="bf16", num_blocks=8))
    try:
        bm = BlockManager(r.num_blocks, r.block_size)
        logits = r.prefill_logits(prefill_seqs(r, bm, [[1, 2, 3]]))
        assert r.pool.dtype == torch.bfloat16 and logits.dtype == torch.float32
        assert torch.isfinite(logits).all()
    finally:
        r.close()


def test_config_validation_names_field():
    with pytest.raises(ValueError, match="attention must be one of"):
        EngineConfig(attention="xformers")
    with pytest.raises(ValueError, match="block_size must be >= 1, got 0"):
        EngineConfig(block_size=0)
    with pytest.raises(ValueError, match="dtype must be one of"):
        EngineConfig(dtype="int8")
    with pytest.raises(ValueError, match=r"gpu_memory_utilization must be in \(0, 1\]"):
        EngineConfig(gpu_memory_utilization=1.5)


# A serving engine's start-up in a fresh process: a checkpoint loaded on the meta device, packed
# and warmed. torch._dynamo (3-4 s to import on two cores) came in through nn.Embedding's random
# init on the meta device; nothing in an engine needs it.
BUILD_CODE = """
import sys
from bucketserve.engine.config import EngineConfig
from bucketserve.engine.runner import ModelRunner
r = ModelRunner(EngineConfig(model="smollm2", device="cpu", dtype="float32", kv_cache_gb=0.05, max_model_len=256,
                             warm_gemms=True, max_num_batched_tokens=64, max_num_seqs=4))
r.close()
assert "torch._dynamo" not in sys.modules, "torch._dynamo was imported"
"""


def test_building_an_engine_does_not_import_dynamo():
    subprocess.run([sys.executable, "-c", BUILD_CODE], check=True)


@pytest.mark.parametrize("attention", ["cpu_paged", "sdpa"])
def test_a_dropped_engine_frees_its_runner_without_the_cyclic_collector(attention):
    """No reference cycle through the runner: weights and KV pool go when the last reference
    does, not when Python's cyclic collector next runs (an in-process parity session held
    every closed runner, 12 GB, until then)."""
    gc.collect()
    gc.disable()
    try:
        engine = LLMEngine(EngineConfig(model="dummy:tiny", device="cpu", attention=attention,
                                        kv_cache_gb=0.01, max_num_seqs=4))  # fmt: skip
        params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
        assert len(engine.generate([PROMPTS[4], PROMPTS[6]], [params, params])[0]) == 3
        runner, model = weakref.ref(engine.runner), weakref.ref(engine.runner.model)
        engine.close()
        del engine
        assert runner() is None and model() is None
    finally:
        gc.enable()
