"""Sizing and allocating the paged KV pool through the kv transport (so peers can open it)."""

from __future__ import annotations

import logging

import torch

from bucketserve.engine.shapes import ModelConfig

log = logging.getLogger(__name__)

SHM_HEADROOM = 0.9  # leave /dev/shm room for the Python backend's own tensors


def pool_shape(mc: ModelConfig, num_blocks: int, block_size: int) -> tuple[int, ...]:
    """[layers, 2, num_blocks, block_size, kv_heads, head_dim]."""
    return (mc.num_layers, 2, num_blocks, block_size, mc.num_kv_heads, mc.head_dim)


def block_bytes(mc: ModelConfig, block_size: int) -> int:
    """Bytes one KV block occupies across all layers (K and V)."""
    return mc.kv_bytes_per_token * block_size


def auto_num_blocks(config, device: torch.device, block_size: int, mc: ModelConfig) -> int:
    """Pool size from kv_cache_gb capped by free /dev/shm (CPU) or free GPU memory (GPU)."""
    per_block = block_bytes(mc, block_size)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        num_blocks = int(free * config.gpu_memory_utilization) // per_block
        where = f"free GPU memory ({free / 2**30:.1f} GiB x {config.gpu_memory_utilization})"
    else:
        from bucketserve.kv.shm import shm_free_bytes

        shm_free = shm_free_bytes()
        budget = min(int(config.kv_cache_gb * 2**30), int(shm_free * SHM_HEADROOM))
        if budget < config.kv_cache_gb * 2**30:
            log.warning("KV pool capped at %.2f GiB by free /dev/shm", budget / 2**30)
        num_blocks = budget // per_block
        where = (
            f"kv_cache_gb={config.kv_cache_gb} capped by /dev/shm ({shm_free / 2**30:.2f} GiB free)"
        )
    needed = -(-mc.max_model_len // block_size)
    if num_blocks < needed:
        raise ValueError(
            f"KV pool too small: {where} holds {num_blocks} blocks of {block_size} tokens, "
            f"one max_model_len={mc.max_model_len} sequence needs {needed}. Enlarge /dev/shm "
            f"(docker --shm-size / compose shm_size), raise kv_cache_gb, or lower max_model_len."
        )
    return num_blocks


def allocate_kv_pool(
    mc: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype, device, name: str
) -> tuple[torch.Tensor, object]:
    """Allocate the exportable pool tensor and its PoolHandle."""
    from bucketserve.kv.transport import allocate_pool

    shape = pool_shape(mc, num_blocks, block_size)
    return allocate_pool(shape, dtype, device, name)
