"""GPU-only behaviour checked on CPU through fakes: KV pool sizing on a shared GPU, and the
CUDA device made current around every engine entry point and Triton launch."""

from __future__ import annotations

import contextlib

import pytest
import torch
from bucketserve.engine import device as device_mod
from bucketserve.engine import kv_pool
from bucketserve.engine.config import EngineConfig
from bucketserve.engine.shapes import dummy_model_config

GiB = 2**30
MC = dummy_model_config("llama-3-8b", "bfloat16")
WEIGHTS = 16 * GiB


class FakeGpu:
    """mem_get_info / memory_allocated of one 141 GiB GPU shared by processes in turn."""

    def __init__(self) -> None:
        self.total, self.used = 141 * GiB, 0

    def install(self, monkeypatch) -> None:
        monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d: (self.total - self.used,
                                                                   self.total))  # fmt: skip
        monkeypatch.setattr(torch.cuda, "memory_allocated", lambda d: WEIGHTS)

    def load_instance(self, config) -> int:
        """One process: weights, then its pool sized and allocated; returns the pool bytes."""
        self.used += WEIGHTS
        blocks = kv_pool.auto_num_blocks(config, torch.device("cuda", 0), 16, MC, "triton")
        self.used += blocks * kv_pool.block_bytes(MC, 16)
        return blocks


def test_two_instances_on_one_gpu_split_it_the_same_in_either_order(monkeypatch):
    sizes = []
    for _ in range(2):  # load order does not matter: both read total, not free, memory
        gpu = FakeGpu()
        gpu.install(monkeypatch)
        cfg = EngineConfig(gpu_memory_utilization=0.45)
        sizes.append((gpu.load_instance(cfg), gpu.load_instance(cfg)))
        assert gpu.used <= gpu.total * 0.9
    assert sizes[0][0] == sizes[0][1] == sizes[1][0]
    expected = int(141 * GiB * 0.45) - WEIGHTS - kv_pool.activation_bytes(MC, cfg, "triton")
    expected -= kv_pool.FIXED_GPU_RESERVE
    assert sizes[0][0] == expected // kv_pool.block_bytes(MC, 16)


def test_explicit_kv_cache_gb_is_honoured_on_gpu(monkeypatch):
    gpu = FakeGpu()
    gpu.install(monkeypatch)
    blocks = gpu.load_instance(EngineConfig(kv_cache_gb=20.0))
    assert blocks == 20 * GiB // kv_pool.block_bytes(MC, 16)
    with pytest.raises(ValueError, match="exceeds the .* GiB free on cuda:0"):
        gpu.load_instance(EngineConfig(kv_cache_gb=120.0))


def test_activation_headroom_grows_with_the_prefill_token_budget():
    small = kv_pool.activation_bytes(MC, EngineConfig(max_num_batched_tokens=2048), "triton")
    large = kv_pool.activation_bytes(MC, EngineConfig(max_num_batched_tokens=65536), "triton")
    # gate_up + act alone are 3 x 14336 x 2 B per token: 65536 tokens need > 5 GiB
    assert large - small > 5 * GiB
    sdpa = kv_pool.activation_bytes(MC, EngineConfig(max_model_len=8192), "sdpa")
    assert sdpa - kv_pool.activation_bytes(MC, EngineConfig(), "triton") > 4 * GiB  # gather


@pytest.fixture
def recorded_devices(monkeypatch):
    entered = []

    @contextlib.contextmanager
    def fake_device(dev):
        entered.append(torch.device(dev))
        yield

    monkeypatch.setattr(torch.cuda, "device", fake_device)
    monkeypatch.setattr(torch.cuda, "set_device", lambda dev: entered.append(("set", dev)))
    return entered


def test_device_context_enters_the_tensors_device(recorded_devices):
    with device_mod.device_context(torch.device("cuda", 1)):
        pass
    with device_mod.device_context(torch.device("cpu")):
        pass
    device_mod.bind_thread(torch.device("cuda", 1))
    device_mod.bind_thread(torch.device("cpu"))
    assert recorded_devices == [torch.device("cuda", 1), ("set", torch.device("cuda", 1))]


def test_runner_steps_run_inside_its_device(monkeypatch, tiny_runner):
    from bucketserve.engine import runner as runner_mod
    from bucketserve.engine.block_manager import BlockManager

    from tests.unit.engine.helpers import prefill_seqs

    entered = []

    @contextlib.contextmanager
    def spy(dev):
        entered.append(dev)
        yield

    monkeypatch.setattr(runner_mod, "device_context", spy)
    bm = BlockManager(tiny_runner.num_blocks, tiny_runner.block_size)
    seqs = prefill_seqs(tiny_runner, bm, [[1, 2, 3]])
    tiny_runner.prefill(seqs)
    seqs[0].append_token(4)
    bm.ensure_slot(seqs[0])
    tiny_runner.decode(seqs)
    bm.release(seqs[0])
    assert entered == [tiny_runner.device] * 2
